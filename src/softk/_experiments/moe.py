r"""`softk experiment moe`: a small Mixtral-shaped language model on Shakespeare,
its router replaced by each of softk's maps through
:func:`softk.integrations.hf_moe.apply_softk_router`.

**Question** (ReMoE, Wang et al. ICLR 2025; DTop-p; the sparsemax and entmax
routers of :func:`softk.route`): does a router that chooses how many experts a
token uses train a mixture-of-experts language model as well as softmax top-2,
at what expert compute, and with what balance across experts?  And does the
controller on τ hold a sparse router at a target count of experts?

**Data:** :mod:`.corpus`, as ``softk experiment lm`` reads it: 38 works train, 4
held-out works test; byte-level BPE trained on the training works.
**Model:** ``MixtralForCausalLM`` built from a ``transformers`` config (no
pre-trained weights): :data:`Config` layers of width ``hidden``, 8 SwiGLU
experts of width ``intermediate`` per layer, top-2, tied embeddings, eager
attention and the eager experts implementation (a loop over the experts hit).
**Training:** the model's own loss (``labels=``: cross-entropy plus Mixtral's
load-balancing term at ``aux_coef``, which reads the softk router's own map,
see :mod:`softk.integrations.hf_moe`), AdamW (β = 0.9, 0.95, weight decay 0.1)
on the schedule of ``lm`` (:func:`softk._experiments.lm.schedule`), batches of
windows of the training stream at positions drawn by the seed; every arm of a
seed starts from the same weights and sees the same batches.

**Arms:** :data:`softk._experiments.moe_arms.ARMS`.

**Metrics.**  On held-out windows (one in ``test_stride``): the perplexity of
the language-model cross-entropy; live experts per (token, layer), mean and
95th percentile; the load CV (population std / mean over the experts of the
(token, expert) pairs each received, per layer, averaged over the layers); and
the expert FLOPs per token actually run, :func:`expert_flops_per_pair` times
the live pairs (the zero weights run no expert).  These are counted by
:class:`RoutingCounter` from what each layer hands its experts.  Training
tokens/s; along training, every ``log_every`` steps, each layer's
:func:`~softk.integrations.hf_moe.router_stats` of that step's batch (the load
per expert, the live experts and τ).

>>> expert_flops_per_pair(QUICK)   # 2·H·2I (gate and up) + 2·I·H (down), H = 32, I = 64
12288
>>> load_cv([3.0, 1.0])   # std 1 / mean 2
0.5
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import torch

from softk.integrations.hf_moe import apply_softk_router, router_stats

from . import corpus
from .common import Progress, mean_std, pyplot, save_figure
from .lm import schedule
from .moe_arms import ARMS, K_MAX, TARGET  # noqa: F401  (re-exported)

CONTROL_TOLERANCE = 0.10  # the controller's check: mean live experts within 10 % of the target


class Config(NamedTuple):
    vocab: int = 512
    context: int = 128
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    experts: int = 8
    top_k: int = 2
    batch: int = 16
    steps: int = 200
    lr: float = 3e-3
    aux_coef: float = 0.01
    log_every: int = 10
    test_stride: int = 4  # the held-out metrics score one window in test_stride
    quick_chars: int | None = None  # --quick: a slice of the corpus


QUICK = Config(vocab=300, context=32, hidden=32, intermediate=64, heads=2, kv_heads=1, batch=8, steps=12, log_every=4,
               test_stride=1, quick_chars=20_000)


def expert_flops_per_pair(cfg: Config) -> int:
    """FLOPs of one expert on one token (multiply and add counted apart): the SwiGLU's
    gate-and-up matmul, H → 2I, and its down matmul, I → H."""
    return 2 * cfg.hidden * 2 * cfg.intermediate + 2 * cfg.intermediate * cfg.hidden


def load_cv(load) -> float:
    """Coefficient of variation of a load over the experts: population std / mean (0 when empty)."""
    v = torch.as_tensor(load, dtype=torch.float64)
    return float(v.std(correction=0) / v.mean()) if v.sum() > 0 else 0.0


def build_model(cfg: Config, seed: int):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    config = MixtralConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                           num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                           num_key_value_heads=cfg.kv_heads, num_local_experts=cfg.experts,
                           num_experts_per_tok=cfg.top_k, max_position_embeddings=cfg.context,
                           output_router_logits=True, router_aux_loss_coef=cfg.aux_coef, tie_word_embeddings=True,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = MixtralForCausalLM._from_config(config, attn_implementation="eager")
    model.set_experts_implementation("eager")
    return model


def apply_arm(model, arm: str):
    """``apply_softk_router(model, **ARMS[arm])``."""
    options = dict(ARMS[arm])
    return apply_softk_router(model, options.pop("router"), **options)


class RoutingCounter:
    """Counts, per layer, what the model hands its experts: the live (weight ≠ 0)
    slots of each token.  A forward pre-hook on every ``experts`` module beside a
    router; :meth:`result` gives the live experts per (token, layer), the load per
    expert of each layer and the live pairs in all."""

    def __init__(self, model, experts: int):
        self.experts = experts
        self.active: list[list[torch.Tensor]] = []
        self.loads: list[torch.Tensor] = []
        self.handles = []
        for module in model.modules():
            child = getattr(module, "experts", None)
            if isinstance(child, torch.nn.Module) and hasattr(module, "gate"):
                layer = len(self.loads)
                self.active.append([])
                self.loads.append(torch.zeros(experts, dtype=torch.float64))
                self.handles.append(child.register_forward_pre_hook(
                    lambda mod, args, layer=layer: self._record(layer, *args)))

    def _record(self, layer, hidden, index, weights):
        live = weights.detach() != 0
        self.active[layer].append(live.sum(-1).to(torch.float64))
        self.loads[layer] += torch.bincount(index[live], minlength=self.experts).to(torch.float64)

    def close(self):
        for h in self.handles:
            h.remove()

    def result(self) -> dict:
        per_layer = [torch.cat(a) for a in self.active]
        active = torch.cat(per_layer)
        return {"active_mean": float(active.mean()), "active_p95": float(torch.quantile(active, 0.95)),
                "active_per_layer": [float(a.mean()) for a in per_layer],
                "load": [load.tolist() for load in self.loads],
                "load_cv": sum(load_cv(load) for load in self.loads) / len(self.loads),
                "live_pairs": int(active.sum()), "tokens": len(per_layer[0])}


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, cfg: Config, chunk: int = 16) -> dict:
    """Held-out perplexity, live experts per (token, layer), load CV and expert FLOPs per token."""
    model.eval()
    counter = RoutingCounter(model, cfg.experts)
    nll, n = 0.0, 0
    try:
        for i in range(0, len(windows), chunk):
            ids = windows[i:i + chunk]
            z = model(input_ids=ids, output_router_logits=False).logits[:, :-1].reshape(-1, cfg.vocab).float()
            nll += float(torch.nn.functional.cross_entropy(z, ids[:, 1:].reshape(-1), reduction="sum"))
            n += ids[:, 1:].numel()
    finally:
        counter.close()
    r = counter.result()
    r["perplexity"] = math.exp(nll / n)
    r["expert_flops_per_token"] = r["live_pairs"] * expert_flops_per_pair(cfg) / r["tokens"]
    return r


def train(model, stream: torch.Tensor, cfg: Config, seed: int, bar: Progress) -> dict:
    """``cfg.steps`` AdamW steps of the model's own loss; the routing of every
    ``log_every``-th batch; training tokens/s (the logging left out)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(10_000 + seed)
    curve, elapsed = [], 0.0
    model.train()
    for step in range(cfg.steps):
        starts = torch.randint(0, len(stream) - cfg.context, (cfg.batch,), generator=gen)
        ids = torch.stack([stream[s:s + cfg.context] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = schedule(step, cfg.steps, cfg.lr)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        elapsed += time.perf_counter() - t0
        if step % cfg.log_every == 0 or step + 1 == cfg.steps:
            stats = router_stats(model).values()
            curve.append({"step": step + 1, "loss": float(loss.detach()),
                          "load": [(s["load"] / s["load"].sum()).tolist() for s in stats],
                          "active": [s["active_mean"] for s in stats], "load_cv": [s["load_cv"] for s in stats],
                          "tau": [s["tau"] for s in stats]})
        bar.step()
    return {"curve": curve, "tokens_per_s": cfg.steps * cfg.batch * cfg.context / elapsed}


def learned_alphas(model) -> list:
    """Each layer's learned α = 1 + softplus(ρ) (router="entmax", learn_alpha=True)."""
    return [float(1 + torch.nn.functional.softplus(m.softk_alpha_raw.detach()))
            for m in model.modules() if hasattr(m, "softk_alpha_raw")]


def run_moe(seeds=(0, 1, 2), arms=None, cfg: Config = Config(), corpus_path: str | None = None,
            progress: bool = True) -> dict:
    """Train and score every arm for every seed; returns the report (see :func:`markdown`)."""
    arms = list(ARMS if arms is None else arms)
    t_start = time.perf_counter()
    data, tok, train_stream, test_stream = corpus.prepare(corpus_path, cfg.vocab, cfg.quick_chars)
    cfg = cfg._replace(vocab=tok.get_vocab_size())
    test_windows = corpus.windows(test_stream, cfg.context)[::cfg.test_stride]
    bar = Progress(cfg.steps * len(arms) * len(seeds), "moe", progress)
    runs = []
    for seed in seeds:
        for arm in arms:
            bar.note = f"seed {seed} {arm}"
            model = apply_arm(build_model(cfg, seed), arm)
            t0 = time.perf_counter()
            fit = train(model, train_stream, cfg, seed, bar)
            wall = time.perf_counter() - t0
            result = {"arm": arm, "seed": seed, **ARMS[arm], **evaluate(model, test_windows, cfg),
                      "tokens_per_s": fit["tokens_per_s"], "train_wall_s": wall, "curve": fit["curve"],
                      "tau": [s["tau"] for s in router_stats(model).values()]}
            if ARMS[arm].get("learn_alpha"):
                result["learned_alpha"] = learned_alphas(model)
            runs.append(result)
    bar.close()
    return {"experiment": "moe", "config": cfg._asdict(), "seeds": list(seeds), "arms": arms,
            "corpus": {"distribution": corpus.DISTRIBUTION, "test_works": sorted(data.test),
                       "train_tokens": len(train_stream), "scored_tokens": int(test_windows[:, 1:].numel())},
            "expert_flops_per_pair": expert_flops_per_pair(cfg), "runs": runs,
            "wall_s": time.perf_counter() - t_start, "threads": torch.get_num_threads()}


def controller(report: dict) -> dict:
    """{arm: {"target", "held_out", "training"}} for the arms with a target: the mean live experts
    per (token, layer), mean over seeds, on the held-out windows and over the last quarter of
    the logged training batches; and the largest relative miss over seeds and both readings."""
    out = {}
    for arm in report["arms"]:
        target = ARMS[arm].get("target")
        if target is None:
            continue
        rows = [r for r in report["runs"] if r["arm"] == arm]
        late = [[sum(c["active"]) / len(c["active"]) for c in r["curve"][-max(1, len(r["curve"]) // 4):]] for r in rows]
        training = [sum(v) / len(v) for v in late]
        held_out = [r["active_mean"] for r in rows]
        out[arm] = {"target": target, "held_out": mean_std(held_out), "training": mean_std(training),
                    "worst_miss": max(abs(v / target - 1) for v in held_out + training)}
    return out


METRICS = ("perplexity", "active_mean", "active_p95", "load_cv", "expert_flops_per_token", "tokens_per_s")


def summary(report: dict) -> dict:
    """{arm: {metric: (mean, std)}} over seeds, for :data:`METRICS`."""
    return {arm: {m: mean_std([r[m] for r in report["runs"] if r["arm"] == arm]) for m in METRICS}
            for arm in report["arms"]}


def _cell(ms, digits, scale=1.0):
    return f"{ms[0] * scale:.{digits}f} ± {ms[1] * scale:.{digits}f}"


def markdown(report: dict) -> str:
    cfg = report["config"]
    lines = [
        f"Mixtral ({cfg['layers']} layers, width {cfg['hidden']}, {cfg['experts']} experts of width "
        f"{cfg['intermediate']}, top-{cfg['top_k']}, context {cfg['context']}, vocabulary {cfg['vocab']}) on "
        f"{report['corpus']['train_tokens']:,} training tokens, {cfg['steps']} steps of {cfg['batch']}×{cfg['context']} "
        f"tokens, load-balancing coefficient {cfg['aux_coef']:g}; held out: {', '.join(report['corpus']['test_works'])} "
        f"({report['corpus']['scored_tokens']:,} tokens scored); seeds {' '.join(map(str, report['seeds']))}; "
        f"mean ± std over seeds; one expert on one token: {report['expert_flops_per_pair']:,} FLOPs.",
        "",
        "| arm | router | held-out ppl | live experts / token | p95 | load CV | expert kFLOPs / token | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, c in summary(report).items():
        options = ", ".join(f"{k}={v}" for k, v in ARMS[arm].items() if k != "router")
        lines.append(f"| {arm} | {ARMS[arm]['router']}{f' ({options})' if options else ''} | "
                     f"{_cell(c['perplexity'], 2)} | {_cell(c['active_mean'], 2)} | {_cell(c['active_p95'], 1)} | "
                     f"{_cell(c['load_cv'], 2)} | {_cell(c['expert_flops_per_token'], 1, 1e-3)} | "
                     f"{c['tokens_per_s'][0]:,.0f} ± {c['tokens_per_s'][1]:,.0f} |")
    held = controller(report)
    if held:
        lines += ["", "| arm with a target | target | held-out live experts | training, last quarter | "
                  f"worst miss over seeds | within {CONTROL_TOLERANCE:.0%} |", "|---|---|---|---|---|---|"]
        for arm, h in held.items():
            lines.append(f"| {arm} | {h['target']:g} | {_cell(h['held_out'], 3)} | {_cell(h['training'], 3)} | "
                         f"{h['worst_miss']:.1%} | {'yes' if h['worst_miss'] <= CONTROL_TOLERANCE else 'no'} |")
    learned = [a for r in report["runs"] for a in r.get("learned_alpha", [])]
    if learned:
        lines += ["", f"learned α per layer (all seeds): min {min(learned):.3f}, max {max(learned):.3f}."]
    return "\n".join(lines) + "\n"


def figure(report: dict, path: str) -> str:
    """The share of each layer's (token, expert) pairs per expert along training, first seed,
    one panel per arm and layer (stacked: a balanced layer is eight even bands)."""
    plt = pyplot()
    arms, layers = report["arms"], report["config"]["layers"]
    seed = report["seeds"][0]
    fig, axes = plt.subplots(len(arms), layers, figsize=(4.2 * layers, 1.6 * len(arms)), sharex=True, sharey=True,
                             squeeze=False)
    colours = plt.cm.tab10.colors
    for row, arm in zip(axes, arms):
        curve = next(r for r in report["runs"] if r["arm"] == arm and r["seed"] == seed)["curve"]
        steps = [c["step"] for c in curve]
        for layer, ax in enumerate(row):
            shares = list(zip(*[c["load"][layer] for c in curve]))
            ax.stackplot(steps, shares, colors=colours[:len(shares)], linewidth=0)
            ax.set_ylim(0, 1)
            ax.set_title(f"{arm}, layer {layer}", fontsize=8)
            ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=8)
    fig.suptitle(f"share of the (token, expert) pairs per expert along training (seed {seed}; balanced: 1/8 each)",
                 fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
