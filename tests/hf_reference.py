"""Tiny random transformers models of every family the workbench implements (test helper)."""

import torch
import transformers

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    max_position_embeddings=512,
)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8, linear_value_head_dim=12)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def make_hf(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON))
    elif kind == "qwen3_tied":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON, tie_word_embeddings=True))
    elif kind == "qwen3_moe":
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**COMMON, **MOE, norm_topk_prob=False))
    elif kind == "qwen3_5_text":
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**COMMON, **LINEAR))
    elif kind == "qwen3_5_moe_text":
        cfg = transformers.Qwen3_5MoeTextConfig(**COMMON, **LINEAR, **MOE, shared_expert_intermediate_size=48)
        model = transformers.Qwen3_5MoeForCausalLM(cfg)
    elif kind == "qwen3_next":
        cfg = transformers.Qwen3NextConfig(**COMMON, **LINEAR, **MOE, shared_expert_intermediate_size=48, mlp_only_layers=[1])
        model = transformers.Qwen3NextForCausalLM(cfg)
    else:
        raise ValueError(kind)
    # transformers' init is tiny (std 0.02): scale it up so every layer visibly matters
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                continue
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def hf_cache_kwargs(cache):
    """transformers >= 5.2x names the cache argument `cache`; older releases `past_key_values`."""
    import inspect

    params = inspect.signature(transformers.Qwen3ForCausalLM.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}


def hf_cache_of(output):
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)
