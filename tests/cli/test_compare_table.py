"""What `softk compare`'s table shows: 0.0000 only for an exact zero, the rows
whose entries may leave [0, 1] marked, and a fractional k for the maps that
take one."""

import json

import numpy as np
import pytest

from softk._cli import main

from ..oracle import maps as oracle

THRESHOLD = ("exp", "sigmoid", "laplace", "sparse")


def table(argv, capsys):
    assert main(["compare", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("-----")) + 1
    rows = {}
    for line in lines[start:]:
        if line.startswith(("*", "logsumexp")):
            break
        name, *cells = line.split()
        rows[name] = cells
    return rows, lines


def test_a_small_non_zero_entry_is_not_printed_as_zero(capsys):
    rows, _ = table([], capsys)
    p = oracle.entmax(np.array([1.0, 2.0, 3.0, 4.0]), 1.3)
    assert 0 < p[0] < 5e-5  # four decimals would round it to 0.0000; the support counts it
    assert rows["entmax[alpha=1.3]"][0] == f"{p[0]:.1e}"
    assert rows["entmax[alpha=1.3]"][-1] == "4"
    assert rows["sparsemax"][:3] == ["0.0000"] * 3  # exact zeros


@pytest.mark.parametrize("argv", [[], ["--k", "2", "--tau", "0.3", "0", "0", "0", "5"], ["--k", "3", "3", "2", "1", "0"]])
def test_every_row_with_an_entry_above_one_is_marked(argv, capsys):
    rows, lines = table(argv, capsys)
    marked = {name for name in rows if name.endswith("*")}
    assert marked == {"soft_topk[iterative]*", "soft_topk[weighted]*"}
    assert any(line.startswith("* kept for comparison only") for line in lines)
    for name, cells in rows.items():
        if any(float(c) > 1 for c in cells[:-2]):
            assert name in marked, name


def test_a_fractional_k_runs_the_threshold_methods(capsys):
    x = np.array([-1.0, 0.0, 2.0, 5.0, 0.5])
    assert main(["compare", "--json", "--k", "2.5", "--", *map(str, x)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["k"] == 2.5
    assert sorted(out["left_out"]) == ["soft_topk[grad]", "soft_topk[iterative]", "soft_topk[weighted]",
                                       "topk_softmax"]
    for method in THRESHOLD:
        row = out["rows"][f"soft_topk[{method}]"]
        np.testing.assert_allclose(row["values"], oracle.soft_topk(x, 2.5, method=method), atol=1e-9)
        assert abs(row["sum"] - 2.5) < 1e-9
    np.testing.assert_allclose(out["rows"]["sparsemax"]["values"], oracle.sparsemax(x), atol=1e-12)


def test_a_whole_k_written_as_a_float_is_that_k(capsys):
    assert main(["compare", "--json", "--k", "3.0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["k"] == 3 and out["left_out"] == [] and "topk_softmax" in out["rows"]
    _, lines = table(["--k", "2.5"], capsys)
    assert lines[1].startswith("k = 2.5 is fractional: left out topk_softmax")


def test_a_k_just_below_a_whole_number_is_written_in_full(capsys):
    # k = 3.9999999999999996 was printed as "k = 4 is fractional"
    _, lines = table(["--k", "3.9999999999999996"], capsys)
    assert lines[0].startswith("k = 3.9999999999999996, tau = 1 ")
    assert lines[1].startswith("k = 3.9999999999999996 is fractional")
