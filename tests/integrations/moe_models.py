"""Tiny transformers mixture-of-experts models built from configs (nothing downloaded).

Two layers, 8 experts, top-2, a large initialisation so that router logits
spread and a sparse map's support varies from token to token.
"""

from __future__ import annotations

import torch

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v3")
EXPERTS, TOP_K, VOCAB = 8, 2, 40


def build(family: str, dtype=torch.float64, seed: int = 0, experts: str = "eager", **overrides):
    """A seeded causal LM of ``family`` in ``dtype``, its experts run by ``experts``."""
    import transformers as t

    common = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=64, initializer_range=0.5,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)
    moe = dict(num_experts_per_tok=TOP_K)
    if family == "mixtral":
        cfg, cls = t.MixtralConfig(**common, **moe, intermediate_size=24, num_local_experts=EXPERTS), t.MixtralForCausalLM
    elif family == "qwen2_moe":
        cfg = t.Qwen2MoeConfig(**common, **moe, intermediate_size=24, moe_intermediate_size=12,
                               shared_expert_intermediate_size=12, num_experts=EXPERTS, norm_topk_prob=True)
        cls = t.Qwen2MoeForCausalLM
    elif family == "qwen3_moe":
        cfg = t.Qwen3MoeConfig(**common, **moe, intermediate_size=24, moe_intermediate_size=12,
                               num_experts=EXPERTS, head_dim=8)
        cls = t.Qwen3MoeForCausalLM
    elif family == "olmoe":
        cfg, cls = t.OlmoeConfig(**common, **moe, intermediate_size=12, num_experts=EXPERTS), t.OlmoeForCausalLM
    elif family == "gpt_oss":
        cfg = t.GptOssConfig(**common, **moe, intermediate_size=12, num_local_experts=EXPERTS, head_dim=8,
                             layer_types=["full_attention"] * 2)
        cls = t.GptOssForCausalLM
    elif family == "deepseek_v3":
        cfg = t.DeepseekV3Config(**{**common, "num_key_value_heads": 2}, **moe, intermediate_size=24,
                                 moe_intermediate_size=12, n_routed_experts=EXPERTS, n_group=2, topk_group=1,
                                 n_shared_experts=1, first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=8,
                                 qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, norm_topk_prob=True)
        cls = t.DeepseekV3ForCausalLM
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    model = cls(cfg)
    model.set_experts_implementation(experts)
    with torch.no_grad():  # DeepSeek's selection bias starts at 0; a nonzero one exercises it
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0, 0.3)
    return model.to(dtype).eval()


def routers(model):
    """The router modules of ``model``, in order."""
    return [m for m in model.modules() if all(hasattr(m, a) for a in ("weight", "top_k", "num_experts"))
            and not hasattr(m, "gate_up_proj") and not hasattr(m, "up_proj")]


# Other transformers families, by (config, model) class name: those whose router
# shares the v5 contract (patched) and those with another router (refused).
SHARING = {"glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"), "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM"),
           "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM"),
           "exaone_moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM"),
           "solar_open": ("SolarOpenConfig", "SolarOpenForCausalLM"),
           "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM")}
OTHER = {"phimoe": ("PhimoeConfig", "PhimoeForCausalLM", "PhimoeTopKRouter"),
         "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeTopKRouter"),
         "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", "Llama4Router"),
         "hunyuan_v1_moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Moe"),
         "minimax_m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", "MiniMaxM2TopKRouter")}


def build_other(config_name: str, model_name: str, seed: int = 0):
    """A 2-layer float64 model of another family from its config class with small sizes (None if absent)."""
    import transformers as t

    config_class, model_class = getattr(t, config_name, None), getattr(t, model_name, None)
    if config_class is None or model_class is None:
        return None
    cfg = config_class(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=4, intermediate_size=32, moe_intermediate_size=16,
                       max_position_embeddings=64, head_dim=8)
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        if isinstance(getattr(cfg, name, None), int):
            setattr(cfg, name, EXPERTS)
    if isinstance(getattr(cfg, "num_experts_per_tok", None), int):
        cfg.num_experts_per_tok = TOP_K
    for name, value in (("n_group", 2), ("topk_group", 1)):
        if hasattr(cfg, name):
            setattr(cfg, name, value)
    torch.manual_seed(seed)
    model = model_class(cfg)
    try:
        model.set_experts_implementation("eager")  # float64 on the CPU
    except ValueError:  # a family whose experts take no other implementation
        pass
    return model.to(torch.float64).eval()
