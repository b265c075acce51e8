"""The static tree walk in one Triton program (see naive.py): the ~20 small torch launches of the
reference become one, on every round of every method (the AR step's one-node tree included).

Row blocks of BR nodes; for each, the ancestor rows are scanned in BC-wide column chunks and a node
is rejected when any ancestor (itself included) fails its match, where a column's match is
recomputed from its token, validity and the target's choice at its parent (a gather: cheaper than
a second pass). The accepted nodes of a block add themselves into a [BD] path vector by depth (at
most one per depth: the accepted set is a path), so nothing is scattered to memory and no two
lanes write one address; the deepest accepted node is tracked by a max over the blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._pdl import pdl_enter, pdl_options
from .._triton_common import mask_as_uint8, next_pow2

__all__ = ["tree_walk"]


@triton.jit
def _matches(Tok, Par, Valid, Choice, idx, live):
    # node idx matches the target's choice at its parent (the root always does)
    tok = tl.load(Tok + idx, mask=live, other=0)
    par = tl.load(Par + idx, mask=live, other=0)
    val = tl.load(Valid + idx, mask=live, other=0) != 0
    want = tl.load(Choice + tl.maximum(par, 0), mask=live, other=-1)
    return ((val & (tok == want)) | (idx == 0)) & live


@triton.jit
def _tree_walk_kernel(Tok, Par, Dep, Valid, Anc, Choice, Path, Count, Bonus, Last, T, s_anc,
                      MAX_DEPTH: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, BD: tl.constexpr,
                      USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    slots = tl.arange(0, BD)
    path = tl.zeros([BD], dtype=tl.int64)
    best_depth = -1
    best_node = 0
    for r0 in range(0, T, BR):
        rows = r0 + tl.arange(0, BR)
        row_live = rows < T
        rejected = tl.zeros([BR], dtype=tl.int32)
        for c0 in range(0, T, BC):
            cols = c0 + tl.arange(0, BC)
            col_live = cols < T
            bad = (~_matches(Tok, Par, Valid, Choice, cols, col_live)) & col_live
            a = tl.load(Anc + rows.to(tl.int64)[:, None] * s_anc + cols[None, :],
                        mask=row_live[:, None] & col_live[None, :], other=0)
            rejected += tl.sum(((a != 0) & bad[None, :]).to(tl.int32), axis=1)
        accepted = (rejected == 0) & row_live
        dep = tl.load(Dep + rows, mask=row_live, other=0).to(tl.int32)
        # the accepted node at depth d (one at most) lands in path[d]; depths past MAX_DEPTH are dropped
        hit = accepted[:, None] & (dep[:, None] == slots[None, :]) & (slots[None, :] <= MAX_DEPTH)
        path += tl.sum(tl.where(hit, rows.to(tl.int64)[:, None], 0), axis=0)
        d_or_minus = tl.where(accepted, dep, -1)
        block_best = tl.max(d_or_minus, axis=0)
        block_node = tl.min(tl.where(d_or_minus == block_best, rows, 2147483647), axis=0)
        better = block_best > best_depth
        best_node = tl.where(better, block_node, best_node)
        best_depth = tl.maximum(block_best, best_depth)
    tl.store(Path + slots, path, mask=slots <= MAX_DEPTH)
    tl.store(Count, (best_depth + 1).to(tl.int64))
    tl.store(Last, best_node.to(tl.int64))
    tl.store(Bonus, tl.load(Choice + best_node))


def tree_walk(tokens, parents, depths, valid, anc, choices, max_depth: int) -> tuple:
    n = tokens.shape[0]
    for name, t in (("tokens", tokens), ("parents", parents), ("depths", depths), ("choices", choices)):
        if t.shape != (n,) or t.dtype != torch.int64:
            raise ValueError(f"tree_walk: {name} must be int64 [{n}], got {t.dtype} {tuple(t.shape)}")
    if valid.shape != (n,) or anc.shape != (n, n):
        raise ValueError(f"tree_walk: valid must be [{n}] and anc [{n}, {n}], got {tuple(valid.shape)} and {tuple(anc.shape)}")
    tokens, parents, depths, choices = (t.contiguous() for t in (tokens, parents, depths, choices))
    anc = mask_as_uint8(anc)
    if anc.stride(-1) != 1:
        anc = anc.contiguous()
    out = torch.empty(max_depth + 4, dtype=torch.int64, device=tokens.device)
    path, count, bonus, last = out[: max_depth + 1], out[max_depth + 1], out[max_depth + 2], out[max_depth + 3]
    block = min(64, next_pow2(max(n, 16)))
    _tree_walk_kernel[(1,)](tokens, parents, depths, mask_as_uint8(valid.contiguous()), anc, choices, path, count, bonus,
                            last, n, anc.stride(0), MAX_DEPTH=max_depth, BR=block, BC=block,
                            BD=next_pow2(max(max_depth + 1, 2)), num_warps=4, **pdl_options(tokens))
    return path, count, bonus, last
