"""Target configs read straight from an HF ``config.json`` (no transformers classes needed).

One flat dataclass covers every family the workbench runs; each family file reads the
fields it needs. Defaults mirror transformers' own config classes, so a minimal config.json
means what it means there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

# model_type in config.json -> (family, text model_type)
MODEL_TYPES = {
    "qwen3": ("qwen3", "qwen3"),
    "qwen3_moe": ("qwen3", "qwen3_moe"),
    "qwen3_5_text": ("qwen3_5", "qwen3_5_text"),
    "qwen3_5": ("qwen3_5", "qwen3_5_text"),
    "qwen3_5_moe_text": ("qwen3_5", "qwen3_5_moe_text"),
    "qwen3_5_moe": ("qwen3_5", "qwen3_5_moe_text"),
    "qwen3_next": ("qwen3_5", "qwen3_next"),
}

HYBRID_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
MOE_TYPES = ("qwen3_moe", "qwen3_5_moe_text", "qwen3_next")


class ConfigError(ValueError):
    """A config.json that cannot describe a model this workbench runs."""


@dataclass
class RopeConfig:
    theta: float
    rotary_dim: int
    rope_type: str = "default"
    parameters: dict = field(default_factory=dict)

    def inv_freq(self, raw_text_config: dict, model_type: str) -> tuple[torch.Tensor, float]:
        """Inverse frequencies [rotary_dim / 2] and the attention scaling factor."""
        if self.rope_type == "default":
            exps = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64).float() / self.rotary_dim
            return 1.0 / (self.theta**exps), 1.0
        # scaled variants (linear, yarn, llama3, ...): use transformers' own formulas verbatim
        try:
            from transformers import AutoConfig
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        except Exception as exc:  # pragma: no cover - transformers is a dependency
            raise ConfigError(f"rope_type {self.rope_type!r} needs transformers: {exc}") from exc
        if self.rope_type not in ROPE_INIT_FUNCTIONS:
            raise ConfigError(f"unsupported rope_type {self.rope_type!r}")
        hf = AutoConfig.for_model(model_type, **{k: v for k, v in raw_text_config.items() if k != "model_type"})
        inv, scale = ROPE_INIT_FUNCTIONS[self.rope_type](hf, "cpu")
        return inv.float(), float(scale)


@dataclass
class TargetConfig:
    model_type: str  # text model type (see MODEL_TYPES)
    checkpoint_type: str  # model_type as written in config.json
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    layer_types: list[str]
    sliding_window: int | None
    rope: RopeConfig
    hidden_act: str = "silu"
    # gated delta net (hybrids)
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    # mixture of experts
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    eos_token_ids: list[int] = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False)  # the whole config.json
    text_raw: dict = field(default_factory=dict, repr=False)  # its text part

    @property
    def is_hybrid(self) -> bool:
        return self.model_type in HYBRID_TYPES

    @property
    def is_moe(self) -> bool:
        return self.model_type in MOE_TYPES

    def is_moe_layer(self, i: int) -> bool:
        if not self.is_moe or self.num_experts <= 0:
            return False
        if self.model_type == "qwen3_5_moe_text":
            return True
        return i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    def inv_freq(self) -> tuple[torch.Tensor, float]:
        return self.rope.inv_freq(self.text_raw, self.model_type)


def _rope_from(text: dict, head_dim: int, default_partial: float) -> RopeConfig:
    params = dict(text.get("rope_parameters") or {})
    legacy = text.get("rope_scaling") or {}
    if legacy and not params:
        params = dict(legacy)
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor"))
    if partial is None:
        partial = default_partial
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    rotary_dim = int(head_dim * float(partial))
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ConfigError(f"partial_rotary_factor {partial} gives rotary dim {rotary_dim} for head_dim {head_dim}")
    return RopeConfig(theta=float(theta), rotary_dim=rotary_dim, rope_type=rope_type, parameters=params)


def _eos_ids(raw: dict, text: dict, directory: Path | None) -> list[int]:
    ids: list[int] = []
    for source in (text.get("eos_token_id"), raw.get("eos_token_id")):
        if source is None:
            continue
        ids.extend(source if isinstance(source, list) else [source])
    if directory is not None and (directory / "generation_config.json").is_file():
        gen = json.loads((directory / "generation_config.json").read_text())
        eos = gen.get("eos_token_id")
        if eos is not None:
            ids.extend(eos if isinstance(eos, list) else [eos])
    return sorted({int(i) for i in ids})


def _require(d: dict, key: str, where: str):
    if key not in d:
        raise ConfigError(f"{where}: missing required key {key!r}")
    return d[key]


def parse_target_config(raw: dict, directory: Path | None = None) -> TargetConfig:
    where = f"{directory / 'config.json'}" if directory is not None else "config"
    checkpoint_type = raw.get("model_type")
    if checkpoint_type not in MODEL_TYPES:
        raise ConfigError(
            f"{where}: unknown model_type {checkpoint_type!r}; supported: {', '.join(sorted(MODEL_TYPES))}"
        )
    family, model_type = MODEL_TYPES[checkpoint_type]
    text = raw.get("text_config") if checkpoint_type in ("qwen3_5", "qwen3_5_moe") else raw
    if not isinstance(text, dict):
        raise ConfigError(f"{where}: model_type {checkpoint_type!r} needs a 'text_config' object")
    hidden = int(_require(text, "hidden_size", where))
    heads = int(_require(text, "num_attention_heads", where))
    layers = int(_require(text, "num_hidden_layers", where))
    head_dim = int(text.get("head_dim") or hidden // heads)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    hybrid = model_type in HYBRID_TYPES
    layer_types = text.get("layer_types")
    sliding_window = text.get("sliding_window")
    if not hybrid and not text.get("use_sliding_window", False):
        sliding_window = None  # as transformers: the window only applies with use_sliding_window
    if layer_types is None:
        if hybrid:
            interval = int(text.get("full_attention_interval", 4))
            layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
        else:
            max_window = int(text.get("max_window_layers", 28))
            layer_types = [
                "sliding_attention" if sliding_window is not None and i >= max_window else "full_attention"
                for i in range(layers)
            ]
    if len(layer_types) != layers:
        raise ConfigError(f"{where}: layer_types has {len(layer_types)} entries for {layers} layers")
    allowed = {"full_attention", "linear_attention"} if hybrid else {"full_attention", "sliding_attention"}
    bad = sorted(set(layer_types) - allowed)
    if bad:
        raise ConfigError(f"{where}: layer_types {bad} not supported for {model_type} (allowed {sorted(allowed)})")
    cfg = TargetConfig(
        model_type=model_type,
        checkpoint_type=checkpoint_type,
        family=family,
        vocab_size=int(_require(text, "vocab_size", where)),
        hidden_size=hidden,
        intermediate_size=int(text.get("intermediate_size", 0) or 0),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        attention_bias=bool(text.get("attention_bias", False)),
        layer_types=list(layer_types),
        sliding_window=int(sliding_window) if sliding_window else None,
        rope=_rope_from(text, head_dim, 0.25 if hybrid else 1.0),
        hidden_act=text.get("hidden_act", "silu"),
        linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
        linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
        linear_num_key_heads=int(text.get("linear_num_key_heads", 16)),
        linear_num_value_heads=int(text.get("linear_num_value_heads", 32)),
        # hub checkpoints say num_experts; transformers >= 5 may write num_local_experts
        num_experts=int(text.get("num_experts") or text.get("num_local_experts") or 0),
        num_experts_per_tok=int(text.get("num_experts_per_tok", 0) or 0),
        moe_intermediate_size=int(text.get("moe_intermediate_size", 0) or 0),
        shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size", 0) or 0),
        norm_topk_prob=bool(text.get("norm_topk_prob", model_type != "qwen3_moe")),
        decoder_sparse_step=int(text.get("decoder_sparse_step", 1) or 1),
        mlp_only_layers=list(text.get("mlp_only_layers") or []),
        eos_token_ids=_eos_ids(raw, text, directory),
        raw=raw,
        text_raw=text,
    )
    if cfg.hidden_act not in ("silu", "swish"):
        raise ConfigError(f"{where}: hidden_act {cfg.hidden_act!r} not supported (silu only)")
    if heads % kv_heads:
        raise ConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if hybrid and cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ConfigError(
            f"{where}: linear_num_value_heads {cfg.linear_num_value_heads} is not a multiple of "
            f"linear_num_key_heads {cfg.linear_num_key_heads}"
        )
    if cfg.is_moe and cfg.num_experts > 0 and not 0 < cfg.num_experts_per_tok <= cfg.num_experts:
        raise ConfigError(f"{where}: num_experts_per_tok {cfg.num_experts_per_tok} out of range 1..{cfg.num_experts}")
    if not math.isfinite(cfg.rms_norm_eps) or cfg.rms_norm_eps <= 0:
        raise ConfigError(f"{where}: rms_norm_eps must be a positive number, got {cfg.rms_norm_eps}")
    return cfg


def load_target_config(directory: str | Path) -> TargetConfig:
    directory = Path(directory)
    path = directory / "config.json"
    if not path.is_file():
        raise ConfigError(f"{directory}: no config.json (expected an HF checkpoint directory)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
    return parse_target_config(raw, directory)
