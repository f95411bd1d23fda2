"""The benchmark harness produces tidy rows and clear usage errors (no timing assertions)."""

import json

import pytest

from softk._cli import harness as bench
from softk._cli import main

FIELDS = {"op", "provider", "pass", "shape", "dtype", "device", "p20_ms", "p50_ms", "p80_ms", "gbps", "peak_mb", "version", "date"}


def test_rows_are_tidy_and_include_the_softmax_baseline():
    rows = bench.run(["sparsemax"], shapes=[(4, 70)], repeats=2, warmup=0)
    assert all(set(r) == FIELDS for r in rows)
    assert {(r["op"], r["provider"]) for r in rows} >= {("softmax", "torch"), ("sparsemax", "softk")}
    assert {r["pass"] for r in rows} == {"fwd", "bwd", "fwd+bwd"}
    assert all(r["p20_ms"] <= r["p50_ms"] <= r["p80_ms"] for r in rows)
    table = bench.markdown(rows)
    assert table.count("\n") == len(rows) + 1 and "| 4x70 | fwd | softmax | torch |" in table


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="ops must be among"):
        bench.run(["nope"], shapes=[(2, 8)])
    with pytest.raises(ValueError, match="repeats"):
        bench.run(["sparsemax"], shapes=[(2, 8)], repeats=0)


def test_cli_json_and_usage_errors(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--shapes", "3x65", "--ops", "entmax15", "--repeats", "1", "--format", "json", "--output", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {r["op"] for r in rows} == {"softmax", "entmax15"} and all(r["shape"] == "3x65" for r in rows)
    assert main(["bench", "--shapes", "3by65"]) == 2
    assert "--shapes" in capsys.readouterr().err
