"""The products over each row's nonzeros (softk._backends.blockwise.support.rows_sparse
and the CPU kernels of softk._backends.native.products): when they are taken,
and whole calls that take them at the default settings (long rows, a narrow
support) against the float64 oracle, forward and gradients, with masks,
causal, GQA and a query with no key.  Every map through them at small sizes
is the "blockwise_nonzeros" backend of test_attention.py and test_grad.py."""

import pytest
import torch

import softk
from softk._backends.blockwise import support
from softk._backends.native import products

from ..oracle import attention as ora
from .test_attention import close, one_thread, run  # noqa: F401
from .test_support import sparse_p

F64 = torch.float64
pytestmark = pytest.mark.skipif(not softk._backends.registry.native_available(), reason="needs a C compiler")


def test_when_the_rows_nonzeros_are_taken():
    p = sparse_p((1, 2, 64, 400), 0.05)
    assert support.rows_sparse(p, True)
    assert not support.rows_sparse(p, False)  # the softmax: no zeros
    assert not support.rows_sparse(sparse_p((1, 2, 64, 400), 0.3), True)  # over an eighth of the keys a row
    assert not support.rows_sparse(p.half(), True)  # no kernel for half
    assert not support.rows_sparse(p, True, torch.zeros(2, dtype=torch.float32))  # one dtype
    assert not support.rows_sparse(p[:, :, :0], True)
    # the count is over rows spread across the chunk: wide rows at its end count too
    q = p.clone()
    q[:, 1, 32:] = 1.0
    assert not support.rows_sparse(q, True)


@pytest.fixture
def calls(monkeypatch):
    """The names of the row kernels called, in order."""
    made = []
    for name in ("mm", "sampled", "mm_t_"):
        fn = getattr(products, name)

        def record(*a, _fn=fn, _name=name, **kw):
            made.append(_name)
            return _fn(*a, **kw)

        monkeypatch.setattr(products, name, record)
    return made


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [2, 1])
def test_default_settings_take_the_rows_nonzeros_and_match_oracle(calls, name, causal, hkv):
    B, H, L, S, E = 1, 2, 320, 320, 16
    alpha = 1.3 if name == "entmax" else None
    g = torch.Generator().manual_seed(hkv)
    q, k, v = (torch.randn(*shape, generator=g, dtype=F64).requires_grad_()
               for shape in ((B, H, L, E), (B, hkv, S, E), (B, hkv, S, E)))
    mask = torch.rand(L, S, generator=g) > 0.2
    mask[5] = False  # a query with no key
    out = run("blockwise", q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, map=name, alpha=alpha,
              scale=4.0)
    assert calls and set(calls) == {"mm"}
    dout = torch.randn(out.shape, generator=g, dtype=F64)
    got = torch.autograd.grad(out, [q, k, v], dout)
    assert {"sampled", "mm_t_"} <= set(calls)
    args = [t.detach().numpy() for t in (q, k, v)]
    close(out.detach(), ora.attention(*args, mask.numpy(), causal, 4.0, name, alpha)[0])
    for a, want in zip(got, ora.grads(*args, dout.numpy(), mask.numpy(), causal, 4.0, name, alpha)):
        close(a, want)
    assert (out[:, :, 5] == 0).all() and (got[0][:, :, 5] == 0).all()
