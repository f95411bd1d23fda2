"""Host-side launch arithmetic shared by the Triton launchers."""


def cdiv(a: int, b: int) -> int:
    """⌈a/b⌉ for the grid of a launch, in integer arithmetic: ``triton.cdiv``
    is a jit function whose host call costs more than the division."""
    return -(-a // b)
