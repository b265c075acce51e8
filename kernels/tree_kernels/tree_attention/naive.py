"""Attention of draft-tree nodes over the committed prefix plus the tree: plain-torch reference.

Shapes (batch 1, tokens first):
    q           [T, Hq, D]      one query per tree node
    k, v        [P + T, Hkv, D] cache rows: committed prefix 0..P-1, then the tree nodes
    anc         [T, T] bool     ancestor-or-self mask of the tree
    positions   [T] int64       attention positions of the nodes (P + depth)
Node n sees every prefix row and the tree rows of its ancestors-or-self. With ``window`` set,
a key is visible only if query_position - key_position < window (prefix row j sits at j).
GQA: query head h reads kv head h // (Hq // Hkv). Softmax in fp32, output in q's dtype.
"""

from __future__ import annotations

import torch

__all__ = ["tree_visibility", "tree_attention"]


def tree_visibility(
    anc: torch.Tensor, prefix_len: int, positions: torch.Tensor | None = None, window: int | None = None
) -> torch.Tensor:
    """[T, P + T] bool: which cache rows each node may attend to."""
    t = anc.shape[0]
    visible = torch.cat([torch.ones(t, prefix_len, dtype=torch.bool, device=anc.device), anc], dim=1)
    if window is not None:
        if positions is None:
            raise ValueError("a sliding window needs the node positions")
        key_pos = torch.cat([torch.arange(prefix_len, device=anc.device), positions])
        visible = visible & ((positions[:, None] - key_pos[None, :]) < window)
    return visible


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    anc: torch.Tensor,
    prefix_len: int,
    scale: float | None = None,
    positions: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    t, hq, d = q.shape
    s, hkv, _ = k.shape
    if s != prefix_len + t or v.shape[:2] != (s, hkv) or hq % hkv:
        raise ValueError(
            f"tree_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"prefix_len {prefix_len} do not fit"
        )
    scale = d**-0.5 if scale is None else scale
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)  # [S, Hq, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), kf) * scale
    visible = tree_visibility(anc, prefix_len, positions, window)
    scores = scores.masked_fill(~visible[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hts,shd->thd", probs, vf).to(q.dtype)
