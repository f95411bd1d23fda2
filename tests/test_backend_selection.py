"""Backend selection without a GPU: "auto" keeps CPU tensors on torch, and
"triton" on a CPU tensor without the interpreter is a clear error."""

import os
import subprocess
import sys

import pytest
import torch

import softk
from softk import _backend


def test_auto_runs_cpu_tensors_with_torch():
    with softk.use_backend("auto"):
        assert _backend.resolve(torch.zeros(2)) == "torch"


def test_triton_listed_and_unknown_rejected():
    with pytest.raises(ValueError, match=r"name must be one of \['auto', 'torch', 'triton'\]"):
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
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ValueError: backend 'triton' runs CUDA tensors" in r.stderr


def test_env_variable_selects_triton_when_installed(monkeypatch):
    monkeypatch.setenv("SOFTK_BACKEND", "triton")
    if _backend.triton_importable():
        assert softk.backend() == "triton"
    else:
        with pytest.raises(ValueError, match="SOFTK_BACKEND='triton'.*pip install"):
            softk.backend()
