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


class Switch:
    """An on/off setting: read from an environment variable at import, changed at run time with
    ``set`` or, for a block, ``use``."""

    def __init__(self, env: str, default: bool = True):
        self.on = os.environ.get(env, "1" if default else "0").lower() not in ("0", "false", "off", "no")

    def set(self, enabled: bool) -> None:
        self.on = bool(enabled)

    def enabled(self) -> bool:
        return self.on

    @contextlib.contextmanager
    def use(self, enabled: bool = True):
        old, self.on = self.on, bool(enabled)
        try:
            yield
        finally:
            self.on = old


# The fused row-wise kernels (norms, GDN gates: tree_kernels.norms) run wherever Triton runs: on the
# H200 they are 3-6x faster per call than the torch chains with the same error against fp32, and
# doubled the bundled hybrid's AR tokens/s (data/results/kernels-*, e2e-*). WORKBENCH_FUSED_NORMS=0
# (or set_fused_norms(False)) keeps the torch references with the Triton tree kernels.
_fused_norms = Switch("WORKBENCH_FUSED_NORMS")
set_fused_norms, fused_norms_enabled, use_fused_norms = _fused_norms.set, _fused_norms.enabled, _fused_norms.use

# The one-row linear layers (the AR step's GEMMs) as a Triton GEMV: on the H200 it reads the 27B
# weights at 88-109 % of the copy bandwidth where cuBLAS reads them at 83-101 %
# (data/results/gemv-*). WORKBENCH_GEMV=0 (or set_gemv(False)) keeps cuBLAS.
_gemv = Switch("WORKBENCH_GEMV")
set_gemv, gemv_enabled, use_gemv = _gemv.set, _gemv.enabled, _gemv.use

# Programmatic dependent launch of the Triton kernels on Hopper (tree_kernels._pdl says how it stays
# exact). Off by default until a device run measures it: WORKBENCH_PDL=1 or set_pdl(True).
_pdl = Switch("WORKBENCH_PDL", default=False)
set_pdl, pdl_enabled, use_pdl = _pdl.set, _pdl.enabled, _pdl.use

# Kernel groups launched without PDL while it is on (a per-kernel choice): "tma", the TMA few-rows
# GEMM, whose peeled first tile costs it a pipeline stage of shared memory under PDL
# (gemv.triton.tma_stages); "gemm", every weight-streaming GEMM (the GEMV and the few-rows kernels,
# the TMA one included); "rest", every other kernel (norms, tree kernels, commits, split-K sums).
# WORKBENCH_PDL_EXEMPT is a comma list of them ("" for none); the default exempts "tma", which
# slowed the 27B verify by a stage (H100, 2026-12-07 18:04 and 21:05).
PDL_GROUPS = ("tma", "gemm", "rest")


def _parse_pdl_groups(groups, where: str) -> frozenset:
    names = [g.strip() for g in (groups.split(",") if isinstance(groups, str) else groups) if g.strip()]
    unknown = sorted(set(names) - set(PDL_GROUPS))
    if unknown:
        raise ValueError(f"{where}: unknown PDL group(s) {unknown}; known: {list(PDL_GROUPS)}")
    return frozenset(names)


_pdl_exempt = _parse_pdl_groups(os.environ.get("WORKBENCH_PDL_EXEMPT", "tma"), "WORKBENCH_PDL_EXEMPT")


def pdl_exempt() -> frozenset:
    """The kernel groups that launch without PDL even while it is on."""
    return _pdl_exempt


def set_pdl_exempt(groups) -> None:
    """Launch these kernel groups (a comma string or an iterable of PDL_GROUPS) without PDL."""
    global _pdl_exempt
    _pdl_exempt = _parse_pdl_groups(groups, "set_pdl_exempt")


@contextlib.contextmanager
def use_pdl_exempt(groups):
    global _pdl_exempt
    old, _pdl_exempt = _pdl_exempt, _parse_pdl_groups(groups, "use_pdl_exempt")
    try:
        yield
    finally:
        _pdl_exempt = old

# The round's bookkeeping kernels (the ancestor mask, the conv gather table and the walk, one launch
# each instead of ~50 small torch launches) wherever Triton runs. WORKBENCH_ROUND_KERNELS=0 keeps their torch references.
_round_kernels = Switch("WORKBENCH_ROUND_KERNELS")
set_round_kernels, round_kernels_enabled, use_round_kernels = _round_kernels.set, _round_kernels.enabled, _round_kernels.use


# Half-precision GEMMs of 2+ rows through small weights (a tiny model's verify and draft: launch-bound,
# not bandwidth-bound) through the Triton few-rows kernel instead of cuBLAS, so that under PDL the
# layer's kernels chain without a cuBLAS launch between them. Off until a device run measures it:
# WORKBENCH_SMALL_GEMM_TRITON=1 or set_small_gemm(True).
_small_gemm = Switch("WORKBENCH_SMALL_GEMM_TRITON", default=False)
set_small_gemm, small_gemm_enabled, use_small_gemm = _small_gemm.set, _small_gemm.enabled, _small_gemm.use


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
