"""Target models: one file per family, loaded from HF checkpoint directories.

    load_target(dir)         config.json + safetensors (sharded or not) -> CausalLM
    save_target(model, dir)  the same layout back (transformers loads it with its own classes)
"""

from __future__ import annotations

from pathlib import Path

import torch

from .checkpoint import CheckpointError, check_against, group_expert_keys, load_into, read_headers, save_tensors, unstack_experts, write_json
from .common import CausalLM, ForwardOutput, KVCache, ModelCache
from .config import MODEL_TYPES, ConfigError, TargetConfig, load_target_config, parse_target_config
from .qwen3 import Qwen3ForCausalLM
from .qwen3_5 import Qwen3_5ForCausalLM, RecurrentCache

__all__ = [
    "CausalLM",
    "CheckpointError",
    "ConfigError",
    "ForwardOutput",
    "KVCache",
    "ModelCache",
    "RecurrentCache",
    "TargetConfig",
    "build_target",
    "load_target",
    "save_target",
    "default_dtype",
]

_FAMILIES = {"qwen3": Qwen3ForCausalLM, "qwen3_5": Qwen3_5ForCausalLM}

# checkpoint parts a text target does not use (vision tower, multi-token-prediction head)
_IGNORED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")


def build_target(config: TargetConfig) -> CausalLM:
    return _FAMILIES[config.family](config)


def default_dtype(device: torch.device | str) -> torch.dtype:
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _module_key(key: str, config: TargetConfig) -> str:
    if config.checkpoint_type in ("qwen3_5", "qwen3_5_moe") and key.startswith("model.language_model."):
        return "model." + key[len("model.language_model.") :]
    return key


def load_target(
    directory: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> CausalLM:
    """Load an HF checkpoint directory. Headers are checked against the model before any tensor is read."""
    directory = Path(directory)
    config = load_target_config(directory)
    headers = read_headers(directory)
    renamed = {}
    for key, h in headers.items():
        if key.startswith(_IGNORED_PREFIXES):
            continue
        renamed[_module_key(key, config)] = h
    sources = group_expert_keys(renamed)
    ignore = ("lm_head.weight",) if config.tie_word_embeddings else ()
    if config.tie_word_embeddings:
        sources.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = build_target(config)
    check_against(model, sources, str(directory), ignore)
    # allocate only now that the checkpoint is known to fit; every tensor is overwritten below
    model = model.to_empty(device=device).to(dtype or default_dtype(device))
    model.tie_weights()
    model.reset_rotary()
    load_into(model, sources, ignore + ("rotary.inv_freq",))
    model.eval().requires_grad_(False)  # inference; training code turns gradients back on
    model.pack_projections()  # one GEMM for each layer's q/k/v, gate/up, GDN in_proj_*; state_dict unchanged
    model.source_directory = str(directory)
    return model


def save_target(model: CausalLM, directory: str | Path) -> Path:
    """Write config.json and model.safetensors in HF layout (per-expert keys, tied head omitted)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    prefix = "model.language_model." if model.config.checkpoint_type in ("qwen3_5", "qwen3_5_moe") else None
    tensors = unstack_experts(state)
    if prefix:
        tensors = {(prefix + k[len("model.") :] if k.startswith("model.") else k): v for k, v in tensors.items()}
    save_tensors(directory / "model.safetensors", tensors)
    write_json(directory / "config.json", model.config.raw)
    return directory
