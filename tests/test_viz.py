"""Figures and the analyses behind them: checked against the traces they are drawn from."""

import json
import math
import subprocess
import sys

import pytest
from viz_helpers import PROMPT, session_for, trace_named, write_pair

import workbench.viz as viz
from workbench.tree import Tree


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return session_for(write_pair(tmp_path_factory.mktemp("pair")))


@pytest.fixture(scope="module")
def trace(session):
    return session.generate(PROMPT, method="ddtree", budget=12, max_new_tokens=32)


def test_engine_and_cli_import_no_viz_dependencies():
    code = ("import sys, workbench, workbench.engine, workbench.cli, workbench.batch, workbench.viz, workbench.viz.analysis, "
            "workbench.viz.params; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('plotly', 'pandas', 'papermill', 'ipywidgets', 'kaleido', 'nbformat', 'IPython')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == []


def test_tree_layout_depths_and_leaf_rows():
    #      0
    #    /   \
    #   1     2      ranks: 1 is rank 0, 2 is rank 1
    #  / \    |
    # 3   4   5
    parents, ranks = [-1, 0, 0, 1, 1, 2], [-1, 0, 1, 0, 1, 0]
    x, y = viz.tree_layout(parents, ranks)
    assert x == [0, 1, 1, 2, 2, 2]
    assert (y[3], y[4], y[5]) == (0, 1, 2)  # leaves in rank-ordered DFS order
    assert y[1] == 0.5 and y[2] == 2 and y[0] == pytest.approx((0.5 + 2) / 2)


def test_first_chain_mask():
    # node 5's parent is 2, but flat order hands it node 4's state: not exact
    assert viz.first_chain_mask([-1, 0, 1, 0, 3, 2]) == [True, True, True, False, False, False]
    assert viz.first_chain_mask([-1, 0, 1, 2, 1]) == [True, True, True, True, False]
    assert viz.first_chain_mask([-1, 0, 0, 2]) == [True, True, False, False]


def test_token_labels(session):
    tok = session.tokenizer
    assert viz.token_label(tok, ord("a")) == "a"
    assert viz.token_label(tok, ord(" ")) == "␣" and viz.token_label(tok, ord("\n")) == "⏎"
    assert viz.token_label(tok, 0x80) == "⟨128⟩"  # a lone continuation byte decodes to U+FFFD
    assert viz.token_label(tok, 300) == "⟨300⟩"  # <|unused_300|>
    assert viz.token_label(None, 7) == "⟨7⟩"


def test_pick_round_defaults_to_a_sibling_round_and_checks_range(trace):
    r = viz.pick_round(trace, -1)
    assert trace.rounds[r].through_sibling
    assert viz.pick_round(trace, 1) == 1
    with pytest.raises(ValueError, match="round_index 999 out of range"):
        viz.pick_round(trace, 999)


def test_tree_figure_matches_the_round(session, trace):
    r = viz.pick_round(trace)
    rt = trace.rounds[r]
    fig = viz.tree_figure(rt, session.tokenizer).to_plotly_json()
    nodes = trace_named(fig, "nodes")
    assert len(nodes["x"]) == rt.tree_size - 1 == 12
    assert [c[0] for c in nodes["customdata"]] == list(range(1, rt.tree_size))
    # colour = the drafter's probability of the node's token given its parent
    s, p = rt.tree["scores"], rt.tree["parents"]
    assert nodes["marker"]["color"] == pytest.approx([math.exp(s[n] - s[p[n]]) for n in range(1, rt.tree_size)])
    # the accepted path: one segment per accepted draft node, outlined markers on exactly those nodes
    path = trace_named(fig, "accepted path")
    assert sum(v is None for v in path["x"]) == len(rt.accepted) - 1
    widths = nodes["marker"]["line"]["width"]
    assert [n for n in range(1, rt.tree_size) if widths[n - 1] == 3] == rt.accepted[1:]
    bonus = trace_named(fig, "bonus")
    assert bonus["text"] == [viz.token_label(session.tokenizer, rt.bonus)]
    last = rt.accepted[-1]
    assert bonus["x"][0] > rt.tree["depths"][last]
    # hover carries the token, depth and the target's top tokens after the node
    n = rt.accepted[1] if len(rt.accepted) > 1 else 1
    hover = nodes["hovertext"][n - 1]
    top = viz.token_label(session.tokenizer, rt.target_top_tokens[n][0]).replace("<", "&lt;").replace(">", "&gt;")
    assert f"depth {rt.tree['depths'][n]}" in hover and "target's top" in hover and top in hover


def test_tree_figure_with_values_and_bad_length(session, trace):
    rt = trace.rounds[0]
    vals = [float(i) for i in range(rt.tree_size)]
    fig = viz.tree_figure(rt, session.tokenizer, values=vals, value_name="x", cmax=None)
    assert list(trace_named(fig.to_plotly_json(), "nodes")["marker"]["color"]) == vals[1:]
    with pytest.raises(ValueError, match="values has 2 entries"):
        viz.tree_figure(rt, session.tokenizer, values=[0.0, 1.0])


def test_draft_heatmap_shows_the_drafters_topk(session, trace):
    rt = trace.rounds[viz.pick_round(trace)]
    fig = viz.draft_heatmap(rt, session.tokenizer, k=6).to_plotly_json()
    heat = fig["data"][0]
    assert len(heat["z"]) == len(rt.draft_tokens) == 7 and all(len(row) == 6 for row in heat["z"])
    assert heat["z"][0][0] == pytest.approx(math.exp(rt.draft_logprobs[0][0]))
    assert heat["text"][1][2] == viz.token_label(session.tokenizer, rt.draft_tokens[1][2])
    acc = trace_named(fig, "accepted")
    expected = [(rt.tree["depths"][n], rt.tree["ranks"][n]) for n in rt.accepted[1:]]
    assert list(zip(acc["y"], acc["x"])) == expected


def test_text_figure_marks_accepted_and_bonus_tokens(session, trace):
    r = 2
    committed = viz.committed_tokens(trace, r, session.tokenizer)
    n_gen = 1 + sum(trace.rounds[i].acceptance_length for i in range(r + 1))
    assert [t.token for t in committed] == trace.prompt_ids + trace.generated_ids[:n_gen]
    assert sum(t.kind == "accepted" for t in committed) == sum(len(trace.rounds[i].accepted) - 1 for i in range(r + 1))
    fig = viz.text_figure(trace, r, session.tokenizer).to_plotly_json()
    assert len(trace_named(fig, "accepted draft")["text"]) == sum(t.kind == "accepted" for t in committed)
    assert len(trace_named(fig, "bonus (target's pick)")["text"]) == r + 2  # prefill pick + one bonus per round
    assert len(fig["layout"]["shapes"]) == trace.rounds[r].acceptance_length  # this round's tokens shaded


def test_trace_row_and_acceptance_histogram(trace):
    row = viz.trace_row(trace, prompt_index=3)
    assert row["tau"] == trace.mean_acceptance and row["budget"] == 12 and row["prompt_index"] == 3
    assert row["acceptance_lengths"] == trace.acceptance_lengths
    assert sum(row[f"{p}_seconds"] for p in ("draft", "tree", "verify", "walk", "commit")) == pytest.approx(
        sum(sum(r.timings.values()) for r in trace.rounds))
    fig = viz.acceptance_histogram({"run": trace.acceptance_lengths}).to_plotly_json()
    bars = fig["data"][0]
    assert sum(bars["y"]) == pytest.approx(1.0)
    assert sum(bars["customdata"]) == len(trace.rounds)


@pytest.fixture(scope="module")
def comparison(session, trace):
    return viz.compare_round(session.target, trace, viz.pick_round(trace))


def test_sibling_comparison_fork_is_exact_unsafe_leaks_off_the_first_chain(trace, comparison):
    c = comparison
    rt = trace.rounds[c.round_index]
    assert c.layers == [0, 1, 2] and c.size == rt.tree_size
    # the replayed committed cache reproduces the run: same logits (as recorded) and same accepted path
    assert c.trace_logprob_error < 1e-4
    assert c.accepted_fork == rt.accepted and c.bonus_fork == rt.bonus
    # fork agrees with the paths oracle, in logits and in every node's recurrent state
    assert max(c.kl_paths) < 1e-8
    assert c.max_state_div("fork") < 1e-4
    # unsafe is exact on the first chain (flattened order hands those nodes their parent) ...
    for n in range(c.size):
        if c.first_chain[n]:
            assert c.kl_unsafe[n] < 1e-8 and max(c.state_div_unsafe[n]) < 1e-5
    # ... and corrupted off it
    off = [n for n in range(c.size) if not c.first_chain[n]]
    assert off and max(c.kl_unsafe[n] for n in off) > 1e-3
    assert min(max(c.state_div_unsafe[n]) for n in off) > 1e-3
    s = c.summary()
    assert s["off_chain_nodes"] == len(off) and s["top1_flips"] == sum(c.flips)


def test_sibling_figures(session, trace, comparison):
    c = comparison
    rt = trace.rounds[c.round_index]
    kl = viz.kl_figure(c).to_plotly_json()
    assert list(trace_named(kl, "KL(fork‖unsafe)")["y"]) == pytest.approx(c.kl_unsafe)
    assert list(trace_named(kl, "top-1 flip")["x"]) == [n for n in range(c.size) if c.flips[n]]
    heat = viz.state_divergence_heatmap(c, session.tokenizer).to_plotly_json()["data"][0]
    assert len(heat["z"]) == c.size and len(heat["z"][0]) == len(c.layers) and list(heat["x"]) == ["layer 0", "layer 1", "layer 2"]
    tree = viz.corruption_tree(rt, c, session.tokenizer, "state").to_plotly_json()
    assert list(trace_named(tree, "nodes")["marker"]["color"]) == pytest.approx([max(r) for r in c.state_div_unsafe[1:]])
    with pytest.raises(ValueError, match="metric"):
        viz.corruption_tree(rt, c, session.tokenizer, "nope")


def test_compare_run_matches_compare_round(session, trace, comparison):
    run = viz.compare_run(session.target, trace)
    assert [c.round_index for c in run] == list(range(len(trace.rounds)))
    same = run[comparison.round_index]
    assert same.kl_unsafe == pytest.approx(comparison.kl_unsafe, abs=1e-9)
    assert same.accepted_unsafe == comparison.accepted_unsafe
    for c, rt in zip(run, trace.rounds):
        assert c.accepted_fork == rt.accepted  # the exact replay walks the run's own path every round
    s = viz.run_summary(run)
    assert s["rounds"] == len(trace.rounds) and s["rounds_path_changed"] == sum(c.path_changed for c in run)
    fig = viz.run_overview(run).to_plotly_json()
    assert list(trace_named(fig, "top-1 flips")["y"]) == [sum(c.flips) for c in run]


def test_compare_round_needs_a_recurrent_target(tmp_path):
    from workbench.random_models import write_random_pair
    from workbench.viz.session import open_session

    target, _ = write_random_pair(tmp_path, "dense", seed=0)
    s = open_session(str(target), "oracle", "cpu")
    t = s.generate(PROMPT, budget=4, max_new_tokens=8)
    with pytest.raises(ValueError, match="no recurrent"):
        viz.compare_round(s.target, t, 0)


def test_generation_diff_and_verdict(session):
    diff = viz.generation_diff(session, PROMPT, method="ddtree", budget=12, max_new_tokens=32)
    assert diff.identical["fork"] and diff.tokens["fork"] == diff.ar_tokens
    first = diff.first_difference["unsafe"]
    assert first is not None and diff.changed["unsafe"][0] == first
    assert diff.tokens["unsafe"][first] != diff.ar_tokens[first]
    fig = viz.generation_diff_figure(diff, session.tokenizer).to_plotly_json()
    unsafe_strip = trace_named(fig, "unsafe tokens")
    red = [i for i, c in enumerate(unsafe_strip["marker"]["color"]) if c != "#2ca02c"]
    assert red == diff.changed["unsafe"]
    text = viz.verdict({"rounds": 3, "rounds_path_changed": 2, "total_top1_flips": 5, "total_nodes": 30,
                        "max_kl_fork_unsafe": 0.5, "max_kl_fork_paths": 1e-12}, diff)
    assert text.startswith("unsafe is NOT good enough") and f"token {first}" in text


def test_benchmark_rows_and_figures(session):
    rows = viz.run_benchmark(session, [PROMPT], methods=["dflash", "ddtree"], budgets=[2, 6], recurrent_modes=["fork", "unsafe"],
                             max_new_tokens=16, progress=False)
    import pandas as pd

    df = pd.DataFrame(rows)
    # AR once, the DFlash chain once per mode, DDTree per mode and budget
    assert sorted(df["method"].value_counts().items()) == [("ar", 1), ("ddtree", 4), ("dflash", 2)]
    exact = df[(df["recurrent"] == "fork") | (df["method"] != "ddtree")]
    assert exact["identical_to_ar"].all()
    assert not df[(df["recurrent"] == "unsafe") & (df["method"] == "ddtree")]["identical_to_ar"].all()
    tau = viz.tau_vs_budget(df).to_plotly_json()
    line = trace_named(tau, "ddtree fork T=0")
    want = df[(df.method == "ddtree") & (df.recurrent == "fork")].sort_values("budget")["tau"].tolist()
    assert list(line["x"]) == [2, 6] and list(line["y"]) == pytest.approx(want)
    speed = viz.speed_vs_budget(df).to_plotly_json()
    ar = trace_named(speed, "AR T=0")
    assert ar["y"][0] == ar["y"][1] == pytest.approx(df[df.method == "ar"]["tokens_per_second"].iloc[0])
    phase = viz.phase_breakdown(df).to_plotly_json()
    total_ms = sum(t["y"][0] for t in phase["data"])  # the AR bar, stacked over phases
    ar_row = df[df.method == "ar"].iloc[0]
    assert total_ms == pytest.approx(1e3 * sum(ar_row[f"{p}_seconds"] for p in ("draft", "tree", "verify", "walk", "commit"))
                                     / ar_row["new_tokens"])
    with pytest.raises(ValueError, match="AR rows"):
        viz.speed_vs_budget(df[df.method != "ar"])
    hist = viz.acceptance_histogram(df).to_plotly_json()
    assert {a["text"] for a in hist["layout"]["annotations"]} == {"recurrent mode: fork", "recurrent mode: unsafe"}


def test_session_caches_and_validates(session):
    a = session.generate(PROMPT, budget=4, max_new_tokens=8)
    assert session.generate(PROMPT, budget=4, max_new_tokens=8) is a
    with pytest.raises(ValueError, match="unknown generation setting"):
        session.generate(PROMPT, bogus=1)
    with pytest.raises(ValueError, match="budget"):
        session.generate(PROMPT, budget=0)


def test_tree_roundtrip_used_by_the_comparison(trace):
    rt = trace.rounds[0]
    assert Tree.from_dict(rt.tree).to_dict() == rt.tree


def test_session_with_a_dflash_drafter_directory(tmp_path):
    """A real (random-weight) DFlash drafter: loaded once, lossless, and the comparison still replays."""
    from workbench.random_models import write_random_pair
    from workbench.viz.session import open_session

    target, drafter = write_random_pair(tmp_path, "hybrid", seed=2)
    s = open_session(str(target), str(drafter), "cpu")
    ar = s.generate(PROMPT, method="ar", max_new_tokens=16)
    tree = s.generate(PROMPT, method="ddtree", budget=6, max_new_tokens=16)
    chain = s.generate(PROMPT, method="dflash", max_new_tokens=16)
    assert tree.generated_ids == ar.generated_ids == chain.generated_ids
    assert s._loaded_drafter is not None and tree.settings["drafter"] == str(drafter)
    c = viz.compare_round(s.target, tree, 0)
    assert c.trace_logprob_error < 1e-4 and c.accepted_fork == tree.rounds[0].accepted


def test_random_hybrid_default_is_written_once_atomically(tmp_path, monkeypatch):
    from workbench.viz import session as sess

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    first = sess.random_hybrid_dir(0)
    assert first == tmp_path / "random-hybrid-seed0" / "target" and (first / "tokenizer.json").is_file()
    stamp = (first / "config.json").stat().st_mtime_ns
    assert sess.random_hybrid_dir(0) == first and (first / "config.json").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left
