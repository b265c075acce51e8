"""Model shapes of the recipe: the bundled zoo's targets and drafters, and test-sized ones.

A target preset is an HF ``config.json`` (built like workbench.random_models.tiny_config), so the
saved checkpoint loads in workbench.models.load_target and in transformers' own classes.
"""

from __future__ import annotations

from ..drafters.dflash import dflash_config_dict
from ..models import parse_target_config
from .common import TrainError

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM"}

# name -> (model_type, dims)
TARGET_PRESETS = {
    # Qwen3.5-text: Gated DeltaNet + gated attention, 3:1; tied embeddings
    "tiny-hybrid": ("qwen3_5_text", dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=64, intermediate_size=1024, linear_num_key_heads=2, linear_num_value_heads=4,
                                        linear_key_head_dim=64, linear_value_head_dim=64)),
    # dense Qwen3 of about the same size
    "tiny-dense": ("qwen3", dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=64, intermediate_size=1088)),
    # test-sized (CPU tests of the recipe)
    "test-hybrid": ("qwen3_5_text", dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                        head_dim=16, intermediate_size=64, linear_num_key_heads=1, linear_num_value_heads=2,
                                        linear_key_head_dim=16, linear_value_head_dim=16)),
    "test-dense": ("qwen3", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                 head_dim=16, intermediate_size=64)),
}

# drafter shapes per target preset (layers, intermediate size); target_layer_ids are chosen from the target
DRAFTER_PRESETS = {
    "tiny-hybrid": dict(num_layers=2, intermediate_size=768),
    "tiny-dense": dict(num_layers=2, intermediate_size=768),
    "test-hybrid": dict(num_layers=1, intermediate_size=64),
    "test-dense": dict(num_layers=1, intermediate_size=64),
}


def target_config_dict(preset: str, vocab_size: int, eos_token_id: int, max_position_embeddings: int = 4096,
                       tie_word_embeddings: bool = True) -> dict:
    if preset not in TARGET_PRESETS:
        raise TrainError(f"unknown target preset {preset!r}; known: {', '.join(sorted(TARGET_PRESETS))}")
    model_type, dims = TARGET_PRESETS[preset]
    cfg = {
        "model_type": model_type,
        "architectures": [ARCHITECTURES[model_type]],
        "vocab_size": int(vocab_size),
        **dims,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "eos_token_id": int(eos_token_id),
        "pad_token_id": int(eos_token_id),
        "dtype": "bfloat16",
    }
    if model_type == "qwen3_5_text":
        n = dims["num_hidden_layers"]
        cfg["layer_types"] = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
        cfg["full_attention_interval"] = 4
        cfg["linear_conv_kernel_dim"] = 4
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    else:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    parse_target_config(cfg)  # fail here, not halfway through training
    return cfg


def default_target_layer_ids(num_layers: int, taps: int = 3) -> list[int]:
    """Evenly spread taps from layer 1 to the last layer (all distinct, sorted)."""
    if num_layers < 1:
        raise TrainError("the target has no layers")
    if num_layers == 1:
        return [0]
    lo, hi = 1, num_layers - 1
    taps = min(taps, hi - lo + 1)
    if taps == 1:
        return [hi]
    return sorted({round(lo + i * (hi - lo) / (taps - 1)) for i in range(taps)})


def drafter_config_dict(target_config, mask_token_id: int, num_layers: int = 2, intermediate_size: int | None = None,
                        target_layer_ids: list[int] | None = None, block_size: int = 16) -> dict:
    ids = target_layer_ids if target_layer_ids is not None else default_target_layer_ids(target_config.num_hidden_layers)
    bad = [i for i in ids if not 0 <= i < target_config.num_hidden_layers]
    if bad:
        raise TrainError(f"target_layer_ids {bad} out of range for a {target_config.num_hidden_layers}-layer target")
    if block_size < 2:
        raise TrainError(f"block_size must be >= 2, got {block_size}")
    if not 0 <= mask_token_id < target_config.vocab_size:
        raise TrainError(f"mask token id {mask_token_id} outside the target vocabulary ({target_config.vocab_size})")
    kv = max(1, min(target_config.num_attention_heads, target_config.num_key_value_heads))
    raw = dflash_config_dict(target_config, num_layers=num_layers, target_layer_ids=list(ids), mask_token_id=mask_token_id,
                             block_size=block_size, kv_heads=kv, intermediate_size=intermediate_size)
    raw["rms_norm_eps"] = 1e-6
    raw["dtype"] = "bfloat16"
    return raw
