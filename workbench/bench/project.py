"""Project Qwen3.6-27B-dims speed from committed measurements: ``python -m workbench.bench.project``.

A projection, not a measurement: the per-round GPU timings of the 27B-dims run of
``workbench.bench.e2e`` (verify of ``budget + 1`` tree tokens + one draft pass, and the AR step)
combined with the acceptance lengths the bundled hybrid pair reaches on HumanEval
(``data/results/zoo-acceptance.json``, CPU fp32, T=0, the final drafters). Only budgets with
both a timing and a tau are projected. Nothing here runs a model; it reads the two JSON files
and writes ``data/results/projection-27b.json`` atomically, with the inputs' names and hashes.

    tokens/s(budget) = 1000 * tau(budget) / (verify_ms(budget, fork) + draft_ms(budget))
    speed-up         = tokens/s(budget) / (1000 / ar_step_ms)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from ..trace import write_json_atomic
from .results import REPORTED_DEVICE, RESULTS, newest_e2e_with


def project(e2e: dict, acceptance: dict, pair: str = "tiny-hybrid", mode: str = "fork") -> dict:
    """The projection table from an e2e result (with ``qwen36_27b_dims``) and a zoo-acceptance result."""
    big = e2e.get("qwen36_27b_dims")
    if not big:
        raise ValueError("the e2e result has no qwen36_27b_dims part (run bench.e2e on a GPU without --skip-27b)")
    if pair not in acceptance.get("pairs", {}):
        raise ValueError(f"pair {pair!r} not in the acceptance result (has {sorted(acceptance.get('pairs', {}))})")
    measured = acceptance["pairs"][pair]
    # throughput follows tokens per round over all rounds (tau_pooled), not the mean of per-prompt taus,
    # which weights a prompt of few long rounds as much as one of many short ones
    tau_key = "tau_pooled" if all("tau_pooled" in row for row in measured["ddtree"].values()) else "tau"
    taus = {int(b): row[tau_key] for b, row in measured["ddtree"].items()}
    ar_ms = float(big["ar_step_ms"])
    rows = {}
    for key, verify_ms in sorted(big["verify_ms"].items(), key=lambda kv: int(kv[0].split("/")[0])):
        budget, m = key.split("/")
        budget = int(budget)
        if m != mode or budget not in taus or str(budget) not in big["draft_ms"]:
            continue
        round_ms = float(verify_ms) + float(big["draft_ms"][str(budget)])
        tps = 1e3 * taus[budget] / round_ms
        rows[str(budget)] = {"tau": taus[budget], "verify_ms": float(verify_ms), "draft_ms": float(big["draft_ms"][str(budget)]),
                             "round_ms": round_ms, "tokens_per_second": tps, "speedup_over_ar": tps * ar_ms / 1e3}
    chain_tau = measured["dflash"].get(tau_key, measured["dflash"]["tau"])
    return {
        "what": "projection (not a measurement): Qwen3.6-27B-dims GPU round timings x tau of the bundled hybrid pair",
        "formula": "tokens/s = 1000 tau / (verify_ms + draft_ms); speed-up = tokens/s / (1000 / ar_step_ms)",
        "pair": pair, "recurrent": mode,
        "ar_step_ms": ar_ms, "ar_tokens_per_second": 1e3 / ar_ms,
        "dflash_tau": chain_tau, "tau_key": tau_key,
        "by_budget": rows,
        "best_budget": max(rows, key=lambda b: rows[b]["tokens_per_second"]) if rows else None,
        "timings_from": {"device": e2e.get("device"), "date": e2e.get("date"), "versions": e2e.get("versions")},
        "tau_from": {"device": acceptance.get("device"), "date": acceptance.get("date"), "settings": acceptance.get("settings")},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.project", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--e2e", default=None, help="e2e result with a qwen36_27b_dims part (default: the newest e2e-*.json that has one)")
    p.add_argument("--device", default=REPORTED_DEVICE,
                   help=f"without --e2e: take the newest run on a card whose name contains this (default {REPORTED_DEVICE}; 'any')")
    p.add_argument("--acceptance", default=str(RESULTS / "zoo-acceptance.json"))
    p.add_argument("--pair", default="tiny-hybrid")
    p.add_argument("--out", default=str(RESULTS / "projection-27b.json"))
    args = p.parse_args(argv)
    try:
        e2e_path = Path(args.e2e) if args.e2e else newest_e2e_with(
            "qwen36_27b_dims", RESULTS, device=args.device)
        acc_path = Path(args.acceptance)
        for path in (e2e_path, acc_path):
            if not path.is_file():
                raise FileNotFoundError(f"{path}: no such file")
        result = project(json.loads(e2e_path.read_text()), json.loads(acc_path.read_text()), args.pair)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"project: error: {exc}", file=sys.stderr)
        return 2
    result["inputs"] = {str(path.name): hashlib.sha256(path.read_bytes()).hexdigest() for path in (e2e_path, acc_path)}
    write_json_atomic(Path(args.out), result, indent=2)
    print(f"AR {result['ar_tokens_per_second']:.1f} tok/s ({result['ar_step_ms']:.2f} ms per step)")
    for budget, row in result["by_budget"].items():
        print(f"DDTree {budget:>4s}: tau {row['tau']:.2f} / round {row['round_ms']:.2f} ms -> {row['tokens_per_second']:.1f} tok/s "
              f"= {row['speedup_over_ar']:.2f}x AR (projection)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
