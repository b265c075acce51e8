"""The one-row linear layer as a Triton GEMV (see naive.py).

Program p owns BLOCK_N rows of the weight and, with SPLIT_K > 1, one of SPLIT_K slices of K.
It streams its [BLOCK_N, BLOCK_K] tiles (each row's K is contiguous, so the loads coalesce),
multiplies by x's chunk and keeps a [BLOCK_N, BLOCK_K] fp32 accumulator, reduced once at the
end. With SPLIT_K = 1 it writes y directly; otherwise each slice writes fp32 partials and a
second launch sums them (for small N: the rows alone would not give every SM work).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .naive import check_linear_inputs

__all__ = ["gemv", "config_for", "gemm_few_rows", "DEFAULT_CONFIG", "TUNED", "FEW_ROWS_CONFIG"]

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
_configs: dict[tuple, dict] = {}  # (device index, N, K) -> config, looked up once per shape


def config_for(weight: torch.Tensor) -> dict:
    """The tuned config for this weight's shape on this device, else the default."""
    if not weight.is_cuda:
        return DEFAULT_CONFIG
    index = weight.device.index if weight.device.index is not None else torch.cuda.current_device()
    key = (index, *weight.shape)
    cfg = _configs.get(key)
    if cfg is None:
        tuned = TUNED.get((torch.cuda.get_device_name(index), *weight.shape), {})
        cfg = _configs[key] = {**DEFAULT_CONFIG, **tuned}
    return cfg


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
    check_linear_inputs("gemv", x, weight, bias, one_row=True)
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


# -- few rows (a tree verify's M = 17 ... 129 tokens): tensor-core tiles, one program per BLOCK_N
# columns and BLOCK_M rows, streaming the weight once per row block (every row block at once for M
# up to BLOCK_M); memory-bound like the GEMV as long as M is small against the H200's ~200 flop/byte.
FEW_ROWS_CONFIG = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4, "MAX_BLOCK_M": 128}
# tree_kernels.linear sends 2 .. FEW_ROWS_MAX rows here, more to cuBLAS. Off (0): on the H200 this
# plain tl.dot loop (no TMA / warp-specialised pipeline) only ties cuBLAS at 17 rows and is 1.2-2.3x
# slower at 65 and 129 (data/results/gemv-nvidia-h200-2026-12-03T20-few.json); it put the 27B
# 65-token verify at 27.9 ms against 20.4 ms through cuBLAS in the same run.
FEW_ROWS_MAX = 0
# Triton's interpreter (the CPU tests) returns garbage (~1e10) from tl.dot on bf16 operands; there
# the operands are widened to fp32 first. On the GPU the dot takes them as they are.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _few_rows_kernel(X, W, B, Y, M, N, K, sxm, swn, sym, HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # row blocks fastest: the programs that share a weight tile run side by side (L2 serves the rest)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    x_rows = X + rm.to(tl.int64)[:, None] * sxm
    w_rows = W + rn.to(tl.int64)[:, None] * swn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        c = k0 + rk
        c_ok = c < K
        x = tl.load(x_rows + c[None, :], mask=m_ok[:, None] & c_ok[None, :], other=0.0)
        w = tl.load(w_rows + c[None, :], mask=n_ok[:, None] & c_ok[None, :], other=0.0)
        if DOT_FP32:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(B + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rm.to(tl.int64)[:, None] * sym + rn[None, :], acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def gemm_few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    check_linear_inputs("gemm_few_rows", x, weight, bias, one_row=False)
    if weight.stride(1) != 1:
        raise ValueError(f"gemm_few_rows: weight rows must be contiguous, got strides {weight.stride()}")
    if x.stride(1) != 1:
        x = x.contiguous()
    cfg = {**FEW_ROWS_CONFIG, **(config or {})}
    m, k = x.shape
    n = weight.shape[0]
    bm = min(max(16, 1 << (m - 1).bit_length()), cfg["MAX_BLOCK_M"])  # tl.dot wants >= 16 rows
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _few_rows_kernel[(triton.cdiv(m, bm), triton.cdiv(n, cfg["BLOCK_N"]))](
        x, weight, bias if bias is not None else y, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, DOT_FP32=_INTERPRETED, BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y
