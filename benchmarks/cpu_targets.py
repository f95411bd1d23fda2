"""Issue 6's CPU targets: fwd+bwd, fp32, 2 threads, 256x32000 and 2048x1024,
softk vs torch.softmax vs the entmax package, providers interleaved.

    python benchmarks/cpu_targets.py [--threads 2] [--repeats 7] > results.md
"""

import argparse
import json

import torch

from softk import bench

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--repeats", type=int, default=7)
ap.add_argument("--json", default=None, help="also write the tidy rows here")
a = ap.parse_args()
torch.set_num_threads(a.threads)
rows = bench.run(None, [(256, 32000), (2048, 1024)], repeats=a.repeats)
if a.json:
    with open(a.json, "w") as f:
        json.dump(rows, f, indent=1)
print(bench.markdown([r for r in rows if r["pass"] == "fwd+bwd"]))
