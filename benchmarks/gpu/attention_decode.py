"""Decoding, a paged KV cache and packed training: softk's attention against torch's on the device.

    python benchmarks/gpu/attention_decode.py [--sections decode paged packed] [--lengths 4096 16384 65536 131072]
        [--pages 16 256] [--maps softmax sparsemax entmax15] [--sharpness 1.0] [--locality 0.0] [--window 64]
        [--budget-s 600] [--json OUT.json]

Three sections, bfloat16 on CUDA, every map of ``--maps``:

* ``decode``: 1 query per sequence (and 4: speculative decoding, the 4
  draft tokens seeing the whole cache, no mask among them) against a KV
  cache of S keys, B = 4, H = 32, H_kv = 8 (GQA), E = 128, forward:
  ``softk.attention.scaled_dot_product_attention(..., enable_gqa=True)``
  against torch's SDPA (its default backend choice, and flash), with the
  share of keys and of 16-key pages whose values P·V can skip: keys that
  no query row of their key/value head gives a nonzero weight
  (``softk._backends.blockwise.support.skipped`` on softk's weights of the
  float32 scores, one batch item at a time).
* ``paged``: softk's ``varlen_attn`` with ``block_table`` and ``seqused_k``
  (pages of 16 and of 256 keys, shuffled in the pool), N = 8 sequences of
  ragged lengths up to S, one query each, against torch's
  ``torch.nn.attention.varlen.varlen_attn`` with a block table (where that
  torch takes one; else a row says so) and SDPA per sequence on contiguous
  caches; skip shares at the section's page size.
* ``packed``: softk's ``varlen_attn`` on T = 16384 packed tokens (8
  documents of ragged lengths), H = 16, H_kv = 4, E = 128, causal
  (window (-1, 0)) and a sliding window (1024, 0), forward and
  forward+backward, against torch's ``varlen_attn`` (where it runs) and
  SDPA per document (the sliding window as a boolean mask there, so SDPA
  runs the backend that takes a mask).

Before it is timed, every softk row's output is compared with a float32
reference computed here on the device from the same rounded inputs (the
scores, the mask and softk's map on them, then P·V): decoding on batch
item 0, the paged cache on every sequence, packed training on the first two
documents.  The error is max |got − ref| / max(1, max |ref|); above the
tolerance of ``attention_check.py`` (2.5e-2 in bfloat16, 2e-4 in float32)
the row says FAIL, and the run goes on.

Times are Triton's ``do_bench`` (p20/p50/p80 ms, L2 flushed); ``× SDPA`` is
a row's p50 over the p50 of its section's SDPA row (decode: the default
backend; paged and packed: SDPA per sequence) in the same case; peak MiB is
``torch.cuda.max_memory_allocated`` above what the inputs hold.  q and k
are standard normal times ``--sharpness``, plus ``--locality`` times the
positional vector of ``attention.py`` (nearby keys score higher: for
decoding, a recency bias towards the end of the cache).

Each section runs in a child process, so that a fault on the device costs
one section, not the run; the JSON (device, versions, date, every row) is
rewritten after each case, and cases not started within ``--budget-s`` are
rows that say so.  Markdown tables, one per section, are printed at the end.

``--smoke`` runs the same code on the CPU at tiny sizes (S ≤ 256, T = 256,
float32, wall-clock timer, no flash, in this process): a check that the
script runs, not a timing.  Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SECTIONS = ("decode", "paged", "packed")
# The packed documents' lengths are T times these weights over their sum: ragged, none page-aligned.
DOC_WEIGHTS = (3, 1, 4, 1, 5, 9, 2, 6)


def _sibling(name):
    """benchmarks/gpu/<name>.py, loaded from its path: a module named like it
    elsewhere on sys.path (benchmarks/cpu/attention.py) cannot stand in."""
    key = f"_softk_gpu_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, os.path.join(HERE, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


# ----------------------------------------------------------------- inputs and reference
def positional(n, E, device, a):
    """(n, E) float32: ``--locality`` times attention.py's positional vector, or None."""
    import torch

    if not a.locality:
        return None
    # make_inputs with sharpness 0 and locality 1 returns that vector itself as q
    u = _sibling("attention").make_inputs(1, 1, n, E, torch.float32, device, sharpness=0.0, seed=1, locality=1.0,
                                          window=a.window)[0]
    return a.locality * u[0, 0]


def normal(shape, g, a, device, pos=None):
    """Standard normal times ``--sharpness`` (float32), plus ``pos`` on the token axis (-2)."""
    import torch

    x = torch.randn(*shape, generator=g, device=device) * a.sharpness
    return x if pos is None else x + pos


def mapfn(name):
    import softk

    return {"softmax": softk.softmax, "sparsemax": softk.sparsemax, "entmax15": softk.entmax15}[name]


def reference(q, k, v, name, keep=None):
    """float32 output (H, L, Ev) and weights (H_kv, G·L, S) of q (H, L, E) against
    k (H_kv, S, E), v (H_kv, S, Ev); ``keep`` (L, S) bool or None.  Query head h reads
    key/value head h // G, so the rows of one key/value head are its G query heads' rows."""
    H, L, E = q.shape
    Hkv = k.shape[0]
    G = H // Hkv
    s = (q.float().reshape(Hkv, G * L, E) @ k.float().transpose(-1, -2)) * E ** -0.5
    if keep is not None:
        s = s.masked_fill(~keep.repeat(G, 1), float("-inf"))
    p = mapfn(name)(s)
    return (p @ v.float()).reshape(H, L, -1), p


def error(got, ref):
    """max |got − ref| / max(1, max |ref|): inf when got is not finite."""
    import torch

    got = got.float()
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    return (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())


def window_keep(L, window, device):
    """(L, L) bool of a document's queries and keys under a (left, 0) window, built
    here rather than taken from softk so that the check does not share its code."""
    import torch

    i = torch.arange(L, device=device).unsqueeze(-1)
    j = torch.arange(L, device=device)
    keep = j <= i
    if window[0] >= 0:
        keep &= j >= i - window[0]
    return keep


# ----------------------------------------------------------------- implementations
def _label(name, q):
    from softk._backends import dispatch

    from softk.threshold import attention_maps

    kernel = dispatch.pick("attention", q, attention_maps.family_id(name, None, False))
    return f"softk-{name} ({getattr(kernel, 'backend', 'reference')})"


def _sdpa(flash=False, **kw):
    import contextlib

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(q, k, v, mask=None):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if flash else contextlib.nullcontext():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, **kw)

    return fn


def torch_varlen_kwargs(window, paged=None):
    """torch's varlen_attn and the keyword arguments its version takes for this call;
    NotImplementedError (a row that says why) where it has no such call."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise NotImplementedError(f"this torch has no torch.nn.attention.varlen ({exc})") from None
    params = inspect.signature(varlen_attn).parameters
    kw = {}
    if "window_size" in params:
        kw["window_size"] = window
    elif "is_causal" in params and window in ((-1, 0), (-1, -1)):
        kw["is_causal"] = window == (-1, 0)
    else:
        raise NotImplementedError(f"this torch's varlen_attn takes no window {window}")
    if "enable_gqa" in params:  # (versions without it take fewer key/value heads as they come)
        kw["enable_gqa"] = True
    if paged is not None:
        if "block_table" not in params or "seqused_k" not in params:
            raise NotImplementedError("this torch's varlen_attn takes no block_table")
        kw.update(paged)
    return varlen_attn, kw


# ----------------------------------------------------------------- the sections
def decode_cases(a, device, dtype):
    """The decoding section's cases, each (case, build, impls): ``build()`` makes its inputs
    ((q, k, v), extra) when the case starts, so one case's tensors live at a time, and
    ``impls(q, k, v, extra)`` the rows to run on them (the paged and packed sections alike)."""
    import torch

    import softk.attention as sa

    B, H, Hkv, E = a.batch, a.heads, a.kv_heads, a.dim
    for S in a.lengths:
        for Lq in a.queries:
            case = dict(section="decode", S=S, queries=Lq, mode="fwd", B=B, H=H, H_kv=Hkv, E=E)

            def build(S=S, Lq=Lq):
                g = torch.Generator(device=device).manual_seed(0)
                u = positional(S, E, device, a)
                q = normal((B, H, Lq, E), g, a, device, None if u is None else u[S - Lq:]).to(dtype)
                k = normal((B, Hkv, S, E), g, a, device, u).to(dtype)
                v = torch.randn(B, Hkv, S, E, generator=g, device=device).to(dtype)
                return (q, k, v), None

            def impls(q, k, v, _):
                out = [dict(impl="sdpa", fn=_sdpa(), base=True)]
                if not a.smoke:
                    out.append(dict(impl="sdpa-flash", fn=_sdpa(flash=True)))
                for name in a.maps:
                    def check(out, name=name):
                        skips, err = [], None
                        for b in range(B):  # one batch item at a time: the float32 scores of all of them are large
                            ref, p = reference(q[b], k[b], v[b], name)
                            skips.append(_skips(p, 16))
                            if b == 0:
                                err = error(out[0], ref)
                            del ref, p
                        return dict(err=err, keys_skipped=sum(s[0] for s in skips) / B,
                                    pages_skipped=sum(s[1] for s in skips) / B)

                    out.append(dict(impl=_label(name, q), check=check,
                                    fn=lambda q, k, v, name=name: sa.scaled_dot_product_attention(
                                        q, k, v, enable_gqa=True, map=name)))
                return out

            yield case, build, impls


def _skips(p, page):
    from softk._backends.blockwise.support import skipped

    return skipped(p, page)


def paged_lengths(S, N):
    """N ragged lengths spread up to S, minus 3·i so that most end inside a page
    (for N coprime with 5 the longest is S − 3·i for one i)."""
    return [max(1, S * ((5 * i) % N + 1) // N - 3 * i) for i in range(N)]


def paged_cases(a, device, dtype):
    import torch

    import softk.attention as sa

    N, H, Hkv, E = a.seqs, a.heads, a.kv_heads, a.dim
    for S in a.lengths:
        for page in a.pages:
            lens = paged_lengths(S, N)
            case = dict(section="paged", S=S, page=page, mode="fwd", N=N, H=H, H_kv=Hkv, E=E, max_k=max(lens))

            def build(S=S, page=page, lens=lens):
                g = torch.Generator(device=device).manual_seed(0)
                u = positional(S, E, device, a)
                # contiguous caches (H_kv, len, E): SDPA's inputs, and the pages are cut from them
                ks = [normal((Hkv, n, E), g, a, device, None if u is None else u[:n]).to(dtype) for n in lens]
                vs = [torch.randn(Hkv, n, E, generator=g, device=device).to(dtype) for n in lens]
                q = torch.stack([normal((H, E), g, a, device, None if u is None else u[n - 1]) for n in lens])
                q = q.to(dtype)
                counts = [-(-n // page) for n in lens]
                order = torch.randperm(sum(counts) + N, generator=torch.Generator().manual_seed(0))  # spare pages too
                kp = torch.zeros(len(order), page, Hkv, E, device=device, dtype=dtype)
                vp = torch.zeros_like(kp)
                table = torch.zeros(N, max(counts), dtype=torch.int32)
                at = 0
                for i, (n, c) in enumerate(zip(lens, counts)):
                    slots = order[at:at + c]
                    at += c
                    table[i, :c] = slots.to(torch.int32)
                    pad = c * page - n
                    for src, dst in ((ks[i], kp), (vs[i], vp)):
                        t = torch.nn.functional.pad(src.transpose(0, 1), (0, 0, 0, 0, 0, pad))
                        dst[slots.to(device)] = t.reshape(c, page, Hkv, E)
                caches = dict(ks=ks, vs=vs, table=table.to(device),
                            used=torch.tensor(lens, dtype=torch.int32, device=device),
                            cu_q=torch.arange(N + 1, dtype=torch.int32, device=device),
                            cu_k=torch.tensor([0] + lens, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32))
                return (q, kp, vp), caches  # the impls read the contiguous caches and the tables

            def impls(q, kp, vp, m, lens=lens, page=page):
                paged = dict(seqused_k=m["used"], block_table=m["table"])
                sdpa = _sdpa()

                def per_sequence(q, kp, vp):
                    return torch.cat([sdpa(q[i].view(1, H, 1, E), m["ks"][i].unsqueeze(0), m["vs"][i].unsqueeze(0))
                                      .view(1, H, E) for i in range(N)])

                def torch_paged(q, kp, vp):
                    fn, kw = torch_varlen_kwargs((-1, -1), paged)
                    return fn(q, kp, vp, m["cu_q"], m["cu_k"], 1, max(lens), **kw)

                out = [dict(impl="sdpa per sequence (contiguous)", fn=per_sequence, base=True),
                       dict(impl="torch varlen_attn (block_table)", fn=torch_paged)]
                for name in a.maps:
                    def check(out, name=name):
                        err, keys, pages, n_pages = 0.0, 0.0, 0.0, 0
                        for i, n in enumerate(lens):
                            ref, p = reference(q[i].view(H, 1, E), m["ks"][i], m["vs"][i], name)
                            err = max(err, error(out[i].view(H, 1, E), ref))
                            sk = _skips(p, page)
                            keys += sk[0] * n
                            pages += sk[1] * -(-n // page)
                            n_pages += -(-n // page)
                        return dict(err=err, keys_skipped=keys / sum(lens), pages_skipped=pages / n_pages)

                    def fn(q, kp, vp, name=name):
                        return sa.varlen_attn(q, kp, vp, m["cu_q"], m["cu_k"], 1, max(lens), enable_gqa=True,
                                              map=name, **paged)

                    out.append(dict(impl=_label(name, q), fn=fn, check=check))
                return out

            yield case, build, impls


def packed_lengths(T, docs):
    w = [DOC_WEIGHTS[i % len(DOC_WEIGHTS)] for i in range(docs)]
    lens = [T * x // sum(w) for x in w]
    lens[-1] += T - sum(lens)
    return lens


def packed_cases(a, device, dtype):
    import torch

    import softk.attention as sa

    T, H, Hkv, E = a.tokens, a.packed_heads, a.packed_kv_heads, a.dim
    lens = packed_lengths(T, a.docs)
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    for window in ((-1, 0), (a.sliding, 0)):
        for mode in a.modes:
            case = dict(section="packed", window=list(window), mode=mode, T=T, docs=len(lens), H=H, H_kv=Hkv, E=E)

            def build(mode=mode):
                g = torch.Generator(device=device).manual_seed(0)
                u = positional(T, E, device, a)
                q = normal((T, H, E), g, a, device, None if u is None else u.unsqueeze(1)).to(dtype)
                k = normal((T, Hkv, E), g, a, device, None if u is None else u.unsqueeze(1)).to(dtype)
                v = torch.randn(T, Hkv, E, generator=g, device=device).to(dtype)
                return [t.requires_grad_(mode == "fwdbwd") for t in (q, k, v)], None

            def impls(q, k, v, _, window=window):
                cu = torch.tensor(offsets, dtype=torch.int32, device=device)
                causal = window == (-1, 0)
                masks = None if causal else [window_keep(n, window, device) for n in lens]
                sdpa = _sdpa(is_causal=causal)

                def per_document(q, k, v):
                    outs = []
                    for d, (a0, a1) in enumerate(zip(offsets, offsets[1:])):
                        o = sdpa(*(t[a0:a1].transpose(0, 1).unsqueeze(0) for t in (q, k, v)),
                                 None if causal else masks[d])
                        outs.append(o[0].transpose(0, 1))
                    return torch.cat(outs)

                def torch_packed(q, k, v):
                    fn, kw = torch_varlen_kwargs(window)
                    return fn(q, k, v, cu, cu, max(lens), max(lens), **kw)

                out = [dict(impl="sdpa per document", fn=per_document, base=True),
                       dict(impl="torch varlen_attn", fn=torch_packed)]
                for name in a.maps:
                    def check(out, name=name):
                        err = 0.0
                        for d in range(min(2, len(lens))):  # the first two documents: the slice checked
                            a0, a1 = offsets[d], offsets[d + 1]
                            ref, _ = reference(*(t[a0:a1].detach().transpose(0, 1) for t in (q, k, v)), name,
                                               window_keep(a1 - a0, window, device))
                            err = max(err, error(out[a0:a1].transpose(0, 1), ref))
                        return dict(err=err)

                    def fn(q, k, v, name=name):
                        return sa.varlen_attn(q, k, v, cu, cu, max(lens), max(lens), window_size=window,
                                              enable_gqa=True, map=name)

                    out.append(dict(impl=_label(name, q), fn=fn, check=check))
                return out

            yield case, build, impls


CASES = {"decode": decode_cases, "paged": paged_cases, "packed": packed_cases}


# ----------------------------------------------------------------- running
def run_section(a, section, rows, flush) -> None:
    """Append ``section``'s rows to ``rows``, calling ``flush(rows)`` after each case."""
    import torch

    att = _sibling("attention")
    TOL = _sibling("attention_check").TOL
    device, dtype = ("cpu", torch.float32) if a.smoke else ("cuda", torch.bfloat16)
    tol = TOL[str(dtype).split(".")[-1]]
    measure = att.wall_measure if a.smoke else att.cuda_measure
    for case, build, make_impls in CASES[section](a, device, dtype):
        if time.time() > a.deadline:
            rows.append(dict(case, impl="all", error="skipped: time budget"))
            flush(rows)
            continue
        try:
            (q, k, v), extra = build()
            impls = make_impls(q, k, v, extra)
        except Exception as exc:  # a row that says why, never a crash
            rows.append(dict(case, impl="all", error="inputs: " + why(exc)))
            flush(rows)
            continue
        mode = case["mode"]
        done = []
        for imp in impls:
            row = dict(case, impl=imp["impl"])
            try:
                if "check" in imp:  # first the output against the float32 reference, then the time
                    with torch.no_grad():
                        row.update(imp["check"](imp["fn"](q, k, v)))
                    row["tol"] = tol
                    row["check"] = "pass" if row["err"] <= tol else "FAIL"
                row.update(zip(("p20", "p50", "p80", "peak_mib"), measure(imp["fn"], q, k, v, mode)))
                if row["peak_mib"] != row["peak_mib"]:  # the wall-clock timer measures no memory: null, not NaN, in JSON
                    row["peak_mib"] = None
            except Exception as exc:
                row["error"] = why(exc)
            row["base"] = bool(imp.get("base"))
            done.append(row)
            print(json.dumps(row), flush=True)
        base = next((r.get("p50") for r in done if r["base"]), None)
        for r in done:
            if base and "p50" in r:
                r["x_sdpa"] = r["p50"] / base
        rows.extend(done)
        flush(rows)
        del q, k, v, extra, impls
        if device == "cuda":
            torch.cuda.empty_cache()


def why(exc) -> str:
    """The exception's type and first sentence: a table cell, not a traceback."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text.split('. ')[0][:160]}"


def meta_info(a) -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"device": "cpu (smoke)" if a.smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton_version, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "dtype": "float32" if a.smoke else "bfloat16", "argv": a.argv}


def write(path, meta, rows) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)


def child_section(a, section) -> None:
    """In a child: the rows so far from ``--json``, this section's appended, the file rewritten after each case."""
    with open(a.json) as fh:
        data = json.load(fh)
    rows = data["rows"]
    run_section(a, section, rows, lambda rows: write(a.json, data["meta"], rows))
    write(a.json, data["meta"], rows)


def run_children(a, meta) -> list:
    """Each section in its own process; a section that dies leaves its rows so far and one that says how."""
    out = a.json or os.path.join(tempfile.mkdtemp(prefix="attention_decode_"), "rows.json")
    rows: list = []
    write(out, meta, rows)
    for section in a.sections:
        if time.time() > a.deadline:
            rows.append(dict(section=section, impl="all", error="skipped: time budget"))
            write(out, meta, rows)
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--child-section", section, "--json", out,
               "--deadline", repr(a.deadline)] + a.argv_rest
        left = a.deadline - time.time()
        try:
            res = subprocess.run(cmd, stdout=None, stderr=subprocess.PIPE, text=True,
                                 timeout=None if left == float("inf") else left + 120)
            failed = res.returncode and f"exit {res.returncode}: " + (res.stderr.strip().splitlines() or ["?"])[-1][:200]
            if res.returncode:
                sys.stderr.write(res.stderr[-3000:])
        except subprocess.TimeoutExpired:
            failed = "killed: past the time budget"
        with open(out) as fh:
            rows = json.load(fh)["rows"]
        if failed:
            rows.append(dict(section=section, impl="all", error=failed))
            write(out, meta, rows)
    return rows


# ----------------------------------------------------------------- report
def _ms(r):
    return f"{r['p50']:.3f} ({r['p20']:.3f}-{r['p80']:.3f})"


def _cell(r, key, fmt):
    return format(r[key], fmt) if r.get(key) is not None else ""


def tables(rows) -> str:
    heads = {"decode": ("S", "queries"), "paged": ("S", "page"), "packed": ("window", "mode")}
    out = []
    for section in SECTIONS:
        mine = [r for r in rows if r.get("section") == section]
        if not mine:
            continue
        c1, c2 = heads[section]
        out += [f"\n### {section}\n", f"| {c1} | {c2} | impl | ms p50 (p20-p80) | × SDPA | peak MiB | "
                "keys skipped | pages skipped | max err | check |", "|---:|---:|---|---|---:|---:|---:|---:|---:|---|"]
        for r in mine:
            lead = f"| {r.get(c1, '')} | {r.get(c2, '')} | {r['impl']} |"
            if "error" in r:
                out.append(f"{lead} {r['error']} | | | | | | |")
                continue
            out.append(f"{lead} {_ms(r)} | {_cell(r, 'x_sdpa', '.2f')} | {_cell(r, 'peak_mib', '.0f')} | "
                       f"{_cell(r, 'keys_skipped', '.1%')} | "
                       f"{_cell(r, 'pages_skipped', '.1%')} | {_cell(r, 'err', '.1e')} | {r.get('check', '')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="the same code on the CPU at tiny sizes, float32")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    p.add_argument("--lengths", type=int, nargs="+", help="S: decode and paged (default 4096 16384 65536 131072)")
    p.add_argument("--queries", type=int, nargs="+", default=[1, 4], help="decode: queries per sequence")
    p.add_argument("--pages", type=int, nargs="+", default=[16, 256], help="paged: page sizes")
    p.add_argument("--maps", nargs="+", default=["softmax", "sparsemax", "entmax15"],
                   choices=["softmax", "sparsemax", "entmax15"])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"], help="packed")
    p.add_argument("--tokens", type=int, help="packed: T (default 16384)")
    p.add_argument("--docs", type=int, default=8, help="packed: documents")
    p.add_argument("--sliding", type=int, help="packed: W of the (W, 0) window (default 1024)")
    p.add_argument("--sharpness", type=float, default=1.0)
    p.add_argument("--locality", type=float, default=0.0)
    p.add_argument("--window", type=int, default=64, help="the width of --locality's positional vector")
    p.add_argument("--json", metavar="OUT", help="rewritten after each case")
    p.add_argument("--budget-s", type=float, default=float("inf"), help="cases not started by then are skipped")
    p.add_argument("--child-section", choices=SECTIONS, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if os.path.join(ROOT, "src") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "src"))
    # sizes: the device's, or tiny ones for the smoke run
    a.batch, a.heads, a.kv_heads, a.dim, a.seqs, a.packed_heads, a.packed_kv_heads = (
        (2, 4, 2, 16, 3, 4, 2) if a.smoke else (4, 32, 8, 128, 8, 16, 4))
    a.lengths = a.lengths or ([64, 256] if a.smoke else [4096, 16384, 65536, 131072])
    a.tokens = a.tokens or (256 if a.smoke else 16384)
    a.docs = 4 if a.smoke and "--docs" not in argv else a.docs
    a.sliding = a.sliding or (32 if a.smoke else 1024)
    a.argv = argv
    # the children get the same options; the parent names the file they share
    a.argv_rest = [x for i, x in enumerate(argv) if not x.startswith("--json")
                   and (i == 0 or argv[i - 1] != "--json")]
    if a.child_section:
        a.deadline = a.deadline if a.deadline is not None else float("inf")
        child_section(a, a.child_section)
        return 0
    a.deadline = time.time() + a.budget_s
    import torch

    if not (a.smoke or torch.cuda.is_available()):
        p.error("no CUDA device: use --smoke to check the script on the CPU")
    meta = meta_info(a)
    if a.smoke:
        rows: list = []
        for section in a.sections:
            run_section(a, section, rows, lambda rows: write(a.json, meta, rows))
        write(a.json, meta, rows)
    else:
        rows = run_children(a, meta)
    print(f"\n{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, {meta['dtype']}, {meta['date']}")
    print(tables(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
