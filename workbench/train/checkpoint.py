"""Resumable training checkpoints: safetensors for tensors, JSON for the rest (never pickle).

A checkpoint directory holds
    model.safetensors      fp32 master weights (named parameters; a tied head is stored once)
    optimizer.safetensors  AdamW moments and step counts, keyed by parameter name
    state.json             step, hyperparameters, the loss history, timings

It is written to ``<dir>.tmp`` and renamed into place, so a crash leaves the previous one intact.
Batches and anchors are pure functions of (seed, step), so a resumed run continues exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .common import TrainError, read_json, write_json


def _named_params(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return dict(model.named_parameters())  # shared (tied) parameters appear once


def save_checkpoint(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> Path:
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    params = _named_params(model)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in params.items()}, str(tmp / "model.safetensors"))
    by_id = {id(p): name for name, p in params.items()}
    opt = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p)
            if not st:
                continue
            name = by_id[id(p)]
            for key, value in st.items():
                t = value if torch.is_tensor(value) else torch.tensor(float(value))
                opt[f"{name}::{key}"] = t.detach().contiguous().cpu()
    save_file(opt, str(tmp / "optimizer.safetensors"))
    write_json(tmp / "state.json", state)
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        if old.exists():
            shutil.rmtree(old)
        directory.rename(old)
    tmp.rename(directory)
    if old.exists():
        shutil.rmtree(old)
    return directory


def has_checkpoint(directory: str | Path) -> bool:
    d = Path(directory)
    return all((d / n).is_file() for n in ("model.safetensors", "optimizer.safetensors", "state.json"))


def load_checkpoint(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore weights and optimizer state in place; returns state.json. Refuses a checkpoint of another model."""
    directory = Path(directory)
    state = read_json(directory / "state.json", "checkpoint state")
    params = _named_params(model)
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        if keys != set(params):
            missing, extra = sorted(set(params) - keys)[:5], sorted(keys - set(params))[:5]
            raise TrainError(f"checkpoint {directory} does not fit this model (missing {missing}, unexpected {extra})")
        with torch.no_grad():
            for name, p in params.items():
                t = f.get_tensor(name)
                if tuple(t.shape) != tuple(p.shape):
                    raise TrainError(f"checkpoint {directory}: {name} has shape {tuple(t.shape)}, the model needs {tuple(p.shape)}")
                p.copy_(t.to(p.dtype))
    with safe_open(str(directory / "optimizer.safetensors"), framework="pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = next(n for n, q in params.items() if q is p)
            st = {}
            for key in ("step", "exp_avg", "exp_avg_sq"):
                full = f"{name}::{key}"
                if full in saved:
                    t = saved[full]
                    st[key] = t.to(torch.float32) if key == "step" else t.to(device=p.device, dtype=p.dtype)
            if st:
                optimizer.state[p] = st
    return state
