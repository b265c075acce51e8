"""The one-row linear layer as a Triton GEMV (see naive.py).

Program p owns BLOCK_N rows of the weight and, with SPLIT_K > 1, one of SPLIT_K slices of K.
It streams its [BLOCK_N, BLOCK_K] tiles (each row's K is contiguous, so the loads coalesce),
multiplies by x's chunk and keeps a [BLOCK_N, BLOCK_K] fp32 accumulator, reduced once at the
end. With SPLIT_K = 1 it writes y directly; otherwise each slice writes fp32 partials and a
second launch sums them (for small N: the rows alone would not give every SM work).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .naive import check_gemv_inputs

__all__ = ["gemv", "config_for", "DEFAULT_CONFIG", "TUNED"]

# Within 5 % of the best of the sweep on every Qwen3.6-27B shape on the H200, ahead of cuBLAS on 6 of 7
# (data/results/gemv-nvidia-h200-2026-12-03.json); split-K never won there (the rows alone fill the SMs).
DEFAULT_CONFIG = {"BLOCK_N": 8, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4}
# (device name, N, K) -> the sweep's best on that device (same file)
TUNED = {
    ("NVIDIA H200", 16480, 5120): {"BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4},  # GDN q,k,v,z,b,a
    ("NVIDIA H200", 5120, 6144): {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 4, "num_stages": 4},  # GDN out, attention o
    ("NVIDIA H200", 14336, 5120): {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4},  # attention q+gate,k,v
    ("NVIDIA H200", 34816, 5120): {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 2},  # MLP gate,up
    ("NVIDIA H200", 5120, 17408): {"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 8, "num_stages": 4},  # MLP down
    ("NVIDIA H200", 248320, 5120): {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2},  # LM head
}
_device_names: dict[int, str] = {}


def config_for(weight: torch.Tensor) -> dict:
    """The tuned config for this weight's shape on this device, else the default."""
    if not weight.is_cuda:
        return DEFAULT_CONFIG
    index = weight.device.index if weight.device.index is not None else torch.cuda.current_device()
    name = _device_names.get(index)
    if name is None:
        name = _device_names[index] = torch.cuda.get_device_name(index)
    return {**DEFAULT_CONFIG, **TUNED.get((name, *weight.shape), {})}


@triton.jit
def _gemv_kernel(X, W, B, Y, N, K, k_per_split, stride_w, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_K)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_rows = W + rows.to(tl.int64)[:, None] * stride_w
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        c = k0 + cols
        c_ok = c < k_end
        w = tl.load(w_rows + c[None, :], mask=row_ok[:, None] & c_ok[None, :], other=0.0)
        xv = tl.load(X + c, mask=c_ok, other=0.0)
        acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)
    if PARTIAL:
        tl.store(Y + split * N + rows, y, mask=row_ok)
    else:
        if HAS_BIAS:
            y += tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=row_ok)


@triton.jit
def _split_sum_kernel(P, B, Y, N, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < N
    y = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        y += tl.load(P + s * N + rows, mask=ok, other=0.0)
    if HAS_BIAS:
        y += tl.load(B + rows, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=ok)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    check_gemv_inputs(x, weight, bias)
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    if weight.stride(1) != 1:
        raise ValueError(f"gemv: weight rows must be contiguous, got strides {weight.stride()}")
    x = x.contiguous()
    n, k = weight.shape
    bn, bk, split = cfg["BLOCK_N"], cfg["BLOCK_K"], max(1, int(cfg["SPLIT_K"]))
    # each slice a whole number of BLOCK_K chunks, so that only the last slice is ragged
    k_per_split = triton.cdiv(triton.cdiv(k, split), bk) * bk
    split = triton.cdiv(k, k_per_split)
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    b = bias if bias is not None else y
    launch = dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if split == 1:
        _gemv_kernel[(triton.cdiv(n, bn), 1)](x, weight, b, y, n, k, k_per_split, weight.stride(0),
                                              HAS_BIAS=bias is not None, PARTIAL=False, **launch)
        return y
    partial = torch.empty(split, n, dtype=torch.float32, device=x.device)
    _gemv_kernel[(triton.cdiv(n, bn), split)](x, weight, b, partial, n, k, k_per_split, weight.stride(0),
                                              HAS_BIAS=False, PARTIAL=True, **launch)
    _split_sum_kernel[(triton.cdiv(n, 1024),)](partial, b, y, n, SPLIT_K=split, HAS_BIAS=bias is not None, BLOCK=1024)
    return y
