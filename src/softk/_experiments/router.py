r"""`softk experiment router`: a small mixture-of-experts classifier (8 experts,
choose 2) with five routers.

The claim tested (the smooth top-k seed): smooth top-k operators can replace a
hard top-k selection in training, as an MoE router selects k experts.

Data: MNIST-5k (:func:`~softk._experiments.common.load_mnist5k`); each image is
one token.  Model:

.. math::
   h = \mathrm{relu}(A x),\quad r = R h \in \mathbb R^8,\quad g = \mathrm{router}(r),\quad
   y = U\Big(h + \sum_e g_e\, \mathrm{relu}(B_e h)\Big)

(width 64; every expert is computed and multiplied by its gate — the model is
tiny, so only the gates' support matters, not the compute saved), trained with
CE, Adam lr 1e-3, batches of 64, **no auxiliary load-balancing loss**.  Routers,
all with k = 2 and gates rescaled to sum to 1:

* ``softmax_hardtopk`` — softmax(r) ⊙ hard_topk(r, 2), renormalised over the
  two kept experts (the usual router; Shazeer et al. 2017, Mixtral);
* ``topk_softmax`` — :func:`softk.topk_softmax` (r, 2): softmax over the top 2.
  Mathematically the same gates as the row above (renormalised softmax over
  the top two); run as a check that the two routes agree;
* ``sparsemax`` — :func:`softk.sparsemax` (r): as many experts as its support;
* ``soft_topk_exp`` — :func:`softk.soft_topk` (r, 2, "exp") / 2: dense, every
  expert gets a positive gate;
* ``soft_topk_sparse`` — :func:`softk.soft_topk` (r, 2, "sparse") / 2: the
  capped-simplex projection, sparse with at least 2 experts.

Reported per router, mean ± std over seeds, on the test set: accuracy; the
mean number of experts with a non-zero gate per token; the coefficient of
variation (std / mean over the 8 experts) of the expert load, counted two ways
— tokens routed to the expert (g_e > 0) and total gate mass Σ g_e (Shazeer et
al.'s "importance").

>>> import torch
>>> r = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
>>> route("softmax_hardtopk", r), route("sparsemax", r)
(tensor([[0.7311, 0.2689, 0.0000, 0.0000]]), tensor([[1., 0., 0., 0.]]))
"""

from __future__ import annotations

import torch
from torch import nn

from .. import hard_topk, soft_topk, softmax, sparsemax, topk_softmax
from .common import Progress, fmt, load_mnist5k, mean_std, pyplot, save_figure, seeded, train_and_eval

ROUTERS = ("softmax_hardtopk", "topk_softmax", "sparsemax", "soft_topk_exp", "soft_topk_sparse")
N_EXPERTS, K = 8, 2
# ``softk experiment router --quick``: every router once, one seed, two epochs (a smoke test, not a result)
QUICK = {"seeds": (0,), "epochs": 2}


def route(name: str, r):
    """Gates (N, 8), each row summing to 1, from router logits r."""
    if name == "softmax_hardtopk":
        g = softmax(r) * hard_topk(r, K)
        return g / g.sum(-1, keepdim=True)
    if name == "topk_softmax":
        return topk_softmax(r, K)
    if name == "sparsemax":
        return sparsemax(r)
    if name == "soft_topk_exp":
        return soft_topk(r, K, method="exp") / K
    if name == "soft_topk_sparse":
        return soft_topk(r, K, method="sparse") / K
    raise ValueError(f"router must be one of {list(ROUTERS)}, got {name!r}")


class MoEClassifier(nn.Module):
    def __init__(self, router: str, width: int = 64):
        super().__init__()
        route(router, torch.zeros(1, N_EXPERTS))  # validates the name
        self.router = router
        self.inp = nn.Linear(784, width)
        self.gate = nn.Linear(width, N_EXPERTS)
        self.experts = nn.Parameter(torch.randn(N_EXPERTS, width, width) / width ** 0.5)
        self.expert_bias = nn.Parameter(torch.zeros(N_EXPERTS, width))
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        """x (N, 784) → (logits (N, 10), gates (N, 8))."""
        h = torch.relu(self.inp(x))
        g = route(self.router, self.gate(h))
        e = torch.relu(torch.einsum("nd,edf->nef", h, self.experts) + self.expert_bias)
        return self.out(h + (g.unsqueeze(-1) * e).sum(1)), g


def load_stats(g) -> dict:
    """Active experts per token and the load's coefficient of variation (count and mass)."""
    count = (g > 0).double().sum(0)
    mass = g.double().sum(0)
    cv = lambda v: float(v.std(unbiased=False) / v.mean())  # noqa: E731
    return {"active": float((g > 0).double().sum(-1).mean()), "cv_count": cv(count), "cv_mass": cv(mass),
            "load_mass": (mass / mass.sum()).tolist()}


def run_router(seeds=(0, 1, 2, 3, 4), epochs=20, n_train_per_class=400, n_test_per_class=100, routers=ROUTERS,
               progress=True) -> dict:
    """Train every (router, seed); returns ``{"config", "runs": [...]}``."""
    bad = [r for r in routers if r not in ROUTERS]
    if bad or not routers or not seeds:
        raise ValueError(f"routers must be a non-empty list drawn from {list(ROUTERS)} and seeds non-empty; "
                         f"got {list(routers)}, {list(seeds)}")
    Xtr, ytr, Xte, yte = load_mnist5k(n_train_per_class, n_test_per_class)
    bar = Progress(len(seeds) * len(routers) * epochs, "router", progress)
    runs = []
    for seed in seeds:
        for name in routers:
            gen = seeded(seed)
            model = MoEClassifier(name)
            logits, g = train_and_eval(model, Xtr, ytr, Xte, epochs, 1e-3, gen, bar, f"{name} seed {seed}")
            runs.append({"router": name, "seed": seed, "acc": float((logits.argmax(-1) == yte).float().mean()),
                         **load_stats(g)})
    bar.close()
    config = dict(seeds=list(seeds), epochs=epochs, n_train_per_class=n_train_per_class,
                  n_test_per_class=n_test_per_class, routers=list(routers), experts=N_EXPERTS, k=K)
    return {"experiment": "router", "config": config, "runs": runs}


def markdown(result: dict) -> str:
    cfg = result["config"]
    out = [f"({len(cfg['seeds'])} seeds, mean ± std; {cfg['experts']} experts, k = {cfg['k']}, "
           f"test set of {10 * cfg['n_test_per_class']} tokens)", "",
           "| router | test acc (%) | experts active per token | load CV (tokens routed) | load CV (gate mass) |",
           "|---|---:|---:|---:|---:|"]
    for name in cfg["routers"]:
        rs = [r for r in result["runs"] if r["router"] == name]
        out.append(f"| {name} | {fmt([r['acc'] for r in rs], 100)} | {fmt([r['active'] for r in rs], 1, 2)} "
                   f"| {fmt([r['cv_count'] for r in rs], 1, 2)} | {fmt([r['cv_mass'] for r in rs], 1, 2)} |")
    return "\n".join(out) + "\n"


def figure(result: dict, path: str) -> str:
    """Share of the gate mass per expert, sorted, per router (mean over seeds of the sorted shares)."""
    plt = pyplot()
    cfg = result["config"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(cfg["routers"])
    for i, name in enumerate(cfg["routers"]):
        shares = [sorted(r["load_mass"], reverse=True) for r in result["runs"] if r["router"] == name]
        mean = [100 * mean_std(s)[0] for s in zip(*shares)]
        ax.bar([e + i * width for e in range(cfg["experts"])], mean, width, label=name)
    ax.axhline(100 / cfg["experts"], color="k", lw=0.8, ls="--", label="balanced")
    ax.set_xlabel("expert, sorted by load (per seed)")
    ax.set_ylabel("share of gate mass (%)")
    ax.set_title(f"expert load on the test set, mean of {len(cfg['seeds'])} seeds")
    ax.set_xticks([e + 0.4 - width / 2 for e in range(cfg["experts"])], [str(e + 1) for e in range(cfg["experts"])])
    ax.legend(fontsize=7)
    return save_figure(fig, path)
