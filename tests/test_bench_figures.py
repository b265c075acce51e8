"""Figures from e2e results: the traces they draw come from the JSON, and bad input names the problem."""

import json

import pytest

pytest.importorskip("plotly")

from workbench.bench import figures as bench_figures  # noqa: E402
from workbench.viz import figures as F  # noqa: E402


def _row(method, budget, mode, tps, variant="fused_norms", t=0.0):
    return {"method": method, "budget": budget, "recurrent": mode, "temperature": t, "tokens_per_second": tps,
            "mean_acceptance": 1.0 if method == "ar" else 2.0, "variant": variant}


RESULT = {
    "device": "GPU X",
    "pairs": {"tiny-x": {"rows": [_row("ar", None, "fork", 100.0), _row("dflash", None, "fork", 120.0),
                                  _row("ddtree", 8, "fork", 130.0), _row("ddtree", 16, "fork", 140.0),
                                  _row("ddtree", 8, "unsafe", 125.0), _row("ddtree", 16, "unsafe", 135.0),
                                  _row("ar", None, "fork", 50.0, variant="reference_norms")],
                         "hf_generate": {"0.0": {"tokens_per_second": 9.0}}}},
    "qwen36_27b_dims": {"verify_ms": {"16/fork": 21.0, "16/unsafe": 22.0, "64/fork": 25.0, "64/unsafe": 27.0},
                        "ar_step_ms": 19.5, "weight_read_floor_ms": 12.0},
}


def test_speed_figure_draws_the_runs_own_variant_and_the_reference_lines():
    fig = F.e2e_speed_figure(RESULT, "tiny-x")
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["ddtree fork T=0"].y) == [130.0, 140.0]
    assert list(by_name["AR T=0"].y) == [100.0, 100.0]  # not the other variant's 50
    assert list(by_name["HF generate T=0"].y) == [9.0, 9.0]
    with pytest.raises(ValueError, match="'nope' not in the e2e result"):
        F.e2e_speed_figure(RESULT, "nope")


def test_verify_cost_figure_puts_tree_tokens_on_x():
    fig = F.verify_cost_figure(RESULT)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["verify (fork)"].x) == [17, 65] and list(by_name["verify (fork)"].y) == [21.0, 25.0]
    assert list(by_name["weight-read floor"].y) == [12.0, 12.0]
    with pytest.raises(ValueError, match="no qwen36_27b_dims"):
        F.verify_cost_figure({"pairs": {}})


def test_figures_script_names_and_errors(tmp_path, capsys):
    items = bench_figures.figures_for(RESULT, "e2e-x")
    assert [name for _, name in items] == ["e2e-x-tiny-x-speed.png", "e2e-x-27b-verify.png"]
    assert bench_figures.main(["--e2e", str(tmp_path / "missing.json")]) == 2
    empty = tmp_path / "e2e-empty.json"
    empty.write_text(json.dumps({"pairs": {}}))
    assert bench_figures.main(["--e2e", str(empty), "--out-dir", str(tmp_path)]) == 2
    assert "neither pairs nor 27B-dims" in capsys.readouterr().err
