"""Module forms of the losses equal their functions; arguments checked at construction."""

import pytest
import torch

from softk import losses
from softk import nn as snn


def test_modules_equal_functions():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g, dtype=torch.float64)
    t = torch.tensor([0, 4, -1, 2])
    y = torch.softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), 1)
    multi = torch.tensor([[1.0, 1, 0, 0, 0]] * 4, dtype=torch.float64)
    w = torch.rand(5, generator=g, dtype=torch.float64)
    pairs = [
        (snn.SoftmaxLoss(ignore_index=-1, tau=0.5), losses.softmax_loss(x, t, -1, "mean", 0.5), t),
        (snn.SparsemaxLoss(reduction="none"), losses.sparsemax_loss(x, y, reduction="none"), y),
        (snn.Entmax15Loss(reduction="sum"), losses.entmax15_loss(x, y, reduction="sum"), y),
        (snn.EntmaxLoss(1.3, ignore_index=-1), losses.entmax_loss(x, t, 1.3, -1), t),
        (snn.CrossEntropyLoss(w, ignore_index=-1, label_smoothing=0.1), losses.cross_entropy(x, t, w, -1, "mean", 0.1), t),
        (snn.TopKSoftmaxCrossEntropyLoss(2, ignore_index=-1), losses.topk_softmax_cross_entropy(x, t, 2, -1), t),
        (snn.SoftTopKLoss(2, "sparse", 0.5), losses.soft_topk_loss(x, multi, 2, "sparse", 0.5), multi),
    ]
    for module, expected, target in pairs:
        assert torch.equal(module(x, target), expected), repr(module)
        assert type(module).__name__ in repr(module)


def test_module_arguments_checked_at_construction():
    with pytest.raises(ValueError, match="reduction must be"):
        snn.SparsemaxLoss(reduction="avg")
    with pytest.raises(ValueError, match="alpha must be"):
        snn.EntmaxLoss(0.5)
    with pytest.raises(ValueError, match="method must be"):
        snn.SoftTopKLoss(2, method="hard")
    with pytest.raises(ValueError, match="k must be"):
        snn.TopKSoftmaxCrossEntropyLoss(0)
    with pytest.raises(ValueError, match="label_smoothing must be"):
        snn.CrossEntropyLoss(label_smoothing=2.0)
    with pytest.raises(ValueError, match="tau must be"):
        snn.SoftmaxLoss(tau=0.0)
    # the head's size is known at construction (the call refused it only then)
    with pytest.raises(ValueError, match="k must be at most num_classes = 10, got 20"):
        snn.FusedLinearLoss(4, 10, loss="topk_softmax_ce", k=20)


def test_cross_entropy_loss_weight_is_a_buffer():
    m = snn.CrossEntropyLoss(torch.ones(3))
    assert "weight" in dict(m.named_buffers())
    assert "reduction='mean'" in repr(m)
