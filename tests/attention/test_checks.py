"""Bad input to softk.attention.scaled_dot_product_attention: a TypeError or
ValueError from softk that names the argument, never a kernel traceback."""

import pytest
import torch

from softk.attention import scaled_dot_product_attention as sdpa

Q, K, V = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 3)


def _fake_device():
    """A tensor on another device than the CPU (meta), to test the device checks without a GPU."""
    return torch.empty(2, 4, 6, 8, device="meta")


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(query=Q.numpy()), TypeError, "query must be a torch.Tensor"),
    (dict(query=Q.long()), TypeError, "query must be a floating-point tensor"),
    (dict(key=K.double()), TypeError, "same dtype"),
    (dict(value=torch.randn(3)), ValueError, "value must have at least 2 dimensions"),
    (dict(key=torch.randn(2, 4, 6, 7)), ValueError, "key's last dimension"),
    (dict(value=torch.randn(2, 4, 7, 3)), ValueError, "value must have as many rows S"),
    (dict(key=torch.randn(2, 3, 6, 8), value=torch.randn(2, 3, 6, 3)), ValueError, "enable_gqa=True"),
    (dict(key=torch.randn(2, 3, 6, 8), value=torch.randn(2, 3, 6, 3), enable_gqa=True), ValueError,
     "multiple of the key's"),
    (dict(value=torch.randn(2, 2, 6, 3)), ValueError, "key and value must have the same number of heads"),
    (dict(key=torch.randn(3, 4, 6, 8), value=torch.randn(3, 4, 6, 3)), ValueError, "batch dimensions"),
    (dict(key=_fake_device()), ValueError, "key must be on the query's device"),
    (dict(attn_mask=torch.ones(5, 5, dtype=torch.bool)), ValueError, r"attn_mask of shape \(5, 5\) must broadcast"),
    (dict(attn_mask=torch.ones(5, 6, dtype=torch.int64)), TypeError, "attn_mask must be a bool tensor"),
    (dict(attn_mask=torch.ones(5, 6, dtype=torch.float64)), TypeError, "attn_mask must be a bool tensor"),
    (dict(attn_mask=[[True]]), TypeError, "attn_mask must be None or a torch.Tensor"),
    (dict(attn_mask=torch.zeros(5, 6, requires_grad=True)), ValueError, "attn_mask requires grad"),
    (dict(dropout_p=0.1), ValueError, "dropout_p=0.1: softk's attention does not implement dropout"),
    (dict(dropout_p=1.5), ValueError, r"dropout_p must be in \[0, 1\]"),
    (dict(dropout_p="0"), TypeError, "dropout_p must be a number"),
    (dict(is_causal=1), TypeError, "is_causal must be a bool"),
    (dict(enable_gqa=None), TypeError, "enable_gqa must be a bool"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(scale="1"), TypeError, "scale must be None or a real number"),
    (dict(map="hardmax"), ValueError, "map must be one of"),
    (dict(map="softmax", alpha=1.5), ValueError, "alpha is only used with map='entmax'"),
    (dict(map="entmax", alpha=1.0), ValueError, "alpha must be a finite float > 1"),
    (dict(map="entmax", alpha=0.5), ValueError, "alpha must be a finite float > 1"),
    (dict(map="entmax", alpha=float("inf")), ValueError, "alpha must be a finite float > 1"),
    (dict(map="entmax", alpha="1.5"), TypeError, "alpha must be a float > 1 or a tensor"),
    (dict(map="entmax", alpha=torch.tensor([1.5, 1.5])), ValueError, r"shape \(H,\) = \(4,\)"),
    (dict(map="entmax", alpha=torch.tensor([1.5, 1.0, 2.0, 1.5])), ValueError, r"alpha must lie in \(1, 2\]"),
    (dict(map="entmax", alpha=torch.tensor([1.5, 1.5, 2.0, 2.01])), ValueError, r"for every head .*got \[1.5, 1.5, 2.0, 2.00999"),
    (dict(map="entmax", alpha=torch.tensor([1.5, float("nan"), 2.0, 2.0])), ValueError, "alpha must lie in"),
    (dict(map="entmax", alpha=2.001), ValueError, r"alpha must lie in \(1, 2\] with float32-compute"),
    (dict(query=Q.half(), key=K.half(), value=V.half(), map="entmax", alpha=2.2), ValueError, "float32-compute"),
    (dict(query=Q.double(), key=K.double(), value=V.double(), map="entmax", alpha=3.5), ValueError,
     r"alpha must lie in \(1, 3\] with float64"),
    (dict(query=Q.double(), key=K.double(), value=V.double(), map="entmax", alpha=torch.full((4,), 3.0005,
     dtype=torch.float64)), ValueError, r"\(1, 3\] for every head"),
    (dict(map="entmax", alpha=10.0), ValueError, "use softk.entmax on the scores"),
    (dict(map="entmax", alpha=torch.tensor([2, 2, 2, 2])), TypeError, "alpha must be a float or a floating"),
    (dict(map="entmax", alpha=torch.full((4,), 1.5, device="meta")), ValueError, "alpha must be on the query's"),
])
def test_bad_input_names_the_argument(kwargs, exc, match):
    args = dict(query=Q, key=K, value=V)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        sdpa(**args)


def test_query_with_no_features_is_refused():
    with pytest.raises(ValueError, match="E must be at least 1"):
        sdpa(torch.randn(1, 2, 0), torch.randn(1, 3, 0), torch.randn(1, 3, 2))
