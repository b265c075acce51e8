"""Small shared pieces of the training recipe: seeds, devices, progress, hashing, atomic files, logs."""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch


class TrainError(ValueError):
    """Bad input to a training command: raised before any heavy compute, naming the problem."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TrainError(f"device {device!r} asked for but CUDA is not available")
    return dev


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA (weights and optimizer state stay fp32); plain fp32 on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, obj, indent: int = 2) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=indent) + "\n").encode())


def read_json(path: str | Path, what: str = "file"):
    path = Path(path)
    if not path.is_file():
        raise TrainError(f"{what} {path} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TrainError(f"{path}: not valid JSON ({exc})") from exc


class Progress:
    """A tqdm bar on stderr when tqdm is installed (optional on the GPU image), else periodic log lines."""

    def __init__(self, total: int, desc: str, initial: int = 0, quiet: bool = False, log=None, every: int = 50):
        self.total, self.desc, self.n, self.quiet, self.log, self.every = total, desc, initial, quiet, log, every
        self.bar = None
        if not quiet and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def update(self, n: int = 1, **postfix) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()}, refresh=False)
        elif self.n % self.every == 0 or self.n == self.total:
            extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in postfix.items())
            msg = f"{self.desc}: {self.n}/{self.total} {extra}"
            if self.log is not None:
                self.log(msg)  # a Logger: quiet silences stderr, the log file still gets the line
            elif not self.quiet:
                print(msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Logger:
    """Timestamped lines to stderr and, optionally, a log file."""

    def __init__(self, path: str | Path | None = None, quiet: bool = False, prefix: str = ""):
        self.path = Path(path) if path else None
        self.quiet = quiet
        self.prefix = prefix
        self.start = time.time()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.start:7.1f}s] {self.prefix}{msg}"
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def versions() -> dict:
    import platform

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "tokenizers", "safetensors", "numpy"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # pragma: no cover - optional
            pass
    return out


def peak_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    return f" (peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB)"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
