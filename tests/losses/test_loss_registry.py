"""Every loss of the one table softk.losses._registry.LOSSES through every entry point that takes a loss by name.

Parametrized over the table itself, so a loss added there and missing from an
entry point fails here.  Each entry point must give the single-device value
of the same loss with the same defaults: the reference is the public loss
called with every option spelled out (torch's own F.cross_entropy for
"cross_entropy"; the others are checked against the NumPy oracles
elsewhere), in float64.  Two sets of options per loss: the defaults (only
what a loss cannot do without: entmax's α), and every option it takes set
away from its default.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch
import torch.nn.functional as F

import softk.losses as L
from softk.distributed import vocab_parallel_fused_linear_loss, vocab_parallel_loss
from softk.integrations.megatron import megatron_loss
from softk.integrations.torchtitan import SoftkLoss
from softk.losses import fused_linear_loss
from softk.losses._options import LossOptions
from softk.losses._registry import LOSSES, REQUIRED
from softk.nn import FusedLinearLoss

from ..distributed.dist_harness import run

D = torch.float64
N, H, V = 7, 5, 11
TOL = dict(rtol=1e-10, atol=1e-10)

# The public losses with every option spelled out at its default (no default for entmax's α).
REFERENCE = {
    "cross_entropy": lambda z, t, r, tau=1.0: F.cross_entropy(z / tau, t, ignore_index=-100, reduction=r),
    "softmax": lambda z, t, r, tau=1.0: L.softmax_loss(z, t, -100, r, tau),
    "sparsemax": lambda z, t, r, tau=1.0: L.sparsemax_loss(z, t, -100, r, tau),
    "entmax15": lambda z, t, r, tau=1.0: L.entmax15_loss(z, t, -100, r, tau),
    "entmax": lambda z, t, r, alpha, tau=1.0: L.entmax_loss(z, t, alpha, -100, r, tau),
    "soft_topk": lambda z, y, r, k=1, method="exp", tau=1.0: L.soft_topk_loss(z, y, k, method, tau, r),
    "topk_softmax_ce": lambda z, t, r, k=1, tau=1.0: L.topk_softmax_cross_entropy(z, t, k, -100, r, tau),
    "ts2": lambda z, t, r, suppression=1.0, adaptive=False, tau=1.0: L.ts2_loss(
        z, t, suppression=suppression, tau=tau, adaptive=adaptive, ignore_index=-100, reduction=r),
}
# Each loss's own options away from their defaults (soft top-k's "sparse": the method vocabulary slices take at k > 1).
GIVEN = {"alpha": 1.3, "k": 3, "method": "sparse", "suppression": 0.5, "adaptive": True}
CASES = ["defaults", "given"]


def options(name, case):
    kind = LOSSES[name]
    if case == "defaults":
        return {o: GIVEN[o] for o, default in kind.options.items() if default is REQUIRED}
    return {**{o: GIVEN[o] for o in kind.options}, "tau": 0.8}


def data(name, case, seed=0):
    """x (N, H), w (V, H) and a target of the loss's kind (an ignored row among class indices)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, dtype=D, generator=g)
    w = torch.randn(V, H, dtype=D, generator=g)
    if LOSSES[name].targets == "dense":
        k = options(name, case).get("k", 1)
        t = torch.zeros(N, V, dtype=D).scatter_(1, torch.rand(N, V, generator=g).argsort(1)[:, :k], 1.0)
    else:
        t = torch.randint(0, V, (N,), generator=g)
        t[2] = -100
    return x, w, t


def reference(name, case, z, t, reduction):
    return REFERENCE[name](z, t, reduction, **options(name, case))


def public(name, case):
    """The public loss of ``name`` and its keyword arguments (soft_topk_loss's k has no default of its own)."""
    kind = LOSSES[name]
    own = {o: default for o, default in kind.options.items() if default is not REQUIRED}
    return getattr(L, kind.public_name), {**own, **options(name, case)}


def test_the_references_cover_the_table():
    assert set(REFERENCE) == set(LOSSES)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", list(LOSSES))
def test_single_device_entry_points(name, case):
    """softk.losses.<function>, fused_linear_loss, nn.FusedLinearLoss and torchtitan's SoftkLoss."""
    x, w, t = data(name, case)
    opts = options(name, case)
    z = x @ w.T
    want = reference(name, case, z, t, "mean")
    fn, kw = public(name, case)
    torch.testing.assert_close(fn(z, t, **kw), want, **TOL)
    torch.testing.assert_close(fused_linear_loss(x, w, t, name, chunk_size=3, **opts), want, **TOL)
    head = FusedLinearLoss(H, V, name, bias=False, chunk_size=3, dtype=D, **opts)
    with torch.no_grad():
        head.weight.copy_(w)
    torch.testing.assert_close(head(x, t), want, **TOL)
    assert all(f"{o}=" in repr(head) for o in LOSSES[name].options)
    got, metrics = SoftkLoss(SoftkLoss.Config(loss=name, **opts))(z, t, torch.tensor(4.0, dtype=D))
    torch.testing.assert_close(got, reference(name, case, z, t, "sum") / 4, **TOL)


def _gpt2():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).to(D).eval()  # eval: no dropout


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", list(LOSSES))
def test_apply_softk(name, case):
    """A causal LM's labels are class indices: the dense-target losses are refused by name."""
    from softk.integrations.transformers import apply_softk

    model = _gpt2()
    opts = options(name, case)
    if LOSSES[name].targets == "dense":
        with pytest.raises(ValueError, match=f"loss='{name}' needs dense"):
            apply_softk(model, name, **opts)
        return
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = model.transformer(ids).last_hidden_state
        z = (hidden @ model.lm_head.weight.T).reshape(-1, 32)
        t = F.pad(ids, (0, 1), value=-100)[:, 1:].reshape(-1)  # position i predicts label i + 1
        want = reference(name, case, z, t, "mean")
        got = apply_softk(model, name, **opts)(ids, labels=ids).loss
    torch.testing.assert_close(got, want, **TOL)


def test_every_entry_point_has_the_one_set_of_defaults():
    """Each option an entry point takes defaults to LossOptions' (soft top-k's method "exp" included)."""
    entry_points = {
        "fused_linear_loss": inspect.signature(fused_linear_loss).parameters,
        "FusedLinearLoss": inspect.signature(FusedLinearLoss.__init__).parameters,
        "vocab_parallel_loss": inspect.signature(vocab_parallel_loss).parameters,
        "vocab_parallel_fused_linear_loss": inspect.signature(vocab_parallel_fused_linear_loss).parameters,
        "megatron_loss": inspect.signature(megatron_loss).parameters,
        "SoftkLoss.Config": inspect.signature(SoftkLoss.Config).parameters,
    }
    defaults = dict(LossOptions._field_defaults)
    for where, params in entry_points.items():
        for p in params.values():
            if p.name in defaults:
                assert p.default == defaults[p.name], (where, p.name, p.default)
        assert {"loss", "alpha", "k", "method", "tau", "suppression", "adaptive"} <= set(params), where


# ---------------------------------------------------------------- vocabulary slices on 2 gloo ranks
def _ranks(rank, world):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    lo, hi = (0, 6) if rank == 0 else (6, V)
    for name in LOSSES:
        for case in CASES:
            x, w, t = data(name, case, seed=2)
            opts = options(name, case)
            z = x @ w.T
            mine = t[:, lo:hi] if t.is_floating_point() else t
            what = f"{name} ({case})"

            def close(got, want, entry):
                torch.testing.assert_close(got, want, **TOL, msg=lambda m: f"{what}, {entry}: {m}")

            close(vocab_parallel_loss(z[:, lo:hi], mine, name, **opts), reference(name, case, z, t, "mean"),
                  "vocab_parallel_loss")
            close(vocab_parallel_fused_linear_loss(x, w[lo:hi], mine, name, chunk_size=3, **opts),
                  reference(name, case, z, t, "mean"), "vocab_parallel_fused_linear_loss")
            ms, mb = 1, N  # Megatron's (s, b) tokens
            close(megatron_loss(name, **opts)(z[:, lo:hi].reshape(ms, mb, -1), mine.reshape(ms, mb, *mine.shape[1:]),
                                              None),
                  reference(name, case, z, t, "none").reshape(ms, mb), "megatron_loss")
            zd = distribute_tensor(z, mesh, [Shard(1)])
            fn, kw = public(name, case)
            close(fn(zd, t, **kw).full_tensor(), reference(name, case, z, t, "mean"), "DTensor entry")
            close(SoftkLoss(SoftkLoss.Config(loss=name, **opts), group=dist.group.WORLD)(z[:, lo:hi], mine)[0],
                  reference(name, case, z, t, "sum"), "torchtitan's SoftkLoss on slices")
    # soft top-k's default method needs every entry for k > 1: refused on every rank, naming the fix
    y2 = torch.zeros(N, V, dtype=D)
    y2[:, :2] = 1.0
    with pytest.raises(ValueError, match="pass method=\"sparse\""):
        vocab_parallel_loss(torch.zeros(N, hi - lo, dtype=D), y2[:, lo:hi], "soft_topk", k=2)


@pytest.mark.slow
def test_vocab_parallel_entry_points_on_two_ranks(tmp_path):
    """vocab_parallel_loss, vocab_parallel_fused_linear_loss, megatron_loss, the DTensor entry and
    torchtitan's SoftkLoss on plain slices."""
    run(2, _ranks, tmp_path)
