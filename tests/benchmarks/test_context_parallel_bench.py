"""benchmarks/gpu/context_parallel.py on 2 gloo ranks at a tiny size: every softk variant runs and
reports a time; torch's own context parallelism, which has no CPU attention rule, is reported as not
run with its reason.  Nothing here asserts on time."""

import json
import os
import sys


from .. import safety_net
from ..paths import REPO

SCRIPT = os.path.join(str(REPO), "benchmarks", "gpu", "context_parallel.py")


def test_tiny_run(tmp_path):
    out = tmp_path / "cp.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(str(REPO), "src"))
    r = safety_net.run([sys.executable, SCRIPT, "--world", "2", "--tokens", "64", "--heads", "2", "--dim", "8",
                        "--steps", "1", "--warmup", "1", "--json", str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = {row["variant"]: row for row in data["rows"]}
    assert data["meta"]["world"] == 2 and data["meta"]["tokens"] == 64
    softk_rows = [name for name in rows if name.startswith("softk_")]
    assert sorted(softk_rows) == sorted(f"softk_{m}_{s}" for m in ("softmax", "sparsemax", "entmax15")
                                        for s in ("allgather", "ring"))
    for name in softk_rows:
        assert "error" not in rows[name] and rows[name]["ms"] > 0 and rows[name]["tokens_per_s"] > 0, rows[name]
    assert "error" in rows["torch_sdpa"] or rows["torch_sdpa"]["ms"] > 0


def test_tokens_must_fit_the_layout():
    r = safety_net.run([sys.executable, SCRIPT, "--world", "2", "--tokens", "66"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(str(REPO), "src")))
    assert r.returncode != 0 and "--tokens must be a multiple of 2·world" in r.stderr
