"""softk's attention in Hugging Face transformers (optional extra "hf"): tiny
Llama (GQA) and GPT-2 models built from configs, nothing downloaded."""

import numpy as np
import pytest
import torch

from softk.integrations import hf_attention as hfa

from ..oracle import attention as ora
from ..attention.test_attention import one_thread  # noqa: F401

transformers = pytest.importorskip("transformers")
from transformers import (AttentionInterface, GPT2Config, GPT2LMHeadModel, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402


def _oracle_entmax15(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                     **kwargs):
    """An attention implementation from the NumPy oracle (float64), for comparison."""
    causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    mask = None if attention_mask is None else attention_mask.numpy()
    out, _ = ora.attention(query.detach().double().numpy(), key.detach().double().numpy(),
                           value.detach().double().numpy(), mask, causal, scaling, "entmax15")
    return torch.tensor(out, dtype=query.dtype).transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module", autouse=True)
def registered():
    names = hfa.register()
    AttentionInterface.register("oracle_entmax15", _oracle_entmax15)
    AttentionMaskInterface.register("oracle_entmax15", sdpa_mask)
    return names


def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return cfg, LlamaForCausalLM(cfg).state_dict()


def gpt2():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, attn_pdrop=0.0,
                     resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return cfg, GPT2LMHeadModel(cfg).state_dict()


def build(kind, impl):
    cfg, state = llama() if kind == "llama" else gpt2()
    cls = LlamaForCausalLM if kind == "llama" else GPT2LMHeadModel
    model = cls._from_config(cfg, attn_implementation=impl).eval()
    model.load_state_dict(state)
    return model


def batch():
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding: three query rows with no key at all in the second sequence
    return ids, mask


def test_register_names_the_implementations(registered):
    assert registered == ("softk_softmax", "softk_sparsemax", "softk_entmax15", "softk_entmax_learned")
    assert hfa.register() == registered  # idempotent
    for name in registered:
        assert name in AttentionInterface._global_mapping and name in AttentionMaskInterface._global_mapping


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_softmax_matches_sdpa_logits(kind):
    ids, mask = batch()
    with torch.no_grad():
        want = build(kind, "sdpa")(ids, attention_mask=mask).logits
        got = build(kind, "softk_softmax")(ids, attention_mask=mask).logits
        # without padding, the causal flag path (no mask tensor at all)
        want_c = build(kind, "sdpa")(ids).logits
        got_c = build(kind, "softk_softmax")(ids).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_c, want_c, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_entmax15_runs_softk_and_matches_the_oracle(kind):
    ids, mask = batch()
    with torch.no_grad():
        got = build(kind, "softk_entmax15")(ids, attention_mask=mask).logits
        want = build(kind, "oracle_entmax15")(ids, attention_mask=mask).logits
        sdpa = build(kind, "sdpa")(ids, attention_mask=mask).logits
    keep = mask.bool()
    np.testing.assert_allclose(got[keep].numpy(), want[keep].numpy(), atol=2e-5, rtol=1e-4)
    assert (got[keep] - sdpa[keep]).abs().max() > 2e-4  # ten times the tolerance: not softmax in disguise


def test_sparsemax_and_generation():
    ids, mask = batch()
    with torch.no_grad():
        assert torch.isfinite(build("llama", "softk_sparsemax")(ids, attention_mask=mask).logits).all()
        # greedy decoding with a cache: queries of length 1 against a growing key set
        want = build("llama", "sdpa").generate(ids[:1], max_new_tokens=4, do_sample=False, pad_token_id=0)
        got = build("llama", "softk_softmax").generate(ids[:1], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_generate_with_a_cache_decodes_on_the_support(kind, monkeypatch):
    # greedy decoding through the KV cache: each new query against the cached
    # keys, P·V gathered from the support (forced at these tiny lengths), and
    # the step's logits equal the float64 oracle's attention in the same model
    from softk._backends.blockwise import support
    monkeypatch.setattr(support, "GATHER_SHARE", float("inf"))
    gathered = []
    real = support.product
    monkeypatch.setattr(support, "product", lambda p, v, sparse: gathered.append(p.shape[2]) or real(p, v, sparse))
    ids, _ = batch()
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        got = build(kind, "softk_entmax15").generate(ids[:1], **kw)
        want = build(kind, "oracle_entmax15").generate(ids[:1], **kw)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores, want.scores):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-5, rtol=1e-4)
    heads = 2 if kind == "llama" else 1  # query rows per key/value head at one query (GQA 4/2, MHA)
    assert gathered.count(heads) >= 4 * 2  # 4 decoding steps after the prompt, 2 layers


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_learned_alpha(kind):
    model = build(kind, "softk_entmax_learned").train()
    ids, mask = batch()
    with pytest.raises(ValueError, match="learn_alpha"):
        model(ids, attention_mask=mask)
    assert hfa.learn_alpha(model, alpha=1.5) == 2
    assert hfa.learned_alphas(model) == [[1.5] * 4, [1.5] * 4]
    out = model(ids, attention_mask=mask, labels=ids)
    # at α = 1.5 every head is entmax15: the logits are softk_entmax15's
    with torch.no_grad():
        ref = build(kind, "softk_entmax15")(ids, attention_mask=mask).logits
    torch.testing.assert_close(out.logits[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=1e-5)
    out.loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if n.endswith("softk_attention.alpha_raw")]
    assert len(grads) == 2 and all(g is not None and torch.isfinite(g).all() and (g != 0).any() for g in grads)


def test_attention_dropout_is_refused_in_training():
    cfg, _ = gpt2()
    cfg.attn_pdrop = 0.1
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation="softk_entmax15").train()
    with pytest.raises(ValueError, match="attn_pdrop"):
        model(torch.zeros(1, 4, dtype=torch.long))
    model.eval()(torch.zeros(1, 4, dtype=torch.long))  # eval passes dropout=0.0


def test_gemma2_with_its_attention_softcap_matches_eager():
    # Gemma 2 caps its attention logits (attn_logit_softcapping: c·tanh(s/c)) and
    # alternates sliding-window layers; softk_softmax must give the eager logits
    Gemma2Config = transformers.Gemma2Config
    Gemma2ForCausalLM = transformers.Gemma2ForCausalLM
    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=5,
                       attn_logit_softcapping=0.02, final_logit_softcapping=None, query_pre_attn_scalar=8)
    state = Gemma2ForCausalLM(cfg).state_dict()
    ids, mask = batch()

    def logits(impl, **kw):
        model = Gemma2ForCausalLM._from_config(cfg, attn_implementation=impl).eval()
        model.load_state_dict(state)
        with torch.no_grad():
            return model(ids, **kw).logits

    want, got = logits("eager"), logits("softk_softmax")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the cap changes the result: without it the logits differ (the test can fail)
    cfg_nocap = Gemma2Config(**{**cfg.to_dict(), "attn_logit_softcapping": None})
    model = Gemma2ForCausalLM._from_config(cfg_nocap, attn_implementation="softk_softmax").eval()
    model.load_state_dict(state)
    with torch.no_grad():
        assert (model(ids).logits - want).abs().max() > 1e-4  # ten times the tolerance


# ---- packed batches: several documents in one row -------------------------------------------------------------

def packed_docs(kind, lengths=(5, 7, 4)):
    """Three documents, as DataCollatorWithFlattening packs them into one row
    (position_ids restarting at 0, and the flash kwargs cu_seq_lens_q/k)."""
    g = torch.Generator().manual_seed(2)
    docs = [torch.randint(0, 64, (n,), generator=g) for n in lengths]
    batch = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": d.tolist()} for d in docs])
    assert batch["input_ids"].shape == (1, sum(lengths))
    return docs, batch


def build64(kind, impl):
    return build(kind, impl).double()


FLASH_KW = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
# how the packing reaches softk's attention function: the kwargs the flash implementations read, or only the
# restarting position_ids (in training mode the model makes a cache, so transformers' mask builder, which looks
# for restarting positions only without a cache, leaves the mask to the attention), or the mask builder's
# block-diagonal mask (use_cache=False)
ROUTES = {
    "cu_seq_lens": lambda b: dict(position_ids=b["position_ids"], **{k: b[k] for k in FLASH_KW}),
    "position_ids": lambda b: dict(position_ids=b["position_ids"]),
    "mask_builder": lambda b: dict(position_ids=b["position_ids"], use_cache=False),
}


def per_document(model, docs):
    return torch.cat([model(d[None]).logits[0] for d in docs])


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("impl", ["softk_sparsemax", "softk_entmax15"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_packed_documents_attend_only_to_themselves(kind, impl, route, monkeypatch):
    docs, batch = packed_docs(kind)
    model = build64(kind, impl).train()  # training mode, dropout 0: the model makes its cache as in training
    with torch.no_grad():
        want = per_document(model, docs)
        got = model(batch["input_ids"], **ROUTES[route](batch)).logits[0]
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
        if route != "mask_builder":  # the test can fail: with the packing ignored, documents 2 and 3 see document 1
            monkeypatch.setattr(hfa, "_packed_keep", lambda *a: None)
            leak = model(batch["input_ids"], **ROUTES[route](batch)).logits[0]
            first = len(docs[0])
            torch.testing.assert_close(leak[:first], want[:first], atol=1e-12, rtol=1e-12)
            assert (leak[first:] - want[first:]).abs().max() > 1e-3


def test_packed_positions_are_read_once_per_forward(monkeypatch):
    docs, batch = packed_docs("llama")
    model = build64("llama", "softk_sparsemax").train()
    assert model.config.num_hidden_layers > 1
    calls = []
    real = hfa._is_packed
    monkeypatch.setattr(hfa, "_is_packed", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        first = model(batch["input_ids"], position_ids=batch["position_ids"]).logits
        assert len(calls) == 1  # every layer got the same position_ids tensor
        again = model(batch["input_ids"], position_ids=batch["position_ids"].clone()).logits
    assert len(calls) == 2  # a new tensor is read again
    torch.testing.assert_close(again, first, atol=0, rtol=0)
    torch.testing.assert_close(first[0], per_document(model, docs), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_packed_gradients_are_those_of_the_documents_alone(kind):
    docs, batch = packed_docs(kind)
    model = build64(kind, "softk_entmax15").train()
    w = torch.randn(batch["input_ids"].shape[1], 64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (per_document(model, docs) * w).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (model(batch["input_ids"], **ROUTES["cu_seq_lens"](batch)).logits[0] * w).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=1e-11, rtol=1e-10, msg=n)
    assert any(g.abs().max() > 1e-3 for g in want.values())


def test_packed_keys_longer_than_queries_are_bottom_right_aligned():
    # cu_seq_lens_k ≠ cu_seq_lens_q (documents with keys before their queries): FlashAttention's causal
    # alignment, as softk.attention.varlen_attn computes it
    from softk.attention import varlen_attn

    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 7, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 11, 8, generator=g, dtype=torch.float64) for _ in range(2))
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 11], dtype=torch.int32)
    module = torch.nn.Module()
    module.is_causal = True
    for impl, map_name in (("softk_sparsemax", "sparsemax"), ("softk_entmax15", "entmax15")):
        fn = AttentionInterface._global_mapping[impl]
        got, _ = fn(module, q, k, v, None, scaling=0.5, cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k, max_length_q=4,
                    max_length_k=6)
        want = varlen_attn(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu_q, cu_k, 4, 6,
                           scale=0.5, window_size=(-1, 0), enable_gqa=True, map=map_name)
        torch.testing.assert_close(got[0], want, atol=1e-12, rtol=1e-12)
    with pytest.raises(ValueError, match="packed length"):
        fn(module, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 3, 6], dtype=torch.int32), cu_seq_lens_k=cu_k)
    with pytest.raises(ValueError, match="batch size 1"):
        fn(module, q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), None,
           cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k)


def test_unpacked_calls_keep_the_causal_path(monkeypatch):
    # positions 0, 1, 2, … in one row, or several rows: no mask is built, the maps get is_causal as before
    seen = []
    real = hfa.scaled_dot_product_attention
    monkeypatch.setattr(hfa, "scaled_dot_product_attention",
                        lambda *a, **kw: seen.append((a[3], a[5])) or real(*a, **kw))
    model = build("llama", "softk_entmax15").train()
    ids, _ = batch()
    with torch.no_grad():
        model(ids[:1], position_ids=torch.arange(12)[None])
        model(ids)
    assert seen and all(mask is None and causal for mask, causal in seen)
