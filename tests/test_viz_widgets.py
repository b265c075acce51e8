"""Widget behaviour, headless: setting a control's value updates the figures and the Output widgets."""

import pytest
from viz_helpers import PROMPT, session_for, trace_named, write_pair

import workbench.viz as viz

PLOTLY = "application/vnd.plotly.v1+json"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return session_for(write_pair(tmp_path_factory.mktemp("pair")))


def shown(output) -> dict:
    """The figure an Output widget currently holds (what the browser renders)."""
    (out,) = output.outputs
    return out["data"][PLOTLY]


def node_tokens(fig: dict) -> list[int]:
    return [c[1] for c in trace_named(fig, "nodes")["customdata"]]


@pytest.fixture
def widget(session):
    explorer = viz.TreeExplorer(session, PROMPT, budget=8, max_new_tokens=24, round_index=0)
    return viz.ExplorerWidget(explorer, prompts=["class Stack:\n"])


def test_round_slider_updates_the_tree_heatmap_and_text(widget):
    trace = widget.explorer.trace
    assert widget.round_slider.max == len(trace.rounds) - 1 >= 2
    before = shown(widget.outputs["tree"])
    assert node_tokens(before) == trace.rounds[0].tree["tokens"][1:]
    widget.round_slider.value = 2
    after = shown(widget.outputs["tree"])
    rt = trace.rounds[2]
    assert node_tokens(after) == rt.tree["tokens"][1:] and node_tokens(after) != node_tokens(before)
    assert after["layout"]["title"]["text"].startswith("Round 2")
    heat = shown(widget.outputs["draft"])["data"][0]
    assert heat["z"][0][0] == pytest.approx(2.718281828 ** rt.draft_logprobs[0][0])
    text = shown(widget.outputs["text"])
    assert len(text["layout"]["shapes"]) == rt.acceptance_length
    assert widget.figures["tree"].layout.title.text == after["layout"]["title"]["text"]
    assert widget.status.value.startswith(f"round 2 of 0–{len(trace.rounds) - 1}")


def test_budget_regenerates_and_clamps_the_round(widget):
    widget.round_slider.value = widget.round_slider.max
    widget.budget.value = 2
    trace = widget.explorer.trace
    assert trace.settings["budget"] == 2
    assert widget.round_slider.max == len(trace.rounds) - 1
    assert widget.round_slider.value <= widget.round_slider.max
    fig = shown(widget.outputs["tree"])
    assert len(trace_named(fig, "nodes")["x"]) == 2  # a 2-node budget tree
    assert node_tokens(fig) == trace.rounds[widget.round_slider.value].tree["tokens"][1:]


def test_method_recurrent_temperature_and_prompt_controls(widget, session):
    widget.method.value = "dflash"
    fig = shown(widget.outputs["tree"])
    parents = widget.explorer.round().tree["parents"]
    assert parents == list(range(-1, len(parents) - 1))  # a chain
    assert len(trace_named(fig, "nodes")["x"]) == 7
    widget.method.value = "ar"
    assert len(trace_named(shown(widget.outputs["tree"]), "nodes")["x"]) == 0
    assert "no draft" in shown(widget.outputs["draft"])["layout"]["title"]["text"]
    widget.method.value = "ddtree"
    widget.recurrent.value = "unsafe"
    assert widget.explorer.trace.settings["recurrent"] == "unsafe"
    widget.temperature.value = 0.7
    assert widget.explorer.trace.settings["temperature"] == pytest.approx(0.7)
    widget.prompt.value = "class Stack:\n"
    trace = widget.explorer.trace
    assert trace.prompt_ids == session.encode("class Stack:\n")
    text = shown(widget.outputs["text"])
    prompt_chars = "".join(trace_named(text, "prompt")["text"])
    assert prompt_chars.startswith("class␣Stack:")


def test_explorer_state_rejects_bad_settings(session):
    e = viz.TreeExplorer(session, PROMPT, budget=4, max_new_tokens=12)
    with pytest.raises(ValueError, match="budget"):
        e.set(budget=0)
    with pytest.raises(ValueError, match="out of range"):
        e.set(round_index=10_000)
    with pytest.raises(ValueError, match="unknown setting"):
        e.set(colour="red")
    assert e.settings["budget"] == 4  # nothing changed by the failed calls


def test_sibling_widget_round_and_colour(session):
    trace = session.generate(PROMPT, budget=8, max_new_tokens=24)
    w = viz.SiblingWidget(viz.SiblingExplorer(session, trace), 0)
    kl0 = shown(w.outputs["kl"])
    w.round_slider.value = 1
    c1 = w.explorer.comparison(1)
    kl1 = shown(w.outputs["kl"])
    assert list(trace_named(kl1, "KL(fork‖unsafe)")["y"]) == pytest.approx(c1.kl_unsafe)
    assert kl1["layout"]["title"]["text"] != kl0["layout"]["title"]["text"] or kl1["data"] != kl0["data"]
    w.color_by.value = "flip"
    colours = trace_named(shown(w.outputs["tree"]), "nodes")["marker"]["color"]
    assert colours == [1.0 if f else 0.0 for f in c1.flips[1:]]
    assert w.status.value.startswith("round 1:")
