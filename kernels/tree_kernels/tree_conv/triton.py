"""Tree causal depthwise conv1d in Triton (gather table + bias + SiLU) and the conv-state commit.

Same semantics as naive.py. conv: one program per (block of nodes, block of channels); tap w of
node n reads ``x[idx[n, w]]`` when the index is a node, else column ``idx + W - 1`` of the
committed conv state; products and the sum in fp32, one rounding to x's dtype at the end.
commit: one launch; new column j is input P + j of cat([conv_state columns, x[path]]) (P = path
length, known on the host): an old state column, or x at a path node read from the index tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._pdl import pdl_enter, pdl_options
from .._triton_common import as_last_contiguous, next_pow2, path_operand
from ..norms.triton import gdn_gate_values

__all__ = ["tree_conv1d", "tree_conv1d_gdn_gates", "gdn_gates_block", "tree_conv_commit", "tree_conv_commit_layers", "conv1d_decode_step", "MAX_COMMIT_WIDTH"]

MAX_COMMIT_WIDTH = 4  # widths 2..4 in one launch (conv states of up to three columns)


@triton.jit
def _conv_taps(X, CS, Wt, Idx, rows, rm, cols, cm, sx_t, scs_c, scs_w, sw_c, sw_w, si_t,
               W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """sum_w weight[:, w] * (x or conv-state column) at tap w of each node, fp32 [BT, BC]."""
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for w in tl.static_range(W):
        idx = tl.load(Idx + rows * si_t + w, mask=rm, other=0)
        node = idx >= 0
        xv = tl.load(X + idx[:, None] * sx_t + cols[None, :], mask=(rm & node)[:, None] & cm[None, :], other=0.0)
        sv = tl.load(CS + cols[None, :] * scs_c + (idx + W - 1)[:, None] * scs_w,
                     mask=(rm & (idx < 0))[:, None] & cm[None, :], other=0.0)
        val = tl.where(node[:, None], xv.to(tl.float32), sv.to(tl.float32))
        wv = tl.load(Wt + cols * sw_c + w * sw_w, mask=cm, other=0.0).to(tl.float32)
        acc += val * wv[None, :]
    return acc


@triton.jit
def _tree_conv_kernel(
    X, CS, Wt, Bias, Idx, Y, XOut,
    T, C,
    sx_t, scs_c, scs_w, sw_c, sw_w, si_t, sy_t, sxo_t,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    SAVE_X: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    rm = rows < T
    cm = cols < C
    acc = _conv_taps(X, CS, Wt, Idx, rows, rm, cols, cm, sx_t, scs_c, scs_w, sw_c, sw_w, si_t, W, BT, BC)
    if SAVE_X:  # the nodes' own inputs, kept for the commit (the last tap read them already: an L1/L2 hit)
        xs = tl.load(X + rows[:, None] * sx_t + cols[None, :], mask=rm[:, None] & cm[None, :], other=0.0)
        tl.store(XOut + rows[:, None] * sxo_t + cols[None, :], xs.to(XOut.dtype.element_ty), mask=rm[:, None] & cm[None, :])
    if HAS_BIAS:
        acc += tl.load(Bias + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(Y + rows[:, None] * sy_t + cols[None, :], acc.to(Y.dtype.element_ty), mask=rm[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["plen"])
def _conv_commit_kernel(
    X, CS, Path, Out, Count, C, plen, sx_t, scs_c, scs_w, sl_x, sl_cs, sl_out,
    KEEP: tl.constexpr, BC: tl.constexpr, IS_RANGE: tl.constexpr, DEVICE_COUNT: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    if DEVICE_COUNT:  # a padded path whose valid length lives on the device (fast path)
        plen = tl.load(Count).to(tl.int32)
    layer = tl.program_id(1).to(tl.int64)  # stacked layers (tree_conv_commit_layers): one launch
    X += layer * sl_x
    CS += layer * sl_cs
    Out += layer * sl_out
    cols = tl.program_id(0) * BC + tl.arange(0, BC)
    cm = cols < C
    for j in tl.static_range(KEEP):
        pos = plen + j  # position in cat([conv_state columns, x[path]])
        if pos >= KEEP:  # an input of the path
            if IS_RANGE:
                node = pos - KEEP
            else:
                node = tl.load(Path + (pos - KEEP)).to(tl.int32)
            val = tl.load(X + node * sx_t + cols, mask=cm, other=0.0).to(Out.dtype.element_ty)
        else:  # the path is shorter than the window: an old state column
            val = tl.load(CS + cols * scs_c + pos * scs_w, mask=cm, other=0.0).to(Out.dtype.element_ty)
        tl.store(Out + cols * KEEP + j, val, mask=cm)


@triton.jit
def _conv_decode_kernel(
    X, CS, Wt, Bias, Y, Out, C, scs_c, scs_w, sw_c, sw_w, so_c, so_w,
    W: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    # one token: taps 0..W-2 read the state's columns (oldest first), tap W-1 the token; then the
    # window moves by one. Out may be CS: every column is loaded before the barrier, stored after.
    cols = tl.program_id(0) * BC + tl.arange(0, BC)
    cm = cols < C
    s0 = tl.load(CS + cols * scs_c, mask=cm, other=0.0)
    s1 = tl.zeros_like(s0)
    s2 = tl.zeros_like(s0)
    if W >= 3:
        s1 = tl.load(CS + cols * scs_c + scs_w, mask=cm, other=0.0)
    if W >= 4:
        s2 = tl.load(CS + cols * scs_c + 2 * scs_w, mask=cm, other=0.0)
    xv = tl.load(X + cols, mask=cm, other=0.0)
    acc = s0.to(tl.float32) * tl.load(Wt + cols * sw_c, mask=cm, other=0.0).to(tl.float32)
    if W >= 3:
        acc += s1.to(tl.float32) * tl.load(Wt + cols * sw_c + sw_w, mask=cm, other=0.0).to(tl.float32)
    if W >= 4:
        acc += s2.to(tl.float32) * tl.load(Wt + cols * sw_c + 2 * sw_w, mask=cm, other=0.0).to(tl.float32)
    acc += xv.to(tl.float32) * tl.load(Wt + cols * sw_c + (W - 1) * sw_w, mask=cm, other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(Bias + cols, mask=cm, other=0.0).to(tl.float32)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(Y + cols, acc.to(Y.dtype.element_ty), mask=cm)
    tl.debug_barrier()
    od = Out.dtype.element_ty
    if W == 2:
        tl.store(Out + cols * so_c, xv.to(od), mask=cm)
    if W == 3:
        tl.store(Out + cols * so_c, s1.to(od), mask=cm)
        tl.store(Out + cols * so_c + so_w, xv.to(od), mask=cm)
    if W == 4:
        tl.store(Out + cols * so_c, s1.to(od), mask=cm)
        tl.store(Out + cols * so_c + so_w, s2.to(od), mask=cm)
        tl.store(Out + cols * so_c + 2 * so_w, xv.to(od), mask=cm)


@triton.jit
def _tree_conv_gdn_kernel(
    X, CS, Wt, Idx, QN, KN, V, XOut, B, A, ALog, DtBias, Beta, G,
    T, C, KD, HV, NCB,
    sx_t, scs_c, scs_w, sw_c, sw_w, si_t, sxo_t, sb_t, sa_t,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, DK: tl.constexpr, BHV: tl.constexpr, SAVE_X: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    # program (node block, channel block): the tree conv + SiLU of _tree_conv_kernel, rounded to x's
    # dtype as there; a block of q or k channels (whole heads: BC divides KD, DK divides BC) is then
    # l2-normalised per head in fp32 as gdn_gates does, a block of v stored as it is. The extra
    # channel-block column (pid 1 == NCB) computes beta and g for its nodes.
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    rm = rows < T
    cb = tl.program_id(1)
    if cb < NCB:
        cols = cb * BC + tl.arange(0, BC)
        cm = cols < C
        acc = _conv_taps(X, CS, Wt, Idx, rows, rm, cols, cm, sx_t, scs_c, scs_w, sw_c, sw_w, si_t, W, BT, BC)
        m2 = rm[:, None] & cm[None, :]
        if SAVE_X:
            xs = tl.load(X + rows[:, None] * sx_t + cols[None, :], mask=m2, other=0.0)
            tl.store(XOut + rows[:, None] * sxo_t + cols[None, :], xs.to(XOut.dtype.element_ty), mask=m2)
        y = (acc / (1.0 + tl.exp(-acc))).to(X.dtype.element_ty)
        c0 = cb * BC
        if c0 < 2 * KD:
            y3 = tl.reshape(y.to(tl.float32), (BT, BC // DK, DK))
            inv = 1.0 / tl.sqrt(tl.sum(y3 * y3, axis=2) + 1e-6)
            yn = tl.reshape(y3 * inv[:, :, None], (BT, BC))
            if c0 < KD:
                tl.store(QN + rows[:, None] * KD + cols[None, :], yn, mask=m2)
            else:
                tl.store(KN + rows[:, None] * KD + (cols - KD)[None, :], yn, mask=m2)
        else:
            tl.store(V + rows[:, None] * (C - 2 * KD) + (cols - 2 * KD)[None, :], y, mask=m2)
    else:
        rv = tl.arange(0, BHV)
        for i in tl.static_range(BT):
            t = tl.program_id(0) * BT + i
            mv = rv < tl.where(t < T, HV, 0)  # (a node past T: nothing)
            beta, g = gdn_gate_values(B + t * sb_t, A + t * sa_t, ALog, DtBias, rv, mv)
            tl.store(Beta + t * HV + rv, beta.to(Beta.dtype.element_ty), mask=mv)
            tl.store(G + t * HV + rv, g, mask=mv)


# 8 warps: at 4 the [16, 256] tile with its four taps in flight needs 255 registers and spills
# 208 bytes a thread (sm_90, bench.regs-style AOT compile), at 8 it takes 212 and spills nothing
GDN_GATES_WARPS = 8


def gdn_gates_block(key_dim: int, dk: int, limit: int = 256) -> int | None:
    """The channel block of tree_conv1d_gdn_gates: whole heads (a power-of-two multiple of dk, at
    most ``limit`` unless one head is wider) dividing key_dim; None where dk is not a power of two."""
    if dk < 1 or dk & (dk - 1) or key_dim % dk:
        return None
    heads = key_dim // dk
    per = 1
    while dk * per * 2 <= limit and heads % (per * 2) == 0:
        per *= 2
    return dk * per


def tree_conv1d_gdn_gates(x, conv_state, weight, index, b, a, A_log, dt_bias, key_dim: int, dk: int, *,
                          x_out: torch.Tensor | None = None, block_t: int | None = None, num_warps: int | None = None):
    """The GDN layer's tree conv (SiLU, no bias) and its gates in one launch. x [T, C] holds q | k | v
    (C = 2 key_dim + value_dim). Returns (q, k [T, key_dim // dk, dk] fp32 l2-normed, v [T, value_dim]
    in x's dtype, beta [T, HV] in b's dtype, g [T, HV] fp32): what tree_conv1d then gdn_gates give."""
    width = weight.shape[-1]
    t, c = x.shape
    hv = b.shape[-1]
    bc = gdn_gates_block(key_dim, dk)
    if bc is None:
        raise ValueError(f"tree_conv1d_gdn_gates: head dim {dk} must be a power of two dividing key_dim {key_dim}")
    if c <= 2 * key_dim or index.shape != (t, width) or conv_state.shape != (c, width - 1) or not 2 <= width <= 4:
        raise ValueError(f"tree_conv1d_gdn_gates: x {tuple(x.shape)}, conv_state {tuple(conv_state.shape)}, weight "
                         f"{tuple(weight.shape)}, index {tuple(index.shape)}, key_dim {key_dim} do not fit")
    if b.shape != (t, hv) or a.shape != (t, hv) or A_log.shape != (hv,) or dt_bias.shape != (hv,):
        raise ValueError(f"tree_conv1d_gdn_gates: b {tuple(b.shape)}, a {tuple(a.shape)}, A_log {tuple(A_log.shape)}, "
                         f"dt_bias {tuple(dt_bias.shape)} do not fit {t} nodes")
    if x_out is not None and (x_out.shape != (t, c) or x_out.stride(-1) != 1):
        raise ValueError(f"tree_conv1d_gdn_gates: x_out must be a {(t, c)} tensor with contiguous rows, got {tuple(x_out.shape)}")
    x, index = as_last_contiguous(x), as_last_contiguous(index)
    b = b if b.stride(-1) == 1 else b.contiguous()
    a = a if a.stride(-1) == 1 else a.contiguous()
    dev = x.device
    q = torch.empty(t, key_dim // dk, dk, dtype=torch.float32, device=dev)
    k = torch.empty_like(q)
    v = torch.empty(t, c - 2 * key_dim, dtype=x.dtype, device=dev)
    beta = torch.empty(t, hv, dtype=b.dtype, device=dev)
    g = torch.empty(t, hv, dtype=torch.float32, device=dev)
    if t:
        bt = block_t or min(16, max(2, next_pow2(t)))
        ncb = triton.cdiv(c, bc)
        _tree_conv_gdn_kernel[(triton.cdiv(t, bt), ncb + 1)](
            x, conv_state, weight, index, q, k, v, x_out if x_out is not None else v, b, a, A_log, dt_bias, beta, g,
            t, c, key_dim, hv, ncb,
            x.stride(0), conv_state.stride(0), conv_state.stride(1), weight.stride(0), weight.stride(1), index.stride(0),
            x_out.stride(0) if x_out is not None else 0, b.stride(0), a.stride(0),
            W=width, BT=bt, BC=bc, DK=dk, BHV=max(2, next_pow2(hv)), SAVE_X=x_out is not None,
            num_warps=num_warps or GDN_GATES_WARPS, **pdl_options(x)
        )
    return q, k, v, beta, g


def _activation(activation) -> bool:
    if activation in (None, "identity"):
        return False
    if activation in ("silu", "swish"):
        return True
    raise ValueError(f"unsupported conv activation {activation!r}")


def tree_conv1d(x, conv_state, weight, bias, index, activation="silu", *, block_t: int | None = None, block_c: int | None = None,
                num_warps: int = 4, x_out: torch.Tensor | None = None):
    """``x_out`` [T, C] (contiguous rows): also store the inputs there, in the same launch (a
    layer's slice of stacked buffers that one launch then commits for every layer)."""
    width = weight.shape[-1]
    t, c = x.shape
    if index.shape != (t, width) or conv_state.shape != (c, width - 1):
        raise ValueError(
            f"tree_conv1d: x {tuple(x.shape)}, conv_state {tuple(conv_state.shape)}, "
            f"weight {tuple(weight.shape)}, index {tuple(index.shape)} do not fit"
        )
    if x_out is not None and (x_out.shape != (t, c) or x_out.stride(-1) != 1):
        raise ValueError(f"tree_conv1d: x_out must be a {(t, c)} tensor with contiguous rows, got {tuple(x_out.shape)}")
    silu = _activation(activation)
    x = as_last_contiguous(x)
    index = as_last_contiguous(index)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    bt = block_t or min(16, max(2, next_pow2(t)))
    bc = block_c or 256
    grid = (triton.cdiv(t, bt), triton.cdiv(c, bc))
    _tree_conv_kernel[grid](
        x, conv_state, weight, bias if bias is not None else weight, index, y, x_out if x_out is not None else y,
        t, c,
        x.stride(0), conv_state.stride(0), conv_state.stride(1), weight.stride(0), weight.stride(1), index.stride(0), y.stride(0),
        x_out.stride(0) if x_out is not None else 0,
        W=width, BT=bt, BC=bc, HAS_BIAS=bias is not None, SILU=silu, SAVE_X=x_out is not None, num_warps=num_warps, **pdl_options(x)
    )
    return y


def tree_conv_commit(x, conv_state, path, *, count: torch.Tensor | None = None, block_c: int = 1024, num_warps: int = 4,
                     out: torch.Tensor | None = None):
    """Conv state after accepting ``path`` (the last W-1 inputs along it), one launch.

    ``path``: a host list (copied once and cached: every layer of a round commits the same
    path) or a device tensor (no host sync). ``out`` may be ``conv_state`` itself (contiguous):
    column j is written after every read it precedes (reads are of columns plen + j' > j')."""
    keep = conv_state.shape[1]
    if not 1 <= keep <= MAX_COMMIT_WIDTH - 1:
        raise ValueError(f"tree_conv_commit (triton): conv state of {keep} columns is not supported")
    x = as_last_contiguous(x)
    idx, plen, is_range = path_operand(path, x.device)
    c = conv_state.shape[0]
    if out is None:
        out = torch.empty(c, keep, dtype=conv_state.dtype, device=conv_state.device)
    elif out.shape != (c, keep) or out.dtype != conv_state.dtype or not out.is_contiguous():
        raise ValueError(f"tree_conv_commit: out must be a contiguous {(c, keep)} {conv_state.dtype} tensor")
    _conv_commit_kernel[(triton.cdiv(c, block_c),)](
        x, conv_state, idx if idx is not None else x, out, count.reshape(1) if count is not None else out,
        c, plen, x.stride(0), conv_state.stride(0), conv_state.stride(1), 0, 0, 0,
        KEEP=keep, BC=block_c, IS_RANGE=is_range, DEVICE_COUNT=count is not None, num_warps=num_warps, **pdl_options(x)
    )
    return out


def tree_conv_commit_layers(x, conv_states, path, count, *, block_c: int = 1024, num_warps: int = 4):
    """``tree_conv_commit`` of L stacked layers in one launch, in place: ``x`` [L, T, C] (each
    layer's conv inputs), ``conv_states`` [L, C, W-1] contiguous, ``path`` a padded device path
    with ``count`` valid slots. Returns ``conv_states``."""
    n, t, c = x.shape
    keep = conv_states.shape[-1]
    if conv_states.shape[:2] != (n, c) or conv_states.dim() != 3 or not conv_states.is_contiguous():
        raise ValueError(f"tree_conv_commit_layers: conv states must be contiguous [{n}, {c}, W-1], got "
                         f"{tuple(conv_states.shape)}")
    if not 1 <= keep <= MAX_COMMIT_WIDTH - 1:
        raise ValueError(f"tree_conv_commit_layers (triton): conv state of {keep} columns is not supported")
    if x.stride(-1) != 1:
        raise ValueError("tree_conv_commit_layers: x must be contiguous in its last dim")
    idx, plen, _ = path_operand(path, x.device)
    _conv_commit_kernel[(triton.cdiv(c, block_c), n)](
        x, conv_states, idx, conv_states, count.reshape(1),
        c, plen, x.stride(1), conv_states.stride(1), conv_states.stride(2), x.stride(0), conv_states.stride(0),
        conv_states.stride(0),
        KEEP=keep, BC=block_c, IS_RANGE=False, DEVICE_COUNT=True, num_warps=num_warps, **pdl_options(x)
    )
    return conv_states


def conv1d_decode_step(x, conv_state, weight, bias=None, activation="silu", *, out: torch.Tensor | None = None,
                       block_c: int = 1024, num_warps: int = 4):
    """One committed token: (y [1, C], next conv state), one launch. ``out`` may be ``conv_state``
    (the window then moves in place: the AR step's conv needs no separate commit)."""
    width = weight.shape[-1]
    c = conv_state.shape[0]
    if x.dim() != 2 or x.shape[0] != 1 or x.shape[1] != c or conv_state.shape != (c, width - 1):
        raise ValueError(f"conv1d_decode_step: x {tuple(x.shape)} (one token [1, C]), conv_state "
                         f"{tuple(conv_state.shape)}, weight {tuple(weight.shape)} do not fit")
    if not 2 <= width <= MAX_COMMIT_WIDTH:
        raise ValueError(f"conv1d_decode_step (triton): conv width {width} is not supported (2..{MAX_COMMIT_WIDTH})")
    silu = _activation(activation)
    x = as_last_contiguous(x)
    if out is None:
        out = torch.empty(c, width - 1, dtype=conv_state.dtype, device=conv_state.device)
    elif out.shape != conv_state.shape or out.dtype != conv_state.dtype:
        raise ValueError(f"conv1d_decode_step: out must be a {tuple(conv_state.shape)} {conv_state.dtype} tensor")
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    _conv_decode_kernel[(triton.cdiv(c, block_c),)](
        x, conv_state, weight, bias if bias is not None else weight, y, out, c,
        conv_state.stride(0), conv_state.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
        W=width, BC=block_c, HAS_BIAS=bias is not None, SILU=silu, num_warps=num_warps, **pdl_options(x)
    )
    return y, out
