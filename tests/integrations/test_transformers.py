"""softk.integrations.transformers.apply_softk on tiny transformers models built from configs.

The references are independent of softk: the unpatched model's logits fed to
torch's F.cross_entropy (float64) or to the NumPy Fenchel–Young oracle, and
the unpatched model's own loss (transformers' ForCausalLMLoss, which computes
in float32).  Nothing is downloaded.
"""

from __future__ import annotations

import copy
import inspect
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from softk.integrations.transformers import apply_softk, remove_softk, softk_loss  # noqa: E402

from ..oracle import losses as OL  # noqa: E402

V = 97
D = torch.float64
SMALL = dict(bos_token_id=0, eos_token_id=0, initializer_range=0.3)  # large init: token losses differ


def tiny(arch, dtype=D, tied=None):
    """A 2-layer model of architecture ``arch``, seeded, in eval mode (no dropout)."""
    t = transformers
    if arch == "llama":
        cfg = t.LlamaConfig(
            vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=bool(tied), **SMALL,
        )
        cls = t.LlamaForCausalLM
    elif arch == "gpt2":
        cfg = t.GPT2Config(vocab_size=V, n_positions=64, n_embd=16, n_layer=2, n_head=2, **SMALL)
        cls = t.GPT2LMHeadModel
    elif arch == "phi":  # an LM head with a bias
        cfg = t.PhiConfig(
            vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, **SMALL,
        )
        cls = t.PhiForCausalLM
    else:
        raise AssertionError(arch)
    torch.manual_seed(0)
    return cls(cfg).to(dtype).eval()


def batch(b=3, t=9, seed=1, pad_mask=True):
    """input_ids, a padding attention mask and labels with -100 on a prompt and on the padding.

    ``pad_mask=False`` gives no mask (None): transformers < 4.53's GPT-2 cannot
    build a float64 attention mask (torch.full overflows), a bug of its own.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long) if pad_mask else None
    if pad_mask:
        mask[2, 6:] = 0
    labels = ids.clone()
    labels[0, :4] = -100
    labels[2, 6:] = -100
    return ids, mask, labels


def grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(got, want, **tol):
    assert got.keys() == want.keys() and len(want) > 5
    for name in want:
        torch.testing.assert_close(got[name], want[name], **tol, msg=lambda m: f"{name}: {m}")


def shifted_logits(model, ids, mask, labels):
    """The unpatched model's logits and targets, shifted as transformers does: (N, V), (N,)."""
    logits = model(input_ids=ids, attention_mask=mask).logits
    return logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1)


# --- cross-entropy equals the model's own loss and gradients ------------------------------------


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("gpt2", None), ("phi", None)])
def test_cross_entropy_equals_float64_reference(arch, tied):
    model = tiny(arch, tied=tied)
    if tied is not None:
        assert (model.lm_head.weight is model.get_input_embeddings().weight) == tied
    ids, mask, labels = batch(pad_mask=arch != "gpt2")
    z, t = shifted_logits(model, ids, mask, labels)
    ref = F.cross_entropy(z, t, ignore_index=-100)
    want = grads(model, ref)
    own = model(input_ids=ids, attention_mask=mask, labels=labels).loss  # float32 inside
    own_grads = grads(model, own)

    apply_softk(model, loss="cross_entropy")
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert out.logits is None and out.loss.dtype == D
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=0)
    got = grads(model, out.loss)
    assert_grads_close(got, want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.loss, own.to(D), rtol=1e-6, atol=0)
    assert_grads_close(got, own_grads, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_cross_entropy_float32_matches_own_loss(arch):
    model = tiny(arch, dtype=torch.float32)
    ids, mask, labels = batch()
    own = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    want = grads(model, own)
    with softk_loss(model, "cross_entropy"):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, own, rtol=2e-6, atol=0)
    assert_grads_close(grads(model, loss), want, rtol=1e-4, atol=1e-6)


def test_a_mixture_of_experts_keeps_its_router_loss():
    # Mixtral adds router_aux_loss_coef · aux_loss to its loss only when it is
    # given labels, which the wrapper withholds: the balancing term was lost
    t = transformers
    cfg = t.MixtralConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                          output_router_logits=True, router_aux_loss_coef=0.5, **SMALL)
    torch.manual_seed(0)
    model = t.MixtralForCausalLM(cfg).eval()  # float32: its experts' grouped product takes no float64
    ids, mask, labels = batch()
    own = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert float(own.aux_loss) > 0.1  # the term is not negligible here
    want = grads(model, own.loss)
    apply_softk(model, loss="cross_entropy")
    got = model(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(got.loss, own.loss, rtol=2e-6, atol=0)
    assert_grads_close(grads(model, got.loss), want, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="return_dict=True"):
        model(input_ids=ids, attention_mask=mask, labels=labels, return_dict=False)


def test_num_items_in_batch_and_shift_labels_follow_transformers():
    model = tiny("llama", dtype=torch.float32)
    ids, mask, labels = batch()
    g = torch.Generator().manual_seed(5)
    shift = torch.randint(0, V, labels.shape, generator=g)
    shift[1, 2:5] = -100
    calls = [
        dict(num_items_in_batch=torch.tensor(23)),  # gradient accumulation: sum / 23
        dict(num_items_in_batch=7),
        dict(shift_labels=shift),  # already shifted: used as they are
        dict(shift_labels=shift, num_items_in_batch=torch.tensor(40)),
    ]
    for kw in calls:
        own = model(input_ids=ids, attention_mask=mask, labels=labels, **kw).loss
        want = grads(model, own)
        with softk_loss(model, "cross_entropy"):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels, **kw).loss
        torch.testing.assert_close(loss, own, rtol=2e-6, atol=0, msg=lambda m: f"{sorted(kw)}: {m}")
        assert_grads_close(grads(model, loss), want, rtol=1e-4, atol=1e-6)
    # the three kinds of call give three different losses: each argument was used
    losses = {round(model(input_ids=ids, labels=labels, **kw).loss.item(), 6) for kw in calls[:3]}
    assert len(losses) == 3


def test_tuple_output_and_return_logits():
    model = tiny("gpt2")
    ids, mask, labels = batch(pad_mask=False)
    own = model(input_ids=ids, attention_mask=mask, labels=labels, return_dict=False)
    apply_softk(model, "cross_entropy")
    got = model(input_ids=ids, attention_mask=mask, labels=labels, return_dict=False)
    assert isinstance(got, tuple) and len(got) == len(own) - 1  # (loss, *rest): no logits
    torch.testing.assert_close(got[0], own[0].to(D), rtol=1e-6, atol=0)
    apply_softk(model, "cross_entropy", return_logits=True)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert torch.equal(out.logits, own[1])
    torch.testing.assert_close(out.loss, own[0].to(D), rtol=1e-6, atol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_autocast_bfloat16_follows_the_heads_dtype(arch):
    """Under autocast the chunk logits are bfloat16, as the head's nn.Linear would make them."""
    model = tiny(arch, dtype=torch.float32)
    ids, _, labels = batch(pad_mask=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        own = model(input_ids=ids, labels=labels).loss
    want = grads(model, own)
    apply_softk(model, "cross_entropy")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=labels).loss
    assert loss.dtype == torch.float32  # as transformers returns it (the value is rounded to bfloat16)
    torch.testing.assert_close(loss, own, rtol=8e-3, atol=0)
    got = grads(model, loss)
    for name in want:
        cos = F.cosine_similarity(got[name].flatten(), want[name].flatten(), dim=0)
        assert cos > 0.999, (name, cos.item())


# --- Fenchel–Young losses ------------------------------------------------------------------------


@pytest.mark.parametrize("loss,options", [("sparsemax", {}), ("entmax", {"alpha": 1.3})])
def test_fenchel_young_loss_equals_numpy_oracle(loss, options):
    model = tiny("llama")
    ids, mask, labels = batch()
    z, t = shifted_logits(model, ids, mask, labels)
    keep = (t != -100).numpy()
    name = "sparsemax" if loss == "sparsemax" else "entmax"
    y = OL.one_hot(t.numpy(), V, 1)
    want = OL.fy_loss(name, z.detach().numpy(), y, alpha=options.get("alpha"), keep=keep, reduction="mean")
    apply_softk(model, loss, **options)
    got = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    np.testing.assert_allclose(got.item(), want, rtol=1e-9)


@pytest.mark.parametrize("arch,loss", [("llama", "sparsemax"), ("llama", "entmax15"), ("gpt2", "sparsemax")])
def test_optimiser_steps_lower_the_loss(arch, loss):
    model = tiny(arch, dtype=torch.float32).train()
    ids, mask, labels = batch(b=4, t=12)
    apply_softk(model, loss)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = []
    for _ in range(8):
        opt.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        assert out.logits is None
        out.loss.backward()
        opt.step()
        history.append(out.loss.item())
    assert np.isfinite(history).all()
    assert history[-1] < 0.7 * history[0], history


# --- the patch leaves everything else alone --------------------------------------------------------


def test_without_labels_the_model_is_unchanged():
    model = tiny("llama")
    ids, mask, _ = batch()
    want = model(input_ids=ids, attention_mask=mask).logits
    gen = model.generate(ids[:1, :5], max_new_tokens=4, do_sample=False)
    apply_softk(model, "sparsemax")
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, want)
    assert torch.equal(model.generate(ids[:1, :5], max_new_tokens=4, do_sample=False), gen)


def test_remove_reapply_context_and_copy():
    model = tiny("gpt2", dtype=torch.float32)
    ids, _, labels = batch()
    own = model(input_ids=ids, labels=labels)
    assert "forward" not in model.__dict__
    apply_softk(model, "sparsemax")
    sparse = model(input_ids=ids, labels=labels).loss
    assert not torch.isclose(sparse, own.loss)
    with softk_loss(model, "cross_entropy"):  # nested: cross-entropy inside, sparsemax after
        torch.testing.assert_close(model(input_ids=ids, labels=labels).loss, own.loss, rtol=1e-6, atol=0)
    assert torch.equal(model(input_ids=ids, labels=labels).loss, sparse)
    apply_softk(model, "entmax15")  # re-applying replaces the loss
    assert not torch.isclose(model(input_ids=ids, labels=labels).loss, sparse)

    twin = copy.deepcopy(model)  # the copy's patched forward is bound to the copy
    assert twin.forward.__self__ is twin
    assert remove_softk(model) is model and "forward" not in model.__dict__ and remove_softk(model) is model
    back = model(input_ids=ids, labels=labels)
    assert torch.equal(back.loss, own.loss) and torch.equal(back.logits, own.logits)
    assert twin(input_ids=ids, labels=labels).logits is None
    assert "labels" in inspect.signature(twin.forward).parameters  # the Trainer reads it


# --- refusals --------------------------------------------------------------------------------------


def test_refuses_unknown_losses_and_options():
    model = tiny("gpt2")
    with pytest.raises(ValueError, match="loss must be one of .*'hinge'"):
        apply_softk(model, "hinge")
    with pytest.raises(ValueError, match="soft_topk.*k-hot"):
        apply_softk(model, "soft_topk")
    with pytest.raises(TypeError, match=r"unknown loss option\(s\) \['reduction'\].*num_items_in_batch"):
        apply_softk(model, "sparsemax", reduction="sum")
    with pytest.raises(ValueError, match="alpha"):
        apply_softk(model, "entmax")
    with pytest.raises(ValueError, match="chunk_size"):
        apply_softk(model, "sparsemax", chunk_size=0)
    with pytest.raises(ValueError, match="tau"):
        apply_softk(model, "sparsemax", tau=-1.0)
    assert "forward" not in model.__dict__  # nothing was patched


def test_refuses_models_without_a_visible_lm_head():
    with pytest.raises(TypeError, match="torch.nn.Module.*got str"):
        apply_softk("gpt2", "sparsemax")
    base = transformers.LlamaModel(tiny("llama").config)
    with pytest.raises(ValueError, match="LlamaModel returned None from get_output_embeddings.*no LM head"):
        apply_softk(base, "sparsemax")
    with pytest.raises(ValueError, match="Linear has no get_output_embeddings"):
        apply_softk(nn.Linear(3, 4), "sparsemax")

    model = tiny("llama")
    model.lm_head = nn.Sequential(model.lm_head)
    with pytest.raises(TypeError, match="LM head .* is a Sequential, not a plain torch.nn.Linear"):
        apply_softk(model, "sparsemax")

    class CappedLinear(nn.Linear):
        def forward(self, x):
            return 30 * torch.tanh(super().forward(x) / 30)

    model = tiny("llama")
    model.lm_head = CappedLinear(16, V, bias=False)
    with pytest.raises(TypeError, match="is a CappedLinear"):
        apply_softk(model, "sparsemax")


@pytest.mark.parametrize(
    "make,field",
    [
        (lambda t: t.Gemma2ForCausalLM(t.Gemma2Config(**_GEMMA)), "final_logit_softcapping=30.0"),
        (lambda t: t.CohereForCausalLM(t.CohereConfig(**_COHERE)), "logit_scale=0.0625"),
        (lambda t: t.GraniteForCausalLM(t.GraniteConfig(**_COHERE, logits_scaling=8.0)), "logits_scaling=8.0"),
    ],
)
def test_refuses_configs_that_transform_the_logits(make, field):
    model = make(transformers)
    with pytest.raises(ValueError, match=f"config has {field}: the model transforms its logits"):
        apply_softk(model, "cross_entropy")


_COHERE = dict(
    vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, bos_token_id=0, eos_token_id=0, pad_token_id=0,
)
_GEMMA = dict(_COHERE, head_dim=4, final_logit_softcapping=30.0)


def test_refuses_at_call_time_what_it_cannot_see_in_advance():
    ids, _, labels = batch()
    cfg = tiny("gpt2").config

    class ScaledLogits(transformers.GPT2LMHeadModel):  # a transformation with no config field
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out["logits"] = out.logits * 2
            return out

    model = apply_softk(ScaledLogits(cfg).eval(), "sparsemax")
    with pytest.raises(ValueError, match="returned a Tensor of shape \\(3, 9, 97\\) instead of its LM head's output"):
        model(input_ids=ids, labels=labels)
    assert torch.equal(model(input_ids=ids).logits, ScaledLogits.forward(model, input_ids=ids).logits)

    class TiedByHand(transformers.GPT2LMHeadModel):  # logits from the embedding matrix, head unused
        def forward(self, input_ids=None, labels=None, **kwargs):
            h = self.transformer(input_ids).last_hidden_state
            return transformers.modeling_outputs.CausalLMOutput(logits=h @ self.transformer.wte.weight.T)

    model = apply_softk(TiedByHand(cfg), "sparsemax")
    with pytest.raises(ValueError, match="called its LM head \\(Linear, get_output_embeddings\\(\\)\\) 0 times"):
        model(input_ids=ids, labels=labels)

    model = apply_softk(tiny("llama"), "sparsemax")
    with pytest.raises(ValueError, match="logits_to_keep must be 0"):
        model(input_ids=ids, labels=labels, logits_to_keep=1)
    with pytest.raises(IndexError):  # an error inside the model's forward
        model(input_ids=ids + V, labels=labels)
    assert "forward" not in model.lm_head.__dict__  # the head was restored
