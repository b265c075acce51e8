"""Tree-stage timings on this machine: ``python -m workbench.bench.tree``.

Builds DDTree trees of 64..1024 nodes from a drafter-like top-k (block 16), compiles them
(ancestor mask, bitmask, conv table) and follows a walk; median of repeats per stage,
written to data/results/tree-<host>-<date>.json. The engine issue asks for a 1024-node build
in under 20 ms on CPU: this script is where that is measured (tests never assert timings).
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import time
from pathlib import Path

import torch

from ..trace import write_json_atomic
from ..tree import Draft, build_ddtree, compile_tree, follow

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    depth = 15
    logp = torch.log_softmax(torch.randn(depth, args.vocab) * 3, -1)
    rows = []
    for budget in (64, 256, 1024):
        top = torch.topk(logp, budget, dim=-1)
        draft = Draft(top.indices, top.values)
        tree = build_ddtree(draft, budget, 0)
        # the target agrees with the rank-0 chain all the way down: the longest walk
        kids = tree.children()
        choices = [next((t for t, c in kids[n].items() if tree.ranks[c] == 0), -1) for n in range(len(tree))]
        row = {
            "budget": budget,
            "nodes": len(tree),
            "max_depth": tree.max_depth,
            "build_ms": median_ms(lambda: build_ddtree(draft, budget, 0), args.repeats),
            "compile_ms": median_ms(lambda: compile_tree(tree, 4096), args.repeats),
            "bitmask_ms": median_ms(lambda: compile_tree(tree, 4096).bitmask(), args.repeats),
            "follow_ms": median_ms(lambda: follow(tree, choices), args.repeats),
        }
        rows.append(row)
        print(f"budget {budget:5d}: build {row['build_ms']:.2f} ms, compile {row['compile_ms']:.2f} ms, "
              f"+bitmask {row['bitmask_ms']:.2f} ms, follow {row['follow_ms']:.3f} ms (walk of {len(follow(tree, choices)[0])} nodes)")
    result = {
        "benchmark": "tree",
        "date": dt.date.today().isoformat(),
        "device": f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "shapes": {"depth": depth, "vocab": args.vocab},
        "repeats": args.repeats,
        "statistic": "median",
        "rows": rows,
        "target": {"build_ms_1024": 20.0, "met": rows[-1]["build_ms"] < 20.0},
    }
    out = Path(args.out) if args.out else RESULTS / f"tree-cpu-{platform.node() or 'host'}-{result['date']}.json"
    write_json_atomic(out, result, indent=2)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
