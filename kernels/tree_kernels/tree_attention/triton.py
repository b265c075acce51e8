"""Tree attention in Triton: the tree nodes attend to the committed prefix plus their ancestors.

Same semantics as naive.py, one launch per layer:

- GQA packing: a program takes BLOCK_M rows of (node, query head) pairs of one KV head, row
  r = node * group + head-in-group, so every K/V tile is loaded once for all heads of the group.
- Split-K (flash-decoding) over the keys [kv_lo, P + T): program (m-block, kv head, split)
  runs an online softmax (fp32, exp2) over its key range and writes a partial (o, lse); the
  last program of an (m-block, kv head) to arrive (an atomic ticket) merges the partials and
  writes the output, then resets its ticket, so the counters are zero again for the next
  launch. With one split the program writes the output directly.
- Mask: prefix keys are visible to every node; tree key m is visible to node n iff
  anc[n, m] (bool matrix, or the per-row int64 bitmask: bit m % 64 of word m // 64). With a
  sliding window also query_position - key_position < window (prefix row j sits at j); the
  host skips prefix keys below prefix_len - window + 1, which assumes node positions are
  >= prefix_len (they are prefix_len + depth).
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from .._pdl import pdl_enter, pdl_options
from .._triton_common import as_last_contiguous, dot_precision, mask_as_uint8, launch_with_fallback, next_pow2, scratch, sm_count

__all__ = ["tree_attention", "default_config", "plan"]

_LOG2E = 1.4426950408889634


@triton.jit
def _tree_attn_kernel(
    Q, K, V, O, Anc, Pos, PartO, PartL, Counter, Prefix,
    T, P, S, kv_lo, tiles_per_split, n_splits, window, qk_scale, mpad,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, sa_n,
    GROUP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, HAS_WINDOW: tl.constexpr, BITMASK: tl.constexpr, PREC: tl.constexpr,
    DOT_F32: tl.constexpr, DEVICE_PREFIX: tl.constexpr, TICKET_MERGE: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    if DEVICE_PREFIX:
        # the fast path: the prefix length lives on the device and K/V are the whole cache
        # buffers; splits are planned over the buffer and those past P + T find nothing to do
        P = tl.load(Prefix).to(tl.int32)
        S = P + T
    pid_m = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    n_mblocks = tl.num_programs(0)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < T * GROUP
    node = rows // GROUP
    head = kvh * GROUP + rows % GROUP
    offd = tl.arange(0, BD)
    dmask = offd < D
    q = tl.load(Q + node[:, None] * sq_t + head[:, None] * sq_h + offd[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    if HAS_WINDOW:
        qpos = tl.load(Pos + node, mask=rmask, other=0).to(tl.int64)

    start = kv_lo + split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, S)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        cm = cols < end
        k = tl.load(K + cols[:, None] * sk_t + kvh * sk_h + offd[None, :], mask=cm[:, None] & dmask[None, :], other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
        # fp32 whatever type the scale arrives as (under torch.compile a Python float is fp64)
        s = (tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale).to(tl.float32)
        vis = cm[None, :] & rmask[:, None]
        if n0 + BLOCK_N > P:  # the tile reaches the tree block: ancestor mask
            tcol = cols - P
            intree = (tcol >= 0) & cm
            if BITMASK:
                word = tl.load(Anc + node[:, None] * sa_n + (tcol >> 6)[None, :], mask=rmask[:, None] & intree[None, :], other=0)
                bit = (word >> (tcol & 63)[None, :].to(tl.int64)) & 1
                anc = bit != 0
            else:
                anc = tl.load(Anc + node[:, None] * sa_n + tcol[None, :], mask=rmask[:, None] & intree[None, :], other=0) != 0
            vis = vis & ((tcol < 0)[None, :] | anc)
        if HAS_WINDOW:
            kpos = cols.to(tl.int64)
            if n0 + BLOCK_N > P:
                tcol = cols - P
                tpos = tl.load(Pos + tcol, mask=(tcol >= 0) & cm, other=0).to(tl.int64)
                kpos = tl.where(tcol >= 0, tpos, kpos)
            vis = vis & ((qpos[:, None] - kpos[None, :]) < window)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(V + cols[:, None] * sv_t + kvh * sv_h + offd[None, :], mask=cm[:, None] & dmask[None, :], other=0.0)
        if DOT_F32:
            v = v.to(tl.float32)
            p = p.to(V.dtype.element_ty).to(tl.float32)  # the rounding the half-type dot would see
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new

    if SPLIT:
        # partial for this split: normalised o and lse (log2 domain); -inf where nothing was visible
        has = l_i > 0.0
        o_part = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        prow = (split * tl.num_programs(1) + kvh) * mpad + rows
        # only the block's real rows: with one node (the AR step) 6 of 128 rows are real, and
        # the padding would be 21x the partials' traffic, written here and read by the merge
        tl.store(PartO + prow[:, None] * BD + offd[None, :], o_part, mask=rmask[:, None])
        tl.store(PartL + prow, lse, mask=rmask)
    if SPLIT and TICKET_MERGE:  # else _attn_merge_kernel, launched next, merges the partials
        tl.debug_barrier()  # every thread's partial is written before the ticket is taken
        cidx = kvh * n_mblocks + pid_m
        ticket = tl.atomic_add(Counter + cidx, 1, sem="acq_rel")
        if ticket == n_splits - 1:  # last to arrive: merge every split's partial
            mx = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            for sp in range(0, n_splits):
                r2 = (sp * tl.num_programs(1) + kvh) * mpad + rows
                mx = tl.maximum(mx, tl.load(PartL + r2, mask=rmask, other=float("-inf"), cache_modifier=".cg"))
            mx_use = tl.where(mx == float("-inf"), 0.0, mx)
            num = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
            den = tl.zeros([BLOCK_M], dtype=tl.float32)
            for sp in range(0, n_splits):
                r2 = (sp * tl.num_programs(1) + kvh) * mpad + rows
                wgt = tl.exp2(tl.load(PartL + r2, mask=rmask, other=float("-inf"), cache_modifier=".cg") - mx_use)
                num += wgt[:, None] * tl.load(PartO + r2[:, None] * BD + offd[None, :], mask=rmask[:, None], other=0.0,
                                              cache_modifier=".cg")
                den += wgt
            out = num / tl.where(den > 0.0, den, 1.0)[:, None]
            tl.store(O + node[:, None] * so_t + head[:, None] * so_h + offd[None, :], out.to(O.dtype.element_ty),
                     mask=rmask[:, None] & dmask[None, :])
            tl.atomic_xchg(Counter + cidx, 0)  # ready for the next launch
    if not SPLIT:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(O + node[:, None] * so_t + head[:, None] * so_h + offd[None, :], out.to(O.dtype.element_ty),
                 mask=rmask[:, None] & dmask[None, :])


@triton.jit
def _attn_merge_kernel(
    PartO, PartL, O, HQ, HKV, n_splits, mpad, so_t, so_h,
    GROUP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, NS: tl.constexpr, BDC: tl.constexpr, USE_GDC: tl.constexpr = False
):
    """The split partials of one (node, head) row and a chunk of its channels, merged: every
    split's lse and partial are loaded at once ([NS] and [NS, BDC] tiles), not one split after
    another as the ticket merge does, whose serial chain of loads sets the AR step's latency."""
    pdl_enter(USE_GDC)
    r = tl.program_id(0)
    node = r // HQ
    head = r % HQ
    kvh = head // GROUP
    row = node * GROUP + head % GROUP  # the row's index in its kv head's m-blocks
    sp = tl.arange(0, NS)
    sm = sp < n_splits
    prow = (sp * HKV + kvh) * mpad + row
    lse = tl.load(PartL + prow, mask=sm, other=float("-inf"))
    mx = tl.max(lse, axis=0)
    wgt = tl.exp2(lse - tl.where(mx == float("-inf"), 0.0, mx))  # 0 where a split saw nothing
    den = tl.sum(wgt, axis=0)
    offd = tl.program_id(1) * BDC + tl.arange(0, BDC)
    dm = offd < D
    part = tl.load(PartO + prow[:, None] * BD + offd[None, :], mask=sm[:, None] & dm[None, :], other=0.0)
    out = tl.sum(wgt[:, None] * part, axis=0) / tl.where(den > 0.0, den, 1.0)
    tl.store(O + node * so_t + head * so_h + offd, out.to(O.dtype.element_ty), mask=dm)


# The Triton 3.9 interpreter multiplies bf16 operands as their raw 16-bit patterns; under the
# interpreter bf16 tiles go through the dots as fp32 (the loads, casts and stores stay bf16).
_INTERPRETED = type(_tree_attn_kernel).__name__ == "InterpretedFunction"


def default_config(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype) -> dict:
    """Block sizes, the split-K target (about ``waves`` x SMs programs) and how splits merge.

    head_dim > 128: BLOCK_M = 128 (each K/V tile serves 128 (node, head) rows), 8 warps: the
    best of the sweep on an H200 at T = 64, prefix 4096, 24/4 heads, D = 256 (60.7 us vs 90.8 us
    for BLOCK_M = 64; data/results/kernels-nvidia-h200-2026-12-02.json).
    MERGE = "launch": the split partials are merged by their own launch, every split at once,
    instead of by the last split's program one split after another (a serial chain of loads).
    H200, 27B dims, prefix 4096, cold graph: T = 64 40.0 us against 61.5 us; one node 16.7 us
    (with 4 waves of splits) against 32.2 us (data/results/kernels-nvidia-h200-2026-12-03T17-merge.json).
    """
    if t * (hq // hkv) <= 16 and dtype != torch.float32:
        # the AR step (one node: ``group`` real rows) and two- or three-node trees: a 128-row block
        # would be 95 % padding in every QK^T and PV dot; 16 rows is the smallest dot. H200, 27B
        # dims, prefix 4096, one node: 32.0 us against 46.9 for the 128-row default with the
        # ticket merge (kernels-nvidia-h200-2026-12-03-decode.json); with the merge launch more
        # splits pay: 16.7 / 18.1 / 20.0 us at 4 / 2 / 1 waves
        return {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "waves": 4.0, "MERGE": "launch"}
    if d > 128 and dtype != torch.float32:
        # with the merge launch: 40.0 / 54.9 / 71.1 us at 1 / 2 / 4 waves (T = 64)
        return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "waves": 1.0, "MERGE": "launch"}
    return {
        "BLOCK_M": 64,
        "BLOCK_N": 64 if d <= 128 or dtype != torch.float32 else 32,
        "num_warps": 8 if d > 128 else 4,
        "num_stages": 2,
        "waves": 1.0,
        "MERGE": "launch",  # the same serial-merge latency as above; not measured at these shapes
    }


def plan(t, hq, hkv, d, s, kv_lo, device, cfg, num_splits=None):
    """(m-blocks, splits, tiles per split) for a launch."""
    group = hq // hkv
    n_mblocks = triton.cdiv(t * group, cfg["BLOCK_M"])
    n_tiles = max(1, triton.cdiv(s - kv_lo, cfg["BLOCK_N"]))
    if num_splits is None:
        want = max(1, round(cfg["waves"] * sm_count(device) / (hkv * n_mblocks)))
        num_splits = min(want, n_tiles)
    num_splits = max(1, min(int(num_splits), n_tiles))
    tiles_per_split = triton.cdiv(n_tiles, num_splits)
    num_splits = triton.cdiv(n_tiles, tiles_per_split)  # no empty splits
    return n_mblocks, num_splits, tiles_per_split


def tree_attention(q, k, v, anc, prefix_len, scale=None, positions=None, window=None, *,
                   bitmask: torch.Tensor | None = None, num_splits: int | None = None, config: dict | None = None):
    """``prefix_len`` an int (K/V hold exactly P + T rows), or a device scalar tensor (K/V are the
    whole cache buffers; rows past P + T are never read): the fast path, graph-capturable."""
    t, hq, d = q.shape
    s, hkv, _ = k.shape
    device_prefix = isinstance(prefix_len, torch.Tensor)
    if (not device_prefix and s != prefix_len + t) or v.shape[:2] != (s, hkv) or hq % hkv:
        raise ValueError(
            f"tree_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"prefix_len {prefix_len} do not fit"
        )
    if window is not None and positions is None:
        raise ValueError("a sliding window needs the node positions")
    scale = d**-0.5 if scale is None else float(scale)
    cfg = dict(default_config(t, hq, hkv, d, q.dtype), **(config or {}))
    q, k, v = as_last_contiguous(q), as_last_contiguous(k), as_last_contiguous(v)
    dev = q.device
    if bitmask is not None:
        words = triton.cdiv(t, 64)
        if bitmask.shape != (t, words) or bitmask.dtype != torch.int64:
            raise ValueError(f"bitmask {tuple(bitmask.shape)} {bitmask.dtype}: expected int64 [{t}, {words}]")
        amat = as_last_contiguous(bitmask)
    else:
        amat = as_last_contiguous(mask_as_uint8(anc))
    kv_lo = max(0, prefix_len - int(window) + 1) if window is not None and not device_prefix else 0
    prefix_arg = prefix_len.reshape(1) if device_prefix else q  # a dummy pointer when P is an int
    p_int = 0 if device_prefix else prefix_len
    bd = max(16, next_pow2(d))
    o = torch.empty(t, hq, d, dtype=q.dtype, device=dev)
    pos = positions if positions is not None else amat

    def launch(c):
        n_mblocks, n_splits, tps = plan(t, hq, hkv, d, s, kv_lo, dev, c, num_splits)
        mpad = n_mblocks * c["BLOCK_M"]
        split = n_splits > 1
        merge = c.get("MERGE", "ticket")
        if merge not in ("ticket", "launch"):
            raise ValueError(f"tree_attention: config MERGE must be 'ticket' or 'launch', got {merge!r}")
        ticket = merge == "ticket"
        if split:
            part_o = scratch("attn_part_o", n_splits * hkv * mpad * bd, torch.float32, dev)
            part_l = scratch("attn_part_l", n_splits * hkv * mpad, torch.float32, dev)
            counter = scratch("attn_counter", hkv * n_mblocks, torch.int32, dev, zero=True)
        else:
            part_o = part_l = o
            counter = scratch("attn_counter", 1, torch.int32, dev, zero=True)
        _tree_attn_kernel[(n_mblocks, hkv, n_splits)](
            q, k, v, o, amat, pos, part_o, part_l, counter, prefix_arg,
            t, p_int, s, kv_lo, tps, n_splits, int(window) if window is not None else 0, scale * _LOG2E, mpad,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1), amat.stride(0),
            GROUP=hq // hkv, D=d, BD=bd, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
            SPLIT=split, HAS_WINDOW=window is not None, BITMASK=bitmask is not None, PREC=dot_precision(q.dtype),
            DOT_F32=_INTERPRETED and q.dtype == torch.bfloat16, DEVICE_PREFIX=device_prefix, TICKET_MERGE=ticket,
            num_warps=c["num_warps"], num_stages=c["num_stages"], **pdl_options(q)
        )
        if split and not ticket:
            ns = next_pow2(n_splits)
            bdc = max(16, min(bd, 4096 // ns))  # an [NS, BDC] tile of partials per program
            _attn_merge_kernel[(t * hq, triton.cdiv(d, bdc))](
                part_o, part_l, o, hq, hkv, n_splits, mpad, o.stride(0), o.stride(1),
                GROUP=hq // hkv, D=d, BD=bd, NS=ns, BDC=bdc, num_warps=4, **pdl_options(part_o)
            )

    fallback = [dict(cfg, num_stages=1), dict(cfg, BLOCK_N=32, num_stages=1), dict(cfg, BLOCK_M=32, BLOCK_N=32, num_stages=1)]
    launch_with_fallback(launch, [cfg] + fallback, ("attention", d, str(q.dtype), str(dev)))
    return o
