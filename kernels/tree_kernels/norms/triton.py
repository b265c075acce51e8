"""The row-wise work of a decoder layer in Triton, one launch per op instead of one per torch
elementwise op (a decode step's elementwise kernels are latency-bound: ~8 for an RMSNorm, ~17
for the GDN gates). Same maths and rounding points as naive.py, which they are tested against.

    _rms_norm_kernel        one program per row (rows addressed by two strided leading dims)
    _gated_rms_norm_kernel  one program per (token, value head)
    _gdn_gates_kernel       one program per token: l2norm of its q and k heads, beta and g of its value heads
    _rotary_kernel          one program per (token, head): rotate-half on the first R channels
    _silu_mul_kernel        blocks of a flat [T, I] pair
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._pdl import pdl_enter, pdl_options
from .._triton_common import next_pow2

_HALF = (torch.float16, torch.bfloat16)


@triton.jit
def _normed_row(X, pid, n1, sx0, sx1, D, eps, BLOCK: tl.constexpr):
    """Row ``pid`` of x (two strided leading dims): the raw row, x * rsqrt(mean(x^2) + eps) in fp32, the mask."""
    offs = tl.arange(0, BLOCK)
    m = offs < D
    x_raw = tl.load(X + (pid // n1) * sx0 + (pid % n1) * sx1 + offs, mask=m, other=0.0)
    x = x_raw.to(tl.float32)
    return x_raw, x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)), m


@triton.jit
def _norm_weight(nx, w, like, ZERO_CENTERED: tl.constexpr):
    """The weight on x̂ (fp32 in, fp32 out; the caller casts once): zero-centred x̂ (1 + w) in fp32
    (the order transformers uses), plain w * (x̂ cast to ``like``'s dtype first), as the reference."""
    if ZERO_CENTERED:
        return nx * (1.0 + w)
    return w * nx.to(like.dtype).to(tl.float32)


@triton.jit
def _rms_norm_kernel(X, W, Y, n1, sx0, sx1, D, eps, BLOCK: tl.constexpr, ZERO_CENTERED: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x_raw, nx, m = _normed_row(X, pid, n1, sx0, sx1, D, eps, BLOCK)
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + pid * D + offs, _norm_weight(nx, w, x_raw, ZERO_CENTERED).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _add_rms_norm_kernel(X, Dl, H, W, Y, D, eps, BLOCK: tl.constexpr, ZERO_CENTERED: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    # the residual add (rounded to x's dtype, as torch adds half tensors), stored, then its norm
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    x = tl.load(X + pid * D + offs, mask=m, other=0.0)
    h = (x.to(tl.float32) + tl.load(Dl + pid * D + offs, mask=m, other=0.0).to(tl.float32)).to(x.dtype)
    tl.store(H + pid * D + offs, h, mask=m)
    hf = h.to(tl.float32)
    nx = hf * (1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / D + eps))
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + pid * D + offs, _norm_weight(nx, w, x, ZERO_CENTERED).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _gated_rms_norm_kernel(X, Z, W, Y, n1, sx0, sx1, sz0, sz1, D, eps, BLOCK: tl.constexpr, ROUND_WX: tl.constexpr,
                           CAST_X: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    x_raw = tl.load(X + (pid // n1) * sx0 + (pid % n1) * sx1 + offs, mask=m, other=0.0)
    if CAST_X:  # x in fp32 (the recurrence's output) rounded to y's dtype first, as x.to(dtype) then the norm
        x_raw = x_raw.to(Y.dtype.element_ty)
    xf = x_raw.to(tl.float32)
    nx = xf * (1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps))
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    wx = w * nx.to(x_raw.dtype).to(tl.float32)
    if ROUND_WX:  # weight and x in the same half type: the product is rounded to it, as in torch
        wx = wx.to(x_raw.dtype).to(tl.float32)
    z = tl.load(Z + (pid // n1) * sz0 + (pid % n1) * sz1 + offs, mask=m, other=0.0).to(tl.float32)
    y = wx * (z / (1.0 + tl.exp(-z)))
    tl.store(Y + pid * D + offs, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _l2norm_heads(P, t, st, sh, H, DK, BH: tl.constexpr, BK: tl.constexpr):
    rh = tl.arange(0, BH)
    rk = tl.arange(0, BK)
    m = (rh[:, None] < H) & (rk[None, :] < DK)
    x = tl.load(P + t * st + rh[:, None] * sh + rk[None, :], mask=m, other=0.0).to(tl.float32)
    return x * (1.0 / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6))[:, None], m


@triton.jit
def _gdn_gates_kernel(
    Q, K, B, A, ALog, DtBias,
    QN, KN, Beta, G,
    H, DK, HV,
    sq_t, sq_h, sk_t, sk_h, sb_t, sa_t,
    BH: tl.constexpr, BK: tl.constexpr, BHV: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    t = tl.program_id(0)
    qn, m = _l2norm_heads(Q, t, sq_t, sq_h, H, DK, BH, BK)
    kn, _ = _l2norm_heads(K, t, sk_t, sk_h, H, DK, BH, BK)
    rh = tl.arange(0, BH)
    rk = tl.arange(0, BK)
    out = t * H * DK + rh[:, None] * DK + rk[None, :]
    tl.store(QN + out, qn, mask=m)
    tl.store(KN + out, kn, mask=m)
    rv = tl.arange(0, BHV)
    mv = rv < HV
    beta, g = gdn_gate_values(B + t * sb_t, A + t * sa_t, ALog, DtBias, rv, mv)
    tl.store(Beta + t * HV + rv, beta.to(Beta.dtype.element_ty), mask=mv)
    tl.store(G + t * HV + rv, g, mask=mv)


@triton.jit
def gdn_gate_values(B, A, ALog, DtBias, rv, mv):
    """beta = sigmoid(b) (fp32; the caller rounds it to b's dtype) and g = -exp(A_log) softplus(a +
    dt_bias) (fp32) for value heads ``rv``: the gates kernel and the fused decode step share it."""
    b = tl.load(B + rv, mask=mv, other=0.0).to(tl.float32)
    beta = 1.0 / (1.0 + tl.exp(-b))
    x = tl.load(A + rv, mask=mv, other=0.0).to(tl.float32) + tl.load(DtBias + rv, mask=mv, other=0.0).to(tl.float32)
    # softplus as torch's (threshold 20); log1p(e) by Kahan's trick: log(u) e / (u - 1), u = 1 + e,
    # exact where a plain log(1 + e) would lose the digits of a small e
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    log1p = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))  # no 0/0 even where unused
    sp = tl.where(x > 20.0, x, log1p)
    g = -tl.exp(tl.load(ALog + rv, mask=mv, other=0.0).to(tl.float32)) * sp
    return beta, g


@triton.jit
def _rotary_kernel(X, Cos, Sin, Y, H, sx_t, sx_h, sc_t, D, R, BLOCK: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    pid = tl.program_id(0)
    t = pid // H
    h = pid % H
    offs = tl.arange(0, BLOCK)
    m = offs < D
    base = X + t * sx_t + h * sx_h
    x_raw = tl.load(base + offs, mask=m, other=0.0)
    half = R // 2
    in_rot = offs < R
    partner = tl.where(offs < half, offs + half, offs - half)
    xp = tl.load(base + partner, mask=m & in_rot, other=0.0).to(tl.float32)
    xp = tl.where(offs < half, -xp, xp)  # rotate_half: (-x2, x1)
    c = tl.load(Cos + t * sc_t + offs, mask=m & in_rot, other=0.0).to(tl.float32)
    s = tl.load(Sin + t * sc_t + offs, mask=m & in_rot, other=0.0).to(tl.float32)
    # the reference rounds each product and the sum to x's dtype
    a = (x_raw.to(tl.float32) * c).to(x_raw.dtype).to(tl.float32)
    b = (xp * s).to(x_raw.dtype).to(tl.float32)
    y = tl.where(in_rot, (a + b).to(x_raw.dtype), x_raw)
    tl.store(Y + pid * D + offs, y, mask=m)


@triton.jit
def _normed_rotated_row(X, W, Cos, Sin, Y, t, sc_t, D, R, eps, live, BLOCK: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    """One head row: RMSNorm (rounded to x's dtype, as rms_norm), then rotate-half on its first R
    channels (each product and the sum rounded, as rotary). The partner half is re-read and normed
    again rather than permuted in registers. ``live``: the row's lane mask (all or nothing)."""
    offs = tl.arange(0, BLOCK)
    m = (offs < D) & live
    half = R // 2
    in_rot = offs < R
    partner = tl.where(offs < half, offs + half, offs - half)
    x_raw = tl.load(X + offs, mask=m, other=0.0)
    xf = x_raw.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    xp = tl.load(X + partner, mask=m & in_rot, other=0.0).to(tl.float32)
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    wp = tl.load(W + partner, mask=m & in_rot, other=0.0).to(tl.float32)
    y = _norm_weight(xf * inv, w, x_raw, ZERO_CENTERED).to(x_raw.dtype)
    yp = _norm_weight(xp * inv, wp, x_raw, ZERO_CENTERED).to(x_raw.dtype).to(tl.float32)
    yp = tl.where(offs < half, -yp, yp)  # rotate_half: (-x2, x1)
    c = tl.load(Cos + t * sc_t + offs, mask=m & in_rot, other=0.0).to(tl.float32)
    sn = tl.load(Sin + t * sc_t + offs, mask=m & in_rot, other=0.0).to(tl.float32)
    a = (y.to(tl.float32) * c).to(x_raw.dtype).to(tl.float32)
    b = (yp * sn).to(x_raw.dtype).to(tl.float32)
    tl.store(Y + offs, tl.where(in_rot, (a + b).to(x_raw.dtype), y), mask=m)


@triton.jit
def _qk_norm_rotary_kernel(Q, K, WQ, WK, Cos, Sin, QO, KO, HQ, HK, sq_t, sq_h, sk_t, sk_h, sc_t, D, R, eps,
                           BLOCK: tl.constexpr, ZERO_CENTERED: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    # program (token, head): q head h, and k head h when h < HK (GQA: fewer key heads)
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    _normed_rotated_row(Q + t * sq_t + h * sq_h, WQ, Cos, Sin, QO + (t * HQ + h) * D, t, sc_t, D, R, eps,
                        offs >= 0, BLOCK, ZERO_CENTERED)
    kh = tl.minimum(h, HK - 1)
    _normed_rotated_row(K + t * sk_t + kh * sk_h, WK, Cos, Sin, KO + (t * HK + kh) * D, t, sc_t, D, R, eps,
                        (offs * 0 + h) < HK, BLOCK, ZERO_CENTERED)


@triton.jit
def _silu_mul_kernel(G, U, Y, N, I, sg, su, BLOCK: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    row = offs // I
    col = offs % I
    g_raw = tl.load(G + row * sg + col, mask=m, other=0.0)
    g = g_raw.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(g_raw.dtype).to(tl.float32)  # silu in fp32, rounded as torch does
    u = tl.load(U + row * su + col, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + offs, (act * u).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _sigmoid_mul_kernel(G, X, Y, N, HD, D, sg_t, sg_h, sx_t, BLOCK: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    # y = x * sigmoid(gate) over [T, H, D] (gate rows and heads strided: the attention gate is a
    # chunk of the q projection), sigmoid rounded to gate's dtype first, as torch does
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    row = offs // HD
    col = offs % HD
    g_raw = tl.load(G + row * sg_t + (col // D) * sg_h + col % D, mask=m, other=0.0)
    act = (1.0 / (1.0 + tl.exp(-g_raw.to(tl.float32)))).to(g_raw.dtype).to(tl.float32)
    x = tl.load(X + row * sx_t + col, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + offs, (x * act).to(Y.dtype.element_ty), mask=m)


def _rows(x: torch.Tensor):
    """(n0, n1, stride0, stride1) addressing every row of x (last dim unit-stride) without a copy."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x, 1, 1, 0, 0
    if x.dim() == 2:
        return x, x.shape[0], 1, x.stride(0), 0
    if x.dim() == 3:
        return x, x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    x = x.reshape(-1, x.shape[-1])
    return x, x.shape[0], 1, x.stride(0), 0


def _warps(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    d = x.shape[-1]
    if weight.shape != (d,):
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} does not fit rows of {d}")
    out_dtype = x.dtype if zero_centered else torch.promote_types(weight.dtype, x.dtype)
    xs, n0, n1, s0, s1 = _rows(x)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if y.numel():
        block = max(16, next_pow2(d))
        _rms_norm_kernel[(n0 * n1,)](xs, weight, y, n1, s0, s1, d, float(eps), BLOCK=block, ZERO_CENTERED=bool(zero_centered),
                                     num_warps=_warps(block), **pdl_options(xs))
    return y


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool):
    """(h = x + delta, rms_norm(h)) in one launch; x, delta [T, D] of one dtype."""
    d = x.shape[-1]
    if x.dim() != 2 or delta.shape != x.shape or delta.dtype != x.dtype or weight.shape != (d,):
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} {x.dtype}, delta {tuple(delta.shape)} {delta.dtype}, "
                         f"weight {tuple(weight.shape)}")
    x, delta = x.contiguous(), delta.contiguous()
    h = torch.empty_like(x)
    y = torch.empty(x.shape, dtype=x.dtype if zero_centered else torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if y.numel():
        block = max(16, next_pow2(d))
        _add_rms_norm_kernel[(x.shape[0],)](x, delta, h, weight, y, d, float(eps), BLOCK=block,
                                            ZERO_CENTERED=bool(zero_centered), num_warps=_warps(block), **pdl_options(x))
    return h, y


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``out_dtype``: the norm of ``x.to(out_dtype)`` without the separate cast (one launch fewer)."""
    d = x.shape[-1]
    if gate.shape != x.shape or weight.shape != (d,):
        raise ValueError(f"gated_rms_norm: x {tuple(x.shape)}, gate {tuple(gate.shape)}, weight {tuple(weight.shape)}")
    xs, n0, n1, s0, s1 = _rows(x)
    zs, _, _, z0, z1 = _rows(gate)
    dtype = out_dtype or x.dtype
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    if y.numel():
        block = max(16, next_pow2(d))
        round_wx = torch.promote_types(weight.dtype, dtype) in _HALF
        _gated_rms_norm_kernel[(n0 * n1,)](xs, zs, weight, y, n1, s0, s1, z0, z1, d, float(eps), BLOCK=block,
                                           ROUND_WX=round_wx, CAST_X=dtype != x.dtype, num_warps=_warps(block), **pdl_options(xs))
    return y


def gdn_gates(q, k, b, a, A_log, dt_bias):
    """q, k [T, H, dk] -> fp32 l2-normed; b, a [T, HV] -> beta (b's dtype), g fp32. One launch."""
    t, h, dk = q.shape
    hv = b.shape[-1]
    if k.shape != q.shape or b.shape != (t, hv) or a.shape != (t, hv) or A_log.shape != (hv,) or dt_bias.shape != (hv,):
        raise ValueError(f"gdn_gates: q {tuple(q.shape)}, k {tuple(k.shape)}, b {tuple(b.shape)}, a {tuple(a.shape)}, "
                         f"A_log {tuple(A_log.shape)}, dt_bias {tuple(dt_bias.shape)}")
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    a = a if a.stride(-1) == 1 else a.contiguous()
    dev = q.device
    qn = torch.empty(t, h, dk, dtype=torch.float32, device=dev)
    kn = torch.empty(t, h, dk, dtype=torch.float32, device=dev)
    beta = torch.empty(t, hv, dtype=b.dtype, device=dev)
    g = torch.empty(t, hv, dtype=torch.float32, device=dev)
    if t:
        bh, bk, bhv = max(2, next_pow2(h)), max(16, next_pow2(dk)), max(2, next_pow2(hv))
        _gdn_gates_kernel[(t,)](q, k, b, a, A_log, dt_bias, qn, kn, beta, g, h, dk, hv,
                                q.stride(0), q.stride(1), k.stride(0), k.stride(1), b.stride(0), a.stride(0),
                                BH=bh, BK=bk, BHV=bhv, num_warps=_warps(bh * bk), **pdl_options(q))
    return qn, kn, beta, g


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] (last dim unit-stride), cos/sin [T, R], R even and <= D. One launch."""
    t, h, d = x.shape
    r = cos.shape[-1]
    if cos.shape != (t, r) or sin.shape != (t, r) or r > d or r % 2:
        raise ValueError(f"rotary: x {tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():  # one row stride for both (rows of one table may share it)
        cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty(t, h, d, dtype=x.dtype, device=x.device)
    if y.numel():
        block = max(16, next_pow2(d))
        _rotary_kernel[(t * h,)](x, cos, sin, y, h, x.stride(0), x.stride(1), cos.stride(0), d, r, BLOCK=block,
                                 num_warps=_warps(block), **pdl_options(x))
    return y


def qk_norm_rotary(q, k, wq, wk, eps: float, zero_centered: bool, cos, sin):
    """Attention's per-head q / k RMSNorm then rotary, both in one launch. q [T, HQ, D], k [T, HK, D]
    (last dim unit-stride), HK <= HQ; weights of x's dtype (the output keeps it)."""
    t, hq, d = q.shape
    hk = k.shape[1]
    r = cos.shape[-1]
    if (k.shape != (t, hk, d) or hk > hq or wq.shape != (d,) or wk.shape != (d,) or cos.shape != (t, r)
            or sin.shape != (t, r) or r > d or r % 2):
        raise ValueError(f"qk_norm_rotary: q {tuple(q.shape)}, k {tuple(k.shape)}, weights {tuple(wq.shape)} / "
                         f"{tuple(wk.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():  # one row stride for both (rows of one table may share it)
        cos, sin = cos.contiguous(), sin.contiguous()
    qo = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    ko = torch.empty(t, hk, d, dtype=k.dtype, device=k.device)
    if qo.numel():
        block = max(16, next_pow2(d))
        _qk_norm_rotary_kernel[(t, hq)](q, k, wq, wk, cos, sin, qo, ko, hq, hk, q.stride(0), q.stride(1),
                                        k.stride(0), k.stride(1), cos.stride(0), d, r, float(eps), BLOCK=block,
                                        ZERO_CENTERED=bool(zero_centered), num_warps=_warps(block), **pdl_options(q))
    return qo, ko


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [T, I] tensors (rows may be strided). One launch."""
    if gate.shape != up.shape or gate.dim() != 2:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)}, up {tuple(up.shape)}")
    gate = gate if gate.stride(-1) == 1 else gate.contiguous()
    up = up if up.stride(-1) == 1 else up.contiguous()
    t, i = gate.shape
    y = torch.empty(t, i, dtype=torch.promote_types(gate.dtype, up.dtype), device=gate.device)
    n = t * i
    if n:
        block = 1024
        _silu_mul_kernel[(triton.cdiv(n, block),)](gate, up, y, n, i, gate.stride(0), up.stride(0), BLOCK=block, num_warps=4, **pdl_options(gate))
    return y


def sigmoid_mul(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) for [T, H, D] tensors (gate's rows and heads may be strided; x's rows). One launch."""
    if gate.shape != x.shape or gate.dim() != 3:
        raise ValueError(f"sigmoid_mul: gate {tuple(gate.shape)}, x {tuple(x.shape)}")
    gate = gate if gate.stride(-1) == 1 else gate.contiguous()
    t, h, d = x.shape
    if x.stride(-1) != 1 or x.stride(1) != d:
        x = x.contiguous()
    y = torch.empty(t, h, d, dtype=torch.promote_types(gate.dtype, x.dtype), device=x.device)
    n = y.numel()
    if n:
        block = 1024
        _sigmoid_mul_kernel[(triton.cdiv(n, block),)](gate, x, y, n, h * d, d, gate.stride(0), gate.stride(1), x.stride(0),
                                                      BLOCK=block, num_warps=4, **pdl_options(gate))
    return y
