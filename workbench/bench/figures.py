"""Figures from a committed end-to-end result: ``python -m workbench.bench.figures [--e2e FILE]``.

Reads ``data/results/e2e-*.json`` (the newest unless ``--e2e``) and writes, next to it under
``data/results/figures/``: tokens/s vs budget for each bundled pair, and the Qwen3.6-27B-dims
verify cost against tree tokens. Needs plotly and a browser for PNG (``env/install-chromium.sh``);
nothing here runs a model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"


def figures_for(result: dict, stem: str) -> list[tuple[object, str]]:
    from ..viz import figures as F

    items = [(F.e2e_speed_figure(result, pair), f"{stem}-{pair}-speed.png") for pair in result.get("pairs", {})]
    if result.get("qwen36_27b_dims", {}).get("verify_ms"):
        items.append((F.verify_cost_figure(result), f"{stem}-27b-verify.png"))
    return items


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--e2e", default=None, help="an e2e result (default: the newest data/results/e2e-*.json)")
    p.add_argument("--out-dir", default=str(RESULTS / "figures"))
    args = p.parse_args(argv)
    found = sorted(RESULTS.glob("e2e-*.json"))
    path = Path(args.e2e) if args.e2e else (found[-1] if found else None)
    if path is None or not path.is_file():
        print(f"error: no e2e result at {path or RESULTS / 'e2e-*.json'}", file=sys.stderr)
        return 2
    result = json.loads(path.read_text())
    items = figures_for(result, path.stem)
    if not items:
        print(f"error: {path.name} has neither pairs nor 27B-dims timings to plot", file=sys.stderr)
        return 2
    from ..viz import save_many

    out = Path(args.out_dir)
    written = save_many([(fig, out / name) for fig, name in items])
    for w in written:
        print(f"wrote {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
