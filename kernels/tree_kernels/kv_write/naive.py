"""Writing a verify pass's new K/V rows into the cache buffers at a device offset: the reference.

Shapes: buffers k_buf, v_buf [capacity, Hkv, D]; new rows k, v [T, Hkv, D]; start a device scalar
(the committed length). Rows start .. start + T - 1 of both buffers take the new rows, in place;
the host never learns ``start`` (CUDA-graph capturable). After the walk, ``kv_commit_static``
moves the accepted path's rows to sit contiguously after the prefix.
"""

from __future__ import annotations

import torch

__all__ = ["kv_commit_static", "kv_write_static"]


def kv_write_static(k_buf: torch.Tensor, v_buf: torch.Tensor, start: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if k.shape != v.shape or k.shape[1:] != k_buf.shape[1:] or v_buf.shape != k_buf.shape:
        raise ValueError(f"kv_write_static: k {tuple(k.shape)}, v {tuple(v.shape)} do not fit buffers "
                         f"{tuple(k_buf.shape)} / {tuple(v_buf.shape)}")
    rows = start + torch.arange(k.shape[0], device=k.device)
    k_buf.index_copy_(0, rows, k.to(k_buf.dtype))
    v_buf.index_copy_(0, rows, v.to(v_buf.dtype))


def kv_commit_static(k_buf: torch.Tensor, v_buf: torch.Tensor, start: torch.Tensor, path: torch.Tensor,
                     count: torch.Tensor) -> None:
    """Keep the accepted rows: rows start + path[i] move to start + i for the first ``count``
    slots of the padded ``path`` (device tensors, no host sync); every other row stays as it was.

    In place. The accepted path is in topological order from the root (path[i] >= i), and every
    source row is gathered before any is written."""
    if path.dim() != 1:
        raise ValueError(f"kv_commit_static: path must be 1-D, got shape {tuple(path.shape)}")
    slots = torch.arange(path.shape[0], device=path.device)
    src = start + torch.where(slots < count, path, slots)  # a slot past count copies itself
    dst = start + slots
    k_buf.index_copy_(0, dst, k_buf[src])
    v_buf.index_copy_(0, dst, v_buf[src])
