"""torch.compile(fullgraph=True) captures softk's maps and losses with no
graph break, and the compiled model matches eager (CPU, both CPU backends)."""

import pytest
import torch

import softk
from softk.losses import entmax15_loss, sparsemax_loss

pytestmark = pytest.mark.usefixtures("each_cpu_backend")


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 70)
        self.b = torch.nn.Linear(70, 5)

    def forward(self, x, y):
        h = softk.sparsemax(self.a(x)) + softk.soft_topk(self.a(x), 4, tau=0.5) + softk.entmax(self.a(x), 1.3)
        z = self.b(h)
        return sparsemax_loss(z, y) + entmax15_loss(z, y) + softk.topk_sum(z, 2).mean() + softk.softmax(z).amax(-1).mean()


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
@pytest.mark.slow
def test_compiled_model_matches_eager(compiler):
    torch._dynamo.reset()
    model = Tiny()
    x = torch.randn(16, 8)
    y = torch.randint(0, 5, (16,))
    eager = model(x, y)
    g_eager = torch.autograd.grad(eager, list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    out = compiled(x, y)
    g = torch.autograd.grad(out, list(model.parameters()))
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bad_target_still_refused_inside_a_compiled_graph():
    """Eagerly a class index out of range is a ValueError naming it; in a
    compiled graph the value check is an assertion in the graph, not a
    graph break, and it still stops the call."""
    torch._dynamo.reset()
    f = torch.compile(lambda t, y: sparsemax_loss(t, y), fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3)
    assert torch.isfinite(f(x, torch.tensor([0, 2])))
    with pytest.raises(ValueError, match="class index 3"):
        sparsemax_loss(x, torch.tensor([0, 3]))
    with pytest.raises(RuntimeError, match="invalid input"):
        f(x, torch.tensor([0, 3]))
