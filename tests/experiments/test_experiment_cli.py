"""What every `softk experiment EXPERIMENT` says on the command line: its
errors name the full subcommand (`softk experiment lm: error: ...`, exit 2),
and it lists the files it wrote on stderr, one line each, stdout keeping the
table or the JSON.  Checked in-process, before any training: every case here
fails on its options, or runs a stubbed experiment."""

import json

import pytest

from softk._cli import main

EXPERIMENTS = ("multilabel", "topk-softmax", "attention", "router", "lm")

# experiment -> (argv after the name, a word of the message); each is refused before any data is read
BAD = {
    "multilabel": ([], "--data is required"),
    "topk-softmax": (["--loss", "hinge"], "--loss must be among"),
    "attention": (["--epochs", "0"], "--epochs must be >= 1"),
    "router": (["--router", "switch"], "--router must be among"),
    "lm": (["--steps", "0"], "--steps must be >= 1"),
}


def _one_error_line(capsys, prefix):
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(prefix), err
    return lines[0]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_refused_option_names_the_full_subcommand(name, capsys):
    argv, word = BAD[name]
    assert main(["experiment", name, *argv]) == 2
    assert word in _one_error_line(capsys, f"softk experiment {name}: error: ")


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_an_unknown_option_names_the_full_subcommand(name, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's own error, through the subcommand's parser
        main(["experiment", name, "--no-such-option"])
    assert exit_.value.code == 2
    assert "--no-such-option" in _one_error_line(capsys, f"softk experiment {name}: error: ")


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_malformed_number_names_the_full_subcommand(name, capsys):
    option = "--seed" if name in ("multilabel", "lm") else "--epochs"
    with pytest.raises(SystemExit) as exit_:
        main(["experiment", name, option, "two"])
    assert exit_.value.code == 2
    assert "invalid int value" in _one_error_line(capsys, f"softk experiment {name}: error: ")


def test_no_experiment_is_an_error_of_softk_experiment(capsys):
    assert main(["experiment"]) == 2
    err = capsys.readouterr().err
    assert "softk experiment: error: choose an experiment" in err
