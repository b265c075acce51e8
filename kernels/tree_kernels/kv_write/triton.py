"""The K/V cache write of the fast path in one launch (see naive.py): program (row, chunk of
Hkv x D) stores that chunk of the new k and v rows at row start + t of the buffers, start read
from the device. Replaces an arange, an add, two index_copy_ and the copy of a strided v."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_common import next_pow2

__all__ = ["kv_write_static"]


@triton.jit
def _kv_write_kernel(KB, VB, Start, K, V, C, D, skb_r, svb_r, sk_t, sk_h, sv_t, sv_h, BLOCK: tl.constexpr):
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
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), BLOCK=bl, num_warps=num_warps,
    )
