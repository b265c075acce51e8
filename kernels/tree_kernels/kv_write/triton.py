"""The K/V cache write of the fast path in one launch (see naive.py): program (row, chunk of
Hkv x D) stores that chunk of the new k and v rows at row start + t of the buffers, start read
from the device. Replaces an arange, an add, two index_copy_ and the copy of a strided v.

The commit after the walk, also one launch (``kv_commit_static``): program p owns a chunk of the
Hkv x D columns for every path slot, loads the accepted rows of that chunk for all slots, waits at
a barrier, then stores them at start + slot. Rows move down (path[i] >= i), so a store can land on
a row another slot still has to read; the barrier puts every read of the program before every
write, and no other program touches its columns. Replaces seven launches (two adds, an arange,
two gathers, two index_copy_)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._pdl import pdl_enter, pdl_options
from .._triton_common import next_pow2

__all__ = ["kv_commit_static", "kv_write_static"]


@triton.jit
def _kv_write_kernel(KB, VB, Start, K, V, C, D, skb_r, svb_r, sk_t, sk_h, sv_t, sv_h, BLOCK: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # flat (head, channel) index in the row
    m = offs < C
    h = offs // D
    d = offs % D
    row = tl.load(Start).to(tl.int64) + t
    kv = tl.load(K + t * sk_t + h * sk_h + d, mask=m, other=0.0)
    vv = tl.load(V + t * sv_t + h * sv_h + d, mask=m, other=0.0)
    tl.store(KB + row * skb_r + offs, kv.to(KB.dtype.element_ty), mask=m)
    tl.store(VB + row * svb_r + offs, vv.to(VB.dtype.element_ty), mask=m)


def kv_write_static(k_buf, v_buf, start, k, v, *, block: int = 1024, num_warps: int = 4) -> None:
    if k.shape != v.shape or k.dim() != 3 or k.shape[1:] != k_buf.shape[1:] or v_buf.shape != k_buf.shape:
        raise ValueError(f"kv_write_static: k {tuple(k.shape)}, v {tuple(v.shape)} do not fit buffers "
                         f"{tuple(k_buf.shape)} / {tuple(v_buf.shape)}")
    if not (k_buf.is_contiguous() and v_buf.is_contiguous()):
        raise ValueError("kv_write_static: the cache buffers must be contiguous")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    t, hkv, d = k.shape
    c = hkv * d
    bl = min(block, max(16, next_pow2(c)))
    _kv_write_kernel[(t, triton.cdiv(c, bl))](
        k_buf, v_buf, start.reshape(1), k, v, c, d, k_buf.stride(0), v_buf.stride(0),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), BLOCK=bl, num_warps=num_warps, **pdl_options(k_buf)
    )


@triton.jit
def _kv_commit_kernel(KB, VB, Start, Path, Count, C, P, skb_r, svb_r, BP: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # flat (head, channel) index in the row
    m = offs < C
    slots = tl.arange(0, BP)
    valid = (slots < tl.load(Count)) & (slots < P)
    start = tl.load(Start).to(tl.int64)
    src = start + tl.load(Path + slots, mask=valid, other=0).to(tl.int64)
    dst = start + slots.to(tl.int64)
    mm = valid[:, None] & m[None, :]
    kv = tl.load(KB + src[:, None] * skb_r + offs[None, :], mask=mm, other=0.0)
    vv = tl.load(VB + src[:, None] * svb_r + offs[None, :], mask=mm, other=0.0)
    tl.debug_barrier()  # every read of this program's columns before any write to them
    tl.store(KB + dst[:, None] * skb_r + offs[None, :], kv, mask=mm)
    tl.store(VB + dst[:, None] * svb_r + offs[None, :], vv, mask=mm)


def kv_commit_static(k_buf, v_buf, start, path, count, *, block: int | None = None, num_warps: int = 4) -> None:
    """See naive.kv_commit_static: the first ``count`` slots of the padded path, in place."""
    if v_buf.shape != k_buf.shape or k_buf.dim() != 3:
        raise ValueError(f"kv_commit_static: buffers {tuple(k_buf.shape)} / {tuple(v_buf.shape)} must be equal [capacity, Hkv, D]")
    if not (k_buf.is_contiguous() and v_buf.is_contiguous()):
        raise ValueError("kv_commit_static: the cache buffers must be contiguous")
    if path.dim() != 1:
        raise ValueError(f"kv_commit_static: path must be 1-D, got shape {tuple(path.shape)}")
    c = k_buf.shape[1] * k_buf.shape[2]
    bp = max(16, next_pow2(path.shape[0]))
    # about 2K elements of each buffer per program: small tiles, several programs per row
    bl = block or min(max(16, next_pow2(c)), max(16, 2048 // bp))
    _kv_commit_kernel[(triton.cdiv(c, bl),)](
        k_buf, v_buf, start.reshape(1), path.contiguous(), count.reshape(1), c, path.shape[0],
        k_buf.stride(0), v_buf.stride(0), BP=bp, BLOCK=bl, num_warps=num_warps, **pdl_options(k_buf)
    )
