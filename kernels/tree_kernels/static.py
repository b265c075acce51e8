"""Static-shape variants for the device fast path (CUDA-graph capturable: no host syncs, no
data-dependent shapes). Same maths as the references in tree_<op>/naive.py, which they are
tested against; the prefix length and the accepted path arrive as device tensors.
"""

from __future__ import annotations

import torch

from .backend import Switch, use_triton
from .tree_gdn.naive import TreeGDNStash

_TRITON_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def tree_visibility_static(anc, prefix_t, capacity: int, positions=None, window: int | None = None):
    """[T, capacity] bool over the whole cache buffer: prefix rows, then the tree rows at prefix_t."""
    t = anc.shape[0]
    j = torch.arange(capacity, device=anc.device)
    rel = j - prefix_t
    in_tree = (rel >= 0) & (rel < t)
    relc = rel.clamp(0, t - 1)
    visible = (j < prefix_t)[None, :] | (anc[:, relc] & in_tree[None, :])
    if window is not None:
        key_pos = torch.where(in_tree, positions[relc], j)
        visible = visible & ((positions[:, None] - key_pos[None, :]) < window)
    return visible


def kv_write_static(k_buf, v_buf, start, k, v) -> None:
    """The new K/V rows into the cache buffers at the device offset ``start``, in place."""
    if use_triton(k) and k.dtype in _TRITON_FLOATS and k_buf.is_contiguous() and v_buf.is_contiguous():
        from .kv_write import triton as impl

        return impl.kv_write_static(k_buf, v_buf, start, k, v)
    from .kv_write import naive

    return naive.kv_write_static(k_buf, v_buf, start, k, v)


# The KV commit in one launch (kv_write/triton.py). use_kv_commit_launch(False) or
# WORKBENCH_KV_COMMIT_LAUNCH=0: the torch gathers and index_copy_ (bench.e2e --fusion-variants compares them)
_kv_commit_launch = Switch("WORKBENCH_KV_COMMIT_LAUNCH")
kv_commit_launch_enabled, use_kv_commit_launch = _kv_commit_launch.enabled, _kv_commit_launch.use


def kv_commit_static(k_buf, v_buf, start, path, count) -> None:
    """After the walk: rows start + path[i] to start + i for the first ``count`` slots, in place."""
    if (_kv_commit_launch.on and use_triton(k_buf) and k_buf.dtype in _TRITON_FLOATS and k_buf.is_contiguous()
            and v_buf.is_contiguous()):
        from .kv_write import triton as impl

        return impl.kv_commit_static(k_buf, v_buf, start, path, count)
    from .kv_write import naive

    return naive.kv_commit_static(k_buf, v_buf, start, path, count)


def tree_attention_static(q, k_all, v_all, anc, prefix_t, scale=None, positions=None, window=None):
    """tree_attention over the full cache buffers [capacity, Hkv, D], masked by the device prefix length."""
    if use_triton(q) and q.dtype in _TRITON_FLOATS and q.shape[-1] <= 256:
        from .tree_attention import triton as impl

        return impl.tree_attention(q, k_all, v_all, anc, prefix_t, scale, positions, window)
    t, hq, d = q.shape
    cap, hkv, _ = k_all.shape
    scale = d**-0.5 if scale is None else scale
    group = hq // hkv
    kf = k_all.float().repeat_interleave(group, dim=1)
    vf = v_all.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), kf) * scale
    visible = tree_visibility_static(anc, prefix_t, cap, positions, window)
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, -1), vf).to(q.dtype)


def tree_gdn_commit_padded(stash: TreeGDNStash, state, path, valid):
    """State after the last valid slot of a padded path: exp(G_a) S0 + sum_valid exp(G_a - G_m) k_m u_m^T."""
    count = valid.sum()
    if use_triton(stash.G) and state.dtype in _TRITON_FLOATS and stash.k.dtype in _TRITON_FLOATS:
        from .tree_gdn import triton as impl

        return impl.tree_gdn_commit(stash, state, path, count=count.clamp(min=1))
    a = path.gather(0, (count - 1).clamp(min=0).reshape(1))
    Ga = stash.G.index_select(0, a)[0]  # [HV] (index_select: a 0-dim index would be read on the host)
    w = torch.where(valid[:, None], torch.exp(Ga[None, :] - stash.G[path]), torch.zeros_like(stash.G[path]))
    upd = torch.einsum("ph,phk,phv->hkv", w, stash.k[path], stash.u[path])
    return torch.exp(Ga)[:, None, None] * state.to(upd.dtype) + upd


def tree_gdn_commit_static(stash: TreeGDNStash, state, path, count, out=None):
    """State after the first ``count`` slots of a padded path (``count`` a device scalar >= 1).

    Triton writes into ``out`` (``state`` itself for an in-place commit); the torch reference
    returns a new tensor (the caller copies)."""
    if use_triton(stash.G) and state.dtype in _TRITON_FLOATS and stash.k.dtype in _TRITON_FLOATS:
        from .tree_gdn import triton as impl

        can_write = out is not None and out.dtype == torch.float32 and out.is_contiguous()
        return impl.tree_gdn_commit(stash, state, path, count=count, out=out if can_write else None)
    valid = torch.arange(path.shape[0], device=path.device) < count
    return tree_gdn_commit_padded(stash, state, path, valid)


def conv_commit_static(flat: bool, x, conv_state, path, count, out=None):
    """Conv state after a padded path: the last W-1 inputs along it (or, flat, up to its last node)."""
    keep = conv_state.shape[1]
    if keep == 0:
        return conv_state
    if use_triton(x) and x.dtype in _TRITON_FLOATS and keep <= 3:
        from .tree_conv import triton as impl

        if out is not None and not out.is_contiguous():
            out = None
        if flat:  # the flattened order up to the last accepted node
            last = path.gather(0, (count - 1).reshape(1))[0]
            return impl.tree_conv_commit(x, conv_state, torch.arange(x.shape[0], device=x.device), count=last + 1, out=out)
        return impl.tree_conv_commit(x, conv_state, path, count=count, out=out)
    offsets = torch.arange(keep, device=x.device)
    if flat:
        last = path.gather(0, (count - 1).reshape(1))[0]
        history = torch.cat([conv_state.t(), x.to(conv_state.dtype)], dim=0)
        rows = last + 1 + offsets
    else:
        history = torch.cat([conv_state.t(), x[path].to(conv_state.dtype)], dim=0)
        rows = count + offsets
    return history[rows].t()


def tree_gdn_commit_layers_static(stash: TreeGDNStash, states, path, count):
    """``tree_gdn_commit_static`` for L stacked layers (stash fields [L, T, ...], ``states``
    [L, HV, dk, dv]), in place: one launch on the Triton route; the reference commits the
    layers one after another."""
    if use_triton(stash.G) and states.dtype == torch.float32 and stash.k.dtype == torch.float32:
        from .tree_gdn import triton as impl

        return impl.tree_gdn_commit_layers(stash, states, path, count)
    for layer in range(states.shape[0]):
        one = TreeGDNStash(k=stash.k[layer], u=stash.u[layer], G=stash.G[layer])
        states[layer].copy_(tree_gdn_commit_static(one, states[layer], path, count))
    return states


def conv_commit_layers_static(x, conv_states, path, count):
    """``conv_commit_static`` (tree order) for L stacked layers (``x`` [L, T, C], ``conv_states``
    [L, C, W-1]), in place: one launch on the Triton route, else layer by layer."""
    if conv_states.shape[-1] == 0:
        return conv_states
    if use_triton(x) and x.dtype in _TRITON_FLOATS and conv_states.shape[-1] <= 3 and conv_states.is_contiguous():
        from .tree_conv import triton as impl

        return impl.tree_conv_commit_layers(x, conv_states, path, count)
    for layer in range(conv_states.shape[0]):
        conv_states[layer].copy_(conv_commit_static(False, x[layer], conv_states[layer], path, count))
    return conv_states
