"""What each rank runs in tests/distributed/test_fsdp_fused.py (imported by the spawned processes).

A GPT-2 built from a small config (float64, no dropout) under FSDP2
(``fully_shard``) on the gloo ranks, trained one step on softk's fused linear
loss through ``apply_softk``, in the four layouts of the LM head:

1. ``root``: only the root is a unit (the head is in it);
2. ``blocks``: every block and the root (the head in the root);
3. ``head``: the head is a unit of its own;
4. ``norm_head``: the head grouped with the final norm, as torchtitan does
   (``fully_shard([ln_f, lm_head])``).

With tied embeddings FSDP refuses 3 and 4 as written, the embedding's weight
being the head's and each parameter belonging to one unit: the tied variants
put the embedding in the head's unit (``[wte, lm_head]`` and
``[wte, ln_f, lm_head]``), as FSDP's error says to.

The expected values come from one process with no FSDP: the same model's
logits on each rank's batch, the loss on them by ``F.cross_entropy`` or
softk's unfused ``sparsemax_loss`` (the labels shifted as transformers does),
and the gradients of the mean of the ranks' losses (FSDP averages the
gradients over the ranks).  Everything is float64, so the fused loss's
chunked sums and the reduce-scatter's order differ from the reference by
rounding only (a few ulps of sums of tens of terms); the tolerance, 1e-9
relative, is far below what a gradient reduced over one rank only, or read
from the wrong weight, would miss by.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

from softk import losses as L
from softk.integrations.fsdp import check_weight, fsdp_fused_linear_loss
from softk.integrations.transformers import apply_softk

D = torch.float64
V, H, LAYERS, T, B = 48, 16, 2, 7, 2
RTOL, ATOL = 1e-9, 1e-12
LAYOUTS = ("root", "blocks", "head", "norm_head")


class AllGathers:
    """Counts FSDP's all-gathers: every one goes through ``dist.all_gather_single`` (its default collective)."""

    def __init__(self):
        self.n = 0

    def __enter__(self):
        self._orig = dist.all_gather_single

        def counted(*args, **kwargs):
            self.n += 1
            return self._orig(*args, **kwargs)

        dist.all_gather_single = counted
        return self

    def __exit__(self, *exc):
        dist.all_gather_single = self._orig


def gpt2(tied):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=V, n_positions=16, n_embd=H, n_layer=LAYERS, n_head=2, bos_token_id=0, eos_token_id=0,
                     tie_word_embeddings=tied, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg).to(D)


def shard(model, layout, tied):
    """``fully_shard`` bottom-up in ``layout``; the number of units that reshard after forward (all but the root)."""
    t = model.transformer
    if layout in ("blocks", "head", "norm_head"):
        for block in t.h:
            fully_shard(block)
    embedding = [t.wte] if tied else []
    if layout == "head":
        fully_shard(embedding + [model.lm_head] if tied else model.lm_head)
    if layout == "norm_head":
        fully_shard(embedding + [t.ln_f, model.lm_head])
    fully_shard(model)
    return {"root": 0, "blocks": LAYERS, "head": LAYERS + 1, "norm_head": LAYERS + 1}[layout]


def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = ids.clone()
    labels[0, 2 + rank] = -100  # an ignored label, a different one on each rank
    return ids, labels


def reference_loss(model, ids, labels, loss):
    z = model(ids).logits[:, :-1].reshape(-1, V)
    t = labels[:, 1:].reshape(-1)
    if loss == "cross_entropy":
        return F.cross_entropy(z, t)
    return L.sparsemax_loss(z, t)


def reference(world, tied, loss):
    """One process: each rank's loss, and every parameter's gradient of their mean."""
    model = gpt2(tied)
    losses = [reference_loss(model, *batch(r), loss) for r in range(world)]
    torch.stack(losses).mean().backward()
    return [x.detach() for x in losses], {n: p.grad for n, p in model.named_parameters()}


def close(got, want, what):
    if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
        err = (got - want).abs().max().item()
        raise AssertionError(f"{what}: max abs error {err:.3g} (want within rtol={RTOL}, atol={ATOL})")


def one_layout(rank, world, layout, loss, tied, apply_first=True, return_logits=False):
    want_losses, want_grads = reference(world, tied, loss)
    model = gpt2(tied)
    if apply_first:
        apply_softk(model, loss, return_logits=return_logits)
    resharded_units = shard(model, layout, tied)
    if not apply_first:
        apply_softk(model, loss, return_logits=return_logits)
    ids, labels = batch(rank)
    with AllGathers() as forward:
        out = model(ids, labels=labels)
    # Reshard-after-forward stayed on: a head in a unit of its own is a shard again once the forward is over.
    head_sharded = isinstance(model.lm_head.weight, DTensor)
    if head_sharded != (layout in ("head", "norm_head")):
        raise AssertionError(f"{layout}: after the forward, lm_head.weight is {type(model.lm_head.weight).__name__}")
    with AllGathers() as backward:
        out.loss.backward()
    what = f"{layout} {loss} tied={tied} rank {rank}"
    close(out.loss.detach(), want_losses[rank], f"{what}: loss")
    if return_logits:
        close(out.logits.detach(), gpt2(tied)(ids).logits.detach(), f"{what}: logits")
    elif out.logits is not None:
        raise AssertionError(f"{what}: logits {type(out.logits).__name__}, want None")
    # Each unit all-gathers once in the forward and each unit but the root once more in the backward,
    # as for the model's own loss: the fused loss adds none.
    units = resharded_units + 1
    if (forward.n, backward.n) != (units, resharded_units):
        raise AssertionError(f"{what}: {forward.n} all-gathers in the forward and {backward.n} in the backward, "
                             f"want {units} and {resharded_units}")
    for name, p in model.named_parameters():
        if not isinstance(p.grad, DTensor):
            raise AssertionError(f"{what}: {name}.grad is {type(p.grad).__name__}, want FSDP's sharded DTensor")
        close(p.grad.full_tensor(), want_grads[name], f"{what}: {name}.grad")


def own_loss_all_gathers(rank, layout, tied):
    """The model's own loss in ``layout``: the all-gathers of a forward and a backward, for comparison."""
    model = gpt2(tied)
    shard(model, layout, tied)
    ids, labels = batch(rank)
    with AllGathers() as forward:
        out = model(ids, labels=labels)
    with AllGathers() as backward:
        out.loss.backward()
    return forward.n, backward.n


class TwoLayers(nn.Module):
    """A body and an output layer whose forward computes the fused loss inside the head's unit."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.body = nn.Linear(H, H, dtype=D)
        self.head = nn.Linear(H, V, dtype=D)

    def forward(self, x, target, loss):
        return fsdp_fused_linear_loss(self.head, torch.tanh(self.body(x)), target, loss=loss)


def functional(rank, world, loss):
    """``fsdp_fused_linear_loss`` on a head that is its own unit, against one process's unfused loss;
    ``check_weight`` on the shard it would otherwise read."""
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(5, H, dtype=D, generator=g) for _ in range(world)]
    ts = [torch.randint(0, V, (5,), generator=g) for _ in range(world)]
    ref = TwoLayers()
    lossfn = F.cross_entropy if loss == "cross_entropy" else L.sparsemax_loss
    want = [lossfn(ref.head(torch.tanh(ref.body(x))), t) for x, t in zip(xs, ts)]
    torch.stack(want).mean().backward()
    net = TwoLayers()
    fully_shard(net.head)
    fully_shard(net)
    with AllGathers() as forward:
        got = net(xs[rank], ts[rank], loss)
    with AllGathers() as backward:
        got.backward()
    what = f"fsdp_fused_linear_loss {loss} rank {rank}"
    close(got.detach(), want[rank].detach(), f"{what}: loss")
    if (forward.n, backward.n) != (2, 1):
        raise AssertionError(f"{what}: all-gathers {forward.n} + {backward.n}, want 2 + 1")
    for name, p in net.named_parameters():
        close(p.grad.full_tensor(), dict(ref.named_parameters())[name].grad, f"{what}: {name}.grad")
    # Outside its unit's forward the head's weight is the shard: the check names weight and the way out.
    try:
        check_weight(net.head.weight, xs[rank])
    except ValueError as e:
        if not str(e).startswith("weight is a DTensor") or "fsdp_fused_linear_loss" not in str(e):
            raise AssertionError(f"check_weight's message: {e}") from None
    else:
        raise AssertionError("check_weight accepted an FSDP shard with a plain input")


def head_sharded_elsewhere(rank, world):
    """A head whose weight is a DTensor not gathered by any unit of its own (tensor parallelism, or a unit
    around the head): apply_softk refuses it with a ValueError instead of torch's mixed-tensor error."""
    model = gpt2(tied=False)
    mesh = init_device_mesh("cpu", (world,))
    model.lm_head.weight = nn.Parameter(distribute_tensor(model.lm_head.weight.detach(), mesh, [Shard(0)]))
    apply_softk(model, "cross_entropy")
    ids, labels = batch(rank)
    try:
        model(ids, labels=labels)
    except ValueError as e:
        if "weight is a DTensor" not in str(e) or "fully_shard(model.lm_head)" not in str(e):
            raise AssertionError(f"apply_softk's message: {e}") from None
    else:
        raise AssertionError("apply_softk read a sharded head weight without an error")


def default_checks(rank, world):
    """The default tier: the four layouts with cross-entropy, two with sparsemax, the functional path,
    and the plain fused loss refusing a shard."""
    one_layout(rank, world, "root", "cross_entropy", tied=True)
    one_layout(rank, world, "blocks", "cross_entropy", tied=True, apply_first=False)
    one_layout(rank, world, "head", "cross_entropy", tied=False)
    one_layout(rank, world, "norm_head", "cross_entropy", tied=False, apply_first=False)
    one_layout(rank, world, "head", "sparsemax", tied=False, apply_first=False)
    one_layout(rank, world, "norm_head", "sparsemax", tied=False)
    functional(rank, world, "cross_entropy")
    head_sharded_elsewhere(rank, world)
    plain_call_with_a_shard(rank, world)


def all_checks(rank, world):
    """Every layout × loss × tied (grouped with the embedding where FSDP needs it), return_logits,
    and the all-gathers of the model's own loss, which the fused loss must match."""
    for layout in LAYOUTS:
        for tied in (False, True):
            for loss in ("cross_entropy", "sparsemax"):
                one_layout(rank, world, layout, loss, tied=tied, apply_first=(loss == "sparsemax"))
            own = own_loss_all_gathers(rank, layout, tied)
            resharded = {"root": 0, "blocks": LAYERS}.get(layout, LAYERS + 1)
            if own != (resharded + 1, resharded):
                raise AssertionError(f"{layout} tied={tied}: the model's own loss all-gathers {own}")
    one_layout(rank, world, "head", "cross_entropy", tied=False, return_logits=True)
    one_layout(rank, world, "norm_head", "sparsemax", tied=True, return_logits=True)
    functional(rank, world, "sparsemax")


def plain_call_with_a_shard(rank, world):
    """``softk.losses.fused_linear_loss`` handed an FSDP-style shard (a DTensor sharded on dim 0) and a plain input."""
    from softk.losses import fused_linear_loss

    mesh = init_device_mesh("cpu", (world,))
    weight = distribute_tensor(torch.randn(V, H, dtype=D), mesh, [Shard(0)])
    try:
        fused_linear_loss(torch.randn(3, H, dtype=D), weight, torch.zeros(3, dtype=torch.long))
    except ValueError as e:
        if "weight" not in str(e):
            raise AssertionError(f"the ValueError does not name weight: {e}") from None
    else:
        raise AssertionError("fused_linear_loss accepted a sharded weight with a plain input")
