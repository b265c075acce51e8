"""The one-row linear layer as a Triton GEMV (see naive.py).

Program p owns BLOCK_N rows of the weight and, with SPLIT_K > 1, one of SPLIT_K slices of K.
It streams its [BLOCK_N, BLOCK_K] tiles (each row's K is contiguous, so the loads coalesce),
multiplies by x's chunk and keeps a [BLOCK_N, BLOCK_K] fp32 accumulator, reduced once at the
end. With SPLIT_K = 1 it writes y directly; otherwise each slice writes fp32 partials and a
second launch sums them (for small N: the rows alone would not give every SM work).
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from ..backend import small_gemm_enabled
from .._pdl import pdl_enter, pdl_options
from . import few_rows_tuned as _committed_routes
from .naive import check_linear_inputs

# the PDL groups (backend.PDL_GROUPS) of the weight-streaming kernels' launches
GEMM = ("gemm",)
TMA_GEMM = ("gemm", "tma")

__all__ = ["gemv", "config_for", "gemm_few_rows", "swap_row_blocks", "DEFAULT_CONFIG", "TUNED",
           "FEW_ROWS_CONFIG", "FEW_ROWS_TUNED",
           "few_rows_config_for", "load_few_rows_tuned", "few_rows_routes", "routed_max_rows", "CUBLAS_ROUTE", "use_few_rows", "linear_cublaslt",
           "few_rows_route"]

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
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_GDC: tl.constexpr = False):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = tl.arange(0, BLOCK_K)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_rows = W + rows.to(tl.int64)[:, None] * stride_w
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    k_loop = k_start
    if USE_GDC:  # the first weight tile is read while the kernel before this one finishes (_pdl.py)
        c = k_start + cols
        c_ok = c < k_end
        w = tl.load(w_rows + c[None, :], mask=row_ok[:, None] & c_ok[None, :], other=0.0)
        pdl_enter(USE_GDC)
        xv = tl.load(X + c, mask=c_ok, other=0.0)
        acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
        k_loop = k_start + BLOCK_K
    for k0 in range(k_loop, k_end, BLOCK_K):
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
def _split_sum_kernel(P, B, Y, N, N_BIAS, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    # P [SPLIT_K, N] fp32 partials -> Y [N]; N may be M rows x N_BIAS columns flattened (the few-rows GEMM)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < N
    y = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        y += tl.load(P + s * N + rows, mask=ok, other=0.0)
    if HAS_BIAS:
        y += tl.load(B + rows % N_BIAS, mask=ok, other=0.0).to(tl.float32)
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
                                              HAS_BIAS=bias is not None, PARTIAL=False, **launch, **pdl_options(x, GEMM))
        return y
    partial = torch.empty(split, n, dtype=torch.float32, device=x.device)
    _gemv_kernel[(triton.cdiv(n, bn), split)](x, weight, b, partial, n, k, k_per_split, weight.stride(0),
                                              HAS_BIAS=False, PARTIAL=True, **launch, **pdl_options(x, GEMM))
    _split_sum_kernel[(triton.cdiv(n, 1024),)](partial, b, y, n, n, SPLIT_K=split, HAS_BIAS=bias is not None, BLOCK=1024, **pdl_options(partial))
    return y


# -- few rows (a tree verify's M = 17 ... 257 tokens): tensor-core tiles, memory-bound like the GEMV as
# long as M is small against the H200's ~200 flop/byte. Two layouts:
#   "rows": x's rows are the MMA's M side: one program per BLOCK_M rows and BLOCK_N weight rows,
#           every row block at once for M up to MAX_BLOCK_M (M padded to a power of two: 65 -> 128).
#   "swap": the weight's rows are the MMA's M side (BLOCK_N >= 64 fills a Hopper warpgroup's MMA),
#           x's rows its N side, split into a power-of-two main block and a tail block of >= 16
#           (65 = 64 + 1 -> MMA N of 64 + 16 = 80, not 128), both multiplied by the same weight tile,
#           so the weight is read once; SPLIT_K > 1 gives a small N (5120 outputs) enough programs.
FEW_ROWS_CONFIG = {"LAYOUT": "rows", "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4, "MAX_BLOCK_M": 128,
                   "SPLIT_K": 1}
# (device name, N, K, M) -> the route a few-rows sweep chose there: a Triton config, cuBLASLt, or plain
# cuBLAS ({"BACKEND": "cublas"}: swept, and nothing beat F.linear; kept so that fewer rows round up to
# this M, not to a larger one whose route was measured at other rows only). Filled from a bench.gemv
# result by load_few_rows_tuned, by default with the committed routes (few_rows_tuned.py, generated).
FEW_ROWS_TUNED: dict[tuple, dict] = dict(_committed_routes.TABLE)
CUBLAS_ROUTE = {"BACKEND": "cublas"}


def routed_max_rows(table: dict[tuple, dict], device: str | None = None) -> int:
    """The largest M with a route other than plain cuBLAS in ``table`` (on ``device``; None: any), else 0."""
    return max((key[3] for key, route in table.items()
                if route != CUBLAS_ROUTE and (device is None or key[0] == device)), default=0)


# tree_kernels.linear sends 2 .. FEW_ROWS_MAX rows here, more to cuBLAS; by default up to the largest M
# with a committed route (only those shapes and devices: elsewhere cuBLAS), else off (0): without a
# table every shape would take FEW_ROWS_CONFIG, and the plain "rows" loop only ties cuBLAS at 17 rows
# and is 1.2-2.3x slower at 65 and 129 (data/results/gemv-nvidia-h200-2026-12-03T20-few.json).
FEW_ROWS_MAX = int(os.environ.get("WORKBENCH_FEW_ROWS_MAX", str(routed_max_rows(FEW_ROWS_TUNED))))
# Triton's interpreter (the CPU tests) returns garbage (~1e10) from tl.dot on bf16 operands; there
# the operands are widened to fp32 first. On the GPU the dot takes them as they are.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
SWAP_MAX_MAIN = 256  # more rows than main + tail run as several launches of at most this many main rows


def swap_row_blocks(m: int) -> tuple[int, int]:
    """(main, tail) MMA widths for m rows in the "swap" layout: main the largest power of two <= m
    (at least 16, tl.dot's minimum), tail the power of two >= 16 covering the rest (0 if none)."""
    if m < 1:
        raise ValueError(f"swap_row_blocks: m must be >= 1, got {m}")
    main = max(16, 1 << (m.bit_length() - 1))
    rest = m - main
    return main, (0 if rest <= 0 else max(16, 1 << (rest - 1).bit_length()))



@contextlib.contextmanager
def use_few_rows(max_rows: int):
    """Within the block, tree_kernels.linear sends 2 .. max_rows rows to the few-rows GEMM (0: none)."""
    global FEW_ROWS_MAX
    old = FEW_ROWS_MAX
    FEW_ROWS_MAX = max_rows
    try:
        yield
    finally:
        FEW_ROWS_MAX = old


# small weights (tree_kernels.use_small_gemm): a tiny model's layers, where a GEMM is a launch and a
# few tiles, not a weight read; the "swap" layout puts the weight's rows on the MMA's M side
SMALL_WEIGHT_MAX = 1 << 22  # elements (8 MB in bf16)
SMALL_WEIGHT_ROUTE = {"LAYOUT": "swap", "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2, "SPLIT_K": 1}


def few_rows_config_for(weight: torch.Tensor, m: int) -> dict | None:
    """The config for m rows through this weight: SMALL_WEIGHT_ROUTE for a small weight with the
    small-GEMM switch on; with FEW_ROWS_TUNED empty, FEW_ROWS_CONFIG; else the route for this shape at
    the smallest swept M >= m on this device, or None (not swept here, or cuBLAS won there: the
    caller keeps cuBLAS)."""
    if small_gemm_enabled() and weight.numel() <= SMALL_WEIGHT_MAX:
        return {**FEW_ROWS_CONFIG, **SMALL_WEIGHT_ROUTE}
    if not FEW_ROWS_TUNED:
        return FEW_ROWS_CONFIG
    if weight.is_cuda:
        name = torch.cuda.get_device_name(weight.device)
        swept = sorted(key[3] for key in FEW_ROWS_TUNED if key[:3] == (name, *weight.shape) and key[3] >= m)
        if swept:
            route = FEW_ROWS_TUNED[(name, *weight.shape, swept[0])]
            return None if route == CUBLAS_ROUTE else {**FEW_ROWS_CONFIG, **route}
    return None


# a route other than plain cuBLAS is taken only when it is at least this much faster than F.linear
# there (the sweep's medians repeat to ~1 %; a tie is not worth a second code path)
ROUTE_MIN_GAIN = 0.01


def few_rows_route(row: dict) -> tuple[float | None, dict | None]:
    """(ms, route) for one row of a bench.gemv few-rows section: the fastest route tree_kernels.linear
    can take there (the best Triton config, or F.linear through cuBLASLt: {"BACKEND": "cublaslt"}) when
    it beats F.linear by ROUTE_MIN_GAIN, the Triton config only when it also beat every cuBLAS call
    layout measured; else (F.linear's ms, None)."""
    linear = row.get("linear_ms")
    if not linear:
        return None, None
    routes = []
    best, cublas = row.get("best_triton"), row.get("best_cublas") or {"ms": linear}
    if best and best["ms"] < cublas["ms"]:
        routes.append((best["ms"], dict(best["config"])))
    lt = next((r for r in row.get("rows", []) if r.get("variant") == "linear_cublaslt" and "ms" in r and not r.get("wrong")), None)
    if lt:
        routes.append((lt["ms"], {"BACKEND": "cublaslt"}))
    ms, config = min(routes, key=lambda r: r[0], default=(linear, None))
    return (ms, config) if config is not None and ms < linear * (1 - ROUTE_MIN_GAIN) else (linear, None)


def few_rows_routes(result: dict, device: str | None = None) -> dict[tuple, dict]:
    """The routes a bench.gemv result's few-rows section gives, keyed (device, N, K, M): for each
    measured (shape, M), the route few_rows_route found faster than F.linear there, else CUBLAS_ROUTE.
    A shape measured twice (the 27B's GDN and attention output projections are both 5120 x 6144)
    keeps a route only where both rows chose the same one: else the two timings of one GEMM disagree
    by more than the margin, and cuBLAS stays."""
    device = device or result["device"]
    routes = {}
    for row in result.get("few_rows", []):
        if row.get("linear_ms"):
            _, config = few_rows_route(row)
            key, route = (device, row["N"], row["K"], row["M"]), dict(CUBLAS_ROUTE) if config is None else config
            routes[key] = route if routes.get(key, route) == route else dict(CUBLAS_ROUTE)
    return routes


def load_few_rows_tuned(result: dict, device: str | None = None) -> dict[tuple, dict]:
    """Adds few_rows_routes(result, device) to FEW_ROWS_TUNED. Returns what it added."""
    added = few_rows_routes(result, device)
    FEW_ROWS_TUNED.update(added)
    return added


def linear_cublaslt(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear with torch's preferred BLAS library set to cuBLASLt for this one call (a tuned route:
    on the H100 cuBLASLt reads the 65-row MLP down projection at 90 % of the copy bandwidth where
    cuBLAS's default pick reads it at 80 %). A CUDA graph captured around it keeps cuBLASLt's kernel."""
    old = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return torch.nn.functional.linear(x, weight, bias)
    finally:
        torch.backends.cuda.preferred_blas_library(old)


@triton.jit
def _swap_step(w, x_rows, t_rows, c, c_ok, m_ok, t_ok, acc, acc_t, DOT_FP32: tl.constexpr, M_TAIL: tl.constexpr):
    # one BLOCK_K step of the "swap" layout: the weight tile times x's main and tail row blocks
    x = tl.load(x_rows + c[None, :], mask=m_ok[:, None] & c_ok[None, :], other=0.0)
    if DOT_FP32:
        w, x = w.to(tl.float32), x.to(tl.float32)
    acc = tl.dot(w, tl.trans(x), acc)
    if M_TAIL > 0:
        xt = tl.load(t_rows + c[None, :], mask=t_ok[:, None] & c_ok[None, :], other=0.0)
        if DOT_FP32:
            xt = xt.to(tl.float32)
        acc_t = tl.dot(w, tl.trans(xt), acc_t)
    return acc, acc_t


@triton.jit
def _few_rows_swap_kernel(X, W, B, Y, M, N, K, k_per_split, sxm, swn, sym, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                          DOT_FP32: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          M_MAIN: tl.constexpr, M_TAIL: tl.constexpr, USE_GDC: tl.constexpr = False):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rk = tl.arange(0, BLOCK_K)
    rm = tl.arange(0, M_MAIN)
    m_ok = rm < M
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_rows = W + rn.to(tl.int64)[:, None] * swn
    x_rows = X + rm.to(tl.int64)[:, None] * sxm
    acc = tl.zeros((BLOCK_N, M_MAIN), dtype=tl.float32)
    if M_TAIL > 0:
        rt = M_MAIN + tl.arange(0, M_TAIL)
        t_ok = rt < M
        t_rows = X + rt.to(tl.int64)[:, None] * sxm
        acc_t = tl.zeros((BLOCK_N, M_TAIL), dtype=tl.float32)
    else:  # (unused: no tail block)
        t_ok, t_rows, acc_t = m_ok, x_rows, acc
    k_loop = k_start
    if USE_GDC:  # the first weight tile is read while the kernel before this one finishes (_pdl.py)
        c = k_start + rk
        c_ok = c < k_end
        w = tl.load(w_rows + c[None, :], mask=n_ok[:, None] & c_ok[None, :], other=0.0)
        pdl_enter(USE_GDC)
        acc, acc_t = _swap_step(w, x_rows, t_rows, c, c_ok, m_ok, t_ok, acc, acc_t, DOT_FP32, M_TAIL)
        k_loop = k_start + BLOCK_K
    for k0 in range(k_loop, k_end, BLOCK_K):
        c = k0 + rk
        c_ok = c < k_end
        w = tl.load(w_rows + c[None, :], mask=n_ok[:, None] & c_ok[None, :], other=0.0)
        acc, acc_t = _swap_step(w, x_rows, t_rows, c, c_ok, m_ok, t_ok, acc, acc_t, DOT_FP32, M_TAIL)
    # acc[n, m] is y[m, n]: stored transposed (M x N outputs are tiny next to the N x K weight)
    if PARTIAL:  # fp32 slice split of [SPLIT_K, M, N]; the bias goes in the sum
        out = Y + split * M * N
        tl.store(out + rm.to(tl.int64)[None, :] * N + rn[:, None], acc, mask=n_ok[:, None] & m_ok[None, :])
        if M_TAIL > 0:
            tl.store(out + rt.to(tl.int64)[None, :] * N + rn[:, None], acc_t, mask=n_ok[:, None] & t_ok[None, :])
    else:
        if HAS_BIAS:
            bias = tl.load(B + rn, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            acc += bias
            if M_TAIL > 0:
                acc_t += bias
        tl.store(Y + rm.to(tl.int64)[None, :] * sym + rn[:, None], acc.to(Y.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])
        if M_TAIL > 0:
            tl.store(Y + rt.to(tl.int64)[None, :] * sym + rn[:, None], acc_t.to(Y.dtype.element_ty),
                     mask=n_ok[:, None] & t_ok[None, :])


@triton.jit
def _few_rows_kernel(X, W, B, Y, M, N, K, sxm, swn, sym, HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
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


@triton.jit
def _swap_tma_step(w, x_desc, xt_desc, k0, acc, acc_t, DOT_FP32: tl.constexpr, M_MAIN: tl.constexpr, M_TAIL: tl.constexpr):
    x = x_desc.load([0, k0])
    if DOT_FP32:
        w, x = w.to(tl.float32), x.to(tl.float32)
    acc = tl.dot(w, tl.trans(x), acc)
    if M_TAIL > 0:
        xt = xt_desc.load([M_MAIN, k0])
        if DOT_FP32:
            xt = xt.to(tl.float32)
        acc_t = tl.dot(w, tl.trans(xt), acc_t)
    return acc, acc_t


@triton.jit
def _few_rows_swap_tma_kernel(x_desc, xt_desc, w_desc, B, Y, M, N, K, k_per_split, sym, HAS_BIAS: tl.constexpr,
                              PARTIAL: tl.constexpr, DOT_FP32: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              M_MAIN: tl.constexpr, M_TAIL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                              USE_GDC: tl.constexpr = False):
    # the "swap" layout with every tile loaded by the Hopper TMA (tensor descriptors): no address
    # arithmetic or masks in the loop, the tiles past M, N or K come back as zeros
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rm = tl.arange(0, M_MAIN)
    m_ok = rm < M
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_N, M_MAIN), dtype=tl.float32)
    if M_TAIL > 0:
        rt = M_MAIN + tl.arange(0, M_TAIL)
        t_ok = rt < M
        acc_t = tl.zeros((BLOCK_N, M_TAIL), dtype=tl.float32)
    else:  # (unused: no tail block)
        acc_t = acc
    k_loop = k_start
    if USE_GDC:  # the first weight tile is read while the kernel before this one finishes (_pdl.py)
        w = w_desc.load([pid_n * BLOCK_N, k_start])
        pdl_enter(USE_GDC)
        acc, acc_t = _swap_tma_step(w, x_desc, xt_desc, k_start, acc, acc_t, DOT_FP32, M_MAIN, M_TAIL)
        k_loop = k_start + BLOCK_K
    for k0 in tl.range(k_loop, k_end, BLOCK_K, warp_specialize=WARP_SPECIALIZE):  # producer warps feed the MMA's
        w = w_desc.load([pid_n * BLOCK_N, k0])
        acc, acc_t = _swap_tma_step(w, x_desc, xt_desc, k0, acc, acc_t, DOT_FP32, M_MAIN, M_TAIL)
    if PARTIAL:
        out = Y + split * M * N
        tl.store(out + rm.to(tl.int64)[None, :] * N + rn[:, None], acc, mask=n_ok[:, None] & m_ok[None, :])
        if M_TAIL > 0:
            tl.store(out + rt.to(tl.int64)[None, :] * N + rn[:, None], acc_t, mask=n_ok[:, None] & t_ok[None, :])
    else:
        if HAS_BIAS:
            bias = tl.load(B + rn, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            acc += bias
            if M_TAIL > 0:
                acc_t += bias
        tl.store(Y + rm.to(tl.int64)[None, :] * sym + rn[:, None], acc.to(Y.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])
        if M_TAIL > 0:
            tl.store(Y + rt.to(tl.int64)[None, :] * sym + rn[:, None], acc_t.to(Y.dtype.element_ty),
                     mask=n_ok[:, None] & t_ok[None, :])


def tma_stages(num_stages: int, pdl: dict) -> int:
    """The TMA swap kernel's pipeline depth: with its first tile peeled for PDL, the peeled tiles hold
    their own shared-memory buffers, one stage's worth (the 65-row LM-head route at 4 stages would
    need 266 KB of the H100's 227 KB), so the loop gets one stage fewer and the kernel the shared
    memory (and occupancy) it has without PDL."""
    return max(1, num_stages - 1) if pdl.get("USE_GDC") else num_stages


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """A TMA descriptor needs 16-byte aligned bases and row strides."""
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors)


def gemm_few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    check_linear_inputs("gemm_few_rows", x, weight, bias, one_row=False)
    if weight.stride(1) != 1:
        raise ValueError(f"gemm_few_rows: weight rows must be contiguous, got strides {weight.stride()}")
    cfg = {**FEW_ROWS_CONFIG, **(config or {})}
    if cfg["LAYOUT"] not in ("rows", "swap", "swap_tma"):
        raise ValueError(f"gemm_few_rows: LAYOUT must be 'rows', 'swap' or 'swap_tma', got {cfg['LAYOUT']!r}")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    launch = dict(BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg["LAYOUT"] == "rows":
        bm = min(max(16, 1 << (m - 1).bit_length()), cfg["MAX_BLOCK_M"])  # tl.dot wants >= 16 rows
        _few_rows_kernel[(triton.cdiv(m, bm), triton.cdiv(n, cfg["BLOCK_N"]))](
            x, weight, bias if bias is not None else y, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
            HAS_BIAS=bias is not None, DOT_FP32=_INTERPRETED, BLOCK_M=bm, **launch, **pdl_options(x, GEMM))
        return y
    chunk = SWAP_MAX_MAIN + SWAP_MAX_MAIN // 4  # 257 rows (a budget of 256 + the root) stay one launch
    for r0 in range(0, m, chunk):
        _few_rows_swap(x[r0:r0 + chunk], weight, bias, y[r0:r0 + chunk], int(cfg["SPLIT_K"]), launch,
                       tma=cfg["LAYOUT"] == "swap_tma", warp_specialize=cfg.get("WARP_SPECIALIZE", False))
    return y


def _few_rows_swap(x, weight, bias, y, split, launch, tma: bool, warp_specialize: bool = False) -> None:
    m, k = x.shape
    n = weight.shape[0]
    main, tail = swap_row_blocks(m)
    split = max(1, split)
    k_per_split = triton.cdiv(triton.cdiv(k, split), launch["BLOCK_K"]) * launch["BLOCK_K"]
    split = triton.cdiv(k, k_per_split)
    b = bias if bias is not None else y
    blocks = dict(DOT_FP32=_INTERPRETED, M_MAIN=main, M_TAIL=tail, **launch)
    grid = (triton.cdiv(n, launch["BLOCK_N"]), split)
    if tma and _tma_ready(x, weight):  # else (unaligned rows) the same layout through pointer loads
        from triton.tools.tensor_descriptor import TensorDescriptor

        bk = launch["BLOCK_K"]
        descs = (TensorDescriptor.from_tensor(x, [main, bk]), TensorDescriptor.from_tensor(x, [max(tail, 16), bk]),
                 TensorDescriptor.from_tensor(weight, [launch["BLOCK_N"], bk]))
        out = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
        stages = tma_stages(launch["num_stages"], pdl_options(y, TMA_GEMM))
        _few_rows_swap_tma_kernel[grid](*descs, b, out, m, n, k, k_per_split, y.stride(0) if split == 1 else n,
                                        HAS_BIAS=bias is not None and split == 1, PARTIAL=split > 1,
                                        WARP_SPECIALIZE=bool(warp_specialize), **{**blocks, "num_stages": stages},
                                        **pdl_options(y, TMA_GEMM))
        if split > 1:
            _split_sum_kernel[(triton.cdiv(m * n, 1024),)](out, b, y, m * n, n, SPLIT_K=split, HAS_BIAS=bias is not None, BLOCK=1024, **pdl_options(out))
        return
    if split == 1:
        _few_rows_swap_kernel[grid](x, weight, b, y, m, n, k, k_per_split, x.stride(0), weight.stride(0), y.stride(0),
                                    HAS_BIAS=bias is not None, PARTIAL=False, **blocks, **pdl_options(x, GEMM))
        return
    partial = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    _few_rows_swap_kernel[grid](x, weight, b, partial, m, n, k, k_per_split, x.stride(0), weight.stride(0), n,
                                HAS_BIAS=False, PARTIAL=True, **blocks, **pdl_options(x, GEMM))
    _split_sum_kernel[(triton.cdiv(m * n, 1024),)](partial, b, y, m * n, n, SPLIT_K=split, HAS_BIAS=bias is not None, BLOCK=1024, **pdl_options(partial))
