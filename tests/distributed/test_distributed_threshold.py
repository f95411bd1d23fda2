"""The vocab-parallel λ search (softk.distributed.threshold) on many random splits, without processes.

Each "rank" is a thread and the collectives are a fake in-process group (shared
slots and a condition variable), so hypothesis can try hundreds of rows: ties,
flat rows, -inf masks, fully masked slices, wide and narrow slices, k > 1.
The result must equal softk's single-device map on the concatenated row (p)
and its potential Φ = ⟨z, p⟩ − Σψ(p) (checked against the NumPy oracle's λ
in tests/losses/test_fenchel_young.py).
"""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from softk._ops import distributed as collectives
from softk.distributed import threshold as T
from softk.threshold import ENTMAX15, SOFTMAX, SPARSE, SPARSEMAX, entmax_family
from softk._backends.torch.threshold import map_rows as threshold_forward
from softk._ops.potential import value_at

D = torch.float64


class FakeGroup:
    """all_reduce / all_gather between `world` threads (rank from a thread-local).

    No time limit: an exchange completes when every rank has brought its
    tensor, and fails at once when a rank has already left (returned or
    raised), since that rank can never arrive."""

    def __init__(self, world):
        self.world = world
        self.cond = threading.Condition()
        self.slots = [None] * world
        self.arrived, self.round, self.got = 0, 0, None
        self.left = set()
        self.local = threading.local()
        self.ReduceOp = types.SimpleNamespace(SUM="sum", MAX="max")

    def _exchange(self, t):
        with self.cond:
            rank, round_ = self.local.rank, self.round
            self.slots[rank] = t.clone()
            self.arrived += 1
            if self.arrived == self.world:
                self.got, self.arrived, self.round = list(self.slots), 0, round_ + 1
                self.cond.notify_all()
            while self.round == round_:
                if self.left:
                    raise AssertionError(f"rank {rank} waits at a collective that rank(s) {sorted(self.left)} left")
                self.cond.wait()
            return self.got

    def leave(self, rank):
        with self.cond:
            self.left.add(rank)
            self.cond.notify_all()

    def all_reduce(self, t, op, group=None):
        got = self._exchange(t)
        red = torch.stack(got).sum(0) if op == "sum" else torch.stack(got).amax(0)
        t.copy_(red)

    def all_gather(self, out, t, group=None):
        for o, g in zip(out, self._exchange(t)):
            o.copy_(g)


def run_ranks(world, fn):
    fake = FakeGroup(world)
    results, errors = [None] * world, []

    def body(r):
        fake.local.rank = r
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            fake.leave(r)

    saved = collectives.dist  # where softk.distributed's collectives are made
    collectives.dist = fake
    try:
        threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        collectives.dist = saved
    if errors:
        raise errors[0]
    return results


FAMILIES = {
    "softmax": (SOFTMAX, 1),
    "sparsemax": (SPARSEMAX, 1),
    "entmax15": (ENTMAX15, 1),
    "entmax1.3": (entmax_family(1.3), 1),
    "entmax2.5": (entmax_family(2.5), 1),
    "sparse_k1": (SPARSE, 1),
    "sparse_k3": (SPARSE, 3),
}


@st.composite
def rows_and_split(draw):
    v = draw(st.integers(2, 40))
    m = draw(st.integers(1, 4))
    pool = draw(st.sampled_from(["normal", "ties", "wide"]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if pool == "ties":
        z = rng.integers(-2, 3, size=(m, v)).astype(np.float64) * 0.5
    else:
        z = rng.normal(size=(m, v)) * (10.0 if pool == "wide" else 1.0)
    mask = rng.random((m, v)) < draw(st.sampled_from([0.0, 0.3, 0.9, 1.0]))
    z[mask] = -np.inf
    world = draw(st.integers(1, 3))
    cuts = sorted(rng.choice(np.arange(1, v), size=min(world - 1, v - 1), replace=False).tolist())
    return torch.tensor(z, dtype=D), [0, *cuts, v]


@pytest.mark.parametrize("name", list(FAMILIES))
@given(case=rows_and_split())
def test_distributed_map_and_potential_equal_single_device(name, case):
    family, k = FAMILIES[name]
    z, edges = case
    world = len(edges) - 1
    if k > z.shape[-1]:
        return
    shift = z.amax(-1, keepdim=True)
    zs = z - torch.where(torch.isfinite(shift), shift, 0.0)
    p_ref = threshold_forward(family, zs, k)
    phi_ref = value_at(family, zs, p_ref)

    def one(r):
        return T.distributed_forward(family, z[:, edges[r] : edges[r + 1]].clone(), k, None, r, world)

    outs = run_ranks(world, one)
    p = torch.cat([o.p for o in outs], -1)
    torch.testing.assert_close(p, p_ref, rtol=1e-9, atol=1e-12)
    for o in outs:
        torch.testing.assert_close(o.phi, phi_ref, rtol=1e-9, atol=1e-12)
