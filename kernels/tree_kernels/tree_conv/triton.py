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

from .._triton_common import as_last_contiguous, next_pow2, path_operand

__all__ = ["tree_conv1d", "tree_conv_commit", "MAX_COMMIT_WIDTH"]

MAX_COMMIT_WIDTH = 4  # widths 2..4 in one launch (conv states of up to three columns)


@triton.jit
def _tree_conv_kernel(
    X, CS, Wt, Bias, Idx, Y,
    T, C,
    sx_t, scs_c, scs_w, sw_c, sw_w, si_t, sy_t,
    W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    rm = rows < T
    cm = cols < C
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
    if HAS_BIAS:
        acc += tl.load(Bias + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(Y + rows[:, None] * sy_t + cols[None, :], acc.to(Y.dtype.element_ty), mask=rm[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["plen"])
def _conv_commit_kernel(
    X, CS, Path, Out, Count, C, plen, sx_t, scs_c, scs_w,
    KEEP: tl.constexpr, BC: tl.constexpr, IS_RANGE: tl.constexpr, DEVICE_COUNT: tl.constexpr,
):
    if DEVICE_COUNT:  # a padded path whose valid length lives on the device (fast path)
        plen = tl.load(Count).to(tl.int32)
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


def _activation(activation) -> bool:
    if activation in (None, "identity"):
        return False
    if activation in ("silu", "swish"):
        return True
    raise ValueError(f"unsupported conv activation {activation!r}")


def tree_conv1d(x, conv_state, weight, bias, index, activation="silu", *, block_t: int | None = None, block_c: int | None = None, num_warps: int = 4):
    width = weight.shape[-1]
    t, c = x.shape
    if index.shape != (t, width) or conv_state.shape != (c, width - 1):
        raise ValueError(
            f"tree_conv1d: x {tuple(x.shape)}, conv_state {tuple(conv_state.shape)}, "
            f"weight {tuple(weight.shape)}, index {tuple(index.shape)} do not fit"
        )
    silu = _activation(activation)
    x = as_last_contiguous(x)
    index = as_last_contiguous(index)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    bt = block_t or min(16, max(2, next_pow2(t)))
    bc = block_c or 256
    grid = (triton.cdiv(t, bt), triton.cdiv(c, bc))
    _tree_conv_kernel[grid](
        x, conv_state, weight, bias if bias is not None else weight, index, y,
        t, c,
        x.stride(0), conv_state.stride(0), conv_state.stride(1), weight.stride(0), weight.stride(1), index.stride(0), y.stride(0),
        W=width, BT=bt, BC=bc, HAS_BIAS=bias is not None, SILU=silu, num_warps=num_warps,
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
        c, plen, x.stride(0), conv_state.stride(0), conv_state.stride(1),
        KEEP=keep, BC=block_c, IS_RANGE=is_range, DEVICE_COUNT=count is not None, num_warps=num_warps,
    )
    return out
