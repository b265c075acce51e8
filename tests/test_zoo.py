"""The bundled zoo (data/zoo): every file as its card records it, size limits, HF / z-lab layouts,
transformers loads the targets with the same logits, and each pair drafts losslessly with real acceptance."""

import json
import math
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

from workbench.engine import GenerationConfig, generate
from workbench.prompts import humaneval_prompts
from workbench.runner import DEFAULT_DRAFTER, DEFAULT_TARGET, ZOO_DIR, load_dflash_drafter, load_target_and_tokenizer, resolve_model_dir
from workbench.train.common import sha256_file
from workbench.train.export import check_card

PAIRS = {"tiny-hybrid": "tiny-hybrid-dflash", "tiny-dense": "tiny-dense-dflash"}
MODELS = [*PAIRS, *PAIRS.values()]
MiB = 2**20
RESULTS = Path(__file__).resolve().parent.parent / "data" / "results" / "zoo-acceptance.json"


def test_every_file_matches_its_card_and_the_size_limits():
    total = 0
    for name in MODELS:
        card = check_card(ZOO_DIR / name)  # sha256 and size of every file, nothing unlisted
        for f, meta in card["files"].items():
            assert meta["bytes"] <= 15 * MiB, f"{name}/{f} is {meta['bytes'] / MiB:.1f} MiB"
        for key in ("data", "steps", "final_train_loss", "date", "interpreter", "device", "tokens_seen"):
            assert card.get(key) is not None, f"{name}: card lacks {key}"
        assert card["steps"] > 0 and math.isfinite(card["final_train_loss"])
    total = sum(p.stat().st_size for p in ZOO_DIR.rglob("*") if p.is_file())
    assert total <= 44 * MiB, f"the zoo is {total / MiB:.2f} MiB"


@pytest.mark.parametrize("name, model_type", [("tiny-hybrid", "qwen3_5_text"), ("tiny-dense", "qwen3")])
def test_targets_are_bf16_hf_checkpoints_transformers_loads_with_the_same_logits(name, model_type):
    d = ZOO_DIR / name
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == model_type and cfg["dtype"] == "bfloat16"
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == cfg["eos_token_id"]
    assert (d / "tokenizer.json").is_file() and (d / "tokenizer_config.json").is_file()
    for shard in d.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            assert all(f.get_slice(k).get_dtype() == "BF16" for k in f.keys())
    if model_type == "qwen3_5_text":
        assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    card = check_card(d)
    assert 9e6 <= card["parameters"] <= 20e6 and math.isfinite(card["heldout_loss"])
    ours, tokenizer = load_target_and_tokenizer(name, "cpu", "float32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    assert sum(p.numel() for p in ours.parameters()) == card["parameters"]
    ids = tokenizer.encode(humaneval_prompts()[0])[:96]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
        got = ours.run_chain(ids, ours.new_cache(len(ids) + 4)).logits
    assert (ref - got).abs().max() < 1e-3 * max(1.0, ref.abs().max().item() / 10)
    assert torch.equal(ref.argmax(-1), got.argmax(-1))


@pytest.mark.parametrize("target, drafter", PAIRS.items())
def test_drafters_are_z_lab_checkpoints_that_fit_their_target(target, drafter):
    cfg = json.loads((ZOO_DIR / drafter / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3" and cfg["block_size"] == 16
    assert set(cfg["dflash_config"]) == {"mask_token_id", "target_layer_ids"} and 1 <= cfg["num_hidden_layers"] <= 2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ZOO_DIR / target / "tokenizer.json"))
    assert cfg["dflash_config"]["mask_token_id"] == tok.token_to_id("<|mask|>")
    card = check_card(ZOO_DIR / drafter)
    assert card["target"] == target and card["target_layer_ids"] == cfg["dflash_config"]["target_layer_ids"]


@pytest.mark.parametrize("target_name, drafter_name", PAIRS.items())
def test_each_pair_drafts_losslessly_with_real_acceptance(target_name, drafter_name):
    target, tokenizer = load_target_and_tokenizer(target_name, "cpu", "float32")  # names resolve to the zoo
    drafter = load_dflash_drafter(drafter_name, target)
    ids = tokenizer.encode(humaneval_prompts()[2])
    base = dict(max_new_tokens=40, temperature=0.0, trace_topk=0)
    ar = generate(target, ids, GenerationConfig(method="ar", **base))
    tree = generate(target, ids, GenerationConfig(method="ddtree", budget=32, **base), drafter)
    chain = generate(target, ids, GenerationConfig(method="dflash", **base), drafter)
    assert tree.generated_ids == ar.generated_ids and chain.generated_ids == ar.generated_ids
    # a random drafter accepts ~nothing (tau ~ 1.0); the trained one must do clearly better
    assert tree.mean_acceptance > 1.3 and chain.mean_acceptance > 1.0


def test_default_names_are_the_bundled_hybrid_pair():
    assert resolve_model_dir(DEFAULT_TARGET) == ZOO_DIR / "tiny-hybrid"
    assert resolve_model_dir(DEFAULT_DRAFTER) == ZOO_DIR / "tiny-hybrid-dflash"


def test_committed_measurements_belong_to_the_committed_models():
    res = json.loads(RESULTS.read_text())
    assert res["settings"]["n"] == 164 and res["settings"]["max_new_tokens"] == 128 and res["settings"]["temperature"] == 0
    for target, drafter in PAIRS.items():
        r = res["pairs"][target]
        assert r["target_card_sha256"] == sha256_file(ZOO_DIR / target / "card.json")
        assert r["drafter_card_sha256"] == sha256_file(ZOO_DIR / drafter / "card.json")
        assert sorted(int(b) for b in r["ddtree"]) == [8, 16, 32, 64, 128]
        for row in [r["dflash"], *r["ddtree"].values()]:
            assert row["prompts"] == 164 and row["identical_to_ar"] == 164 and row["tau"] >= 1.0
    audit = res["pairs"]["tiny-hybrid"]["audit"]
    assert audit["fork"]["identical"] == audit["fork"]["prompts"] == 164
    assert audit["unsafe"]["divergent_count"] == 164 - audit["unsafe"]["identical"]
