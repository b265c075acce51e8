"""The pieces both trainers share: schedule, optimizer groups, deterministic batches, the step loop."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

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
) -> dict:
    """The training loop: ``loss_fn(step) -> (loss, metrics)``; checkpoints; resume; a wall-clock guard.

    ``params_model`` owns the trained parameters (the drafter for drafter training, the target
    for pre-training). Returns the final state (step, losses, timings, stopped_early).
    """
    sched.validate()
    optimizer = adamw(params_model, sched, device)
    start_step = 0
    state["schedule"] = asdict(sched)
    if resume and checkpoint_dir is not None and has_checkpoint(checkpoint_dir):
        saved = load_checkpoint(checkpoint_dir, params_model, optimizer)
        for key in ("schedule", "hyper"):
            if saved.get(key) != state.get(key):
                raise TrainError(
                    f"checkpoint {checkpoint_dir} was made with other settings ({key}: {saved.get(key)} vs {state.get(key)}); "
                    "use another --out or --no-resume"
                )
        state = saved
        start_step = int(saved["step"])
        log(f"{desc}: resumed from {checkpoint_dir} at step {start_step}")
    state.setdefault("losses", [])
    state.setdefault("seconds", 0.0)
    progress = Progress(sched.steps, desc, initial=start_step, quiet=quiet, log=log, every=max(1, sched.steps // 20))
    t0 = time.time()
    base_seconds = float(state.get("seconds", 0.0))
    autocast = autocast_for(device)
    params_model.train()
    trainable = [p for p in params_model.parameters() if p.requires_grad]
    state["stopped_early"] = False
    step = start_step
    for step in range(start_step, sched.steps):
        lr = sched.lr_at(step)
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
        value = float(loss.detach())
        state["losses"].append([step, value])
        progress.update(1, loss=value, lr=lr, gnorm=float(gnorm), **metrics)
        done = step + 1
        elapsed = base_seconds + time.time() - t0
        state["step"], state["seconds"] = done, elapsed
        over = max_seconds is not None and time.time() - t0 > max_seconds and done < sched.steps
        if checkpoint_dir is not None and (done % checkpoint_every == 0 or done == sched.steps or over):
            save_checkpoint(checkpoint_dir, params_model, optimizer, state)
        if over:
            state["stopped_early"] = True
            log(f"{desc}: wall-clock limit of {max_seconds:.0f}s reached at step {done}/{sched.steps}; stopping")
            break
    progress.close()
    if start_step >= sched.steps:
        log(f"{desc}: checkpoint already at step {start_step} of {sched.steps}")
    return state


def smoothed_loss(state: dict, last: int = 50) -> float | None:
    losses = [v for _, v in state.get("losses", [])][-last:]
    return sum(losses) / len(losses) if losses else None
