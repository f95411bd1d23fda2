"""The arms of ``softk experiment moe`` by name (plain data, so that the command
line lists them without importing the experiment): each is the keyword
arguments of :func:`softk.integrations.hf_moe.apply_softk_router`.

The control keeps the model's own router (softmax, then the top 2, renormalised),
rendered by softk so that its statistics are read like the others'.  The sparse
maps may use up to :data:`K_MAX` experts per token, twice the control's 2; the
``_target2`` arms add the controller on τ that keeps their mean at 2 live experts
per token, the control's expert compute.

>>> list(ARMS)[:3]
['softmax_top2', 'sparsemax', 'sparsemax_target2']
>>> ARMS["budget_k2"]
{'router': 'budget', 'k': 2, 'k_max': 4}
"""

from typing import Any

K_MAX = 4  # experts per token at most, for the sparse maps
TARGET = 2.0  # the controlled arms' mean live experts per token

ARMS: dict[str, dict[str, Any]] = {
    "softmax_top2": {"router": "topk_softmax"},
    "sparsemax": {"router": "sparsemax", "k_max": K_MAX},
    "sparsemax_target2": {"router": "sparsemax", "k_max": K_MAX, "target": TARGET},
    "entmax15": {"router": "entmax15", "k_max": K_MAX},
    "entmax15_target2": {"router": "entmax15", "k_max": K_MAX, "target": TARGET},
    "entmax_learned": {"router": "entmax", "learn_alpha": True, "k_max": K_MAX},
    "soft_topk_k2": {"router": "soft_topk", "k": 2},
    "budget_k2": {"router": "budget", "k": 2, "k_max": K_MAX},
}
