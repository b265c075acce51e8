"""The three notebooks under plain papermill with small parameters: the figures and numbers they
show, the files they write, and how they are committed."""

import json

import pandas as pd
import pytest
from viz_helpers import (
    NOTEBOOKS,
    ORACLE,
    decode_png,
    errors,
    export_formats,
    figures,
    load_notebook,
    numbers,
    outputs,
    run_notebook,
    trace_named,
    write_pair,
)

NAMES = ["01_tree_explorer", "02_sibling_states", "03_benchmark"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return str(write_pair(tmp_path_factory.mktemp("pair")))


@pytest.mark.parametrize("name", NAMES)
def test_committed_without_outputs_with_typed_parameters(name):
    import nbformat
    from papermill.inspection import inspect_notebook

    from workbench.viz.params import read_parameters

    path = NOTEBOOKS / f"{name}.ipynb"
    nbformat.validate(nbformat.read(path, as_version=4))
    nb = load_notebook(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, "notebooks are committed without outputs"
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    ours = read_parameters(path)
    theirs = inspect_notebook(str(path))
    assert list(ours) == list(theirs), "papermill and workbench batch must read the same parameters"
    src = "".join(tagged[0]["source"])
    for p in ours.values():
        assert f"{p.name}: " in src and p.help, f"{p.name} needs a type annotation and a comment"
        assert theirs[p.name]["inferred_type_name"] in (p.type, f"list[{p.element}]")
    assert {"out_dir", "export_formats", "target", "drafter", "device"} <= set(ours)


def test_tree_explorer_on_the_bundled_default(tmp_path, monkeypatch):
    """target/drafter left empty: the zoo pair if present, else a random hybrid written on the fly."""
    from workbench.viz.session import zoo_available

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))  # the kernel inherits it
    fmts = export_formats()
    out = tmp_path / "point"
    nb = run_notebook("01_tree_explorer", tmp_path, budget=8, max_new_tokens=24, out_dir=str(out), export_formats=fmts)
    assert errors(nb) == []
    num = numbers(nb)["generation"]
    if zoo_available():
        assert "zoo" in num["models"] and num["random_weights"] is False
    else:
        assert "RANDOM-WEIGHT" in num["models"] and num["random_weights"] is True
        assert (tmp_path / "cache" / "random-hybrid-seed0" / "target" / "config.json").is_file()
    figs = figures(nb)
    assert set(figs) == {"acceptance", "draft_heatmap", "tree", "text"}
    r, accepted = num["round"], num["round_accepted"]
    assert num["round_tree_nodes"] == 9
    # the tree: 8 draft nodes, the accepted ones outlined, the bonus star
    nodes = trace_named(figs["tree"], "nodes")
    assert len(nodes["x"]) == 8
    assert [c[0] for c, w in zip(nodes["customdata"], nodes["marker"]["line"]["width"]) if w == 3] == accepted[1:]
    assert len(trace_named(figs["tree"], "bonus")["x"]) == 1
    assert figs["tree"]["layout"]["title"]["text"].startswith(f"Round {r}:")
    # the drafter's top-k: depths x 8 ranks, probabilities in [0, 1]
    z = figs["draft_heatmap"]["data"][0]["z"]
    assert len(z[0]) == 8 and all(0 <= v <= 1 for row in z for v in row)
    assert len(figs["text"]["layout"]["shapes"]) == len(accepted)  # this round's committed tokens shaded
    bars = [t for t in figs["acceptance"]["data"] if t["type"] == "bar"]
    assert sum(len(t["x"]) for t in bars) == num["rounds"]
    assert sum(sum(t["y"]) for t in bars) / num["rounds"] == pytest.approx(num["tau"])
    # the interactive explorer is there for a live kernel
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for _, o in outputs(nb))
    # what batch collects
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert len(rows) == 1 and rows[0]["tau"] == pytest.approx(num["tau"]) and rows[0]["round_shown"] == r
    for name in figs if fmts else []:
        w, h = decode_png(out / "figures" / f"{name}.png")
        assert w > 300 and h > 150


def test_sibling_states_answers_the_question(tmp_path, target):
    out = tmp_path / "point"
    nb = run_notebook("02_sibling_states", tmp_path, target=target, drafter=ORACLE, budget=8, max_new_tokens=24,
                      out_dir=str(out), export_formats=export_formats(), interactive=False)
    assert errors(nb) == []
    num = numbers(nb)
    rnd, run, diff, verdict = num["round"], num["run"], num["generation_diff"], num["verdict"]
    # fork is exact (vs the paths oracle), unsafe is exact on the first chain and wrong off it
    assert rnd["max_kl_fork_paths"] < 1e-8 and rnd["max_state_div_fork"] < 1e-4
    assert rnd["max_kl_unsafe_first_chain"] < 1e-8
    assert rnd["off_chain_nodes"] > 0 and rnd["mean_kl_unsafe_off_chain"] > 1e-4
    assert rnd["replay_vs_trace_logprob_error"] < 1e-4
    assert run["rounds"] >= 2 and run["max_kl_fork_paths"] < 1e-8
    assert diff["identical_to_ar"] == {"fork": True, "unsafe": False}
    assert verdict["unsafe_good_enough"] is False and verdict["verdict"].startswith("unsafe is NOT good enough")
    figs = figures(nb)
    assert set(figs) == {"corruption_tree", "kl_per_node", "state_divergence", "run_overview", "generation_diff"}
    kl = trace_named(figs["kl_per_node"], "KL(fork‖unsafe)")["y"]
    assert len(kl) == rnd["nodes"] == 9 and max(kl) == pytest.approx(rnd["max_kl_fork_unsafe"])
    assert len(trace_named(figs["kl_per_node"], "top-1 flip")["x"]) == rnd["top1_flips"]
    heat = figs["state_divergence"]["data"][0]
    assert len(heat["z"]) == 9 and len(heat["z"][0]) == 3
    assert max(v for row in heat["z"] for v in row) == pytest.approx(rnd["max_state_div_unsafe"])
    tree_colours = trace_named(figs["corruption_tree"], "nodes")["marker"]["color"]
    assert tree_colours == pytest.approx(kl[1:])  # coloured by KL, node for node
    overview = trace_named(figs["run_overview"], "top-1 flips")["y"]
    assert len(overview) == run["rounds"] and sum(overview) == run["total_top1_flips"]
    nodes = pd.read_parquet(out / "nodes.parquet")
    assert len(nodes) == run["total_nodes"] and {"kl_fork_unsafe", "state_div_layer0", "top1_flip"} <= set(nodes.columns)
    row = json.loads((out / "results.json").read_text())["rows"][0]
    assert row["unsafe_good_enough"] is False and row["fork_identical_to_ar"] is True
    assert row["unsafe_first_difference"] == diff["first_difference"]["unsafe"]


def test_benchmark_grid_table_and_figures(tmp_path, target):
    out = tmp_path / "point"
    fmts = export_formats()
    nb = run_notebook("03_benchmark", tmp_path, target=target, drafter=ORACLE, n_prompts=1, budgets=[2, 4],
                      recurrent_modes=["fork", "unsafe"], max_new_tokens=16, out_dir=str(out), export_formats=fmts)
    assert errors(nb) == []
    num = numbers(nb)["benchmark"]
    assert num["rows"] == 7  # AR + DFlash x 2 modes + DDTree x 2 modes x 2 budgets
    assert num["exact_modes_lossless"] is True and num["unsafe_identical_fraction"] < 1
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 7 and set(table["method"]) == {"ar", "dflash", "ddtree"}
    assert table[table.recurrent == "fork"]["identical_to_ar"].all()
    figs = figures(nb)
    assert set(figs) == {"acceptance_histogram", "tau_vs_budget", "tokens_per_second_vs_budget", "phase_breakdown"}
    fork = table[(table.method == "ddtree") & (table.recurrent == "fork")].sort_values("budget")
    line = trace_named(figs["tau_vs_budget"], "ddtree fork T=0")
    assert list(line["x"]) == [2, 4] and list(line["y"]) == pytest.approx(fork["tau"].tolist())
    ar = trace_named(figs["tokens_per_second_vs_budget"], "AR T=0")
    assert ar["y"][0] == pytest.approx(table[table.method == "ar"]["tokens_per_second"].iloc[0])
    phases = {t["name"] for t in figs["phase_breakdown"]["data"]}
    assert phases == {"draft", "tree", "verify", "walk", "commit"}
    hist = figs["acceptance_histogram"]["data"]
    assert all(sum(t["y"]) == pytest.approx(1.0) for t in hist)
    csv = pd.read_csv(out / "results.csv")
    assert len(csv) == 7 and json.loads(csv["acceptance_lengths"].iloc[1])  # list cells as JSON text
    for name in figs if fmts else []:
        decode_png(out / "figures" / f"{name}.png")


def test_plain_papermill_gets_the_parameter_checks(tmp_path):
    import papermill
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError) as info:
        papermill.execute_notebook(str(NOTEBOOKS / "01_tree_explorer.ipynb"), str(tmp_path / "bad.ipynb"),
                                   parameters={"budget": 0}, progress_bar=False, cwd=str(tmp_path))
    assert "parameter 'budget': must be an integer >= 1" in str(info.value)
    nb = load_notebook(tmp_path / "bad.ipynb")
    failed = [i for i, c in enumerate(nb["cells"]) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert failed and "check_parameters" in "".join(nb["cells"][failed[0]]["source"])  # before any model is loaded
