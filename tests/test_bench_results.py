"""Which committed e2e result the figure and projection scripts read by default."""

import json

import pytest

from workbench.bench.results import has_part, newest_e2e_with


def _write(path, date, dtype="bfloat16", pairs=False, big=False, device="NVIDIA H200"):
    result = {"date": date, "device": device, "settings": {"dtype": dtype}, "pairs": {"tiny-x": {"rows": []}} if pairs else {},
              "qwen36_27b_dims": {"verify_ms": {"16/fork": 1.0}} if big else {}}
    path.write_text(json.dumps(result))
    return path


def test_newest_with_each_part_across_split_runs(tmp_path):
    old_both = _write(tmp_path / "e2e-a.json", "2026-12-01T10:00:00", pairs=True, big=True)
    big = _write(tmp_path / "e2e-b-27b.json", "2026-12-03T12:00:00", big=True)
    pairs = _write(tmp_path / "e2e-b.json", "2026-12-03T12:05:00", pairs=True)
    fp32 = _write(tmp_path / "e2e-b-fp32.json", "2026-12-03T12:10:00", dtype="float32", pairs=True)
    assert newest_e2e_with("pairs", tmp_path) == pairs  # not the later fp32 exactness run
    assert newest_e2e_with("pairs", tmp_path, dtype=None) == fp32
    assert newest_e2e_with("qwen36_27b_dims", tmp_path) == big
    big.unlink()
    assert newest_e2e_with("qwen36_27b_dims", tmp_path) == old_both
    (tmp_path / "e2e-c-truncated.json").write_text('{"date": "2026-12-04", "pairs"')  # a cut-short write
    assert newest_e2e_with("pairs", tmp_path) == pairs  # skipped, not fatal


def test_a_later_run_on_another_card_does_not_replace_the_reported_one(tmp_path):
    h200 = _write(tmp_path / "e2e-nvidia-h200-a-27b.json", "2026-12-05T16:00:00", big=True)
    h100 = _write(tmp_path / "e2e-nvidia-h100-b-27b.json", "2026-12-06T22:00:00", big=True, device="NVIDIA H100 80GB HBM3")
    assert newest_e2e_with("qwen36_27b_dims", tmp_path) == h200
    assert newest_e2e_with("qwen36_27b_dims", tmp_path, device="h100") == h100
    assert newest_e2e_with("qwen36_27b_dims", tmp_path, device=None) == h100
    assert newest_e2e_with("qwen36_27b_dims", tmp_path, device="any") == h100  # the scripts' --device any
    with pytest.raises(FileNotFoundError, match="on a device named like 'B200'"):
        newest_e2e_with("qwen36_27b_dims", tmp_path, device="B200")


def test_missing_part_and_unknown_part_name_the_problem(tmp_path):
    _write(tmp_path / "e2e-a.json", "2026-12-01", pairs=True)
    with pytest.raises(FileNotFoundError, match="qwen36_27b_dims part in bfloat16"):
        newest_e2e_with("qwen36_27b_dims", tmp_path)
    with pytest.raises(ValueError, match="unknown e2e part 'verify'"):
        has_part({}, "verify")
