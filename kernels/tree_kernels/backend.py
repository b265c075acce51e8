"""Which implementation runs: the Triton kernels on CUDA, the torch references elsewhere.

``WORKBENCH_KERNELS`` (or :func:`set_backend`) forces one: ``auto`` (default), ``torch`` or
``triton``. Forcing ``triton`` on CPU tensors only works under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import contextlib
import os

import torch

_CHOICES = ("auto", "torch", "triton")
_backend = os.environ.get("WORKBENCH_KERNELS", "auto").lower()
if _backend not in _CHOICES:
    raise ValueError(f"WORKBENCH_KERNELS={_backend!r}: expected one of {_CHOICES}")


# The fused row-wise kernels (norms, GDN gates: tree_kernels.norms) are opt-in until they are
# measured on the GPU: WORKBENCH_FUSED_NORMS=1 (or set_fused_norms) turns them on where Triton runs.
_fused_norms = os.environ.get("WORKBENCH_FUSED_NORMS", "0").lower() in ("1", "true", "on", "yes")


def set_fused_norms(enabled: bool) -> None:
    global _fused_norms
    _fused_norms = bool(enabled)


def fused_norms_enabled() -> bool:
    return _fused_norms


@contextlib.contextmanager
def use_fused_norms(enabled: bool = True):
    old = _fused_norms
    set_fused_norms(enabled)
    try:
        yield
    finally:
        set_fused_norms(old)


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def set_backend(name: str) -> None:
    global _backend
    name = name.lower()
    if name not in _CHOICES:
        raise ValueError(f"kernel backend {name!r}: expected one of {_CHOICES}")
    if name == "triton" and not triton_available():
        raise RuntimeError("kernel backend 'triton' requested but triton is not importable")
    _backend = name


def get_backend() -> str:
    return _backend


@contextlib.contextmanager
def use_backend(name: str):
    old = _backend
    set_backend(name)
    try:
        yield
    finally:
        set_backend(old)


def use_triton(x: torch.Tensor) -> bool:
    """True when the Triton kernel should run for a tensor on this device."""
    if _backend == "torch":
        return False
    if _backend == "triton":
        return True
    return x.is_cuda and triton_available()
