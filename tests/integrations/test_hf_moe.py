"""softk.integrations.hf_moe on tiny transformers MoE models built from configs.

The references are independent of softk's router: the unpatched model (its
own router, experts and load-balancing loss), NumPy recomputations of the
statistics and the balance term, and the same model run without skipping.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import softk

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from softk.integrations.hf_moe import (  # noqa: E402
    ROUTERS, apply_softk_router, balance_loss, remove_softk_router, router_stats, switch_loss)

from ..matrix import product  # noqa: E402
from .moe_models import EXPERTS, FAMILIES, OTHER, SHARING, TOP_K, VOCAB, build, build_other, routers  # noqa: E402

SPARSE = {"sparsemax": {}, "entmax15": {}, "entmax": {"learn_alpha": True, "alpha": 1.3},
          "soft_topk": {"k": 2, "method": "sparse"}, "budget": {"k": 2}}


def batch(seed=1, shape=(2, 7)):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, shape, generator=g)


def loss_and_grads(model, ids, **kw):
    model.zero_grad()
    out = model(ids, labels=ids, **kw)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", FAMILIES)
def test_control_equals_the_models_own_router(family):
    """router="topk_softmax": loss, aux loss and every gradient equal the model's own (float64)."""
    model = build(family).train()
    ids = batch()
    own, own_grads = loss_and_grads(model, ids, output_router_logits=True)
    apply_softk_router(model, "topk_softmax")
    ours, grads = loss_and_grads(model, ids, output_router_logits=True)
    assert set(grads) == set(own_grads)
    torch.testing.assert_close(ours.loss, own.loss, rtol=0, atol=1e-10)
    if getattr(own, "aux_loss", None) is not None:
        torch.testing.assert_close(ours.aux_loss, own.aux_loss, rtol=0, atol=1e-10)
    for name, g in own_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=0, atol=1e-10, msg=name)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_control_keeps_the_models_dtypes_in_bfloat16(family):
    model = build(family, dtype=torch.bfloat16)
    ids = batch()
    gate = routers(model)[0]
    hidden = torch.randn(5, gate.weight.shape[-1], dtype=torch.bfloat16)
    own = gate(hidden)
    apply_softk_router(model, "topk_softmax")
    ours = gate(hidden)
    for a, b in zip(ours, own):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)
    assert torch.isfinite(model(ids).logits).all()
    # a sparse router: the map in float32, its weights in the model's own scores dtype
    apply_softk_router(model, "entmax", learn_alpha=True, tau=3.0)
    logits, weights, indices = gate(hidden)
    assert weights.dtype == own[1].dtype and logits.dtype == own[0].dtype
    alpha = 1 + torch.nn.functional.softplus(gate.softk_alpha_raw.detach())  # 1.5, to float32's rounding
    reference = softk.entmax(own[0].float(), alpha, dim=-1, tau=3.0)
    torch.testing.assert_close(weights.float(), reference.gather(1, indices).to(weights.dtype).float(), rtol=0, atol=0)
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and gate.softk_alpha_raw.grad is not None and torch.isfinite(gate.weight.grad).all()


@pytest.mark.parametrize("family, router", product(FAMILIES, list(SPARSE)))
def test_sparse_routers_train(family, router):
    """Five steps of SGD: finite losses, gradients on every router weight, a learned α moves, generate runs."""
    model = build(family).train()
    # τ = 3: supports of several experts (a token routed to one expert alone gives its router no gradient)
    apply_softk_router(model, router, tau=3.0, **SPARSE[router])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    alphas = [float(r.softk_alpha_raw.detach()) for r in routers(model) if hasattr(r, "softk_alpha_raw")]
    for step in range(5):
        optimizer.zero_grad()
        loss = model(batch(step), labels=batch(step)).loss
        assert torch.isfinite(loss)
        loss.backward()
        for r in routers(model):
            assert r.weight.grad is not None and torch.isfinite(r.weight.grad).all()
            assert r.weight.grad.abs().sum() > 0
        optimizer.step()
    if router == "entmax":
        assert len(alphas) == 2
        assert all(float(r.softk_alpha_raw.detach()) != a for r, a in zip(routers(model), alphas))
    model.eval()
    out = model.generate(batch()[:, :3], max_new_tokens=3, do_sample=False)
    assert out.shape == (2, 6)


def _route_rows(model, ids):
    """Each router's last (weights, indices) after a forward."""
    model(ids)
    return [(r._softk.last["weights"], r._softk.last["indices"]) for r in routers(model)]


@pytest.mark.parametrize("router", ["sparsemax", "entmax15"])
def test_weights_are_the_maps_own(router):
    """The returned weights are the map of the layer's logits at the top-k_max entries, zero-padded."""
    from softk import entmax15, sparsemax

    reference = {"sparsemax": sparsemax, "entmax15": entmax15}[router]
    model = build("olmoe")
    captured = []
    gate = routers(model)[0]
    gate.register_forward_hook(lambda m, args, out: captured.append((args[0], out)))
    apply_softk_router(model, router, k_max=4, tau=0.5)
    model(batch())
    hidden, (logits, weights, indices) = captured[-1]
    s = hidden.reshape(-1, hidden.shape[-1]) @ gate.weight.T
    p = reference(s / 0.5, dim=-1)
    top = torch.sort(p, dim=-1, descending=True).values[:, :4]
    torch.testing.assert_close(torch.sort(weights, -1, descending=True).values, top, rtol=0, atol=1e-12)
    torch.testing.assert_close(p.gather(1, indices), weights, rtol=0, atol=0)
    # the returned logits are log p, normalised: softmax of them is p
    torch.testing.assert_close(torch.softmax(logits, -1), p, rtol=0, atol=1e-12)
    assert (weights == 0).any() and (weights > 0).sum(-1).max() <= 4


def test_deepseek_routes_within_its_chosen_groups():
    """Live experts lie in the token's topk_group groups, chosen from p + bias; weights carry the scale."""
    model = build("deepseek_v3", routed_scaling_factor=2.5)
    apply_softk_router(model, "sparsemax", k_max=4)
    gate = routers(model)[0]
    captured = []
    gate.register_forward_hook(lambda m, args, out: captured.append(args[0]))
    model(batch())
    weights, indices = gate._softk.last["weights"], gate._softk.last["indices"]
    hidden = captured[-1].reshape(-1, gate.weight.shape[-1]).float()
    s = (hidden @ gate.weight.float().T).detach().double()
    size = EXPERTS // gate.num_group
    # independent recomputation: sparsemax by sorting (NumPy), then DeepSeek's group choice
    def sparsemax_np(z):
        u = np.sort(z)[::-1]
        css = np.cumsum(u)
        k = np.arange(1, len(z) + 1)
        r = k[u - (css - 1) / k > 0][-1]
        return np.maximum(z - (css[r - 1] - 1) / r, 0)
    bias = gate.e_score_correction_bias.double().numpy()
    for t in range(s.shape[0]):
        p = sparsemax_np(s[t].numpy())
        groups = np.sort((p + bias).reshape(gate.num_group, size), axis=1)[:, -2:].sum(1)
        allowed = np.zeros(EXPERTS, bool)
        for g in np.argsort(-groups)[: gate.topk_group]:
            allowed[g * size:(g + 1) * size] = True
        q = sparsemax_np(np.where(allowed, s[t].numpy(), -1e300))
        live = np.flatnonzero(q > 0)
        kept = set(live[np.argsort(-(q + bias)[live])[:4]].tolist())  # the bias steers which live ones stay
        got = {int(i) for i, w in zip(indices[t], weights[t]) if w != 0}
        assert got == kept
        np.testing.assert_allclose(sorted(weights[t][weights[t] != 0].double().numpy()),
                                   sorted(2.5 * q[sorted(kept)]), rtol=1e-5, atol=1e-6)


def _expert_flops(model, ids):
    """FLOPs of the experts' matmuls in one forward (torch's counter, by module)."""
    counter = FlopCounterMode(display=False)
    with counter:
        model(ids)
    per_module = counter.get_flop_counts()
    return sum(sum(v.values()) for name, v in per_module.items() if name.endswith(".experts"))


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss", "deepseek_v3"])
@pytest.mark.parametrize("experts", ["eager", "batched_mm", "grouped_mm"])
def test_zero_weights_run_no_expert(family, experts, monkeypatch):
    """With skip_zeros the experts run on the live (token, expert) pairs only, with the same output and gradients."""
    dtype = torch.float64 if experts == "eager" else torch.float32  # batched_mm: float32 on the CPU
    model = build(family, experts=experts, dtype=dtype)
    ids = batch(shape=(3, 9))
    apply_softk_router(model, "sparsemax", skip_zeros=False, tau=0.3)
    dense_out, dense_grads = loss_and_grads(model, ids)
    dense_flops = _expert_flops(model, ids)
    apply_softk_router(model, "sparsemax", skip_zeros=True, tau=0.3)
    sparse_out, sparse_grads = loss_and_grads(model, ids)
    sparse_flops = _expert_flops(model, ids)
    live = sum(int((r._softk.last["weights"] != 0).sum()) for r in routers(model))
    slots = sum(r._softk.last["weights"].numel() for r in routers(model))
    assert 0 < live < slots  # some zeros to skip
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(sparse_out.loss, dense_out.loss, rtol=0, atol=tol)
    for name, g in dense_grads.items():
        torch.testing.assert_close(sparse_grads[name], g, rtol=tol, atol=tol, msg=name)
    if experts == "grouped_mm":  # torch's counter does not see the CPU grouped_mm: count its rows
        from transformers.integrations import moe

        rows, grouped = [], moe._grouped_linear
        monkeypatch.setattr(moe, "_grouped_linear", lambda x, *a, **k: rows.append(x.shape[0]) or grouped(x, *a, **k))
        model(ids)
        assert rows == [n for r in routers(model) for n in [int((r._softk.last["weights"] != 0).sum())] * 2]
        return
    # the expert matmuls are linear in their rows: the same FLOPs per pair, run for the live pairs only
    assert dense_flops > 0 and dense_flops % slots == 0
    assert sparse_flops * slots == dense_flops * live


def test_expert_flops_count_the_live_pairs():
    """Eager Mixtral experts: 3 matmuls of H x I per (token, expert) pair, counted exactly."""
    model = build("mixtral")
    ids = batch(shape=(3, 9))
    cfg = model.config
    per_pair = 2 * cfg.hidden_size * 2 * cfg.intermediate_size + 2 * cfg.intermediate_size * cfg.hidden_size
    for skip in (False, True):
        apply_softk_router(model, "sparsemax", tau=0.3, skip_zeros=skip)
        flops = _expert_flops(model, ids)
        pairs = [r._softk.last["weights"] for r in routers(model)]
        counted = sum(int((w != 0).sum()) if skip else w.numel() for w in pairs)
        assert flops == per_pair * counted


@pytest.mark.parametrize("router", ["sparsemax", "entmax15", "budget"])
def test_controller_meets_its_target(router):
    """On a stream of random tokens the mean live experts per token settles within 10 % of the target."""
    model = build("olmoe").train()
    target = 1.5
    apply_softk_router(model, router, k_max=4, target=target, rate=0.2, **({"k": 1} if router == "budget" else {}))
    means = []
    with torch.no_grad():
        for step in range(60):
            model(batch(step, shape=(4, 16)))
            means.append(np.mean([s["active_mean"] for s in router_stats(model).values()]))
    settled = np.mean(means[-20:])
    assert abs(settled - target) <= 0.1 * target, (settled, means[:5], means[-5:])
    taus = [float(r.softk_tau) for r in routers(model)]
    assert all(t != 1.0 for t in taus)
    # eval mode freezes τ
    model.eval()
    model(batch())
    assert [float(r.softk_tau) for r in routers(model)] == taus


def test_router_stats_against_numpy():
    model = build("qwen3_moe")
    apply_softk_router(model, "sparsemax", k_max=3, tau=0.4)
    model(batch(shape=(3, 11)))
    stats = router_stats(model, capacity_factor=1.25)
    assert list(stats) == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    for name, r in zip(stats, routers(model)):
        w = r._softk.last["weights"].numpy()
        idx = r._softk.last["indices"].numpy()
        active = (w != 0).sum(1)
        load = np.bincount(idx[w != 0], minlength=EXPERTS).astype(float)
        capacity = 1.25 * w.shape[0] * 3 / EXPERTS
        s = stats[name]
        assert s["active_mean"] == pytest.approx(active.mean(), abs=1e-12)
        assert s["active_p95"] == pytest.approx(np.quantile(active, 0.95), abs=1e-12)
        np.testing.assert_array_equal(s["load"].numpy(), load)
        assert s["load_cv"] == pytest.approx(load.std() / load.mean(), rel=1e-12)
        assert s["over_capacity"] == pytest.approx(np.mean(load[idx[:, 0]] > capacity), abs=1e-12)


@pytest.mark.parametrize("router, alpha", [("topk_softmax", 1.0), ("sparsemax", 2.0), ("entmax15", 1.5)])
def test_balance_loss_is_the_tsallis_divergence(router, alpha):
    model = build("mixtral").train()
    apply_softk_router(model, router)
    model(batch())
    loss = balance_loss(model)
    expected = []
    for r in routers(model):
        p = r._softk.last["p"].detach().double().numpy()
        load = (p / p.sum(1, keepdims=True)).mean(0)
        if alpha == 1.0:
            expected.append(np.sum(load[load > 0] * np.log(load[load > 0])) + np.log(EXPERTS))
        else:
            expected.append((np.sum(load ** alpha) - EXPERTS ** (1 - alpha)) / (alpha * (alpha - 1)))
    precision = 1e-9 if loss.dtype == torch.float64 else 1e-6  # the control's p is float32, as the model's
    assert float(loss.detach()) == pytest.approx(np.mean(expected), rel=precision, abs=1e-12)
    loss.backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers(model))


def test_balance_loss_is_zero_at_a_uniform_load():
    model = build("mixtral")
    apply_softk_router(model, "sparsemax")
    for r in routers(model):
        r.weight.data.zero_()  # every token's scores tie: p is uniform
    model(batch())
    assert float(balance_loss(model).detach()) == pytest.approx(0.0, abs=1e-15)


def test_aux_loss_reads_the_routers_map():
    """The model's own load-balancing loss, computed from p with the Switch formula in NumPy."""
    model = build("mixtral").train()
    apply_softk_router(model, "sparsemax", tau=4.0)
    ids = batch()
    out = model(ids, output_router_logits=True)
    f_sum, p_sum, rows = np.zeros(EXPERTS), np.zeros(EXPERTS), 0
    for r in routers(model):
        p = r._softk.last["p"].detach().double().numpy()
        chosen = np.argsort(-p, axis=1, kind="stable")[:, :TOP_K]
        live = np.take_along_axis(p, chosen, 1) > 0
        f_sum += np.bincount(chosen[live], minlength=EXPERTS)
        p_sum += p.sum(0)
        rows += p.shape[0]
    # tokens whose support is smaller than top_k count ties among zero experts in transformers' loss;
    # with tau=4 and this seed every token keeps at least top_k experts, which the assertion checks
    assert all((r._softk.last["p"] > 0).sum(-1).min() >= TOP_K for r in routers(model))
    expected = EXPERTS * np.sum((f_sum / rows) * (p_sum / rows))
    assert float(out.aux_loss.detach()) == pytest.approx(expected, rel=1e-6)
    # every token has top_k live experts here, so the exact count agrees with transformers'
    assert float(switch_loss(model).detach()) == pytest.approx(float(out.aux_loss.detach()), rel=1e-6)  # transformers sums in float32


def test_switch_loss_counts_the_experts_that_run():
    """Tokens with fewer live experts than top_k: f counts them alone (NumPy), unlike transformers' count."""
    model = build("mixtral").train()
    apply_softk_router(model, "sparsemax", k_max=4, tau=0.3)
    out = model(batch(shape=(3, 9)), output_router_logits=True)
    f_sum, p_sum, rows, short = np.zeros(EXPERTS), np.zeros(EXPERTS), 0, 0
    for r in routers(model):
        p = r._softk.last["p"].detach().double().numpy()
        w, idx = r._softk.last["weights"].numpy(), r._softk.last["indices"].numpy()
        f_sum += np.bincount(idx[w != 0], minlength=EXPERTS)
        p_sum += (p / p.sum(1, keepdims=True)).sum(0)
        rows += p.shape[0]
        short += int(((w != 0).sum(1) < TOP_K).sum())
    assert short > 0  # some tokens run fewer than top_k experts
    loss = switch_loss(model)
    assert float(loss.detach()) == pytest.approx(EXPERTS * np.sum(f_sum / rows * p_sum / rows), rel=1e-12)
    assert float(loss.detach()) != pytest.approx(float(out.aux_loss.detach()), rel=1e-3)
    loss.backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers(model))


def test_remove_restores_the_model():
    model = build("gpt_oss")
    ids = batch()
    before = model(ids).logits
    names = [n for n, _ in model.named_parameters()]
    apply_softk_router(model, "entmax", learn_alpha=True, target=1.5)
    assert any("softk" in n for n, _ in model.named_parameters())
    apply_softk_router(model, "sparsemax")  # a second apply replaces the first
    assert not any("softk" in n for n, _ in model.named_parameters())
    remove_softk_router(model)
    assert [n for n, _ in model.named_parameters()] == names
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert torch.equal(model(ids).logits, before)


def test_remove_restores_forwards_set_on_the_instance():
    """A forward the user had put on the router or the experts instance comes back, after any number of applies."""
    model = build("mixtral")
    gate, experts = model.model.layers[0].mlp.gate, model.model.layers[0].mlp.experts
    calls = []
    own_gate, own_experts = gate.forward, experts.forward

    def gate_forward(hidden):
        calls.append("gate")
        return own_gate(hidden)

    def experts_forward(*args):
        calls.append("experts")
        return own_experts(*args)

    gate.forward, experts.forward = gate_forward, experts_forward
    before = model(batch()).logits
    apply_softk_router(model, "topk_softmax")
    apply_softk_router(model, "sparsemax")
    calls.clear()
    model(batch())
    assert calls == ["experts"]  # softk's router; the experts it wraps are the user's
    remove_softk_router(model)
    assert gate.__dict__["forward"] is gate_forward and experts.__dict__["forward"] is experts_forward
    assert torch.equal(model(batch()).logits, before)


def test_the_map_registry_names_every_router():
    assert set(ROUTERS) == {"topk_softmax", "sparsemax", "entmax15", "entmax", "soft_topk", "budget"}


class _OtherRouter(nn.Module):
    """Contract attributes, but no renormalisation of a softmax top-k that Mixtral would renormalise."""

    def __init__(self, gate):
        super().__init__()
        self.weight, self.top_k, self.num_experts = gate.weight, gate.top_k, gate.num_experts

    def forward(self, hidden):
        logits = hidden.reshape(-1, self.weight.shape[-1]) @ self.weight.T
        values, indices = torch.sigmoid(logits).topk(self.top_k, dim=-1)
        return logits, values, indices


@pytest.mark.parametrize("call, match", [
    (lambda m: apply_softk_router(m, "softmax"), "router"),
    (lambda m: apply_softk_router(m, "sparsemax", k_max=0), "k_max"),
    (lambda m: apply_softk_router(m, "sparsemax", k_max=EXPERTS + 1), "k_max"),
    (lambda m: apply_softk_router(m, "sparsemax", target=3), "target"),
    (lambda m: apply_softk_router(m, "sparsemax", target=0), "target"),
    (lambda m: apply_softk_router(m, "entmax", alpha=1.0), "alpha"),
    (lambda m: apply_softk_router(m, "entmax", alpha=float("nan")), "alpha"),
    (lambda m: apply_softk_router(m, "sparsemax", alpha=1.5), "alpha"),
    (lambda m: apply_softk_router(m, "sparsemax", k=2), "k applies"),
    (lambda m: apply_softk_router(m, "soft_topk", k=0), "k must"),
    (lambda m: apply_softk_router(m, "soft_topk", k=2, target=1), "target"),
    (lambda m: apply_softk_router(m, "topk_softmax", target=1), "target"),
    (lambda m: apply_softk_router(m, "soft_topk", method="nope"), "method"),
    (lambda m: apply_softk_router(m, "sparsemax", tau=0), "tau"),
    (lambda m: apply_softk_router(m, "sparsemax", rate=-1), "rate"),
])
def test_bad_arguments_name_the_parameter(call, match):
    model = build("mixtral")
    with pytest.raises((ValueError, TypeError), match=match):
        call(model)
    assert not any("forward" in m.__dict__ for m in model.modules())  # nothing patched


def test_a_model_without_moe_layers_is_refused():
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=20, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ValueError, match="no MoE layer"):
        apply_softk_router(llama, "sparsemax")


def test_an_unknown_router_is_refused_by_name():
    model = build("mixtral")
    layer = model.model.layers[1].mlp
    layer.gate = _OtherRouter(layer.gate)
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.gate \(_OtherRouter\)"):
        apply_softk_router(model, "sparsemax")
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_experts_without_a_router_are_refused_by_name():
    model = build("olmoe")
    del model.model.layers[0].mlp.gate
    with pytest.raises(ValueError, match=r"model.layers.0.mlp \(OlmoeSparseMoeBlock\) holds experts but no router"):
        apply_softk_router(model, "sparsemax")


@pytest.mark.parametrize("family", list(SHARING))
def test_families_sharing_the_contract_are_patched_exactly(family):
    """Other families whose router shares the contract: the control gives the model's own logits."""
    model = build_other(*SHARING[family])
    if model is None:
        pytest.skip(f"this transformers has no {family}")
    ids = batch(shape=(2, 6))
    own = model(ids).logits
    apply_softk_router(model, "topk_softmax")
    # GraniteMoE renormalises over the top-k logits in float32, the control over the top-k of a float32 softmax
    torch.testing.assert_close(model(ids).logits, own, rtol=0, atol=1e-7 if family == "granitemoe" else 1e-12)
    apply_softk_router(model, "sparsemax")
    assert torch.isfinite(model(ids).logits).all()


@pytest.mark.parametrize("family", list(OTHER))
def test_families_with_another_router_are_refused_by_name(family):
    config_name, model_name, refused = OTHER[family]
    model = build_other(config_name, model_name)
    if model is None:
        pytest.skip(f"this transformers has no {family}")
    with pytest.raises(ValueError, match=rf"\({refused}\) (does not route|holds experts but no router)"):
        apply_softk_router(model, "sparsemax")
    assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.slow
def test_compiles_in_one_graph_with_static_shapes():
    """skip_zeros=False under torch.compile(fullgraph=True): the eager loss, gradients and controller step."""
    model = build("mixtral", dtype=torch.float32, experts="grouped_mm", num_hidden_layers=1).train()
    apply_softk_router(model, "sparsemax", skip_zeros=False, target=1.5, tau=0.7)
    ids = batch()
    runs = []
    for run in (model, torch.compile(model, fullgraph=True)):
        for r in routers(model):  # the same state before each run: τ, and a previous count to step from
            r.softk_tau.fill_(0.7)
            r.softk_active.fill_(1.0)
        model.zero_grad()
        loss = run(ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        runs.append((loss.detach(), grads, [float(r.softk_tau) for r in routers(model)]))
    (eager_loss, eager_grads, eager_tau), (loss, grads, tau) = runs
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for name, g in eager_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-5, msg=name)
    assert tau == pytest.approx(eager_tau, rel=1e-6)
    assert tau == pytest.approx([0.7 * math.exp(0.05 * (1.5 - 1.0) / 1.5)], rel=1e-6)


@functools.lru_cache(maxsize=None)
def _block(family, scale):
    """One MoE block of ``family`` (float64), its router weights scaled by ``scale``."""
    model = build(family)
    block = model.model.layers[0].mlp
    with torch.no_grad():
        for r in routers(block):
            r.weight.mul_(scale)
    return block


@settings(max_examples=25, deadline=None)
@given(family=st.sampled_from(["olmoe", "deepseek_v3"]), router=st.sampled_from(list(SPARSE)),
       k_max=st.integers(1, EXPERTS), scale=st.sampled_from([0.01, 0.3, 1.0, 10.0]), seed=st.integers(0, 2**16))
def test_routing_invariants(family, router, k_max, scale, seed):
    """Whatever the scores: weights are the map's p at distinct experts (scaled on DeepSeek), at most k_max live,
    and off DeepSeek's bias the live experts are the largest p."""
    block = _block(family, scale)
    apply_softk_router(block, router, k_max=k_max, **SPARSE[router])
    gate = routers(block)[0]
    hidden = torch.randn(6, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    logits, weights, indices = gate(hidden)
    p = gate._softk.last["p"]
    assert weights.shape == indices.shape == (6, k_max)
    assert all(len(set(row.tolist())) == k_max for row in indices)
    assert (weights >= 0).all() and torch.isfinite(weights).all()
    live = weights != 0
    scale_out = getattr(gate, "routed_scaling_factor", 1.0)
    torch.testing.assert_close(weights[live], scale_out * p.gather(1, indices)[live], rtol=0, atol=0)
    total = 2 if router in ("soft_topk", "budget") else 1
    eps = torch.finfo(p.dtype).eps  # DeepSeek routes in float32
    assert (weights.sum(-1) <= scale_out * total * (1 + 8 * eps)).all()
    if family != "deepseek_v3":
        outside = p.scatter(1, indices, -1.0).amax(-1)
        smallest = torch.where(live, p.gather(1, indices), torch.inf).amin(-1)
        assert (live.sum(-1) == torch.minimum((p > 0).sum(-1), torch.tensor(k_max))).all()
        assert (smallest >= outside).all()
    # softmax of the returned logits is the map normalised to 1
    torch.testing.assert_close(torch.softmax(logits, -1), p / p.sum(-1, keepdim=True), rtol=0, atol=8 * eps)


@pytest.mark.parametrize("experts", ["eager", "grouped_mm"])
def test_experts_with_no_live_pair_return_zeros(experts):
    model = build("mixtral", dtype=torch.float32, experts=experts)
    apply_softk_router(model, "sparsemax")
    block = model.model.layers[0].mlp
    hidden = torch.randn(5, 16)
    out = block.experts(hidden, torch.zeros(5, 2, dtype=torch.long), torch.zeros(5, 2))
    assert torch.equal(out, torch.zeros_like(hidden))


def test_a_deep_copy_is_patched_on_its_own():
    """copy.deepcopy (a reference policy, an EMA model): the copy routes with its own weights, α and τ."""
    import copy

    model = build("mixtral").train()
    apply_softk_router(model, "entmax", learn_alpha=True, target=1.5)
    clone = copy.deepcopy(model)
    ids = batch()
    loss = clone(ids, labels=ids).loss
    torch.testing.assert_close(loss, model(ids, labels=ids).loss, rtol=0, atol=0)
    loss.backward()
    assert routers(clone)[0].softk_alpha_raw.grad is not None and routers(model)[0].softk_alpha_raw.grad is None
    assert routers(clone)[0]._softk.module is routers(clone)[0]
    assert routers(clone)[0]._softk.experts is clone.model.layers[0].mlp.experts
    remove_softk_router(clone)
    assert "forward" in routers(model)[0].__dict__ and "forward" not in routers(clone)[0].__dict__


def test_a_deep_copy_after_a_training_forward():
    """An EMA or best-model copy taken after a step: the last forward's p, kept
    with its graph for the losses, made deepcopy raise ("Only Tensors created
    explicitly by the user support the deepcopy protocol"); the copy starts
    with no forward of its own and routes as the model does."""
    import copy

    model = build("mixtral").train()
    apply_softk_router(model, "sparsemax")
    ids = batch()
    model(ids, labels=ids).loss.backward()
    model(ids)  # a forward whose graph is still alive
    clone = copy.deepcopy(model)
    assert routers(clone)[0]._softk.last is None and routers(model)[0]._softk.last is not None
    model.eval(), clone.eval()
    torch.testing.assert_close(clone(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_state_dict_restores_the_router_state():
    """A learned α, τ and the controller's count travel in state_dict into a freshly patched model."""
    model = build("mixtral").train()
    apply_softk_router(model, "entmax", learn_alpha=True, target=1.5)
    ids = batch()
    for _ in range(3):
        model(ids, labels=ids).loss.backward()
    with torch.no_grad():
        routers(model)[0].softk_alpha_raw.add_(0.3)
    state = model.state_dict()
    assert {k for k in state if "softk" in k} == {f"model.layers.{i}.mlp.gate.softk_{n}"
                                                  for i in range(2) for n in ("alpha_raw", "tau", "active")}
    fresh = build("mixtral", seed=5)
    apply_softk_router(fresh, "entmax", learn_alpha=True, target=1.5)
    fresh.load_state_dict(state)
    model.eval(), fresh.eval()
    assert torch.equal(fresh(ids).logits, model(ids).logits)
