"""DFlash block-diffusion drafter, native, loading z-lab layout checkpoints (no remote code).

One pass per round: the block ``[bonus, MASK x (B-1)]`` embedded with the *target's* embedding,
through Qwen3-style layers whose keys/values also carry the target's context features
(``fc`` + ``hidden_norm`` of the concatenated tapped layers), non-causal inside the block. The
*target's* lm_head on the last B-1 outputs gives a distribution for every depth at once.

The drafter's own KV cache keeps the context rows of committed tokens; the block's rows are
dropped after each round (the cache is cropped back to the committed length).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tree_kernels.static import tree_attention_static

from ..models.checkpoint import check_against, group_expert_keys, load_into, read_headers, save_tensors, write_json
from ..models.common import MLP, KVCache, Linear, PackableModel, PackedModule, RMSNorm, Rotary, apply_rotary
from ..models.config import ConfigError, RopeConfig, _rope_from
from ..tree import Draft


@dataclass
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeConfig
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int | None
    vocab_size: int | None
    layer_types: list[str]
    sliding_window: int | None
    is_causal: bool | None
    attention_bias: bool
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    raw: dict = field(default_factory=dict, repr=False)


def _draft_value(raw: dict, name: str, default=None):
    """dflash_config first, then the top level (older files), as the reference code reads it."""
    inner = raw.get("dflash_config") or {}
    return inner.get(name, raw.get(name, default))


def parse_dflash_config(raw: dict, where: str = "drafter config") -> DFlashConfig:
    archs = raw.get("architectures") or []
    if any(a != "DFlashDraftModel" for a in archs):
        raise ConfigError(f"{where}: architectures {archs} not supported (only DFlashDraftModel)")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if key not in raw:
            raise ConfigError(f"{where}: missing required key {key!r}")
    layer_ids = _draft_value(raw, "target_layer_ids")
    if layer_ids is None:
        raise ConfigError(
            f"{where}: dflash_config.target_layer_ids is missing. It must come from the drafter's own config: "
            "guessing the tapped layers from layer counts loads silently and collapses acceptance."
        )
    if not isinstance(layer_ids, list) or not layer_ids or not all(isinstance(i, int) for i in layer_ids):
        raise ConfigError(f"{where}: target_layer_ids must be a non-empty list of layer indices, got {layer_ids!r}")
    mask = _draft_value(raw, "mask_token_id")
    if mask is None:
        raise ConfigError(f"{where}: dflash_config.mask_token_id is missing")
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    layers = int(raw["num_hidden_layers"])
    layer_types = raw.get("layer_types") or ["full_attention"] * layers
    if len(layer_types) != layers or set(layer_types) - {"full_attention", "sliding_attention"}:
        raise ConfigError(f"{where}: layer_types {layer_types} do not fit {layers} attention layers")
    block = int(_draft_value(raw, "block_size", 16))
    if block < 2:
        raise ConfigError(f"{where}: block_size must be >= 2, got {block}")
    softcap = _draft_value(raw, "final_logit_softcapping")
    is_causal = raw.get("is_causal")
    return DFlashConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(raw["intermediate_size"]),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=_rope_from(raw, head_dim, 1.0),
        block_size=block,
        mask_token_id=int(mask),
        target_layer_ids=[int(i) for i in layer_ids],
        num_target_layers=raw.get("num_target_layers"),
        vocab_size=raw.get("vocab_size"),
        layer_types=list(layer_types),
        sliding_window=raw.get("sliding_window"),
        is_causal=None if is_causal is None else bool(is_causal),
        attention_bias=bool(raw.get("attention_bias", False)),
        input_embedding_scale=float(_draft_value(raw, "input_embedding_scale", 1.0)),
        output_multiplier=float(_draft_value(raw, "output_multiplier", 1.0)),
        final_logit_softcapping=float(softcap) if softcap else None,
        raw=raw,
    )


def check_pair(config: DFlashConfig, target_config) -> None:
    """A drafter only fits the target it was trained against: say which number disagrees."""
    t = target_config
    problems = []
    if config.hidden_size != t.hidden_size:
        problems.append(f"hidden_size: drafter {config.hidden_size}, target {t.hidden_size}")
    if config.vocab_size is not None and int(config.vocab_size) != t.vocab_size:
        problems.append(f"vocab_size: drafter {config.vocab_size}, target {t.vocab_size}")
    if config.num_target_layers is not None and int(config.num_target_layers) != t.num_hidden_layers:
        problems.append(f"num_target_layers: drafter {config.num_target_layers}, target has {t.num_hidden_layers} layers")
    bad = [i for i in config.target_layer_ids if not 0 <= i < t.num_hidden_layers]
    if bad:
        problems.append(f"target_layer_ids {bad} out of range for a {t.num_hidden_layers}-layer target")
    if not 0 <= config.mask_token_id < t.vocab_size:
        problems.append(f"mask_token_id {config.mask_token_id} outside the target vocabulary (size {t.vocab_size})")
    if problems:
        raise ConfigError("drafter does not fit the target: " + "; ".join(problems))


class DFlashAttention(PackedModule):
    # k and v read the context rows and the block, q only the block: k and v share a GEMM
    # (packing q too would compute it for every context row, the whole prompt on the first round)
    packable = ("k_proj", "v_proj")

    def __init__(self, config: DFlashConfig, layer: int):
        super().__init__()
        h, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, h * d, bias=bias)
        self.k_proj = Linear(config.hidden_size, kv * d, bias=bias)
        self.v_proj = Linear(config.hidden_size, kv * d, bias=bias)
        self.o_proj = Linear(h * d, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, zero_centered=False)
        self.k_norm = RMSNorm(d, config.rms_norm_eps, zero_centered=False)
        sliding = config.layer_types[layer] == "sliding_attention"
        self.causal = sliding if config.is_causal is None else config.is_causal
        self.window = config.sliding_window if sliding else None
        self._masks: dict = {}  # the fast path's block masks, by (block size, device)

    def _block_mask(self, b: int, device) -> torch.Tensor:
        """Which block rows a block query sees: all of them, or (causal) itself and those before."""
        key = (b, str(device))
        mask = self._masks.get(key)
        if mask is None:
            mask = torch.ones(b, b, dtype=torch.bool, device=device)
            mask = torch.tril(mask) if self.causal else mask
            self._masks[key] = mask
        return mask

    def forward(self, x, ctx, cache: KVCache, cos_q, sin_q, cos_k, sin_k, q_pos, k_pos, static_rows=None):
        b, c = x.shape[0], ctx.shape[0]
        q = self.q_norm(self.q_proj(x).view(b, self.heads, self.head_dim))
        both = torch.cat([ctx, x], dim=0)
        k, v = self.projections(both)
        k = self.k_norm(k.view(c + b, self.kv_heads, self.head_dim))
        v = v.view(c + b, self.kv_heads, self.head_dim)
        q, k = apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)
        if static_rows is not None and self.window is None:
            # fast path: the context rows, then the block, each one launch at its device offset (the
            # block overwrites the padding past the valid context); the block's queries then read
            # every row before the block and the block itself (causal: its own earlier rows): a
            # tree over the committed prefix, one tree-attention launch instead of the masked SDPA
            # over the whole buffer with K/V repeated per query head
            ctx_rows, block_rows = static_rows
            cache.write_static(ctx_rows[0], k[:c], v[:c])
            cache.write_static(block_rows[0], k[c:], v[c:])
            o = tree_attention_static(q, cache.k, cache.v, self._block_mask(b, x.device), block_rows[0], self.head_dim**-0.5)
            return self.o_proj(o.reshape(b, self.heads * self.head_dim))
        if static_rows is None:
            keys, values = cache.write(cache.length, k, v)
        else:
            # fast path: context rows then block rows at device offsets (the block overwrites
            # the padding past the valid context); every row is returned and masked below
            ctx_rows, block_rows = static_rows
            cache.k.index_copy_(0, ctx_rows, k[:c])
            cache.v.index_copy_(0, ctx_rows, v[:c])
            cache.k.index_copy_(0, block_rows, k[c:])
            cache.v.index_copy_(0, block_rows, v[c:])
            keys, values = cache.k, cache.v
        visible = torch.ones(b, keys.shape[0], dtype=torch.bool, device=x.device)
        if static_rows is not None:
            visible &= k_pos[None, :] <= block_rows[-1]
        if self.causal:
            visible &= k_pos[None, :] <= q_pos[:, None]
        if self.window is not None:
            visible &= (q_pos[:, None] - k_pos[None, :]) < self.window
            if not self.causal:
                visible &= (k_pos[None, :] - q_pos[:, None]) < self.window
        group = self.heads // self.kv_heads
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys.repeat_interleave(group, dim=1).transpose(0, 1)[None],
            values.repeat_interleave(group, dim=1).transpose(0, 1)[None],
            attn_mask=visible[None, None],
            scale=self.head_dim**-0.5,
        )[0].transpose(0, 1)
        return self.o_proj(o.reshape(b, self.heads * self.head_dim))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig, layer: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=False)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=False)

    def forward(self, x, ctx, cache, rope, static_rows=None):
        x, normed = self.post_attention_layernorm(
            x, self.self_attn(self.input_layernorm(x), ctx, cache, *rope, static_rows=static_rows))
        return x + self.mlp(normed)


class DFlashDraftModel(PackableModel):
    """Parameter names follow the z-lab layout: fc, hidden_norm, layers.{i}..., norm (no prefix)."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.layers = nn.ModuleList([DFlashLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(h, config.rms_norm_eps, zero_centered=False)
        self.fc = Linear(len(config.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps, zero_centered=False)
        self.reset_rotary()

    def reset_rotary(self):
        device = self.fc.weight.device
        inv_freq, scale = self.config.rope.inv_freq(self.config.raw, "qwen3")
        self.rotary = Rotary(inv_freq.to(device), scale)

    def new_cache(self, max_len: int) -> list[KVCache]:
        w = self.fc.weight
        c = self.config
        return [KVCache(max_len, c.num_key_value_heads, c.head_dim, w.dtype, w.device) for _ in self.layers]

    def forward(self, features, noise, ctx_positions, block_positions, caches: list[KVCache]) -> torch.Tensor:
        """features [C, n_taps * H] of the newly committed tokens; noise [B, H] block embeddings.

        Appends the context rows to ``caches`` for good and returns the normed block outputs [B, H].
        """
        ctx = self.hidden_norm(self.fc(features))
        k_pos = torch.cat([torch.arange(caches[0].length, device=noise.device), ctx_positions, block_positions])
        new_k_pos = torch.cat([ctx_positions, block_positions])
        cos_q, sin_q = self.rotary.cos_sin(block_positions, noise.dtype)
        cos_k, sin_k = self.rotary.cos_sin(new_k_pos, noise.dtype)
        rope = (cos_q, sin_q, cos_k, sin_k, block_positions, k_pos)
        x = noise
        keep = torch.arange(ctx.shape[0], device=noise.device)
        for layer, cache in zip(self.layers, caches):
            x = layer(x, ctx, cache, rope)
            cache.commit(keep)  # keep the context rows, drop the block's
        return self.norm(x)

    def forward_static(self, features, count, noise, position, caches: list[KVCache]) -> torch.Tensor:
        """``forward`` with static shapes for the device fast path.

        ``features`` [C_max, n_taps * H] holds the newly committed tokens' features in its first
        ``count`` rows (a device scalar); ``position`` (device) is the bonus token's position.
        Cache row j holds position j, so no separate length is kept: rows past the block are
        simply never visible, and the next call overwrites the block's rows.
        """
        c = features.shape[0]
        b = noise.shape[0]
        ctx = self.hidden_norm(self.fc(features))
        ctx_pos = position - count + torch.arange(c, device=noise.device)
        blk_pos = position + torch.arange(b, device=noise.device)
        # key positions only for the masked SDPA route (sliding-window layers); the others read the
        # cache through tree attention, masked by the device prefix
        windowed = any(layer.self_attn.window is not None for layer in self.layers)
        k_pos = torch.arange(caches[0].capacity, device=noise.device) if windowed else None
        # the block's rows are the last b of the keys' positions: their cos / sin computed once
        cos_k, sin_k = self.rotary.table_rows(torch.cat([ctx_pos, blk_pos]), noise.dtype)
        rope = (cos_k[c:], sin_k[c:], cos_k, sin_k, blk_pos, k_pos)
        x = noise
        for layer, cache in zip(self.layers, caches):
            x = layer(x, ctx, cache, rope, static_rows=(ctx_pos, blk_pos))
        return self.norm(x)


def load_dflash(directory: str | Path, device="cpu", dtype=None, target_config=None) -> DFlashDraftModel:
    """Load a z-lab layout drafter; with ``target_config`` the pair is checked before any tensor is read."""
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"{directory}: no config.json (expected a DFlash drafter directory)")
    config = parse_dflash_config(json.loads(cfg_path.read_text()), str(cfg_path))
    if target_config is not None:
        check_pair(config, target_config)
    sources = group_expert_keys(read_headers(directory))
    if sources and all(k.startswith("model.") for k in sources):
        sources = {k[len("model.") :]: v for k, v in sources.items()}
    with torch.device("meta"):
        model = DFlashDraftModel(config)
    check_against(model, sources, str(directory))
    from ..models import default_dtype

    model = model.to_empty(device=device).to(dtype or default_dtype(device))
    model.reset_rotary()
    load_into(model, sources, ("rotary.inv_freq",))
    model.eval().requires_grad_(False)  # inference; training code turns gradients back on
    model.pack_projections()  # one GEMM for k/v and for gate/up per layer; state_dict unchanged
    model.source_directory = str(directory)
    return model


def save_dflash(model: DFlashDraftModel, directory: str | Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(directory / "model.safetensors", dict(model.state_dict()))
    write_json(directory / "config.json", model.config.raw)
    return directory


def dflash_config_dict(
    target_config,
    *,
    num_layers: int,
    target_layer_ids: list[int],
    mask_token_id: int,
    block_size: int = 16,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
) -> dict:
    """A z-lab style config.json for a drafter of ``target_config`` (training, tests, demos)."""
    t = target_config
    heads = heads or t.num_attention_heads
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": t.hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads or max(1, min(heads, t.num_key_value_heads)),
        "head_dim": head_dim or t.head_dim,
        "intermediate_size": intermediate_size or max(t.intermediate_size, 2 * t.hidden_size),
        "rms_norm_eps": t.rms_norm_eps,
        "rope_theta": t.rope.theta if t.rope.theta else 10000.0,
        "max_position_embeddings": t.max_position_embeddings,
        "vocab_size": t.vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": block_size,
        "num_target_layers": t.num_hidden_layers,
        "layer_types": ["full_attention"] * num_layers,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)},
    }


class DFlashDrafter:
    """Drives a DFlashDraftModel against a target through the rounds of one generation."""

    kind = "dflash"

    def __init__(self, model: DFlashDraftModel, target):
        check_pair(model.config, target.config)
        self.model = model
        self.target = target
        self.block_size = model.config.block_size
        self.target_layer_ids = list(model.config.target_layer_ids)
        self.caches: list[KVCache] = []
        self.pending: torch.Tensor | None = None

    @property
    def needs_features(self) -> bool:
        return True

    def begin(self, prompt_ids: list[int], features: torch.Tensor | None, max_len: int) -> None:
        need = max_len + self.block_size
        if self.caches and self.caches[0].capacity >= need:
            for c in self.caches:  # reuse the buffers: a captured CUDA graph keeps their addresses
                c.length = 0
        else:
            self.caches = self.model.new_cache(need)
        # the static draft step gathers its rotary rows from a table (Rotary.table_rows); graphs read it: kept here
        self._rotary_table = self.model.rotary.build_table(self.caches[0].capacity, self.target.dtype)
        self.pending = features

    def commit(self, accepted_ids: list[int], features: torch.Tensor | None) -> None:
        self.pending = features

    def _scaled_embedding(self, block: torch.Tensor) -> torch.Tensor:
        """The block's noise embedding (the target's embedding, times the drafter's input scale)."""
        noise = self.target.embed(block)
        scale = self.model.config.input_embedding_scale
        return noise * scale if scale != 1.0 else noise

    @torch.no_grad()
    def propose(self, bonus_token: int, position: int, k: int) -> Draft:
        """Distributions for depths 1..B-1 after ``bonus_token`` at ``position``; top-k of each."""
        c = self.model.config
        device = self.target.device
        if self.pending is None or self.pending.shape[0] == 0:
            raise RuntimeError("DFlash drafter has no context features: call begin() after prefill")
        start = self.caches[0].length
        n_ctx = self.pending.shape[0]
        if start + n_ctx != position:
            raise RuntimeError(f"drafter context ({start} + {n_ctx}) out of step with the target position {position}")
        block = torch.full((self.block_size,), c.mask_token_id, dtype=torch.int64, device=device)
        block[0] = int(bonus_token)
        noise = self._scaled_embedding(block)
        ctx_pos = torch.arange(start, position, device=device)
        blk_pos = torch.arange(position, position + self.block_size, device=device)
        h = self.model(self.pending.to(noise.dtype), noise, ctx_pos, blk_pos, self.caches)
        self.pending = None
        return self._top_k(h, k)

    def _top_k(self, h: torch.Tensor, k: int) -> Draft:
        c = self.model.config
        logits = self.target.logits_from_hidden(h[1:])
        if c.output_multiplier != 1.0 or c.final_logit_softcapping:  # (x 1.0 would be a launch for nothing)
            logits = logits.float() * c.output_multiplier
        if c.final_logit_softcapping:
            cap = c.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        top = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
        return Draft(top.indices, top.values)

    @torch.no_grad()
    def propose_static(self, bonus: torch.Tensor, position: torch.Tensor, features: torch.Tensor, count: torch.Tensor, k: int) -> Draft:
        """``propose`` with device inputs and static shapes (see DFlashDraftModel.forward_static)."""
        c = self.model.config
        block = torch.full((self.block_size,), c.mask_token_id, dtype=torch.int64, device=bonus.device)
        block[0] = bonus
        noise = self._scaled_embedding(block)
        h = self.model.forward_static(features.to(noise.dtype), count, noise, position, self.caches)
        return self._top_k(h, k)
