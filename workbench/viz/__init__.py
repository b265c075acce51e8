"""Plotly figures and ipywidgets views built from traces, and the analyses behind them.

Names resolve lazily, so ``import workbench.viz`` (or ``workbench.viz.analysis``) pulls in no
plotly until a figure is asked for; the engine never imports this package.

    figures   draft_heatmap, tree_figure, text_figure, acceptance_by_round, acceptance_histogram,
              tau_vs_budget, speed_vs_budget, phase_breakdown, kl_figure, state_divergence_heatmap,
              corruption_tree, run_overview, generation_diff_figure, e2e_speed_figure, verify_cost_figure
    export    save(fig, path), save_many([(fig, path), ...]), chromium_path()
    analysis  round_view, draft_matrix, committed_tokens, trace_row, compare_round, compare_run,
              run_summary, generation_diff, verdict, pick_round, token_label
    session   open_session, Session, load_prompt_set
    widgets   TreeExplorer, ExplorerWidget, SiblingExplorer, SiblingWidget
    benchmark run_benchmark
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "figures": (
        "draft_heatmap", "tree_figure", "text_figure", "acceptance_by_round", "acceptance_histogram", "tau_vs_budget",
        "speed_vs_budget", "phase_breakdown", "kl_figure", "state_divergence_heatmap", "corruption_tree", "run_overview",
        "generation_diff_figure", "config_label", "e2e_rows", "e2e_speed_figure", "verify_cost_figure",
    ),
    "export": ("save", "save_many", "chromium_path", "BrowserNotFound"),
    "analysis": (
        "round_view", "draft_matrix", "committed_tokens", "trace_row", "compare_round", "compare_run", "run_summary",
        "generation_diff", "verdict", "pick_round", "token_label", "tree_layout", "SiblingComparison", "GenerationDiff",
        "committed_cache", "first_chain_mask",
    ),
    "session": ("open_session", "Session", "load_prompt_set", "PROMPT_SETS", "DEFAULT_ORACLE", "random_hybrid_dir"),
    "widgets": ("TreeExplorer", "ExplorerWidget", "SiblingExplorer", "SiblingWidget"),
    "benchmark": ("run_benchmark",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.viz' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
