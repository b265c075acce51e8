"""Figures from a committed end-to-end result: ``python -m workbench.bench.figures [--e2e FILE]``.

Reads e2e results (``--e2e FILE ...``; by default the newest ``data/results/e2e-*.json`` with
bundled-pair rows and the newest with 27B-dims timings, one file or two) and writes under
``data/results/figures/``: tokens/s vs budget for each bundled pair, and the Qwen3.6-27B-dims
verify cost against tree tokens, each named after the file it came from. Needs plotly and a
browser for PNG (``env/install-chromium.sh``); nothing here runs a model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .results import REPORTED_DEVICE, RESULTS, newest_e2e_with


def figures_for(result: dict, stem: str) -> list[tuple[object, str]]:
    from ..viz import figures as F

    items = [(F.e2e_speed_figure(result, pair), f"{stem}-{pair}-speed.png") for pair in result.get("pairs", {})]
    if result.get("qwen36_27b_dims", {}).get("verify_ms"):
        items.append((F.verify_cost_figure(result), f"{stem}-27b-verify.png"))
    return items


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--e2e", nargs="+", default=None,
                   help="e2e results (default: the newest data/results/e2e-*.json with pairs and with 27B dims)")
    p.add_argument("--device", default=REPORTED_DEVICE,
                   help=f"without --e2e: the newest runs on a card whose name contains this (default {REPORTED_DEVICE}; 'any')")
    p.add_argument("--out-dir", default=str(RESULTS / "figures"))
    args = p.parse_args(argv)
    if args.e2e:
        paths = [Path(p) for p in args.e2e]
    else:
        paths = []
        for part in ("pairs", "qwen36_27b_dims"):
            try:
                paths.append(newest_e2e_with(part, RESULTS, device=args.device))
            except FileNotFoundError:
                pass
        if not paths:
            print(f"error: no e2e result under {RESULTS}", file=sys.stderr)
            return 2
    items = []
    for path in dict.fromkeys(paths):
        if not path.is_file():
            print(f"error: no e2e result at {path}", file=sys.stderr)
            return 2
        found = figures_for(json.loads(path.read_text()), path.stem)
        if not found:
            print(f"error: {path.name} has neither pairs nor 27B-dims timings to plot", file=sys.stderr)
            return 2
        items += found
    from ..viz import save_many

    out = Path(args.out_dir)
    written = save_many([(fig, out / name) for fig, name in items])
    for w in written:
        print(f"wrote {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
