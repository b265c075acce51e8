"""Interactive views. Each is two layers, so behaviour is testable without a browser:

    TreeExplorer / SiblingExplorer   state (settings, round) -> figures; plain Python
    ExplorerWidget / SiblingWidget   ipywidgets controls bound to that state; figures shown in
                                     Output widgets (plotly mimetype, rendered by JupyterLab)

Setting a control's value (``w.round_slider.value = 3``) updates ``w.figures`` and the Output
widgets' contents at once, in a kernel or not.
"""

from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

from ..engine import METHODS
from ..verify import RECURRENT_MODES
from .analysis import compare_round, pick_round
from .figures import corruption_tree, draft_heatmap, kl_figure, state_divergence_heatmap, text_figure, tree_figure
from .notebook import plotly_bundle
from .params import check_value


def _placeholder(title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(template="plotly_white", title=title, xaxis={"visible": False}, yaxis={"visible": False}, height=200)
    return fig


class TreeExplorer:
    """One generation's rounds under chosen settings; regenerates (cached) when settings change."""

    GENERATION = ("prompt", "method", "budget", "recurrent", "temperature")

    def __init__(self, session, prompt: str, method: str = "ddtree", budget: int = 16, recurrent: str = "fork",
                 temperature: float = 0.0, seed: int = 0, max_new_tokens: int = 48, round_index: int = -1, top_k: int = 8):
        self.session = session
        self.settings = {"prompt": prompt, "method": method, "budget": budget, "recurrent": recurrent, "temperature": float(temperature)}
        for k, v in self.settings.items():
            check_value(k, v)
        self.seed, self.max_new_tokens, self.top_k = seed, max_new_tokens, top_k
        self.round_index = pick_round(self.trace, round_index)

    @property
    def trace(self):
        s = dict(self.settings)
        prompt = s.pop("prompt")
        return self.session.generate(prompt, seed=self.seed, max_new_tokens=self.max_new_tokens, **s)

    @property
    def n_rounds(self) -> int:
        return len(self.trace.rounds)

    def set(self, **changes) -> "TreeExplorer":
        """Change settings and/or ``round_index``; the round is clamped into the new generation."""
        round_index = changes.pop("round_index", None)
        for k, v in changes.items():
            if k not in self.GENERATION:
                raise ValueError(f"unknown setting {k!r}: expected round_index or one of {', '.join(self.GENERATION)}")
            check_value(k, v)
        self.settings.update({k: (float(v) if k == "temperature" else v) for k, v in changes.items()})
        n = self.n_rounds
        if n == 0:
            raise ValueError("this generation has no rounds")
        r = self.round_index if round_index is None else int(round_index)
        if round_index is not None and not 0 <= r < n:
            raise ValueError(f"round_index {r} out of range: {n} rounds")
        self.round_index = min(max(r, 0), n - 1)
        return self

    def round(self):
        return self.trace.rounds[self.round_index]

    def figures(self) -> dict[str, go.Figure]:
        tr, rt, tok = self.trace, self.round(), self.session.tokenizer
        draft = draft_heatmap(rt, tok, self.top_k) if rt.draft_tokens is not None else _placeholder("AR: no draft, the tree is the root alone")
        return {"draft": draft, "tree": tree_figure(rt, tok), "text": text_figure(tr, rt.index, tok)}

    def status(self) -> str:
        tr, rt = self.trace, self.round()
        s = self.settings
        return (f"round {rt.index} of 0–{len(tr.rounds) - 1} · {s['method']}"
                + (f" budget {s['budget']}" if s["method"] == "ddtree" else "")
                + f" · {s['recurrent']} · T={s['temperature']:g} · this round commits {rt.acceptance_length} · "
                  f"τ={tr.mean_acceptance:.2f} · {len(tr.generated_ids)} tokens")


def _show(output, fig) -> None:
    """Put a figure into an Output widget by setting its outputs (works from any thread, no kernel needed)."""
    output.outputs = ({"output_type": "display_data", "data": plotly_bundle(fig), "metadata": {}},)


class ExplorerWidget(W.VBox):
    """Round slider, budget, method, recurrent mode, temperature and prompt over a ``TreeExplorer``."""

    def __init__(self, explorer: TreeExplorer, prompts: list[str] | None = None, budgets=(1, 2, 4, 8, 16, 32, 64)):
        self.explorer = explorer
        s = explorer.settings
        prompts = list(dict.fromkeys([s["prompt"]] + list(prompts or [])))
        layout = W.Layout(width="auto")
        self.round_slider = W.IntSlider(value=explorer.round_index, min=0, max=max(0, explorer.n_rounds - 1), description="round",
                                        continuous_update=False)
        self.budget = W.SelectionSlider(options=sorted(set(budgets) | {s["budget"]}), value=s["budget"], description="budget",
                                        continuous_update=False)
        self.method = W.Dropdown(options=list(METHODS), value=s["method"], description="method", layout=layout)
        self.recurrent = W.Dropdown(options=list(RECURRENT_MODES), value=s["recurrent"], description="recurrent", layout=layout)
        self.temperature = W.FloatSlider(value=s["temperature"], min=0.0, max=2.0, step=0.1, description="temperature",
                                         continuous_update=False, readout_format=".1f")
        self.prompt = W.Dropdown(options=[(p.replace("\n", "⏎")[:60], p) for p in prompts], value=s["prompt"], description="prompt",
                                 layout=W.Layout(width="60%"))
        self.status = W.HTML()
        self.outputs = {name: W.Output(layout=W.Layout(border="1px solid #eee")) for name in ("draft", "tree", "text")}
        self.figures: dict[str, go.Figure] = {}
        self.error = W.HTML()
        self._busy = False
        controls = W.VBox([W.HBox([self.round_slider, self.budget, self.temperature]), W.HBox([self.method, self.recurrent, self.prompt])])
        super().__init__([controls, self.status, self.error, self.outputs["tree"], self.outputs["draft"], self.outputs["text"]])
        self.add_class("workbench-explorer")
        self.round_slider.observe(self._on_round, names="value")
        for name in ("budget", "method", "recurrent", "temperature", "prompt"):
            getattr(self, name).observe(lambda change, name=name: self._on_setting(name, change["new"]), names="value")
        self.refresh()

    def _on_round(self, change):
        if not self._busy:
            self.explorer.set(round_index=change["new"])
            self.refresh()

    def _on_setting(self, name, value):
        if self._busy:
            return
        self.status.value = "<i>generating…</i>"
        try:
            self.explorer.set(**{name: value})
            self.error.value = ""
        except ValueError as exc:
            self.error.value = f"<span style='color:#c00'>{exc}</span>"
            return
        self._busy = True
        try:
            self.round_slider.max = max(0, self.explorer.n_rounds - 1)
            self.round_slider.value = self.explorer.round_index
        finally:
            self._busy = False
        self.refresh()

    def refresh(self) -> None:
        self.figures = self.explorer.figures()
        for name, fig in self.figures.items():
            _show(self.outputs[name], fig)
        self.status.value = self.explorer.status()


class SiblingExplorer:
    """Fork vs unsafe vs paths for the rounds of one generation (computed per round, cached)."""

    def __init__(self, session, trace, comparisons=None):
        self.session, self.trace = session, trace
        self._cache = {c.round_index: c for c in (comparisons or [])}

    def comparison(self, round_index: int):
        if not 0 <= round_index < len(self.trace.rounds):
            raise ValueError(f"round {round_index} out of range: {len(self.trace.rounds)} rounds")
        if round_index not in self._cache:
            self._cache[round_index] = compare_round(self.session.target, self.trace, round_index)
        return self._cache[round_index]

    def figures(self, round_index: int, color_by: str = "kl") -> dict[str, go.Figure]:
        check_value("color_by", color_by)
        c = self.comparison(round_index)
        tok = self.session.tokenizer
        rt = self.trace.rounds[round_index]
        return {"tree": corruption_tree(rt, c, tok, color_by), "kl": kl_figure(c), "states": state_divergence_heatmap(c, tok)}


class SiblingWidget(W.VBox):
    """Round slider and colour-by over a ``SiblingExplorer``."""

    def __init__(self, explorer: SiblingExplorer, round_index: int = 0, color_by: str = "kl"):
        self.explorer = explorer
        n = len(explorer.trace.rounds)
        self.round_slider = W.IntSlider(value=round_index, min=0, max=max(0, n - 1), description="round", continuous_update=False)
        self.color_by = W.ToggleButtons(options=[("KL", "kl"), ("state error", "state"), ("top-1 flip", "flip")], value=color_by,
                                        description="colour by")
        self.status = W.HTML()
        self.outputs = {name: W.Output() for name in ("tree", "kl", "states")}
        self.figures: dict[str, go.Figure] = {}
        super().__init__([W.HBox([self.round_slider, self.color_by]), self.status,
                          self.outputs["tree"], W.HBox([self.outputs["states"], self.outputs["kl"]])])
        self.add_class("workbench-siblings")
        self.round_slider.observe(lambda ch: self.refresh(), names="value")
        self.color_by.observe(lambda ch: self.refresh(), names="value")
        self.refresh()

    def refresh(self) -> None:
        r = self.round_slider.value
        self.figures = self.explorer.figures(r, self.color_by.value)
        for name, fig in self.figures.items():
            _show(self.outputs[name], fig)
        s = self.explorer.comparison(r).summary()
        self.status.value = (f"round {r}: {s['nodes']} nodes ({s['off_chain_nodes']} off the first chain) · "
                             f"{s['top1_flips']} top-1 flips · accepted fork {s['accepted_fork']} vs unsafe {s['accepted_unsafe']}"
                             + (" · <b>path changes</b>" if s["path_changed"] else ""))
