"""The ancestor mask of a static tree, with a fixed number of steps (no data-dependent loop):
the reference of the kernel, and what runs where Triton does not.

Input: ``parents`` [T] int64 (-1 for the root; a parent always precedes its child) and
``max_depth``, the deepest a node can be. Output: ``anc`` [T, T] bool, anc[i, j] when j is i or
one of i's ancestors.

Pointer doubling: reach_1 = I + (node -> parent); squaring doubles the path length covered, so
ceil(log2(max_depth + 1)) squarings reach every ancestor. Counts stay small integers: exact in fp32.
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
