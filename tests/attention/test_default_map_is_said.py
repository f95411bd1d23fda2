"""The attention functions that take torch's signatures default to a sparse
map, not torch's softmax: the first line of each docstring says which, and they
all default to the same one."""

import inspect

import pytest

import softk.attention
import softk.nn

TORCH_SIGNATURES = [softk.attention.scaled_dot_product_attention, softk.attention.varlen_attn,
                    softk.nn.ScaledDotProductAttention]


@pytest.mark.parametrize("fn", TORCH_SIGNATURES, ids=lambda f: f.__name__)
def test_the_first_docstring_line_names_the_default_map(fn):
    default = inspect.signature(fn).parameters["map"].default
    assert default == inspect.signature(softk.attention.scaled_dot_product_attention).parameters["map"].default
    assert f'``map="{default}"`` by default' in fn.__doc__.strip().splitlines()[0]
