"""Each target family equals transformers' own implementation (fp32, CPU), both directions of loading."""

import json

import pytest
import torch
import transformers
from hf_reference import hf_cache_kwargs, hf_cache_of, make_hf

from workbench.models import load_target, save_target
from workbench.random_models import random_target

KINDS = ["qwen3", "qwen3_tied", "qwen3_moe", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"]


def compare_prefill_and_decode(hf, ours, steps=8, prompt_len=21):
    ids = torch.randint(0, hf.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = hf(ids, use_cache=True)
        cache = ours.new_cache(prompt_len + steps + 4)
        mine = ours.run_chain(ids[0], cache)
        assert (ref.logits[0] - mine.logits).abs().max().item() < 1e-4
        past = hf_cache_of(ref)
        token = ref.logits[0, -1].argmax()
        for _ in range(steps):
            ref = hf(token.view(1, 1), use_cache=True, **hf_cache_kwargs(past))
            past = hf_cache_of(ref)
            mine = ours.run_chain(token.view(1), cache)
            assert (ref.logits[0, -1] - mine.logits[-1]).abs().max().item() < 1e-4
            token = ref.logits[0, -1].argmax()


@pytest.mark.parametrize("kind", KINDS)
def test_family_matches_transformers(kind, tmp_path):
    hf = make_hf(kind)
    hf.save_pretrained(tmp_path)
    ours = load_target(tmp_path, "cpu", torch.float32)
    compare_prefill_and_decode(hf, ours)


def test_multimodal_qwen3_5_checkpoint_text_part(tmp_path):
    """A `qwen3_5` checkpoint: text_config + model.language_model.* keys, vision and mtp ignored."""
    hf = make_hf("qwen3_5_text")
    hf.save_pretrained(tmp_path / "text")
    text_cfg = json.loads((tmp_path / "text" / "config.json").read_text())
    wrapper = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text_cfg,
               "vision_config": {"model_type": "qwen3_5_vision"}, "tie_word_embeddings": False}
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "text" / "model.safetensors")
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in tensors.items()}
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    renamed["mtp.fc.weight"] = torch.zeros(2, 2)
    (tmp_path / "mm").mkdir()
    save_file(renamed, tmp_path / "mm" / "model.safetensors")
    (tmp_path / "mm" / "config.json").write_text(json.dumps(wrapper))
    ours = load_target(tmp_path / "mm", "cpu", torch.float32)
    assert ours.config.checkpoint_type == "qwen3_5" and ours.config.model_type == "qwen3_5_text"
    compare_prefill_and_decode(hf, ours, steps=3)


def test_sharded_checkpoint_loads(tmp_path):
    hf = make_hf("qwen3_5_text")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    compare_prefill_and_decode(hf, load_target(tmp_path, "cpu", torch.float32), steps=2)


@pytest.mark.parametrize("kind", ["dense", "hybrid", "qwen3_next", "qwen3_moe", "qwen3_5_moe_text"])
def test_transformers_loads_our_checkpoints_with_the_same_logits(kind, tmp_path):
    ours = random_target(kind, seed=3, vocab_size=120)
    save_target(ours, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    compare_prefill_and_decode(hf, ours, steps=4)
