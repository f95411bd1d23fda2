r"""`softk experiment attention`: an attention classifier over sequences, with
five maps for the attention weights.

The claim tested (sparsemax's seed): sparse attention gives sparse, more
interpretable weights at similar accuracy.

Data: MNIST-5k (:func:`~softk.experiments.common.load_mnist5k`) read as
sequences of 28 tokens (the image rows) of 28 features.  Model, for a
sequence :math:`x_1..x_{28}`:

.. math::
   h_t = \tanh(W_2\,\mathrm{relu}(W_1 x_t + e_t)),\quad s_t = v^\top h_t,\quad
   a = \mathrm{map}(s),\quad c = \sum_t a_t h_t,\quad \text{logits} = U c + u_0

(:math:`e_t` a learned position embedding, width 64), trained with CE, Adam
lr 3e-3, batches of 64.  The single attention distribution is the only
path from the tokens to the classifier, so its support is what the model
reads.  Maps (all rows sum to 1):

* ``softmax``, ``sparsemax``, ``entmax15`` — :func:`softk.softmax` etc.;
* ``entmax_learned`` — :class:`softk.nn.Entmax` with ``learnable=True``
  (α = 1 + softplus(ρ), started at 1.5, trained with the rest);
* ``soft_topk_sparse`` — :func:`softk.soft_topk` (``method="sparse"``, the
  capped-simplex projection) with k = 4, divided by k.

Reported per map, mean ± std over seeds: test accuracy, the fraction of
attention weights that are exactly 0, and the mean support size (non-zero
weights per sequence, of 28), on the test set; for ``entmax_learned`` also the
learned α.

>>> import torch
>>> _ = torch.manual_seed(0)
>>> logits, a = AttentionClassifier("sparsemax")(torch.rand(2, 784))
>>> logits.shape, a.shape, bool(torch.allclose(a.sum(-1), torch.ones(2)))
(torch.Size([2, 10]), torch.Size([2, 28]), True)
"""

from __future__ import annotations

import torch
from torch import nn

from .. import entmax15, soft_topk, softmax, sparsemax
from ..nn import Entmax
from .common import Progress, fmt, load_mnist5k, mean_std, pyplot, save_figure, seeded, train_and_eval

MAPS = ("softmax", "sparsemax", "entmax15", "entmax_learned", "soft_topk_sparse")
TOPK_K = 4


class AttentionClassifier(nn.Module):
    """Additive single-query attention over the 28 rows of an image, then a linear classifier."""

    def __init__(self, attn: str, width: int = 64, tokens: int = 28, features: int = 28):
        super().__init__()
        if attn not in MAPS:
            raise ValueError(f"attn must be one of {list(MAPS)}, got {attn!r}")
        self.attn = attn
        self.embed = nn.Linear(features, width)
        self.mix = nn.Linear(width, width)
        self.pos = nn.Parameter(torch.zeros(tokens, width))
        self.score = nn.Linear(width, 1, bias=False)
        self.out = nn.Linear(width, 10)
        self.entmax = Entmax(alpha=1.5, learnable=True) if attn == "entmax_learned" else None

    def weights(self, s):
        if self.attn == "softmax":
            return softmax(s)
        if self.attn == "sparsemax":
            return sparsemax(s)
        if self.attn == "entmax15":
            return entmax15(s)
        if self.attn == "entmax_learned":
            return self.entmax(s)
        return soft_topk(s, TOPK_K, method="sparse") / TOPK_K

    def forward(self, x):
        """x: (N, 784) → (logits (N, 10), attention (N, 28))."""
        h = torch.tanh(self.mix(torch.relu(self.embed(x.view(-1, 28, 28)) + self.pos)))
        a = self.weights(self.score(h).squeeze(-1))
        return self.out((a.unsqueeze(-1) * h).sum(1)), a


def run_attention(seeds=(0, 1, 2, 3, 4), epochs=20, n_train_per_class=400, n_test_per_class=100, maps=MAPS,
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
            run = {"map": name, "seed": seed, "acc": float((logits.argmax(-1) == yte).float().mean()),
                   "zero_fraction": float((a == 0).float().mean()),
                   "support": float((a > 0).float().sum(-1).mean())}
            if model.entmax is not None:
                run["alpha"] = float(model.entmax.alpha.detach())
            runs.append(run)
            if seed == seeds[0]:
                examples["attention"][name] = a[show].tolist()
    bar.close()
    config = dict(seeds=list(seeds), epochs=epochs, n_train_per_class=n_train_per_class,
                  n_test_per_class=n_test_per_class, maps=list(maps), soft_topk_k=TOPK_K)
    return {"experiment": "attention", "config": config, "runs": runs, "examples": examples}


def markdown(result: dict) -> str:
    cfg = result["config"]
    out = [f"({len(cfg['seeds'])} seeds, mean ± std; test set of {10 * cfg['n_test_per_class']} sequences "
           "of 28 tokens)", "",
           "| attention map | test acc (%) | exact zeros (%) | mean support (of 28) | learned α |",
           "|---|---:|---:|---:|---:|"]
    for name in cfg["maps"]:
        rs = [r for r in result["runs"] if r["map"] == name]
        alpha = fmt([r["alpha"] for r in rs], 1, 3) if "alpha" in rs[0] else "—"
        out.append(f"| {name} | {fmt([r['acc'] for r in rs], 100)} | {fmt([r['zero_fraction'] for r in rs], 100, 1)} "
                   f"| {fmt([r['support'] for r in rs], 1, 1)} | {alpha} |")
    return "\n".join(out) + "\n"


def figure(result: dict, path: str) -> str:
    """Each example digit with each map's attention over its rows (first seed)."""
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
    fig.suptitle("attention over image rows (row 0 at top), first seed", fontsize=9)
    return save_figure(fig, path)


def mean_of(result, name, key) -> float:
    return mean_std([r[key] for r in result["runs"] if r["map"] == name])[0]
