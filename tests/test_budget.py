"""--budget auto: a committed measurement wins; otherwise a calibration picks the fastest."""

import hashlib
import json

from workbench.budget import calibrate_budget, measured_best_budget
from workbench.drafters.oracle import OracleDrafter, OracleSpec
from workbench.engine import GenerationConfig, generate
from workbench.random_models import random_target


def test_measured_results_pick_the_fastest_budget(tmp_path):
    target = random_target("hybrid", seed=1, vocab_size=200)
    target.source_directory = str(tmp_path / "tiny-x")
    rows = [{"method": "ddtree", "recurrent": "fork", "temperature": 0.0, "budget": b, "tokens_per_second": tps}
            for b, tps in ((8, 100.0), (32, 180.0), (64, 150.0))]
    rows.append({"method": "ddtree", "recurrent": "unsafe", "temperature": 0.0, "budget": 128, "tokens_per_second": 999.0})
    (tmp_path / "e2e-cpu-x.json").write_text(json.dumps({"device": "cpu", "pairs": {"tiny-x": {"rows": rows}}}))
    best, info = measured_best_budget(target, results_dir=tmp_path)
    assert best == 32 and info["table"][64] == 150.0
    (tmp_path / "e2e-cpu-x.json").write_text(json.dumps({"device": "NVIDIA H200", "pairs": {"tiny-x": {"rows": rows}}}))
    assert measured_best_budget(target, results_dir=tmp_path) is None  # another device's numbers do not apply
    other_dtype = {"device": "cpu", "settings": {"dtype": "bfloat16"}, "pairs": {"tiny-x": {"rows": rows}}}
    (tmp_path / "e2e-cpu-x.json").write_text(json.dumps(other_dtype))
    assert str(target.dtype) == "torch.float32"
    assert measured_best_budget(target, results_dir=tmp_path) is None  # nor another dtype's
    other_dtype["settings"]["dtype"] = "float32"
    (tmp_path / "e2e-cpu-x.json").write_text(json.dumps(other_dtype))
    assert measured_best_budget(target, results_dir=tmp_path)[0] == 32
    # rows of the other fused-norm setting are not this run's (the CPU runs the torch chains)
    other_dtype["pairs"]["tiny-x"]["rows"] = rows + [dict(rows[0], budget=16, tokens_per_second=500.0, variant="fused_norms")]
    (tmp_path / "e2e-cpu-x.json").write_text(json.dumps(other_dtype))
    best, info = measured_best_budget(target, results_dir=tmp_path)
    assert best == 32 and 16 not in info["table"]


def test_a_measurement_of_other_model_files_is_stale(tmp_path):
    target = random_target("hybrid", seed=1, vocab_size=200)
    model_dir = tmp_path / "tiny-x"
    model_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"weights v1")
    target.source_directory = str(model_dir)
    rows = [{"method": "ddtree", "recurrent": "fork", "temperature": 0.0, "budget": 16, "tokens_per_second": 10.0}]
    sha_v1 = hashlib.sha256(b"weights v1").hexdigest()
    result = {"device": "cpu", "pairs": {"tiny-x": {"rows": rows, "model_sha256": {"tiny-x/model.safetensors": sha_v1}}}}
    (tmp_path / "e2e-cpu-x.json").write_text(json.dumps(result))
    assert measured_best_budget(target, results_dir=tmp_path)[0] == 16
    (model_dir / "model.safetensors").write_bytes(b"weights v2")  # retrained since the measurement
    assert measured_best_budget(target, results_dir=tmp_path) is None
    # the run-level record (older result files) is read the same way
    del result["pairs"]["tiny-x"]["model_sha256"]
    result["models_measured"] = {"note": "text", "tiny-x/model.safetensors": sha_v1}
    (tmp_path / "e2e-cpu-x.json").write_text(json.dumps(result))
    assert measured_best_budget(target, results_dir=tmp_path) is None
    (model_dir / "model.safetensors").write_bytes(b"weights v1")
    assert measured_best_budget(target, results_dir=tmp_path)[0] == 16


def test_calibration_times_every_candidate():
    target = random_target("hybrid", seed=2, vocab_size=200, eos_token_id=None)
    prompt = [1, 2, 3, 4, 5]
    ref = prompt + generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=40)).generated_ids
    best, info = calibrate_budget(target, OracleDrafter(ref, 200, OracleSpec(block=6)), prompt, GenerationConfig(), candidates=(4, 16), tokens=16)
    assert set(info["table"]) == {4, 16} and best in (4, 16) and all(v > 0 for v in info["table"].values())


def test_the_newest_dated_measurement_wins_over_name_order(tmp_path):
    target = random_target("hybrid", seed=1, vocab_size=200)
    target.source_directory = str(tmp_path / "tiny-x")

    def result(date, best):
        rows = [{"method": "ddtree", "recurrent": "fork", "temperature": 0.0, "budget": b, "tokens_per_second": 200.0 if b == best else 100.0}
                for b in (8, 16, 32)]
        return json.dumps({"device": "cpu", "date": date, "pairs": {"tiny-x": {"rows": rows}}})

    # "e2e-b.json" sorts after "e2e-b-late.json" by name, yet was measured earlier
    (tmp_path / "e2e-b.json").write_text(result("2026-12-03T10:00:00", 8))
    (tmp_path / "e2e-b-late.json").write_text(result("2026-12-03T12:00:00", 16))
    best, info = measured_best_budget(target, results_dir=tmp_path)
    assert best == 16 and info["source"].endswith("e2e-b-late.json")
