"""The `softk` command, run as a user would: subprocesses, exit codes, key numbers."""

import json
import sys

import numpy as np
import pytest

from .. import safety_net
from ..oracle import maps as oracle


def softk(*args, stdin=None):
    return safety_net.run(
        [sys.executable, "-m", "softk", *args], input=stdin, capture_output=True, text=True
    )


def test_help_lists_subcommands():
    r = softk("--help")
    assert r.returncode == 0
    for name in ("compare", "check", "plot", "bench", "experiment"):
        assert name in r.stdout


def test_compare_default_is_the_seeds_example():
    r = softk("compare")
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("softmax"))
    assert line.split()[1:5] == ["0.0321", "0.0871", "0.2369", "0.6439"]
    assert "logsumexp (smooth max) = 4.4402" in r.stdout


def test_compare_json_against_oracle():
    r = softk("compare", "--json", "--k", "3", "--tau", "0.5", "--", "-1", "0", "2", "5", "0.5")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    x = np.array([-1, 0, 2, 5, 0.5])
    assert out["input"] == x.tolist() and out["k"] == 3 and out["tau"] == 0.5
    rows = out["rows"]
    np.testing.assert_allclose(rows["softmax"]["values"], oracle.softmax(x, tau=0.5), atol=1e-12)
    np.testing.assert_allclose(rows["sparsemax"]["values"], oracle.sparsemax(x, tau=0.5), atol=1e-12)
    np.testing.assert_allclose(rows["entmax15"]["values"], oracle.entmax(x, 1.5, tau=0.5), atol=1e-12)
    for m in ("exp", "sigmoid", "laplace", "sparse"):
        row = rows[f"soft_topk[{m}]"]
        np.testing.assert_allclose(row["values"], oracle.soft_topk(x, 3, tau=0.5, method=m), atol=1e-9)
        assert abs(row["sum"] - 3) < 1e-9
    assert rows["soft_topk[sparse]"]["support"] == int((oracle.soft_topk(x, 3, tau=0.5, method="sparse") > 1e-12).sum())


@pytest.mark.parametrize("suffix", [".txt", ".csv", ".npy"])
@pytest.mark.slow
def test_compare_reads_files(tmp_path, suffix):
    path = tmp_path / f"x{suffix}"
    if suffix == ".npy":
        np.save(path, np.array([3.0, 1.0, 2.0]))
    else:
        # one row: a line of comma- or space-separated numbers, or one number per line
        path.write_text("3, 1, 2\n" if suffix == ".csv" else "3\n1\n2\n")
    r = softk("compare", "--input", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["input"] == [3.0, 1.0, 2.0]
    r = softk("compare", "--input", "-", "--json", stdin="3 1 2")
    assert json.loads(r.stdout)["input"] == [3.0, 1.0, 2.0]
    r = softk("compare", "--input", "-", "--json", stdin="3,1,2\n\n")
    assert json.loads(r.stdout)["input"] == [3.0, 1.0, 2.0]


# Bad input (one `softk <cmd>: error:` line, exit 2): tests/test_cli_errors.py.


@pytest.mark.slow
def test_plot_writes_png_figures(tmp_path):
    r = softk("plot", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    pngs = sorted(tmp_path.glob("*.png"))
    assert [p.name for p in pngs] == sorted(["two_class.png", "simplex.png", "topk_tau.png", "temperature.png"])
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.slow
def test_check_json_reports_measured_findings():
    r = softk("check", "--json")
    assert r.returncode == 0, r.stderr
    table = json.loads(r.stdout)
    names = {"sum_k", "range", "monotone", "shift_invariant", "limit_hard_topk", "k1_softmax"}
    for method in ("exp", "sigmoid", "laplace", "sparse"):
        assert set(table[method]) == names
        assert table[method]["sum_k"] and table[method]["range"] and table[method]["monotone"]
    assert table["exp"]["k1_softmax"] is True
    assert table["laplace"]["k1_softmax"] is False  # measured: Laplace at k=1 is not softmax
    assert table["sparse"]["k1_softmax"] is False  # it is sparsemax
    # The seed's iterative soft-k-max overshoots (p > 1) and is not monotone;
    # the weighted iteration does not reach the hard top-k.
    assert table["iterative"]["range"] is False and table["iterative"]["monotone"] is False
    assert table["weighted"]["limit_hard_topk"] is False
    r = softk("check")
    assert r.returncode == 0 and "limit_hard_topk" in r.stdout and "iterative" in r.stdout


def test_compare_json_is_strict_with_masked_input():
    r = softk("compare", "--json", "--", "1", "2", "-inf", "3")
    assert r.returncode == 0, r.stderr
    assert "Infinity" not in r.stdout and "NaN" not in r.stdout
    out = json.loads(r.stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert out["input"][2] == "-inf"
    assert out["rows"]["softmax"]["values"][2] == 0.0


def test_simplex_figure_labels_clear_the_titles():
    """Each corner label of simplex.png lies inside its panel and clear of the panel's title."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import softk
    from softk._cli.plot import _simplex

    fig = _simplex(plt, softk)
    try:
        renderer = fig.canvas.get_renderer()
        fig.canvas.draw()
        for ax in fig.axes[:3]:
            title, panel = ax.title.get_window_extent(renderer), ax.get_window_extent(renderer)
            labels = [t for t in ax.texts if t.get_text().startswith("class")]
            assert len(labels) == 3
            for t in labels:
                box = t.get_window_extent(renderer)
                assert not box.overlaps(title), (ax.get_title(), t.get_text())
                assert panel.x0 <= box.x0 and box.x1 <= panel.x1 and panel.y0 <= box.y0 and box.y1 <= panel.y1, \
                    (ax.get_title(), t.get_text())
    finally:
        plt.close(fig)
