"""Several rows per program (through the CPU interpreter): the kernels on
[ROWS, BLOCK] tiles against the NumPy float64 oracle, forward and backward,
for every family at widths 1 to 256 in every float dtype, with normal rows
next to ties, −inf masks, fully masked rows, NaN/+inf rows, a dominant entry
and rows far from the origin in the same program; a ragged last program; and
each row's p, dx and pass count bit for bit those of one row per program (a
row's result must not depend on the rows it shares a program with)."""

import numpy as np
import pytest
import torch

from softk._backends.triton import function as tf
from softk._backends.triton.function import FAMILY_IDS, backward_rows, forward_rows

from ...oracle import maps as oracle

EPS32 = float(np.finfo(np.float32).eps)
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
TOPK = ("exp", "sigmoid", "laplace", "sparse")
# (name, family, α); entmax α > 2 takes the false-position branch of the search
FAMS = [("softmax", "softmax", 1.5), ("sparsemax", "sparsemax", 1.5), ("entmax15", "entmax15", 1.5),
        ("entmax1.3", "entmax", 1.3), ("entmax2.5", "entmax", 2.5)] + [(f, f, 1.5) for f in TOPK]
IDS = [f[0] for f in FAMS]


def _oracle(fam, x, k, alpha, tau):
    if fam == "softmax":
        return oracle.softmax(x, tau=tau)
    if fam == "sparsemax":
        return oracle.sparsemax(x, tau=tau)
    if fam in ("entmax15", "entmax"):
        return oracle.entmax(x, 1.5 if fam == "entmax15" else alpha, tau=tau)
    return oracle.soft_topk(x, k, tau=tau, method=fam)


def _mixed_rows(rng, r, n):
    """r rows of width n, each program holding a mix: normal rows at scales
    0.1–100, ties, −inf masks, a fully masked row, a NaN row, a +inf row, one
    dominant entry, a row offset by 1e4, a single finite entry."""
    x = rng.normal(size=(r, n)) * rng.choice([0.1, 1.0, 10.0, 100.0], size=(r, 1))
    for i in range(r):
        kind = i % 9
        if kind == 1:
            x[i, rng.random(n) < 0.5] = -np.inf
        elif kind == 2:
            x[i] = -np.inf
        elif kind == 3:
            x[i, rng.integers(n)] = np.nan
        elif kind == 4:
            x[i, rng.integers(n)] = np.inf
        elif kind == 5:
            x[i] = np.repeat(rng.normal(size=n // 4 + 1), 4)[:n]  # ties in fours
        elif kind == 6:
            x[i, 0] = 1e4  # one dominant entry
        elif kind == 7:
            x[i] += 1e4  # far from the origin
        elif kind == 8:
            x[i, : n - 1] = -np.inf  # one finite entry
    return x


def _bits(t):
    return t.view(BITS[t.dtype])


def _prefilled(shape, dtype, extra=3):
    """A NaN buffer with ``extra`` rows past the end: (the first rows as the
    out tensor, the whole buffer to check that nothing was written past)."""
    buf = torch.full((shape[0] + extra, shape[1]), float("nan"), dtype=dtype)
    return buf[: shape[0]], buf


def _check_forward(p, ref, x, dtype):
    """float32 arithmetic: 1e-5 relative, plus a few ulps of each row's scale
    absolute (p = f(z − λ) can be no closer than z − λ is); half outputs
    also their rounding (≤ eps/2 with p ≤ 1)."""
    got = p.double().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    fin = np.isfinite(x)
    scale = np.maximum(1.0, np.where(fin, np.abs(x), 0.0).max(axis=1, keepdims=True))
    atol = 2 * EPS32 * scale + (torch.finfo(dtype).eps / 2 if dtype != torch.float32 else 0.0)
    ok = np.isnan(ref) | (np.abs(got - ref) <= 1e-5 * np.abs(ref) + atol)
    assert ok.all(), [(int(i), int(j), got[i, j], ref[i, j]) for i, j in zip(*np.nonzero(~ok))][:5]


WIDTHS = (1, 2, 5, 16, 64, 100, 256)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("name, fam, alpha", FAMS, ids=IDS)
@pytest.mark.slow
def test_forward_many_rows_per_program_matches_oracle(rng, name, fam, alpha):
    # every width, the dtypes taking turns; 11 rows: with the launcher's ROWS
    # (8–128 here) one ragged program or two, with 4 rows per program three,
    # the last holding 3
    for j, n in enumerate(WIDTHS):
        dtype = DTYPES[(j + IDS.index(name)) % 3]
        k = (1, 2, 3)[j % 3] if fam in TOPK else 1
        x = torch.tensor(_mixed_rows(rng, 11, n)).to(dtype)
        xn = x.double().numpy()  # the oracle sees exactly the rounded values
        rpp = 4 if j % 2 else None
        out, buf = _prefilled(x.shape, dtype)
        p = forward_rows(x, FAMILY_IDS[fam], k, 0.5, alpha, rows_per_program=rpp, out=out)
        assert p.data_ptr() == out.data_ptr()
        assert torch.isnan(buf[11:]).all()  # nothing written past the last row
        _check_forward(p, _oracle(fam, xn, k, alpha, 0.5), xn, dtype)


def _input(x, fam):
    # the backward of the families whose slope is formed from the input reads it too
    return x if FAMILY_IDS[fam] in tf.FROM_X else None


@pytest.mark.parametrize("name, fam, alpha", FAMS, ids=IDS)
@pytest.mark.slow
def test_rows_do_not_depend_on_their_neighbours(rng, name, fam, alpha):
    # p, dx and the pass count of every row, bit for bit, whether the row has
    # a program of its own, shares one with 3 others (a ragged last one), or
    # with up to 127 others (the launcher's choice at these widths); the
    # families take turns at width 5 in float32 and 64 in bfloat16
    i = IDS.index(name)
    for n, dtype in (((5, torch.float32), (64, torch.bfloat16))[i % 2],):
        k = 2 if fam in TOPK else 1
        x = torch.tensor(_mixed_rows(rng, 11, n)).to(dtype)
        g = torch.tensor(rng.normal(size=(11, n))).to(dtype)
        runs = {}
        for rpp in (1, 4, None):
            p, its = forward_rows(x, FAMILY_IDS[fam], k, 0.7, alpha, return_passes=True, rows_per_program=rpp)
            dx = backward_rows(p, g, FAMILY_IDS[fam], 0.7, alpha, rows_per_program=rpp, x=_input(x, fam),
                               out=torch.full_like(p, float("nan")))
            runs[rpp] = (_bits(p), its, _bits(dx))
        assert tf._config(n, None, None)[3] > 4  # the default differs from both
        for rpp in (4, None):
            for a, b in zip(runs[rpp], runs[1]):
                assert torch.equal(a, b), (n, rpp)
        if fam != "softmax":
            assert (runs[1][1][[0, 5, 6, 7]] > 0).all()  # searched rows did search
        # NaN/+inf rows (3, 4): p and dx NaN, torch.softmax's convention, and only there
        dx = runs[1][2].view(dtype)
        assert torch.isnan(dx[[3, 4]]).all() and not torch.isnan(dx[[0, 1, 2, 5, 6, 7, 8, 9, 10]]).any()


@pytest.mark.parametrize("name, fam, alpha", FAMS, ids=IDS)
def test_backward_many_rows_per_program_matches_oracle_jacobian(rng, name, fam, alpha):
    # 6 rows of 12 at 4 rows per program (two programs, the last ragged):
    # normal rows at two scales, a masked one, ties, and a fully masked one
    # (dx = 0 there)
    n = 12
    k = 3 if fam in TOPK else 1
    x = rng.normal(size=(6, n)) * np.array([[2.0], [0.5], [2.0], [1.0], [1.0], [1.0]])
    x[2, ::3] = -np.inf
    x[3] = np.repeat(rng.normal(size=3), 4) * 2
    x[3, 0] += 0.3  # ties, but none of them on the threshold (the gradient is ambiguous there)
    x[4] = -np.inf
    x[5, 0] = 8.0
    x = x.astype(np.float32).astype(np.float64)
    g = rng.normal(size=(6, n))
    xt = torch.tensor(x, dtype=torch.float32)
    p = forward_rows(xt, FAMILY_IDS[fam], k, 1.0, alpha, rows_per_program=4)
    dx = backward_rows(p, torch.tensor(g, dtype=torch.float32), FAMILY_IDS[fam], 1.0, alpha, rows_per_program=4,
                       x=_input(xt, fam), out=torch.full_like(p, float("nan")))
    dx = dx.double().numpy()
    for i in (0, 1, 2, 3, 5):
        fin = np.isfinite(x[i])  # masked entries neither move p nor get a gradient
        jac = np.zeros((n, n))
        jac[np.ix_(fin, fin)] = oracle.numerical_jacobian(lambda r: _oracle(fam, r[None], k, alpha, 1.0)[0],
                                                          x[i][fin], eps=1e-5)
        np.testing.assert_allclose(dx[i], jac.T @ g[i], rtol=0, atol=5e-4, err_msg=f"row {i}")
    np.testing.assert_array_equal(dx[4], np.zeros(n))


@pytest.mark.parametrize("name, fam, alpha", [FAMS[i] for i in (0, 1, 4, 5, 6)], ids=[IDS[i] for i in (0, 1, 4, 5, 6)])
@pytest.mark.slow
def test_fused_loss_rows_do_not_depend_on_their_neighbours(rng, name, fam, alpha):
    # the fused Fenchel–Young loss kernel on the same tiles: each row's loss
    # and gradient bit for bit those of one row per program, with class
    # indices (−1: an ignored row) or a dense target, next to masked, NaN
    # and +inf rows (the values themselves: tests/triton/test_triton_fused_loss.py)
    from softk._backends.triton.loss import fenchel_young_fused_rows

    n = (5, 64)[IDS.index(name) % 2]
    k = 2 if fam in TOPK else 1
    x = torch.tensor(_mixed_rows(rng, 11, n), dtype=torch.float32)
    if IDS.index(name) % 2:
        y = rng.random((11, n))
        target = torch.tensor(y / y.sum(1, keepdims=True) * k, dtype=torch.float32)
    else:
        target = torch.tensor([-1] + rng.integers(0, n, size=10).tolist())  # row 0 ignored
    runs = [fenchel_young_fused_rows(x, target, torch.full((1,), 0.25), FAMILY_IDS[fam], k, 0.7, alpha,
                                     rows_per_program=rpp) for rpp in (1, 4, None)]
    for loss, grad in runs[1:]:
        assert torch.equal(_bits(loss), _bits(runs[0][0])) and torch.equal(_bits(grad), _bits(runs[0][1]))
    # NaN/+inf rows give NaN, and no other row does (a target on a masked
    # class gives +inf: the value tests check those)
    nan = torch.isnan(runs[0][0])
    assert nan[[3, 4]].all() and not nan[[0, 1, 2, 5, 6, 7, 8, 9, 10]].any()


def test_launcher_rows_per_program():
    # narrow on-chip rows share a program: a tile of TILE entries in the
    # forward, BWD_NARROW_TILE (rows under 1024) or BWD_TILE in the backward;
    # from the tile's width up, one row
    for backward, tile, top in ((False, tf.TILE, tf.ONCHIP_MAX), (True, tf.BWD_TILE, tf.BWD_ONCHIP_MAX)):
        for n in (n for n in (1, 16, 64, 100, 256, 1000, 1024, 2048, top) if n <= top):
            onchip, blk, warps, got = tf._config(n, None, None, backward=backward)
            assert onchip and blk == max(16, 1 << (n - 1).bit_length()), n
            t = tf.BWD_NARROW_TILE if backward and blk < 1024 else tile
            assert got == max(1, min(tf.ROWS_MAX, t // blk)) and 32 * warps <= max(32, got * blk), n
        onchip, blk, warps, rows = tf._config(top + 1, None, None, backward=backward)  # the looped variant: one row
        assert not onchip and rows == 1 and blk == (tf.BWD_LOOP_BLOCK if backward else tf.SHORT_BLOCK)
    assert tf._config(tf.SHORT_MAX, None, None)[1] == tf.SHORT_BLOCK and tf._config(tf.SHORT_MAX + 1, None, None)[1] == tf.LOOP_BLOCK
    assert tf._config(64, None, None, 4)[3] == 4
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="rows_per_program"):
        forward_rows(x, FAMILY_IDS["sparsemax"], 1, 1.0, rows_per_program=3)
    with pytest.raises(ValueError, match="out"):
        forward_rows(x, FAMILY_IDS["sparsemax"], 1, 1.0, out=torch.zeros(2, 9))
    with pytest.raises(ValueError, match="out"):
        backward_rows(x, x, FAMILY_IDS["sparsemax"], 1.0, out=torch.zeros(2, 8, dtype=torch.float16))
