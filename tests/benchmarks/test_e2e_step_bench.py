"""benchmarks/gpu/e2e_step.py's loss columns on the CPU: the marks around the loss bracket
the loss's forward and its backward inside the step."""

import time

import pytest

from .gpu_scripts import load

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

PAUSE = 0.1  # seconds the patched loss waits in its forward and again in its backward


class _PauseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(PAUSE)
        return grad


def test_the_loss_spans_hold_the_loss_forward_and_backward(monkeypatch):
    import softk.integrations.transformers as integration

    e2e = load("e2e_step")
    real = integration.fused_linear_loss

    def slow(*args, **kwargs):
        time.sleep(PAUSE)
        return _PauseInBackward.apply(real(*args, **kwargs))

    monkeypatch.setattr(integration, "fused_linear_loss", slow)
    res = e2e.main(["--size", "tiny", "--steps", "1", "--warmup", "0", "--memory", "none", "--variants", "own,softk_ce"])
    ce, own = res["variants"]["softk_ce"], res["variants"]["own"]
    # each pause falls inside its span: a mark on the wrong side of the loss would leave one out
    assert ce["loss_fwd_s"] >= PAUSE and ce["loss_bwd_s"] >= PAUSE
    for r in (ce, own):
        assert 0 < r["loss_fwd_s"] and 0 < r["loss_bwd_s"]
        assert r["loss_s"] == pytest.approx(r["loss_fwd_s"] + r["loss_bwd_s"])  # one step: its own sum
        assert r["loss_s"] <= r["median_s"] and r["loss_share"] == pytest.approx(r["loss_s"] / r["median_s"])
        assert 0 < r["issue_s"] <= r["median_s"]
    table = e2e.markdown(res)
    assert "| loss fwd (ms) | loss bwd (ms) | loss share of step | host issue (ms) |" in table
    assert f"| {1e3 * ce['loss_fwd_s']:.2f} | {1e3 * ce['loss_bwd_s']:.2f} | {ce['loss_share']:.1%} |" in table
