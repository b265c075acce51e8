"""The pieces both trainers share: schedule, optimizer groups, deterministic batches, the step loop."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

import torch

from .checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from .common import Progress, TrainError, autocast_for


@dataclass
class Schedule:
    steps: int
    lr: float
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0

    def validate(self) -> "Schedule":
        if self.steps < 1:
            raise TrainError(f"steps must be >= 1, got {self.steps}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise TrainError(f"learning rate must be a positive number, got {self.lr}")
        if self.warmup < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise TrainError(f"warmup must be >= 0 and min_lr_ratio in [0, 1] (got {self.warmup}, {self.min_lr_ratio})")
        return self

    def validate_auto(self) -> "Schedule":
        return replace(self, steps=1).validate() and self

    def warmup_lr(self, step: int) -> float:
        """The learning rate during warmup (independent of the schedule's length)."""
        return self.lr * (step + 1) / self.warmup if self.warmup else self.lr

    def lr_at(self, step: int) -> float:
        """Linear warmup, then cosine from lr down to min_lr_ratio * lr at the last step."""
        if self.warmup and step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        span = max(1, self.steps - self.warmup)
        progress = min(1.0, (step - self.warmup) / span)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def adamw(model: torch.nn.Module, sched: Schedule, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not embeddings, norms, gates' scalars, conv kernels)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() == 2 and "embed" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": sched.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = {"fused": True} if device.type == "cuda" else {"foreach": False}
    return torch.optim.AdamW(groups, lr=sched.lr, betas=(sched.beta1, sched.beta2), **kwargs)


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """The RNG of one step: a pure function of (seed, step, stream), so resumed runs see the same data."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step * 7919 + stream * 104_729) % (2**63 - 1))


def windows_at(tokens: torch.Tensor, step: int, seed: int, batch: int, length: int) -> torch.Tensor:
    """``batch`` random windows of ``length`` tokens of a 1-D stream, for this step. [batch, length]."""
    n = tokens.numel()
    if n < length:
        raise TrainError(f"the corpus has {n} tokens, fewer than one window of {length}")
    g = step_generator(seed, step)
    starts = torch.randint(0, n - length + 1, (batch,), generator=g)
    return torch.stack([tokens[s : s + length] for s in starts.tolist()])


AUTO_FIRST = (10, 40)  # steps=auto: time steps 10..40 and fix the schedule's length, then re-time up to warmup - 10


def parse_steps(steps) -> int:
    """A positive step count, or ``"auto"`` / 0: calibrate the count to the time budget."""
    if steps in ("auto", 0, None):
        return 0
    try:
        n = int(steps)
    except (TypeError, ValueError):
        raise TrainError(f"steps must be a positive integer or 'auto', got {steps!r}")
    if n < 1:
        raise TrainError(f"steps must be a positive integer or 'auto', got {steps!r}")
    return n


def run_steps(
    *,
    model: torch.nn.Module,
    params_model: torch.nn.Module,
    sched: Schedule,
    loss_fn,
    device: torch.device,
    checkpoint_dir,
    state: dict,
    checkpoint_every: int,
    resume: bool,
    max_seconds: float | None,
    log,
    desc: str,
    quiet: bool = False,
    stop_at: int | None = None,
    max_steps: int | None = None,
) -> dict:
    """The training loop: ``loss_fn(step) -> (loss, metrics)``; checkpoints; resume; a wall-clock guard.

    ``params_model`` owns the trained parameters (the drafter for drafter training, the target
    for pre-training). ``stop_at`` ends this call after that step (checkpointed; rerun to continue
    the same schedule). ``sched.steps == 0`` (auto): steps 5..25 are timed and the schedule's
    length is then fixed to fill ``max_seconds`` (at most ``max_steps``); the warmup is longer than
    the calibration, so every learning rate equals that of a run given that step count up front,
    and the card records it. Returns the final state (step, losses, timings, stopped_early).
    """
    auto = sched.steps == 0
    if auto:
        if max_seconds is None:
            raise TrainError("steps 'auto' needs a time budget (max_seconds / --max-seconds)")
        if sched.warmup < AUTO_FIRST[1] + 20:
            raise TrainError(f"steps 'auto' needs a warmup of at least {AUTO_FIRST[1] + 20} steps (it is timed inside the warmup)")
        sched.validate_auto()
    else:
        sched.validate()
    optimizer = adamw(params_model, sched, device)
    start_step = 0
    state["schedule"] = asdict(sched)
    if resume and checkpoint_dir is not None and has_checkpoint(checkpoint_dir):
        saved = load_checkpoint(checkpoint_dir, params_model, optimizer)
        mine, theirs = dict(state["schedule"]), dict(saved.get("schedule") or {})
        if auto:  # an auto run adopts the length its checkpoint fixed
            mine.pop("steps"), theirs.pop("steps", None)
        if mine != theirs or saved.get("hyper") != state.get("hyper"):
            key = "schedule" if mine != theirs else "hyper"
            raise TrainError(
                f"checkpoint {checkpoint_dir} was made with other settings ({key}: {saved.get(key)} vs {state.get(key)}); "
                "use another --out or --no-resume"
            )
        if auto and saved["schedule"]["steps"]:
            sched = replace(sched, steps=int(saved["schedule"]["steps"]))
            auto = False
        state = saved
        state["schedule"] = asdict(sched)
        start_step = int(saved["step"])
        log(f"{desc}: resumed from {checkpoint_dir} at step {start_step}")
    state.setdefault("losses", [])
    state.setdefault("seconds", 0.0)
    total = sched.steps if sched.steps else (max_steps or 0)
    progress = Progress(total, desc, initial=start_step, quiet=quiet, log=log, every=max(1, (total or 500) // 20))
    t0 = time.time()
    # auto: marks where the speed is measured; every one lies inside the warmup, whose learning rates do
    # not depend on the schedule's length, so the run equals one given the final length up front
    marks = [start_step + AUTO_FIRST[0], start_step + AUTO_FIRST[1], sched.warmup - 10] if auto else []
    marks = sorted(m for m in set(marks) if m > start_step and m <= sched.warmup - 10)
    marks_t: dict[int, float] = {}
    base_seconds = float(state.get("seconds", 0.0))
    autocast = autocast_for(device)
    params_model.train()
    trainable = [p for p in params_model.parameters() if p.requires_grad]
    state["stopped_early"] = False
    step = start_step
    while (sched.steps == 0 and step < (max_steps or float("inf"))) or step < sched.steps:
        lr = sched.lr_at(step) if step >= sched.warmup or not auto else sched.warmup_lr(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast:
            loss, metrics = loss_fn(step)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{desc}: loss is {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(trainable, sched.grad_clip)
        optimizer.step()
        value = float(loss.detach())  # also a device sync: step timings below are real
        state["losses"].append([step, value])
        progress.update(1, loss=value, lr=lr, gnorm=float(gnorm), **metrics)
        done = step + 1
        step = done
        if auto and done in marks:
            marks_t[done] = time.time()
            idx = marks.index(done)
            if idx > 0:  # fix (or re-fix) the length from the speed since the previous mark
                per_step = (marks_t[done] - marks_t[marks[idx - 1]]) / (done - marks[idx - 1])
                left = max_seconds - (time.time() - t0)
                n = max(done + 1, done + int(0.9 * left / per_step))
                if max_steps:
                    n = min(n, max(done + 1, max_steps))
                sched = replace(sched, steps=n)
                state["schedule"] = asdict(sched)
                state["auto_steps"] = {"seconds_per_step": per_step, "budget_seconds": max_seconds, "steps": n, "fixed_at_step": done}
                progress.total, progress.every = n, max(1, n // 20)
                log(f"{desc}: {per_step * 1000:.1f} ms/step -> {n} steps fill the {max_seconds:.0f}s budget")
        elapsed = base_seconds + time.time() - t0
        state["step"], state["seconds"] = done, elapsed
        end = sched.steps if sched.steps else float("inf")
        over = max_seconds is not None and time.time() - t0 > max_seconds and done < end
        halt = stop_at is not None and done >= stop_at and done < end
        if checkpoint_dir is not None and (done % checkpoint_every == 0 or done == end or over or halt):
            save_checkpoint(checkpoint_dir, params_model, optimizer, state)
        if over or halt:
            state["stopped_early"] = True
            why = f"wall-clock limit of {max_seconds:.0f}s" if over else f"--stop-at {stop_at}"
            log(f"{desc}: {why} reached at step {done}/{sched.steps or '?'}; stopping (rerun to resume)")
            break
    progress.close()
    if sched.steps and start_step >= sched.steps:
        log(f"{desc}: checkpoint already at step {start_step} of {sched.steps}")
    return state


def smoothed_loss(state: dict, last: int = 50) -> float | None:
    losses = [v for _, v in state.get("losses", [])][-last:]
    return sum(losses) / len(losses) if losses else None
