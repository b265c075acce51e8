"""Plotly figures. Every function takes traces (or plain data derived from them) and returns a
``plotly.graph_objects.Figure``; none displays or writes anything (see ``workbench.viz.save``).

Traces inside a figure carry stable names ("nodes", "accepted path", "bonus", "AR", ...) so
tests, widgets and users can find them.
"""

from __future__ import annotations

import math
from collections import Counter

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..trace import PHASES, RoundTrace, Trace
from .analysis import (
    GenerationDiff,
    SiblingComparison,
    committed_tokens,
    draft_matrix,
    round_view,
)

TEMPLATE = "plotly_white"
ACCEPT = "#d62728"  # accepted path
BONUS = "#ff7f0e"
KIND_COLOURS = {"prompt": "#7f7f7f", "accepted": "#2ca02c", "bonus": "#1f77b4"}
KIND_NAMES = {"prompt": "prompt", "accepted": "accepted draft", "bonus": "bonus (target's pick)"}
PHASE_COLOURS = {"draft": "#9467bd", "tree": "#8c564b", "verify": "#1f77b4", "walk": "#17becf", "commit": "#bcbd22"}


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _fmt(v, digits=3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


# ----------------------------------------------------------------------------------------------
# one round: the drafter, the tree, the text


def draft_heatmap(rt: RoundTrace, tokenizer=None, k: int = 8, title: str | None = None) -> go.Figure:
    """The drafter's per-position distributions: depth × rank, colour = q_d(candidate).

    Squares mark the accepted draft tokens; crosses mark the target's own pick at each depth
    along the accepted path (where it is among the shown candidates).
    """
    m = draft_matrix(rt, k, tokenizer)
    depths = list(range(1, m.depth + 1))
    ranks = list(range(m.k))
    hover = [
        [f"depth {d} rank {r}<br>token {_esc(m.labels[d - 1][r])} (id {m.tokens[d - 1][r]})<br>q = {m.probs[d - 1][r]:.3f}"
         for r in ranks]
        for d in depths
    ]
    fig = go.Figure(
        go.Heatmap(
            z=m.probs, x=ranks, y=depths, text=m.labels, texttemplate="%{text}", textfont={"size": 10},
            hovertext=hover, hoverinfo="text", colorscale="Blues", zmin=0.0, zmax=max(1e-9, max(max(r) for r in m.probs)),
            colorbar={"title": {"text": "q<sub>d</sub>"}}, name="draft",
        )
    )
    if m.accepted_cells:
        fig.add_trace(go.Scatter(
            x=[r for _, r in m.accepted_cells], y=[d for d, _ in m.accepted_cells], mode="markers", name="accepted",
            marker={"symbol": "square-open", "size": 26, "color": ACCEPT, "line": {"width": 3}}, hoverinfo="skip",
        ))
    shown = [(d, r, lab) for d, r, lab in m.target_cells if r is not None]
    if shown:
        fig.add_trace(go.Scatter(
            x=[r for _, r, _ in shown], y=[d for d, _, _ in shown], mode="markers", name="target's pick",
            marker={"symbol": "x-thin", "size": 14, "color": "black", "line": {"width": 2}},
            hovertext=[f"target picked {_esc(lab)} at depth {d}" for d, _, lab in shown], hoverinfo="text",
        ))
    fig.update_layout(
        template=TEMPLATE, title=title or f"Round {rt.index}: drafter's top-{m.k} per depth",
        xaxis={"title": "rank", "dtick": 1, "range": [-0.5, m.k - 0.5]},
        yaxis={"title": "depth", "dtick": 1, "range": [m.depth + 0.5, 0.5]},
        height=max(320, 150 + 40 * m.depth), width=160 + 72 * m.k, legend={"orientation": "h", "y": -0.22},
    )
    return fig


def tree_figure(
    rt: RoundTrace,
    tokenizer=None,
    values: list[float] | None = None,
    value_name: str = "draft probability",
    colorscale: str = "Viridis",
    cmin: float | None = 0.0,
    cmax: float | None = 1.0,
    title: str | None = None,
    show_labels: bool = True,
) -> go.Figure:
    """The draft tree as a node-link figure.

    Colour = the node's draft probability q_d(token) (or ``values``, one per node, e.g. a
    corruption measure); the accepted path is drawn thick and outlined; the bonus token (the
    target's pick after the last accepted node) hangs off it as a star. Hover: token text,
    depth, rank, score, draft probability and the target's top tokens after the node.
    """
    v = round_view(rt, tokenizer)
    nodes = v.nodes
    if values is None:
        values = [n.draft_prob for n in nodes]
    elif len(values) != len(nodes):
        raise ValueError(f"values has {len(values)} entries but the tree has {len(nodes)} nodes")
    ex, ey, ax, ay = [], [], [], []
    acc = set(v.accepted)
    for n in nodes[1:]:
        p = nodes[n.parent]
        tx, ty = (ax, ay) if (n.id in acc and n.parent in acc) else (ex, ey)
        tx += [p.x, n.x, None]
        ty += [p.y, n.y, None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", name="edges", line={"color": "#c7c7c7", "width": 1.5}, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=ax, y=ay, mode="lines", name="accepted path", line={"color": ACCEPT, "width": 4}, hoverinfo="skip"))
    last = nodes[v.accepted[-1]]
    fig.add_trace(go.Scatter(x=[last.x, v.bonus_x], y=[last.y, v.bonus_y], mode="lines", name="bonus edge",
                             line={"color": BONUS, "width": 2, "dash": "dot"}, hoverinfo="skip", showlegend=False))

    def hover(n):
        top = "<br>".join(f"  {_esc(lab)}  {p:.3f}" for lab, p in n.target_top) or "  (not recorded)"
        return (
            f"<b>{_esc(n.label)}</b> (id {n.token})<br>node {n.id}, depth {n.depth}, rank {n.rank}<br>"
            f"{value_name}: {_fmt(values[n.id])}<br>draft prob: {_fmt(n.draft_prob)}<br>score (Σ log q): {n.score:.3f}<br>"
            f"{'accepted' if n.accepted else 'not accepted'}; target picks {_esc(n.target_pick_label)}<br>target's top:<br>{top}"
        )

    drafts = nodes[1:]
    root = nodes[0]
    fig.add_trace(go.Scatter(
        x=[root.x], y=[root.y], mode="markers+text" if show_labels else "markers", name="root",
        text=[root.label], textposition="middle left", hovertext=[hover(root).replace("draft prob: –<br>", "")], hoverinfo="text",
        marker={"size": 16, "color": "#444", "symbol": "circle", "line": {"color": ACCEPT, "width": 3}},
    ))
    finite = [x for x in (values[n.id] for n in drafts) if x is not None and not (isinstance(x, float) and math.isnan(x))]
    lo = cmin if cmin is not None else (min(finite) if finite else 0.0)
    hi = cmax if cmax is not None else (max(finite) if finite else 1.0)
    fig.add_trace(go.Scatter(
        x=[n.x for n in drafts], y=[n.y for n in drafts], mode="markers+text" if show_labels else "markers", name="nodes",
        text=[n.label for n in drafts], textposition="middle right", textfont={"size": 10},
        customdata=[[n.id, n.token, n.depth, n.rank] for n in drafts],
        hovertext=[hover(n) for n in drafts], hoverinfo="text",
        marker={
            "size": 14, "color": [values[n.id] for n in drafts], "colorscale": colorscale, "cmin": lo, "cmax": hi if hi > lo else lo + 1e-9,
            "showscale": True, "colorbar": {"title": {"text": value_name}},
            "line": {"color": [ACCEPT if n.accepted else "#555" for n in drafts], "width": [3 if n.accepted else 0.5 for n in drafts]},
        },
    ))
    fig.add_trace(go.Scatter(
        x=[v.bonus_x], y=[v.bonus_y], mode="markers+text" if show_labels else "markers", name="bonus",
        text=[v.bonus_label], textposition="middle right",
        hovertext=[f"<b>bonus</b> {_esc(v.bonus_label)} (id {v.bonus})<br>the target's pick after node {last.id}; next round's root"],
        hoverinfo="text", marker={"size": 18, "color": BONUS, "symbol": "star", "line": {"color": "black", "width": 1}},
    ))
    leaves = max(1, int(max(n.y for n in nodes)) + 1)
    fig.update_layout(
        template=TEMPLATE,
        title=title or f"Round {rt.index}: tree of {len(nodes) - 1} nodes, accepted {len(v.accepted) - 1} + bonus",
        xaxis={"title": "depth", "dtick": 1, "range": [-0.6, max(v.bonus_x, max(n.x for n in nodes)) + 0.9]},
        yaxis={"visible": False, "autorange": "reversed"},
        height=min(1400, max(340, 130 + 24 * leaves)), width=820, showlegend=True,
        legend={"orientation": "h", "y": -0.2, "yanchor": "top"}, margin={"l": 40, "r": 20, "t": 60, "b": 100},
    )
    return fig


def text_figure(trace: Trace, round_index: int | None = None, tokenizer=None, width: int = 72, max_prompt: int = 48,
                title: str | None = None) -> go.Figure:
    """The text so far (after ``round_index``) as token chips: prompt grey, accepted draft tokens
    green, the target's bonus tokens blue; tokens of round ``round_index`` are shaded.
    ``width`` is the line length in characters; a newline token ends its line."""
    toks = committed_tokens(trace, round_index, tokenizer)
    prompt = [t for t in toks if t.kind == "prompt"]
    rest = [t for t in toks if t.kind != "prompt"]
    cut = len(prompt) > max_prompt
    shown = (prompt[-max_prompt:] if cut else prompt) + rest
    gap = 0.4
    col, row = (2.0 if cut else 0.0), 0
    placed = []
    for t in shown:
        w = len(t.label)
        if col + w > width and col > 0:
            col, row = 0.0, row + 1
        placed.append((t.label, col, row, t))
        col += w + gap
        if t.label.endswith("⏎"):
            col, row = 0.0, row + 1
    fig = go.Figure()
    for kind in ("prompt", "accepted", "bonus"):
        pts = [(lab, c, r, t) for lab, c, r, t in placed if t.kind == kind]
        fig.add_trace(go.Scatter(
            x=[c for _, c, _, _ in pts], y=[r for _, _, r, _ in pts], mode="text", name=KIND_NAMES[kind],
            text=[lab for lab, _, _, _ in pts], textposition="middle right",
            textfont={"family": "DejaVu Sans Mono, monospace", "size": 15, "color": KIND_COLOURS[kind]},
            hovertext=[f"{_esc(lab)} (id {t.token})<br>position {t.position}<br>{KIND_NAMES[kind]}"
                       + (f", round {t.round}" if t.round >= 0 else "") for lab, _, _, t in pts],
            hoverinfo="text",
        ))
    if cut:
        fig.add_trace(go.Scatter(x=[0], y=[0], mode="text", text=["…"], textposition="middle right", name="(prompt cut)",
                                 showlegend=False, hoverinfo="skip"))
    shapes = []
    if round_index is not None:
        for lab, c, r, t in placed:
            if t.round == round_index:
                shapes.append({"type": "rect", "x0": c - 0.15, "x1": c + len(lab) + 0.15, "y0": r - 0.32, "y1": r + 0.32,
                               "fillcolor": "rgba(255, 221, 87, 0.5)", "line": {"width": 0}, "layer": "below"})
    rows = (placed[-1][2] + 1) if placed else 1
    n_acc = sum(1 for t in toks if t.kind == "accepted")
    n_gen = len(rest)
    char_px = 9.2  # a 15 px monospace glyph advance
    fig.update_layout(
        template=TEMPLATE, shapes=shapes,
        title=title or (f"Text after round {round_index}: {n_gen} tokens generated, {n_acc} of them accepted drafts (shaded: this round)"
                        if round_index is not None else f"Text: {n_gen} tokens generated, {n_acc} accepted drafts"),
        xaxis={"visible": False, "range": [-0.5, width + 1.5], "fixedrange": True},
        yaxis={"visible": False, "range": [rows - 0.4, -0.6], "fixedrange": True},
        height=int(130 + 28 * rows), width=int(40 + char_px * (width + 2)), legend={"orientation": "h", "y": -0.02, "yanchor": "top"},
        margin={"l": 20, "r": 20, "t": 50, "b": 40},
    )
    return fig


def acceptance_by_round(trace: Trace, title: str | None = None) -> go.Figure:
    """Acceptance length per round of one generation; rounds accepted through a non-first sibling in orange."""
    xs = [r.index for r in trace.rounds]
    fig = go.Figure()
    for flag, name, colour in ((False, "main chain", "#1f77b4"), (True, "through a non-first sibling", BONUS)):
        pts = [r for r in trace.rounds if r.through_sibling == flag]
        fig.add_trace(go.Bar(x=[r.index for r in pts], y=[r.acceptance_length for r in pts], name=name, marker_color=colour))
    fig.update_layout(
        template=TEMPLATE, barmode="overlay",
        title=title or f"Acceptance length per round (τ = {trace.mean_acceptance:.2f} over {len(xs)} rounds)",
        xaxis={"title": "round"}, yaxis={"title": "tokens committed"}, height=320, width=760,
    )
    return fig


# ----------------------------------------------------------------------------------------------
# benchmark views (rows: workbench.viz.analysis.trace_row, as a DataFrame or list of dicts)


def _frame(rows):
    import pandas as pd

    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if df.empty:
        raise ValueError("no benchmark rows to plot")
    return df


def config_label(row) -> str:
    m = row["method"]
    t = f" T={row['temperature']:g}" if "temperature" in row else ""
    if m == "ar":
        return f"AR{t}"
    b = f" b={int(row['budget'])}" if m == "ddtree" and row.get("budget") is not None and not _isnan(row.get("budget")) else ""
    return f"{m}{b} {row.get('recurrent', '')}{t}".strip()


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def acceptance_histogram(data, title: str | None = None) -> go.Figure:
    """Acceptance-length histograms (fraction of rounds), one bar series per configuration.

    ``data``: a dict ``{label: [acceptance lengths]}``, or benchmark rows with an
    ``acceptance_lengths`` list column (AR rows, all 1, are left out); rows get one panel per
    recurrent mode, the DFlash chain in grey and DDTree budgets from light to dark.
    """
    panels: dict[str, dict[str, list[int]]] = {}
    colours: dict[str, str] = {}
    if isinstance(data, dict):
        panels[""] = {str(k): [int(x) for x in v] for k, v in data.items()}
    else:
        df = _frame(data)
        df = df[df["method"] != "ar"]
        if df.empty:
            raise ValueError("no drafted runs (only AR) to histogram")
        budgets = sorted(int(b) for b in df.loc[df["method"] == "ddtree", "budget"].dropna().unique())
        temps = sorted(df["temperature"].unique())
        for _, row in df.iterrows():
            m = row["method"]
            label = "dflash chain" if m == "dflash" else f"ddtree b={int(row['budget'])}" if m == "ddtree" else m
            if len(temps) > 1:
                label += f" T={row['temperature']:g}"
            panels.setdefault(str(row["recurrent"]), {}).setdefault(label, []).extend(int(x) for x in row["acceptance_lengths"])
            if m == "ddtree" and budgets:
                from plotly.colors import sample_colorscale

                pos = budgets.index(int(row["budget"])) / max(1, len(budgets) - 1)
                colours[label] = sample_colorscale("Viridis", [0.85 - 0.75 * pos])[0]
            elif m == "dflash":
                colours[label] = "#9e9e9e"
    names = list(panels)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.12 if len(names) > 1 else 0.05,
                        subplot_titles=[f"recurrent mode: {n}" for n in names] if names != [""] else None)
    for i, panel in enumerate(names, 1):
        for label, lengths in panel_items(panels[panel]):
            c = Counter(lengths)
            xs = sorted(c)
            fig.add_trace(go.Bar(x=xs, y=[c[x] / len(lengths) for x in xs], name=f"{label}{' · ' + panel if len(names) > 1 else ''} (τ={sum(lengths) / len(lengths):.2f})",
                                 legendgroup=label, marker_color=colours.get(label), customdata=[c[x] for x in xs],
                                 hovertemplate=f"{_esc(label)}<br>length %{{x}}: %{{y:.1%}} (%{{customdata}} rounds)<extra>{_esc(panel)}</extra>"),
                          row=i, col=1)
        fig.update_yaxes(title_text="fraction of rounds", tickformat=".0%", row=i, col=1)
    fig.update_xaxes(title_text="tokens committed per round (accepted + bonus)", dtick=1, row=len(names), col=1)
    fig.update_layout(template=TEMPLATE, barmode="group", title=title or "Acceptance length per round",
                      height=140 + 280 * len(names), width=900)
    return fig


def panel_items(groups: dict[str, list[int]]):
    return [(k, v) for k, v in groups.items() if v]


def _budget_lines(df, value: str, ylabel: str, title: str, reference_methods=("ar", "dflash")) -> go.Figure:
    fig = go.Figure()
    tree = df[df["method"] == "ddtree"]
    budgets = sorted(int(b) for b in tree["budget"].dropna().unique()) if len(tree) else []
    span = [budgets[0], budgets[-1]] if budgets else [1, 1]
    if len(tree):
        for (rec, temp), g in tree.groupby(["recurrent", "temperature"], sort=True):
            m = g.groupby("budget")[value].mean().sort_index()
            fig.add_trace(go.Scatter(x=[int(b) for b in m.index], y=m.values.tolist(), mode="lines+markers",
                                     name=f"ddtree {rec} T={temp:g}"))
    for method in reference_methods:
        ref = df[df["method"] == method]
        if not len(ref):
            continue
        keys = ["temperature"] if method == "ar" else ["recurrent", "temperature"]
        for key, g in ref.groupby(keys, sort=True):
            key = key if isinstance(key, tuple) else (key,)
            mean = float(g[value].mean())
            name = f"AR T={key[-1]:g}" if method == "ar" else f"dflash chain {key[0]} T={key[-1]:g}"
            fig.add_trace(go.Scatter(x=span, y=[mean, mean], mode="lines", name=name if method != "ar" or len(keys) > 1 else name,
                                     line={"dash": "dash" if method == "ar" else "dot", "width": 2,
                                           "color": "black" if method == "ar" else None}))
    fig.update_layout(template=TEMPLATE, title=title, xaxis={"title": "DDTree node budget", "type": "log", "tickvals": budgets or None},
                      yaxis={"title": ylabel}, height=420, width=760)
    return fig


def tau_vs_budget(rows, title: str | None = None) -> go.Figure:
    """Mean acceptance length τ against the DDTree budget (the DFlash chain as a reference line)."""
    df = _frame(rows)
    return _budget_lines(df, "tau", "τ (mean tokens per round)", title or "Acceptance length τ vs budget", ("dflash",))


def speed_vs_budget(rows, title: str | None = None) -> go.Figure:
    """Decode tokens/s against the budget, with the AR line (and the DFlash chain)."""
    df = _frame(rows)
    if not (df["method"] == "ar").any():
        raise ValueError("tokens/s vs budget needs AR rows for the AR line (run the benchmark with include_ar=True)")
    fig = _budget_lines(df, "tokens_per_second", "decode tokens / s", title or "Tokens/s vs budget (dashed: AR)")
    return fig


def phase_breakdown(rows, title: str | None = None) -> go.Figure:
    """Where decode time goes: milliseconds per generated token in each phase, per configuration."""
    df = _frame(rows).copy()
    df["config"] = [config_label(r) for _, r in df.iterrows()]
    order = list(dict.fromkeys(df["config"]))
    cols = [f"{p}_seconds" for p in PHASES if f"{p}_seconds" in df]
    sums = df.groupby("config", sort=False)[cols + ["new_tokens"]].sum()
    fig = go.Figure()
    for col in cols:
        p = col[: -len("_seconds")]
        ms = [1e3 * float(sums.loc[c, col]) / max(1, float(sums.loc[c, "new_tokens"])) for c in order]
        fig.add_trace(go.Bar(x=order, y=ms, name=p, marker_color=PHASE_COLOURS.get(p)))
    fig.update_layout(template=TEMPLATE, barmode="stack", title=title or "Decode time per token by phase",
                      xaxis={"title": None, "tickangle": -35}, yaxis={"title": "ms per generated token"},
                      height=460, width=max(600, 60 * len(order) + 200))
    return fig


# ----------------------------------------------------------------------------------------------
# sibling states


def kl_figure(cmp: SiblingComparison, title: str | None = None) -> go.Figure:
    """Per node KL(fork ‖ unsafe) (bars: grey on the first chain, where flattened order is exact),
    KL(fork ‖ paths) (the exactness check, ~0) and the nodes whose top-1 token flips."""
    nodes = list(range(cmp.size))
    colours = ["#bbbbbb" if c else "#e6550d" for c in cmp.first_chain]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=nodes, y=cmp.kl_unsafe, name="KL(fork‖unsafe)", marker_color=colours,
                         customdata=[[cmp.tree["depths"][n], cmp.tree["ranks"][n]] for n in nodes],
                         hovertemplate="node %{x} (depth %{customdata[0]}, rank %{customdata[1]})<br>KL %{y:.4g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=nodes, y=cmp.kl_paths, mode="lines+markers", name="KL(fork‖paths)",
                             line={"color": "#2ca02c"}, marker={"size": 4}))
    flips = [n for n in nodes if cmp.flips[n]]
    fig.add_trace(go.Scatter(x=flips, y=[cmp.kl_unsafe[n] for n in flips], mode="markers", name="top-1 flip",
                             marker={"symbol": "x", "size": 11, "color": "black"}))
    fig.update_layout(template=TEMPLATE, xaxis={"title": "node (flattened order)"}, yaxis={"title": "KL (nats)"},
                      title=title or f"Round {cmp.round_index}: KL(fork‖unsafe) per node, {sum(cmp.flips)} top-1 flips "
                                     f"(grey: first chain, exact by construction)", height=380, width=860)
    return fig


def _node_labels(cmp: SiblingComparison, tokenizer=None) -> list[str]:
    from .analysis import token_label

    t = cmp.tree
    return [f"n{n} d{t['depths'][n]} r{t['ranks'][n]} {token_label(tokenizer, t['tokens'][n])}" for n in range(cmp.size)]


def state_divergence_heatmap(cmp: SiblingComparison, tokenizer=None, title: str | None = None) -> go.Figure:
    """‖S_unsafe − S_exact‖ / ‖S_exact‖ per node (rows) and recurrent layer (columns)."""
    fig = go.Figure(go.Heatmap(
        z=cmp.state_div_unsafe, x=[f"layer {l}" for l in cmp.layers], y=_node_labels(cmp, tokenizer),
        colorscale="Reds", zmin=0.0, colorbar={"title": {"text": "rel. error"}}, name="state divergence",
        hovertemplate="%{y}<br>%{x}<br>‖S_unsafe − S_exact‖/‖S_exact‖ = %{z:.3g}<extra></extra>",
    ))
    fig.update_layout(template=TEMPLATE, yaxis={"autorange": "reversed", "title": "node", "dtick": 1, "tickfont": {"size": 10}},
                      title=title or f"Round {cmp.round_index}: recurrent-state divergence of unsafe (vs paths)",
                      height=max(320, 120 + 18 * cmp.size), width=260 + 90 * len(cmp.layers))
    return fig


def corruption_tree(rt: RoundTrace, cmp: SiblingComparison, tokenizer=None, metric: str = "kl", title: str | None = None) -> go.Figure:
    """The round's tree coloured by how much unsafe corrupts each node: ``kl`` (KL(fork‖unsafe)),
    ``state`` (worst layer's relative state error) or ``flip`` (top-1 flips, 0/1)."""
    if rt.index != cmp.round_index:
        raise ValueError(f"round {rt.index} and comparison of round {cmp.round_index} do not match")
    if metric == "kl":
        values, name = cmp.kl_unsafe, "KL(fork‖unsafe)"
    elif metric == "state":
        values, name = [max(r) if r else 0.0 for r in cmp.state_div_unsafe], "max state error"
    elif metric == "flip":
        values, name = [1.0 if f else 0.0 for f in cmp.flips], "top-1 flip"
    else:
        raise ValueError(f"metric {metric!r}: expected kl, state or flip")
    top = max(values) if values else 1.0
    return tree_figure(rt, tokenizer, values=values, value_name=name, colorscale="Reds", cmin=0.0, cmax=top if top > 0 else 1.0,
                       title=title or f"Round {rt.index}: tree coloured by {name} (accepted path: fork's)")


def run_overview(comparisons: list[SiblingComparison], title: str | None = None) -> go.Figure:
    """Whole run: per round the worst KL(fork‖unsafe), top-1 flips, and whether the accepted path changes."""
    if not comparisons:
        raise ValueError("no compared rounds")
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    xs = [c.round_index for c in comparisons]
    fig.add_trace(go.Bar(x=xs, y=[sum(c.flips) for c in comparisons], name="top-1 flips", marker_color="#9ecae1"), secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[max(c.kl_unsafe) for c in comparisons], mode="lines+markers", name="max KL(fork‖unsafe)",
                             line={"color": "#e6550d"}), secondary_y=True)
    changed = [c for c in comparisons if c.path_changed]
    fig.add_trace(go.Scatter(x=[c.round_index for c in changed], y=[sum(c.flips) for c in changed], mode="markers",
                             name="accepted path changes", marker={"symbol": "diamond", "size": 11, "color": ACCEPT}), secondary_y=False)
    fig.update_layout(template=TEMPLATE, title=title or f"Whole run: unsafe changes the accepted path in {len(changed)} of {len(xs)} rounds",
                      xaxis={"title": "round"}, height=380, width=860)
    fig.update_yaxes(title_text="top-1 flips (nodes)", secondary_y=False)
    fig.update_yaxes(title_text="max KL (nats)", secondary_y=True)
    return fig


def generation_diff_figure(diff: GenerationDiff, tokenizer=None, title: str | None = None) -> go.Figure:
    """Each mode's generated tokens against AR (red: differs), and acceptance length per round."""
    from .analysis import token_label

    fig = make_subplots(rows=2, cols=1, row_heights=[0.45, 0.55], vertical_spacing=0.24,
                        subplot_titles=("generated tokens vs AR (red: differs)", "tokens committed per round"))
    modes = list(diff.tokens)
    rows = ["AR"] + modes
    seqs = [diff.ar_tokens] + [diff.tokens[m] for m in modes]
    for i, (name, seq) in enumerate(zip(rows, seqs)):
        same = [j < len(diff.ar_tokens) and t == diff.ar_tokens[j] for j, t in enumerate(seq)]
        fig.add_trace(go.Scatter(
            x=list(range(len(seq))), y=[name] * len(seq), mode="markers", name=f"{name} tokens", showlegend=False,
            marker={"symbol": "square", "size": 9, "color": ["#2ca02c" if s else ACCEPT for s in same]},
            hovertext=[f"{name} token {j}: {_esc(token_label(tokenizer, t))}" for j, t in enumerate(seq)], hoverinfo="text",
        ), row=1, col=1)
    for m in modes:
        fig.add_trace(go.Scatter(x=list(range(len(diff.acceptance[m]))), y=diff.acceptance[m], mode="lines+markers",
                                 name=f"{m} (τ={diff.tau[m]:.2f})"), row=2, col=1)
    firsts = ", ".join(f"{m}: {'identical to AR' if d is None else f'differs from token {d}'}" for m, d in diff.first_difference.items())
    fig.update_layout(template=TEMPLATE, title=title or f"Generation diff ({firsts})", height=520, width=900)
    fig.update_xaxes(title_text="generated token", row=1, col=1)
    fig.update_xaxes(title_text="round", row=2, col=1)
    return fig


def e2e_rows(result: dict, pair: str, variant: str | None = None) -> list[dict]:
    """One pair's rows of a ``bench.e2e`` result as benchmark rows (``tau`` = mean acceptance), the
    run's own norm variant unless ``variant`` names another."""
    if pair not in result.get("pairs", {}):
        raise ValueError(f"pair {pair!r} not in the e2e result (has {sorted(result.get('pairs', {}))})")
    rows = result["pairs"][pair]["rows"]
    if not rows:
        raise ValueError(f"pair {pair!r} has no rows")
    variant = variant or rows[0].get("variant")
    return [dict(r, tau=r["mean_acceptance"]) for r in rows if r.get("variant") == variant]


def e2e_speed_figure(result: dict, pair: str, title: str | None = None) -> go.Figure:
    """Measured tokens/s against the DDTree budget for one bundled pair (AR dashed, the DFlash
    chain dotted, HF ``generate`` as a grey line where measured)."""
    rows = e2e_rows(result, pair)
    fig = speed_vs_budget(rows, title or f"{pair} on {result.get('device', '?')}: decode tokens/s vs budget")
    budgets = sorted({int(r["budget"]) for r in rows if r["method"] == "ddtree"})
    for t, hf in result["pairs"][pair].get("hf_generate", {}).items():
        if "tokens_per_second" in hf and budgets:
            fig.add_trace(go.Scatter(x=[budgets[0], budgets[-1]], y=[hf["tokens_per_second"]] * 2, mode="lines",
                                     name=f"HF generate T={float(t):g}", line={"color": "#9e9e9e", "width": 1}))
    return fig


def verify_cost_figure(result: dict, title: str | None = None) -> go.Figure:
    """Qwen3.6-27B dims: verify time against tree tokens (``fork`` and ``unsafe``), with the AR
    step and the weight-read floor as reference lines."""
    big = result.get("qwen36_27b_dims")
    if not big or not big.get("verify_ms"):
        raise ValueError("the e2e result has no qwen36_27b_dims verify timings")
    fig = go.Figure()
    by_mode: dict[str, list[tuple[int, float]]] = {}
    for key, ms in big["verify_ms"].items():
        budget, mode = key.split("/")
        by_mode.setdefault(mode, []).append((int(budget) + 1, float(ms)))
    tokens = sorted({t for pts in by_mode.values() for t, _ in pts})
    for mode, pts in sorted(by_mode.items()):
        pts.sort()
        fig.add_trace(go.Scatter(x=[t for t, _ in pts], y=[m for _, m in pts], mode="lines+markers", name=f"verify ({mode})"))
    span = [tokens[0], tokens[-1]]
    fig.add_trace(go.Scatter(x=span, y=[big["ar_step_ms"]] * 2, mode="lines", name="AR step",
                             line={"dash": "dash", "color": "black", "width": 2}))
    fig.add_trace(go.Scatter(x=span, y=[big["weight_read_floor_ms"]] * 2, mode="lines", name="weight-read floor",
                             line={"dash": "dot", "color": "#7f7f7f", "width": 2}))
    fig.update_layout(template=TEMPLATE, title=title or f"Qwen3.6-27B dims on {result.get('device', '?')}: one verify pass",
                      xaxis={"title": "tree tokens verified (budget + 1)", "type": "log", "tickvals": tokens},
                      yaxis={"title": "ms per pass", "rangemode": "tozero"}, height=420, width=760)
    return fig
