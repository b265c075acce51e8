"""Programmatic dependent launch (PDL, Hopper and later) for the Triton kernels.

In a CUDA graph of a decode step every kernel waits for the one before it to finish, then pays its
own launch and ramp-up (~1-2 us) while the GPU idles: hundreds of times per step. Launched with PDL,
a kernel's programs become resident while the kernel before it is still running, and block in
``griddepcontrol.wait`` until that kernel has finished and its writes are visible. Each kernel also
signals ``launch_dependents`` at its start, so the next one can be scheduled that early.

The rule that keeps this exact: before ``pdl_enter`` a kernel may only read memory no earlier kernel
of the step writes (a weight); every other load and every store comes after it. ``pdl_enter`` is
the first statement of every kernel launched with ``pdl_options``; the GEMV and few-rows GEMM read
their first weight tile before it (the only work PDL lets overlap the previous kernel). A kernel
launched without PDL (cuBLAS, torch ops) waits for everything before it as usual, and a PDL
kernel's wait covers every earlier kernel too: the kernel before it could not finish before its
own wait returned.

Off unless ``WORKBENCH_PDL=1`` or ``use_pdl(True)`` (a default only after a device run measured
it: ``bench.e2e --pdl-variants``). Under ``TRITON_INTERPRET=1`` the switch takes the same code
paths (the peeled first weight tile included) with ``pdl_enter`` a no-op, so CPU tests compare
them against the launches without it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .backend import PDL_GROUPS, pdl_enabled, pdl_exempt

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_CAPABLE: dict = {}

if INTERPRETED:  # the interpreter has no grid dependency control; nothing runs concurrently there anyway

    @triton.jit
    def pdl_enter(USE_GDC: tl.constexpr):
        pass

else:

    @triton.jit
    def pdl_enter(USE_GDC: tl.constexpr):
        if USE_GDC:
            tl.extra.cuda.gdc_wait()  # every write of the kernels before this one is visible after it
            tl.extra.cuda.gdc_launch_dependents()  # the next kernel's programs may start now


def pdl_capable(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.0 or later (PDL needs Hopper)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _CAPABLE:
        _CAPABLE[key] = torch.cuda.get_device_capability(key)[0] >= 9
    return _CAPABLE[key]


def pdl_options(x: torch.Tensor, groups: tuple = ()) -> dict:
    """Launch keywords for a kernel with a ``USE_GDC`` constexpr working on ``x``'s device: PDL on
    where the switch is on, the device has it and none of the kernel's ``groups`` (backend.PDL_GROUPS;
    none named: "rest") is exempt; under the interpreter the same kernel code without the launch attribute; otherwise
    nothing (the kernel's default, USE_GDC False: it waits for the kernels before it to finish, and
    the kernel after it waits for it)."""
    groups = groups or ("rest",)  # a launch that names no group is one of the rest
    for group in groups:
        if group not in PDL_GROUPS:
            raise ValueError(f"pdl_options: unknown PDL group {group!r}; known: {list(PDL_GROUPS)}")
    if not pdl_enabled() or any(group in pdl_exempt() for group in groups):
        return {}
    if INTERPRETED:
        return {"USE_GDC": True}
    if pdl_capable(x.device):
        return {"USE_GDC": True, "launch_pdl": True}
    return {}
