"""DDTree construction from the drafter's per-depth top-k: the plain reference of the kernel.

Inputs: ``draft_tokens`` [L, k] and ``draft_logprobs`` [L, k] (depth d's candidates, sorted by
descending log-probability), a node ``budget`` and the root token. A prefix is a rank tuple
(r_1..r_d) with score sum_d logq[d-1, r_d]; the tree is the ``budget`` best prefixes, emitted
best-first from a frontier that starts with (0,): pop the best entry, emit it as a node, put
back its next sibling (rank + 1, same parent) and its first child (depth + 1, rank 0). A node's
score never exceeds its parent's or its previous sibling's, so the emitted set is closed under
both: a tree, in topological order.

Arithmetic: scores in fp32, each the parent's fp32 score plus one fp32 log-probability (as the
kernel adds them); NaN log-probabilities count as -inf. Ties: the shallower prefix, then the one
whose parent was emitted first, then the lower rank (a total order on frontier entries, so the
reference and the kernel emit the same tree). When no finite candidate is left, the remaining
slots are invalid: token 0, parent 0 (the root), depth 1, rank 0, score 0, ``valid`` False.

Returns ``(tokens, parents, depths, scores, ranks, valid)``, each of ``budget + 1`` slots
(slot 0 the root: parent -1, depth 0, rank -1, score 0); int64 but scores fp32 and valid bool.
"""

from __future__ import annotations

import numpy as np
import torch


def tree_build(draft_tokens: torch.Tensor, draft_logprobs: torch.Tensor, budget: int, root_token) -> tuple:
    depth, k = draft_logprobs.shape
    lq = draft_logprobs.detach().float().cpu().numpy().astype(np.float32)
    lq = np.where(np.isnan(lq), np.float32(-np.inf), lq)
    toks = draft_tokens.detach().cpu().tolist()
    n = budget + 1
    tokens, parents, depths = [0] * n, [0] * n, [1] * n
    scores, ranks, valid = [np.float32(0.0)] * n, [0] * n, [False] * n
    tokens[0] = int(torch.as_tensor(root_token).reshape(-1)[0])
    parents[0], depths[0], ranks[0], valid[0] = -1, 0, -1, True
    # frontier entries: [score, depth, parent node, rank, parent score]
    frontier = [[lq[0, 0], 1, 0, 0, np.float32(0.0)]] if depth > 0 and k > 0 else []
    for node in range(1, n):
        live = [e for e in frontier if e[0] > -np.inf]
        if not live:
            break
        best = max(live, key=lambda e: (e[0], -e[1], -e[2], -e[3]))
        score, d, parent, r, pscore = best
        tokens[node], parents[node], depths[node] = toks[d - 1][r], parent, d
        scores[node], ranks[node], valid[node] = score, r, True
        frontier.remove(best)
        if r + 1 < k:
            frontier.append([np.float32(pscore + lq[d - 1, r + 1]), d, parent, r + 1, pscore])
        if d < depth:
            frontier.append([np.float32(score + lq[d, 0]), d + 1, node, 0, score])
    dev = draft_logprobs.device
    as_long = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
    return (as_long(tokens), as_long(parents), as_long(depths),
            torch.tensor(np.array(scores, dtype=np.float32), device=dev), as_long(ranks),
            torch.tensor(valid, dtype=torch.bool, device=dev))
