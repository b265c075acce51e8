"""The ``workbench`` command line: thin wrappers over workbench.runner and friends."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .engine import METHODS, GenerationConfig
from .verify import RECURRENT_MODES


def _progress(total: int, desc: str, quiet: bool):
    """A tqdm bar on stderr (a no-op when quiet or tqdm is absent). Returns (update, close)."""
    if quiet:
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:  # the GPU image may lack tqdm's extras; progress is optional
        return None, lambda: None
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)
    return bar.update, bar.close


def _budget(value: str):
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"budget must be an integer >= 1 or 'auto', got {value!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"budget must be >= 1, got {n}")
    return n


def _temperature(value: str) -> float:
    try:
        t = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"temperature must be a number, got {value!r}")
    if t != t or t < 0 or t == float("inf"):
        raise argparse.ArgumentTypeError(f"temperature must be a finite number >= 0, got {value!r}")
    return t


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _add_run_options(p: argparse.ArgumentParser) -> None:
    from .runner import DEFAULT_DRAFTER, DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET, help="HF checkpoint directory or a bundled zoo name")
    p.add_argument("--drafter", default=None, help=f"DFlash directory, zoo name, or oracle[:p=..,rank=..] (default {DEFAULT_DRAFTER})")
    p.add_argument("--method", choices=METHODS, default="ddtree")
    p.add_argument("--budget", type=_budget, default=32, help="DDTree node budget, or 'auto'")
    p.add_argument("--temperature", type=_temperature, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recurrent", choices=RECURRENT_MODES, default="fork")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _config(args, budget: int) -> GenerationConfig:
    return GenerationConfig(
        method=args.method,
        budget=budget,
        temperature=args.temperature,
        seed=args.seed,
        recurrent=args.recurrent,
        max_new_tokens=args.max_new_tokens,
    ).validate()


def _drafter_spec(args):
    from .runner import DEFAULT_DRAFTER

    if args.method == "ar":
        return None
    return args.drafter or DEFAULT_DRAFTER


def _resolve_budget(args, target, drafter_spec, prompt_ids):
    """A number as given; 'auto' picks the fastest budget (measured results, else a calibration)."""
    if args.budget != "auto":
        return args.budget
    if args.method != "ddtree":
        return 32  # only DDTree has a budget
    from .budget import auto_budget
    from .runner import drafter_for

    probe = GenerationConfig(method="ddtree", temperature=args.temperature, seed=args.seed, recurrent=args.recurrent)
    budget, info = auto_budget(target, drafter_for(drafter_spec, target, prompt_ids, probe), prompt_ids, probe)
    if not args.quiet:
        table = ", ".join(f"{b}: {v:.0f} tok/s" for b, v in info["table"].items())
        print(f"--budget auto: {budget} (from {info['source']}; {table})", file=sys.stderr)
    return budget


def cmd_generate(args) -> int:
    from .runner import encode_prompt, load_target_and_tokenizer, run_prompt

    if (args.prompt is None) == (args.prompt_file is None):
        raise ValueError("give exactly one of --prompt or --prompt-file")
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text()
    if not prompt:
        raise ValueError("empty prompt")
    target, tokenizer = load_target_and_tokenizer(args.target, args.device, args.dtype)
    spec = _drafter_spec(args)
    ids = encode_prompt(tokenizer, prompt)
    config = _config(args, _resolve_budget(args, target, spec, ids))
    update, close = _progress(config.max_new_tokens, "generate", args.quiet)
    try:
        trace = run_prompt(target, tokenizer, spec, ids, config, update)
    finally:
        close()
    if args.trace_out:
        trace.save(args.trace_out)
    if args.json:
        print(json.dumps(trace.summary()))
    else:
        print(trace.text if trace.text is not None else trace.generated_ids)
        print(
            f"\n[{config.method}{'' if config.method == 'ar' else f' budget={config.budget}'} recurrent={config.recurrent}] "
            f"{len(trace.generated_ids)} tokens in {len(trace.rounds)} rounds, mean acceptance "
            f"{trace.mean_acceptance:.2f}, {trace.tokens_per_second:.1f} tok/s",
            file=sys.stderr,
        )
    return 0


def cmd_audit(args) -> int:
    from .prompts import load_prompts
    from .runner import audit, load_target_and_tokenizer

    prompts = load_prompts(args.prompts, args.n)
    target, tokenizer = load_target_and_tokenizer(args.target, args.device, args.dtype)
    spec = _drafter_spec(args)
    first = prompts[0] if isinstance(prompts[0], list) else tokenizer.encode(prompts[0]) if tokenizer else [0]
    config = _config(args, _resolve_budget(args, target, spec, first))
    update, close = _progress(len(prompts), f"audit {config.method}/{config.recurrent}", args.quiet)
    try:
        report = audit(target, tokenizer, spec, prompts, config, update)
    finally:
        close()
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['identical']}/{report['prompts']} outputs identical to AR ({config.method}, recurrent={config.recurrent})")
        for d in report["divergent"]:
            print(f"  prompt {d['prompt_index']}: first difference at token {d['position']}: AR {d['ar_token']} vs {d['method_token']}")
    return 0


def cmd_make_random(args) -> int:
    from .random_models import write_random_pair

    tdir, ddir = write_random_pair(args.out, args.kind, args.seed, block_size=args.block_size)
    print(json.dumps({"target": str(tdir), "drafter": str(ddir)}))
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args.out, quiet=args.quiet)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description="DDTree speculative decoding workbench")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text with AR, DFlash or DDTree")
    _add_run_options(g)
    g.add_argument("--prompt", help="prompt text")
    g.add_argument("--prompt-file", help="file whose text is the prompt")
    g.add_argument("--trace-out", help="write the full trace (JSON) here")
    g.set_defaults(func=cmd_generate)

    a = sub.add_parser("audit", help="compare a method's outputs with AR over a prompt set")
    _add_run_options(a)
    a.add_argument("--prompts", default="humaneval", help="humaneval, or a JSON list / JSONL file")
    a.add_argument("--n", type=_positive, default=None, help="only the first N prompts")
    a.set_defaults(func=cmd_audit)

    r = sub.add_parser("make-random", help="write a random-weight target + DFlash drafter pair")
    r.add_argument("--out", required=True)
    r.add_argument("--kind", default="hybrid", help="hybrid, dense, qwen3_next, qwen3_moe, qwen3_5_moe_text")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--block-size", type=_positive, default=8)
    r.set_defaults(func=cmd_make_random)

    # training recipe (workbench/train) and notebook grids (workbench/batch) add their own commands
    from .train.cli import add_subcommands as add_train_commands
    from .batch import add_subcommands as add_batch_commands

    add_train_commands(sub)
    add_batch_commands(sub)

    d = sub.add_parser("demo", help="the main job on the bundled default (what `make demo` runs)")
    d.add_argument("--out", default="out/demo")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
