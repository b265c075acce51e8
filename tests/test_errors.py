"""Bad input gets a clear error naming the problem, before any heavy compute."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import workbench.models as models
from workbench.drafters.oracle import OracleDrafter, OracleSpec
from workbench.engine import GenerationConfig, generate
from workbench.models import CheckpointError, ConfigError, load_target, save_target
from workbench.random_models import random_target
from workbench.verify import NonFiniteLogitsError


@pytest.fixture()
def checkpoint(tmp_path):
    save_target(random_target("hybrid", seed=1, vocab_size=120), tmp_path)
    return tmp_path


@pytest.fixture()
def no_tensor_reads(monkeypatch):
    """Fail the test if a tensor is copied into the model: errors must come from headers alone."""

    def forbidden(*a, **k):
        raise AssertionError("tensors were read before the checkpoint was validated")

    monkeypatch.setattr(models, "load_into", forbidden)


def edit_tensors(directory, fn):
    tensors = load_file(directory / "model.safetensors")
    fn(tensors)
    save_file(tensors, directory / "model.safetensors")


def test_missing_key_is_named(checkpoint, no_tensor_reads):
    edit_tensors(checkpoint, lambda t: t.pop("model.layers.1.linear_attn.A_log"))
    with pytest.raises(CheckpointError, match=r"missing key 'model.layers.1.linear_attn.A_log' \(expected shape \[4\]\)"):
        load_target(checkpoint)


def test_extra_key_is_named(checkpoint, no_tensor_reads):
    edit_tensors(checkpoint, lambda t: t.update({"model.layers.0.surprise.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unexpected key 'model.layers.0.surprise.weight' \(shape \[3\]\)"):
        load_target(checkpoint)


def test_misshaped_tensor_names_key_and_both_shapes(checkpoint, no_tensor_reads):
    edit_tensors(checkpoint, lambda t: t.update({"model.layers.3.self_attn.q_proj.weight": torch.zeros(10, 64)}))
    with pytest.raises(CheckpointError, match=r"'model.layers.3.self_attn.q_proj.weight': checkpoint shape \[10, 64\] but the model needs \[128, 64\]"):
        load_target(checkpoint)


def test_unknown_model_type(checkpoint):
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg["model_type"] = "llama"
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="unknown model_type 'llama'"):
        load_target(checkpoint)


def test_pickles_are_never_loaded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="pickled weights are never loaded"):
        models.read_headers(tmp_path)


@pytest.fixture(scope="module")
def target():
    return random_target("hybrid", seed=2, vocab_size=120, eos_token_id=None, max_position_embeddings=64)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("budget", 0, "budget must be an integer >= 1"),
        ("budget", -3, "budget must be an integer >= 1"),
        ("temperature", -0.5, "temperature must be a finite number >= 0"),
        ("temperature", float("nan"), "temperature must be a finite number >= 0"),
        ("recurrent", "flat", "recurrent mode 'flat'"),
        ("method", "beam", "method 'beam'"),
        ("max_new_tokens", 0, "max_new_tokens must be an integer >= 1"),
    ],
)
def test_bad_generation_settings(target, field, value, message):
    with pytest.raises(ValueError, match=message):
        generate(target, [1, 2, 3], GenerationConfig(**{"method": "ar", field: value}))


def test_bad_prompts(target):
    with pytest.raises(ValueError, match="empty prompt"):
        generate(target, [], GenerationConfig(method="ar"))
    with pytest.raises(ValueError, match=r"prompt of 64 tokens does not fit the model's context of 64 positions"):
        generate(target, [1] * 64, GenerationConfig(method="ar"))
    with pytest.raises(ValueError, match=r"outside the vocabulary \(size 120\)"):
        generate(target, [1, 500], GenerationConfig(method="ar"))
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(target, [1, 2], GenerationConfig(method="ddtree"))


def test_generation_stops_at_the_context_end(target):
    trace = generate(target, [1] * 50, GenerationConfig(method="ar", max_new_tokens=40))
    assert trace.stop_reason == "context" and len(trace.generated_ids) < 40


def test_nan_logits_stop_the_run_naming_the_round(target):
    prompt = [5, 6, 7, 8]
    ref = prompt + generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=30)).generated_ids
    calls = {"n": 0}

    def poison(module, inputs, output):
        calls["n"] += 1
        if calls["n"] == 4:  # prefill, rounds 0 and 1 fine; round 2 poisoned
            output = output.clone()
            output[1, 0] = float("nan")
            return output

    handle = target.model.norm.register_forward_hook(poison)
    try:
        with pytest.raises(NonFiniteLogitsError, match=r"round 2: target logits contain NaN or inf \(rows \[1\]\)"):
            generate(target, prompt, GenerationConfig(method="ddtree", budget=8, max_new_tokens=30), OracleDrafter(ref, 120, OracleSpec(block=4)))
    finally:
        handle.remove()


def test_oracle_spec_errors():
    with pytest.raises(ValueError, match="oracle p must be in"):
        OracleSpec.parse("oracle:p=1.5")
    with pytest.raises(ValueError, match="expected key=value"):
        OracleSpec.parse("oracle:q=1")
    with pytest.raises(ValueError, match="rank='abc': not a int"):
        OracleSpec.parse("oracle:rank=abc")
