"""benchmarks/gpu/moe_router.py at its tiny size: every variant runs, and the
experts it reports match the routing (the control's k per token, fewer with a
target, the same with and without skipping).  Nothing here asserts on time."""

import json
import os
import sys

import pytest

from .. import safety_net
from ..paths import REPO

SCRIPT = os.path.join(str(REPO), "benchmarks", "gpu", "moe_router.py")


def test_tiny_run(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "moe.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(str(REPO), "src"))
    r = safety_net.run([sys.executable, SCRIPT, "--size", "tiny", "--steps", "1", "--warmup", "0", "--threads", "1",
                        "--json", str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = {row["variant"]: row for row in data["rows"]}
    shape = data["meta"]["shape"]
    assert list(rows) == ["own", "control", "sparsemax", "sparsemax_half", "entmax15_half", "sparsemax_dense"]
    per_pair = 6 * shape["hidden"] * shape["intermediate"] / 1e6
    for row in rows.values():
        assert row["expert_mflops_per_token"] == pytest.approx(row["live_per_token"] * per_pair)
        assert 0 < row["live_per_token"] <= shape["top_k"]
    assert rows["own"]["live_per_token"] == rows["control"]["live_per_token"] == shape["top_k"]
    half = shape["top_k"] / 2
    for name in ("sparsemax_half", "entmax15_half"):  # the controller settled near its target
        assert abs(rows[name]["live_per_token"] - half) <= 0.1 * half, rows[name]
    assert rows["sparsemax_dense"]["live_per_token"] == rows["sparsemax_half"]["live_per_token"]
