"""Tidy rows, ratios, and the JSON / Markdown writers of ``benchmarks/gpu/gpu.py``.

A row is one (op, impl, shape, dtype, mode).  Times are milliseconds
(``p20``/``p50``/``p80``), ``ratio`` is p50 over the group baseline's p50
(torch.softmax, or F.cross_entropy for losses) at the same shape, dtype and
mode in the same run, ``peak_mib`` the CUDA memory allocated beyond what was
allocated before the call, ``gbps`` :func:`gpu_cases.ideal_bytes` over p50.
A row that was not timed has ``status`` saying why and null numbers.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

from gpu_cases import BASELINE, MODES, Case, ideal_bytes

FIELDS = (
    "group", "op", "impl", "shape", "dtype", "mode", "p20", "p50", "p80", "ratio", "peak_mib", "gbps",
    "status", "impl_version", "device", "torch", "triton", "date",
)  # fmt: skip


def make_row(case: Case, impl: str, mode: str, meta: dict, status: str = "ok", times=None, peak_mib=None, impl_version=None) -> dict:
    """One tidy row; ``times`` is (p20, p50, p80) in ms or None when not timed."""
    p20, p50, p80 = times if times is not None else (None, None, None)
    gbps = ideal_bytes(case, mode) / (p50 * 1e-3) / 1e9 if p50 else None
    row = {
        "group": case.group, "op": case.op, "impl": impl, "shape": case.shape, "dtype": case.dtype, "mode": mode,
        "p20": p20, "p50": p50, "p80": p80, "ratio": None, "peak_mib": peak_mib, "gbps": gbps,
        "status": status, "impl_version": impl_version,
        "device": meta.get("device"), "torch": meta.get("torch"), "triton": meta.get("triton"), "date": meta.get("date"),
    }  # fmt: skip
    return row


def attach_ratios(rows: list[dict]) -> list[dict]:
    """Set ``ratio`` = p50 / the baseline's p50 (same group, shape, dtype, mode); None without one."""
    base = {}
    for r in rows:
        if (r["op"], r["impl"]) == BASELINE[r["group"]] and r["p50"]:
            base[(r["group"], r["shape"], r["dtype"], r["mode"])] = r["p50"]
    for r in rows:
        b = base.get((r["group"], r["shape"], r["dtype"], r["mode"]))
        r["ratio"] = r["p50"] / b if (b and r["p50"]) else None
    return rows


def _clean(v):
    return v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)


def write_json(rows: list[dict], path: str) -> None:
    """Strict JSON: a list of rows with the keys of :data:`FIELDS` (non-finite numbers as strings)."""
    with open(path, "w") as f:
        json.dump([{k: _clean(r.get(k)) for k in FIELDS} for r in rows], f, indent=1)
        f.write("\n")


def _short(status: str) -> str:
    for prefix, tag in (("not installed", "n/i"), ("import failed", "n/i"), ("not available", "n/a"), ("crashed", "crash"),
                        ("timed out", "t/o"), ("skipped", "skip"), ("error", "err")):  # fmt: skip
        if status.startswith(prefix):
            return tag
    return status[:8]


def _cell(row: dict | None) -> str:
    if row is None:
        return "–"
    if row["status"] != "ok":
        return _short(row["status"])
    return f"{row['ratio']:.2f}" if row["ratio"] is not None else f"{row['p50']:.3f} ms"


def markdown(rows: list[dict], title: str = "GPU benchmark") -> str:
    """Summary tables (p50 ratio to the baseline, "fwd / fwd+bwd", per impl), then every row."""
    meta = rows[0] if rows else {}
    out = [f"## {title}", "", f"Device: {meta.get('device')}; torch {meta.get('torch')}, triton {meta.get('triton')}; {meta.get('date')}.",
           "Cells: p50 as a multiple of the baseline's p50 in the same run (torch.softmax; F.cross_entropy for losses), fwd / fwd+bwd.",
           "n/i: not installed; n/a: not served; err/crash/t/o/skip: see the status column below.", ""]  # fmt: skip
    by = {(r["group"], r["shape"], r["dtype"], r["op"], r["impl"], r["mode"]): r for r in rows}
    for group in dict.fromkeys(r["group"] for r in rows):
        grows = [r for r in rows if r["group"] == group]
        impls = list(dict.fromkeys(r["impl"] for r in grows))
        bop, bimpl = BASELINE[group]
        out += [f"### {group}", "", "| shape, dtype | op | baseline p50 ms (fwd / fwd+bwd) | " + " | ".join(impls) + " |",
                "|---|---|---|" + "---|" * len(impls)]  # fmt: skip
        for shape, dtype, op in dict.fromkeys((r["shape"], r["dtype"], r["op"]) for r in grows):
            bp = [by.get((group, shape, dtype, bop, bimpl, m)) for m in MODES]
            bcell = " / ".join(f"{b['p50']:.3f}" if b and b["p50"] else "–" for b in bp)
            cells = [" / ".join(_cell(by.get((group, shape, dtype, op, i, m))) for m in MODES) for i in impls]
            if all(c == "– / –" for c in cells):
                continue
            out.append(f"| {shape} {dtype} | {op} | {bcell} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["### Every row", "", "| group | shape | dtype | op | impl | mode | p20 | p50 | p80 ms | ratio | GB/s | peak MiB | status |",
            "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip

    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "–"

    for r in rows:
        out.append(
            f"| {r['group']} | {r['shape']} | {r['dtype']} | {r['op']} | {r['impl']} | {r['mode']} | {num(r['p20'], '.3f')} | "
            f"{num(r['p50'], '.3f')} | {num(r['p80'], '.3f')} | {num(r['ratio'], '.2f')} | {num(r['gbps'], '.0f')} | "
            f"{num(r['peak_mib'], '.0f')} | {r['status']} |"
        )
    return "\n".join(out) + "\n"


def status_counts(rows: list[dict]) -> dict[str, int]:
    """How many rows per short status (ok, n/i, err, ...), for the closing summary line."""
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts["ok" if r["status"] == "ok" else _short(r["status"])] += 1
    return dict(counts)
