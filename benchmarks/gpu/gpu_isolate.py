"""Run work items in child processes, so that a crash costs one item, not the run.

A device-side assert (the entmax package on a fully masked row) leaves the
CUDA context of its process unusable: every later CUDA call fails.  So peers
run in a worker process: the parent hands it a list of item names, the
worker appends one JSON line ``{"start": item}`` before each item and
``{"done": item, "payload": {...}}`` after it, and exits with
:data:`CONTEXT_LOST_EXIT` when an item lost the context.  The parent then
starts a fresh worker on the items left; an item that was started and never
finished is reported as crashed, with the tail of the worker's stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable

CONTEXT_LOST_EXIT = 3
_MARKERS = ("CUDA error", "device-side assert", "illegal memory access", "unspecified launch failure", "CUBLAS_STATUS", "cudaError")


def context_lost(exc: BaseException) -> bool:
    """True when ``exc`` says the CUDA context is gone (later CUDA calls in this process would fail)."""
    return any(m in str(exc) for m in _MARKERS)


def short_error(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters, for a one-cell status."""
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0] if msg else ''}"
    return text[:limit]


def _tail(text: str, limit: int = 400) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-limit:]


def run_items(argv: list[str], items: list[str], timeout_s: float, env: dict | None = None) -> dict[str, dict]:
    """Run ``argv + ["--worker-items", F, "--worker-out", G]`` until every item has a payload.

    Returns ``{item: payload}``.  Items that crashed a worker get
    ``{"status": "crashed: ..."}``; items not reached before ``timeout_s``
    get ``{"status": "skipped: time budget"}``.
    """
    results: dict[str, dict] = {}
    remaining = list(items)
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="softk_isolate_") as tmp:
        attempt = 0
        while remaining:
            left = deadline - time.monotonic()
            if left < 5:
                break
            attempt += 1
            items_path = os.path.join(tmp, f"items{attempt}.json")
            out_path = os.path.join(tmp, f"out{attempt}.jsonl")
            with open(items_path, "w") as f:
                json.dump(remaining, f)
            cmd = argv + ["--worker-items", items_path, "--worker-out", out_path]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env)
                rc, err = proc.returncode, proc.stderr
            except subprocess.TimeoutExpired as e:
                rc, err = "timeout", (e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr) or ""
            started, done = _read_progress(out_path, results)
            crashed = [i for i in started if i not in done]
            for item in crashed:
                why = "timed out (time budget)" if rc == "timeout" else f"crashed: worker exit {rc}: {_tail(err)}"
                results[item] = {"status": why}
            if not started:  # the worker died before its first item: it will not do better next time
                for item in remaining:
                    results[item] = {"status": f"worker failed: exit {rc}: {_tail(err)}"}
            remaining = [i for i in remaining if i not in results]
    for item in remaining:
        results[item] = {"status": "skipped: time budget"}
    return results


def _read_progress(path: str, results: dict) -> tuple[list[str], set[str]]:
    started, done = [], set()
    if not os.path.exists(path):
        return started, done
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by the crash
                continue
            if "start" in rec:
                started.append(rec["start"])
            elif "done" in rec:
                done.add(rec["done"])
                results[rec["done"]] = rec["payload"]
    return started, done


def worker_loop(items_path: str, out_path: str, handle: Callable[[str], dict]) -> None:
    """The worker side: ``handle(item) -> payload`` for each item, progress flushed line by line.

    A payload with ``"context_lost": True``, or an exception that says the
    context is gone, ends the worker with :data:`CONTEXT_LOST_EXIT` after its
    line is written, so that the parent restarts on a fresh context.
    """
    with open(items_path) as f:
        items = json.load(f)
    with open(out_path, "a") as out:

        def emit(rec):
            out.write(json.dumps(rec) + "\n")
            out.flush()
            os.fsync(out.fileno())

        for item in items:
            emit({"start": item})
            try:
                payload = handle(item)
            except Exception as e:  # noqa: BLE001 - the worker reports every failure as data
                payload = {"status": f"error: {short_error(e)}", "context_lost": context_lost(e)}
            emit({"done": item, "payload": payload})
            if payload.get("context_lost"):
                sys.exit(CONTEXT_LOST_EXIT)


def run_parallel(argv: list[str], items: list[str], procs: int, timeout_s: float, env: dict | None = None) -> dict[str, dict]:
    """Split ``items`` round-robin over ``procs`` workers running at once; no restarts.

    For warming Triton's on-disk kernel cache before anything is timed: the
    compiles of many kernel variants run on many CPU cores, and the timed
    process then loads them from the cache.  Returns ``{item: payload}`` for
    the items that finished.
    """
    results: dict[str, dict] = {}
    chunks = [c for c in (items[i::max(1, procs)] for i in range(max(1, procs))) if c]
    with tempfile.TemporaryDirectory(prefix="softk_parallel_") as tmp:
        running = []
        for i, chunk in enumerate(chunks):
            items_path, out_path = os.path.join(tmp, f"items{i}.json"), os.path.join(tmp, f"out{i}.jsonl")
            with open(items_path, "w") as f:
                json.dump(chunk, f)
            cmd = argv + ["--worker-items", items_path, "--worker-out", out_path]
            running.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env), out_path))
        deadline = time.monotonic() + timeout_s
        for proc, _ in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for _, out_path in running:
            _read_progress(out_path, results)
    return results
