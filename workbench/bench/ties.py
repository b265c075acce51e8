"""Where two routes that are equal in exact arithmetic part on the bundled pairs, and why:
``python -m workbench.bench.ties``.

Greedy AR through cuBLAS (the GEMV switched off), greedy AR through the Triton GEMV, and greedy
DDTree (fork) are the same tokens in exact arithmetic; in bf16 each route rounds its sums in its
own order. For each HumanEval prompt and each pair of routes this finds the first token where they
part and the target's logits there (the reference engine on the common prefix): a near-tie when
both chosen tokens lie within bf16 noise of the best logit (2 % of it, or 0.02). Results:
data/results/ties-<device>-<date>.json (atomic) and one line per prompt on stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import torch

from ..trace import write_json_atomic
from .e2e import device_name, log, versions

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"


def first_divergence(target, prompt, a, b) -> dict:
    """First position where token lists a and b differ, with the target's logits there given the
    common prefix (the caller picks the backend). A near-tie: both chosen tokens within bf16 noise
    of the best logit; ties of more than two tokens count too (any may come out on top after a
    rounding). Also bench.kernels' losslessness check."""
    pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if pos is None:
        if len(a) == len(b):
            return {"identical": True}
        # one is a prefix of the other: they part where the shorter one stops, no logits to compare
        return {"identical": False, "position": min(len(a), len(b)), "lengths": [len(a), len(b)], "near_tie": False}
    cache = target.new_cache(len(prompt) + pos + 8)
    logits = target.run_chain(prompt + b[:pos], cache, logits="last").logits[-1].float()
    top = torch.topk(logits, 2)
    best = float(top.values[0])
    behind = [best - float(logits[a[pos]]), best - float(logits[b[pos]])]
    return {"identical": False, "position": pos, "tokens": [int(a[pos]), int(b[pos])], "top2_ids": top.indices.tolist(), "top1_logit": best,
            "top2_gap": float(top.values[0] - top.values[1]), "tokens_behind_top1": behind,
            "near_tie": bool(max(behind) <= 0.02 * max(1.0, abs(best)))}


def main(argv=None) -> dict:
    import tree_kernels as tk

    from ..engine import GenerationConfig
    from ..fastpath import FastEngine
    from ..prompts import load_prompts
    from ..runner import load_dflash_drafter, load_target_and_tokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", default="tiny-dense:tiny-dense-dflash,tiny-hybrid:tiny-hybrid-dflash")
    p.add_argument("--prompts", default="humaneval")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--budget", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    now = dt.datetime.now()
    out = args.out or RESULTS / f"ties-{device_name().replace(' ', '-').lower()}-{now.date()}.json"
    result = {"benchmark": "ties", "date": now.isoformat(timespec="seconds"), "device": device_name(), "versions": versions(),
              "settings": vars(args) | {"out": str(out)}, "pairs": {}}
    prompts = load_prompts(args.prompts, args.n)
    for spec in args.pairs.split(","):
        name, drafter_name = spec.split(":")
        target, tokenizer = load_target_and_tokenizer(name, str(device), args.dtype)
        drafter = load_dflash_drafter(drafter_name, target)
        ids = [tokenizer.encode(x) for x in prompts]
        max_len = max(len(i) for i in ids) + args.max_new_tokens + 8

        def run(method, gemv):
            cfg = GenerationConfig(method=method, budget=args.budget, recurrent="fork", max_new_tokens=args.max_new_tokens,
                                   temperature=0.0, trace_topk=0, draft_trace_k=0, stop_on_eos=False)
            with tk.use_gemv(gemv):
                engine = FastEngine(target, drafter, cfg, max_len=max_len)
                return [engine.generate(x).generated_ids for x in ids]

        routes = {"ar_cublas": run("ar", False), "ar_gemv": run("ar", True), "ddtree_gemv": run("ddtree", True),
                  "ddtree_cublas": run("ddtree", False)}
        comparisons = [("ar_gemv", "ar_cublas"), ("ddtree_gemv", "ar_gemv"), ("ddtree_cublas", "ar_cublas")]
        rows = []
        with tk.use_backend("torch"):  # the logits at a divergence from the reference route
            for i, prompt in enumerate(ids):
                row = {c[0] + "_vs_" + c[1]: first_divergence(target, prompt, routes[c[0]][i], routes[c[1]][i]) for c in comparisons}
                rows.append(row)
                log(f"{name} prompt {i}: " + ", ".join(
                    f"{k} {'same' if v['identical'] else 'parts@%d %s' % (v['position'], 'near-tie' if v['near_tie'] else 'NOT a tie')}"
                    for k, v in row.items()))
        summary = {}
        for key in rows[0]:
            recs = [r[key] for r in rows]
            summary[key] = {"identical": sum(r["identical"] for r in recs), "of": len(recs),
                            "all_divergences_near_ties": all(r.get("near_tie", True) for r in recs)}
        result["pairs"][name] = {"prompts": rows, "summary": summary}
        write_json_atomic(out, result, indent=2)
        log(f"{name}: {summary}")
        del target, drafter
    return result


if __name__ == "__main__":
    main()
