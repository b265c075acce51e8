"""`workbench batch`: grids, the combined table, failing points, --resume, and checks before any kernel."""

import json

import pandas as pd
import pytest
from viz_helpers import NOTEBOOKS, ORACLE, load_notebook, write_pair

from workbench import batch
from workbench.cli import main

EXPLORER = NOTEBOOKS / "01_tree_explorer.ipynb"
# a 32-position target: the long prompt below does not fit, so that point fails inside its kernel
LONG = "x" * 40
PROMPTS = ["def a():\n", "def b():\n", LONG, "class C:\n"]


@pytest.fixture(scope="module")
def small_target(tmp_path_factory):
    return str(write_pair(tmp_path_factory.mktemp("pair"), max_position_embeddings=32))


def argv(out, target, *extra):
    return ["batch", str(EXPLORER), "--out", str(out), "-p", "target", target, "-p", "drafter", ORACLE,
            "-p", "max_new_tokens", "8", "-p", "budget", "4", "-p", "export_formats", "", "-p", "interactive", "false",
            "--quiet", *extra]


def test_grid_with_a_failing_point_then_resume(tmp_path, small_target, capsys):
    out = tmp_path / "grid"
    grid = ["--grid", "prompt=" + json.dumps(PROMPTS)]
    assert main(argv(out, small_target, *grid)) == 1  # one point failed: non-zero, the others still ran
    err = capsys.readouterr().err
    assert "3 ok, 1 failed" in err and "does not fit the model's context" in err

    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 4
    ok, bad = table[table.status == "ok"], table[table.status == "error"]
    assert len(ok) == 3 and len(bad) == 1
    assert list(ok["param_prompt"]) == [p for p in PROMPTS if p != LONG]
    assert bad["param_prompt"].iloc[0] == LONG and "does not fit the model's context of 32" in bad["error"].iloc[0]
    assert ok["tau"].notna().all() and ok["new_tokens"].eq(8).all() and bad["tau"].isna().all()
    assert ok["param_budget"].eq(4).all()  # fixed values are recorded on every row
    csv = pd.read_csv(out / "results.csv")
    assert len(csv) == 4 and (csv["status"] == "error").sum() == 1

    points = {p["id"]: p for p in json.loads((out / "batch.json").read_text())["points"]}
    assert sorted(p["status"] for p in points.values()) == ["error", "ok", "ok", "ok"]
    for pid, p in points.items():
        d = out / "points" / pid
        nb = load_notebook(d / "notebook.ipynb")  # kept for failed points too (the traceback is in it)
        assert any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
        assert json.loads((d / "status.json").read_text())["status"] == p["status"]
    failed_id = next(pid for pid, p in points.items() if p["status"] == "error")
    mtimes = {pid: (out / "points" / pid / "notebook.ipynb").stat().st_mtime_ns for pid in points}

    (out / "points" / failed_id / "stale.png").write_bytes(b"left over")  # a rerun must start clean
    assert main(argv(out, small_target, *grid, "--resume")) == 1
    assert not (out / "points" / failed_id / "stale.png").exists()
    err = capsys.readouterr().err
    assert "0 ok, 1 failed, 3 skipped" in err
    for pid in points:
        attempts = json.loads((out / "points" / pid / "attempts.json").read_text())["attempts"]
        now = (out / "points" / pid / "notebook.ipynb").stat().st_mtime_ns
        if pid == failed_id:
            assert attempts == 2 and now != mtimes[pid]
        else:
            assert attempts == 1 and now == mtimes[pid]
    assert len(pd.read_parquet(out / "results.parquet")) == 4


def test_resume_reruns_a_point_whose_fixed_values_changed(tmp_path, small_target, capsys):
    out = tmp_path / "grid"
    assert main(argv(out, small_target, "--grid", "recurrent=fork")) == 0
    (pid,) = [p.name for p in (out / "points").iterdir()]
    assert main(argv(out, small_target, "--grid", "recurrent=fork", "--resume")) == 0
    assert json.loads((out / "points" / pid / "attempts.json").read_text())["attempts"] == 1
    changed = [a if a != "8" else "6" for a in argv(out, small_target, "--grid", "recurrent=fork", "--resume")]
    assert main(changed) == 0
    assert json.loads((out / "points" / pid / "attempts.json").read_text())["attempts"] == 2
    assert pd.read_parquet(out / "results.parquet")["new_tokens"].tolist() == [6]
    capsys.readouterr()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["-p", "budjet", "4"], "parameter 'budjet': unknown parameter for 01_tree_explorer.ipynb"),
        (["-p", "temperature", "warm"], "parameter 'temperature': expected a float, got 'warm'"),
        (["-p", "max_new_tokens", "1.5"], "parameter 'max_new_tokens': expected an int"),
        (["-p", "interactive", "maybe"], "parameter 'interactive': expected a bool"),
        (["--grid", "budget=4,0,8"], "parameter 'budget': must be an integer >= 1, got 0"),
        (["--grid", "temperature=0,-1"], "parameter 'temperature': must be a finite number >= 0"),
        (["--grid", "method=ddtree,beam"], "parameter 'method': 'beam' is not one of ar, dflash, ddtree"),
        (["--grid", "recurrent=fork,leaky"], "parameter 'recurrent': 'leaky' is not one of"),
        (["-p", "drafter", "oracle:p=3"], "parameter 'drafter': oracle p must be in [0, 1]"),
        (["-p", "target", "/no/such/model"], "parameter 'target': '/no/such/model' is neither a directory"),
        (["-p", "out_dir", "/tmp/x"], "parameter 'out_dir': is set by workbench batch"),
        (["--grid", "budget=4", "--grid", "budget=8"], "parameter 'budget': given twice with --grid"),
        (["--grid", "budgetless"], "expected NAME=V1,V2"),
    ],
)
def test_bad_parameters_fail_before_any_kernel_starts(tmp_path, capsys, monkeypatch, extra, message):
    import papermill

    def no_kernel(*a, **k):
        raise AssertionError("a kernel was started for bad parameters")

    monkeypatch.setattr(papermill, "execute_notebook", no_kernel)
    base = ["batch", str(EXPLORER), "--out", str(tmp_path / "o"), "--quiet"]
    assert main(base + extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing written either


def test_benchmark_notebook_grid_over_a_list_parameter(tmp_path):
    nb = NOTEBOOKS / "03_benchmark.ipynb"
    from workbench.viz.params import read_parameters

    params = read_parameters(nb)
    grid, fixed = batch.parse_cli(params, ["recurrent_modes=fork,unsafe", "temperatures=0,0.5"], [("budgets", "2,4,8")], nb.name)
    assert grid == {"recurrent_modes": [["fork"], ["unsafe"]], "temperatures": [[0.0], [0.5]]}
    assert fixed == {"budgets": [2, 4, 8]}
    _, points = batch.plan(nb, tmp_path, grid, fixed)
    assert [p.values for p in points] == [
        {"budgets": [2, 4, 8], "recurrent_modes": [m], "temperatures": [t]} for m in ("fork", "unsafe") for t in (0.0, 0.5)
    ]
    assert len({p.id for p in points}) == 4 and points[0].id.startswith("recurrent_modes-fork_temperatures-0.0-")
    _, again = batch.plan(nb, tmp_path, grid, fixed)
    assert [p.id for p in again] == [p.id for p in points]  # stable ids: what --resume relies on
    with pytest.raises(ValueError, match="parameter 'budgets': element 0"):
        batch.plan(nb, tmp_path, {}, {"budgets": [0]})
    with pytest.raises(ValueError, match="parameter 'budgets': must not be empty"):
        batch.plan(nb, tmp_path, {}, batch.parse_cli(params, [], [("budgets", "")], nb.name)[1])


def test_list_prints_points(tmp_path, capsys):
    assert main(["batch", str(EXPLORER), "--out", str(tmp_path), "--grid", "budget=2,4", "--grid", "method=dflash,ddtree",
                 "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and json.loads(lines[0].split("\t")[1]) == {"budget": 2, "method": "dflash"}


def test_combined_table_survives_columns_whose_types_differ_between_points(tmp_path):
    from workbench.viz.notebook import write_tables

    parquet, csv = write_tables([{"x": 1, "y": [1, 2]}, {"x": "one", "y": None}, {"x": None, "y": [3]}], tmp_path / "t")
    table = pd.read_parquet(parquet)
    assert list(table["x"].iloc[:2]) == ["1", "one"] and list(table["y"].iloc[2]) == [3]
    assert len(pd.read_csv(csv)) == 3
