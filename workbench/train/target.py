"""Target pre-training: next-token cross-entropy on the prepared corpus, the workbench's own classes.

    model = build_target(parse_target_config(cfg))     a preset (presets.py) or a config.json
    init_target_(model, seed)                         GPT-style init, GDN decay parameters as transformers
    train_target(...)                                 the loop (fast.batched_logits), checkpoints, export

Loaded models come with requires_grad False (inference); training turns gradients on explicitly.
On CUDA the forward runs under bf16 autocast with fp32 master weights and fp32 AdamW state; the
saved checkpoint is bf16. The GDN recurrence always runs in fp32.
"""

from __future__ import annotations

import math
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models import CausalLM, build_target, load_target, parse_target_config
from .common import Logger, TrainError, autocast_for, device_name, peak_memory, pick_device, read_json, seed_everything, versions
from .corpus import check_corpus_tokenizer, load_corpus
from .export import export_target, utc_now, write_card
from .fast import batched_logits
from .loop import Schedule, parse_steps, run_steps, smoothed_loss, windows_at
from .presets import TARGET_PRESETS, target_config_dict


@torch.no_grad()
def init_target_(model: CausalLM, seed: int, std: float = 0.02) -> CausalLM:
    g = torch.Generator().manual_seed(seed)
    layers = model.config.num_hidden_layers
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=g).log())
        elif name.endswith("dt_bias"):
            p.fill_(1.0)
        elif "norm" in name:
            p.fill_(0.0 if model.config.is_hybrid and "linear_attn.norm" not in name else 1.0)
        elif name.endswith("conv1d.weight"):
            bound = 1.0 / math.sqrt(p.shape[-1])
            p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=g))
        elif p.dim() >= 2:
            s = std / math.sqrt(2 * layers) if name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight")) else std
            p.copy_(torch.randn(p.shape, generator=g) * s)
        else:
            p.zero_()
    return model


def _check_norm_convention(model: CausalLM) -> None:
    """Zero-centred (1 + w) norms start at 0, plain ones at 1: the init above must match the model."""
    for name, mod in model.named_modules():
        zc = getattr(mod, "zero_centered", None)
        if zc is None:
            continue
        w = mod.weight
        if bool(zc) != bool((w == 0).all()):
            raise RuntimeError(f"norm {name} initialised for the wrong convention")


@dataclass
class TargetHyper:
    batch_size: int = 32
    seq_len: int = 1024
    seed: int = 0


def lm_loss(model: CausalLM, windows: torch.Tensor) -> torch.Tensor:
    logits, _ = batched_logits(model, windows[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate_lm(model: CausalLM, tokens: torch.Tensor, seq_len: int, device, batch_size: int = 16, max_tokens: int | None = None) -> dict:
    """Mean next-token CE (nats) over consecutive non-overlapping windows of ``seq_len`` + 1 tokens
    (each window predicts its last ``seq_len`` tokens from what precedes them inside the window)."""
    device = torch.device(device)
    n = tokens.numel() if max_tokens is None else min(tokens.numel(), max_tokens)
    length = seq_len + 1
    starts = list(range(0, max(1, n - 1), seq_len))
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with autocast_for(device):
        for i in range(0, len(starts), batch_size):
            chunk = [tokens[s : min(s + length, n)] for s in starts[i : i + batch_size]]
            chunk = [c for c in chunk if c.numel() >= 2]
            if not chunk:
                continue
            for c in sorted({c.numel() for c in chunk}):  # windows of equal length batch together
                group = torch.stack([x for x in chunk if x.numel() == c]).to(device)
                logits, _ = batched_logits(model, group[:, :-1])
                ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), group[:, 1:].reshape(-1), reduction="sum")
                total += float(ce)
                count += group[:, 1:].numel()
    model.train(was_training)
    if count == 0:
        raise TrainError("no tokens to evaluate on")
    return {"loss": total / count, "tokens": count, "seq_len": seq_len}


def resolve_target_config(spec: str, vocab_size: int, eos_id: int) -> dict:
    """A preset name or a config.json path (its vocab_size must equal the tokenizer's)."""
    if spec in TARGET_PRESETS:
        return target_config_dict(spec, vocab_size, eos_id)
    path = Path(spec)
    if not path.exists():
        raise TrainError(f"target config {spec!r}: not a known preset ({', '.join(sorted(TARGET_PRESETS))}) and not a config.json path")
    raw = read_json(path / "config.json" if path.is_dir() else path, "target config")
    parse_target_config(raw)
    if int(raw.get("vocab_size", -1)) != vocab_size:
        raise TrainError(f"{spec}: vocab_size {raw.get('vocab_size')} but the corpus tokenizer has {vocab_size} tokens")
    return raw


def train_target(
    *,
    config: str,
    corpus_dir: str | Path,
    out: str | Path,
    steps: int | str,
    batch_size: int = 32,
    seq_len: int = 1024,
    lr: float = 2e-3,
    warmup: int = 200,
    weight_decay: float = 0.1,
    seed: int = 0,
    device: str = "auto",
    checkpoint_every: int = 500,
    resume: bool = True,
    max_seconds: float | None = None,
    stop_at: int | None = None,
    max_steps: int | None = None,
    eval_tokens: int | None = None,
    name: str | None = None,
    quiet: bool = False,
    log=None,
) -> Path:
    """Pre-train a target; writes ``out/checkpoint`` (resumable) and ``out/model`` (HF layout, bf16, card)."""
    out = Path(out)
    log = log or Logger(out / "train.log", quiet=quiet, prefix="target: ")
    corpus = load_corpus(corpus_dir)
    vocab = int(corpus.manifest["vocab_size"])
    eos_id = int(corpus.manifest["eos_token_id"])
    raw = resolve_target_config(config, vocab, eos_id)
    check_corpus_tokenizer(corpus, corpus.directory, vocab)
    if corpus.train.numel() < seq_len + 1:
        raise TrainError(f"corpus has {corpus.train.numel()} training tokens, fewer than one window of {seq_len + 1}")
    if batch_size < 1 or seq_len < 2:
        raise TrainError(f"batch_size must be >= 1 and seq_len >= 2 (got {batch_size}, {seq_len})")
    dev = pick_device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    seed_everything(seed)
    model = build_target(parse_target_config(raw))
    init_target_(model, seed)
    _check_norm_convention(model)
    model = model.to(dev)
    model.reset_rotary()
    model.requires_grad_(True)  # explicit: inference models come frozen
    train_tokens = corpus.train
    steps = parse_steps(steps)
    sched = Schedule(steps=steps, lr=lr, warmup=min(warmup, steps // 10) if steps else warmup, weight_decay=weight_decay)
    hyper = asdict(TargetHyper(batch_size, seq_len, seed)) | {"config": raw, "corpus": corpus.manifest["fingerprint"]}
    state = {"kind": "target", "hyper": hyper}
    params = sum(p.numel() for p in model.parameters())
    log(f"{raw['model_type']} target, {params:,} parameters, on {device_name(dev)}; {steps} steps of {batch_size}x{seq_len} tokens")

    def loss_fn(step):
        windows = windows_at(train_tokens, step, seed, batch_size, seq_len + 1).to(dev, non_blocking=True)
        return lm_loss(model, windows), {}

    state = run_steps(model=model, params_model=model, sched=sched, loss_fn=loss_fn, device=dev,
                      checkpoint_dir=out / "checkpoint", state=state, checkpoint_every=checkpoint_every, resume=resume,
                      max_seconds=max_seconds, stop_at=stop_at, max_steps=max_steps, log=log, desc="train-target", quiet=quiet)
    model.eval()
    heldout = evaluate_lm(model, corpus.heldout, seq_len, dev, max_tokens=eval_tokens) if corpus.heldout.numel() > 1 else None
    train_eval = evaluate_lm(model, corpus.train, seq_len, dev, max_tokens=heldout["tokens"] if heldout else 200_000)
    log(f"final: train loss (last 50 steps) {smoothed_loss(state):.4f}, train eval {train_eval['loss']:.4f}, "
        f"held-out {heldout['loss'] if heldout else float('nan'):.4f}" + peak_memory(dev))
    model_dir = export_target(model, out / "model", corpus.directory)
    steps_done = int(state["step"])
    card = {
        "name": name or config,
        "summary": f"A {raw['model_type']} target pre-trained from scratch with the ddtree-workbench recipe (workbench/train) "
                   f"on CPython standard-library sources ({corpus.manifest.get('interpreter') or corpus.manifest['source']}).",
        "kind": "target",
        "architecture": raw["model_type"],
        "parameters": params,
        "dtype": "bfloat16",
        "data": {k: corpus.manifest[k] for k in ("source", "interpreter", "heldout_fraction", "heldout_rule", "files", "bytes", "tokens", "fingerprint")
                 if k in corpus.manifest} | {"heldout_file_list": corpus.manifest.get("heldout_files")},
        "interpreter": corpus.manifest.get("interpreter"),
        "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": vocab, "eos_token_id": eos_id,
                      "sha256": corpus.manifest.get("tokenizer_sha256")},
        "steps": steps_done,
        "steps_planned": state["schedule"]["steps"],
        "auto_steps": state.get("auto_steps"),
        "stopped_early": state.get("stopped_early", False),
        "batch": {"sequences": batch_size, "seq_len": seq_len},
        "tokens_seen": steps_done * batch_size * seq_len,
        "schedule": state["schedule"],
        "precision": "bf16 autocast, fp32 master weights and AdamW state (CUDA); fp32 (CPU); GDN recurrence in fp32",
        "seed": seed,
        "final_train_loss": smoothed_loss(state),
        "final_train_loss_note": "mean next-token CE (nats) over the last 50 training steps",
        "train_eval_loss": train_eval["loss"],
        "heldout_loss": heldout["loss"] if heldout else None,
        "heldout_eval": heldout,
        "training_seconds": round(float(state["seconds"]), 1),
        "device": device_name(dev),
        "versions": versions(),
        "platform": platform.platform(),
        "date": utc_now(),
        "loss_curve": state["losses"][:: max(1, len(state["losses"]) // 100)],
    }
    write_card(model_dir, card)
    return model_dir


def load_trainable_target(directory: str | Path, device) -> CausalLM:
    """A saved target in fp32 on ``device`` (frozen: drafter training never updates it)."""
    return load_target(directory, device, torch.float32)
