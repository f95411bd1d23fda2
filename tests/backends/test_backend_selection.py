"""Backend selection without a GPU: "auto" runs CPU tensors on the compiled
kernels ("native") when a C compiler works and on "torch" otherwise, and
"triton" on a CPU tensor without the interpreter is a clear error."""

import os
import sys

import pytest
import torch

import softk
from softk._backends import dispatch, registry as _backend

from .. import safety_net


def test_auto_runs_cpu_tensors_natively_when_compiled():
    expected = "native" if _backend.native_available() else "torch"
    with softk.use_backend("auto"):
        assert dispatch.pick("threshold", torch.zeros(2), softk.families.SPARSEMAX).backend == expected


def test_backend_selection(monkeypatch):
    assert softk.backend() == "auto"
    for name in ("torch", "native"):
        with softk.use_backend(name):
            assert softk.backend() == name
            assert torch.equal(softk.sparsemax(torch.tensor([0.1, 1.0, 1.5])), torch.tensor([0.0, 0.25, 0.75]))
    assert softk.backend() == "auto"
    monkeypatch.setenv("SOFTK_BACKEND", "torch")
    assert softk.backend() == "torch"
    monkeypatch.setenv("SOFTK_BACKEND", "nope")
    with pytest.raises(ValueError, match="SOFTK_BACKEND"):
        softk.backend()
    with pytest.raises(ValueError, match="name"):
        with softk.use_backend("nope"):
            pass


def test_triton_listed_and_unknown_rejected():
    with pytest.raises(ValueError, match=r"name must be one of \['auto', 'native', 'torch', 'triton'\]"):
        with softk.use_backend("cuda"):
            pass


@pytest.mark.skipif(not _backend.triton_importable(), reason="triton is not installed")
def test_triton_on_cpu_without_interpreter_is_a_clear_error():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import torch, softk\n"
        "with softk.use_backend('triton'):\n"
        "    softk.sparsemax(torch.zeros(3))\n"
    )
    r = safety_net.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "ValueError: backend 'triton' runs CUDA tensors" in r.stderr


def test_env_variable_selects_triton_when_installed(monkeypatch):
    monkeypatch.setenv("SOFTK_BACKEND", "triton")
    if _backend.triton_importable():
        assert softk.backend() == "triton"
    else:
        with pytest.raises(ValueError, match="SOFTK_BACKEND='triton'.*pip install"):
            softk.backend()
