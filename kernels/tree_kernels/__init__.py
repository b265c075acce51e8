"""Tree-verify kernels for DDTree on hybrid targets, each beside its plain-torch reference.

Installed as ``tree_kernels`` (the folder is ``kernels/`` in the repository; it is never a
package named ``kernels``, which is an unrelated project that transformers probes for).

The functions here dispatch: Triton on CUDA (or when forced), the torch reference otherwise.
The references live in ``tree_<op>/naive.py`` and are what every kernel is tested against.
"""

from __future__ import annotations

import os

import torch

from .backend import (PDL_GROUPS, Switch, fused_norms_enabled, gemv_enabled, get_backend, pdl_enabled, round_kernels_enabled,
                      set_backend, set_fused_norms, set_gemv, set_pdl, set_round_kernels, set_small_gemm,
                      small_gemm_enabled, triton_available, use_backend, use_fused_norms, use_gemv, use_pdl,
                      use_round_kernels, use_small_gemm, use_triton, pdl_exempt, set_pdl_exempt, use_pdl_exempt)
from .tree_attention import naive as attention_naive
from .tree_build import naive as build_naive
from .tree_conv import naive as conv_naive
from .tree_gdn import naive as gdn_naive
from .tree_mask import naive as mask_naive
from .tree_walk import naive as walk_naive
from .norms import naive as norms_naive
from .tree_gdn.naive import TreeGDNStash

__all__ = [
    "TreeGDNStash",
    "get_backend",
    "set_backend",
    "use_backend",
    "use_triton",
    "triton_available",
    "tree_attention",
    "tree_build",
    "tree_walk",
    "ancestor_mask",
    "conv_gather_table",
    "tree_conv1d",
    "tree_conv_commit",
    "conv1d_decode_step",
    "tree_gdn_fork",
    "tree_gdn_commit",
    "gdn_decode_step",
    "gdn_decode_step_gated",
    "rms_norm",
    "add_rms_norm",
    "gated_rms_norm",
    "gdn_gates",
    "rotary",
    "qk_norm_rotary",
    "silu_mul",
    "sigmoid_mul",
    "fused_norms_enabled",
    "fused_norms_for",
    "set_fused_norms",
    "use_fused_norms",
    "linear",
    "gemv_enabled",
    "set_gemv",
    "use_gemv",
    "l2_prefetch_start",
    "l2_prefetch_join",
    "l2_prefetch_enabled",
    "set_l2_prefetch",
    "use_l2_prefetch",
    "pdl_enabled",
    "set_pdl",
    "use_pdl",
    "PDL_GROUPS",
    "pdl_exempt",
    "set_pdl_exempt",
    "use_pdl_exempt",
    "round_kernels_enabled",
    "set_round_kernels",
    "use_round_kernels",
    "small_gemm_enabled",
    "set_small_gemm",
    "use_small_gemm",
]


_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _floats(*xs) -> bool:
    """Triton kernels take half types and fp32; fp64 (the maths tests) always stays on torch."""
    return all(x is None or x.dtype in _FLOATS for x in xs)


def tree_gdn_fork(q, k, v, g, beta, state, anc, scale=None, **tuning):
    """Exact ancestor-masked gated delta rule. See tree_gdn/naive.py. Returns (o fp32, stash).

    ``tuning`` (Triton only): ``config={"BS": ..., "BV": ..., "num_warps": ...}``, ``rooted=True``
    when node 0 is known to be every node's ancestor (the dense kernel then peels it).
    """
    if use_triton(v) and _floats(q, k, v, g, beta, state):
        from .tree_gdn import triton as impl

        return impl.tree_gdn_fork(q, k, v, g, beta, state, anc, scale, **tuning)
    o, stash = gdn_naive.tree_gdn_fork(q, k, v, g, beta, state, anc, scale)
    out = tuning.get("stash_out")
    if out is None:
        return o, stash
    gdn_naive.check_stash_out(out, *stash.k.shape, stash.u.shape[-1])
    for name in ("k", "u", "G"):
        getattr(out, name).copy_(getattr(stash, name))
    return o, out


def tree_gdn_commit(stash, state, path):
    """State after the accepted node ``path[-1]`` from the fork stash (fp32 [HV, dk, dv])."""
    if use_triton(stash.G) and _floats(stash.k, stash.u, stash.G, state):
        from .tree_gdn import triton as impl

        return impl.tree_gdn_commit(stash, state, path)
    return gdn_naive.tree_gdn_commit(stash, state, path)


def gdn_decode_step(q, k, v, g, beta, state, scale=None, **tuning):
    """One committed token (T = 1): (o, next state), the fork and the commit of a one-node tree in
    one pass over the state. See tree_gdn/naive.py. ``tuning`` (Triton only): ``out`` (may be
    ``state``: in place), ``block_v``, ``num_warps``."""
    if use_triton(v) and _floats(q, k, v, g, beta, state):
        from .tree_gdn import triton as impl

        return impl.gdn_decode_step(q, k, v, g, beta, state, scale, **tuning)
    o, nxt = gdn_naive.gdn_decode_step(q, k, v, g, beta, state, scale)
    return o, _into(tuning.get("out"), nxt)


def _into(out, new):
    """A reference's new state written into ``out`` when given (the references compute a new
    tensor first, so ``out`` may alias the old state: the in-place route of the kernels)."""
    if out is None:
        return new
    out.copy_(new)
    return out


def tree_conv1d(x, conv_state, weight, bias, index, activation="silu", **tuning):
    """Tree causal depthwise conv1d with the gather table (+ SiLU). See tree_conv/naive.py."""
    if use_triton(x) and _floats(x, conv_state, weight, bias) and 2 <= weight.shape[-1] <= 4:
        from .tree_conv import triton as impl

        return impl.tree_conv1d(x, conv_state, weight, bias, index, activation, **tuning)
    out = tuning.get("x_out")
    if out is not None:  # the inputs kept for the stacked commit
        if out.shape != x.shape:
            raise ValueError(f"tree_conv1d: x_out must be a {tuple(x.shape)} tensor, got {tuple(out.shape)}")
        out.copy_(x)
    return conv_naive.tree_conv1d(x, conv_state, weight, bias, index, activation)


def gdn_decode_step_gated(q, k, v, b, a, A_log, dt_bias, state, scale=None, out=None):
    """The AR step's gates and recurrence: gdn_gates (l2-normed q, k; beta; g) then
    gdn_decode_step, fused into one launch on the Triton route. q, k raw [1, H, dk]; b, a raw
    [1, HV]. ``out`` may be ``state`` (in place). Returns (o, next state)."""
    up = torch.promote_types(v.dtype, torch.float32)
    if up == torch.float32 and _fused(q, k, b, a, A_log, dt_bias) and _floats(v, state):
        from .tree_gdn import triton as impl

        return impl.gdn_decode_step_gated(q, k, v, b, a, A_log, dt_bias, state, scale, out=out)
    qn, kn, beta, g = gdn_gates(q, k, b, a, A_log, dt_bias, up)
    return gdn_decode_step(q=qn, k=kn, v=v, g=g, beta=beta, state=state, scale=scale, out=out)


def conv1d_decode_step(x, conv_state, weight, bias=None, activation="silu", out=None):
    """One committed token (T = 1): (y, next conv state), the tree conv of a one-node tree and
    its commit in one launch. ``out`` may be ``conv_state`` (in place). See tree_conv/naive.py."""
    if use_triton(x) and _floats(x, conv_state, weight, bias) and 2 <= weight.shape[-1] <= 4:
        from .tree_conv import triton as impl

        return impl.conv1d_decode_step(x, conv_state, weight, bias, activation, out=out)
    y, nxt = conv_naive.conv1d_decode_step(x, conv_state, weight, bias, activation)
    return y, _into(out, nxt)


def tree_conv_commit(x, conv_state, path):
    """Conv state after accepting ``path``: the last W-1 inputs along it."""
    if use_triton(x) and _floats(x, conv_state) and 1 <= conv_state.shape[1] <= 3:
        from .tree_conv import triton as impl

        return impl.tree_conv_commit(x, conv_state, path)
    return conv_naive.tree_conv_commit(x, conv_state, path)


def tree_attention(q, k, v, anc, prefix_len, scale=None, positions=None, window=None, *, bitmask=None, **tuning):
    """Tree nodes over the committed prefix + their ancestors. See tree_attention/naive.py.

    ``bitmask`` (optional, Triton only): the per-row int64 ancestor bitmask
    (``workbench.tree.ancestor_bitmask``) to read instead of the bool matrix.
    ``tuning`` (Triton only): ``num_splits=...``, ``config={...}``.
    """
    if use_triton(q) and _floats(q, k, v) and q.shape[-1] <= 256:
        from .tree_attention import triton as impl

        return impl.tree_attention(q, k, v, anc, prefix_len, scale, positions, window, bitmask=bitmask, **tuning)
    return attention_naive.tree_attention(q, k, v, anc, prefix_len, scale, positions, window)


def tree_build(draft_tokens, draft_logprobs, budget, root_token):
    """The DDTree of ``budget`` nodes from the per-depth top-k, best-first. See tree_build/naive.py.

    Returns (tokens, parents, depths, scores, ranks, valid), ``budget + 1`` slots each.
    """
    if use_triton(draft_logprobs) and _floats(draft_logprobs):
        from .tree_build import triton as impl

        return impl.tree_build(draft_tokens, draft_logprobs, budget, root_token)
    return build_naive.tree_build(draft_tokens, draft_logprobs, budget, root_token)


def ancestor_mask(parents, max_depth):
    """anc[i, j]: j is i or an ancestor of i, for a static tree's parents. See tree_mask/naive.py."""
    if round_kernels_enabled() and use_triton(parents):
        from .tree_mask import triton as impl

        return impl.ancestor_mask(parents, max_depth)
    return mask_naive.ancestor_mask(parents, max_depth)


def conv_gather_table(parents, width):
    """The rows a width-W causal conv reads for each node of a tree (its W - 1 nearest ancestors,
    then the committed conv state): [T, W] int64. See tree_mask/naive.py."""
    if round_kernels_enabled() and use_triton(parents):
        from .tree_mask import triton as impl

        return impl.conv_gather_table(parents, width)
    return mask_naive.conv_gather_table(parents, width)


def tree_walk(tokens, parents, depths, valid, anc, choices, max_depth):
    """Which nodes of a static tree the target accepts: (path, count, bonus, last), all on the
    device. See tree_walk/naive.py."""
    if round_kernels_enabled() and use_triton(tokens):
        from .tree_walk import triton as impl

        return impl.tree_walk(tokens, parents, depths, valid, anc, choices, max_depth)
    return walk_naive.tree_walk(tokens, parents, depths, valid, anc, choices, max_depth)


def fused_norms_for(x: torch.Tensor) -> bool:
    """Whether the row-wise work on tensors like ``x`` takes the fused kernels (switch on, Triton runs there)."""
    return fused_norms_enabled() and use_triton(x)


def _fused(x: torch.Tensor, *others) -> bool:
    """The fused kernels have no backward: anything that needs gradients takes the reference."""
    if not fused_norms_enabled():  # switched off: one flag read, nothing else per call
        return False
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *others))
    return not needs_grad and use_triton(x) and _floats(x, *others)


def rms_norm(x, weight, eps, zero_centered):
    """RMSNorm over the last dim (zero-centred (1 + w) or plain w). See norms/naive.py."""
    if _fused(x, weight):
        from .norms import triton as impl

        return impl.rms_norm(x, weight, eps, zero_centered)
    return norms_naive.rms_norm(x, weight, eps, zero_centered)


def add_rms_norm(x, delta, weight, eps, zero_centered):
    """(x + delta, RMSNorm(x + delta)): a residual add and the norm that reads it, one launch fused."""
    if x.dim() == 2 and delta.shape == x.shape and delta.dtype == x.dtype and _fused(x, delta, weight):
        from .norms import triton as impl

        return impl.add_rms_norm(x, delta, weight, eps, zero_centered)
    return norms_naive.add_rms_norm(x, delta, weight, eps, zero_centered)


def gated_rms_norm(x, gate, weight, eps, out_dtype=None):
    """The GDN output norm: w * RMSNorm(x) * silu(gate); with ``out_dtype``, of x.to(out_dtype)
    (fused: no separate cast). See norms/naive.py."""
    if _fused(x, gate, weight):
        from .norms import triton as impl

        return impl.gated_rms_norm(x, gate, weight, eps, out_dtype)
    return norms_naive.gated_rms_norm(x, gate, weight, eps, out_dtype)


def gdn_gates(q, k, b, a, A_log, dt_bias, up_dtype=torch.float32):
    """l2-normed q, k (in ``up_dtype``), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)."""
    if up_dtype == torch.float32 and _fused(q, k, b, a, A_log, dt_bias):
        from .norms import triton as impl

        return impl.gdn_gates(q, k, b, a, A_log, dt_bias)
    return norms_naive.gdn_gates(q, k, b, a, A_log, dt_bias, up_dtype)


# The GDN layer's tree conv and gates in one launch (tree_conv/triton.py). use_fused_conv_gates(False)
# or WORKBENCH_FUSED_CONV_GATES=0: two launches (bench.e2e --fusion-variants compares them)
_conv_gates = Switch("WORKBENCH_FUSED_CONV_GATES")
fused_conv_gates_enabled, use_fused_conv_gates = _conv_gates.enabled, _conv_gates.use


def gdn_gates_of_conv(y, b, a, A_log, dt_bias, key_dim, dk):
    """The gates of a GDN layer's conv output y [T, 2 key_dim + value_dim] (q | k | v): (l2-normed
    q, k [T, H, dk], v [T, value_dim] as a view of y, beta, g)."""
    t = y.shape[0]
    up = torch.promote_types(y.dtype, torch.float32)
    qn, kn, beta, g = gdn_gates(y[:, :key_dim].reshape(t, -1, dk), y[:, key_dim : 2 * key_dim].reshape(t, -1, dk),
                                b, a, A_log, dt_bias, up)
    return qn, kn, y[:, 2 * key_dim :], beta, g


def tree_conv1d_gdn_gates(x, conv_state, weight, index, b, a, A_log, dt_bias, key_dim, dk, x_out=None):
    """A GDN layer's tree conv (SiLU, no bias) then its gates: (l2-normed q, k [T, H, dk] fp32, v
    [T, value_dim], beta, g), one launch on the fused Triton route (tree_conv1d then gdn_gates
    otherwise). ``x_out``: also keep the conv inputs there (as tree_conv1d)."""
    if _conv_gates.on and 2 <= weight.shape[-1] <= 4 and _fused(x, conv_state, weight, b, a, A_log, dt_bias):
        from .tree_conv import triton as conv_impl

        if conv_impl.gdn_gates_block(key_dim, dk) is not None:
            return conv_impl.tree_conv1d_gdn_gates(x, conv_state, weight, index, b, a, A_log, dt_bias, key_dim, dk,
                                                   x_out=x_out)
    extra = {"x_out": x_out} if x_out is not None else {}
    return gdn_gates_of_conv(tree_conv1d(x, conv_state, weight, None, index, "silu", **extra), b, a, A_log, dt_bias, key_dim, dk)


def qk_norm_rotary(q, k, wq, wk, eps, zero_centered, cos, sin):
    """Attention's q / k RMSNorm then rotary: one launch fused (four otherwise). See norms/naive.py."""
    same = (zero_centered or (wq.dtype == q.dtype and wk.dtype == k.dtype)) and q.dtype == k.dtype == cos.dtype
    if same and q.dim() == 3 and k.dim() == 3 and k.shape[1] <= q.shape[1] and _fused(q, k, wq, wk, cos, sin):
        from .norms import triton as impl

        return impl.qk_norm_rotary(q, k, wq, wk, eps, zero_centered, cos, sin)
    return norms_naive.qk_norm_rotary(q, k, wq, wk, eps, zero_centered, cos, sin)


def rotary(x, cos, sin):
    """Rotate-half rotary on the first ``cos.shape[-1]`` channels of each head. See norms/naive.py."""
    if x.dim() == 3 and _fused(x, cos, sin):
        from .norms import triton as impl

        return impl.rotary(x, cos, sin)
    return norms_naive.rotary(x, cos, sin)


def sigmoid_mul(gate, x):
    """x * sigmoid(gate), attention's output gate ([T, H, D]). See norms/naive.py."""
    if gate.dim() == 3 and gate.shape == x.shape and _fused(gate, x):
        from .norms import triton as impl

        return impl.sigmoid_mul(gate, x)
    return norms_naive.sigmoid_mul(gate, x)


def linear(x, weight, bias=None):
    """``F.linear(x, weight, bias)``. In half precision where Triton runs (switch: use_gemv), one row
    (the AR step) takes the Triton GEMV, and 2 .. gemv.triton.FEW_ROWS_MAX rows the few-rows GEMM
    (off by default; with FEW_ROWS_TUNED filled, only the tuned shapes, each through its tuned route:
    a Triton config or cuBLASLt); see gemv/naive.py. No backward: with gradients wanted, F.linear."""
    rows = x.shape[0] if x.dim() == 2 else 0
    if (0 < rows and gemv_enabled() and x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype
            and weight.stride(-1) == 1 and use_triton(x)
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        from .gemv import triton as impl

        if rows == 1:
            return impl.gemv(x, weight, bias, impl.config_for(weight))
        if rows <= impl.FEW_ROWS_MAX:
            config = impl.few_rows_config_for(weight, rows)
            if config is not None and config.get("BACKEND") == "cublaslt":
                return impl.linear_cublaslt(x, weight, bias)
            if config is not None:  # None: tuned shapes only, and this is not one of them
                return impl.gemm_few_rows(x, weight, bias, config)
    return torch.nn.functional.linear(x, weight, bias)


def silu_mul(gate, up):
    """silu(gate) * up, the gated MLP's activation. See norms/naive.py."""
    if gate.dim() == 2 and _fused(gate, up):
        from .norms import triton as impl

        return impl.silu_mul(gate, up)
    return norms_naive.silu_mul(gate, up)


# L2 warm-up of a weight on a side stream (l2_prefetch/naive.py says why). Off unless
# WORKBENCH_L2_PREFETCH=1 or use_l2_prefetch(True): a default only after a device run measured it
# (bench.e2e --prefetch-variants). WORKBENCH_L2_PREFETCH_MB sets how much of each weight is read.
_l2_prefetch = Switch("WORKBENCH_L2_PREFETCH", default=False)
set_l2_prefetch, l2_prefetch_enabled, use_l2_prefetch = _l2_prefetch.set, _l2_prefetch.enabled, _l2_prefetch.use


def _env_megabytes(name: str, default: float) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return int(default * (1 << 20))
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number of megabytes") from None
    if mb < 0:
        raise ValueError(f"{name}={raw!r}: must be >= 0")
    return int(mb * (1 << 20))


L2_PREFETCH_BYTES = _env_megabytes("WORKBENCH_L2_PREFETCH_MB", 32)
# smaller weights are left alone: their GEMM is launch-bound, not bandwidth-bound (a tiny model's
# 256 x 256 projection would only gain a launch and two stream waits)
L2_PREFETCH_MIN_BYTES = 4 << 20
_SIDE_STREAMS: dict = {}


def l2_prefetch_start(weight: torch.Tensor):
    """Start reading the first L2_PREFETCH_BYTES of ``weight`` after the work queued so far, on a
    side stream (one per device), so they sit in L2 when the GEMM that needs them runs. Returns the
    handle for ``l2_prefetch_join`` (None when nothing is pending). A no-op when off, under
    torch.compile, for a weight under L2_PREFETCH_MIN_BYTES or not one contiguous range; on a CPU
    with the Triton backend forced (tests) the read runs inline."""
    if not _l2_prefetch.on:  # (the default: every layer of every forward asks)
        return None
    size = weight.numel() * weight.element_size()
    if not (L2_PREFETCH_BYTES > 0 and size >= L2_PREFETCH_MIN_BYTES and size % 4 == 0 and weight.is_contiguous()
            and use_triton(weight)) or torch.compiler.is_compiling():
        return None
    from ._triton_common import scratch
    from .l2_prefetch import triton as impl

    out = scratch("l2_prefetch", impl.DEFAULT_CONFIG["PROGRAMS"], torch.int32, weight.device)
    if weight.device.type != "cuda":
        impl.l2_prefetch(weight, L2_PREFETCH_BYTES, out=out)
        return None
    main = torch.cuda.current_stream(weight.device)
    side = _SIDE_STREAMS.get(weight.device)
    if side is None:
        side = _SIDE_STREAMS[weight.device] = torch.cuda.Stream(weight.device)
    side.wait_stream(main)  # after the GEMM before it: read beside the latency-bound kernels, not against it
    with torch.cuda.stream(side):
        impl.l2_prefetch(weight, L2_PREFETCH_BYTES, out=out)
    return side


def l2_prefetch_join(handle) -> None:
    """The current stream waits for the read ``l2_prefetch_start`` began (a CUDA graph's side
    stream must rejoin before the capture ends)."""
    if handle is not None:
        torch.cuda.current_stream(handle.device).wait_stream(handle)
