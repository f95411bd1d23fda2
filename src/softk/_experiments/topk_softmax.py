r"""`softk experiment topk-softmax`: Su's sparse-softmax cross-entropy against CE,
sparsemax loss and entmax15 loss, trained from scratch and fine-tuned.

The claim tested (the sparse top-k softmax's seed): the top-k cross-entropy
:math:`\log\sum_{j\in\text{top}_k(z)} e^{z_j} - z_y` (Su 2021;
:func:`softk.losses.topk_softmax_cross_entropy`; with k = K it is CE) "suits
fine-tuning a pre-trained model, where it curbs over-confidence, but may
underfit a model trained from scratch".

Data: MNIST-5k (:func:`~softk._experiments.common.load_mnist5k`, 400 train /
100 test per digit).  Model: an MLP 784 → 128 (ReLU) → 10, Adam (lr 1e-3),
batches of 64.

* ``scratch``: every loss trains a fresh MLP on all ten digits.
* ``finetune``: one MLP per seed is pre-trained with CE on digits 0–4 (their
  2,000 training rows), then a copy is fine-tuned with each loss on
  ``ft_per_class`` rows of each of digits 5–9 (new classes, few examples — the
  setting where over-confidence shows) and tested on digits 5–9's test rows,
  the 10-way head kept.

Reported per loss, mean ± std over seeds: test and train accuracy; NLL and
ECE of softmax(z) (the logits' own calibration, defined for every loss);
ECE and mean confidence − accuracy of the loss's own map (softmax,
sparsemax, entmax15 or topk_softmax(z, k)), the over-confidence measure.

>>> import torch
>>> z = torch.tensor([[3.0, 1.0, 0.0, -1.0]]); y = torch.tensor([1])
>>> round(float(loss_value("topk2", z, y)), 4)   # log(e^3 + e^1) − 1: only the top 2 count
2.1269
>>> own_map("topk2", z)
tensor([[0.8808, 0.1192, 0.0000, 0.0000]])
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .. import entmax15, softmax, sparsemax, topk_softmax
from .. import losses as L
from .common import Progress, batches, ece, fmt, load_mnist5k, mean_std, pyplot, save_figure, seeded

LOSSES = ("ce", "sparsemax", "entmax15", "topk2", "topk3", "topk5", "topk10")
REGIMES = ("scratch", "finetune")
# ``softk experiment topk-softmax --quick``: every loss in both regimes once, one seed, two epochs of
# each training (a smoke test, not a result)
QUICK = {"seeds": (0,), "epochs": 2, "pre_epochs": 2, "ft_epochs": 2}


def _k(name: str) -> int:
    return int(name[4:])


def loss_value(name: str, z, y):
    """Mean training loss ``name`` of logits z (N, 10) against class indices y."""
    if name == "ce":
        return L.cross_entropy(z, y)
    if name == "sparsemax":
        return L.sparsemax_loss(z, y)
    if name == "entmax15":
        return L.entmax15_loss(z, y)
    if name.startswith("topk"):
        return L.topk_softmax_cross_entropy(z, y, k=_k(name))
    raise ValueError(f"loss must be one of {list(LOSSES)}, got {name!r}")


def own_map(name: str, z):
    """The probability map that goes with the loss (the model's predictive distribution)."""
    if name == "ce":
        return softmax(z)
    if name == "sparsemax":
        return sparsemax(z)
    if name == "entmax15":
        return entmax15(z)
    return topk_softmax(z, _k(name))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


@torch.no_grad()
def evaluate(model, name, X, y) -> dict:
    z = model(X)
    acc = float((z.argmax(-1) == y).float().mean())
    p_soft = softmax(z)
    p_own = own_map(name, z)
    return {
        "acc": acc,
        "nll": float(L.cross_entropy(z, y)),
        "ece_softmax": ece(p_soft, y),
        "ece_own": ece(p_own, y),
        "overconf_own": float(p_own.max(-1).values.mean()) - acc,
    }


def train(model, name, X, y, Xte, yte, epochs, gen, lr=1e-3, bar=None) -> list:
    """Adam on loss ``name``; returns the test accuracy after each epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    curve = []
    for _ in range(epochs):
        model.train()
        for idx in batches(len(y), 64, gen):
            opt.zero_grad()
            loss_value(name, model(X[idx]), y[idx]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            curve.append(float((model(Xte).argmax(-1) == yte).float().mean()))
        if bar:
            bar.step(note=name)
    return curve


def run_topk_softmax(seeds=(0, 1, 2, 3, 4), epochs=20, pre_epochs=10, ft_epochs=20, ft_per_class=100,
                     n_train_per_class=400, n_test_per_class=100, losses=LOSSES, regimes=REGIMES,
                     progress=True) -> dict:
    """Train every (regime, loss, seed); returns ``{"config", "runs": [...]}``, one run per triple."""
    bad = [l for l in losses if l not in LOSSES] + [r for r in regimes if r not in REGIMES]
    if bad or not losses or not regimes or not seeds:
        raise ValueError(f"losses ⊂ {list(LOSSES)}, regimes ⊂ {list(REGIMES)}, seeds non-empty; got "
                         f"{list(losses)}, {list(regimes)}, {list(seeds)}")
    Xtr, ytr, Xte, yte = load_mnist5k(n_train_per_class, n_test_per_class)
    ft_per_class = min(ft_per_class, n_train_per_class)
    work = len(seeds) * (("scratch" in regimes) * len(losses) * epochs
                         + ("finetune" in regimes) * (pre_epochs + len(losses) * ft_epochs))
    bar = Progress(work, "topk-softmax", progress)
    runs = []
    for seed in seeds:
        if "scratch" in regimes:
            for name in losses:
                gen = seeded(seed)
                model = mlp()
                curve = train(model, name, Xtr, ytr, Xte, yte, epochs, gen, bar=bar)
                runs.append({"regime": "scratch", "loss": name, "seed": seed, "curve": curve,
                             **evaluate(model, name, Xte, yte),
                             "train_acc": evaluate(model, name, Xtr, ytr)["acc"]})
        if "finetune" in regimes:
            old_tr, old_te = ytr < 5, yte < 5
            gen = seeded(seed)
            base = mlp()
            train(base, "ce", Xtr[old_tr], ytr[old_tr], Xte[old_te], yte[old_te], pre_epochs, gen, bar=bar)
            new_rows = torch.cat([torch.nonzero(ytr == c).flatten()[:ft_per_class] for c in range(5, 10)])
            Xft, yft = Xtr[new_rows], ytr[new_rows]
            Xnt, ynt = Xte[~old_te], yte[~old_te]
            for name in losses:
                gen = seeded(1000 + seed)
                model = copy.deepcopy(base)
                curve = train(model, name, Xft, yft, Xnt, ynt, ft_epochs, gen, bar=bar)
                runs.append({"regime": "finetune", "loss": name, "seed": seed, "curve": curve,
                             **evaluate(model, name, Xnt, ynt), "train_acc": evaluate(model, name, Xft, yft)["acc"]})
    bar.close()
    config = dict(seeds=list(seeds), epochs=epochs, pre_epochs=pre_epochs, ft_epochs=ft_epochs,
                  ft_per_class=ft_per_class, n_train_per_class=n_train_per_class,
                  n_test_per_class=n_test_per_class, losses=list(losses), regimes=list(regimes))
    return {"experiment": "topk-softmax", "config": config, "runs": runs}


COLUMNS = (("acc", "test acc (%)", 100), ("train_acc", "train acc (%)", 100), ("nll", "NLL of softmax(z)", 1),
           ("ece_softmax", "ECE softmax(z) (%)", 100), ("ece_own", "ECE own map (%)", 100),
           ("overconf_own", "conf − acc, own map (%)", 100))


def markdown(result: dict) -> str:
    """One table per regime: mean ± std over seeds of every metric."""
    out = []
    cfg = result["config"]
    for regime in cfg["regimes"]:
        title = ("from scratch, all ten digits" if regime == "scratch" else
                 f"pre-trained with CE on 0–4, fine-tuned on {cfg['ft_per_class']} rows per digit of 5–9")
        out += [f"**{regime}** ({title}; {len(cfg['seeds'])} seeds, mean ± std)", "",
                "| loss | " + " | ".join(c[1] for c in COLUMNS) + " |",
                "|---|" + "---:|" * len(COLUMNS)]
        for name in cfg["losses"]:
            rs = [r for r in result["runs"] if r["regime"] == regime and r["loss"] == name]
            cells = [fmt([r[key] for r in rs], scale, 3 if scale == 1 else 2) for key, _, scale in COLUMNS]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def figure(result: dict, path: str) -> str:
    """Test accuracy against epoch, mean over seeds, one panel per regime."""
    plt = pyplot()
    cfg = result["config"]
    fig, axes = plt.subplots(1, len(cfg["regimes"]), figsize=(5.5 * len(cfg["regimes"]), 3.8), squeeze=False)
    for ax, regime in zip(axes[0], cfg["regimes"]):
        for name in cfg["losses"]:
            curves = [r["curve"] for r in result["runs"] if r["regime"] == regime and r["loss"] == name]
            mean = [mean_std(c)[0] * 100 for c in zip(*curves)]
            ax.plot(range(1, len(mean) + 1), mean, marker=".", label=name)
        ax.set_title(f"{regime}: test accuracy (mean of {len(cfg['seeds'])} seeds)")
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    return save_figure(fig, path)
