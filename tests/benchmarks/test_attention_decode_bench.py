"""benchmarks/gpu/attention_decode.py without a GPU: its ``--smoke`` run (the
device table's code on the CPU at tiny sizes, float32) has rows for every
section, and every softk row matches the float32 reference.  The device run
is one prepared call; this keeps the script runnable between them.  Nothing
here measures or asserts on time."""

import json

from . import gpu_scripts


def _script():
    return gpu_scripts.load("attention_decode")


def test_smoke_run_has_every_section_and_no_fail(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert _script().main(["--smoke", "--lengths", "64", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["device"] == "cpu (smoke)" and data["meta"]["torch"]
    rows = data["rows"]
    for section in ("decode", "paged", "packed"):
        mine = [r for r in rows if r["section"] == section]
        softk = [r for r in mine if r["impl"].startswith("softk-")]
        assert {r["impl"].split(" ")[0] for r in softk} == {"softk-softmax", "softk-sparsemax", "softk-entmax15"}
        for r in softk:
            assert "error" not in r and r["check"] == "pass" and r["err"] <= r["tol"], r
            assert r["p50"] > 0 and r["x_sdpa"] > 0, r
        assert any(r["base"] and "p50" in r for r in mine), section  # the SDPA row each ratio divides by
    assert not [r for r in rows if r.get("check") == "FAIL"]
    skips = [r for r in rows if r["section"] == "decode" and r["impl"].startswith("softk-sparsemax")]
    assert skips and all(0 <= r["pages_skipped"] <= r["keys_skipped"] <= 1 for r in skips)
    printed = capsys.readouterr().out
    assert "### decode" in printed and "### paged" in printed and "### packed" in printed


def test_a_wrong_output_is_marked_fail_and_the_run_goes_on(tmp_path):
    script = _script()
    softmax = script.mapfn("softmax")
    script.mapfn = lambda name: softmax  # the reference now disagrees with softk's sparsemax
    out = tmp_path / "decode.json"
    assert script.main(["--smoke", "--sections", "decode", "packed", "--lengths", "64", "--maps", "sparsemax",
                        "--modes", "fwd", "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["impl"].startswith("softk-")]
    assert {r["section"] for r in rows} == {"decode", "packed"}
    assert all(r["check"] == "FAIL" and r["err"] > r["tol"] and "p50" in r for r in rows), rows
