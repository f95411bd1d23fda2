r"""`softk experiment lm`: a small causal language model trained on Shakespeare
with each of softk's losses and attention maps, side by side.

**Question** (TS², Xu et al. ICLR 2026; Martins et al. 2020, "Sparse Text
Generation"): what does a sparse loss or sparse attention instead of softmax
do to a language model's accuracy, calibration, kept vocabulary, speed and
memory?

**Data:** :mod:`.corpus`: 38 works train, 4 held-out works test (fixed);
byte-level BPE trained on the training works.  **Model:** GPT-2 built from a
``transformers`` config (no pre-trained weights), tied input/output
embeddings, no dropout.  **Training:** AdamW (β = 0.9, 0.95, weight decay
0.1), linear warm-up over the first 10 % of the steps then cosine decay to a
tenth of the peak rate, batches of windows of the training token stream
starting at positions drawn by the seed; the loss is softk's fused linear
loss through :func:`softk.integrations.transformers.apply_softk` (the
(tokens × V) logits are never held in training).

**Arms** (:data:`ARMS`), each ``regime/loss/attention``:

* ``scratch``: every loss of :data:`LOSSES` with softmax attention, and
  cross-entropy with each sparse attention of :data:`ATTENTIONS`;
* ``finetune`` (Su's claim for the sparse softmax, that it helps fine-tuning
  but may underfit from scratch): the seed's ``scratch/cross_entropy/softmax``
  model trained ``ft_steps`` more steps with each loss of :data:`FT_LOSSES` at
  a lower rate; ``finetune/cross_entropy/softmax`` is the control.

**Metrics** on the held-out tokens (:mod:`.lm_metrics`; one window in
``test_stride``, evenly spread over the four works) of the arm's own map
p (softmax for cross-entropy; sparsemax for the sparsemax and TS² losses,
whose Fenchel–Young map it is; 1.5-entmax; the top-k softmax for Su's loss),
plus the softmax perplexity of the same logits (TS²'s "decode with softmax"
reading).  Samples: greedy continuations of one held-out prompt, and sampled
continuations (softmax and own map) of :data:`N_PROMPTS` held-out prompts
scored by distinct-n.  Training throughput (tokens/s) is measured in every
run, and once per loss with and without the fused loss
(:func:`fused_vs_unfused`); the peak extra resident memory of a training step
of every configuration, fused and not, in a child process
(:mod:`.lm_memory`).

>>> [a for a in ARMS if a.startswith("finetune/")]
['finetune/cross_entropy/softmax', 'finetune/topk_softmax_ce/softmax', 'finetune/ts2/softmax']
>>> LOSSES["ts2_adaptive"].options
{'adaptive': True}
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from typing import Callable, NamedTuple

import torch

import softk
from softk.integrations import hf_attention
from softk.integrations.transformers import apply_softk, remove_softk
from softk.losses import (cross_entropy, entmax15_loss, sparsemax_loss, topk_softmax_cross_entropy, ts2_loss)

from . import corpus
from .common import Progress, mean_std, pyplot, save_figure
from .lm_arms import ARMS, ATTENTIONS, FT_LOSSES, LOSS_ARMS, REGIMES  # noqa: F401  (re-exported)
from .lm_memory import step_memory
from .lm_metrics import Accumulator, distinct_n

K = 20  # Su's sparse softmax keeps the top k = 20 of the vocabulary
EPS = 1e-6  # ε of the ε-perplexity
EPS_GRID = tuple(10.0 ** -e for e in range(1, 11))
N_PROMPTS, PROMPT_TOKENS, SAMPLE_TOKENS = 24, 16, 48


class Loss(NamedTuple):
    name: str  # as softk spells it
    options: dict
    own_map: Callable  # logits (n, V) -> p
    plain: Callable  # (logits (n, V), targets (n,)) -> mean loss, on materialised logits


LOSSES = {
    "cross_entropy": Loss("cross_entropy", {}, lambda z: torch.softmax(z, -1), cross_entropy),
    "sparsemax": Loss("sparsemax", {}, softk.sparsemax, sparsemax_loss),
    "entmax15": Loss("entmax15", {}, softk.entmax15, entmax15_loss),
    "ts2": Loss("ts2", {}, softk.sparsemax, ts2_loss),
    "ts2_adaptive": Loss("ts2", {"adaptive": True}, softk.sparsemax,
                         lambda z, y: ts2_loss(z, y, adaptive=True)),
    "topk_softmax_ce": Loss("topk_softmax_ce", {"k": K}, lambda z: softk.topk_softmax(z, K),
                            lambda z, y: topk_softmax_cross_entropy(z, y, K)),
}
class Config(NamedTuple):
    vocab: int = 8192
    context: int = 128
    width: int = 192
    layers: int = 3
    heads: int = 4
    batch: int = 16
    steps: int = 300
    ft_steps: int = 100
    lr: float = 2e-3
    ft_lr: float = 5e-4
    eval_every: int = 60
    curve_windows: int = 32  # held-out windows scored along training
    test_stride: int = 4  # the final metrics score every 4th held-out window
    quick_chars: int | None = None  # --quick: a slice of the corpus


QUICK = Config(vocab=512, context=32, width=32, layers=1, heads=2, batch=8, steps=16, ft_steps=8, eval_every=8,
               curve_windows=8, test_stride=1, quick_chars=20_000)


def arm_parts(arm: str) -> tuple:
    regime, loss, attention = arm.split("/")
    return regime, loss, attention


def build_model(cfg: Config, attention: str, seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_attention.register()
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=cfg.vocab, n_positions=cfg.context, n_embd=cfg.width, n_layer=cfg.layers,
                        n_head=cfg.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                        eos_token_id=0, tie_word_embeddings=True)
    model = GPT2LMHeadModel._from_config(config, attn_implementation=ATTENTIONS[attention])
    if attention == "entmax_learned":
        hf_attention.learn_alpha(model, alpha=1.5)
    return model


def schedule(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over 10 % of the steps, then cosine decay to peak / 10."""
    warm = max(1, steps // 10)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def make_step(model, loss: Loss, fused: bool, opt):
    """One AdamW step of ``loss`` on a batch of windows ``ids`` (B, T): ``step(ids)``.
    Fused: softk's fused linear loss through apply_softk (the model is patched);
    unfused: the model's (B, T, V) logits, then the loss on them."""
    if fused:
        apply_softk(model, loss.name, **loss.options)

    def step(ids):
        opt.zero_grad(set_to_none=True)
        if fused:
            value = model(input_ids=ids, labels=ids).loss
        else:
            z = model(input_ids=ids).logits[:, :-1].reshape(-1, model.config.vocab_size)
            value = loss.plain(z, ids[:, 1:].reshape(-1))
        value.backward()
        opt.step()

    return step


def train(model, stream: torch.Tensor, cfg: Config, loss: Loss, steps: int, peak_lr: float, seed: int,
          evaluate_curve: Callable, bar: Progress, step0: int = 0) -> dict:
    """``steps`` AdamW steps of ``loss`` (fused, through apply_softk); returns
    the held-out curve and the training tokens/s over the steps (held-out scoring left out)."""
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    step_fn = make_step(model, loss, True, opt)
    gen = torch.Generator().manual_seed(10_000 + seed + step0)
    curve, elapsed = [], 0.0
    starts_max = len(stream) - cfg.context
    model.train()
    for step in range(steps):
        starts = torch.randint(0, starts_max, (cfg.batch,), generator=gen)
        ids = torch.stack([stream[s:s + cfg.context] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = schedule(step, steps, peak_lr)
        t0 = time.perf_counter()
        step_fn(ids)
        elapsed += time.perf_counter() - t0
        if (step + 1) % cfg.eval_every == 0 or step + 1 == steps:
            model.eval()
            curve.append({"step": step0 + step + 1, **evaluate_curve(model)})
            model.train()
        bar.step()
    remove_softk(model)
    model.eval()
    return {"curve": curve, "tokens_per_s": steps * cfg.batch * cfg.context / elapsed}


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, own_map: Callable, chunk: int = 16) -> dict:
    """Every metric of :mod:`.lm_metrics` over the windows' next-token predictions
    (transformers' shift: position t predicts t + 1), plus the ε-perplexity at
    the best ε of :data:`EPS_GRID` (chosen on these tokens: an optimistic reading)."""
    acc = Accumulator(EPS)
    p_ys = []
    for i in range(0, len(windows), chunk):
        ids = windows[i:i + chunk]
        z = model(input_ids=ids).logits[:, :-1].reshape(-1, model.config.vocab_size).float()
        y = ids[:, 1:].reshape(-1)
        p = own_map(z)
        acc.add(p, y, torch.log_softmax(z, -1).gather(-1, y[:, None]).squeeze(-1))
        p_ys.append(p.gather(-1, y[:, None]).squeeze(-1).double())
    out = acc.result()
    p_y = torch.cat(p_ys)
    V = model.config.vocab_size
    tuned = {eps: math.exp(-float(torch.log((p_y + eps) / (1 + V * eps)).mean())) for eps in EPS_GRID}
    best = min(tuned, key=tuned.__getitem__)
    out["eps_perplexity_tuned"], out["eps_tuned"] = tuned[best], best
    return out


@torch.no_grad()
def generate(model, prompts: torch.Tensor, steps: int, pick: Callable, context: int) -> list:
    """Continuations of the prompts (n, t), ``steps`` tokens each; ``pick(logits (n, V))`` -> next ids (n,)."""
    ids = prompts
    for _ in range(steps):
        z = model(input_ids=ids[:, -context:]).logits[:, -1].float()
        ids = torch.cat([ids, pick(z)[:, None]], 1)
    return ids[:, prompts.shape[1]:].tolist()


def samples(model, tok, prompts: torch.Tensor, own_map: Callable, cfg: Config, seed: int) -> dict:
    """The greedy continuation of the first prompt (text), and distinct-1/2/3 of
    sampled continuations of every prompt under softmax and under the own map."""
    gen = torch.Generator().manual_seed(20_000 + seed)
    n_tokens = min(SAMPLE_TOKENS, cfg.context - prompts.shape[1])
    out = {"greedy": tok.decode(generate(model, prompts[:1], n_tokens, lambda z: z.argmax(-1), cfg.context)[0])}
    for name, to_p in (("softmax", lambda z: torch.softmax(z, -1)), ("own_map", own_map)):
        seqs = generate(model, prompts, n_tokens, lambda z: torch.multinomial(to_p(z), 1, generator=gen)[:, 0],
                        cfg.context)
        out[f"distinct_{name}"] = {f"distinct_{n}": distinct_n(seqs, n) for n in (1, 2, 3)}
        out[f"sample_{name}"] = tok.decode(seqs[0])
    return out


def fused_vs_unfused(cfg: Config, stream: torch.Tensor, losses, memory: dict, steps: int = 6) -> dict:
    """Per loss: training tokens/s over ``steps`` steps (after two warm-up steps),
    with the fused loss (apply_softk) and with the loss on materialised logits,
    same model, seed 0, in this process; and the peak MiB of a step from
    ``memory`` (:func:`~.lm_memory.step_memory`)."""
    out = {}
    gen = torch.Generator().manual_seed(0)
    batches = [torch.stack([stream[s:s + cfg.context] for s in
                            torch.randint(0, len(stream) - cfg.context, (cfg.batch,), generator=gen).tolist()])
               for _ in range(steps + 2)]
    for name in losses:
        row = {}
        for fused in (True, False):
            model = build_model(cfg, "softmax", 0)
            step = make_step(model, LOSSES[name], fused, torch.optim.AdamW(model.parameters(), lr=1e-4))
            for ids in batches[:2]:
                step(ids)
            t0 = time.perf_counter()
            for ids in batches[2:]:
                step(ids)
            dt = time.perf_counter() - t0
            row["fused" if fused else "unfused"] = {"tokens_per_s": steps * cfg.batch * cfg.context / dt,
                                                    "peak_mib": memory[(name, "softmax", fused)]}
        out[name] = row
    return out


def training_steps(arms, cfg: Config) -> int:
    """The AdamW steps one seed trains for ``arms``: ``cfg.steps`` per scratch arm, ``cfg.ft_steps``
    per fine-tuned one, and the cross-entropy base model's when the arms need it and leave it out.

    >>> training_steps(ARMS, QUICK), training_steps(ARMS, Config())
    (152, 2700)
    """
    n = sum(cfg.ft_steps if a.startswith("finetune/") else cfg.steps for a in arms)
    needs_base = any(a.startswith("finetune/") for a in arms) and "scratch/cross_entropy/softmax" not in arms
    return n + cfg.steps * needs_base


def run_lm(seeds=(0, 1, 2), arms=None, cfg: Config = Config(), corpus_path: str | None = None,
           progress: bool = True, out_dir: str | None = None, throughput: bool = True, memory: bool = True) -> dict:
    """Train and score every arm for every seed; returns the report (see :func:`markdown`).
    With ``out_dir``, each run's result is also written to ``runs/ARM-seedS.json`` as it ends.
    ``throughput``: also compare each loss fused and unfused (:func:`fused_vs_unfused`);
    ``memory``: measure each configuration's peak memory in a child process (else the
    figures are None; ``throughput`` implies it)."""
    arms = list(ARMS if arms is None else arms)
    t_start = time.perf_counter()
    data, tok, train_stream, test_stream = corpus.prepare(corpus_path, cfg.vocab, cfg.quick_chars)
    cfg = cfg._replace(vocab=tok.get_vocab_size())
    all_windows = corpus.windows(test_stream, cfg.context)
    test_windows = all_windows[::cfg.test_stride]
    curve_windows = all_windows[:: max(1, len(all_windows) // cfg.curve_windows)][: cfg.curve_windows]
    every = max(1, len(all_windows) // N_PROMPTS)
    starts = all_windows[every // 2::every][:N_PROMPTS]  # evenly spaced, past each work's title page
    prompts = starts[:, :PROMPT_TOKENS]
    if out_dir:
        os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
        tok.save(os.path.join(out_dir, "tokenizer.json"))

    def curve_eval(own_map):
        def score(model):
            r = evaluate(model, curve_windows, own_map)
            return {k: r[k] for k in ("softmax_perplexity", "eps_perplexity", "sparsemax_score", "accuracy",
                                      "support_mean")}
        return score

    losses_run = sorted({arm_parts(a)[1] for a in arms if arm_parts(a)[0] == "scratch"}, key=list(LOSSES).index)
    # (loss arm, attention, fused): every arm's own configuration, and each scratch loss unfused
    configs = ([(arm_parts(a)[1], arm_parts(a)[2], True) for a in arms]
               + ([(loss, "softmax", False) for loss in losses_run] if throughput else []))
    peak = step_memory(cfg, configs) if memory or throughput else dict.fromkeys(configs)
    needs_base = any(a.startswith("finetune/") for a in arms) and "scratch/cross_entropy/softmax" not in arms
    bar = Progress(training_steps(arms, cfg) * len(seeds), "lm", progress)
    runs = []
    for seed in seeds:
        base = None
        order = (["scratch/cross_entropy/softmax"] if needs_base else []) + arms
        for arm in order:
            regime, loss_name, attention = arm_parts(arm)
            loss = LOSSES[loss_name]
            bar.note = f"seed {seed} {arm}"
            if regime == "scratch":
                model = build_model(cfg, attention, seed)
                t0 = time.perf_counter()
                fit = train(model, train_stream, cfg, loss, cfg.steps, cfg.lr, seed, curve_eval(loss.own_map), bar)
                if arm == "scratch/cross_entropy/softmax":
                    base = copy.deepcopy(model)
                    if arm not in arms:
                        continue
            else:
                model = copy.deepcopy(base)
                t0 = time.perf_counter()
                fit = train(model, train_stream, cfg, loss, cfg.ft_steps, cfg.ft_lr, seed, curve_eval(loss.own_map),
                            bar, step0=cfg.steps)
            wall = time.perf_counter() - t0
            result = {"arm": arm, "regime": regime, "loss": loss.name, "loss_options": loss.options,
                      "attention": attention, "seed": seed, **evaluate(model, test_windows, loss.own_map),
                      "tokens_per_s": fit["tokens_per_s"], "peak_mib": peak[(loss_name, attention, True)], "train_wall_s": wall,
                      "curve": fit["curve"], **samples(model, tok, prompts, loss.own_map, cfg, seed)}
            if attention == "entmax_learned":
                result["learned_alpha"] = hf_attention.learned_alphas(model)
            runs.append(result)
            if out_dir:
                with open(os.path.join(out_dir, "runs", f"{arm.replace('/', '-')}-seed{seed}.json"), "w") as fh:
                    json.dump(result, fh, indent=1)
    bar.close()
    report = {
        "config": cfg._asdict(), "seeds": list(seeds), "arms": arms, "eps": EPS, "k": K,
        "corpus": {"distribution": corpus.DISTRIBUTION, "test_works": sorted(data.test),
                   "train_works": sorted(data.train), "train_tokens": len(train_stream),
                   "test_tokens": int(all_windows[:, 1:].numel()), "scored_tokens": int(test_windows[:, 1:].numel())},
        "prompt": tok.decode(prompts[0].tolist()),
        "human_distinct": {f"distinct_{n}": distinct_n(starts[:, PROMPT_TOKENS:PROMPT_TOKENS + SAMPLE_TOKENS].tolist(), n)
                           for n in (1, 2, 3)},
        "runs": runs,
    }
    if throughput:
        report["fused_vs_unfused"] = fused_vs_unfused(cfg, train_stream, losses_run, peak)
    report["wall_s"] = time.perf_counter() - t_start
    report["threads"] = torch.get_num_threads()
    return report


METRICS = ("eps_perplexity", "eps_perplexity_tuned", "softmax_perplexity", "sparsemax_score", "js_divergence",
           "accuracy", "support_mean", "support_p95", "ece", "tokens_per_s", "peak_mib")


def summary(report: dict) -> dict:
    """{arm: {metric: (mean, std)}} over seeds, for :data:`METRICS` and distinct-2 of both samplings."""
    out = {}
    for arm in report["arms"]:
        rows = [r for r in report["runs"] if r["arm"] == arm]
        cell = {m: mean_std([r[m] for r in rows]) for m in METRICS if all(r.get(m) is not None for r in rows)}
        for name in ("softmax", "own_map"):
            cell[f"distinct2_{name}"] = mean_std([r[f"distinct_{name}"]["distinct_2"] for r in rows])
        out[arm] = cell
    return out


def _cell(ms, digits):
    return f"{ms[0]:.{digits}f} ± {ms[1]:.{digits}f}"


def markdown(report: dict) -> str:
    cfg = report["config"]
    s = summary(report)
    lines = [
        f"GPT-2 ({cfg['layers']} layers, width {cfg['width']}, {cfg['heads']} heads, context {cfg['context']}, "
        f"vocabulary {cfg['vocab']}) on {report['corpus']['train_tokens']:,} training tokens, "
        f"{cfg['steps']} steps of {cfg['batch']}×{cfg['context']} tokens (fine-tuning: {cfg['ft_steps']} more); "
        f"held out: {', '.join(report['corpus']['test_works'])} ({report['corpus']['test_tokens']:,} tokens; one window "
        f"of {cfg['context']} in {cfg['test_stride']} scored, {report['corpus']['scored_tokens']:,} tokens); "
        f"seeds {' '.join(map(str, report['seeds']))}; mean ± std over seeds; ε = {report['eps']:g}.",
        "",
        "| arm | ε-ppl | ε-ppl, best ε | softmax ppl | sparsemax score | JS | accuracy % | support mean | "
        "support p95 | ECE % | distinct-2 softmax / own | tokens/s | peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, c in s.items():
        peak = _cell(c["peak_mib"], 0) if "peak_mib" in c else "n/a"
        lines.append(
            f"| {arm} | {_cell(c['eps_perplexity'], 1)} | {_cell(c['eps_perplexity_tuned'], 1)} | "
            f"{_cell(c['softmax_perplexity'], 1)} | {_cell(c['sparsemax_score'], 4)} | {_cell(c['js_divergence'], 4)} | "
            f"{c['accuracy'][0] * 100:.2f} ± {c['accuracy'][1] * 100:.2f} | {_cell(c['support_mean'], 1)} | "
            f"{_cell(c['support_p95'], 0)} | {c['ece'][0] * 100:.2f} ± {c['ece'][1] * 100:.2f} | "
            f"{c['distinct2_softmax'][0]:.3f} / {c['distinct2_own_map'][0]:.3f} | {c['tokens_per_s'][0]:,.0f} | {peak} |")
    h = report["human_distinct"]
    lines += ["", f"distinct-2 of the held-out text itself (the same {N_PROMPTS} stretches): {h['distinct_2']:.3f}."]
    if "fused_vs_unfused" in report:
        lines += ["", "| loss | tokens/s fused | tokens/s unfused | peak MiB fused | peak MiB unfused |",
                  "|---|---|---|---|---|"]
        for name, row in report["fused_vs_unfused"].items():
            f, u = row["fused"], row["unfused"]
            mib = (f"{f['peak_mib']:.0f} | {u['peak_mib']:.0f}" if f["peak_mib"] is not None else "n/a | n/a")
            lines.append(f"| {name} | {f['tokens_per_s']:,.0f} | {u['tokens_per_s']:,.0f} | {mib} |")
    learned = [r for r in report["runs"] if "learned_alpha" in r]
    if learned:
        alphas = torch.tensor([a for r in learned for layer in r["learned_alpha"] for a in layer])
        lines += ["", f"learned α per head (all seeds and layers): min {alphas.min():.3f}, median "
                  f"{alphas.median():.3f}, max {alphas.max():.3f}."]
    lines += ["", f"Greedy continuations (seed {report['seeds'][0]}) of the held-out prompt "
              f"{report['prompt']!r}:", ""]
    for r in report["runs"]:
        if r["seed"] == report["seeds"][0]:
            lines.append(f"* {r['arm']}: {r['greedy']!r}")
    return "\n".join(lines) + "\n"


def figure(report: dict, path: str) -> str:
    """Held-out softmax perplexity, ε-perplexity and sparsemax score along training, mean over seeds."""
    plt = pyplot()
    keys = (("softmax_perplexity", "softmax perplexity", True), ("eps_perplexity", f"ε-perplexity (ε = {EPS:g})", True),
            ("sparsemax_score", "sparsemax score", False))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = plt.cm.tab20.colors
    for i, arm in enumerate(report["arms"]):
        rows = [r for r in report["runs"] if r["arm"] == arm]
        steps = [c["step"] for c in rows[0]["curve"]]
        for ax, (key, title, log) in zip(axes, keys):
            ys = [sum(r["curve"][i][key] for r in rows) / len(rows) for i in range(len(steps))]
            ax.plot(steps, ys, label=arm, marker=".", color=colours[(2 * i) % 20 + (2 * i) // 20],
                    linestyle="--" if arm.startswith("finetune/") else "-")
            ax.set_title(title)
            ax.set_xlabel("step")
            if log:
                ax.set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.2))
    fig.suptitle("held-out curves (the scored subset of the held-out windows), mean over seeds")
    return save_figure(fig, path)
