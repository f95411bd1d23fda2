"""What every `softk experiment EXPERIMENT` says on the command line: its
errors name the full subcommand (`softk experiment lm: error: ...`, exit 2),
and it lists the files it wrote on stderr, one line each, stdout keeping the
table or the JSON.  Checked in-process, before any training: every case here
fails on its options, or runs a stubbed experiment."""

import json

import pytest

from softk._cli import main

EXPERIMENTS = ("multilabel", "topk-softmax", "attention", "router", "lm", "moe")

# experiment -> (argv after the name, a word of the message); each is refused before any data is read
BAD = {
    "multilabel": ([], "--data is required"),
    "topk-softmax": (["--loss", "hinge"], "--loss must be among"),
    "attention": (["--epochs", "0"], "--epochs must be >= 1"),
    "router": (["--router", "switch"], "--router must be among"),
    "lm": (["--steps", "0"], "--steps must be >= 1"),
    "moe": (["--arm", "switch"], "--arm must be among"),
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
    option = "--seed" if name in ("multilabel", "lm", "moe") else "--epochs"
    with pytest.raises(SystemExit) as exit_:
        main(["experiment", name, option, "two"])
    assert exit_.value.code == 2
    line = _one_error_line(capsys, f"softk experiment {name}: error: ")
    assert f"argument {option}" in line and ("invalid int value" in line or "an integer >= 0, got 'two'" in line)


def test_no_experiment_is_an_error_of_softk_experiment(capsys):
    assert main(["experiment"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("softk experiment: error: choose an experiment") and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("argv", [["topk-softmax", "--seeds", "0", "-1"], ["lm", "--quick", "--seed", "-1"],
                                  ["moe", "--seed", "-1"], ["multilabel", "--seed", "-1"], ["router", "--seed", "x"]])
def test_a_seed_below_zero_is_refused(argv, capsys):
    # torch.manual_seed and numpy's generators take no negative seed: the
    # training ran, or failed deep inside, where the option is one error line
    try:
        code = main(["experiment", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"softk experiment {argv[0]}: error: argument --seed") and "integer >= 0" in err, err


# ------------------------------------------------------------ --quick's work
def test_quick_settings_are_pinned():
    """--quick's work, by count (not by clock): what every quick run trains."""
    from softk._experiments import multilabel

    assert multilabel.QUICK == {"n_train": 200, "lambdas": (1e-1,), "schemes": ("contiguous",)}
    pytest.importorskip("mlxtend")
    from softk._experiments import attention, router, topk_softmax

    assert topk_softmax.QUICK == {"seeds": (0,), "epochs": 2, "pre_epochs": 2, "ft_epochs": 2}
    assert attention.QUICK == {"seeds": (0,), "epochs": 1}
    assert router.QUICK == {"seeds": (0,), "epochs": 2}


# experiment -> (module, its run function, the keyword arguments --quick passes it)
NETWORK_QUICK = {
    "topk-softmax": ("topk_softmax", "run_topk_softmax",
                     {"seeds": [0], "epochs": 2, "pre_epochs": 2, "ft_epochs": 2}),
    "attention": ("attention", "run_attention", {"seeds": [0], "epochs": 1}),
    "router": ("router", "run_router", {"seeds": [0], "epochs": 2}),
}


def _stub_network(monkeypatch, name):
    """Replace the experiment's run function (and figure) by stubs; returns the keyword arguments seen."""
    import importlib

    pytest.importorskip("mlxtend")
    module_name, fn, _ = NETWORK_QUICK[name]
    module = importlib.import_module(f"softk._experiments.{module_name}")
    seen = {}

    def run(**kwargs):
        seen.update(kwargs)
        return {"experiment": name, "config": {}, "runs": []}

    def figure(result, path):
        with open(path, "wb") as fh:
            fh.write(b"\x89PNG")
        return path

    monkeypatch.setattr(module, fn, run)
    monkeypatch.setattr(module, "markdown", lambda result: "| table |\n")
    monkeypatch.setattr(module, "figure", figure)
    return seen


@pytest.mark.parametrize("name", sorted(NETWORK_QUICK))
def test_quick_runs_the_pinned_settings_on_every_arm(name, monkeypatch, capsys):
    seen = _stub_network(monkeypatch, name)
    assert main(["experiment", name, "--quick", "--quiet"]) == 0
    expected = NETWORK_QUICK[name][2]
    assert {k: seen[k] for k in expected} == expected
    assert not any(k in seen for k in ("losses", "regimes", "maps", "routers"))  # every arm: the module's default
    assert seen["n_train_per_class"] == 400 and seen["n_test_per_class"] == 100  # all of MNIST-5k
    # an option given still applies under --quick
    assert main(["experiment", name, "--quick", "--quiet", "--seeds", "3", "4", "--epochs", "5"]) == 0
    assert seen["seeds"] == [3, 4] and seen["epochs"] == 5
    capsys.readouterr()


@pytest.mark.parametrize("name", sorted(NETWORK_QUICK))
def test_network_lists_the_paths_it_wrote(name, monkeypatch, capsys, tmp_path):
    _stub_network(monkeypatch, name)
    out, fig = tmp_path / "out", tmp_path / "fig.png"
    assert main(["experiment", name, "--quick", "--quiet", "--out", str(out), "--figure", str(fig)]) == 0
    cap = capsys.readouterr()
    assert cap.out == "| table |\n\n"  # stdout: the table only
    assert cap.err.splitlines() == [f"wrote {out / name}.json", f"wrote {out / name}.md", f"wrote {fig}"]
    assert json.loads((out / f"{name}.json").read_text())["experiment"] == name and fig.exists()
    # without --out or --figure, nothing is written and nothing listed
    assert main(["experiment", name, "--quick", "--quiet", "--json"]) == 0
    cap = capsys.readouterr()
    assert cap.err == "" and json.loads(cap.out)["experiment"] == name
