"""benchmarks/gpu/fused_live_tiles.py without a GPU: its ``--dry-run`` (the
tile kernels in Triton's interpreter, tiny shape) runs every setting, writes
its JSON, and finds the two routes' loss and gradients equal.  Nothing here
measures or asserts on time."""

import json
import os
import sys

import pytest

from .. import safety_net
from ..paths import REPO

SCRIPT = os.path.join(str(REPO), "benchmarks", "gpu", "fused_live_tiles.py")


def test_dry_run(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "tiles.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(str(REPO), "src"))
    r = safety_net.run([sys.executable, SCRIPT, "--dry-run", "--chunks", "0", "16", "--json", str(out)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["meta"]["interpreted"]
    rows = data["rows"]
    assert {r["setting"] for r in rows} == {"trained", "zipf", "random"} and len(rows) == 6
    for row in rows:
        assert "status" not in row, row
        assert row["match"] and 0 < row["live_tile_share"] <= 1, row
    assert "crossover" in r.stdout and "| N×H×V |" in r.stdout
