"""Build the bundled zoo: tokenizer + corpus, then for each pair a target and its DFlash drafter.

    python -m workbench.train.zoo --out data/zoo                 the recipe as committed (CUDA advised)
    python -m workbench.train.zoo --out /tmp/zoo --scale test    a minutes-long CPU run of the same code

Steps (each resumable: rerun the same command and finished parts are reused or resumed):
    1. byte-level BPE on the stdlib training split (held-out files excluded), corpus tokenized
    2. per pair (both pairs can run as parallel processes on one GPU, ``--parallel``):
       train-target -> data/zoo/<name>/ ; train-drafter (with self-distillation) -> data/zoo/<name>-dflash/
With ``--pack DIR`` every finished model directory is also packed into tar volumes of at most
15.5 MiB in DIR (what a device run sends back).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .common import Logger, TrainError, write_json

PAIRS = ("tiny-hybrid", "tiny-dense")
PACK_LIMIT = int(15.5 * 2**20)


@dataclass
class Scale:
    vocab_size: int = 4096
    heldout_fraction: float = 0.02
    target_steps: int | str = "auto"  # auto: calibrated to target_seconds
    target_max_steps: int = 20000
    target_batch: int = 32
    target_seq_len: int = 1024
    target_lr: float = 2e-3
    target_warmup: int = 200
    drafter_steps: int | str = "auto"  # auto: calibrated to drafter_seconds (or what the deadline leaves)
    drafter_max_steps: int = 20000
    drafter_batch: int = 64
    drafter_seq_len: int = 512
    drafter_blocks: int = 16
    drafter_lr: float = 1.5e-3
    drafter_warmup: int = 200
    distill: int = 16384  # an upper bound: generation is time-bounded by distill_seconds
    distill_batch: int = 1024
    distill_prompt_lens: tuple = (64, 128, 192, 256)
    distill_fraction: float = 0.75
    block_size: int = 16
    gamma: float = 7.0
    checkpoint_every: int = 500
    target_seconds: float | None = 250.0
    drafter_seconds: float | None = 180.0
    distill_seconds: float | None = 40.0
    reserve_seconds: float = 35.0  # kept free before the deadline for evaluation, export and packing
    presets: dict = field(default_factory=lambda: {p: p for p in PAIRS})
    # stage "finetune" (CPU is fine): the target's greedy continuations (128 tokens) of task-shaped prompts
    # (the 160 tokens ending at a function docstring of a training file), features cached at generation,
    # then a short fine-tune of each stage-1 drafter on them
    ft_distill: int = 2048
    ft_distill_batch: int = 64
    ft_distill_seed: int = 2000
    ft_prompts: str = "docstrings"
    ft_prompt_lens: tuple = (160,)
    ft_seq_len: int = 288
    ft_steps: int | str = 400  # or auto: calibrated to ft_seconds
    ft_batch: int = 16
    ft_lr: float = 5e-4
    ft_warmup: int = 20
    ft_seconds: float | None = None  # a time bound on the fine-tune's steps (None: all ft_steps)


SCALES = {
    "full": Scale(),
    # the device smoke test: real shapes and batches, a few steps (timings, and the whole flow on CUDA)
    "smoke": Scale(target_steps=30, drafter_steps=30, distill=1024, target_warmup=5, drafter_warmup=5, checkpoint_every=1000),
    # stage 3 of the bundled drafters (2026-12-04, an H200): stage 2 again on the GPU, on every docstring of the
    # training files at three prompt lengths (24,000 continuations) and for a fixed time
    "gpu-finetune": Scale(ft_distill=24000, ft_distill_batch=2048, ft_prompt_lens=(96, 160, 224), ft_steps="auto",
                          ft_seconds=170.0, ft_warmup=100, ft_batch=64, ft_lr=6e-4),
    # CPU tests: test-sized models, a small corpus
    "test": Scale(vocab_size=320, heldout_fraction=0.2, target_steps=30, target_batch=4, target_seq_len=64, target_warmup=3,
                  target_lr=3e-3, drafter_steps=30, drafter_batch=4, drafter_seq_len=64, drafter_blocks=3, drafter_warmup=3,
                  drafter_lr=3e-3, distill=8, distill_batch=4, distill_prompt_lens=(16, 24), checkpoint_every=10,
                  presets={"tiny-hybrid": "test-hybrid", "tiny-dense": "test-dense"}),
}

_PRESET_DRAFTER = {"test-hybrid": "test-hybrid", "test-dense": "test-dense", "tiny-hybrid": "tiny-hybrid", "tiny-dense": "tiny-dense"}


def build_corpus(work: Path, scale: Scale, source: str = "stdlib", log=print) -> Path:
    """Tokenizer trained on the training split only, then the corpus encoded with it (reused if present)."""
    from .bpe import save_bpe, train_bpe
    from .corpus import collect_documents, is_prepared, prepare_corpus, split_documents, stdlib_root

    corpus_dir = work / "corpus"
    if is_prepared(corpus_dir):
        log(f"corpus: reusing {corpus_dir}")
        return corpus_dir
    root = stdlib_root() if source == "stdlib" else Path(source)
    docs, _ = collect_documents(root)
    train, _ = split_documents(docs, scale.heldout_fraction)
    t0 = time.time()
    tok = train_bpe((t for _, t in train), scale.vocab_size)
    save_bpe(tok, work / "tokenizer")
    log(f"tokenizer: {tok.get_vocab_size()} tokens trained on {len(train)} files in {time.time() - t0:.1f}s")
    tmp = work / "corpus.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    prepare_corpus(tmp, work / "tokenizer", source, scale.heldout_fraction, log=log)
    tmp.rename(corpus_dir)
    return corpus_dir


def pack_model(model_dir: Path, pack_dir: Path, limit: int = PACK_LIMIT) -> list[Path]:
    """Tar volumes ``<name>.<k>.tar`` of at most ``limit`` bytes holding ``<name>/<file>`` (first fit, largest first)."""
    pack_dir.mkdir(parents=True, exist_ok=True)
    files = sorted((p for p in model_dir.iterdir() if p.is_file()), key=lambda p: -p.stat().st_size)
    bins: list[list[Path]] = []
    sizes: list[int] = []
    for f in files:
        size = f.stat().st_size + 2048  # tar header and padding
        if size > limit:
            raise TrainError(f"{f} is {size} bytes: larger than one pack volume ({limit})")
        for i, s in enumerate(sizes):
            if s + size <= limit - 10240:
                bins[i].append(f)
                sizes[i] += size
                break
        else:
            bins.append([f])
            sizes.append(size)
    out = []
    for i, group in enumerate(bins, 1):
        path = pack_dir / f"{model_dir.name}.{i}.tar"
        with tarfile.open(path, "w") as tar:
            for f in sorted(group):
                tar.add(f, arcname=f"{model_dir.name}/{f.name}")
        out.append(path)
    return out


def unpack(pack_dir: Path, out: Path) -> list[str]:
    """Extract every ``*.tar`` from ``pack_dir`` into ``out`` (plain files in one folder level only)."""
    names = set()
    for path in sorted(pack_dir.glob("*.tar")):
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                parts = Path(m.name).parts
                if not m.isfile() or len(parts) != 2 or m.name.startswith(("/", "..")) or ".." in parts:
                    raise TrainError(f"{path}: unexpected member {m.name!r}")
                names.add(parts[0])
            tar.extractall(out, filter="data")
    return sorted(names)


def build_pair(pair: str, out: Path, work: Path, corpus_dir: Path, scale: Scale, device: str, seed: int,
               pack: Path | None, quiet: bool, log_path: Path | None, deadline: float | None = None) -> dict:
    from .drafter import train_drafter
    from .presets import DRAFTER_PRESETS
    from .target import train_target

    log = Logger(log_path, quiet=quiet, prefix=f"{pair}: ")
    preset = scale.presets[pair]
    t0 = time.time()

    def budget(planned):
        """A phase's seconds: as planned, but never past the deadline minus the reserve."""
        if deadline is None:
            return planned
        left = deadline - time.time() - scale.reserve_seconds
        if left < 5:
            raise TrainError(f"{pair}: the deadline leaves {left:.0f}s, too little to train")
        return left if planned is None else min(planned, left)

    tdir = train_target(config=preset, corpus_dir=corpus_dir, out=work / pair, steps=scale.target_steps,
                        batch_size=scale.target_batch, seq_len=scale.target_seq_len, lr=scale.target_lr,
                        warmup=scale.target_warmup, seed=seed, device=device, checkpoint_every=scale.checkpoint_every,
                        max_seconds=budget(scale.target_seconds), max_steps=scale.target_max_steps, name=pair,
                        quiet=quiet, log=log)
    final_t = out / pair
    if final_t.exists():
        shutil.rmtree(final_t)
    shutil.copytree(tdir, final_t)
    if pack:
        pack_model(final_t, pack)
    t1 = time.time()
    dp = DRAFTER_PRESETS[_PRESET_DRAFTER[preset]]
    ddir = train_drafter(target_dir=final_t, corpus=corpus_dir, out=work / f"{pair}-dflash", steps=scale.drafter_steps,
                         batch_size=scale.drafter_batch, seq_len=scale.drafter_seq_len, blocks_per_seq=scale.drafter_blocks,
                         block_size=scale.block_size, gamma=scale.gamma, num_layers=dp["num_layers"],
                         intermediate_size=dp["intermediate_size"], lr=scale.drafter_lr, warmup=scale.drafter_warmup,
                         self_distill_count=scale.distill, distill_prompt_lens=tuple(scale.distill_prompt_lens),
                         distill_batch=scale.distill_batch, distill_fraction=scale.distill_fraction,
                         distill_seconds=scale.distill_seconds, seed=seed + 1, device=device,
                         checkpoint_every=scale.checkpoint_every, max_steps=scale.drafter_max_steps,
                         max_seconds=_drafter_budget(budget, scale), name=f"{pair}-dflash", quiet=quiet, log=log)
    final_d = out / f"{pair}-dflash"
    if final_d.exists():
        shutil.rmtree(final_d)
    shutil.copytree(ddir, final_d)
    if pack:
        pack_model(final_d, pack)
    log(f"done: target {t1 - t0:.0f}s, drafter {time.time() - t1:.0f}s")
    return {"pair": pair, "target_seconds": t1 - t0, "drafter_seconds": time.time() - t1}


def _drafter_budget(budget, scale: Scale):
    """Drafter training time: what the deadline leaves once self-distillation (and its last batch) is done."""
    left = budget(None)  # None without a deadline
    if left is None:
        return scale.drafter_seconds
    left -= ((scale.distill_seconds or 0) + 15) if scale.distill else 5
    if scale.drafter_seconds is not None:
        left = min(left, scale.drafter_seconds)
    return max(5.0, left)


def finetune_pair(pair: str, out: Path, work: Path, corpus_dir: Path, scale: Scale, device: str, seed: int, quiet: bool,
                  log_path: Path | None) -> dict:
    """A fine-tuning stage: ``out/<pair>-dflash`` trained further on fresh self-distilled data (features cached), in place."""
    from .drafter import train_drafter

    log = Logger(log_path, quiet=quiet, prefix=f"{pair}: ")
    start = out / f"{pair}-dflash"
    if not (start / "config.json").is_file():
        raise TrainError(f"{start}: no stage-1 drafter to fine-tune")
    # the starting drafter, kept beside the work (its card is summarised in the new card); keyed by its card, so an
    # interrupted fine-tune resumes and a finished one, run again, is a further stage from the new drafter
    from .common import sha256_file

    tag = sha256_file(start / "card.json")[:12]
    keep = work / f"{pair}-dflash-from-{tag}"
    if not keep.exists():
        shutil.copytree(start, keep)
    t0 = time.time()
    ddir = train_drafter(target_dir=out / pair, corpus=corpus_dir, out=work / f"{pair}-dflash-ft-{tag}", steps=scale.ft_steps,
                         batch_size=scale.ft_batch, seq_len=scale.ft_seq_len, blocks_per_seq=scale.drafter_blocks,
                         gamma=scale.gamma, lr=scale.ft_lr, warmup=scale.ft_warmup, self_distill_count=scale.ft_distill,
                         distill_prompt_lens=tuple(scale.ft_prompt_lens), distill_batch=scale.ft_distill_batch,
                         distill_seed=scale.ft_distill_seed, distill_prompts=scale.ft_prompts, cache_features=True,
                         init_from=keep, seed=seed, max_seconds=scale.ft_seconds,
                         device=device, checkpoint_every=50, name=f"{pair}-dflash", quiet=quiet, log=log)
    shutil.rmtree(start)
    shutil.copytree(ddir, start)
    log(f"fine-tuned {start} in {time.time() - t0:.0f}s")
    return {"pair": pair, "finetune_seconds": time.time() - t0}


def zoo_size(out: Path) -> dict:
    sizes = {}
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        sizes[d.name] = {f.name: f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()}
    total = sum(sum(v.values()) for v in sizes.values())
    return {"models": sizes, "total_bytes": total, "total_mib": total / 2**20,
            "largest_file_mib": max((s for v in sizes.values() for s in v.values()), default=0) / 2**20}


def _loss_cell(loss, ev) -> str:
    if loss:
        return f"{loss:.3f}"
    return f"tau_est {ev['tau_est']:.2f} (continuations of held-out-file windows)" if ev else ""


def _lineage(card: dict) -> list[dict]:
    """The stages a model was trained in, oldest first: its card, then what each was initialized from."""
    stages = [card]
    while (stages[-1].get("initialized_from") or {}).get("card"):
        stages.append(stages[-1]["initialized_from"]["card"])
    return stages[::-1]


def _tokens_seen(card: dict) -> int:
    if card.get("tokens_seen"):
        return int(card["tokens_seen"])
    batch = card.get("batch") or {}  # older summaries kept only the batch shape
    return int(card.get("steps", 0)) * int(batch.get("sequences", 0)) * int(batch.get("seq_len", 0))


def write_zoo_readme(out: Path) -> Path:
    """data/zoo/README.md: one row per model from its card, and how to rebuild them."""
    import json as _json

    rows = []
    for d in sorted(p for p in out.iterdir() if p.is_dir() and (p / "card.json").is_file()):
        c = _json.loads((d / "card.json").read_text())
        size = sum(f["bytes"] for f in c["files"].values()) + (d / "card.json").stat().st_size
        kind = c.get("architecture") or f"DFlash, {c.get('layers')} layers, taps {c.get('target_layer_ids')}"
        loss = c.get("heldout_loss")
        ev = (c.get("eval") or {}).get("self_distilled_heldout_prompts") or {}
        steps, tokens, device = str(c["steps"]), f"{c.get('tokens_seen', 0) / 1e6:.1f}M", c.get("device", "")
        stages = _lineage(c)
        if len(stages) > 1:  # a fine-tuned drafter: every stage, the first one first
            steps = " + ".join(str(st.get("steps")) for st in stages)
            tokens = " + ".join(f"{_tokens_seen(st) / 1e6:.1f}M" for st in stages)
            devices = [st.get("device") for st in stages]
            device = " + ".join(d for i, d in enumerate(devices) if d not in devices[:i])
        rows.append(f"| {d.name} | {kind} | {c['parameters'] / 1e6:.2f}M | {steps} | {tokens} | "
                    f"{c['final_train_loss']:.3f} | {_loss_cell(loss, ev)} | {size / 2**20:.2f} MiB | {device} |")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and f.name != "README.md")
    text = "\n".join([
        "# The bundled zoo",
        "",
        "Tiny models trained from scratch with the workbench's own recipe (`workbench/train/`) on the CPython",
        "standard-library sources, so every notebook, test and benchmark runs offline on real acceptance.",
        "Each directory has a `card.json` (data, steps, tokens, losses, date, device, sha256 and size of every file)",
        "and a README generated from it. `--target tiny-hybrid` style names resolve here.",
        "",
        "| model | architecture | params | steps | tokens seen | final train loss | held-out loss / drafter tau_est | size | trained on |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Total: {total / 2**20:.2f} MiB (plus this README).",
        "",
        "Rebuild: `python -m workbench.train.zoo --out data/zoo --parallel` (stage 1: tokenizer, corpus, targets, drafters; a GPU",
        "advised), then `OMP_NUM_THREADS=1 python -m workbench.train.zoo --out data/zoo --stage finetune --parallel` (stage 2:",
        "each drafter fine-tuned on the target's own continuations of docstring-shaped prompts; CPU is fine), then",
        "`python -m workbench.train.zoo --out data/zoo --stage finetune --parallel --scale gpu-finetune` (stage 3: the same on",
        "every docstring at three prompt lengths, on a GPU). Each drafter's card holds the settings of every stage.",
        "",
    ])
    path = out / "README.md"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.train.zoo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/zoo", help="where the model directories go")
    p.add_argument("--work", default="out/zoo-work", help="checkpoints, corpus, logs (resumable)")
    p.add_argument("--corpus", default=None, help="a prepared corpus directory (else built from the stdlib)")
    p.add_argument("--source", default="stdlib", help="corpus source when building it: stdlib or a directory")
    p.add_argument("--scale", choices=sorted(SCALES), default="full")
    p.add_argument("--pairs", default=",".join(PAIRS))
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parallel", action="store_true", help="train the pairs as parallel processes (one GPU is fine)")
    p.add_argument("--pack", default=None, help="also pack every finished model into <=15.5 MiB tar volumes here")
    p.add_argument("--logs", default=None, help="per-pair log files here (default: the work directory)")
    p.add_argument("--prepare-only", action="store_true", help="stop after the tokenizer and corpus")
    p.add_argument("--stage", choices=("train", "finetune", "all"), default="train",
                   help="train: targets + drafters (GPU advised); finetune: stage 2 on the drafters (CPU is fine); all: both")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a Scale field, e.g. target_steps=2000")
    p.add_argument("--deadline-seconds", type=float, default=None,
                   help="finish everything within this many seconds from now (phases shrink to fit)")
    p.add_argument("--deadline-at", type=float, default=None, help=argparse.SUPPRESS)  # absolute, for the children
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    deadline = args.deadline_at or (time.time() + args.deadline_seconds if args.deadline_seconds else None)
    scale = SCALES[args.scale]
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in Scale.__dataclass_fields__ or key == "presets":
            raise SystemExit(f"--set {item}: unknown field {key!r}")
        current = getattr(scale, key)
        if isinstance(current, tuple):
            parsed = tuple(int(v) for v in value.split(","))
        elif isinstance(current, str) and key not in ("target_steps", "drafter_steps", "ft_steps"):
            parsed = value
        elif key in ("target_steps", "drafter_steps", "ft_steps"):
            parsed = value if value == "auto" else int(value)
        elif current is None or isinstance(current, float):
            parsed = None if value == "none" else float(value)
        else:
            parsed = type(current)(value)
        scale = replace(scale, **{key: parsed})
    pairs = [x for x in args.pairs.split(",") if x]
    bad = [x for x in pairs if x not in PAIRS]
    if bad:
        raise SystemExit(f"unknown pairs {bad}; known {list(PAIRS)}")
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    logs = Path(args.logs) if args.logs else work
    log = Logger(None, quiet=args.quiet, prefix="zoo: ")
    try:
        corpus_dir = Path(args.corpus) if args.corpus else build_corpus(work, scale, args.source, log)
        if args.prepare_only:
            print(json.dumps({"corpus": str(corpus_dir)}))
            return 0
        pack = Path(args.pack) if args.pack else None
        results = []
        if args.parallel and len(pairs) > 1:
            procs = []
            for pair in pairs:
                cmd = [sys.executable, "-m", "workbench.train.zoo", "--out", str(out), "--work", str(work), "--corpus", str(corpus_dir),
                       "--scale", args.scale, "--pairs", pair, "--device", args.device, "--seed", str(args.seed), "--logs", str(logs),
                       "--stage", args.stage]
                cmd += [f"--set={s}" for s in args.set] + ([f"--deadline-at={deadline}"] if deadline else []) + (["--pack", str(pack)] if pack else []) + (["--quiet"] if args.quiet else [])
                procs.append((pair, subprocess.Popen(cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"))))
            failed = [pair for pair, proc in procs if proc.wait() != 0]
            if failed:
                raise TrainError(f"pairs {failed} failed (see their logs in {logs})")
        else:
            for pair in pairs:
                if args.stage in ("train", "all"):
                    results.append(build_pair(pair, out, work, corpus_dir, scale, args.device, args.seed, pack, args.quiet,
                                              logs / f"{pair}.log", deadline))
                if args.stage in ("finetune", "all"):
                    results.append(finetune_pair(pair, out, work, corpus_dir, scale, args.device, args.seed, args.quiet,
                                                 logs / f"{pair}-finetune.log"))
                    if pack:
                        pack_model(out / f"{pair}-dflash", pack)
        summary = {"scale": asdict(scale), "results": results, "zoo": zoo_size(out)}
        write_json(work / "zoo-summary.json", summary)
        print(json.dumps({"zoo": str(out), "total_mib": round(summary["zoo"]["total_mib"], 2)}))
        return 0
    except TrainError as exc:
        print(f"zoo: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
