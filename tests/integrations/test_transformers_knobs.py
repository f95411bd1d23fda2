"""apply_softk with loss="ts2" and the knobs of the fused loss, on a tiny
llama built from a config, against the unpatched model's logits fed to
unfused float64 references (torch's F.cross_entropy, softk's ts2_loss)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from softk.integrations.transformers import apply_softk  # noqa: E402
from softk.losses import ts2_loss  # noqa: E402

from .test_transformers import V, batch, grads, assert_grads_close, shifted_logits, tiny  # noqa: E402


def test_ts2_equals_the_unfused_loss():
    model = tiny("llama")
    ids, mask, labels = batch()
    z, t = shifted_logits(model, ids, mask, labels)
    ref = ts2_loss(z, t, suppression=0.3, tau=0.8, adaptive=True)
    want = grads(model, ref)
    apply_softk(model, loss="ts2", suppression=0.3, tau=0.8, adaptive=True)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=0)
    assert_grads_close(grads(model, out.loss), want, rtol=1e-9, atol=1e-12)


def test_knobs_equal_torch_cross_entropy():
    model = tiny("llama")
    ids, mask, labels = batch()
    cw = torch.rand(V, dtype=torch.float64) + 0.5
    z, t = shifted_logits(model, ids, mask, labels)
    zc = 30.0 * torch.tanh(z / 30.0)
    keep = t != -100
    ref = F.cross_entropy(zc, t, weight=cw, label_smoothing=0.1) + 1e-3 * (torch.logsumexp(zc, -1) ** 2)[keep].mean()
    want = grads(model, ref)
    apply_softk(model, softcap=30.0, label_smoothing=0.1, class_weight=cw, z_loss=1e-3)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=0)
    assert_grads_close(grads(model, out.loss), want, rtol=1e-9, atol=1e-12)


def test_bad_knobs_are_refused_at_apply_time():
    model = tiny("gpt2")
    for kw, match in ((dict(softcap=0.0), "softcap"), (dict(label_smoothing=1.0), "label_smoothing"),
                      (dict(suppression=1.0), "suppression"), (dict(z_loss=-1.0), "z_loss")):
        with pytest.raises(ValueError, match=match):
            apply_softk(model, "sparsemax", **kw)
    with pytest.raises(ValueError, match="label_smoothing"):
        apply_softk(model, "ts2", label_smoothing=0.1)
    assert "forward" not in model.__dict__
