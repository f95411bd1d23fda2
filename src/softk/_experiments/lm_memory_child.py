"""The child process of :func:`softk._experiments.lm_memory.step_memory`:
reads the configuration and the (loss, attention, fused) triples as JSON on
stdin, measures one training step of each and prints the rows as JSON
(``python -m softk._experiments.lm_memory_child``)."""

from __future__ import annotations

import json
import sys

import torch

from . import lm
from .memory import PeakRSS


def main() -> None:
    torch.set_num_threads(1)
    spec = json.loads(sys.stdin.read())
    cfg = lm.Config(**spec["cfg"])
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.context), generator=gen)
    rows = []
    for loss_arm, attention, fused in spec["configs"]:
        model = lm.build_model(cfg, attention, 0)
        step = lm.make_step(model, lm.LOSSES[loss_arm], fused, torch.optim.AdamW(model.parameters(), lr=1e-4))
        step(ids[:1, :8])
        with PeakRSS() as mem:
            step(ids)
        rows.append([loss_arm, attention, fused, mem.extra / 2**20])
        del model, step
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
