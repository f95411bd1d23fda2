"""Parameter matrices in two tiers.

A test that runs every combination of a few axes (map × causal × cap, row ×
method × variant) costs their product.  ``product`` gives pytest all of it,
and marks ``slow`` every combination outside a cover in which each value of
each axis appears at least once: the default run (the README's command) sees
every value, the slow tier (``-m slow``, which CI runs after it) every
combination.
"""

import itertools

import pytest


def product(*axes):
    """The product of ``axes`` as ``pytest.param``s, those outside the cover
    marked slow.  Each axis is a list of values; a tuple value fills as many
    argnames as it has items (``[("entmax", 1.3), ...]`` for ``"name,alpha"``).
    The cover is the diagonal: combination i takes value i mod len(axis) of
    every axis, for i up to the longest axis.  Each id joins the values'
    own words (numbers, strings, dtypes) or, for others, their place on
    their axis.

    >>> [(p.values, [m.name for m in p.marks]) for p in product([1, 2], ["a"])]
    [((1, 'a'), []), ((2, 'a'), [])]
    >>> [p.values for p in product([1, 2, 3], [("x", 0), ("y", 1)]) if not p.marks]
    [(1, 'x', 0), (2, 'y', 1), (3, 'x', 0)]
    """
    longest = max(len(axis) for axis in axes)
    cover = {tuple(i % len(axis) for axis in axes) for i in range(longest)}
    params = []
    for index in itertools.product(*(range(len(axis)) for axis in axes)):
        values, words = [], []
        for axis, i in zip(axes, index):
            items = axis[i] if isinstance(axis[i], tuple) else (axis[i],)
            values.extend(items)
            words.extend(_word(v, i) for v in items)
        params.append(pytest.param(*values, marks=() if index in cover else pytest.mark.slow, id="-".join(words)))
    return params


def _word(value, place):
    """A value as a test id says it: itself where short and plain, else its place on its axis."""
    if value is None or isinstance(value, (bool, int, float, str)) or type(value).__module__ == "torch":
        return str(value)
    return f"#{place}"
