r"""`softk experiment attention`: multi-head attention pooling over sequences,
with softk's attention op and five maps for the weights.

Claims tested: sparse attention gives sparse weights at similar accuracy
(Martins & Astudillo 2016, §4.3), and a learned α per head (Correia et al.
2019, "Adaptively Sparse Transformers") lets each head choose how sparse it is.

Data: MNIST-5k (:func:`~softk._experiments.common.load_mnist5k`) read as
sequences of 28 tokens (the image rows) of 28 features.  Model, for a
sequence :math:`x_1..x_{28}`:

.. math::
   h_t = \tanh(W_2\,\mathrm{relu}(W_1 x_t + e_t)),\quad k_t = W_k h_t,\quad v_t = W_v h_t,\quad
   o_h = \mathrm{SDPA}(q_h, K_h, V_h),\quad \text{logits} = U[o_1; …; o_4] + u_0

(:math:`e_t` a learned position embedding, width 64; 4 heads of width 16,
each with one learned query :math:`q_h`), trained with CE, Adam lr 3e-3,
batches of 64, 8 epochs, seeds 0, 1, 2 by default (``--help`` says what that
costs, measured).  The pooled heads are the only path from the tokens to the
classifier, so their supports are what the model reads.  SDPA is
:func:`softk.attention.scaled_dot_product_attention` with

* ``softmax``, ``sparsemax``, ``entmax15``: map="softmax" etc.;
* ``entmax_learned``: :class:`softk.nn.ScaledDotProductAttention` with
  map="entmax" and a learnable α per head (α = 1 + 2⁻²⁰ + (1 − 2⁻²⁰)·sigmoid(ρ), started
  at 1.5, trained with the rest);
* ``soft_topk_sparse``, for comparison (not an SDPA map): the scores formed
  explicitly, :func:`softk.soft_topk` (``method="sparse"``, k = 4) divided by k.

Reported per map, mean ± std over seeds, on the test set: accuracy, the
fraction of attention weights that are exactly 0, the mean support (non-zero
weights per head and sequence, of 28); for ``entmax_learned`` also the α each
head learned and each head's support.  The weights are read from the op
itself (values = the 28×28 identity, so the output is the weight row).

>>> import torch
>>> _ = torch.manual_seed(0)
>>> logits, a = AttentionClassifier("sparsemax")(torch.rand(2, 784))
>>> logits.shape, a.shape, bool(torch.allclose(a.sum(-1), torch.ones(2)))
(torch.Size([2, 10]), torch.Size([2, 28]), True)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import soft_topk
from ..nn.attention import ScaledDotProductAttention
from .common import Progress, fmt, load_mnist5k, mean_std, pyplot, save_figure, seeded, train_and_eval

MAPS = ("softmax", "sparsemax", "entmax15", "entmax_learned", "soft_topk_sparse")
TOPK_K = 4
# ``softk experiment attention --quick``: every map once, one seed, one epoch (a smoke test, not a result)
QUICK = {"seeds": (0,), "epochs": 1}
HEADS = 4


class AttentionClassifier(nn.Module):
    """Attention pooling (one learned query per head) over the 28 rows of an image, then a linear classifier."""

    def __init__(self, attn: str, width: int = 64, tokens: int = 28, features: int = 28, heads: int = HEADS):
        super().__init__()
        if attn not in MAPS:
            raise ValueError(f"attn must be one of {list(MAPS)}, got {attn!r}")
        self.attn, self.heads, self.tokens = attn, heads, tokens
        self.embed = nn.Linear(features, width)
        self.mix = nn.Linear(width, width)
        self.pos = nn.Parameter(torch.zeros(tokens, width))
        self.key, self.value = nn.Linear(width, width), nn.Linear(width, width)
        self.query = nn.Parameter(torch.randn(heads, 1, width // heads) / math.sqrt(width // heads))
        self.out = nn.Linear(width, 10)
        if attn == "entmax_learned":
            self.sdpa = ScaledDotProductAttention("entmax", alpha=1.5, num_heads=heads, learnable=True)
        elif attn != "soft_topk_sparse":
            self.sdpa = ScaledDotProductAttention(attn)

    def _split(self, t):
        """(N, 28, width) -> (N, heads, 28, width / heads)."""
        return t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)

    def _attend(self, k, v):
        q = self.query.expand(k.shape[0], -1, -1, -1)
        if self.attn == "soft_topk_sparse":
            s = (q @ k.transpose(-1, -2)) / math.sqrt(k.shape[-1])
            return (soft_topk(s, TOPK_K, method="sparse") / TOPK_K) @ v
        return self.sdpa(q, k, v)

    def _weights(self, k):
        """(N, heads, 28): each head's attention weights, read from the op with values = identity."""
        eye = torch.eye(self.tokens).expand(k.shape[0], self.heads, -1, -1)
        return self._attend(k, eye).squeeze(2)

    def head_weights(self, x):
        """(N, heads, 28): each head's attention weights."""
        return self._weights(self._split(self.key(self._encode(x))))

    def _encode(self, x):
        return torch.tanh(self.mix(torch.relu(self.embed(x.view(-1, self.tokens, 28)) + self.pos)))

    def forward(self, x):
        """x: (N, 784) → (logits (N, 10), attention (N, 28): the heads' mean weights, no gradient)."""
        h = self._encode(x)
        k = self._split(self.key(h))
        o = self._attend(k, self._split(self.value(h)))  # (N, heads, 1, width / heads)
        with torch.no_grad():
            a = self._weights(k).mean(1)
        return self.out(o.flatten(1)), a

    def alpha(self):
        """The learned α per head (entmax_learned), else None."""
        return self.sdpa.alpha.detach().tolist() if self.attn == "entmax_learned" else None


def run_attention(seeds=(0, 1, 2), epochs=8, n_train_per_class=400, n_test_per_class=100, maps=MAPS,
                  progress=True) -> dict:
    """Train every (map, seed); returns ``{"config", "runs": [...], "examples": {...}}``."""
    bad = [m for m in maps if m not in MAPS]
    if bad or not maps or not seeds:
        raise ValueError(f"maps must be a non-empty list drawn from {list(MAPS)} and seeds non-empty; got "
                         f"{list(maps)}, {list(seeds)}")
    Xtr, ytr, Xte, yte = load_mnist5k(n_train_per_class, n_test_per_class)
    show = torch.cat([torch.nonzero(yte == c).flatten()[:1] for c in (0, 2, 4, 7)])  # for the figure
    bar = Progress(len(seeds) * len(maps) * epochs, "attention", progress)
    runs, examples = [], {"images": Xte[show].tolist(), "labels": yte[show].tolist(), "attention": {}}
    for seed in seeds:
        for name in maps:
            gen = seeded(seed)
            model = AttentionClassifier(name)
            logits, a = train_and_eval(model, Xtr, ytr, Xte, epochs, 3e-3, gen, bar, f"{name} seed {seed}")
            with torch.no_grad():
                w = model.head_weights(Xte)  # (N, heads, 28)
            per_head = (w > 0).float().sum(-1).mean(0)
            run = {"map": name, "seed": seed, "acc": float((logits.argmax(-1) == yte).float().mean()),
                   "zero_fraction": float((w == 0).float().mean()), "support": float(per_head.mean()),
                   "support_per_head": per_head.tolist()}
            if model.alpha() is not None:
                run["alpha"] = model.alpha()
            runs.append(run)
            if seed == seeds[0]:
                examples["attention"][name] = a[show].tolist()
    bar.close()
    config = dict(seeds=list(seeds), epochs=epochs, n_train_per_class=n_train_per_class,
                  n_test_per_class=n_test_per_class, maps=list(maps), soft_topk_k=TOPK_K, heads=HEADS)
    return {"experiment": "attention", "config": config, "runs": runs, "examples": examples}


def markdown(result: dict) -> str:
    cfg = result["config"]
    out = [f"({len(cfg['seeds'])} seeds, mean ± std; test set of {10 * cfg['n_test_per_class']} sequences "
           f"of 28 tokens, {cfg.get('heads', HEADS)} heads)", "",
           "| attention map | test acc (%) | exact zeros (%) | mean support per head (of 28) | learned α (head mean) |",
           "|---|---:|---:|---:|---:|"]
    for name in cfg["maps"]:
        rs = [r for r in result["runs"] if r["map"] == name]
        alpha = fmt([mean_std(r["alpha"])[0] for r in rs], 1, 3) if "alpha" in rs[0] else "—"
        out.append(f"| {name} | {fmt([r['acc'] for r in rs], 100)} | {fmt([r['zero_fraction'] for r in rs], 100, 1)} "
                   f"| {fmt([r['support'] for r in rs], 1, 1)} | {alpha} |")
    learned = [r for r in result["runs"] if "alpha" in r]
    if learned:
        out += ["", "Learned α per head (sorted) and that head's mean support (of 28), per seed:", "",
                "| seed | α per head | support per head |", "|---:|---|---|"]
        for r in learned:
            pairs = sorted(zip(r["alpha"], r["support_per_head"]))
            out.append(f"| {r['seed']} | {', '.join(f'{a:.3f}' for a, _ in pairs)} "
                       f"| {', '.join(f'{s:.1f}' for _, s in pairs)} |")
    return "\n".join(out) + "\n"


def figure(result: dict, path: str) -> str:
    """Each example digit with each map's attention (mean over heads) over its rows (first seed)."""
    import numpy as np

    plt = pyplot()
    ex = result["examples"]
    maps = result["config"]["maps"]
    n = len(ex["labels"])
    fig, axes = plt.subplots(n, len(maps) + 1, figsize=(1.7 * (len(maps) + 1), 1.8 * n), squeeze=False)
    for i in range(n):
        axes[i][0].imshow(np.array(ex["images"][i]).reshape(28, 28), cmap="gray_r")
        axes[i][0].set_ylabel(f"digit {ex['labels'][i]}")
        for j, name in enumerate(maps):
            a = np.array(ex["attention"][name][i])
            ax = axes[i][j + 1]
            ax.barh(range(28), a, color=["C3" if v > 0 else "C7" for v in a])
            ax.set_ylim(27.5, -0.5)
            ax.set_xlim(0, max(a.max(), 1e-9) * 1.05)
            ax.set_title(f"{name}\n{int((a > 0).sum())} rows" if i == 0 else f"{int((a > 0).sum())} rows",
                         fontsize=7)
            ax.tick_params(labelsize=5)
    for ax in axes.ravel():
        ax.set_xticks([])
    axes[0][0].set_title("image (rows = tokens)", fontsize=7)
    fig.suptitle("attention over image rows (mean of the heads; row 0 at top), first seed", fontsize=9)
    return save_figure(fig, path)


def mean_of(result, name, key) -> float:
    return mean_std([r[key] for r in result["runs"] if r["map"] == name])[0]
