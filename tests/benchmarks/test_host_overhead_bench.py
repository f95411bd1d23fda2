"""benchmarks/gpu/host_overhead.py without a GPU: ``--stub-kernels`` runs the
Triton route on the CPU with every launch a no-op (softk's own host path),
and refuses a CUDA run.  Nothing here asserts on time."""

import json
import os
import sys

from .. import safety_net
from ..paths import REPO

SCRIPT = os.path.join(str(REPO), "benchmarks", "gpu", "host_overhead.py")


def _ops():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import host_overhead

    return host_overhead.OPS


def _run(*args, env=None):
    env = {k: v for k, v in (env or os.environ).items() if k not in ("SOFTK_BACKEND", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(str(REPO), "src"), env.get("PYTHONPATH", "")])
    return safety_net.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env)


def test_stubbed_run_times_every_op_on_the_triton_route(tmp_path):
    out = tmp_path / "host.json"
    r = _run("--device", "cpu", "--stub-kernels", "--calls", "3", "--repeats", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert "Triton route" in data["meta"]["device"] and "kernels stubbed" in data["meta"]["device"]
    stubbed = int(data["meta"]["device"].split(", ")[-1].split()[0])
    assert stubbed >= 5  # the map, top-k, wide, backward, softmax and loss launchers' kernels
    rows = data["rows"]  # (impl, op) × forward and forward + backward, each timed
    assert {(row["impl"], row["op"], row["mode"]) for row in rows} == {
        (impl, op, mode) for impl, op in _ops() for mode in ("fwd", "fwd+bwd")}
    assert all(row["us"] > 0 for row in rows)


def test_stub_kernels_refuses_a_gpu_run():
    r = _run("--device", "cuda", "--stub-kernels")
    assert r.returncode == 2 and "--stub-kernels runs on the CPU" in r.stderr
