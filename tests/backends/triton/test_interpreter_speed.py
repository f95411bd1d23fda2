"""The test suite's speed-up of Triton's interpreter (tests/interpreter_speed.py)
changes what the interpreter does, not what it computes: softk's kernels give
bit-identical results with and without it, forward and backward, on the
attention kernels (helpers from softk's modules and from triton.language's
standard library, which sees ``triton.language.core`` only) and the
row kernels; and with it the language is swept once per launch and module,
not once per helper call."""

import pytest
import torch

from ... import interpreter_speed

tri = pytest.importorskip("softk._backends.triton.attention")

from triton.runtime import interpreter  # noqa: E402

import softk  # noqa: E402
from softk.attention import checks, op  # noqa: E402
from softk._backends import kernels  # noqa: E402


def attention_and_grads():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g, requires_grad=True) for n in (20, 37, 37))
    call = checks.check_call(q, k, v, None, 0.0, True, None, True, "entmax15", None, 2.0)
    out = op.attention(call, kernels.get("attention", "triton"))
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))]


def rows_and_grads():
    x = torch.randn(5, 70, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with softk.use_backend("triton"):
        p = softk.entmax(x, alpha=1.3) + softk.softmax(x, tau=0.5)
    return [p.detach(), *torch.autograd.grad(p, x, torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))]


def sweeps(run, monkeypatch):
    """(results, how many times the language was swept) of run()."""
    count = [0]
    builtin = interpreter._patch_builtin

    def counted(*args, **kwargs):
        count[0] += 1
        return builtin(*args, **kwargs)
    monkeypatch.setattr(interpreter, "_patch_builtin", counted)
    return run(), count[0]


@pytest.fixture
def tiles(monkeypatch):
    monkeypatch.setattr(tri, "BLOCK_M", 16)  # several blocks each way: helpers called in loops
    monkeypatch.setattr(tri, "BLOCK_N", 16)


@pytest.mark.parametrize("run", [attention_and_grads, rows_and_grads])
def test_the_results_are_bit_identical_and_the_sweeps_fewer(run, tiles, monkeypatch):
    assert interpreter_speed.install()
    fast, fast_sweeps = sweeps(run, monkeypatch)
    interpreter_speed.uninstall()
    try:
        plain, plain_sweeps = sweeps(run, monkeypatch)
    finally:
        assert interpreter_speed.install()
    for a, b in zip(fast, plain, strict=True):
        assert torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(a.nan_to_num(), b.nan_to_num())
    assert 0 < fast_sweeps < plain_sweeps
