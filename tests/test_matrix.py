"""tests/matrix.py: the whole product is there, and the combinations left in
the default run (not marked slow) show every value of every axis."""

import math

from hypothesis import given, strategies as st

from . import matrix


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_the_cover_shows_every_value_and_the_rest_is_slow(lengths):
    axes = [[f"{a}.{i}" for i in range(n)] for a, n in enumerate(lengths)]
    params = matrix.product(*axes)
    assert sorted(p.values for p in params) == sorted(set(p.values for p in params))
    assert len(params) == math.prod(lengths)
    fast = [p.values for p in params if not p.marks]
    assert len(fast) == max(lengths)
    for a, axis in enumerate(axes):
        assert {values[a] for values in fast} == set(axis)
    assert all([m.name for m in p.marks] == ["slow"] for p in params if p.marks)
