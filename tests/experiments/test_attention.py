"""`softk experiment attention` on softk's attention op: the α each head learns
and each head's support are reported (a tiny run; the full one is EXPERIMENTS.md's)."""

import pytest
import torch

pytest.importorskip("mlxtend")

from softk._experiments import attention  # noqa: E402


def test_weights_come_from_the_op_and_sum_to_one():
    torch.manual_seed(0)
    x = torch.rand(5, 784)
    for name in ("sparsemax", "entmax_learned"):
        model = attention.AttentionClassifier(name)
        w = model.head_weights(x)
        assert w.shape == (5, attention.HEADS, 28)
        torch.testing.assert_close(w.sum(-1), torch.ones(5, attention.HEADS))
        torch.testing.assert_close(model(x)[1], w.mean(1))


def test_run_reports_alpha_and_support_per_head():
    result = attention.run_attention(seeds=[0], epochs=1, n_train_per_class=10, n_test_per_class=5,
                                     maps=["entmax_learned", "sparsemax"], progress=False)
    learned, sparse = result["runs"]
    assert len(learned["alpha"]) == attention.HEADS and all(a > 1.01 for a in learned["alpha"])
    assert learned["alpha"] != [1.5] * attention.HEADS  # trained
    for run in (learned, sparse):
        assert len(run["support_per_head"]) == attention.HEADS
        assert all(1 <= s <= 28 for s in run["support_per_head"])
        assert run["support"] == pytest.approx(sum(run["support_per_head"]) / attention.HEADS, rel=1e-5)
        assert run["zero_fraction"] == pytest.approx(1 - run["support"] / 28, rel=1e-5)
    table = attention.markdown(result)
    assert "| entmax_learned |" in table and "| sparsemax |" in table
    assert "Learned α per head" in table and f"{sorted(learned['alpha'])[0]:.3f}" in table
