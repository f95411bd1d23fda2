"""The public surface: reachable after ``import softk``, no function shadows a
module, modules take their function's arguments in the same order and check
them at construction with the same errors."""

import inspect

import pytest
import torch

import softk
from softk import nn as snn


def test_subpackages_reachable_after_import_softk():
    assert softk.nn.Sparsemax is snn.Sparsemax
    assert softk.losses.sparsemax_loss is not None
    assert isinstance(softk.families.SPARSEMAX, softk.families.Family)


def test_no_public_function_shadows_a_module():
    import importlib
    import pkgutil

    modules = {m.name for m in pkgutil.iter_modules(softk.__path__)}
    for name in softk.__all__:
        obj = getattr(softk, name)
        if callable(obj) and not inspect.ismodule(obj):
            assert name not in modules, f"softk.{name} is a function and also a module softk/{name}.py"


@pytest.mark.parametrize(
    "module,function,skip",
    [
        (snn.Softmax, softk.softmax, 1),
        (snn.Sparsemax, softk.sparsemax, 1),
        (snn.Entmax15, softk.entmax15, 1),
        (snn.Entmax, softk.entmax, 1),
        (snn.SoftTopK, softk.soft_topk, 1),
        (snn.TopKSoftmax, softk.topk_softmax, 1),
        (snn.HardTopK, softk.hard_topk, 1),
        (snn.TopKSum, softk.topk_sum, 1),
        (snn.SoftTopKLoss, softk.losses.soft_topk_loss, 2),
        (snn.TopKSoftmaxCrossEntropyLoss, softk.losses.topk_softmax_cross_entropy, 2),
        (snn.EntmaxLoss, softk.losses.entmax_loss, 2),
        (snn.SparsemaxLoss, softk.losses.sparsemax_loss, 2),
    ],
)
def test_module_arguments_in_function_order(module, function, skip):
    mod_args = [p for p in inspect.signature(module.__init__).parameters if p != "self"]
    fn_args = list(inspect.signature(function).parameters)[skip:]
    common = [a for a in fn_args if a in mod_args]
    assert common == [a for a in mod_args if a in fn_args]
    assert common == fn_args[: len(common)] or set(fn_args) - set(mod_args) <= {"keepdim"}


def test_softmax_module():
    x = torch.tensor([[0.0, float("-inf")], [float("-inf"), float("-inf")]])
    out = snn.Softmax(dim=-1, tau=0.5)(x)
    assert torch.equal(out, torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize(
    "make,fn,error",
    [
        (lambda: snn.SoftTopK(k="2"), lambda: softk.soft_topk(torch.zeros(4), k="2"), TypeError),
        (lambda: snn.SoftTopK(k=0), lambda: softk.soft_topk(torch.zeros(4), k=0), ValueError),
        (lambda: snn.Sparsemax(dim="a"), lambda: softk.sparsemax(torch.zeros(4), dim="a"), TypeError),
        (lambda: snn.Entmax(alpha=float("inf")), lambda: softk.entmax(torch.zeros(4), alpha=float("inf")), ValueError),
        (lambda: snn.Entmax(alpha=0.5), lambda: softk.entmax(torch.zeros(4), alpha=0.5), ValueError),
        (lambda: snn.Entmax(alpha="x"), lambda: softk.entmax(torch.zeros(4), alpha="x"), TypeError),
        (lambda: snn.HardTopK(k=2.5), lambda: softk.hard_topk(torch.zeros(4), k=2.5), ValueError),
        (lambda: snn.EntmaxLoss(alpha=float("nan")), lambda: softk.losses.entmax_loss(torch.zeros(1, 4), torch.tensor([0]), alpha=float("nan")), ValueError),
        (lambda: snn.Sparsemax(tau=0), lambda: softk.sparsemax(torch.zeros(4), tau=0), ValueError),
    ],
)
def test_modules_refuse_at_construction_what_functions_refuse(make, fn, error):
    with pytest.raises(error) as from_module:
        make()
    with pytest.raises(error) as from_function:
        fn()
    # the same parameter is named first in both messages
    assert str(from_module.value).split()[0] == str(from_function.value).split()[0]


def test_learnable_alpha_accepts_large_alpha():
    m = snn.Entmax(alpha=1e30, learnable=True)
    assert m.alpha.item() == pytest.approx(1e30, rel=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        snn.Entmax(alpha=float("inf"), learnable=True)


def test_tensor_alpha_inf_is_refused_like_float_inf():
    with pytest.raises(ValueError, match="alpha"):
        softk.entmax(torch.zeros(2, 3), alpha=torch.tensor([[float("inf")], [2.0]]))


def test_every_loss_by_name_entry_point_shares_one_default_and_one_table():
    """fused_linear_loss, nn.FusedLinearLoss, vocab_parallel_loss,
    vocab_parallel_fused_linear_loss and apply_softk/softk_loss default to the
    one DEFAULT_LOSS, a name of the one table LOSSES."""
    from softk.distributed import vocab_parallel_fused_linear_loss, vocab_parallel_loss
    from softk.integrations import megatron, transformers
    from softk.losses import fused_linear_loss
    from softk.losses._registry import DEFAULT_LOSS, LOSSES
    from softk.nn import FusedLinearLoss

    fns = (fused_linear_loss, FusedLinearLoss.__init__, vocab_parallel_loss, vocab_parallel_fused_linear_loss,
           transformers.apply_softk, transformers.softk_loss, megatron.megatron_loss)
    assert {inspect.signature(f).parameters["loss"].default for f in fns} == {DEFAULT_LOSS}
    assert DEFAULT_LOSS == "cross_entropy" and DEFAULT_LOSS in LOSSES
    assert set(transformers.SUPPORTED_LOSSES) == set(LOSSES) - {"soft_topk"}
