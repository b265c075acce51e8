"""``make demo``: the tour of the workbench on the bundled default, through ``workbench batch``.

    1. tree explorer (headless)     out/demo/explorer/
    2. sibling states               out/demo/sibling_states/
    3. a small benchmark grid       out/demo/benchmark/   (recurrent mode fork | unsafe, budgets 2..32)
    4. grid-wide figures            out/demo/figures/*.png
    5. summary                      out/demo/summary.json

Each step leaves executed notebooks, results.parquet / .csv and PNG figures. The bundled default
is the zoo pair (data/zoo/tiny-hybrid + tiny-hybrid-dflash) when it exists, else a random-weight
hybrid with the synthetic oracle drafter; the tour says which. Exit status 0 only if every point
ran, every expected file is there, and the exact recurrent mode (fork) reproduced AR everywhere.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from .runner import REPO_ROOT
from .trace import write_json_atomic

NOTEBOOKS = REPO_ROOT / "notebooks"

TOUR = [
    # (step, notebook, grid, fixed)
    ("explorer", "01_tree_explorer.ipynb", {}, {"interactive": False, "max_new_tokens": 48, "budget": 16}),
    ("sibling_states", "02_sibling_states.ipynb", {}, {"interactive": False, "max_new_tokens": 48, "budget": 16}),
    ("benchmark", "03_benchmark.ipynb", {"recurrent_modes": [["fork"], ["unsafe"]]},
     {"budgets": [2, 4, 8, 16, 32], "n_prompts": 2, "max_new_tokens": 48}),
]


def _command(notebook: str, out: Path, grid: dict, fixed: dict) -> str:
    parts = ["workbench", "batch", f"notebooks/{notebook}"]
    for k, vs in grid.items():
        parts += ["--grid", f"{k}=" + ",".join(str(v[0] if isinstance(v, list) and len(v) == 1 else v) for v in vs)]
    for k, v in fixed.items():
        parts += ["-p", k, ",".join(map(str, v)) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else str(v)]
    parts += ["--out", str(out)]
    return shlex.join(parts)


def run_demo(out: str | Path = "out/demo", quiet: bool = False) -> int:
    from .batch import run_batch
    from .viz.export import BrowserNotFound, chromium_path
    from .viz.session import random_hybrid_dir, zoo_available

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    start = time.time()
    if chromium_path() is None:
        say("demo: no chromium found: the tour exports PNG figures through it. Run env/install-chromium.sh "
            "(or `make demo`, which does), or set BROWSER_PATH.")
        return 1
    if zoo_available():
        say("demo: bundled zoo models found (data/zoo/tiny-hybrid): the tour runs on them")
        models = "zoo"
    else:
        say("demo: no bundled trained models yet (data/zoo/tiny-hybrid is absent) -> a RANDOM-WEIGHT hybrid target")
        say("      (Qwen3.5 layout: 3 GDN : 1 attention) with the synthetic oracle drafter (true token at rank 0 w.p. 0.5, else rank 1)")
        random_hybrid_dir(0)  # write it once, before the kernels need it
        models = "random-weight hybrid + oracle drafter"

    steps, failed = {}, []
    for i, (step, notebook, grid, fixed) in enumerate(TOUR, 1):
        step_out = out / step
        say(f"\n[{i}/{len(TOUR)}] {step}: {_command(notebook, step_out, grid, fixed)}")
        t0 = time.time()
        result = run_batch(NOTEBOOKS / notebook, step_out, grid, fixed, progress=not quiet, log=say)
        steps[step] = {
            "notebook": f"notebooks/{notebook}", "out": str(step_out), "seconds": round(time.time() - t0, 1),
            "points": {pid: s for pid, s in result.status.items()}, "errors": result.errors,
        }
        failed += [f"{step}/{pid}: {err}" for pid, err in result.errors.items()]

    problems = list(failed)
    numbers = {}
    try:
        numbers = _read_numbers(out)
    except Exception as exc:  # missing tables are reported below, not hidden
        problems.append(f"could not read the tour's results: {type(exc).__name__}: {exc}")
    figures = []
    if "benchmark" in steps and not any(f.startswith("benchmark/") for f in failed):
        try:
            figures = _grid_figures(out)
        except (BrowserNotFound, ValueError, OSError, RuntimeError) as exc:
            problems.append(f"grid figures: {exc}")
    problems += _check_files(out)
    if numbers.get("fork_lossless") is False:
        problems.append("fork (exact) differed from AR in the benchmark: losslessness is broken")

    summary = {
        "models": models,
        "ok": not problems,
        "problems": problems,
        "seconds": round(time.time() - start, 1),
        "steps": steps,
        "numbers": numbers,
        "grid_figures": [str(p) for p in figures],
    }
    write_json_atomic(out / "summary.json", summary, indent=2)
    say("")
    if numbers:
        say(f"explorer: τ = {numbers.get('explorer_tau', float('nan')):.2f} over {numbers.get('explorer_rounds')} rounds")
        if "verdict" in numbers:
            say(f"sibling states: {numbers['verdict']}")
        if "benchmark_best" in numbers:
            say(f"benchmark: fork identical to AR in every run: {numbers.get('fork_lossless')}; unsafe identical in "
                f"{numbers.get('unsafe_identical_fraction', 0):.0%} of runs; best DDTree τ {numbers['benchmark_best']}")
    for p in problems:
        say(f"demo: PROBLEM: {p}")
    say(f"demo: {'done' if not problems else 'FAILED'} in {summary['seconds']:.0f}s; executed notebooks, results.parquet and "
        f"PNG figures under {out}/ (summary: {out / 'summary.json'})")
    print(json.dumps({"ok": not problems, "seconds": summary["seconds"], **{k: v for k, v in numbers.items() if k != "verdict"}}))
    return 0 if not problems else 1


def _read_numbers(out: Path) -> dict:
    import pandas as pd

    n = {}
    ex = pd.read_parquet(out / "explorer" / "results.parquet")
    ok = ex[ex["status"] == "ok"]
    if len(ok):
        n["explorer_tau"] = float(ok["tau"].iloc[0])
        n["explorer_rounds"] = int(ok["rounds"].iloc[0])
    sib = pd.read_parquet(out / "sibling_states" / "results.parquet")
    ok = sib[sib["status"] == "ok"]
    if len(ok):
        row = ok.iloc[0]
        n["unsafe_good_enough"] = bool(row["unsafe_good_enough"])
        n["sibling_fork_identical_to_ar"] = bool(row["fork_identical_to_ar"])
        n["sibling_unsafe_identical_to_ar"] = bool(row["unsafe_identical_to_ar"])
        n["verdict"] = (f"unsafe changed the accepted path in {int(row['run_rounds_path_changed'])} of {int(row['run_rounds'])} "
                        f"rounds; its generation is {'identical to' if row['unsafe_identical_to_ar'] else 'different from'} AR "
                        f"(τ unsafe {row['tau_unsafe']:.2f} vs fork {row['tau_fork']:.2f}) -> unsafe is "
                        f"{'good enough here' if row['unsafe_good_enough'] else 'NOT good enough'}")
    bench = pd.read_parquet(out / "benchmark" / "results.parquet")
    ok = bench[bench["status"] == "ok"]
    if len(ok):
        exact = ok[(ok["recurrent"] != "unsafe") | (ok["method"] != "ddtree")]
        n["fork_lossless"] = bool(exact["identical_to_ar"].all())
        unsafe = ok[(ok["recurrent"] == "unsafe") & (ok["method"] == "ddtree")]
        if len(unsafe):
            n["unsafe_identical_fraction"] = float(unsafe["identical_to_ar"].mean())
        tree = ok[(ok["method"] == "ddtree") & (ok["recurrent"] == "fork")]
        if len(tree):
            by = tree.groupby("budget")["tau"].mean()
            n["benchmark_best"] = f"{by.max():.2f} at budget {int(by.idxmax())}"
        n["benchmark_rows"] = int(len(ok))
    return n


def _grid_figures(out: Path) -> list[Path]:
    import pandas as pd

    from .viz import figures as F
    from .viz.export import save_many

    df = pd.read_parquet(out / "benchmark" / "results.parquet")
    df = df[df["status"] == "ok"]
    if df.empty:
        raise ValueError("the benchmark grid recorded no rows")
    folder = out / "figures"
    items = [
        (F.acceptance_histogram(df), folder / "acceptance_histogram.png"),
        (F.tau_vs_budget(df, title="τ vs budget (whole grid)"), folder / "tau_vs_budget.png"),
        (F.phase_breakdown(df.drop_duplicates(subset=["method", "budget", "recurrent", "temperature", "prompt_index"])),
         folder / "phase_breakdown.png"),
    ]
    if (df["method"] == "ar").any():
        items.append((F.speed_vs_budget(df.drop_duplicates(subset=["method", "budget", "recurrent", "temperature", "prompt_index"]),
                                        title="Tokens/s vs budget (whole grid; dashed: AR)"), folder / "tokens_per_second_vs_budget.png"))
    return save_many(items)


def _check_files(out: Path) -> list[str]:
    problems = []
    for step, notebook, _, _ in TOUR:
        d = out / step
        if not (d / "results.parquet").is_file():
            problems.append(f"{step}: no results.parquet")
        nbs = list((d / "points").glob("*/notebook.ipynb"))
        if not nbs:
            problems.append(f"{step}: no executed notebook")
        pngs = list((d / "points").glob("*/figures/*.png"))
        if not pngs:
            problems.append(f"{step}: no PNG figures")
    return problems
