"""A torch.compile backend for the tests that records what it compiles and what of it runs.

Handing each graph to a real backend (``"aot_eager"`` in these tests), it
keeps the graph's functional collectives and counts the runs of its compiled
form, so that a test can ask which collectives ran inside compiled code during
one call, cached graphs included.
"""

from __future__ import annotations

import functools

import torch


def _collectives(gm):
    """The functional collectives in ``gm``, with those of an autograd rule's forward and backward subgraphs."""
    mods = [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]
    return {str(n.target).split(".")[1] for m in mods for n in m.graph.nodes if "_c10d_functional" in str(n.target)}


class Recording:
    """A torch.compile backend that hands each graph to ``backend`` and keeps, for each one, its
    functional collectives and how many times its compiled form has run."""

    def __init__(self, backend):
        self.backend = backend
        self.collectives: list[set] = []
        self.runs: list[int] = []

    def __call__(self, gm, inputs):
        i = len(self.runs)
        self.collectives.append(_collectives(gm))
        self.runs.append(0)
        compiled = torch._dynamo.lookup_backend(self.backend)(gm, inputs)

        @functools.wraps(compiled)
        def counted(*args):
            self.runs[i] += 1
            return compiled(*args)

        return counted

    def ran_since(self, runs):
        """The collectives of the graphs that ran since ``runs`` (an earlier copy of ``self.runs``)."""
        before = runs + [0] * (len(self.runs) - len(runs))
        return set().union(*(c for c, n, b in zip(self.collectives, self.runs, before) if n > b))
