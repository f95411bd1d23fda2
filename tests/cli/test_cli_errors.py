"""Bad input to the `softk` command: exactly one line `softk <cmd>: error: ...`
naming the option or file, exit status 2, no traceback.

Most cases call the CLI's ``main()`` in-process (the message is the point,
and a subprocess costs 1-2 s of torch import each); a few run ``python -m
softk`` to check the exit status a shell sees."""

import argparse
import io
import os
import json
import sys

import numpy as np
import pytest
import torch

from softk._cli import harness as bench
from softk._cli import build_parser, main

from .. import safety_net


def cli(argv, capsys, monkeypatch=None, stdin=None):
    """(exit code, stdout, stderr) of ``softk ARGV`` run in-process."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, cmd, word):
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"softk {cmd}: error: "), err
    assert word in lines[0], err


@pytest.fixture
def files(tmp_path):
    """A folder of bad --input files, by name."""
    np.save(tmp_path / "three_d.npy", np.zeros((2, 2, 2)))
    np.save(tmp_path / "two_d.npy", np.arange(6.0).reshape(2, 3))
    np.save(tmp_path / "complex.npy", np.array([1 + 2j, 3]))
    np.save(tmp_path / "bool.npy", np.array([True, False]))
    np.save(tmp_path / "empty.npy", np.array([]))
    np.save(tmp_path / "strings.npy", np.array(["a", "b"]))
    np.save(tmp_path / "nan.npy", np.array([1.0, np.nan]))
    np.save(tmp_path / "objects.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    (tmp_path / "not_npy.npy").write_text("1 2 3")
    (tmp_path / "table.csv").write_text("1,2\n3,4\n")
    (tmp_path / "ragged.txt").write_text("3 1\n2\n")
    (tmp_path / "gap.csv").write_text("1,2,,4\n")
    (tmp_path / "words.csv").write_text("a,b\n")
    (tmp_path / "empty.csv").write_text("\n\n")
    (tmp_path / "inf.txt").write_text("1 inf\n")
    (tmp_path / "masked.txt").write_text("-inf -inf\n")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x01")
    (tmp_path / "folder").mkdir()
    with open(tmp_path / "huge.npy", "wb") as fh:  # a header claiming 80 GB, no data
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f8", "fortran_order": False, "shape": (10**10,)})
    return tmp_path


# (argv with {d} for the files folder, command, word the message must contain)
COMPARE_CASES = [
    (["--input", "{d}/three_d.npy"], "three_d.npy"),
    (["--input", "{d}/two_d.npy"], "(2, 3)"),
    (["--input", "{d}/complex.npy"], "complex"),
    (["--input", "{d}/bool.npy"], "bool"),
    (["--input", "{d}/empty.npy"], "no scores"),
    (["--input", "{d}/strings.npy"], "strings.npy"),
    (["--input", "{d}/nan.npy"], "nan"),
    (["--input", "{d}/objects.npy"], "objects.npy"),
    (["--input", "{d}/not_npy.npy"], "not_npy.npy"),
    (["--input", "{d}/table.csv"], "2 rows x 2 columns"),
    (["--input", "{d}/ragged.txt"], "ragged.txt"),
    (["--input", "{d}/gap.csv"], "field 3 is empty"),
    (["--input", "{d}/words.csv"], "'a'"),
    (["--input", "{d}/empty.csv"], "no scores"),
    (["--input", "{d}/inf.txt"], "value 2 is inf"),
    (["--input", "{d}/masked.txt"], "-inf"),
    (["--input", "{d}/binary.txt"], "binary.txt"),
    (["--input", "{d}/folder"], "folder"),
    (["--input", "{d}/huge.npy"], "huge.npy"),  # MemoryError: a traceback
    (["--input", ""], "empty path"),  # was "--input .: is a folder"
    (["--input", "{d}/missing.csv"], "missing.csv"),
    (["--input", "{d}/table.csv", "1", "2"], "--input"),
    (["1", "nan"], "VALUES"),
    (["1", "x"], "VALUES"),
    (["--", "inf", "1"], "VALUES"),
    (["--", "-inf"], "VALUES"),
    (["1", "--k", "2"], "--k"),
    (["--k", "0"], "--k"),
    (["--k", "-3"], "--k"),
    (["--k", str(10**30)], "--k"),
    (["--k", "two"], "--k"),
    (["--k", "4.5"], "--k"),
    (["--k", "nan"], "--k"),
    (["--k", "0.0"], "--k"),
    (["--tau", "-1"], "--tau must be"),
    (["--tau", "0"], "--tau must be"),
    (["--tau", "inf"], "--tau must be"),
    (["--tau", "nan"], "--tau must be"),
    (["--alpha", "0.5"], "--alpha must be"),
    (["--alpha", "inf"], "--alpha must be"),
    (["--alpha", "nan"], "--alpha must be"),
    (["--nope"], "--nope"),
    (["-1e5", "2"], "after --"),
]


@pytest.mark.parametrize("argv,word", COMPARE_CASES, ids=[" ".join(a).replace("{d}/", "") for a, _ in COMPARE_CASES])
def test_compare_bad_input(argv, word, files, capsys):
    code, out, err = cli(["compare"] + [a.replace("{d}", str(files)) for a in argv], capsys)
    assert_one_line_error(code, err, "compare", word)
    assert out == ""


@pytest.mark.parametrize("stdin,word", [("", "no scores"), ("1,,2", "field 2 is empty"), ("1 2\n3 4\n", "2 rows")])
def test_compare_bad_stdin(stdin, word, capsys, monkeypatch):
    code, _, err = cli(["compare", "--input", "-"], capsys, monkeypatch, stdin=stdin)
    assert_one_line_error(code, err, "compare", word)
    assert "--input -" in err


@pytest.mark.parametrize(
    "argv,word",
    [
        (["--out", "/dev/null/x"], "--out /dev/null/x"),
        (["--out", "/dev/null"], "--out /dev/null"),
        (["--out", ""], "--out"),
        (["--bad"], "--bad"),
    ],
)
def test_plot_bad_input(argv, word, capsys):
    code, _, err = cli(["plot"] + argv, capsys)
    assert_one_line_error(code, err, "plot", word)


CUDA_THAT_IS_NOT_HERE = "cuda:99" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize(
    "argv,word",
    [
        (["--device", "foo"], "--device"),
        (["--device", CUDA_THAT_IS_NOT_HERE], f"--device {CUDA_THAT_IS_NOT_HERE}"),
        (["--device", "meta"], "--device"),
        (["--output", "/dev/null/x"], "--output /dev/null/x"),
        (["--output", "{d}/folder"], "--output"),
        (["--output", "{d}/no/such/dir/x.md"], "--output"),
        (["--repeats", "-3"], "--repeats"),
        (["--repeats", "0"], "--repeats"),
        (["--threads", "0"], "--threads"),
        (["--threads", "100000"], "--threads"),  # used to crash the process (OpenMP)
        (["--ops", "nope"], "--ops"),
        (["--shapes", "3by65"], "--shapes"),
        (["--shapes", "2x0"], "--shapes"),
        (["--shapes", "2x4"], "--shapes has 2x4"),  # the default ops include top-64
        (["--shapes", "2x4", "--ops", "soft_topk_exp64"], "--ops soft_topk_exp64"),
        (["--shapes", "99999999999x99999999", "--ops", "sparsemax"], "--shapes 99999999999x99999999"),
        (["--shapes", "1x" + "9" * 20, "--ops", "softmax"], "--shapes"),  # beyond int64: torch's C++ backtrace
        (["--dtype", "int8"], "--dtype"),
        (["--format", "xml"], "--format"),
        # writable when checked, full when written: the OS's message alone named no option
        pytest.param(["--output", "/dev/full", "--shapes", "8x16", "--ops", "sparsemax", "--repeats", "1", "--quiet"],
                     "--output /dev/full: the results could not be written",
                     marks=pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")),
    ],
)
def test_bench_bad_input(argv, word, files, capsys):
    code, out, err = cli(["bench"] + [a.replace("{d}", str(files)) for a in argv], capsys)
    assert_one_line_error(code, err, "bench", word)
    assert out == ""


@pytest.mark.parametrize("argv,word", [(["--seed", "-5"], "--seed"), (["--seed", "x"], "--seed"), (["--json", "1"], "1")])
def test_check_bad_input(argv, word, capsys):
    code, _, err = cli(["check"] + argv, capsys)
    assert_one_line_error(code, err, "check", word)


def test_compare_k_defaults_to_min_2_n(capsys):
    code, out, err = cli(["compare", "--json", "5"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["k"] == 1 and result["rows"]["soft_topk[exp]"]["values"] == [1.0]
    code, out, _ = cli(["compare", "--json", "5", "1", "3"], capsys)
    assert json.loads(out)["k"] == 2


def test_compare_accepts_one_row_in_every_form(tmp_path, capsys, monkeypatch):
    forms = {"col.csv": "3\n1\n2\n", "line.txt": " 3  1 2 \n", "spaced.csv": "3, 1 ,2\r\n"}
    for name, text in forms.items():
        (tmp_path / name).write_text(text)
    np.save(tmp_path / "ints.npy", np.array([3, 1, 2], dtype=np.int16))
    np.save(tmp_path / "row.npy", np.array([3.0, 1.0, 2.0], dtype=np.float32))
    for name in [*forms, "ints.npy", "row.npy"]:
        code, out, err = cli(["compare", "--json", "--input", str(tmp_path / name)], capsys)
        assert code == 0, (name, err)
        assert json.loads(out)["input"] == [3.0, 1.0, 2.0], name
    code, out, _ = cli(["compare", "--json", "--input", "-"], capsys, monkeypatch, stdin="-inf 0 2")
    assert code == 0 and json.loads(out)["rows"]["softmax"]["values"][0] == 0.0  # -inf masks an entry


def test_compare_reads_a_csv_with_a_byte_order_mark(tmp_path, capsys):
    # a spreadsheet's UTF-8 export: '\ufeff1' was refused as not a number
    (tmp_path / "bom.csv").write_bytes("1,2,4\n".encode("utf-8-sig"))
    code, out, err = cli(["compare", "--input", str(tmp_path / "bom.csv"), "--json"], capsys)
    assert code == 0, err
    p = np.array(json.loads(out)["rows"]["softmax"]["values"])
    np.testing.assert_allclose(p, np.exp([1, 2, 4]) / np.exp([1, 2, 4]).sum(), rtol=1e-12)


def test_compare_huge_numbers_are_printed_short(capsys):
    code, out, err = cli(["compare", "--tau", "1e300"], capsys)
    assert code == 0, err
    assert "logsumexp (smooth max) = 1.3863e+300" in out  # 1e300 · log 4
    assert max(len(line) for line in out.splitlines()) < 120


def _walk(parser, prog="softk"):
    """(prog, parser) for the command and every subcommand, nested ones included."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{prog} {name}")


def test_every_option_has_help_and_no_help_shows_rest():
    for prog, parser in _walk(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, f"{prog} {action.option_strings or action.dest}"
        text = parser.format_help()
        for markup in ("``", ":func:", ":mod:", ":class:", ":meth:", ".. "):
            assert markup not in text, f"{prog} --help shows reST {markup!r}"


def test_bench_help_lists_every_op():
    sub = dict(_walk(build_parser()))["softk bench"]
    ops_help = next(a.help for a in sub._actions if "--ops" in a.option_strings)
    assert ops_help.count(",") + 1 >= len(bench.OPS)
    for op in bench.OPS:
        assert op in ops_help


def softk(*args, stdin=None):
    return safety_net.run([sys.executable, "-m", "softk", *args], input=stdin, capture_output=True, text=True)


@pytest.mark.parametrize(
    "argv,word",
    [
        (["plot", "--out", "/dev/null/x"], "--out"),
        (["bench", "--device", "foo"], "--device"),
        (["compare", "1", "--k", "2"], "--k"),
        (["check", "--seed", "-5"], "--seed"),
        (["compare", "--nope"], "--nope"),
    ],
)
@pytest.mark.slow
def test_exit_status_in_a_shell(argv, word):
    r = softk(*argv)
    assert_one_line_error(r.returncode, r.stderr, argv[0], word)
    assert r.stdout == ""


@pytest.mark.parametrize("option, value, word", [
    ("--figure", "{d}/no/such/x.png", "--figure"),
    ("--figure", "{d}", "--figure"),
    ("--out", "{d}/a_file/sub", "--out"),
    ("--figure", "/proc/softk_cannot_write.png", "--figure /proc/softk_cannot_write.png"),
    ("--figure", "{d}/fig.xyz", "--figure"),  # a format matplotlib does not write
    ("--figure", "{d}/fig", "--figure"),  # no extension: matplotlib would write fig.png
])
def test_experiment_outputs_are_checked_before_the_run(option, value, word, tmp_path, capsys, monkeypatch):
    # a --figure or --out that could not be written failed after the whole
    # run, losing its results, with a message that named no option
    import importlib

    from softk._cli.experiment import NETWORKS

    if value.startswith("/proc") and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    (tmp_path / "a_file").write_text("")
    module_name, fn_name, _ = NETWORKS["router"]
    monkeypatch.setattr(importlib.import_module(module_name), fn_name,
                        lambda **_: pytest.fail("the experiment ran before its outputs were checked"))
    code, out, err = cli(["experiment", "router", "--quick", option, value.replace("{d}", str(tmp_path))], capsys)
    assert_one_line_error(code, err, "experiment router", word)
    assert out == ""


@pytest.mark.parametrize("network", ["topk-softmax", "router", "attention"])
@pytest.mark.parametrize("rows", [["--n-train-per-class", "450"], ["--n-test-per-class", "101"],
                                  ["--n-train-per-class", "1", "--n-test-per-class", "500"]])
def test_experiment_rows_per_digit_beyond_mnist5k(network, rows, capsys, monkeypatch):
    # MNIST-5k has 500 rows a digit: the error named the loader's Python
    # arguments (n_train_per_class), and came after the data was loaded
    import importlib

    from softk._cli.experiment import NETWORKS

    module_name, fn_name, _ = NETWORKS[network]
    monkeypatch.setattr(importlib.import_module(module_name), fn_name,
                        lambda **_: pytest.fail("the experiment ran with more rows than a digit has"))
    code, out, err = cli(["experiment", network, *rows], capsys)
    assert_one_line_error(code, err, f"experiment {network}", "--n-train-per-class + --n-test-per-class must be at most 500")
    assert out == ""


def test_the_figure_check_leaves_a_dangling_link_alone(tmp_path):
    # the check opened the path for appending and removed it: through a
    # dangling symlink that made an empty target file and deleted the link
    from softk._cli.experiment_common import writable_file

    link = tmp_path / "fig.png"
    link.symlink_to(tmp_path / "target.png")
    writable_file(str(link), "--figure")
    assert link.is_symlink() and not (tmp_path / "target.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]


def _mulan(folder, xml, train="", test=""):
    folder.mkdir()
    (folder / "x.xml").write_text(xml)
    (folder / "x-train.arff").write_text(train)
    (folder / "x-test.arff").write_text(test)
    return folder


LABELS = '<?xml version="1.0"?><labels xmlns="http://mulan.sourceforge.net/labels"><label name="a"></label></labels>'


@pytest.mark.parametrize("xml, word", [("<labels", "x.xml"), (LABELS, "x-train.arff")])
def test_experiment_unreadable_mulan_files(xml, word, tmp_path, capsys):
    # a malformed XML header and an empty ARFF file raised from the parsers
    # (ParseError, StopIteration) with a traceback
    folder = _mulan(tmp_path / "m", xml)
    code, out, err = cli(["experiment", "multilabel", "--data", str(folder), "--quick"], capsys)
    assert_one_line_error(code, err, "experiment multilabel", word)


def test_experiment_truncated_corpus_archive(tmp_path, capsys):
    # tarfile raised EOFError on a gzip stream cut short, with a traceback
    bad = tmp_path / "f.tar.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    code, out, err = cli(["experiment", "moe", "--corpus", str(bad)], capsys)
    assert_one_line_error(code, err, "experiment moe", "unreadable archive")
