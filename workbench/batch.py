"""`workbench batch`: a notebook over a cartesian parameter grid, one papermill run per point.

    workbench batch notebooks/03_benchmark.ipynb --grid recurrent_modes=fork,unsafe \\
        -p budgets 2,4,8 --out out/bench [--resume]

Layout under ``--out``::

    batch.json                 the plan: notebook, fixed values, grid, every point's status
    results.parquet / .csv     every point's rows + one error row per failed point
    points/<id>/notebook.ipynb the executed notebook (kept when it fails, for the traceback)
    points/<id>/status.json    ok | error, the error text, the point's full parameters
    points/<id>/results.json   rows the notebook recorded (``workbench.viz.notebook.record``)
    points/<id>/figures/       figures the notebook exported

The convention with notebooks: a notebook with an ``out_dir`` parameter gets its point's
directory there and writes ``results.json`` (``{"rows": [...]}``) and ``figures/`` into it.

Every value is checked (unknown name, wrong type, out-of-range budget, missing model, ...)
against the notebook's ``parameters`` cell before any kernel starts. A failing point is
recorded with its error and the grid goes on; ``--resume`` skips points that finished with the
same parameters. Combined tables are rewritten atomically after every point.

This module imports no papermill / pandas / plotly at import time (``workbench --help`` stays light).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

RESERVED = ("out_dir",)  # set by the batch for every point


@dataclass
class Point:
    index: int
    grid_values: dict  # the grid's values for this point
    values: dict  # everything passed to the notebook except out_dir: fixed + grid
    id: str
    directory: Path


@dataclass
class BatchResult:
    out: Path
    points: list[Point]
    status: dict = field(default_factory=dict)  # point id -> ok | error | skipped (ok from before)
    errors: dict = field(default_factory=dict)  # point id -> message

    @property
    def failed(self) -> list[str]:
        return [pid for pid, s in self.status.items() if s == "error"]

    @property
    def ran(self) -> list[str]:
        return [pid for pid, s in self.status.items() if s in ("ok", "error")]


# ----------------------------------------------------------------------------------------------
# planning (no kernel)


def _split_grid(spec: str) -> tuple[str, str]:
    name, eq, rest = spec.partition("=")
    name = name.strip()
    if not eq or not name:
        raise ValueError(f"--grid {spec!r}: expected NAME=V1,V2,...")
    return name, rest


def parse_cli(params: dict, grid_specs: list[str], pairs: list[tuple[str, str]], notebook: str) -> tuple[dict, dict]:
    """``--grid`` / ``-p`` strings -> typed (grid, fixed). A grid over a list parameter takes one
    element per point (``--grid budgets=4,8`` runs budgets=[4], then [8])."""
    from .viz.params import ParameterError, Parameter, parse_value

    def param(name) -> Parameter:
        if name in RESERVED:
            raise ParameterError(name, "is set by workbench batch (each point gets its own directory)")
        if name not in params:
            raise ParameterError(name, f"unknown parameter for {notebook} (it has: {', '.join(params)})")
        return params[name]

    fixed = {}
    for name, text in pairs:
        p = param(name)
        if name in fixed:
            raise ParameterError(name, "given twice with -p")
        fixed[name] = parse_value(p, text)
    grid = {}
    for spec in grid_specs:
        name, rest = _split_grid(spec)
        p = param(name)
        if name in grid:
            raise ParameterError(name, "given twice with --grid")
        if name in fixed:
            raise ParameterError(name, "given both with --grid and -p")
        element = Parameter(p.name, p.element or "str", None) if p.type == "list" else p
        t = rest.strip()
        if t.startswith("["):
            try:
                raw = json.loads(t)
            except json.JSONDecodeError as exc:
                raise ParameterError(name, f"--grid values are not a JSON list: {exc}") from None
            if not isinstance(raw, list):
                raise ParameterError(name, "--grid values must be a list")
            values = raw
        else:
            values = [parse_value(element, part) for part in rest.split(",")]
        if not values:
            raise ParameterError(name, "--grid needs at least one value")
        grid[name] = [[v] if p.type == "list" and not isinstance(v, list) else v for v in values]
    return grid, fixed


_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def point_id(grid_values: dict) -> str:
    """Readable and stable: ``budget=4_method=ddtree-1a2b3c4d`` (the hash keeps long values apart)."""
    blob = json.dumps(grid_values, sort_keys=True)
    digest = hashlib.sha1(blob.encode()).hexdigest()[:8]
    if not grid_values:
        return f"point-{digest}"
    parts = []
    for k, v in grid_values.items():
        v = v[0] if isinstance(v, list) and len(v) == 1 else v
        parts.append(f"{k}={v}")
    slug = _SLUG.sub("-", "_".join(parts)).strip("-")[:60]
    return f"{slug}-{digest}"


def plan(notebook: str | Path, out: str | Path, grid: dict, fixed: dict) -> tuple[dict, list[Point]]:
    """Check every point against the notebook's parameters; no kernel is started."""
    from .viz.params import ParameterError, read_parameters, validate

    nb = Path(notebook)
    if nb.suffix != ".ipynb":
        raise ValueError(f"{nb}: not a notebook (.ipynb)")
    params = read_parameters(nb)
    for name in list(grid) + list(fixed):
        if name in RESERVED:
            raise ParameterError(name, "is set by workbench batch (each point gets its own directory)")
    names = list(grid)
    combos = list(itertools.product(*(grid[n] for n in names))) if names else [()]
    points = []
    seen = set()
    for i, combo in enumerate(combos):
        gv = dict(zip(names, combo))
        values = validate(params, {**fixed, **gv}, nb.name)
        gv = {k: values[k] for k in names}
        pid = point_id(gv)
        if pid in seen:
            raise ValueError(f"the grid has the same point twice: {gv}")
        seen.add(pid)
        points.append(Point(i, gv, values, pid, Path(out) / "points" / pid))
    return params, points


# ----------------------------------------------------------------------------------------------
# running


def _status_path(p: Point) -> Path:
    return p.directory / "status.json"


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def finished(p: Point) -> bool:
    s = _read_json(_status_path(p))
    return bool(s) and s.get("status") == "ok" and s.get("values") == json.loads(json.dumps(p.values))


def _error_text(exc: BaseException) -> str:
    try:
        from papermill.exceptions import PapermillExecutionError
    except ImportError:  # pragma: no cover
        PapermillExecutionError = ()  # type: ignore[assignment]
    if isinstance(exc, PapermillExecutionError):
        return f"{exc.ename}: {exc.evalue} (cell {exc.cell_index})"
    return f"{type(exc).__name__}: {exc}"


def run_point(notebook: Path, p: Point, has_out_dir: bool, kernel: str | None, timeout: float | None) -> tuple[str, str | None]:
    import papermill

    from .trace import write_json_atomic

    p.directory.mkdir(parents=True, exist_ok=True)
    # a rerun starts clean: nothing from an earlier attempt (rows, figures) may pass for this one's
    for stale in p.directory.iterdir():
        if stale.name != "attempts.json":
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    parameters = dict(p.values)
    if has_out_dir:
        parameters["out_dir"] = str(p.directory.resolve())
    final = p.directory / "notebook.ipynb"
    tmp = p.directory / ".notebook.running.ipynb"
    start = time.time()
    error = None
    try:
        papermill.execute_notebook(
            str(notebook), str(tmp), parameters=parameters, kernel_name=kernel, progress_bar=False,
            log_output=False, cwd=str(p.directory), execution_timeout=timeout,
        )
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # the point failed: record it, the grid goes on
        error = _error_text(exc)
        tb = traceback.format_exc(limit=3)
    finally:
        if tmp.exists():
            tmp.replace(final)
    status = {
        "status": "ok" if error is None else "error",
        "error": error,
        "values": p.values,
        "notebook": str(notebook),
        "seconds": time.time() - start,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if error is not None:
        status["traceback"] = tb
    old = _read_json(p.directory / "attempts.json") or {"attempts": 0}
    write_json_atomic(p.directory / "attempts.json", {"attempts": int(old.get("attempts", 0)) + 1})
    write_json_atomic(_status_path(p), status, indent=2)
    return status["status"], error


def combined_rows(points: list[Point]) -> list[dict]:
    """Every finished point's rows (tagged with the point and its grid values) + one row per error."""
    rows = []
    for p in points:
        s = _read_json(_status_path(p))
        if not s:
            continue
        tag = {"point": p.id, "status": s["status"], "error": s.get("error")}
        tag.update({f"param_{k}": v for k, v in p.values.items()})
        if s["status"] != "ok":
            rows.append(tag)
            continue
        recorded = (_read_json(p.directory / "results.json") or {}).get("rows") or [{}]
        for r in recorded:
            rows.append({**tag, **r})
    return rows


def write_results(out: Path, points: list[Point]) -> list[Path]:
    from .viz.notebook import write_tables

    rows = combined_rows(points)
    if not rows:
        return []
    return list(write_tables(rows, out / "results"))


def run_batch(notebook: str | Path, out: str | Path, grid: dict | None = None, fixed: dict | None = None, resume: bool = False,
              kernel: str | None = None, timeout: float | None = None, progress: bool = True, log=None) -> BatchResult:
    """Plan (all checks before any kernel), then run every point; returns what happened."""
    from .trace import write_json_atomic

    notebook, out = Path(notebook), Path(out)
    params, points = plan(notebook, out, dict(grid or {}), dict(fixed or {}))
    has_out_dir = "out_dir" in params
    out.mkdir(parents=True, exist_ok=True)
    result = BatchResult(out, points)
    say = log or (lambda msg: print(msg, file=sys.stderr))

    def manifest():
        write_json_atomic(out / "batch.json", {
            "notebook": str(notebook), "grid": grid or {}, "fixed": fixed or {},
            "points": [{"id": p.id, "values": p.values, "status": result.status.get(p.id, "pending"),
                        "error": result.errors.get(p.id)} for p in points],
        }, indent=2)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), desc=f"batch {notebook.stem}", unit="point", file=sys.stderr, dynamic_ncols=True)
    try:
        manifest()
        for p in points:
            if resume and finished(p):
                result.status[p.id] = "skipped"
            else:
                if bar is not None:
                    bar.set_postfix_str(p.id[:40])
                status, error = run_point(notebook, p, has_out_dir, kernel, timeout)
                result.status[p.id] = status
                if error:
                    result.errors[p.id] = error
                    say(f"batch: point {p.id} failed: {error}")
                write_results(out, points)
                manifest()
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        write_results(out, points)
        manifest()
    return result


# ----------------------------------------------------------------------------------------------
# command line


def cmd_batch(args) -> int:
    from .viz.params import read_parameters

    notebook = Path(args.notebook)
    params = read_parameters(notebook)
    grid, fixed = parse_cli(params, args.grid, [tuple(p) for p in args.param], notebook.name)
    if args.list:
        _, points = plan(notebook, args.out, grid, fixed)
        for p in points:
            print(f"{p.id}\t{json.dumps(p.values)}")
        return 0
    result = run_batch(notebook, args.out, grid, fixed, resume=args.resume, kernel=args.kernel, timeout=args.timeout,
                       progress=not args.quiet)
    ok = sum(1 for s in result.status.values() if s == "ok")
    skipped = sum(1 for s in result.status.values() if s == "skipped")
    print(f"batch {notebook.name}: {ok} ok, {len(result.failed)} failed, {skipped} skipped (finished before) "
          f"-> {Path(args.out) / 'results.parquet'}", file=sys.stderr)
    for pid in result.failed:
        print(f"  {pid}: {result.errors[pid]}", file=sys.stderr)
    return 1 if result.failed else 0


def add_subcommands(sub) -> None:
    b = sub.add_parser(
        "batch", help="run a notebook over a parameter grid with papermill",
        description="Run NOTEBOOK once per point of the cartesian grid; executed notebooks, figures and a combined "
                    "results.parquet / .csv go under --out. All values are checked before any kernel starts.",
    )
    b.add_argument("notebook", help="the .ipynb to run (its cell tagged 'parameters' lists what can be set)")
    b.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                   help="a grid axis (repeat for more axes); for a list parameter each value is one element; "
                        "a JSON list (NAME=[...]) allows commas inside values")
    b.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="a fixed value for every point (lists: 4,8,16 or JSON)")
    b.add_argument("--out", required=True, help="output directory")
    b.add_argument("--resume", action="store_true", help="skip points that already finished with the same parameters")
    b.add_argument("--kernel", default=None, help="Jupyter kernel name (default: the notebook's)")
    b.add_argument("--timeout", type=float, default=None, help="seconds allowed per cell (default: no limit)")
    b.add_argument("--list", action="store_true", help="check the grid and print its points without running them")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=cmd_batch)
