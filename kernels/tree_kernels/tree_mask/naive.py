"""The ancestor mask of a static tree, with a fixed number of steps (no data-dependent loop):
the reference of the kernel, and what runs where Triton does not.

Input: ``parents`` [T] int64 (-1 for the root; a parent always precedes its child) and
``max_depth``, the deepest a node can be. Output: ``anc`` [T, T] bool, anc[i, j] when j is i or
one of i's ancestors.

Pointer doubling: reach_1 = I + (node -> parent); squaring doubles the path length covered, so
ceil(log2(max_depth + 1)) squarings reach every ancestor. Counts stay small integers: exact in fp32.

Beside it the other walk up the parents a round needs: ``conv_gather_table``, the rows a short
causal conv reads for each node (its W - 1 nearest ancestors, then the committed conv state).
"""

from __future__ import annotations

import torch


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    n = parents.shape[0]
    rows = torch.arange(n, device=parents.device)
    has_parent = parents >= 0
    reach = (rows[:, None] == rows[None, :]) | (has_parent[:, None] & (parents.clamp(min=0)[:, None] == rows[None, :]))
    covered = 1  # path length (edges) covered so far
    while covered < max_depth:
        r = reach.float()
        reach = (r @ r) > 0
        covered *= 2
    return reach


def conv_gather_table(parents: torch.Tensor, width: int) -> torch.Tensor:
    """The window of a width-W causal conv on a tree, as rows to gather: idx[n, W-1] = n,
    idx[n, W-2] = n's parent, and so on up the tree; past the root the window continues into the
    committed conv state (-1 the newest committed input, -2 the one before), so ``idx + W - 1``
    indexes a row of ``cat([conv_state.T, x])``. [T, W] int64."""
    n = parents.shape[0]
    idx = torch.empty(n, width, dtype=torch.int64, device=parents.device)
    cur = torch.arange(n, device=parents.device)
    for j in range(width - 1, -1, -1):
        idx[:, j] = cur
        # a node steps to its parent (the root's parent is -1: the newest committed input);
        # a negative offset steps one further back into the conv state
        cur = torch.where(cur >= 0, parents[cur.clamp(min=0)], cur - 1)
    return idx
