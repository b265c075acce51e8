"""The `make demo` tour (workbench.demo.run_demo) on small parameters: what it leaves, and that it
exits non-zero when the tour fails."""

import json

import pandas as pd
import pytest
from viz_helpers import decode_png, export_formats

from workbench import demo

SMALL_TOUR = [
    ("explorer", "01_tree_explorer.ipynb", {}, {"interactive": False, "max_new_tokens": 12, "budget": 4}),
    ("sibling_states", "02_sibling_states.ipynb", {}, {"interactive": False, "max_new_tokens": 12, "budget": 4}),
    ("benchmark", "03_benchmark.ipynb", {"recurrent_modes": [["fork"], ["unsafe"]]},
     {"budgets": [2, 4], "n_prompts": 1, "max_new_tokens": 12}),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))


def test_the_tour_leaves_notebooks_tables_and_pngs(tmp_path, monkeypatch, capsys):
    if not export_formats():
        pytest.skip("no chromium: the tour exports PNG figures")
    monkeypatch.setattr(demo, "TOUR", SMALL_TOUR)
    out = tmp_path / "demo"
    assert demo.run_demo(out, quiet=True) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["problems"] == []
    assert summary["numbers"]["fork_lossless"] is True
    for step in ("explorer", "sibling_states", "benchmark"):
        assert list((out / step / "points").glob("*/notebook.ipynb"))
        table = pd.read_parquet(out / step / "results.parquet")
        assert (table["status"] == "ok").all()
        for png in (out / step / "points").glob("*/figures/*.png"):
            decode_png(png)
    assert len(pd.read_parquet(out / "benchmark" / "results.parquet")) == 2 * 4  # 2 points x (AR + DFlash chain + DDTree x 2 budgets), 1 prompt
    grid = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert grid == ["acceptance_histogram.png", "phase_breakdown.png", "tau_vs_budget.png", "tokens_per_second_vs_budget.png"]
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["ok"] is True and line["fork_lossless"] is True


def test_a_failing_tour_exits_non_zero(tmp_path, monkeypatch):
    if not export_formats():
        pytest.skip("no chromium")
    # a directory passes the up-front check (it exists) but holds no model: the point fails in its kernel
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    bad = [("explorer", "01_tree_explorer.ipynb", {}, {"interactive": False, "max_new_tokens": 4, "target": str(empty)})]
    monkeypatch.setattr(demo, "TOUR", bad)
    out = tmp_path / "demo"
    assert demo.run_demo(out, quiet=True) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["ok"]
    assert any(p.startswith("explorer/") and "config.json" in p for p in summary["problems"]), summary["problems"]


def test_no_browser_is_reported(tmp_path, monkeypatch, capsys):
    from workbench.viz import export

    monkeypatch.setattr(export, "chromium_path", lambda: None)
    assert demo.run_demo(tmp_path / "demo") == 1
    assert "install-chromium.sh" in capsys.readouterr().err
