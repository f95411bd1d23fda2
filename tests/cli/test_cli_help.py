"""What `softk --help` and friends tell a user: the version, every option's
choices, where the multi-label data comes from, and bench's progress and its
warning that timings on a shared machine are noisy."""

import importlib
import re
import sys

import pytest
import torch

import softk
from softk._cli import harness as bench
from softk._cli import build_parser, main
from softk._cli.experiment import CHOICES, NETWORKS
from softk._experiments.moe_arms import ARMS as MOE_ARMS
from softk._experiments.multilabel import CV_SCORES, FOLD_SCHEMES, FOLD_SIZES
from softk._experiments.objectives import LOSSES

from .. import safety_net
from .test_cli_errors import _walk


def _help(prog: str, option: str) -> str:
    parser = dict(_walk(build_parser()))[prog]
    action = next(a for a in parser._actions if option in a.option_strings)
    return parser.format_help() if action.choices else action.help


def test_version_in_process(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"softk {softk.__version__} (torch {torch.__version__})"


def test_version_in_a_shell():
    r = safety_net.run([sys.executable, "-m", "softk", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith(f"softk {softk.__version__} ")


# (prog, option) -> every value the option accepts
CHOICE_LISTS = {
    ("softk bench", "--ops"): list(bench.OPS),
    ("softk bench", "--dtype"): ["float32", "float64", "float16", "bfloat16"],
    ("softk bench", "--format"): ["markdown", "csv", "json"],
    ("softk bench", "--device"): ["cpu", "cuda", "cuda:N"],
    ("softk experiment multilabel", "--loss"): list(LOSSES),
    ("softk experiment multilabel", "--folds"): list(FOLD_SCHEMES),
    ("softk experiment multilabel", "--cv-score"): list(CV_SCORES),
    ("softk experiment multilabel", "--fold-sizes"): list(FOLD_SIZES),
    ("softk experiment moe", "--arm"): list(MOE_ARMS),
}
for _name, (_module, _, _) in NETWORKS.items():
    for _option, (_constant, _) in CHOICES.items():
        parser = dict(_walk(build_parser()))[f"softk experiment {_name}"]
        if any(f"--{_option}" in a.option_strings for a in parser._actions):
            CHOICE_LISTS[(f"softk experiment {_name}", f"--{_option}")] = list(
                getattr(importlib.import_module(_module), _constant))


@pytest.mark.parametrize("prog,option", sorted(CHOICE_LISTS))
def test_help_lists_every_choice(prog, option):
    text = " ".join(_help(prog, option).split())
    for value in CHOICE_LISTS[(prog, option)]:
        assert value in text, f"{prog} {option}: {value!r} missing from its help"


def test_each_network_experiment_lists_its_choices():
    # every network experiment has the option naming what it compares
    listed = {prog for prog, _ in CHOICE_LISTS}
    assert {f"softk experiment {n}" for n in NETWORKS} <= listed


@pytest.mark.parametrize("network,option,bad", [("router", "--router", "top2"), ("attention", "--map", "relu"),
                                                ("topk-softmax", "--loss", "hinge")])
def test_network_choices_are_checked_before_training(network, option, bad, capsys):
    assert main(["experiment", network, option, bad, "--seed", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{option} must be among" in err and bad in err


def test_multilabel_without_data_says_what_it_needs(capsys):
    assert main(["experiment", "multilabel"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("softk experiment multilabel: error: --data is required")
    for word in ("NAME-train.arff", "NAME-test.arff", "NAME.xml", "Mulan", "../shared/data/mulan/"):
        assert word in err
    assert len(err.splitlines()) == 1


def test_multilabel_with_a_missing_folder_says_what_it_takes(tmp_path, capsys):
    assert main(["experiment", "multilabel", "--data", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and "NAME-train.arff" in err


def test_bench_shows_progress_and_the_noise_note(tmp_path, capsys):
    out = tmp_path / "b.md"
    assert main(["bench", "--shapes", "3x65", "2x70", "--ops", "sparsemax", "--repeats", "1", "--output", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("softk bench: note: timings on a shared or busy machine are noisy")
    assert [line.split(":")[1].strip() for line in err[1:]] == ["[1/2] 3x65", "[1/2] 3x65", "[2/2] 2x70", "[2/2] 2x70"]
    text = out.read_text()
    assert "| 3x65 | fwd | sparsemax | softk |" in text and "| 2x70 |" in text and "noisy" in text


def test_bench_quiet_is_silent(tmp_path, capsys):
    assert main(["bench", "--shapes", "3x65", "--ops", "sparsemax", "--repeats", "1", "--quiet",
                 "--format", "csv", "--output", str(tmp_path / "b.csv")]) == 0
    assert capsys.readouterr().err == ""
    assert "noisy" not in (tmp_path / "b.csv").read_text()  # csv and json stay machine-readable


def test_no_help_names_a_private_module():
    """--help is for users: it explains, and does not send them into softk's private modules."""
    for prog, parser in _walk(build_parser()):
        private = re.findall(r"\bsoftk\._\w[\w.]*", parser.format_help())
        assert not private, f"{prog} --help names {private}"
