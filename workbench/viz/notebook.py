"""What the notebooks call between their parameters cell and their figures.

    check_parameters(globals())        the batch's range rules, again inside the kernel
    book = FigureBook(out_dir, ["png"])
    book.show("tree", fig)             display (plotly mimetype) and keep for export
    book.export()                      every kept figure through one chromium session
    show_numbers("summary", {...})     a JSON output tests and readers can find
    record(rows, out_dir)              the point's rows for ``workbench batch`` (results.json)

The batch convention: a notebook with an ``out_dir`` parameter writes ``results.json``
(``{"rows": [...]}``) and its figures into ``out_dir``; ``workbench batch`` sets ``out_dir`` to
the point's directory and combines every point's rows into results.parquet / results.csv.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..trace import write_json_atomic
from .params import RULES, check_value

RESULTS_FILE = "results.json"
NUMBERS_MIME = "application/json"


def check_parameters(namespace: dict) -> None:
    """Apply the range rules to every rule-named parameter present in ``namespace``."""
    for name in RULES:
        if name in namespace:
            check_value(name, namespace[name])


def plotly_bundle(fig) -> dict:
    """A display bundle JupyterLab renders with its plotly extension (and tests can read)."""
    spec = json.loads(fig.to_json())
    spec.setdefault("config", {"responsive": True})
    title = fig.layout.title.text or "figure"
    return {"application/vnd.plotly.v1+json": spec, "text/plain": f"<plotly figure: {title}>"}


def display_figure(fig, name: str | None = None) -> None:
    from IPython.display import display

    bundle = plotly_bundle(fig)
    display(bundle, raw=True, metadata={"workbench": {"figure": name}} if name else None)


class FigureBook:
    """Figures a notebook shows, exported together at the end (one browser for all of them)."""

    def __init__(self, out_dir: str | Path | None = None, formats=("png",), subdir: str = "figures"):
        self.out_dir = Path(out_dir) if out_dir else None
        self.formats = [f.lower().lstrip(".") for f in formats]
        self.subdir = subdir
        self.figures: dict = {}

    def show(self, name: str, fig, display: bool = True) -> None:
        if name in self.figures:
            raise ValueError(f"figure name {name!r} used twice")
        self.figures[name] = fig
        if display:
            display_figure(fig, name)

    def paths(self) -> list[tuple[object, Path]]:
        if self.out_dir is None:
            return []
        folder = self.out_dir / self.subdir
        return [(fig, folder / f"{name}.{fmt}") for name, fig in self.figures.items() for fmt in self.formats]

    def export(self) -> list[Path]:
        items = self.paths()
        if not items:
            return []
        from .export import save_many

        return save_many(items)


def show_numbers(kind: str, numbers: dict) -> dict:
    """Display ``numbers`` as a JSON output tagged ``kind`` (plus a readable text form)."""
    from IPython.display import display

    payload = {"kind": kind, **_plain(numbers)}
    text = "\n".join(f"{k}: {v}" for k, v in payload.items())
    display({NUMBERS_MIME: payload, "text/plain": text}, raw=True)
    return payload


def _plain(obj):
    """JSON-safe copy (numpy / tuples / NaN -> plain)."""
    return json.loads(json.dumps(obj, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def record(rows: list[dict], out_dir: str | Path | None, tables: bool = True) -> Path | None:
    """Write the point's rows (results.json, and results.parquet / .csv) atomically into ``out_dir``."""
    if not out_dir:
        return None
    out = Path(out_dir)
    path = write_json_atomic(out / RESULTS_FILE, {"rows": _plain(rows)})
    if tables and rows:
        write_tables(rows, out / "results")
    return path


def write_tables(rows: list[dict], stem: str | Path) -> tuple[Path, Path]:
    """``stem``.parquet and ``stem``.csv from rows, each written to a temp file and renamed.
    List / dict cells stay lists in parquet and become JSON text in the CSV."""
    import pandas as pd

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(_plain(rows))
    parquet, csv = stem.with_suffix(".parquet"), stem.with_suffix(".csv")
    for path, write in ((parquet, lambda p: _to_parquet(df, p)),
                        (csv, lambda p: _csv_frame(df).to_csv(p, index=False))):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    return parquet, csv


def _to_parquet(df, path) -> None:
    """Parquet needs one type per column; rows from different points may disagree (an int here, a
    string there): such columns are written as JSON text instead of failing the whole table."""
    try:
        df.to_parquet(path, index=False)
        return
    except Exception:  # pyarrow's ArrowInvalid / ArrowTypeError: retry with mixed columns as text
        pass
    fixed = df.copy()
    for col in fixed.columns:
        kinds = {type(v).__name__ for v in fixed[col] if v is not None and not (isinstance(v, float) and v != v)}
        if len(kinds - {"int", "float"}) > 1 or (kinds & {"int", "float"} and kinds - {"int", "float", "bool"}):
            fixed[col] = fixed[col].map(lambda v: None if v is None else v if isinstance(v, str) else json.dumps(v))
    fixed.to_parquet(path, index=False)


def _csv_frame(df):
    out = df.copy()
    for col in out.columns:
        if out[col].map(lambda v: isinstance(v, (list, dict))).any():
            out[col] = out[col].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    return out
