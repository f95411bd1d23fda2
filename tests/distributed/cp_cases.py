"""What each rank runs in the context-parallel attention tests (tests/distributed/test_context_parallel.py).

Every rank builds the same whole-sequence q, k, v (same seed), computes the
reference on one device with softk's reference backend (the scores
materialised, plain autograd: not the blockwise passes the ring reuses),
takes its own shard by the layout's positions, and compares its rows of the
output and its shards' gradients.  α's gradient is summed over the ranks
first (the data-parallel reduction of a replicated parameter).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import softk
import softk.attention as sa
from softk.distributed import context_parallel_attention
from softk.distributed import cp_ring
from softk.distributed.cp_plan import positions

D = torch.float64
B, H, HKV, E = 2, 4, 2, 8
ALPHAS = (1.2, 1.5, 1.7, 1.05)  # one per head: the learned-α case


def _inputs(total, dtype=D, seed=0, flat=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, total, E, generator=g, dtype=D) * 2
    k = torch.randn(B, HKV, total, E, generator=g, dtype=D) * 2
    v = torch.randn(B, HKV, total, E, generator=g, dtype=D)
    do = torch.randn(B, H, total, E, generator=g, dtype=D)
    if flat:  # every score of a row equal: every key a candidate of the λ search
        q = torch.zeros_like(q)
    return [t.to(dtype) for t in (q, k, v, do)]


def _alpha(map_name, alphas=ALPHAS):
    if map_name == "entmax-learned":
        return "entmax", torch.tensor(alphas, dtype=D, requires_grad=True)
    if map_name == "entmax":
        return "entmax", 1.3
    return map_name, None


def compare(rank, world, *, map_name, causal, layout, lengths, strategy, dtype=D, softcap=None, flat=False,
            alphas=ALPHAS, tol=1e-12):
    """Max |difference| of this rank's output and gradients (q, k, v; α summed over ranks) from one device's."""
    name, alpha = _alpha(map_name, alphas)
    q, k, v, do = _inputs(sum(lengths), dtype, flat=flat)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with softk.use_backend("torch"):
        ref = sa.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, enable_gqa=True, map=name, alpha=alpha,
                                              softcap=softcap)
    ref.backward(do)
    ref_da = alpha.grad.clone() if isinstance(alpha, torch.Tensor) else None
    if ref_da is not None:
        alpha.grad = None
    pos = positions(layout, lengths, rank, "cpu")
    ql, kl, vl = (t[:, :, pos].detach().clone().requires_grad_() for t in (q, k, v))
    out = context_parallel_attention(ql, kl, vl, is_causal=causal, enable_gqa=True, map=name, alpha=alpha,
                                     softcap=softcap, layout=layout, strategy=strategy)
    out.backward(do[:, :, pos])
    errs = {"out": out - ref[:, :, pos], "dq": ql.grad - qr.grad[:, :, pos], "dk": kl.grad - kr.grad[:, :, pos],
            "dv": vl.grad - vr.grad[:, :, pos]}
    if ref_da is not None:
        da = alpha.grad.clone() if alpha.grad is not None else torch.zeros_like(alpha)  # (a rank with no token)
        dist.all_reduce(da)
        errs["dalpha"] = da - ref_da
    worst = {key: float(e.detach().double().abs().max()) if e.numel() else 0.0 for key, e in errs.items()}
    bad = {key: e for key, e in worst.items() if not e <= tol}  # NaN fails too
    assert not bad, (f"rank {rank}/{world} {map_name} causal={causal} {layout} {lengths} {strategy} {dtype}: "
                     f"{bad} over {tol}")


MAPS = ("softmax", "sparsemax", "entmax15", "entmax", "entmax-learned")


def every_map(rank, world, strategy):
    """Every map, causal or not, contiguous uneven shards and head–tail, GQA, in float64."""
    uneven = [3 + 4 * r for r in range(world)][::-1]  # e.g. 7, 3 for two ranks
    for layout, lengths in (("contiguous", uneven), ("head_tail", [6] * world)):
        for map_name in MAPS:
            for causal in (False, True):
                compare(rank, world, map_name=map_name, causal=causal, layout=layout, lengths=lengths,
                        strategy=strategy)


def edges(rank, world, strategy):
    """A soft cap; flat rows (every key a candidate) with the ring's candidate buffer overflowing into
    its whole-row trip; α near 1 (the Newton trips); a rank holding a single token and one holding none."""
    cp_ring.CAP = 2  # rows past 2 candidates take the whole-row trip
    lengths = [1, 0] + [5] * (world - 2)
    compare(rank, world, map_name="entmax15", causal=True, layout="contiguous", lengths=lengths,
            strategy=strategy, softcap=3.0)
    for map_name in ("sparsemax", "entmax15", "entmax-learned"):
        for causal in (False, True):
            compare(rank, world, map_name=map_name, causal=causal, layout="head_tail", lengths=[8] * world,
                    strategy=strategy, flat=True)
            compare(rank, world, map_name=map_name, causal=causal, layout="contiguous", lengths=lengths,
                    strategy=strategy)
    compare(rank, world, map_name="entmax-learned", causal=True, layout="contiguous", lengths=lengths,
            strategy=strategy, alphas=(1.00001, 1.001, 1.01, 2.0))


def half(rank, world, strategy):
    """float32 / bfloat16 shards against one device's float64 attention, within what one device's
    attention of the same inputs is off by (×4 plus a few ulps of the output)."""
    for dtype, map_name in ((d, m) for d in (torch.float32, torch.bfloat16)
                            for m in ("sparsemax", "entmax15", "entmax-learned")):
        name, alpha = _alpha(map_name)
        q, k, v, _ = _inputs(18, dtype)
        ref64 = sa.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                                enable_gqa=True, map=name, alpha=alpha)
        local = sa.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, map=name, alpha=alpha)
        bound = 4 * float((local.double() - ref64).abs().max()) + 4 * torch.finfo(dtype).eps
        pos = positions("head_tail", [18 // world] * world, rank, "cpu")
        out = context_parallel_attention(q[:, :, pos], k[:, :, pos], v[:, :, pos], is_causal=True, enable_gqa=True,
                                         map=name, alpha=alpha, layout="head_tail", strategy=strategy)
        assert out.dtype == dtype
        err = float((out.double() - ref64[:, :, pos]).abs().max())
        assert err <= bound, (map_name, dtype, err, bound)


def _raises(fn, *words):
    try:
        fn()
    except ValueError as exc:
        for w in words:
            assert w in str(exc), (w, str(exc))
        return
    raise AssertionError(f"no ValueError (expected one naming {words})")


def bad_inputs(rank, world):
    """Each bad call raises a ValueError on every rank, and the ranks go on to the next call together."""
    q, k, v, _ = _inputs(8)
    sl = slice(4 * rank, 4 * rank + 4)
    ql, kl, vl = q[:, :, sl], k[:, :, sl], v[:, :, sl]

    def call(**kw):
        args = dict(query=ql, key=kl, value=vl, enable_gqa=True, map="sparsemax")
        args.update(kw)
        return lambda: context_parallel_attention(**args)

    other = rank == world - 1  # the one rank whose call differs
    _raises(call(key=kl[:, :, :3] if other else kl, value=vl[:, :, :3] if other else vl), "same tokens")
    _raises(call(map="entmax15" if other else "sparsemax"), "map")
    _raises(call(map="entmax", alpha=torch.tensor([1.5, 1.5, 1.5, 1.6 if other else 1.5], dtype=D)), "alpha")
    one_ulp = torch.nextafter(torch.tensor(1.5, dtype=D), torch.tensor(2.0, dtype=D))
    _raises(call(map="entmax", alpha=torch.tensor([1.5, 1.5, 1.5, 1.5], dtype=D) + (one_ulp - 1.5) * other),
            "alpha")  # one ulp apart
    _raises(call(scale=0.3 if other else 0.3 + 2**-54), "scale")
    _raises(call(query=ql[:, :2] if other else ql), "heads")
    _raises(call(attn_mask=torch.ones(4, 8, dtype=torch.bool) if other else None), "attn_mask")
    _raises(call(strategy="rings" if other else "ring"), "strategy")
    _raises(call(is_causal=other), "is_causal")
    _raises(call(layout="head_tail", query=ql[:, :, :3], key=kl[:, :, :3], value=vl[:, :, :3]), "head_tail", "even")
    _raises(call(map="entmax", alpha=0.5), "alpha")
    with softk.distributed.context_parallel(layout="contiguous"):
        _raises(lambda: sa.varlen_attn(ql[0].transpose(0, 1), kl[0].transpose(0, 1), vl[0].transpose(0, 1),
                                       torch.tensor([0, 4], dtype=torch.int32),
                                       torch.tensor([0, 4], dtype=torch.int32), 4, 4, enable_gqa=True),
                "varlen_attn", "context_parallel")
    out = context_parallel_attention(ql, kl, vl, enable_gqa=True, map="sparsemax")  # and the group still works
    assert out.shape == ql.shape


def inside_torch_context(rank, world):
    """softk's attention inside torch's own context_parallel is refused; inside softk's it runs the group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel as torch_context_parallel

    mesh = init_device_mesh("cpu", (world,))
    q, k, v, _ = _inputs(8)
    buf = torch.arange(8).unsqueeze(0)
    with torch_context_parallel(mesh, buffers=[buf], buffer_seq_dims=[1]):
        _raises(lambda: sa.scaled_dot_product_attention(q, k, v, enable_gqa=True), "torch's context parallelism",
                "softk.distributed.context_parallel")
    from torch.distributed.tensor.experimental._attention import (_disable_context_parallel_dispatcher,
                                                                  _enable_context_parallel_dispatcher)

    _enable_context_parallel_dispatcher()  # torchtitan's CP: torch's DTensor attention handlers, no patch
    try:
        _raises(lambda: sa.scaled_dot_product_attention(q, k, v, enable_gqa=True), "torch's context parallelism")
    finally:
        _disable_context_parallel_dispatcher()
    sa.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # and outside, it runs
    for total in (8, 10):  # head–tail (8 % 4 == 0), then contiguous: torch's choice, read back
        ids = torch.arange(total).unsqueeze(0)
        q, k, v, _ = _inputs(total)
        with softk.use_backend("torch"):
            ref = sa.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, map="entmax15")
        qs, ks, vs = (t.clone() for t in (q, k, v))
        with softk.distributed.context_parallel(mesh, buffers=[ids, qs, ks, vs], buffer_seq_dims=[1, 2, 2, 2]):
            out = sa.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True, map="entmax15")
            mine = ids[0].clone()  # the context restores the buffers on exit
        err = float((out - ref[:, :, mine]).abs().max())
        assert err <= 1e-12, (total, err)


def llama(rank, world, strategy, total):
    """A transformers Llama built from a config, on softk's attention (learned α per head too), under
    softk.distributed.context_parallel with torch's buffers: the loss and every parameter's gradient
    (summed over ranks) equal one device's."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaConfig, LlamaForCausalLM

    from softk.integrations import hf_attention

    hf_attention.register()
    for impl in ("softk_entmax15", "softk_entmax_learned"):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          attn_implementation=impl)
        model = LlamaForCausalLM(cfg)
        if impl == "softk_entmax_learned":
            hf_attention.learn_alpha(model, 1.3)
        model = model.double()  # α's parameters too
        ids = torch.randint(0, 64, (2, total + 1))
        inp, lab = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # labels shifted before sharding
        pos = torch.arange(total).expand(2, total).contiguous()
        count = lab.numel()  # the whole batch's tokens (the context shards lab in place)

        def loss_of(logits, labels):
            return torch.nn.functional.cross_entropy(logits.reshape(-1, 64), labels.reshape(-1),
                                                     reduction="sum") / count

        ref = loss_of(model(inp, position_ids=pos).logits, lab)
        ref.backward()
        ref_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        mesh = init_device_mesh("cpu", (world,))
        with softk.distributed.context_parallel(mesh, buffers=[inp, lab, pos], buffer_seq_dims=[1, 1, 1],
                                                strategy=strategy):
            loss = loss_of(model(inp, position_ids=pos).logits, lab)
            loss.backward()
        total_loss = loss.detach().clone()
        dist.all_reduce(total_loss)
        assert abs(float(total_loss - ref.detach())) <= 1e-12, (impl, float(total_loss), float(ref))
        for (name, p), g in zip(model.named_parameters(), ref_grads):
            mine = p.grad.clone()
            dist.all_reduce(mine)
            assert float((mine - g).abs().max()) <= 1e-12, (impl, name, float((mine - g).abs().max()), float(g.abs().max()))
    # a padded batch on one rank only: its mask reaches the context-parallel call, refused on every rank
    half = total // world
    shard = torch.randint(0, 64, (2, half))
    padding = torch.ones(2, half, dtype=torch.long)
    padding[0, 0] = 0 if rank == world - 1 else 1
    with softk.distributed.context_parallel(layout="contiguous"):
        _raises(lambda: model(shard, attention_mask=padding,
                              position_ids=torch.arange(rank * half, (rank + 1) * half).expand(2, half)), "attn_mask")


def torchtitan_llama(rank, world, strategy, learnable):
    """torchtitan's Llama 3 (its debug configuration, 2 layers), softk's attention in its inner-attention
    slot (apply_softk_attention with cp_mesh), the batch sharded by torchtitan's own
    prepare_context_parallel_input (head–tail): the summed loss and gradients equal one device's."""
    from dataclasses import replace

    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.context_parallel import prepare_context_parallel_input
    from torchtitan.models.llama3 import llama3_configs

    from softk.integrations.torchtitan_attention import apply_softk_attention

    cfg = llama3_configs["debugmodel"]("flex")  # its slot is replaced; the model is called with no masks
    cfg = replace(cfg, layers=cfg.layers[:2])
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    one = cfg.build()
    one.init_states()
    one = one.double()
    sharded = cfg.build()
    sharded.load_state_dict(one.state_dict())
    map_name, alpha = ("entmax", 1.3) if learnable else ("entmax15", None)
    apply_softk_attention(one, map_name, alpha, learnable=learnable)
    apply_softk_attention(sharded, map_name, alpha, learnable=learnable, cp_mesh=mesh, strategy=strategy)
    one, sharded = one.double(), sharded.double()
    total = 8 * world
    tokens = torch.randint(0, 2048, (2, total + 1))
    inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    positions = torch.arange(total).expand(2, total).contiguous()

    def loss_of(model, x, y, pos):
        logits = model(x, positions=pos)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / labels.numel()

    ref = loss_of(one, inputs, labels, positions)
    ref.backward()
    x, y, extra = prepare_context_parallel_input(inputs, labels, {"positions": positions}, mesh, torch.device("cpu"))
    assert x.shape[1] == total // world
    loss = loss_of(sharded, x, y, extra["positions"])
    loss.backward()
    summed = loss.detach().clone()
    dist.all_reduce(summed)
    assert abs(float(summed - ref.detach())) <= 1e-12, (float(summed), float(ref))
    for (name, p), q in zip(sharded.named_parameters(), one.parameters()):
        g = p.grad.clone()
        dist.all_reduce(g)
        assert float((g - q.grad).abs().max()) <= 1e-12, (name, float((g - q.grad).abs().max()))


def random_calls(rank, world, count, seed):
    """``count`` random calls, drawn alike on every rank: lengths (some 0) and layout, map, α per head,
    causal, heads and groups, head dims, scale, soft cap, both strategies, and scores with ties
    (integer q, k) or spread far; each against one device's reference backend in float64."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    for _ in range(count):
        layout = pick(["contiguous", "head_tail"])
        if layout == "head_tail":
            lengths = [2 * int(torch.randint(1, 5, (1,), generator=g))] * world
        else:
            lengths = torch.randint(0, 7, (world,), generator=g).tolist()
            lengths[int(torch.randint(world, (1,), generator=g))] += 1  # at least one token
        hkv, groups, e, ev = pick([1, 2]), pick([1, 3]), pick([1, 4, 8]), pick([1, 5])
        h = hkv * groups
        map_name = pick(["softmax", "sparsemax", "entmax15", "entmax"])
        alpha = None
        if map_name == "entmax":
            alpha = (1 + torch.rand(h, generator=g, dtype=D) * pick([1.0, 1e-3])).requires_grad_()
        ties = pick([True, False])
        total = sum(lengths)

        def draw(*shape):
            x = torch.randn(*shape, generator=g, dtype=D)
            return x.round() if ties else x * pick([0.5, 5.0])

        q, k, v, do = draw(2, h, total, e), draw(2, hkv, total, e), draw(2, hkv, total, ev), draw(2, h, total, ev)
        opts = dict(is_causal=pick([False, True]), scale=pick([None, 0.7]), softcap=pick([None, 2.0]),
                    enable_gqa=True, map=map_name, alpha=alpha)
        strategy = pick(["allgather", "ring"])
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        with softk.use_backend("torch"):
            ref = sa.scaled_dot_product_attention(qr, kr, vr, **opts)
        ref.backward(do)
        ref_da = alpha.grad.clone() if alpha is not None else None
        if alpha is not None:
            alpha.grad = None
        pos = positions(layout, lengths, rank, "cpu")
        ql, kl, vl = (t[:, :, pos].clone().requires_grad_() for t in (q, k, v))
        out = context_parallel_attention(ql, kl, vl, layout=layout, strategy=strategy, **opts)
        out.backward(do[:, :, pos])
        what = (layout, lengths, h, hkv, e, ev, opts, strategy, ties)
        for got, want in ((out, ref[:, :, pos]), (ql.grad, qr.grad[:, :, pos]), (kl.grad, kr.grad[:, :, pos]),
                          (vl.grad, vr.grad[:, :, pos])):
            err = float((got - want).detach().abs().max()) if got.numel() else 0.0
            assert err <= 1e-12 * (1 + float(want.detach().abs().max()) if want.numel() else 1), (err, what)
        if alpha is not None:
            da = alpha.grad.clone() if alpha.grad is not None else torch.zeros_like(alpha)
            dist.all_reduce(da)
            assert float((da - ref_da).abs().max()) <= 1e-12 * (1 + float(ref_da.abs().max())), what
