"""The ancestor mask of a static tree in one Triton launch (see naive.py): program (row block,
column block) follows each of its BR rows up the tree max_depth times (a gather of the parent per
step) and marks the columns it passes, so its [BR, BC] tile is written once, with no scatter and
no matrix products (the reference's pointer doubling is 2 + 3 per squaring launches, ~14 at depth 16).
The conv gather table the same way: one program per block of rows walks W - 1 steps up, one launch
where the reference takes 1 + 6 (W - 1) small ones (25 for the width-4 convs of every GDN layer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._pdl import pdl_enter, pdl_options
from .._triton_common import next_pow2

__all__ = ["ancestor_mask", "conv_gather_table"]


@triton.jit
def _ancestor_mask_kernel(Par, Anc, T, s_anc, MAX_DEPTH: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                          USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    row_live = rows < T
    cur = tl.where(row_live, rows, -1)  # the ancestor reached so far (-1: past the root)
    tile = cols[None, :] == cur[:, None]
    for _ in tl.static_range(MAX_DEPTH):
        cur = tl.load(Par + tl.maximum(cur, 0), mask=cur >= 0, other=-1)
        tile = tile | ((cols[None, :] == cur[:, None]) & (cur[:, None] >= 0))
    tl.store(Anc + rows.to(tl.int64)[:, None] * s_anc + cols[None, :], tile.to(tl.int8),
             mask=row_live[:, None] & (cols[None, :] < T))


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    n = parents.shape[0]
    if parents.shape != (n,) or parents.dtype != torch.int64:
        raise ValueError(f"ancestor_mask: parents must be int64 [T], got {parents.dtype} {tuple(parents.shape)}")
    if max_depth < 0:
        raise ValueError(f"ancestor_mask: max_depth must be >= 0, got {max_depth}")
    anc = torch.empty(n, n, dtype=torch.bool, device=parents.device)
    block = min(64, next_pow2(max(n, 16)))
    grid = (triton.cdiv(n, block), triton.cdiv(n, block))
    _ancestor_mask_kernel[grid](parents.contiguous(), anc.view(torch.int8), n, anc.stride(0), MAX_DEPTH=max_depth,
                                BR=block, BC=block, num_warps=4, **pdl_options(parents))
    return anc


@triton.jit
def _conv_gather_kernel(Par, Idx, T, WIDTH: tl.constexpr, BR: tl.constexpr, USE_GDC: tl.constexpr = False):
    pdl_enter(USE_GDC)
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    live = rows < T
    cur = rows.to(tl.int64)
    base = Idx + rows.to(tl.int64) * WIDTH
    for step in tl.static_range(WIDTH):
        tl.store(base + (WIDTH - 1 - step), cur, mask=live)
        # a node steps to its parent (the root's is -1, the newest committed input); past the
        # root, one further back into the committed conv state
        up = tl.load(Par + tl.maximum(cur, 0), mask=live & (cur >= 0), other=0)
        cur = tl.where(cur >= 0, up, cur - 1)


def conv_gather_table(parents: torch.Tensor, width: int) -> torch.Tensor:
    n = parents.shape[0]
    if parents.shape != (n,) or parents.dtype != torch.int64:
        raise ValueError(f"conv_gather_table: parents must be int64 [T], got {parents.dtype} {tuple(parents.shape)}")
    if width < 1:
        raise ValueError(f"conv_gather_table: width must be >= 1, got {width}")
    idx = torch.empty(n, width, dtype=torch.int64, device=parents.device)
    if n:
        block = min(256, next_pow2(max(n, 16)))
        _conv_gather_kernel[(triton.cdiv(n, block),)](parents.contiguous(), idx, n, WIDTH=width, BR=block, num_warps=4,
                                                       **pdl_options(parents))
    return idx
