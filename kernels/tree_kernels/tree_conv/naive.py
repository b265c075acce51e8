"""Short causal depthwise conv1d on a draft tree: plain-torch references.

Shapes (batch 1, tokens first):
    x           [T, C]      inputs of the tree nodes (flat order)
    conv_state  [C, W-1]    the last W-1 committed inputs, oldest first
    weight      [C, W]      depthwise kernel, last tap = the current token
    index       [T, W]      gather table from workbench.tree.conv_gather_table:
                            node ids >= 0, committed inputs as -1 (newest), -2, ...
The window of node n is its last W ancestors-or-self, oldest first, continuing into the
committed state past the root. Output keeps x's dtype; the product is taken in weight's
dtype, as the models do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["tree_conv1d", "tree_conv_commit", "tree_conv1d_paths", "conv1d_decode_step"]


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation in (None, "identity"):
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise ValueError(f"unsupported conv activation {activation!r}")


def tree_conv1d(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    index: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    width = weight.shape[-1]
    if index.shape != (x.shape[0], width) or conv_state.shape != (x.shape[1], width - 1):
        raise ValueError(
            f"tree_conv1d: x {tuple(x.shape)}, conv_state {tuple(conv_state.shape)}, "
            f"weight {tuple(weight.shape)}, index {tuple(index.shape)} do not fit"
        )
    # rows 0..W-2 hold the committed state, row W-1+n holds node n: offset -j -> row W-1-j
    history = torch.cat([conv_state.t(), x], dim=0).to(weight.dtype)
    windows = history[index + (width - 1)]  # [T, W, C]
    y = torch.einsum("twc,cw->tc", windows, weight)
    if bias is not None:
        y = y + bias
    return _activate(y, activation).to(x.dtype)


def tree_conv_commit(x: torch.Tensor, conv_state: torch.Tensor, path: list[int] | torch.Tensor) -> torch.Tensor:
    """Conv state after accepting ``path``: the last W-1 inputs along it (state first if short)."""
    path = torch.as_tensor(path, dtype=torch.int64, device=x.device)
    keep = conv_state.shape[1]
    if keep == 0:
        return conv_state.clone()
    history = torch.cat([conv_state.t(), x[path].to(conv_state.dtype)], dim=0)
    return history[-keep:].t().contiguous()


def conv1d_decode_step(x, conv_state, weight, bias=None, activation: str | None = "silu"):
    """One committed token (T = 1): (y [1, C], next conv state [C, W-1]), i.e. the tree conv of a
    one-node tree and the commit of its root, as one step."""
    width = weight.shape[-1]
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"conv1d_decode_step: x must be one token [1, C], got {tuple(x.shape)}")
    index = torch.arange(width, device=x.device)[None] - (width - 1)  # the state's columns, then the token
    return tree_conv1d(x, conv_state, weight, bias, index, activation), tree_conv_commit(x, conv_state, [0])


def tree_conv1d_paths(x, conv_state, weight, bias, parents, activation="silu"):
    """Oracle: a plain causal conv1d (F.conv1d) over each root-to-leaf path."""
    par = [int(p) for p in torch.as_tensor(parents).tolist()]
    t, c = x.shape
    width = weight.shape[-1]
    out = torch.empty(t, c, dtype=x.dtype, device=x.device)
    has_child = [False] * t
    for p in par:
        if p >= 0:
            has_child[p] = True
    for leaf in (n for n in range(t) if not has_child[n]):
        path, n = [], leaf
        while n >= 0:
            path.append(n)
            n = par[n]
        path.reverse()
        seq = torch.cat([conv_state, x[path].t().to(conv_state.dtype)], dim=1).to(weight.dtype)  # [C, W-1+P]
        y = F.conv1d(seq[None], weight[:, None, :], bias, groups=c)[0]  # [C, P]
        out[path] = _activate(y.t(), activation).to(x.dtype)
    return out
