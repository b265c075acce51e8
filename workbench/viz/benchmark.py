"""The benchmark notebook's grid: method × budget × recurrent mode × temperature over a prompt set.

One tidy row per generation (``analysis.trace_row``) plus ``prompt_index`` and
``identical_to_ar`` (the lossless check against AR at the same temperature and seed).
The DFlash chain ignores the budget and AR ignores both budget and recurrent mode, so each
runs once per (recurrent mode,) temperature rather than once per grid cell.
"""

from __future__ import annotations

import sys

from ..engine import METHODS
from ..verify import RECURRENT_MODES
from .analysis import first_difference, trace_row


def benchmark_configs(methods, budgets, recurrent_modes, temperatures, include_ar: bool = True) -> list[dict]:
    """The distinct generation settings the grid needs (AR first: the others compare against it)."""
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"method {m!r}: expected one of {', '.join(METHODS)}")
    for r in recurrent_modes:
        if r not in RECURRENT_MODES:
            raise ValueError(f"recurrent mode {r!r}: expected one of {', '.join(RECURRENT_MODES)}")
    for b in budgets:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"budget {b!r}: budgets must be integers >= 1")
    configs = []
    for t in temperatures:
        if include_ar or "ar" in methods:
            configs.append({"method": "ar", "budget": 1, "recurrent": "fork", "temperature": float(t)})
        for rec in recurrent_modes:
            if "dflash" in methods:
                configs.append({"method": "dflash", "budget": 1, "recurrent": rec, "temperature": float(t)})
            if "ddtree" in methods:
                for b in budgets:
                    configs.append({"method": "ddtree", "budget": int(b), "recurrent": rec, "temperature": float(t)})
    return configs


def run_benchmark(session, prompts: list[str], methods=("dflash", "ddtree"), budgets=(4, 8, 16, 32),
                  recurrent_modes=("fork",), temperatures=(0.0,), max_new_tokens: int = 48, seed: int = 0,
                  include_ar: bool = True, progress: bool = True) -> list[dict]:
    if not prompts:
        raise ValueError("no prompts to benchmark")
    configs = benchmark_configs(list(methods), list(budgets), list(recurrent_modes), list(temperatures), include_ar)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(configs) * len(prompts), desc="benchmark", file=sys.stderr, mininterval=1.0)
    rows = []
    try:
        for i, prompt in enumerate(prompts):
            ar_ids = {}
            for cfg in configs:
                trace = session.generate(prompt, seed=seed, max_new_tokens=max_new_tokens, **cfg)
                key = cfg["temperature"]
                if cfg["method"] == "ar":
                    ar_ids[key] = trace.generated_ids
                ar = ar_ids.get(key)
                if ar is None:  # AR left out of the table: still needed for the lossless check
                    ar = session.generate(prompt, method="ar", seed=seed, max_new_tokens=max_new_tokens, temperature=key).generated_ids
                    ar_ids[key] = ar
                first = first_difference(ar, trace.generated_ids)
                if cfg["method"] != "ar" or include_ar or "ar" in methods:
                    rows.append(trace_row(trace, prompt_index=i, identical_to_ar=first is None, first_difference=first))
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return rows
