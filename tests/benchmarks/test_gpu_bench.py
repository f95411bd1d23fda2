"""benchmarks/gpu/gpu.py and benchmarks/gpu/gpu_correctness.py without a GPU.

Timings are injected (a fake timer), so nothing here measures or asserts on
time; the CUDA-only paths are checked for their clean exit without CUDA.
"""

import json
import os
import sys
import textwrap

import numpy as np
import pytest
import torch

from tests.oracle import maps as oracle

from .. import safety_net
from ..paths import REPO

ROOT = str(REPO)
BENCH = os.path.join(ROOT, "benchmarks", "gpu")
sys.path.insert(0, BENCH)

import gpu  # noqa: E402
import gpu_cases  # noqa: E402
import gpu_correctness  # noqa: E402
import gpu_isolate  # noqa: E402
import gpu_peers  # noqa: E402
import gpu_reference  # noqa: E402
import gpu_report  # noqa: E402
from gpu_cases import Case  # noqa: E402

META = {"device": "fake GPU", "torch": "t", "triton": "tr", "date": "2026-11-23"}


# ---- the case list -------------------------------------------------------------------------


def test_case_list_builds_with_the_issue_shapes():
    cases = gpu_cases.build_cases()
    keys = [c.key for c in cases]
    assert len(keys) == len(set(keys)) == 5 * 8 + 5 * 5 + 2 * 4
    assert {(c.rows, c.cols, c.dtype) for c in cases if c.group == "wide"} == set(gpu_cases.WIDE_SHAPES)
    assert {c.cols for c in cases if c.group == "router"} == {16, 64, 128, 256, 512}
    assert all(c.rows * c.cols == 2**25 and c.dtype == "bfloat16" for c in cases if c.group == "router")
    assert {c.shape for c in cases if c.group == "loss"} == {"8192x32768", "2048x131072"}
    for group in ("wide", "router", "loss"):  # the baseline comes first in every shape
        first = [c for c in cases if c.group == group][0]
        assert first.is_baseline
    quick = gpu_cases.build_cases(quick=True)
    assert len(quick) == 8 + 5 + 4 and set(quick) <= set(cases)


def test_only_keeps_the_baseline_of_each_selected_shape():
    cases = gpu_cases.build_cases(only=r"router/sparsemax/.*x64/")
    assert [c.key for c in cases] == ["router/softmax/524288x64/bfloat16", "router/sparsemax/524288x64/bfloat16"]
    losses = gpu_cases.build_cases(only="entmax15_loss")
    assert sorted(c.op for c in losses) == ["cross_entropy", "cross_entropy", "entmax15_loss", "entmax15_loss"]


def test_ideal_bytes():
    c = Case("wide", "sparsemax", 8192, 32768, "bfloat16")
    assert gpu_cases.ideal_bytes(c, "fwd") == 2 * 8192 * 32768 * 2
    assert gpu_cases.ideal_bytes(c, "fwd+bwd") == 5 * 8192 * 32768 * 2
    loss = Case("loss", "sparsemax_loss", 2048, 131072, "bfloat16")
    assert gpu_cases.ideal_bytes(loss, "fwd") == 2048 * 131072 * 2
    assert gpu_cases.ideal_bytes(loss, "fwd+bwd") == 2 * 2048 * 131072 * 2
    with pytest.raises(ValueError, match="mode"):
        gpu_cases.ideal_bytes(c, "bwd")


def test_impls_per_op():
    assert gpu_peers.impls_for("router", "sparsemax") == ("softk", "adasplash")
    assert gpu_peers.impls_for("wide", "sparsemax") == ("softk", "entmax", "adasplash", "liger")
    assert gpu_peers.impls_for("loss", "cross_entropy")[0] == "torch"
    for c in gpu_cases.build_cases():  # every case has an impl, and its group's baseline is served
        assert gpu_peers.impls_for(c.group, c.op), c.key
    assert all(gpu_peers.IMPLS[n].isolate for n in ("entmax", "adasplash", "liger"))


# ---- the driver with a fake timer, on the CPU ----------------------------------------------


class FakeClock:
    """Runs each closure once (so fwd and fwd+bwd really execute) and returns made-up times."""

    def __init__(self):
        self.n = 0

    def timer(self, call, grads, est_ms):
        call()
        self.n += 1
        return (1.0 * self.n, 2.0 * self.n, 3.0 * self.n)

    def mem(self, call, grads):
        call()
        return 0.25, 1.0


SMALL = [
    Case("wide", "softmax", 4, 16, "float32"),
    Case("wide", "sparsemax", 4, 16, "float32"),
    Case("wide", "soft_topk_exp_k2", 4, 16, "float32"),
    Case("router", "softmax", 8, 16, "float32"),
    Case("router", "route_top2", 8, 16, "float32"),
    Case("loss", "cross_entropy", 4, 16, "float32"),
    Case("loss", "sparsemax_loss", 4, 16, "float32"),
]


@pytest.fixture
def ghost_registry(monkeypatch):
    """The real impls plus "ghost", a peer whose package is missing, listed for sparsemax."""
    monkeypatch.setitem(gpu_peers.SERVES, "sparsemax", gpu_peers.SERVES["sparsemax"] + ("ghost",))
    registry = dict(gpu_peers.IMPLS)
    registry["ghost"] = gpu_peers.Impl("ghost", ("softk_no_such_package",), lambda mods: {}, dist="softk-no-such-package")
    return registry


def _run_small(registry):
    clock = FakeClock()
    names = ["torch", "softk", "entmax", "ghost"]
    rows = gpu.run_cases(SMALL, names, META, clock.timer, clock.mem, device="cpu", registry=registry, progress=lambda s: None)
    return gpu_report.attach_ratios(rows), clock


def test_driver_rows_from_fake_timings(ghost_registry):
    rows, clock = _run_small(ghost_registry)
    assert all(set(r) == set(gpu_report.FIELDS) for r in rows)
    timed = [r for r in rows if r["status"] == "ok"]
    assert clock.n == len(timed) > 0
    by = {(r["group"], r["op"], r["impl"], r["mode"]): r for r in rows}
    for r in timed:
        assert r["p20"] < r["p50"] < r["p80"] and r["peak_mib"] == 0.25 and r["device"] == "fake GPU"
        base = by[(r["group"],) + gpu_cases.BASELINE[r["group"]] + (r["mode"],)]
        assert r["ratio"] == pytest.approx(r["p50"] / base["p50"])
        case = next(c for c in SMALL if (c.group, c.op) == (r["group"], r["op"]))
        assert r["gbps"] == pytest.approx(gpu_cases.ideal_bytes(case, r["mode"]) / (r["p50"] * 1e-3) / 1e9)
    assert by[("wide", "softmax", "torch", "fwd")]["ratio"] == 1.0
    for key in [("wide", "sparsemax", "softk", "fwd+bwd"), ("loss", "sparsemax_loss", "softk", "fwd+bwd"), ("router", "route_top2", "torch", "fwd+bwd")]:
        assert by[key]["status"] == "ok", by[key]
    # a row per mode for every listed impl, timed or not
    assert {r["mode"] for r in rows} == {"fwd", "fwd+bwd"} and len(rows) % 2 == 0


def test_missing_peer_is_a_row_not_a_crash(ghost_registry):
    rows, _ = _run_small(ghost_registry)
    ghost = [r for r in rows if r["impl"] == "ghost"]
    assert len(ghost) == 2 and all(r["status"].startswith("not installed: ModuleNotFoundError") for r in ghost)
    assert all(r["p50"] is None and r["ratio"] is None and r["gbps"] is None for r in ghost)
    em = [r for r in rows if r["impl"] == "entmax"]
    assert em and all(r["status"] == "ok" or r["status"].startswith("not installed") for r in em)


def test_isolated_peer_that_is_missing_starts_no_process(monkeypatch):
    monkeypatch.setattr(gpu, "load", lambda name, registry=None: (None, "not installed: ModuleNotFoundError: x", None))

    def no_subprocess(*a, **k):
        raise AssertionError("a missing peer must not start a child process")

    monkeypatch.setattr(gpu, "run_items", no_subprocess)
    cases = gpu_cases.build_cases(quick=True)
    rows = gpu._peer_phase(cases, ["adasplash", "liger"], META, None, 1e12, lambda more: None)
    assert {r["impl"] for r in rows} == {"adasplash", "liger"}
    assert all(r["status"].startswith("not installed") for r in rows)
    assert len(rows) == 2 * sum(("adasplash" in gpu_peers.impls_for(c.group, c.op)) + ("liger" in gpu_peers.impls_for(c.group, c.op)) for c in cases)


def test_json_and_markdown_writers(ghost_registry, tmp_path):
    rows, _ = _run_small(ghost_registry)
    path = tmp_path / "gpu.json"
    gpu_report.write_json(rows, str(path))
    back = json.loads(path.read_text())
    assert back == [{k: r[k] for k in gpu_report.FIELDS} for r in rows]
    md = gpu_report.markdown(rows)
    assert "Device: fake GPU; torch t, triton tr; 2026-11-23." in md
    r = next(r for r in rows if (r["group"], r["op"], r["impl"], r["mode"]) == ("wide", "sparsemax", "softk", "fwd"))
    r2 = next(x for x in rows if (x["group"], x["op"], x["impl"], x["mode"]) == ("wide", "sparsemax", "softk", "fwd+bwd"))
    line = next(ln for ln in md.splitlines() if ln.startswith("| 4x16 float32 | sparsemax |"))
    assert f"{r['ratio']:.2f} / {r2['ratio']:.2f}" in line and "n/i / n/i" in line
    assert md.count("\n| wide | 4x16 | float32 | sparsemax | ghost |") == 2
    assert gpu_report.status_counts(rows)["n/i"] == 2


def test_json_is_strict_with_non_finite_numbers(tmp_path):
    row = gpu_report.make_row(SMALL[0], "softk", "fwd", META, times=(1.0, float("inf"), float("nan")))
    gpu_report.write_json([row], str(tmp_path / "x.json"))
    text = (tmp_path / "x.json").read_text()
    assert "Infinity" not in text and "NaN" not in text and json.loads(text)[0]["p80"] == "nan"


# ---- child processes -----------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {bench!r})
    from gpu_isolate import worker_loop
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))

    def handle(item):
        if item == "crash":
            os._exit(7)  # dies mid-item, as a device-side assert does
        if item == "lost":
            raise RuntimeError("CUDA error: device-side assert triggered")
        return {{"value": item.upper(), "pid": os.getpid()}}

    worker_loop(args["--worker-items"], args["--worker-out"], handle)
    """
)


def test_isolation_reports_a_crash_and_goes_on(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(bench=BENCH))
    items = ["a", "crash", "b", "lost", "c"]
    got = gpu_isolate.run_items([sys.executable, str(script)], items, timeout_s=120)
    assert set(got) == set(items)
    assert got["a"]["value"] == "A" and got["b"]["value"] == "B" and got["c"]["value"] == "C"
    assert got["crash"]["status"].startswith("crashed: worker exit 7")
    assert got["lost"]["status"].startswith("error: RuntimeError: CUDA error") and got["lost"]["context_lost"]
    # a fresh process after the crash and after the lost context
    assert got["a"]["pid"] != got["b"]["pid"] != got["c"]["pid"]


def test_isolation_reports_a_worker_that_cannot_start():
    got = gpu_isolate.run_items([sys.executable, "-c", "import sys; sys.exit('no softk here')"], ["x", "y"], timeout_s=60)
    assert all(v["status"].startswith("worker failed: exit 1") and "no softk here" in v["status"] for v in got.values())


# ---- the float64 reference -----------------------------------------------------------------

ORACLES = {
    "softmax": oracle.softmax,
    "sparsemax": oracle.sparsemax,
    "entmax15": lambda a: oracle.entmax(a, 1.5),
    "entmax_a1.3": lambda a: oracle.entmax(a, 1.3),
    **{m: (lambda m: lambda a: oracle.soft_topk(a, 3, method=m))(m) for m in ("exp", "sigmoid", "laplace", "sparse")},
}


def _adversarial_rows():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 11, generator=gen, dtype=torch.float64) * 2
    x[1, :6] = -torch.inf  # masked
    x[2] = -torch.inf  # fully masked
    x[3, 1:] = -torch.inf  # one finite entry
    x[4, 3:] = -torch.inf  # three finite: at most k for the top-k maps
    x[5] = torch.round(x[5])  # ties
    x[6, 4] = 1e4  # outlier
    x[7] *= 1e-3
    x[8] = x[8] * 1e3 + 1e5  # far from the origin
    return x


@pytest.mark.parametrize("family", list(gpu_reference.FAMILIES))
def test_reference_agrees_with_the_numpy_oracle(family):
    x = _adversarial_rows()
    p, lam, _ = gpu_reference.solve(x, family)
    want = ORACLES[family](x.numpy())
    # both bisect to adjacent float64 values of λ: they may differ by an ulp of the largest |x| (1e5 here)
    ulp = np.spacing(x[torch.isfinite(x)].abs().max().item())
    np.testing.assert_allclose(p.numpy(), want, rtol=0, atol=4 * ulp)
    assert torch.isnan(lam[2]) and torch.isfinite(lam[0])


@pytest.mark.parametrize("family", list(gpu_reference.FAMILIES))
def test_reference_vjp_agrees_with_the_oracle_jacobian(family):
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        row = torch.randn(8, generator=gen, dtype=torch.float64) * 1.5
        g = torch.randn(1, 8, generator=gen, dtype=torch.float64)
        jac = oracle.numerical_jacobian(lambda r: ORACLES[family](r[None])[0], row.numpy())
        p, _, _ = gpu_reference.solve(row[None], family)
        np.testing.assert_allclose(gpu_reference.vjp(family, p, g)[0].numpy(), jac.T @ g[0].numpy(), rtol=0, atol=1e-7)


# ---- the correctness verdicts --------------------------------------------------------------


def test_compare_passes_the_reference_and_fails_a_wrong_map():
    x = gpu_correctness.make_input("scale_1", 64, "float32", "cpu")
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    p, _, _ = gpu_reference.solve(x, "entmax15")
    dx = gpu_reference.vjp("entmax15", p, g)
    assert gpu_correctness.compare("entmax15", "float32", x, p.float(), dx.float(), g)["verdict"] == "pass"
    wrong_p = gpu_reference.solve(x * 1.001, "entmax15")[0]
    assert gpu_correctness.compare("entmax15", "float32", x, wrong_p.float(), dx.float(), g)["why"] == "forward"
    sparse_p = gpu_reference.solve(x, "sparsemax")[0]  # sparsemax is not entmax15
    assert gpu_correctness.compare("entmax15", "bfloat16", x, sparse_p, None, None)["verdict"] == "fail"
    wrong_dx = dx.clone()
    wrong_dx[0, 0] += 1e-3
    r = gpu_correctness.compare("entmax15", "float32", x, p.float(), wrong_dx.float(), g)
    assert r["verdict"] == "fail" and r["why"] == "backward"
    nan_p = p.float().clone()
    nan_p[2, 3] = float("nan")
    assert gpu_correctness.compare("entmax15", "float32", x, nan_p, None, None)["verdict"] == "fail"


def test_a_tie_on_the_threshold_is_ambiguous_not_failed():
    x = torch.tensor([[1.5, 1.5, 1.0, 0.0]])  # sparsemax: λ = 1 exactly, the third entry sits on it
    g = torch.tensor([[0.0, 0.0, 3.0, 0.0]])
    p, lam, _ = gpu_reference.solve(x, "sparsemax")
    assert float(lam[0]) == 1.0 and float(p[0, 2]) == 0.0
    other_side = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the subgradient with the tie in the support
    dx = gpu_reference.vjp("sparsemax", other_side, g)
    r = gpu_correctness.compare("sparsemax", "bfloat16", x, p.float(), dx.float(), g)
    assert r["verdict"] == "ambiguous" and r["why"] == "backward at a kink"
    moved = torch.tensor([[1.5, 1.5, 0.5, 0.0]])  # away from the threshold the same dx is a failure
    p2 = gpu_reference.solve(moved, "sparsemax")[0]
    assert gpu_correctness.compare("sparsemax", "bfloat16", moved, p2.float(), dx.float(), g)["verdict"] == "fail"


@pytest.mark.parametrize("family", list(gpu_reference.FAMILIES))
@pytest.mark.slow
def test_softk_cpu_passes_a_few_cases(family):
    """The check on softk's CPU path (the GPU kernels run it on CUDA): it must be passable."""
    for kind, dtype in (("masked", "float32"), ("ties", "bfloat16"), ("outlier_1e4", "float16")):
        r = gpu_correctness.run_case(family, kind, 64, dtype, device="cpu")
        assert r["verdict"] == "pass", r


def test_the_grid_is_720_cases():
    grid = len(gpu_correctness.FAMILY_NAMES) * len(gpu_correctness.WIDTHS) * len(gpu_correctness.DTYPES) * len(gpu_correctness.KINDS)
    assert grid == 720 and gpu_correctness.WIDTHS[0] == 5 and gpu_correctness.WIDTHS[-1] == 262144


def test_peer_check_of_a_missing_peer_is_skipped():
    r = gpu_correctness.peer_check("ghost", "sparsemax", "masked_fp32", registry={"ghost": gpu_peers.Impl("ghost", ("softk_no_such_package",), lambda m: {})})
    assert r["verdict"] == "skip" and r["why"].startswith("not installed")


@pytest.mark.slow
def test_peer_check_runs_on_the_cpu_for_softk():
    for check in ("masked_fp32", "outlier_bf16", "bwd_bf16"):
        r = gpu_correctness.peer_check("softk", "sparsemax", check, device="cpu")
        assert r["verdict"] == "pass", r


# ---- the command lines ---------------------------------------------------------------------


def _run(script, *args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.path.join(ROOT, "src"))
    return safety_net.run([sys.executable, os.path.join(BENCH, script), *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("script", ["gpu.py", "gpu_correctness.py"])
@pytest.mark.slow
def test_help_works_and_no_cuda_exits_2_with_one_line(script):
    h = _run(script, "--help")
    assert h.returncode == 0 and "--json" in h.stdout
    r = _run(script, "--quick")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "no CUDA device" in r.stderr


def test_list_needs_no_gpu():
    r = _run("gpu.py", "--list", "--only", "router/")
    assert r.returncode == 0
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 25 and lines[0] == "router/softmax/2097152x16/bfloat16 torch"


def test_parallel_warm_workers_run_every_item(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(bench=BENCH))
    got = gpu_isolate.run_parallel([sys.executable, str(script)], ["a", "b", "c", "crash", "d"], procs=2, timeout_s=120)
    assert {k: v["value"] for k, v in got.items()} == {"a": "A", "b": "B", "c": "C", "d": "D"}
    assert "crash" not in got  # a warm-up that died is only missing, never fatal
    assert len({v["pid"] for v in got.values()}) == 2


def test_warm_helpers_run_on_the_cpu():
    from gpu_timing import warm

    warm(Case("loss", "sparsemax_loss", 8192, 64, "float32"), gpu_peers.load("softk")[0]["sparsemax_loss"], "cpu")
    warm(Case("wide", "entmax15", 8192, 64, "bfloat16"), gpu_peers.load("softk")[0]["entmax15"], "cpu")
    assert gpu_correctness.warm_one("exp|70|float32", device="cpu") == {"compiled": "exp|70|float32"}


@pytest.mark.slow
def test_dry_run_of_the_whole_flow_on_the_cpu(tmp_path):
    """main() end to end with small rows: warm-up, torch/softk in process, the entmax package in a child."""
    out = tmp_path / "dry.json"
    r = _run("gpu.py", "--device", "cpu", "--max-rows", "2", "--quick", "--only", "loss/sparsemax_loss", "--min-reps", "2",
             "--warm-jobs", "1", "--impls", "torch,softk,entmax", "--json", str(out), "--markdown", str(tmp_path / "dry.md"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    got = {(x["op"], x["impl"], x["mode"]): x for x in rows}
    assert set(got) == {(op, impl, m) for op, impl in [("cross_entropy", "torch"), ("cross_entropy", "softk"), ("sparsemax_loss", "softk"),
                                                      ("sparsemax_loss", "entmax")] for m in ("fwd", "fwd+bwd")}  # fmt: skip
    assert all(x["shape"] == "2x32768" and x["ratio"] is not None for x in rows if x["status"] == "ok")
    assert got[("sparsemax_loss", "softk", "fwd+bwd")]["status"] == "ok"
    assert got[("sparsemax_loss", "entmax", "fwd")]["status"] in ("ok",) or got[("sparsemax_loss", "entmax", "fwd")]["status"].startswith("not installed")
    assert "| 2x32768 bfloat16 | sparsemax_loss |" in (tmp_path / "dry.md").read_text()


@pytest.mark.slow
def test_dry_run_of_the_correctness_flow_on_the_cpu(tmp_path):
    out = tmp_path / "c.json"
    common = ["--device", "cpu", "--quick", "--families", "sparsemax", "--no-peers", "--json", str(out)]
    r = _run("gpu_correctness.py", *common, "--warm-jobs", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["summary"]["total"] == data["summary"]["pass"] == 2 * 3 * 5
    assert {(c["width"], c["dtype"], c["kind"]) for c in data["cases"]} == {
        (w, d, k) for w in gpu_correctness.QUICK_WIDTHS for d in gpu_correctness.DTYPES for k in gpu_correctness.KINDS
    }
    r = _run("gpu_correctness.py", *common, "--warm-jobs", "0", "--budget-s", "0")
    assert r.returncode == 1 and json.loads(out.read_text())["summary"]["skipped"] == 30
