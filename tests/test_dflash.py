"""The native DFlash drafter: z-lab layout checkpoints, cached drafting vs recomputation, mismatches."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from workbench.drafters.dflash import DFlashDrafter, load_dflash, parse_dflash_config, save_dflash
from workbench.models.config import ConfigError
from workbench.models.common import apply_rotary
from workbench.random_models import random_dflash, random_target


@pytest.fixture(scope="module")
def target():
    return random_target("hybrid", seed=4, vocab_size=300, eos_token_id=None)


def test_checkpoint_is_in_the_z_lab_layout_and_round_trips(target, tmp_path):
    model = random_dflash(target, seed=1, num_layers=2, block_size=8)
    save_dflash(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert set(cfg["dflash_config"]) == {"mask_token_id", "target_layer_ids"} and cfg["block_size"] == 8
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(2):
        expected |= {f"layers.{i}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")}
        expected |= {f"layers.{i}.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
        expected |= {f"layers.{i}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
    assert keys == expected
    loaded = load_dflash(tmp_path, dtype=torch.float32)
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k


def naive_block_logits(target, model, features, block_tokens, start):
    """DFlash from scratch: every context row recomputed, no cache (the definition)."""
    c = model.config
    ctx = model.hidden_norm(model.fc(features))  # [P, H], positions 0..P-1
    x = target.embed(torch.tensor(block_tokens)) * c.input_embedding_scale
    pos_k = torch.arange(start + len(block_tokens))
    pos_q = pos_k[start:]
    cos_k, sin_k = model.rotary.cos_sin(pos_k, x.dtype)
    cos_q, sin_q = model.rotary.cos_sin(pos_q, x.dtype)
    for layer in model.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        both = torch.cat([ctx, h])
        q = apply_rotary(a.q_norm(a.q_proj(h).view(len(h), a.heads, a.head_dim)), cos_q, sin_q)
        k = apply_rotary(a.k_norm(a.k_proj(both).view(len(both), a.kv_heads, a.head_dim)), cos_k, sin_k)
        v = a.v_proj(both).view(len(both), a.kv_heads, a.head_dim)
        rep = a.heads // a.kv_heads
        scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(rep, 1)) * a.head_dim**-0.5
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.repeat_interleave(rep, 1))
        x = x + a.o_proj(o.reshape(len(h), -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return F.log_softmax(target.logits_from_hidden(model.norm(x)[1:]).float(), -1)


@torch.no_grad()
def test_cached_drafting_equals_recomputation_over_rounds(target):
    model = random_dflash(target, seed=2, num_layers=2, block_size=6)
    drafter = DFlashDrafter(model, target)
    taps = drafter.target_layer_ids
    seq = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    cache = target.new_cache(64)
    out = target.run_chain(seq[:10], cache, taps=taps)
    drafter.begin(seq[:10], out.taps, 64)
    all_features = [out.taps]
    committed = 10
    for step in (3, 1, 5, 2):  # commit a few tokens per round, as the engine does
        bonus = seq[committed]
        draft = drafter.propose(bonus, committed, k=7)
        ref = naive_block_logits(target, model, torch.cat(all_features), [bonus] + [model.config.mask_token_id] * 5, committed)
        top = torch.topk(ref, 7, -1)
        assert torch.equal(draft.tokens, top.indices)
        assert (draft.logprobs - top.values).abs().max() < 1e-4
        new = target.run_chain(seq[committed : committed + step], cache, taps=taps)
        drafter.commit(seq[committed : committed + step], new.taps)
        all_features.append(new.taps)
        committed += step
    assert drafter.caches[0].length == committed - step  # block rows were dropped each round


def zlab_config(target, **over):
    from workbench.drafters.dflash import dflash_config_dict

    raw = dflash_config_dict(target.config, num_layers=1, target_layer_ids=[0, 2], mask_token_id=257)
    raw.update(over)
    return raw


def test_older_config_layout_and_rope_parameters(target):
    raw = zlab_config(target)
    inner = raw.pop("dflash_config")
    raw.update(inner)  # block_size / mask_token_id / target_layer_ids at the top level
    raw.pop("rope_theta")
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    cfg = parse_dflash_config(raw)
    assert cfg.mask_token_id == 257 and cfg.target_layer_ids == [0, 2] and cfg.rope.theta == 5e5


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["dflash_config"].pop("target_layer_ids"), "target_layer_ids is missing"),
        (lambda r: r["dflash_config"].update(target_layer_ids=[0, 2, 9]), r"target_layer_ids \[9\] out of range"),
        (lambda r: r["dflash_config"].update(mask_token_id=5000), "mask_token_id 5000 outside"),
        (lambda r: r.update(hidden_size=128), "hidden_size: drafter 128, target 64"),
        (lambda r: r.update(vocab_size=1000), "vocab_size: drafter 1000, target 300"),
        (lambda r: r.update(num_target_layers=36), "num_target_layers: drafter 36"),
        (lambda r: r.update(architectures=["DFlash2DraftModel"]), "only DFlashDraftModel"),
        (lambda r: r["dflash_config"].pop("mask_token_id"), "mask_token_id is missing"),
    ],
)
def test_mismatched_drafter_is_refused_with_the_reason(target, tmp_path, change, message):
    model = random_dflash(target, seed=3)
    save_dflash(model, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    change(raw)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message):
        load_dflash(tmp_path, target_config=target.config)  # refused before any tensor is read
    if "architectures" not in message and "missing" not in message and "hidden_size" not in message:
        with pytest.raises(ConfigError, match=message):  # and by the drafter itself, for a loaded model
            DFlashDrafter(load_dflash(tmp_path), target)


def test_proposals_build_no_autograd_graph_even_with_trainable_weights(target):
    """propose / propose_static are inference: with the drafter's weights trainable (as during
    training-time evaluation) and gradients on, the drafts still carry no graph."""
    model = random_dflash(target, seed=3, num_layers=1, block_size=6).requires_grad_(True)
    drafter = DFlashDrafter(model, target)
    seq = list(range(20, 32))
    with torch.no_grad():
        out = target.run_chain(seq, target.new_cache(64), taps=drafter.target_layer_ids)
    drafter.begin(seq, out.taps, 64)
    with torch.enable_grad():
        draft = drafter.propose(seq[-1], len(seq), k=3)
    assert not draft.logprobs.requires_grad and not draft.tokens.requires_grad
