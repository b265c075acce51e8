"""The 27B-dims projection: the arithmetic on hand-made inputs, errors that name the gap, and the
committed projection file recomputes from the committed inputs it names."""

import hashlib
import json
from pathlib import Path

import pytest

from workbench.bench.project import RESULTS, main, project

E2E = {
    "device": "gpu", "date": "d", "versions": {},
    "qwen36_27b_dims": {
        "ar_step_ms": 20.0,
        "verify_ms": {"16/fork": 30.0, "16/unsafe": 31.0, "64/fork": 40.0, "256/fork": 90.0},
        "draft_ms": {"16": 5.0, "64": 5.0, "256": 5.0},
    },
}
ACC = {"pairs": {"tiny-hybrid": {"dflash": {"tau": 2.0}, "ddtree": {"16": {"tau": 3.5}, "64": {"tau": 5.4}, "128": {"tau": 5.0}}}}}


def test_projection_arithmetic_and_only_budgets_with_both_inputs():
    r = project(E2E, ACC)
    assert sorted(r["by_budget"], key=int) == ["16", "64"]  # 256 has no tau, 128 no timing
    assert r["by_budget"]["16"]["tokens_per_second"] == pytest.approx(1e3 * 3.5 / 35.0)
    assert r["by_budget"]["64"]["speedup_over_ar"] == pytest.approx((1e3 * 5.4 / 45.0) / (1e3 / 20.0))
    assert r["best_budget"] == "64" and r["ar_tokens_per_second"] == pytest.approx(50.0)
    unsafe = project(E2E, ACC, mode="unsafe")
    assert list(unsafe["by_budget"]) == ["16"] and unsafe["by_budget"]["16"]["round_ms"] == pytest.approx(36.0)


def test_pooled_tau_drives_the_projection_when_present():
    pooled = {"pairs": {"tiny-hybrid": {"dflash": {"tau": 2.0, "tau_pooled": 1.7},
                                        "ddtree": {"16": {"tau": 3.5, "tau_pooled": 3.0}, "64": {"tau": 5.4, "tau_pooled": 4.4}}}}}
    r = project(E2E, pooled)
    assert r["tau_key"] == "tau_pooled" and r["dflash_tau"] == 1.7
    assert r["by_budget"]["16"]["tokens_per_second"] == pytest.approx(1e3 * 3.0 / 35.0)
    assert project(E2E, ACC)["tau_key"] == "tau"  # older results without the pooled figure


def test_missing_parts_are_named():
    with pytest.raises(ValueError, match="qwen36_27b_dims"):
        project({"pairs": {}}, ACC)
    with pytest.raises(ValueError, match="'tiny-dense'"):
        project(E2E, ACC, pair="tiny-dense")


def test_cli_writes_atomically_and_reports_missing_files(tmp_path, capsys):
    e2e, acc, out = tmp_path / "e2e.json", tmp_path / "acc.json", tmp_path / "p.json"
    e2e.write_text(json.dumps(E2E))
    acc.write_text(json.dumps(ACC))
    assert main(["--e2e", str(e2e), "--acceptance", str(acc), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["inputs"]["e2e.json"] == hashlib.sha256(e2e.read_bytes()).hexdigest()
    assert main(["--e2e", str(tmp_path / "nope.json"), "--acceptance", str(acc), "--out", str(out)]) == 2
    assert "nope.json" in capsys.readouterr().err
    assert json.loads(out.read_text()) == written  # the failed run left the earlier file alone


def test_committed_projection_recomputes_from_its_inputs():
    committed = RESULTS / "projection-27b.json"
    if not committed.is_file():
        pytest.fail("data/results/projection-27b.json is missing (python -m workbench.bench.project)")
    saved = json.loads(committed.read_text())
    inputs = {}
    for name, sha in saved["inputs"].items():
        path = RESULTS / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha, f"{name} changed since the projection was written"
        inputs[name] = json.loads(path.read_text())
    e2e = next(v for k, v in inputs.items() if k.startswith("e2e-"))
    again = project(e2e, inputs["zoo-acceptance.json"], saved["pair"], saved["recurrent"])
    assert again["by_budget"] == saved["by_budget"]
