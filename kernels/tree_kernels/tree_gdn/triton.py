"""Tree gated delta rule in Triton: ``fork`` (one launch per layer) and ``commit`` (one launch).

Same maths, shapes and stash as naive.py (tree-recurrence.md), per value head j:

    G = anc @ g                                    path-summed log decay
    L[n, m] = beta_n exp(G_n - G_m) k_n.k_m        m a strict ancestor of n, else 0
    (I + L) u = beta (v - exp(G) K S0)             the triangular solve
    o = exp(G) Q S0 + (anc . exp(G_n - G_m) . Q K^T) u

fork: one program per (value head, block of BV value columns). Phase 0 writes G for the head
into the stash. Phase 1 walks the nodes in blocks of BS rows (topological order, so block b
only depends on blocks <= b): for block b the off-diagonal blocks c < b are applied to the
right-hand side and the output with u_c read back from the stash, the BS x BS diagonal block
is inverted by forward substitution in registers, u_b = inv (rhs), and u_b is stored. Any
tree size works (the solve is blocked); T <= BS is a single block with no read-back.
Every program of a head recomputes G and the (I + L) blocks (they only depend on k, g, beta):
cheap next to the K S0 / Q S0 products, which are split across the value-column blocks.
Variant ``PRE_INVERSE`` (a second launch before the solve; the default for trees of more than one
block since its H200 measurement): G and the inverses of the diagonal blocks are computed by
nb x HV one-warp programs in parallel and read back, so the serial chain is dots and loads only.
With ``PRE_OFFDIAG`` (the default from 18 to 257 nodes) that launch also stores the blocks of the solve
that do not depend on u, L_bc = beta_b exp(G_b - G_c) k_b k_c^T and M_bc = exp(G_b - G_c) q_b k_c^T,
so each step of the chain is two dots (rhs -= L_bc u_c, o += M_bc u_c) instead of four.
Root peel (``ROOT_PEEL``): a draft tree's node 0 is an ancestor of every node, so its step is the
decode step on the program's [dk, BV] tile in registers, and the blocks start at node 1 from that
state with gates relative to the root. A tree of 16 k + 1 nodes (budget 16 k plus the root) is then
k blocks, not k + 1 with a last block of one node. Measured, it pays at 17 nodes (one block, not
two) and without stored off-diagonal blocks; with them the unpeeled solve is faster, so the
default peels only up to 17 nodes. The kernel reads whether the mask is rooted from the mask, so
forests take the unpeeled path.

Where the selection happens before the exponential (never exp(..) * mask, inf * 0 = NaN),
padded rows and columns load zeros and are masked out of every store.

decode: one committed token (the AR step), where fork + commit would read the state twice and
write a stash: one program per (value head, block of BV value columns) loads its dk x BV tile of
S once, and writes o and the next state (in place if asked):
    S' = exp(g) S + k u^T,  u = beta (v - exp(g) S^T k),  o = S'^T (scale q)

commit: one program per (value head, dk block, dv block):
    S_a = exp(G_a) S0 + sum_{m in path} exp(G_a - G_m) k_m u_m^T
with the path either a device index tensor (cached across layers) or the range 0..P-1.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .._pdl import pdl_enter, pdl_options
from ..norms.triton import gdn_gate_values
from .._triton_common import as_last_contiguous, dot_precision, mask_as_uint8, launch_with_fallback, next_pow2, path_operand
from .naive import TreeGDNStash, check_stash_out

__all__ = ["tree_gdn_fork", "tree_gdn_commit", "gdn_decode_step", "default_config", "blocked_config", "dense_config",
           "dense_fork"]


@triton.jit
def _unit_lower_inverse(L, BS: tl.constexpr):
    """(I + L)^-1 for a strictly lower-triangular [BS, BS] block, by forward substitution:
    row i of the inverse is e_i - sum_{m < i} L[i, m] X[m, :] (rows m < i already final)."""
    r = tl.arange(0, BS)
    X = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in tl.static_range(1, BS):
        li = tl.sum(tl.where(r[:, None] == i, L, 0.0), axis=0)  # L[i, :], indexed by column m
        contrib = tl.sum(li[:, None] * X, axis=0)  # sum_m L[i, m] X[m, :]
        X = tl.where(r[:, None] == i, X - contrib[None, :], X)
    return X


@triton.jit
def _block_path_sums(Gin, Anc, rows, rm, j, T, sg_t, sg_h, sa_n, BS: tl.constexpr, nblocks):
    """G[rows] = anc[rows, :] @ g[:, j] for the rows of one block (ancestors lie in blocks < nblocks)."""
    ar = tl.arange(0, BS)
    acc = tl.zeros([BS], dtype=tl.float32)
    for c in range(0, nblocks):
        cols = c * BS + ar
        cm = cols < T
        a = tl.load(Anc + rows[:, None] * sa_n + cols[None, :], mask=rm[:, None] & cm[None, :], other=0)
        gc = tl.load(Gin + cols * sg_t + j * sg_h, mask=cm, other=0.0).to(tl.float32)
        acc += tl.sum(tl.where(a != 0, gc[None, :], 0.0), axis=1)
    return acc


@triton.jit
def _block_pair_dots(Q, K, rows, rm, cols, cm, hk, sq_t, sq_h, sk_t, sk_h, scale, DK: tl.constexpr, BK: tl.constexpr,
                     BKC: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr, WITH_Q: tl.constexpr, SAME: tl.constexpr):
    """K_rows K_cols^T and (WITH_Q) scale Q_rows K_cols^T, [BS, BS] fp32, summed over dk in BKC-wide
    chunks (SAME: rows and cols are one block, loaded once). With BKC < BK no [BS, dk] tile is held
    whole (at one warp and tf32x3, whose dots keep hi / lo copies of both operands, [16, 128] tiles
    spill ~800 B a thread on sm_90)."""
    kk = tl.zeros([BS, BS], dtype=tl.float32)
    qk = tl.zeros([BS, BS], dtype=tl.float32)
    for ch in tl.static_range(BK // BKC):
        offk = ch * BKC + tl.arange(0, BKC)
        km = offk < DK
        kc = tl.load(K + cols[:, None] * sk_t + hk * sk_h + offk[None, :], mask=cm[:, None] & km[None, :], other=0.0).to(tl.float32)
        if SAME:  # a diagonal block: rows and cols are the same nodes, loaded once
            kr = kc
        else:
            kr = tl.load(K + rows[:, None] * sk_t + hk * sk_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32)
        kk += tl.dot(kr, tl.trans(kc), input_precision=PREC)
        if WITH_Q:
            qr = tl.load(Q + rows[:, None] * sq_t + hk * sq_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32) * scale
            qk += tl.dot(qr, tl.trans(kc), input_precision=PREC)
    return kk, qk


@triton.jit
def _path_sums(Gin, Anc, rows, rm, j, T, sg_t, sg_h, sa_n, BS: tl.constexpr, nblocks, TP: tl.constexpr):
    """_block_path_sums, or with TP > 0 (a power of two >= T) the same sum from one [BS, TP] load
    of the mask rows: one load latency instead of one per earlier block (latency, not bytes, is
    what the prepare pays). Non-ancestors are 0 in the mask, so summing every column is the same."""
    if TP > 0:
        cols = tl.arange(0, TP)
        cm = cols < T
        a = tl.load(Anc + rows[:, None] * sa_n + cols[None, :], mask=rm[:, None] & cm[None, :], other=0)
        gc = tl.load(Gin + cols * sg_t + j * sg_h, mask=cm, other=0.0).to(tl.float32)
        return tl.sum(tl.where(a != 0, gc[None, :], 0.0), axis=1)
    else:
        return _block_path_sums(Gin, Anc, rows, rm, j, T, sg_t, sg_h, sa_n, BS, nblocks)


@triton.jit
def _root_offset_of(Anc, T, sa_n, BS: tl.constexpr, TP: tl.constexpr):
    """_root_offset, or with TP > 0 from one load of the mask's first column."""
    if TP > 0:
        rows = tl.arange(0, TP)
        a = tl.load(Anc + rows * sa_n, mask=rows < T, other=1)
        return tl.min((a != 0).to(tl.int32), axis=0)
    else:
        return _root_offset(Anc, T, sa_n, BS)


@triton.jit
def _decode_tile(s, q, k, v, a, beta):
    """One token's step on a [dk, BV] tile of the state (fp32), in registers: returns (u, S', o),
    S' = a S + k u^T,  u = beta (v - a S^T k),  o = S'^T q (q already scaled). The decode step and
    the fork's peeled root both take it."""
    s = s * a
    u = beta * (v - tl.sum(s * k[:, None], axis=0))
    s = s + k[:, None] * u[None, :]
    return u, s, tl.sum(s * q[:, None], axis=0)


@triton.jit
def _root_offset(Anc, T, sa_n, BS: tl.constexpr):
    """1 when node 0 is an ancestor of every node (every draft tree: its root is the last committed
    token), else 0. Read from the mask itself, so a forest or any other ancestor mask stays exact."""
    ar = tl.arange(0, BS)
    m = 1
    for c in range(0, tl.cdiv(T, BS)):
        rows = c * BS + ar
        a = tl.load(Anc + rows * sa_n, mask=rows < T, other=1)
        m = tl.minimum(m, tl.min((a != 0).to(tl.int32), axis=0))
    return m


@triton.jit
def _prepare_pairs(Q, K, Gin, Beta, Anc, SG, Inv, OffL, OffM, T, HV, nb, scale, b, c, j, hk,
                   sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, sa_n, DK: tl.constexpr, BK: tl.constexpr, BS: tl.constexpr,
                   PREC: tl.constexpr, PEEL: tl.constexpr, OFF: tl.constexpr, DOUBLING: tl.constexpr, LOG2BS: tl.constexpr,
                   TP: tl.constexpr, BKC: tl.constexpr):
    """The prepare's block-pair programs (_gdn_prepare_kernel): program (b, c) of value head j."""
    ar = tl.arange(0, BS)
    r0 = 0
    if PEEL:
        r0 = _root_offset_of(Anc, T, sa_n, BS, TP)
    rows = r0 + b * BS + ar
    rm = rows < T
    Gb = _path_sums(Gin, Anc, rows, rm, j, T, sg_t, sg_h, sa_n, BS, b + 1 + r0, TP)
    bb = tl.load(Beta + rows * sb_t + j * sb_h, mask=rm, other=0.0).to(tl.float32)
    tile = ar[:, None] * BS + ar[None, :]
    if c == b:
        if PEEL:  # the root's own path sum (its only ancestor is itself)
            tl.store(SG + ar * HV + j, tl.load(Gin + ar * sg_t + j * sg_h, mask=ar == 0, other=0.0).to(tl.float32),
                     mask=(ar == 0) & ((ar * 0 + r0) == 1) & ((ar * 0 + b) == 0))
        tl.store(SG + rows * HV + j, Gb, mask=rm)
        a = tl.load(Anc + rows[:, None] * sa_n + rows[None, :], mask=rm[:, None] & rm[None, :], other=0) != 0
        dec = tl.exp(tl.where(a, Gb[:, None] - Gb[None, :], float("-inf")))
        strict = a & (ar[:, None] != ar[None, :])
        kk, qk = _block_pair_dots(Q, K, rows, rm, rows, rm, hk, sq_t, sq_h, sk_t, sk_h, scale, DK, BK, BKC, BS, PREC, OFF, True)
        Lbb = tl.where(strict, bb[:, None] * dec * kk, 0.0)
        if DOUBLING:  # dots only: no per-row reductions, so a 32-row block costs log2(32) levels, not 31 steps
            inv = _unit_lower_inverse_doubling(Lbb, BS, LOG2BS, PREC)
        else:
            inv = _unit_lower_inverse(Lbb, BS)
        tl.store(Inv + ((b * HV + j) * BS + ar[:, None]) * BS + ar[None, :], inv)
        if OFF:
            tl.store(OffM + ((b * nb + b) * HV + j) * BS * BS + tile, dec * qk)
    if c < b:
        # the blocks of the solve that do not depend on u, so its serial chain is two dots a step:
        # L_bc = beta_b exp(G_b - G_c) k_b k_c^T and M_bc = exp(G_b - G_c) scale q_b k_c^T
        cols = r0 + c * BS + ar
        cm = cols < T
        Gc = _path_sums(Gin, Anc, cols, cm, j, T, sg_t, sg_h, sa_n, BS, c + 1 + r0, TP)
        kk, qk = _block_pair_dots(Q, K, rows, rm, cols, cm, hk, sq_t, sq_h, sk_t, sk_h, scale, DK, BK, BKC, BS, PREC, True, False)
        ac = tl.load(Anc + rows[:, None] * sa_n + cols[None, :], mask=rm[:, None] & cm[None, :], other=0) != 0
        dc = tl.exp(tl.where(ac, Gb[:, None] - Gc[None, :], float("-inf")))  # select before exp
        base = ((b * nb + c) * HV + j) * BS * BS + tile
        tl.store(OffL + base, bb[:, None] * dc * kk)
        tl.store(OffM + base, dc * qk)


@triton.jit
def _gdn_prepare_kernel(
    Q, K, Gin, Beta, Anc, V, S0,  # inputs (V, S0: read with S0P only)
    SG, Inv, OffL, OffM,  # outputs: G [T, HV] (the stash's), (I + L_bb)^-1 per diagonal block
    # [nb, HV, BS, BS]; with OFF the solve's u-independent blocks L_bc (c < b) and M_bc (c <= b),
    # [nb, nb, HV, BS, BS]
    SK, SU, O,  # outputs with S0P: the stash's k, and the solve's right-hand side and output before
    # any u term (into the u stash and the output, which the solve then reads and overwrites)
    T, R, HV, nb, npair, scale,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h, sa_n,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr, PEEL: tl.constexpr,
    OFF: tl.constexpr, DOUBLING: tl.constexpr, LOG2BS: tl.constexpr, TP: tl.constexpr, BKC: tl.constexpr,
    S0P: tl.constexpr, BVP: tl.constexpr, S0_BKC: tl.constexpr, USE_GDC: tl.constexpr = False
):
    """Everything of the solve that depends only on k, g and beta, off the serial u recursion:
    program (b, c, value head). c == b: the block's path-summed gates, the inverse of its
    diagonal block (one warp by default, so the forward substitution's row reductions stay inside
    a warp) and, with OFF, M_bb; c < b (OFF only): the off-diagonal pair L_bc, M_bc, each pair its
    own program so the longest program is one pair, not a row of them. With a peeled root the
    blocks start at node 1, as in the solve. With S0P (unpeeled only) programs c >= npair take the
    block's products with the committed state, value columns (c - npair) * BVP onwards:
    rhs_b = beta_b (v_b - exp(G_b) K_b S0) and o_b = exp(G_b) scale Q_b S0, the solve's two
    [BS, dk] x [dk, BV] products per block, which do not depend on u either."""
    pdl_enter(USE_GDC)
    b = tl.program_id(0)
    j = tl.program_id(2)
    c = b
    if OFF:
        c = tl.program_id(1)  # programs with c > b (the upper triangle) store nothing
    hk = j // R
    ar = tl.arange(0, BS)
    if S0P:
        iv = tl.program_id(1) - npair
        if iv >= 0:
            rows = b * BS + ar
            rm = rows < T
            offv = iv * BVP + tl.arange(0, BVP)
            vm = offv < DV
            Gb = _path_sums(Gin, Anc, rows, rm, j, T, sg_t, sg_h, sa_n, BS, b + 1, TP)
            bb = tl.load(Beta + rows * sb_t + j * sb_h, mask=rm, other=0.0).to(tl.float32)
            ks = tl.zeros([BS, BVP], dtype=tl.float32)
            qs = tl.zeros([BS, BVP], dtype=tl.float32)
            for ch in tl.static_range(BK // S0_BKC):  # dk in chunks: one warp holds no [BS, dk] tile
                offk = ch * S0_BKC + tl.arange(0, S0_BKC)
                km = offk < DK
                kc = tl.load(K + rows[:, None] * sk_t + hk * sk_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32)
                qc = tl.load(Q + rows[:, None] * sq_t + hk * sq_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32) * scale
                sc = tl.load(S0 + j * DK * DV + offk[:, None] * DV + offv[None, :], mask=km[:, None] & vm[None, :], other=0.0)
                ks += tl.dot(kc, sc, input_precision=PREC)
                qs += tl.dot(qc, sc, input_precision=PREC)
                if iv == 0:  # the stash's k rows, once per head
                    tl.store(SK + rows[:, None] * (HV * DK) + j * DK + offk[None, :], kc, mask=rm[:, None] & km[None, :])
            vb = tl.load(V + rows[:, None] * sv_t + j * sv_h + offv[None, :], mask=rm[:, None] & vm[None, :], other=0.0).to(tl.float32)
            eGb = tl.exp(Gb)
            out = rows[:, None] * (HV * DV) + j * DV + offv[None, :]
            tl.store(SU + out, bb[:, None] * (vb - eGb[:, None] * ks), mask=rm[:, None] & vm[None, :])
            tl.store(O + out, eGb[:, None] * qs, mask=rm[:, None] & vm[None, :])
    if tl.program_id(1) < npair:  # (every program without S0P)
        _prepare_pairs(Q, K, Gin, Beta, Anc, SG, Inv, OffL, OffM, T, HV, nb, scale, b, c, j, hk,
                       sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, sa_n, DK, BK, BS, PREC, PEEL, OFF, DOUBLING, LOG2BS, TP, BKC)


@triton.jit
def _gdn_fork_kernel(
    Q, K, V, Gin, Beta, S0, Anc, Inv, OffL, OffM,  # inputs (Inv: the diagonal inverses when PRE;
    # OffL, OffM: the u-independent blocks when OFF)
    O, SK, SU, SG,  # outputs: o [T, HV, DV], stash k [T, HV, DK], u [T, HV, DV], G [T, HV] (an input when PRE)
    T, R, HV, scale, nbp,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h, sa_n,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    PREC: tl.constexpr, PRE: tl.constexpr, PEEL: tl.constexpr, OFF: tl.constexpr, TP: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    j = tl.program_id(0)  # value head
    iv = tl.program_id(1)  # block of value columns
    hk = j // R  # the key head this value head reads
    ar = tl.arange(0, BS)
    offk = tl.arange(0, BK)
    kmask = offk < DK
    offv = iv * BV + tl.arange(0, BV)
    vmask = offv < DV
    nb = tl.cdiv(T, BS)

    # ---- phase 0: G = anc @ g (ancestors of a block-b node lie in blocks <= b); PRE: done by
    # _gdn_prepare_kernel, as are the diagonal inverses
    if not PRE:
        for b in range(0, nb):
            rows = b * BS + ar
            rm = rows < T
            tl.store(SG + rows * HV + j, _block_path_sums(Gin, Anc, rows, rm, j, T, sg_t, sg_h, sa_n, BS, b + 1), mask=rm)
        tl.debug_barrier()

    # the committed state's slice this program needs, [BK, BV]
    s0 = tl.load(S0 + j * DK * DV + offk[:, None] * DV + offv[None, :], mask=kmask[:, None] & vmask[None, :], other=0.0)

    # ---- the root, peeled: when node 0 is an ancestor of every node (any draft tree) its step is
    # the decode step on this program's full-dk tile, in registers; the blocks then start at node 1
    # from the root's state, with the gates taken relative to the root (exp(G_n - G_0)). A tree of
    # 16 k + 1 nodes is then k blocks, not k + 1 (the last one holding a single node).
    r0 = 0
    g_base = 0.0
    if PEEL:
        r0 = _root_offset_of(Anc, T, sa_n, BS, TP)
        k0 = tl.load(K + hk * sk_h + offk, mask=kmask, other=0.0).to(tl.float32)
        q0 = tl.load(Q + hk * sq_h + offk, mask=kmask, other=0.0).to(tl.float32) * scale
        v0 = tl.load(V + j * sv_h + offv, mask=vmask, other=0.0).to(tl.float32)
        b0 = tl.load(Beta + j * sb_h).to(tl.float32)
        G0 = tl.load(SG + j)  # the root's path sum: its own gate
        u0, s1, o0 = _decode_tile(s0, q0, k0, v0, tl.exp(G0), b0)
        # masks broadcast from the offsets (a scalar condition in a mask trips the interpreter)
        peeled_v = vmask & ((offv * 0 + r0) == 1)
        tl.store(SU + j * DV + offv, u0, mask=peeled_v)
        tl.store(O + j * DV + offv, o0, mask=peeled_v)
        tl.store(SK + j * DK + offk, k0, mask=kmask & ((offk * 0 + r0) == 1) & ((offk * 0 + iv) == 0))
        s0 = tl.where((offk[:, None] * 0 + offv[None, :] * 0 + r0) == 1, s1, s0)
        g_base = G0 * r0
        nb = tl.cdiv(T - r0, BS)

    # ---- phase 1: blocked forward substitution over the nodes
    for b in range(0, nb):
        rows = r0 + b * BS + ar
        rm = rows < T
        kb = tl.load(K + rows[:, None] * sk_t + hk * sk_h + offk[None, :], mask=rm[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        qb = tl.load(Q + rows[:, None] * sq_t + hk * sq_h + offk[None, :], mask=rm[:, None] & kmask[None, :], other=0.0).to(tl.float32) * scale
        vb = tl.load(V + rows[:, None] * sv_t + j * sv_h + offv[None, :], mask=rm[:, None] & vmask[None, :], other=0.0).to(tl.float32)
        bb = tl.load(Beta + rows * sb_t + j * sb_h, mask=rm, other=0.0).to(tl.float32)
        Gb = tl.load(SG + rows * HV + j, mask=rm, other=0.0)
        eGb = tl.exp(Gb - g_base)
        rhs = bb[:, None] * (vb - eGb[:, None] * tl.dot(kb, s0, input_precision=PREC))
        ob = eGb[:, None] * tl.dot(qb, s0, input_precision=PREC)
        tile = ar[:, None] * BS + ar[None, :]
        for c in range(0, b):
            cols = r0 + c * BS + ar
            cm = cols < T
            if OFF:
                uc = tl.load(SU + cols[:, None] * (HV * DV) + j * DV + offv[None, :], mask=cm[:, None] & vmask[None, :], other=0.0)
                base = ((b * nbp + c) * HV + j) * BS * BS + tile
                rhs -= tl.dot(tl.load(OffL + base), uc, input_precision=PREC)
                ob += tl.dot(tl.load(OffM + base), uc, input_precision=PREC)
            else:
                kc = tl.load(K + cols[:, None] * sk_t + hk * sk_h + offk[None, :], mask=cm[:, None] & kmask[None, :], other=0.0).to(tl.float32)
                uc = tl.load(SU + cols[:, None] * (HV * DV) + j * DV + offv[None, :], mask=cm[:, None] & vmask[None, :], other=0.0)
                Gc = tl.load(SG + cols * HV + j, mask=cm, other=0.0)
                a = tl.load(Anc + rows[:, None] * sa_n + cols[None, :], mask=rm[:, None] & cm[None, :], other=0) != 0
                dec = tl.exp(tl.where(a, Gb[:, None] - Gc[None, :], float("-inf")))  # select before exp
                kct = tl.trans(kc)
                Lbc = bb[:, None] * dec * tl.dot(kb, kct, input_precision=PREC)
                rhs -= tl.dot(Lbc, uc, input_precision=PREC)
                ob += tl.dot(dec * tl.dot(qb, kct, input_precision=PREC), uc, input_precision=PREC)
        # diagonal block: anc includes self (decay 1 on the diagonal for o); L is strict
        if OFF:
            inv = tl.load(Inv + ((b * HV + j) * BS + ar[:, None]) * BS + ar[None, :])
            ub = tl.dot(inv, rhs, input_precision=PREC)
            ob += tl.dot(tl.load(OffM + ((b * nbp + b) * HV + j) * BS * BS + tile), ub, input_precision=PREC)
        else:
            a = tl.load(Anc + rows[:, None] * sa_n + rows[None, :], mask=rm[:, None] & rm[None, :], other=0) != 0
            dec = tl.exp(tl.where(a, Gb[:, None] - Gb[None, :], float("-inf")))
            kbt = tl.trans(kb)
            if PRE:
                inv = tl.load(Inv + ((b * HV + j) * BS + ar[:, None]) * BS + ar[None, :])
            else:
                strict = a & (ar[:, None] != ar[None, :])
                Lbb = tl.where(strict, bb[:, None] * dec * tl.dot(kb, kbt, input_precision=PREC), 0.0)
                inv = _unit_lower_inverse(Lbb, BS)
            ub = tl.dot(inv, rhs, input_precision=PREC)
            ob += tl.dot(dec * tl.dot(qb, kbt, input_precision=PREC), ub, input_precision=PREC)
        tl.store(SU + rows[:, None] * (HV * DV) + j * DV + offv[None, :], ub, mask=rm[:, None] & vmask[None, :])
        tl.store(O + rows[:, None] * (HV * DV) + j * DV + offv[None, :], ob, mask=rm[:, None] & vmask[None, :])
        if iv == 0:
            tl.store(SK + rows[:, None] * (HV * DK) + j * DK + offk[None, :], kb, mask=rm[:, None] & kmask[None, :])
        tl.debug_barrier()  # u_b is read back by later blocks (other threads of this program)


@triton.jit
def _gdn_chain_kernel(
    SU, O, Inv, OffL, OffM,  # SU, O: rhs_b and o_b before the u terms (from the prepare), overwritten
    # with u_b and the output; Inv, OffL, OffM: the prepare's diagonal inverses and off-diagonal blocks
    T, HV, nbp,
    DV: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr, TW: tl.constexpr,
    USE_GDC: tl.constexpr = False
):
    """The blocked solve's serial chain when the prepare took everything that does not depend on u
    (PRE_S0): one program per (value head, BV value columns), block after block,
        u_b = Inv_b (rhs_b - sum_{c<b} L_bc u_c),   o_b += sum_{c<b} M_bc u_c + M_bb u_b.
    Each block's u-independent inputs (rhs_b, o_b, Inv_b, M_bb) are loaded one block ahead, so the
    dependent path of a step is the read-back of the earlier u's and four small dots. TW > 0: the
    earlier blocks' terms as one [BS, TW] x [TW, BV] dot over every earlier node (TW >= the nodes
    before the last block), one load of u's, not one per earlier block."""
    pdl_enter(USE_GDC)
    j = tl.program_id(0)  # value head
    iv = tl.program_id(1)  # block of value columns
    ar = tl.arange(0, BS)
    offv = iv * BV + tl.arange(0, BV)
    vmask = offv < DV
    nb = tl.cdiv(T, BS)
    tile = ar[:, None] * BS + ar[None, :]
    bo = ar[:, None] * (HV * DV) + j * DV + offv[None, :]
    m2 = (ar < T)[:, None] & vmask[None, :]
    rhs_n = tl.load(SU + bo, mask=m2, other=0.0)
    ob_n = tl.load(O + bo, mask=m2, other=0.0)
    inv_n = tl.load(Inv + (j * BS + ar[:, None]) * BS + ar[None, :])
    mbb_n = tl.load(OffM + j * BS * BS + tile)
    if TW > 0:
        cw = tl.arange(0, TW)
        cw_blk = cw // BS
        cw_in = cw % BS
    for b in range(0, nb):
        rhs, ob, inv, mbb = rhs_n, ob_n, inv_n, mbb_n
        rows = b * BS + ar
        rm = rows < T
        out = rows[:, None] * (HV * DV) + j * DV + offv[None, :]
        # the next block's u-independent inputs, in flight while this block waits on its u's
        bn = tl.minimum(b + 1, nb - 1)
        nrm = (rows + BS) < T
        rhs_n = tl.load(SU + out + BS * HV * DV, mask=nrm[:, None] & vmask[None, :], other=0.0)
        ob_n = tl.load(O + out + BS * HV * DV, mask=nrm[:, None] & vmask[None, :], other=0.0)
        inv_n = tl.load(Inv + ((bn * HV + j) * BS + ar[:, None]) * BS + ar[None, :])
        mbb_n = tl.load(OffM + ((bn * nbp + bn) * HV + j) * BS * BS + tile)
        if TW > 0:
            before = cw < b * BS
            uw = tl.load(SU + cw[:, None] * (HV * DV) + j * DV + offv[None, :], mask=before[:, None] & vmask[None, :], other=0.0)
            blk = ((b * nbp + cw_blk) * HV + j) * BS * BS + cw_in
            lw = tl.load(OffL + blk[None, :] + ar[:, None] * BS, mask=before[None, :], other=0.0)
            mw = tl.load(OffM + blk[None, :] + ar[:, None] * BS, mask=before[None, :], other=0.0)
            rhs -= tl.dot(lw, uw, input_precision=PREC)
            ob += tl.dot(mw, uw, input_precision=PREC)
        else:
            for c in range(0, b):
                cols = c * BS + ar
                uc = tl.load(SU + cols[:, None] * (HV * DV) + j * DV + offv[None, :], mask=(cols < T)[:, None] & vmask[None, :], other=0.0)
                base = ((b * nbp + c) * HV + j) * BS * BS + tile
                rhs -= tl.dot(tl.load(OffL + base), uc, input_precision=PREC)
                ob += tl.dot(tl.load(OffM + base), uc, input_precision=PREC)
        ub = tl.dot(inv, rhs, input_precision=PREC)
        ob += tl.dot(mbb, ub, input_precision=PREC)
        tl.store(SU + out, ub, mask=rm[:, None] & vmask[None, :])
        tl.store(O + out, ob, mask=rm[:, None] & vmask[None, :])
        tl.debug_barrier()  # u_b is read back by later blocks (other threads of this program)


@triton.jit
def _unit_lower_inverse_doubling(L, N: tl.constexpr, LOG2N: tl.constexpr, PREC: tl.constexpr):
    """(I + L)^-1 for a strictly lower-triangular [N, N] L by recursive doubling: with X the
    inverse's block diagonal in s x s blocks, the inverse in 2s x 2s blocks is X - X C X, C being
    L's lower-left s x s quarter of every 2s block ([[A, 0], [C, B]]^-1 has -B^-1 C A^-1 there).
    log2(N) levels of two dots and no per-row reductions. Forward substitution's accuracy (fp32,
    16 correlated keys: 1.2e-7 relative against float64, where the Neumann product
    (I - L)(I + L^2)(I + L^4)... loses 7e-5 to cancellation)."""
    r = tl.arange(0, N)
    X = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for lvl in tl.static_range(LOG2N):
        s = 1 << lvl
        same = (r[:, None] // (2 * s)) == (r[None, :] // (2 * s))
        quarter = ((r[:, None] // s) % 2 == 1) & ((r[None, :] // s) % 2 == 0)
        C = tl.where(same & quarter, L, 0.0)
        X = X - tl.dot(tl.dot(X, C, input_precision=PREC), X, input_precision=PREC)
    return X


@triton.jit
def _gdn_dense_prepare_kernel(
    Q, K, Gin, Beta, Anc,  # inputs
    SK, SG, Inv, P,  # outputs: the stash's k and G, (I + L)^-1 and P = M (I + L)^-1 [HV, BN, BN]
    T, R, HV, scale,
    sq_t, sq_h, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h, sa_n,
    DK: tl.constexpr, BK: tl.constexpr, BKC: tl.constexpr, BN: tl.constexpr, LOG2BN: tl.constexpr,
    PREC: tl.constexpr, USE_GDC: tl.constexpr = False
):
    """Program j (value head): everything of the solve that depends only on k, g and beta, for the
    whole tree as one block of at most BN nodes after the peeled root. L and M from K K^T and
    Q K^T summed over dk in BKC-wide chunks (no [BN, dk] tile is ever held), (I + L)^-1 by
    recursive doubling, P = M (I + L)^-1; so the apply launch is dots with no chain at all."""
    pdl_enter(USE_GDC)
    j = tl.program_id(0)
    hk = j // R
    ar = tl.arange(0, BN)
    r0 = _root_offset(Anc, T, sa_n, BN)
    g0 = tl.load(Gin + j * sg_h).to(tl.float32)
    rows = r0 + ar
    rm = rows < T
    a = tl.load(Anc + rows[:, None] * sa_n + rows[None, :], mask=rm[:, None] & rm[None, :], other=0) != 0
    gr = tl.load(Gin + rows * sg_t + j * sg_h, mask=rm, other=0.0).to(tl.float32)
    G = tl.sum(tl.where(a, gr[None, :], 0.0), axis=1) + g0 * r0  # path sums, the root's gate added when peeled
    tl.store(SG + rows * HV + j, G, mask=rm)
    tl.store(SG + j + ar * 0, g0 + ar * 0.0, mask=(ar == 0) & ((ar * 0 + r0) == 1))
    # L first and inverted, M after: K K^T and Q K^T are never live together (a [64, 64] fp32
    # tile is 16 registers a thread at 8 warps; tf32x3 dots hold hi / lo copies of both operands)
    kk = tl.zeros([BN, BN], dtype=tl.float32)
    for c in tl.static_range(BK // BKC):
        offk = c * BKC + tl.arange(0, BKC)
        km = offk < DK
        kc = tl.load(K + rows[:, None] * sk_t + hk * sk_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32)
        kk += tl.dot(kc, tl.trans(kc), input_precision=PREC)
        tl.store(SK + rows[:, None] * (HV * DK) + j * DK + offk[None, :], kc, mask=rm[:, None] & km[None, :])
        k0 = tl.load(K + hk * sk_h + offk, mask=km, other=0.0).to(tl.float32)
        tl.store(SK + j * DK + offk, k0, mask=km & ((offk * 0 + r0) == 1))
    bb = tl.load(Beta + rows * sb_t + j * sb_h, mask=rm, other=0.0).to(tl.float32)
    strict = a & (ar[:, None] != ar[None, :])
    lm = tl.where(strict, bb[:, None] * tl.exp(tl.where(strict, G[:, None] - G[None, :], float("-inf"))) * kk, 0.0)
    inv = _unit_lower_inverse_doubling(lm, BN, LOG2BN, PREC)
    qk = tl.zeros([BN, BN], dtype=tl.float32)
    for c in tl.static_range(BK // BKC):
        offk = c * BKC + tl.arange(0, BKC)
        km = offk < DK
        kc = tl.load(K + rows[:, None] * sk_t + hk * sk_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32)
        qc = tl.load(Q + rows[:, None] * sq_t + hk * sq_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32) * scale
        qk += tl.dot(qc, tl.trans(kc), input_precision=PREC)
    # the mask read again rather than held live across the inverse (registers, not memory, bound here)
    a = tl.load(Anc + rows[:, None] * sa_n + rows[None, :], mask=rm[:, None] & rm[None, :], other=0) != 0
    dec = tl.exp(tl.where(a, G[:, None] - G[None, :], float("-inf")))  # select before exp
    pm = tl.dot(dec * qk, inv, input_precision=PREC)  # M: anc-or-self, decay 1 on the diagonal
    tile = j * BN * BN + ar[:, None] * BN + ar[None, :]
    tl.store(Inv + tile, inv)
    tl.store(P + tile, pm)


@triton.jit
def _gdn_dense_apply_kernel(
    Q, K, V, Beta, S0, Anc, SG, Inv, P,  # inputs (SG, Inv, P from the prepare launch)
    O, SU,  # outputs: o and the stash's u
    T, R, HV, scale,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sb_t, sb_h, sa_n,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr,
    BN: tl.constexpr, PREC: tl.constexpr, USE_GDC: tl.constexpr = False
):
    """Program (value head, block of BV value columns): the root's decode step, then every other
    node at once: rhs = beta (v - exp(G) K S1), u = (I + L)^-1 rhs, o = exp(G) Q S1 + P rhs, with S1
    the state after the root (S0 when nothing is peeled). The state is read in [BKC, BV] chunks,
    twice (the root's u needs all of dk before S1 exists). A tree that does not fit (T - peeled >
    BN) gets NaN outputs, loudly."""
    pdl_enter(USE_GDC)
    j = tl.program_id(0)
    iv = tl.program_id(1)
    hk = j // R
    ar = tl.arange(0, BN)
    offv = iv * BV + tl.arange(0, BV)
    vmask = offv < DV
    r0 = _root_offset(Anc, T, sa_n, BN)
    fits = (T - r0) <= BN
    peel = r0 == 1

    # the root, peeled: u0 = beta0 (v0 - e0 S0^T k0), o0 = S1^T q0 = e0 S0^T q0 + (q0 . k0) u0
    ks0 = tl.zeros([BV], dtype=tl.float32)
    qs0 = tl.zeros([BV], dtype=tl.float32)
    qk0 = 0.0
    for c in tl.static_range(BK // BKC):
        offk = c * BKC + tl.arange(0, BKC)
        km = offk < DK
        s0c = tl.load(S0 + j * DK * DV + offk[:, None] * DV + offv[None, :], mask=km[:, None] & vmask[None, :], other=0.0)
        k0 = tl.load(K + hk * sk_h + offk, mask=km, other=0.0).to(tl.float32)
        q0 = tl.load(Q + hk * sq_h + offk, mask=km, other=0.0).to(tl.float32) * scale
        ks0 += tl.sum(k0[:, None] * s0c, axis=0)
        qs0 += tl.sum(q0[:, None] * s0c, axis=0)
        qk0 += tl.sum(q0 * k0, axis=0)
    e0 = tl.exp(tl.load(SG + j))  # the root's G is its own gate
    u0 = tl.load(Beta + j * sb_h).to(tl.float32) * (tl.load(V + j * sv_h + offv, mask=vmask, other=0.0).to(tl.float32) - e0 * ks0)
    peeled_v = vmask & ((offv * 0 + r0) == 1)  # a vector mask (a scalar & vector mask is not one)
    tl.store(SU + j * DV + offv, u0, mask=peeled_v)
    tl.store(O + j * DV + offv, e0 * qs0 + qk0 * u0, mask=peeled_v)

    # every remaining node at once: K S1 and Q S1 over dk chunks, S1 = e0 S0 + k0 u0^T when peeled
    rows = r0 + ar
    rm = rows < T
    ks = tl.zeros([BN, BV], dtype=tl.float32)
    qs = tl.zeros([BN, BV], dtype=tl.float32)
    for c in tl.static_range(BK // BKC):
        offk = c * BKC + tl.arange(0, BKC)
        km = offk < DK
        s0c = tl.load(S0 + j * DK * DV + offk[:, None] * DV + offv[None, :], mask=km[:, None] & vmask[None, :], other=0.0)
        k0 = tl.load(K + hk * sk_h + offk, mask=km, other=0.0).to(tl.float32)
        s1c = tl.where(peel, e0 * s0c + k0[:, None] * u0[None, :], s0c)
        kc = tl.load(K + rows[:, None] * sk_t + hk * sk_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32)
        qc = tl.load(Q + rows[:, None] * sq_t + hk * sq_h + offk[None, :], mask=rm[:, None] & km[None, :], other=0.0).to(tl.float32) * scale
        ks += tl.dot(kc, s1c, input_precision=PREC)
        qs += tl.dot(qc, s1c, input_precision=PREC)
    g_base = tl.where(peel, tl.load(SG + j), 0.0)
    eG = tl.exp(tl.load(SG + rows * HV + j, mask=rm, other=0.0) - g_base)
    vb = tl.load(V + rows[:, None] * sv_t + j * sv_h + offv[None, :], mask=rm[:, None] & vmask[None, :], other=0.0).to(tl.float32)
    bb = tl.load(Beta + rows * sb_t + j * sb_h, mask=rm, other=0.0).to(tl.float32)
    rhs = bb[:, None] * (vb - eG[:, None] * ks)
    tile = j * BN * BN + ar[:, None] * BN + ar[None, :]
    ub = tl.dot(tl.load(Inv + tile), rhs, input_precision=PREC)
    ob = eG[:, None] * qs + tl.dot(tl.load(P + tile), rhs, input_precision=PREC)
    ob = tl.where(fits, ob, float("nan"))
    out_mask = rm[:, None] & vmask[None, :]
    tl.store(SU + rows[:, None] * (HV * DV) + j * DV + offv[None, :], ub, mask=out_mask)
    tl.store(O + rows[:, None] * (HV * DV) + j * DV + offv[None, :], ob, mask=out_mask)


@triton.jit(do_not_specialize=["plen"])
def _gdn_commit_kernel(
    S0, SK, SU, SG, Path, Out, Count,
    plen, HV, sl_s, sl_k, sl_u, sl_g,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BP: tl.constexpr,
    IS_RANGE: tl.constexpr, PREC: tl.constexpr, DEVICE_COUNT: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    if DEVICE_COUNT:  # a padded path whose valid length lives on the device (fast path)
        plen = tl.load(Count).to(tl.int32)
    # axis 0 is (layer, value head): stacked layers (tree_gdn_commit_layers) commit in one launch,
    # layer l's state, stash and output at l * sl_* (one layer: l = 0)
    layer = (tl.program_id(0) // HV).to(tl.int64)
    j = tl.program_id(0) % HV
    S0 += layer * sl_s
    Out += layer * sl_s
    SK += layer * sl_k
    SU += layer * sl_u
    SG += layer * sl_g
    offk = tl.program_id(1) * BK + tl.arange(0, BK)
    offv = tl.program_id(2) * BV + tl.arange(0, BV)
    km = offk < DK
    vm = offv < DV
    if IS_RANGE:
        last = plen - 1
    else:
        last = tl.load(Path + plen - 1).to(tl.int32)  # the accepted node (no host sync for device paths)
    Ga = tl.load(SG + last * HV + j)
    acc = tl.exp(Ga) * tl.load(S0 + j * DK * DV + offk[:, None] * DV + offv[None, :], mask=km[:, None] & vm[None, :], other=0.0)
    for p0 in range(0, plen, BP):
        pp = p0 + tl.arange(0, BP)
        pm = pp < plen
        if IS_RANGE:
            idx = pp
        else:
            idx = tl.load(Path + pp, mask=pm, other=0)
        Gm = tl.load(SG + idx * HV + j, mask=pm, other=0.0)
        w = tl.where(pm, tl.exp(Ga - Gm), 0.0)
        kp = tl.load(SK + idx[:, None] * (HV * DK) + j * DK + offk[None, :], mask=pm[:, None] & km[None, :], other=0.0)
        up = tl.load(SU + idx[:, None] * (HV * DV) + j * DV + offv[None, :], mask=pm[:, None] & vm[None, :], other=0.0)
        acc += tl.dot(tl.trans(kp * w[:, None]), up, input_precision=PREC)
    tl.store(Out + j * DK * DV + offk[:, None] * DV + offv[None, :], acc, mask=km[:, None] & vm[None, :])


@triton.jit
def _gdn_decode_kernel(
    Q, K, V, G, B, S, O, SOut, ALog, DtBias,
    r, HV, scale,
    sq_h, sk_h, sv_h,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    j = tl.program_id(0)  # value head
    kh = j // r  # the key head it reads
    offk = tl.arange(0, BK)
    offv = tl.program_id(1) * BV + tl.arange(0, BV)
    km = offk < DK
    vm = offv < DV
    q = tl.load(Q + kh * sq_h + offk, mask=km, other=0.0).to(tl.float32)
    k = tl.load(K + kh * sk_h + offk, mask=km, other=0.0).to(tl.float32)
    v = tl.load(V + j * sv_h + offv, mask=vm, other=0.0).to(tl.float32)
    if GATED:
        # the gates of the AR step, here instead of a launch of their own: l2-normed q and k (as
        # _l2norm_heads), beta = sigmoid(b) rounded to b's dtype, g from a (G, B hold raw a, b)
        q = q * (1.0 / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6))
        k = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6))
        lane = tl.arange(0, 2)  # head j's gates as a 2-lane vector, the second lane masked off
        own = lane < 1
        beta_v, g_v = gdn_gate_values(B, G, ALog, DtBias, j + lane, own)
        beta = tl.sum(tl.where(own, beta_v.to(B.dtype.element_ty).to(tl.float32), 0.0), axis=0)
        a = tl.exp(tl.sum(tl.where(own, g_v, 0.0), axis=0))
    else:
        a = tl.exp(tl.load(G + j).to(tl.float32))
        beta = tl.load(B + j).to(tl.float32)
    q = q * scale
    tile = j * DK * DV + offk[:, None] * DV + offv[None, :]
    tm = km[:, None] & vm[None, :]
    _, st, o = _decode_tile(tl.load(S + tile, mask=tm, other=0.0), q, k, v, a, beta)
    tl.store(O + j * DV + offv, o, mask=vm)
    tl.store(SOut + tile, st, mask=tm)  # each program owns its tile: SOut may be S itself


# Trees of up to this many nodes after the root (every node when the tree is not known to be
# rooted) take the chain-free pair of launches, _gdn_dense_prepare_kernel + _gdn_dense_apply_kernel;
# 0 turns it off (benchmarks compare). It pays only for one block: H100, 27B dims, cold graph
# (kernels-nvidia-h100-2026-12-05-dense.json), dense / blocked 25.0 / 31.0 us at 17 nodes, but
# 63 / 33 at 33 and 137 / 42 at 65: the prepare's [BN, BN] tf32x3 doubling inverse spills from
# BN = 32 (1.1 KB a thread at 64, CPU AOT for sm_90) and runs one program per head.
DENSE_MAX_NODES = 16
DENSE_LARGEST = 64  # the largest tree (after the root) the dense kernels take; tested up to it

# Settings of the blocked solve with stored off-diagonal blocks (18-257 nodes) that a device run
# has not yet decided (bench.e2e --gdn-variants compares them; these are the measured defaults):
# - WIDE_SCANS: the mask scans (the root test, the path sums of a block's rows) as one wide load
#   each instead of a loop of one load per block: the prepare's programs and the chain's start wait
#   on load latency, not bytes (up to WIDE_SCANS_MAX_NODES, where a [16, TP] uint8 tile still sits
#   in one warp's registers).
# - ROOT_PEEL: 65 nodes as 4 blocks after the root instead of 5, the last holding one node. It lost
#   on 2026-12-03 (70.3 vs 63.7 us at 65, H200) while the root test was a loop of loads in every
#   program.
# - PREP_BKC / prep_warps: the prepare's K K^T and Q K^T in dk chunks of PREP_BKC. At one warp and
#   full dk the prepare spills ~500-800 B a thread on sm_90 (CPU AOT), 0 at 4 warps with chunks of
#   32; one warp measured faster on 2026-12-03 all the same (2 / 4 warps 1.16x / 1.30x at 65).
# - PRE_S0 (unpeeled only): the prepare launch also takes each block's two products with the
#   committed state (K_b S0 and Q_b S0, [BS, dk] x [dk, BV] in tf32x3, which need no u), in extra
#   programs of S0_BV value columns and dk chunks of S0_BKC; the chain then starts each block from
#   the stored right-hand side and output (_gdn_chain_kernel), so its serial steps are the [BS, BS]
#   dots alone, each block's u-independent inputs loaded a block ahead.
#   WIDE_OFF: that chain's earlier-block terms as one wide dot a step (_gdn_chain_kernel's TW).
OFFDIAG_DEFAULTS = {"WIDE_SCANS": False, "ROOT_PEEL": False, "PREP_BKC": 128, "prep_warps": 1, "PRE_S0": False,
                    "S0_BV": 16, "S0_BKC": 32, "WIDE_OFF": False}
WIDE_SCANS_MAX_NODES = 128


@contextlib.contextmanager
def blocked_variant(**settings):
    """OFFDIAG_DEFAULTS changed for a block (benchmarks compare); unknown names are refused."""
    unknown = set(settings) - set(OFFDIAG_DEFAULTS) - {"num_warps", "BV"}
    if unknown:
        raise ValueError(f"blocked_variant: unknown setting(s) {sorted(unknown)} (known: {sorted(OFFDIAG_DEFAULTS)}, num_warps, BV)")
    old = dict(OFFDIAG_DEFAULTS)
    OFFDIAG_DEFAULTS.update(settings)
    try:
        yield
    finally:
        OFFDIAG_DEFAULTS.clear()
        OFFDIAG_DEFAULTS.update(old)


@contextlib.contextmanager
def dense_fork(enabled: bool):
    """Within the block, trees take (True) or skip (False) the dense kernel: benchmarks compare."""
    global DENSE_MAX_NODES
    old = DENSE_MAX_NODES
    DENSE_MAX_NODES = DENSE_LARGEST if enabled else 0
    try:
        yield
    finally:
        DENSE_MAX_NODES = old


def dense_block(t: int, rooted: bool) -> int:
    """The dense kernel's node block for a tree of t nodes, 0 when it does not fit (the root is
    peeled only when the caller knows node 0 is an ancestor of every node)."""
    n = t - 1 if rooted else t
    if DENSE_MAX_NODES <= 0 or n > DENSE_MAX_NODES:
        return 0
    return max(16, next_pow2(n))


def default_config(t: int, hv: int, dv: int, device: torch.device, rooted: bool = False) -> dict:
    """Block of nodes per solve step (BS), value columns per program (BV), warps.

    BS = 64 needs more than the 227 KiB of shared memory an H200 block may use (measured:
    263-271 KiB with BK = 128, BV = 64), so trees are solved in blocks of 16 by default.
    ``DENSE`` (trees of at most DENSE_MAX_NODES nodes after a known root): the whole tree is one
    block of BN nodes, no serial chain and one launch.
    """
    bn = dense_block(t, rooted) if t > 1 else 0
    return dense_config(bn, dv) if bn else blocked_config(t, dv)


def dense_config(bn: int, dv: int) -> dict:
    """The dense solve's settings for a node block of BN."""
    # H100 sweep at 17 nodes: BV 16 / 32 / 64 within 8 %, 8 apply warps 1.4x slower, prepare
    # warps 2 / 4 / 8 within 5 %, dk chunks of 64 1.15x faster than 32 (no spill at BN 16)
    return {"DENSE": True, "BN": bn, "BV": min(32, max(16, next_pow2(dv))), "num_warps": 4,
            "prep_warps": 4, "BKC": 64 if bn <= 16 else 32}


def blocked_config(t: int, dv: int) -> dict:
    """The blocked solve's settings (trees too large for the dense kernel, and its comparisons)."""
    if t > 17:
        # several diagonal blocks: the parallel prepare launch takes their inverses off the serial
        # chain (H200, 27B dims, T = 64: 72.8 us with BV = 32 against 105 us for the single-launch
        # kernel), and PRE_OFFDIAG also stores the u-independent off-diagonal blocks (one prepare
        # program per block pair), so each chain step is two dots. H200, 27B dims, cold graph,
        # off-diagonal blocks in the chain over stored: 1.68x / 2.03x / 2.15x at 33 / 65 / 129
        # nodes; at 257 stored 300 us against 660 us. With them stored the root peel no longer
        # pays (peeled over unpeeled: 1.15x / 1.02x / 1.06x / 1.12x at 33 / 65 / 129 / 257), and
        # one warp per prepare program stays best (2 / 4 warps: 1.16x / 1.30x at 65;
        # kernels-nvidia-h200-2026-12-03T17-merge.json). Above 257 nodes (nb^2 stored blocks, 28 MB
        # at 257) unmeasured, so the chain keeps them.
        cfg = {"DENSE": False, "BS": 16, "BV": min(32, max(16, next_pow2(dv))), "num_warps": 4, "PRE_INVERSE": True,
               "prep_warps": 1, "ROOT_PEEL": False, "PRE_OFFDIAG": t <= 257}
        if cfg["PRE_OFFDIAG"]:
            cfg.update(OFFDIAG_DEFAULTS)
            cfg["BV"] = min(cfg["BV"], max(16, next_pow2(dv)))
        return cfg
    bv = min(64, max(16, next_pow2(dv)))
    return {"DENSE": False, "BS": 16, "BV": bv, "num_warps": 4, "ROOT_PEEL": True}


_FALLBACK = [{"BS": 16, "BV": 32, "num_warps": 4}, {"BS": 16, "BV": 16, "num_warps": 4},
             {"DENSE": False, "PRE_INVERSE": True, "PRE_OFFDIAG": True, "ROOT_PEEL": False, "BS": 16, "BV": 16, "num_warps": 4}]


def _check(q, k, v, g, beta, state, anc=None):
    t, hv, dv = v.shape
    if q.shape != k.shape or q.dim() != 3 or q.shape[0] != t or g.shape != (t, hv) or beta.shape != (t, hv):
        raise ValueError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"g {tuple(g.shape)}, beta {tuple(beta.shape)}"
        )
    h, dk = q.shape[1], q.shape[2]
    if hv % h:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({h})")
    if state.shape != (hv, dk, dv) or (anc is not None and anc.shape != (t, t)):
        raise ValueError(f"state {tuple(state.shape)} / anc {None if anc is None else tuple(anc.shape)} "
                         f"do not fit T={t}, HV={hv}, dk={dk}, dv={dv}")


def tree_gdn_fork(q, k, v, g, beta, state, anc, scale=None, *, config: dict | None = None, rooted: bool = False,
                  stash_out: TreeGDNStash | None = None):
    """Exact ancestor-masked gated delta rule, one launch. Returns (o fp32 [T, HV, dv], stash).

    ``config``: ``BS``, ``BV``, ``num_warps``; ``PRE_INVERSE=True`` adds a launch before the solve
    (``_gdn_prepare_kernel``: the gates and the diagonal blocks' inverses, nb x HV programs of
    ``prep_warps`` warps) so the solve's serial chain no longer holds the forward substitutions;
    ``ROOT_PEEL`` (default True): when node 0 is an ancestor of every node, its step is taken in
    registers and the blocks start at node 1 (checked on the device from ``anc``, so any mask
    stays exact). ``rooted``: the caller knows node 0 is an ancestor of every node (a draft tree,
    a chain), so a tree of DENSE_MAX_NODES + 1 nodes still fits the dense kernel; a tree that is
    not gets NaN outputs there (not silently wrong ones). ``stash_out``: contiguous fp32 tensors
    to write the stash into (a layer's slice of stacked buffers, so one launch commits every layer).
    """
    _check(q, k, v, g, beta, state, anc)
    t, hv, dv = v.shape
    h, dk = q.shape[1], q.shape[2]
    scale = dk**-0.5 if scale is None else float(scale)
    cfg = dict(default_config(t, hv, dv, v.device, rooted), **(config or {}))
    if config and "DENSE" not in config and set(config) & {"BS", "PRE_INVERSE", "PRE_OFFDIAG", "ROOT_PEEL"}:
        # a blocked-solve setting asks for the blocked solve (tests and sweeps compare the variants)
        cfg = dict(blocked_config(t, dv), **config)
    if config and config.get("DENSE") and not cfg.get("BN"):
        # asked for where the default is blocked: the dense defaults for the smallest block that holds it
        cfg = dict(dense_config(max(16, next_pow2(t - 1 if rooted else t)), dv), **config)
    bs_asked = cfg.get("BS", 16)
    if not cfg.get("DENSE") and (bs_asked < 16 or bs_asked & (bs_asked - 1)):
        raise ValueError(f"tree_gdn_fork: block size BS={bs_asked} must be a power of two of at least 16")
    if cfg.get("DENSE"):
        if cfg["BN"] > DENSE_LARGEST:
            raise ValueError(f"tree_gdn_fork: DENSE block BN={cfg['BN']} is larger than the {DENSE_LARGEST} "
                             f"nodes the dense kernels take ({t} nodes{', rooted' if rooted else ''})")
        if cfg["BN"] < (t - 1 if rooted else t):
            raise ValueError(f"tree_gdn_fork: DENSE block BN={cfg['BN']} is smaller than the {t} nodes "
                             f"({'rooted, ' if rooted else ''}{t - 1 if rooted else t} after the root peel)")
    q, k, v = as_last_contiguous(q), as_last_contiguous(k), as_last_contiguous(v)
    state = state.float().contiguous()
    a8 = mask_as_uint8(anc)
    a8 = as_last_contiguous(a8)
    dev = v.device
    o = torch.empty(t, hv, dv, dtype=torch.float32, device=dev)
    if stash_out is None:
        sk = torch.empty(t, hv, dk, dtype=torch.float32, device=dev)
        su = torch.empty(t, hv, dv, dtype=torch.float32, device=dev)
        sg = torch.empty(t, hv, dtype=torch.float32, device=dev)
    else:
        sk, su, sg = check_stash_out(stash_out, t, hv, dk, dv)
    bk = max(16, next_pow2(dk))

    def launch(c):
        bv = min(c["BV"], max(16, next_pow2(dv)))
        prec = dot_precision(torch.float32)
        if c.get("DENSE"):
            bn = c["BN"]
            bkc = min(bk, c.get("BKC", 32))
            inv = torch.empty(hv, bn, bn, dtype=torch.float32, device=dev)
            pm = torch.empty(hv, bn, bn, dtype=torch.float32, device=dev)
            _gdn_dense_prepare_kernel[(hv,)](
                q, k, g, beta, a8, sk, sg, inv, pm, t, hv // h, hv, scale,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0), g.stride(1),
                beta.stride(0), beta.stride(1), a8.stride(0),
                DK=dk, BK=bk, BKC=bkc, BN=bn, LOG2BN=bn.bit_length() - 1, PREC=prec,
                num_warps=c.get("prep_warps", 4), **pdl_options(q)
            )
            _gdn_dense_apply_kernel[(hv, triton.cdiv(dv, bv))](
                q, k, v, beta, state, a8, sg, inv, pm, o, su, t, hv // h, hv, scale,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                beta.stride(0), beta.stride(1), a8.stride(0),
                DK=dk, DV=dv, BK=bk, BKC=bkc, BV=bv, BN=bn, PREC=prec, num_warps=c["num_warps"], **pdl_options(q)
            )
            return
        bs = c.get("BS", 16)
        pre = bool(c.get("PRE_INVERSE", False))
        peel = bool(c.get("ROOT_PEEL", True))
        tp = next_pow2(t) if c.get("WIDE_SCANS", False) and t <= WIDE_SCANS_MAX_NODES else 0
        inv = off_l = off_m = sg  # unused unless pre / off
        nb = triton.cdiv(t, bs)
        off = pre and bool(c.get("PRE_OFFDIAG", False))
        # the products with S0 in the prepare: only with stored off-diagonal blocks and no peeled root
        # (the peel changes the state the blocks start from inside the chain)
        s0p = off and not peel and bool(c.get("PRE_S0", False))
        if pre:
            inv = torch.empty(nb, hv, bs, bs, dtype=torch.float32, device=dev)
            if off:
                off_l = torch.empty(nb, nb, hv, bs, bs, dtype=torch.float32, device=dev)
                off_m = torch.empty(nb, nb, hv, bs, bs, dtype=torch.float32, device=dev)
            npair = nb if off else 1
            bvp = min(int(c.get("S0_BV", 16)), max(16, next_pow2(dv)))
            s0_bkc = min(bk, int(c.get("S0_BKC", 32)))
            _gdn_prepare_kernel[(nb, npair + (triton.cdiv(dv, bvp) if s0p else 0), hv)](
                q, k, g, beta, a8, v, state, sg, inv, off_l, off_m, sk, su, o, t, hv // h, hv, nb, npair, scale,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
                beta.stride(0), beta.stride(1), a8.stride(0),
                DK=dk, DV=dv, BK=bk, BS=bs, PREC=prec, PEEL=peel, OFF=off, DOUBLING=bool(c.get("PREP_DOUBLING", False)),
                LOG2BS=bs.bit_length() - 1, TP=tp, BKC=min(bk, c.get("PREP_BKC", bk)), S0P=s0p, BVP=bvp, S0_BKC=s0_bkc,
                num_warps=c.get("prep_warps", 1), **pdl_options(q)
            )
        if s0p:
            # the chain's earlier-block terms as one dot over every earlier node, up to 128 of them
            tw = next_pow2(max(16, (nb - 1) * bs)) if c.get("WIDE_OFF", False) and (nb - 1) * bs <= 128 else 0
            _gdn_chain_kernel[(hv, triton.cdiv(dv, bv))](
                su, o, inv, off_l, off_m, t, hv, nb,
                DV=dv, BV=bv, BS=bs, PREC=prec, TW=tw, num_warps=c["num_warps"], **pdl_options(q)
            )
            return
        _gdn_fork_kernel[(hv, triton.cdiv(dv, bv))](
            q, k, v, g, beta, state, a8, inv, off_l, off_m, o, sk, su, sg,
            t, hv // h, hv, scale, nb,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), a8.stride(0),
            DK=dk, DV=dv, BK=bk, BV=bv, BS=bs, PREC=prec, PRE=pre, PEEL=peel, OFF=off, TP=tp,
            num_warps=c["num_warps"], **pdl_options(q)
        )

    fallback = [dict(cfg, **f) for f in _FALLBACK]  # smaller blocks, the same variant
    launch_with_fallback(launch, [cfg] + fallback, ("gdn_fork", dk, dv, str(dev)))
    return o, TreeGDNStash(k=sk, u=su, G=sg)


def tree_gdn_commit(stash: TreeGDNStash, state, path, *, count: torch.Tensor | None = None,
                    block_k: int | None = None, block_v: int | None = None, num_warps: int = 4,
                    out: torch.Tensor | None = None):
    """State after the accepted node path[-1] from the stash, one launch. fp32 [HV, dk, dv].

    With ``count`` (a device scalar), ``path`` is a padded device tensor whose first ``count``
    entries are the path: no host sync, graph-capturable. ``out`` may be ``state`` itself (each
    program reads its tile of S0 before it writes the same tile): the commit in place."""
    t, hv, dk = stash.k.shape
    dv = stash.u.shape[-1]
    if state.shape != (hv, dk, dv):
        raise ValueError(f"state {tuple(state.shape)} does not fit the stash ({hv}, {dk}, {dv})")
    dev = stash.G.device
    idx, plen, is_range = path_operand(path, dev)
    state = state.float().contiguous()
    if out is None:
        out = torch.empty(hv, dk, dv, dtype=torch.float32, device=dev)
    elif out.shape != (hv, dk, dv) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"tree_gdn_commit: out must be a contiguous fp32 {(hv, dk, dv)} tensor, got {tuple(out.shape)} {out.dtype}")
    bk = block_k or min(64, max(16, next_pow2(dk)))
    bv = block_v or min(64, max(16, next_pow2(dv)))
    grid = (hv, triton.cdiv(dk, bk), triton.cdiv(dv, bv))
    _gdn_commit_kernel[grid](
        state, stash.k.contiguous(), stash.u.contiguous(), stash.G.contiguous(), idx if idx is not None else stash.G, out,
        count.reshape(1) if count is not None else out,
        plen, hv, 0, 0, 0, 0,
        DK=dk, DV=dv, BK=bk, BV=bv, BP=16 if plen <= 16 else 32, IS_RANGE=is_range,
        PREC=dot_precision(torch.float32), DEVICE_COUNT=count is not None, num_warps=num_warps, **pdl_options(state)
    )
    return out


def tree_gdn_commit_layers(stash: TreeGDNStash, states, path, count, *, block_k: int | None = None,
                           block_v: int | None = None, num_warps: int = 4):
    """``tree_gdn_commit`` of L stacked layers in one launch, in place: ``states`` [L, HV, dk, dv]
    fp32, ``stash`` fields [L, T, ...] (layer l's fork wrote slice l), ``path`` a padded device
    path with ``count`` valid slots (one path for every layer). Returns ``states``."""
    n, t, hv, dk = stash.k.shape
    dv = stash.u.shape[-1]
    if states.shape != (n, hv, dk, dv) or states.dtype != torch.float32 or not states.is_contiguous():
        raise ValueError(f"tree_gdn_commit_layers: states must be contiguous fp32 {(n, hv, dk, dv)}, got "
                         f"{tuple(states.shape)} {states.dtype}")
    if stash.u.shape != (n, t, hv, dv) or stash.G.shape != (n, t, hv):
        raise ValueError(f"tree_gdn_commit_layers: stash k {tuple(stash.k.shape)}, u {tuple(stash.u.shape)}, "
                         f"G {tuple(stash.G.shape)} do not match")
    if not all(x.is_contiguous() and x.dtype == torch.float32 for x in (stash.k, stash.u, stash.G)):
        raise ValueError("tree_gdn_commit_layers: the stacked stash must be contiguous fp32")
    idx, plen, _ = path_operand(path, stash.G.device)
    bk = block_k or min(64, max(16, next_pow2(dk)))
    bv = block_v or min(64, max(16, next_pow2(dv)))
    grid = (n * hv, triton.cdiv(dk, bk), triton.cdiv(dv, bv))
    _gdn_commit_kernel[grid](
        states, stash.k, stash.u, stash.G, idx, states, count.reshape(1),
        plen, hv, hv * dk * dv, t * hv * dk, t * hv * dv, t * hv,
        DK=dk, DV=dv, BK=bk, BV=bv, BP=16 if plen <= 16 else 32, IS_RANGE=False,
        PREC=dot_precision(torch.float32), DEVICE_COUNT=True, num_warps=num_warps, **pdl_options(states)
    )
    return states


def gdn_decode_step(q, k, v, g, beta, state, scale=None, *, out: torch.Tensor | None = None,
                    block_v: int | None = None, num_warps: int = 4):
    """One committed token in one launch. Returns (o fp32 [1, HV, dv], the next state fp32 [HV, dk, dv]).

    ``out`` may be ``state`` itself (an fp32 contiguous buffer): the state is updated in place."""
    if v.dim() != 3 or v.shape[0] != 1:
        raise ValueError(f"gdn_decode_step takes one token, got v {tuple(v.shape)}")
    _check(q, k, v, g, beta, state)  # one node: no ancestor mask
    return _launch_decode("gdn_decode_step", q, k, v, g, beta, None, None, state, scale, out, block_v, num_warps)


def gdn_decode_step_gated(q, k, v, b, a, A_log, dt_bias, state, scale=None, *, out: torch.Tensor | None = None,
                          block_v: int | None = None, num_warps: int = 4):
    """The AR step's gates and recurrence in one launch: q, k raw (the conv's output, not yet
    l2-normed), b, a raw [1, HV]; the same as gdn_gates then gdn_decode_step. ``out`` may be
    ``state`` (in place). Returns (o fp32 [1, HV, dv], next state fp32)."""
    if v.dim() != 3 or v.shape[0] != 1:
        raise ValueError(f"gdn_decode_step_gated takes one token, got v {tuple(v.shape)}")
    hv = v.shape[1]
    if b.shape != (1, hv) or a.shape != (1, hv) or A_log.shape != (hv,) or dt_bias.shape != (hv,):
        raise ValueError(f"gdn_decode_step_gated: b {tuple(b.shape)}, a {tuple(a.shape)}, A_log {tuple(A_log.shape)}, "
                         f"dt_bias {tuple(dt_bias.shape)} do not fit HV={hv}")
    _check(q, k, v, a, b, state)
    return _launch_decode("gdn_decode_step_gated", q, k, v, a, b, A_log, dt_bias, state, scale, out, block_v, num_warps)


def _launch_decode(name, q, k, v, g_in, beta_in, A_log, dt_bias, state, scale, out, block_v, num_warps):
    """The decode kernel's launch for both entry points: ``g_in`` / ``beta_in`` are g and beta, or
    (``A_log`` given: gated) the raw a and b the kernel turns into them."""
    _, hv, dv = v.shape
    h, dk = q.shape[1], q.shape[2]
    scale = dk**-0.5 if scale is None else float(scale)
    q, k, v = as_last_contiguous(q), as_last_contiguous(k), as_last_contiguous(v)
    g_in, beta_in = g_in.reshape(hv).contiguous(), beta_in.reshape(hv).contiguous()
    if out is None:
        out = torch.empty(hv, dk, dv, dtype=torch.float32, device=v.device)
    elif out.shape != (hv, dk, dv) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"{name}: out must be a contiguous fp32 {(hv, dk, dv)} tensor, got {tuple(out.shape)} {out.dtype}")
    src = state if (state.dtype == torch.float32 and state.is_contiguous()) else state.float().contiguous()
    o = torch.empty(1, hv, dv, dtype=torch.float32, device=v.device)
    bv = block_v or min(32, max(16, next_pow2(dv)))
    gated = A_log is not None
    _gdn_decode_kernel[(hv, triton.cdiv(dv, bv))](
        q, k, v, g_in, beta_in, src, o, out, A_log if gated else g_in, dt_bias if gated else g_in,
        hv // h, hv, scale, q.stride(1), k.stride(1), v.stride(1),
        DK=dk, DV=dv, BK=max(16, next_pow2(dk)), BV=bv, GATED=gated, num_warps=num_warps, **pdl_options(q)
    )
    return o, out
