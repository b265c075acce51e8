"""`workbench train-*` commands: the training recipe from the command line.

    workbench train-tokenizer --out DIR [--source stdlib|DIR] [--vocab-size 4096]
        byte-level BPE on the training split (held-out files excluded) + the corpus encoded with it
    workbench prepare-corpus --tokenizer DIR --out DIR [--source stdlib|DIR]
        encode a corpus with an existing tokenizer (e.g. your own target's)
    workbench train-target --config tiny-hybrid|config.json --corpus DIR --out DIR --steps N
    workbench train-drafter --target DIR|zoo-name --corpus stdlib|DIR --out DIR --steps N
        a DFlash drafter for any target the workbench runs (the drafter lands in DIR/model)
    python -m workbench.train.zoo --out data/zoo        the whole bundled zoo
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _steps(value: str):
    if value == "auto":
        return "auto"
    return _positive(value)


def _positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {value!r}")
    return x


def _fraction(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {value!r}")
    if not 0 <= x < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {value!r}")
    return x


def _int_list(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}")
    if not out:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return out


def cmd_train_tokenizer(args) -> int:
    from .bpe import save_bpe, train_bpe
    from .common import Logger
    from .corpus import collect_documents, prepare_corpus, split_documents, stdlib_root

    out = Path(args.out)
    log = Logger(None, quiet=args.quiet, prefix="train-tokenizer: ")
    root = stdlib_root() if args.source == "stdlib" else Path(args.source)
    suffixes = tuple(args.suffix or [".py"])
    docs, _ = collect_documents(root, suffixes)
    train, heldout = split_documents(docs, args.heldout_fraction)
    log(f"{len(train)} training files ({len(heldout)} held out) from {root}")
    tok = train_bpe((t for _, t in train), args.vocab_size)
    save_bpe(tok, out)
    prepare_corpus(out, out, args.source, args.heldout_fraction, suffixes, log=log)
    print(json.dumps({"tokenizer": str(out / "tokenizer.json"), "corpus": str(out), "vocab_size": tok.get_vocab_size()}))
    return 0


def cmd_prepare_corpus(args) -> int:
    from .common import Logger
    from .corpus import prepare_corpus

    log = Logger(None, quiet=args.quiet, prefix="prepare-corpus: ")
    out = prepare_corpus(args.out, args.tokenizer, args.source, args.heldout_fraction, tuple(args.suffix or [".py"]), log=log)
    print(json.dumps({"corpus": str(out)}))
    return 0


def cmd_train_target(args) -> int:
    from .target import train_target

    model = train_target(config=args.config, corpus_dir=args.corpus, out=args.out, steps=args.steps, batch_size=args.batch_size,
                         seq_len=args.seq_len, lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay, seed=args.seed,
                         device=args.device, checkpoint_every=args.checkpoint_every, resume=not args.no_resume,
                         max_seconds=args.max_seconds, stop_at=args.stop_at, name=args.name, quiet=args.quiet)
    print(json.dumps({"target": str(model)}))
    return 0


def cmd_train_drafter(args) -> int:
    from ..runner import resolve_model_dir
    from .drafter import train_drafter

    target = resolve_model_dir(args.target)
    model = train_drafter(target_dir=target, corpus=args.corpus, out=args.out, steps=args.steps, batch_size=args.batch_size,
                          seq_len=args.seq_len, blocks_per_seq=args.blocks_per_seq, block_size=args.block_size, gamma=args.gamma,
                          num_layers=args.layers, intermediate_size=args.intermediate_size, target_layer_ids=args.target_layer_ids,
                          mask_token_id=args.mask_token_id, lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay,
                          self_distill_count=args.self_distill, distill_prompt_lens=tuple(args.distill_prompt_lens),
                          distill_batch=args.distill_batch, distill_fraction=args.distill_fraction,
                          distill_seconds=args.distill_seconds, distill_seed=args.distill_seed, distill_prompts=args.distill_prompts, cache_features=args.cache_features,
                          init_from=args.init_from, seed=args.seed,
                          device=args.device, checkpoint_every=args.checkpoint_every, resume=not args.no_resume,
                          max_seconds=args.max_seconds, stop_at=args.stop_at, name=args.name, quiet=args.quiet)
    print(json.dumps({"drafter": str(model)}))
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory (checkpoint/ and model/ go here; rerun to resume)")
    p.add_argument("--steps", type=_steps, required=True,
                   help="number of steps, or 'auto': timed inside the warmup to fill --max-seconds")
    p.add_argument("--lr", type=_positive_float)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--checkpoint-every", type=_positive, default=500)
    p.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint in --out")
    p.add_argument("--max-seconds", type=_positive_float, default=None, help="stop (and export) after this much training time")
    p.add_argument("--stop-at", type=_positive, default=None, help="end this call after that step (rerun to resume)")
    p.add_argument("--name", default=None, help="name in the model card")
    p.add_argument("--quiet", action="store_true")


def add_subcommands(sub) -> None:
    t = sub.add_parser("train-tokenizer", help="train the byte-level BPE tokenizer and prepare the corpus")
    t.add_argument("--out", required=True)
    t.add_argument("--source", default="stdlib", help="stdlib (the running interpreter's) or a directory")
    t.add_argument("--suffix", action="append", default=None, help="file suffixes to read (default .py)")
    t.add_argument("--vocab-size", type=_positive, default=4096)
    t.add_argument("--heldout-fraction", type=_fraction, default=0.02)
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=cmd_train_tokenizer)

    c = sub.add_parser("prepare-corpus", help="tokenize a corpus with an existing tokenizer (train/held-out by file)")
    c.add_argument("--tokenizer", required=True, help="a directory with tokenizer.json (e.g. a target)")
    c.add_argument("--out", required=True)
    c.add_argument("--source", default="stdlib")
    c.add_argument("--suffix", action="append", default=None)
    c.add_argument("--heldout-fraction", type=_fraction, default=0.02)
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=cmd_prepare_corpus)

    g = sub.add_parser("train-target", help="pre-train a target (next-token CE) on a prepared corpus")
    g.add_argument("--config", default="tiny-hybrid", help="a preset (tiny-hybrid, tiny-dense, ...) or a config.json")
    g.add_argument("--corpus", required=True, help="a prepared corpus directory (workbench train-tokenizer)")
    g.add_argument("--batch-size", type=_positive, default=32)
    g.add_argument("--seq-len", type=_positive, default=1024)
    _common(g)
    g.set_defaults(func=cmd_train_target, lr=None)

    d = sub.add_parser("train-drafter", help="train a DFlash drafter against a frozen target")
    d.add_argument("--target", required=True, help="target checkpoint directory or a bundled zoo name")
    d.add_argument("--corpus", default="stdlib", help="stdlib, a directory of .py files, or a prepared corpus")
    d.add_argument("--batch-size", type=_positive, default=64)
    d.add_argument("--seq-len", type=_positive, default=512)
    d.add_argument("--blocks-per-seq", type=_positive, default=16)
    d.add_argument("--block-size", type=_positive, default=None, help="default 16 (or that of --init-from)")
    d.add_argument("--gamma", type=_positive_float, default=7.0, help="position weight exp(-(k-1)/gamma)")
    d.add_argument("--layers", type=_positive, default=None, help="default 2 (or that of --init-from)")
    d.add_argument("--intermediate-size", type=_positive, default=None)
    d.add_argument("--target-layer-ids", type=_int_list, default=None, help="comma-separated target layers to tap")
    d.add_argument("--mask-token-id", type=int, default=None, help="default: the tokenizer's <|mask|>")
    d.add_argument("--self-distill", type=int, default=0, help="generate this many target continuations to train on")
    d.add_argument("--distill-prompt-lens", type=_int_list, default=[64, 128, 192, 256])
    d.add_argument("--distill-batch", type=_positive, default=512)
    d.add_argument("--distill-fraction", type=_fraction, default=0.75)
    d.add_argument("--distill-seconds", type=_positive_float, default=None, help="time bound of the generation")
    d.add_argument("--distill-seed", type=int, default=None, help="seed of the generation prompts (default --seed)")
    d.add_argument("--distill-prompts", choices=("windows", "docstrings"), default="windows",
                   help="generation prompts: random training windows, or task-shaped ones ending at a function docstring")
    d.add_argument("--cache-features", action="store_true",
                   help="keep the target's features from the generation and train on them only (the target never runs "
                        "during training: what makes CPU training practical)")
    d.add_argument("--init-from", default=None, help="start from this drafter's weights (fine-tuning; same shape)")
    _common(d)
    d.set_defaults(func=cmd_train_drafter, lr=None)

    for p, lr in ((g, 2e-3), (d, 1e-3)):
        p.set_defaults(lr=lr)
