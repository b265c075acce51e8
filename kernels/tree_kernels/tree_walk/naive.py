"""The static tree walk (which drafted nodes the target accepts) as tensor ops: the reference of
the kernel, and what runs where Triton does not.

Inputs, one verify round of a static tree of T slots in topological order (slot 0 the root):
``tokens``, ``parents`` (-1 for the root), ``depths`` [T] int64, ``valid`` [T] bool (padding slots
False), ``anc`` [T, T] bool with anc[i, j] when j is i or an ancestor of i, ``choices`` [T] int64
(the target's token after each node) and ``max_depth``.

A node is accepted when it and all its ancestors match the target's choice at their parent (the
root always is). Siblings carry distinct tokens, so the accepted set is a path; its deepest node is
the last accepted one.

Returns ``(path, count, bonus, last)``: ``path`` [max_depth + 1] int64, the accepted nodes by depth
(slots past count 0); ``count`` [] the accepted nodes including the root; ``bonus`` [] the target's
choice at the last accepted node; ``last`` [] that node. No host sync: all stay on the device.
"""

from __future__ import annotations

import torch


def tree_walk(tokens, parents, depths, valid, anc, choices, max_depth: int) -> tuple:
    n = tokens.shape[0]
    ok = valid & (tokens == choices[parents.clamp(min=0)])
    ok = ok | (torch.arange(n, device=tokens.device) == 0)  # the root (no host->device copy)
    rejected_ancestors = anc.to(torch.float32) @ (~ok).to(torch.float32)
    accepted = rejected_ancestors == 0
    depth_or_minus = torch.where(accepted, depths, torch.full_like(depths, -1))
    last = torch.argmax(depth_or_minus)
    count = depth_or_minus.max() + 1
    slots = torch.where(accepted, depths, torch.full_like(depths, max_depth + 1))
    path = torch.zeros(max_depth + 2, dtype=torch.int64, device=tokens.device)
    path.scatter_(0, slots, torch.arange(n, device=tokens.device))
    # gather, not choices[last]: indexing with a 0-dim tensor would read it on the host
    return path[: max_depth + 1], count, choices.gather(0, last.reshape(1))[0], last
