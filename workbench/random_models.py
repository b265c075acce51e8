"""Small random-weight targets and drafters (tests, the pre-zoo demo, experiments).

Built with the workbench's own classes and saved in HF layout, so transformers loads the
targets with its own classes. Weights are scaled so outputs depend strongly on context:
exactly what a losslessness test needs to be able to fail.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from .drafters.dflash import DFlashDraftModel, dflash_config_dict, parse_dflash_config, save_dflash
from .models import CausalLM, build_target, parse_target_config, save_target

FAMILY_MODEL_TYPES = {
    "dense": "qwen3",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "hybrid": "qwen3_5_text",
    "qwen3_5_text": "qwen3_5_text",
    "qwen3_5_moe_text": "qwen3_5_moe_text",
    "qwen3_next": "qwen3_next",
}

BYTE_TOKENS = 256
SPECIAL_TOKENS = ["<|endoftext|>", "<|mask|>"]


def tiny_config(
    kind: str = "hybrid",
    vocab_size: int = 320,
    hidden_size: int = 64,
    num_layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate_size: int = 128,
    linear_key_heads: int = 2,
    linear_value_heads: int = 4,
    linear_key_dim: int = 16,
    linear_value_dim: int = 16,
    conv_width: int = 4,
    num_experts: int = 4,
    experts_per_token: int = 2,
    moe_intermediate_size: int = 32,
    max_position_embeddings: int = 4096,
    eos_token_id: int | None = BYTE_TOKENS,
    tie_word_embeddings: bool = False,
    rms_norm_eps: float = 1e-3,
) -> dict:
    """An HF-style config.json dict for a tiny target of the given kind.

    ``rms_norm_eps`` defaults to 1e-3, not the usual 1e-6: with random weights some GDN heads
    output near-zero vectors, and the gated RMSNorm would amplify fp32 rounding on them a
    thousandfold, drowning the 1e-5 comparisons the tests make.
    """
    model_type = FAMILY_MODEL_TYPES.get(kind, kind)
    if model_type not in FAMILY_MODEL_TYPES.values():
        raise ValueError(f"unknown kind {kind!r}: expected one of {sorted(FAMILY_MODEL_TYPES)}")
    cfg = {
        "model_type": model_type,
        "architectures": [
            {
                "qwen3": "Qwen3ForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM",
                "qwen3_5_text": "Qwen3_5ForCausalLM",
                "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                "qwen3_next": "Qwen3NextForCausalLM",
            }[model_type]
        ],
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": rms_norm_eps,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "eos_token_id": eos_token_id,
        "dtype": "float32",
    }
    hybrid = model_type in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
    if hybrid:
        cfg.update(
            {
                "layer_types": ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(num_layers)],
                "linear_num_key_heads": linear_key_heads,
                "linear_num_value_heads": linear_value_heads,
                "linear_key_head_dim": linear_key_dim,
                "linear_value_head_dim": linear_value_dim,
                "linear_conv_kernel_dim": conv_width,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            }
        )
    else:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    if model_type in ("qwen3_moe", "qwen3_5_moe_text", "qwen3_next"):
        cfg.update(
            {
                "num_experts": num_experts,
                "num_experts_per_tok": experts_per_token,
                "moe_intermediate_size": moe_intermediate_size,
                "norm_topk_prob": True,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            }
        )
        if model_type != "qwen3_moe":
            cfg["shared_expert_intermediate_size"] = moe_intermediate_size
    return cfg


@torch.no_grad()
def randomize_(module: nn.Module, seed: int, gain: float = 1.0) -> nn.Module:
    """Fan-in scaled normal weights; GDN decay parameters as transformers initialises them."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=g).log())
        elif name.endswith("dt_bias"):
            p.fill_(1.0)
        elif "norm" in name:
            # zero-centred norms start at 0 (scale 1); plain norms at 1; a little noise either way
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        elif name.endswith("embed_tokens.weight"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif p.dim() >= 2:
            fan_in = p.shape[-1] if p.dim() != 3 or "conv" not in name else p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(fan_in))
        else:
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return module


def random_target(kind: str = "hybrid", seed: int = 0, dtype=torch.float32, pack: bool = True, **dims) -> CausalLM:
    """A tiny random target for inference, its projections packed (``pack=False``: one GEMM each)."""
    config = parse_target_config(tiny_config(kind, **dims))
    model = build_target(config)
    randomize_(model, seed)
    model = model.to(dtype)
    model.reset_rotary()
    model = model.eval().requires_grad_(False)
    return model.pack_projections() if pack else model


def random_dflash(target: CausalLM, seed: int = 0, num_layers: int = 1, block_size: int = 8, mask_token_id=None,
                  pack: bool = True):
    t = target.config
    layer_ids = sorted({max(0, t.num_hidden_layers // 4), t.num_hidden_layers // 2, t.num_hidden_layers - 1})
    mask = BYTE_TOKENS + 1 if mask_token_id is None else mask_token_id
    raw = dflash_config_dict(t, num_layers=num_layers, target_layer_ids=layer_ids, mask_token_id=mask, block_size=block_size)
    model = DFlashDraftModel(parse_dflash_config(raw))
    randomize_(model, seed + 1)
    model = model.to(target.dtype)
    model.reset_rotary()
    model = model.eval().requires_grad_(False)
    return model.pack_projections() if pack else model


def byte_tokenizer(vocab_size: int):
    """A byte-level tokenizer with no merges: ids 0..255 are bytes, then the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # order the alphabet by the byte each symbol stands for, so id == byte value
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(BYTE_TOKENS)}
    assert set(vocab) == set(alphabet)
    for i, tok in enumerate(SPECIAL_TOKENS):
        vocab[tok] = BYTE_TOKENS + i
    for i in range(BYTE_TOKENS + len(SPECIAL_TOKENS), vocab_size):
        vocab[f"<|unused_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def save_tokenizer(tokenizer, directory: str | Path, eos: str = "<|endoftext|>") -> None:
    import json

    directory = Path(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "model_max_length": 1 << 20}, indent=2)
        + "\n"
    )


def write_random_pair(directory: str | Path, kind: str = "hybrid", seed: int = 0, block_size: int = 8, **dims) -> tuple[Path, Path]:
    """target/ and drafter/ under ``directory``: a random target with tokenizer and a random DFlash drafter."""
    directory = Path(directory)
    target = random_target(kind, seed, **dims)
    tdir = save_target(target, directory / "target")
    save_tokenizer(byte_tokenizer(target.config.vocab_size), tdir)
    ddir = save_dflash(random_dflash(target, seed, block_size=block_size), directory / "drafter")
    return tdir, ddir
