"""Gated delta rule on a draft tree: plain-torch references.

Shapes (batch 1, tokens first):
    q, k      [T, H, dk]   key heads H (already l2-normalised if the model does that)
    v         [T, HV, dv]  value heads HV = H * r; value head j reads key head j // r
    g, beta   [T, HV]      log decay (<= 0) and write strength
    state     [HV, dk, dv] fp32, the committed recurrent state S0
    anc       [T, T] bool  ancestor-or-self mask (topological order)
    parents   [T] int64    -1 = the committed prefix

Recurrence along a root-to-node path (tree-recurrence.md):
    S_n = a_n S_p + k_n u_n^T,  u_n = beta_n (v_n - a_n S_p^T k_n),  o_n = S_n^T (scale q_n)

Four ways to run it on a tree, all here:
    tree_gdn_fork    exact, ancestor-masked WY/UT form; no per-node states, a small stash (k, u, G)
    tree_gdn_paths   oracle: every root-to-leaf path as its own sequential chain
    tree_gdn_slots   serving-engine baseline: one state per node, level by level
    (unsafe = tree_gdn_fork on the flattened chain; the model layer makes that substitution)
Everything is computed in fp32 (fp64 inputs stay fp64); outputs come back in that dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "TreeGDNStash",
    "tree_gdn_fork",
    "tree_gdn_commit",
    "tree_gdn_node_states",
    "tree_gdn_paths",
    "tree_gdn_slots",
    "gdn_step",
    "gdn_chain_sequential",
    "gdn_decode_step",
]


@dataclass
class TreeGDNStash:
    """What `fork` keeps per node to commit any node's state later: T * (dk + dv + 1) per head."""

    k: torch.Tensor  # [T, HV, dk] fp32 (key per value head)
    u: torch.Tensor  # [T, HV, dv] fp32 (the solved corrections)
    G: torch.Tensor  # [T, HV] fp32 (log decay summed over ancestors-or-self)


def check_stash_out(stash_out: TreeGDNStash, t: int, hv: int, dk: int, dv: int):
    """The (k, u, G) buffers a fork may write its stash into: contiguous fp32 of the stash's shapes."""
    want = {"k": (t, hv, dk), "u": (t, hv, dv), "G": (t, hv)}
    for name, shape in want.items():
        x = getattr(stash_out, name)
        if tuple(x.shape) != shape or x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError(f"tree_gdn_fork: stash_out.{name} must be a contiguous fp32 {shape} tensor, "
                             f"got {tuple(x.shape)} {x.dtype}")
    return stash_out.k, stash_out.u, stash_out.G


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    h = x.shape[1]
    if hv % h:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({h})")
    return x if h == hv else x.repeat_interleave(hv // h, dim=1)


def _prep(q, k, v, g, beta, scale):
    t, hv, dv = v.shape
    dk = q.shape[-1]
    if q.shape != k.shape or q.shape[0] != t or g.shape != (t, hv) or beta.shape != (t, hv):
        raise ValueError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"g {tuple(g.shape)}, beta {tuple(beta.shape)}"
        )
    scale = dk**-0.5 if scale is None else scale
    up = _compute_dtype(v)
    q = _expand_heads(q.to(up), hv) * scale
    k = _expand_heads(k.to(up), hv)
    return q, k, v.to(up), g.to(up), beta.to(up)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for half types, fp64 stays fp64 (tests use it to separate maths from rounding)."""
    return torch.promote_types(x.dtype, torch.float32)


def tree_gdn_fork(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    anc: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, TreeGDNStash]:
    """Exact tree outputs in one triangular solve per head. Returns (o [T, HV, dv], stash)."""
    q, k, v, g, beta = _prep(q, k, v, g, beta, scale)
    t = v.shape[0]
    S0 = state.to(v.dtype)
    ancf = anc.to(v.dtype)
    G = ancf @ g  # [T, HV]: path-summed log decay
    Gh = G.t()  # [HV, T]
    diff = Gh[:, :, None] - Gh[:, None, :]  # [HV, T, T]: G_n - G_m
    # G_n - G_m is meaningful only where m is an ancestor; elsewhere it may be positive and
    # overflow, so select before exp (never multiply an exp by the mask: inf * 0 = NaN)
    decay = torch.exp(torch.where(anc[None], diff, torch.full_like(diff, float("-inf"))))
    kh, qh, vh = k.transpose(0, 1), q.transpose(0, 1), v.transpose(0, 1)  # [HV, T, d]
    bh = beta.t()[:, :, None]  # [HV, T, 1]
    strict = anc & ~torch.eye(t, dtype=torch.bool, device=anc.device)
    L = torch.where(strict[None], bh * decay * (kh @ kh.transpose(1, 2)), torch.zeros_like(decay))
    eG = torch.exp(Gh)[:, :, None]  # [HV, T, 1]
    rhs = bh * (vh - eG * (kh @ S0))  # [HV, T, dv]
    eye = torch.eye(t, dtype=L.dtype, device=L.device)
    u = torch.linalg.solve_triangular(eye + L, rhs, upper=False, unitriangular=True)
    o = eG * (qh @ S0) + (decay * (qh @ kh.transpose(1, 2))) @ u
    return o.transpose(0, 1).contiguous(), TreeGDNStash(k=k, u=u.transpose(0, 1).contiguous(), G=G)


def tree_gdn_commit(stash: TreeGDNStash, state: torch.Tensor, path: list[int] | torch.Tensor) -> torch.Tensor:
    """State after the accepted node a = path[-1]: exp(G_a) S0 + sum_{m in path} exp(G_a - G_m) k_m u_m^T."""
    path = torch.as_tensor(path, dtype=torch.int64, device=stash.G.device)
    a = path[-1]
    w = torch.exp(stash.G[a][None, :] - stash.G[path])  # [P, HV]
    upd = torch.einsum("ph,phk,phv->hkv", w, stash.k[path], stash.u[path])
    return torch.exp(stash.G[a])[:, None, None] * state.to(upd.dtype) + upd


def tree_gdn_node_states(stash: TreeGDNStash, state: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
    """Every node's state from the stash, [T, HV, dk, dv] (diagnostics; fork itself never builds it)."""
    G = stash.G
    diff = G[:, None, :] - G[None, :, :]  # [T(n), T(m), HV]
    w = torch.exp(torch.where(anc[:, :, None], diff, torch.full_like(diff, float("-inf"))))
    upd = torch.einsum("nmh,mhk,mhv->nhkv", w, stash.k, stash.u)
    return torch.exp(G)[:, :, None, None] * state.to(upd.dtype)[None] + upd


def gdn_step(S, q, k, v, g, beta):
    """One step of the gated delta rule for a batch of independent states.

    S [B, HV, dk, dv]; q, k [B, HV, dk] (q already scaled); v [B, HV, dv]; g, beta [B, HV].
    Returns (o [B, HV, dv], S_new).
    """
    S = S * torch.exp(g)[..., None, None]
    kv_mem = torch.einsum("bhkv,bhk->bhv", S, k)
    u = beta[..., None] * (v - kv_mem)
    S = S + k[..., :, None] * u[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", S, q)
    return o, S


def gdn_decode_step(q, k, v, g, beta, state, scale=None):
    """One committed token (T = 1, the AR step): the output and the next state in one go, where a
    tree would fork and then commit. q, k [1, H, dk]; v [1, HV, dv]; g, beta [1, HV]; state
    [HV, dk, dv]. Returns (o [1, HV, dv], new state [HV, dk, dv]) in the compute dtype."""
    if v.dim() != 3 or v.shape[0] != 1:
        raise ValueError(f"gdn_decode_step takes one token, got v {tuple(v.shape)}")
    q, k, v, g, beta = _prep(q, k, v, g, beta, scale)
    if state.shape != (v.shape[1], q.shape[-1], v.shape[-1]):
        raise ValueError(f"state {tuple(state.shape)} does not fit HV={v.shape[1]}, dk={q.shape[-1]}, dv={v.shape[-1]}")
    o, S = gdn_step(state.to(v.dtype)[None], q, k, v, g, beta)
    return o, S[0]


def gdn_chain_sequential(q, k, v, g, beta, state, scale=None):
    """A plain chain, one token at a time (the textbook recurrence). Returns (o, states [T, ...])."""
    q, k, v, g, beta = _prep(q, k, v, g, beta, scale)
    S = state.to(v.dtype)[None]
    outs, states = [], []
    for i in range(v.shape[0]):
        o, S = gdn_step(S, q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1])
        outs.append(o[0])
        states.append(S[0])
    return torch.stack(outs), torch.stack(states)


def _leaves(parents: list[int]) -> list[int]:
    has_child = [False] * len(parents)
    for p in parents:
        if p >= 0:
            has_child[p] = True
    return [n for n, c in enumerate(has_child) if not c]


def tree_gdn_paths(q, k, v, g, beta, state, parents, scale=None):
    """Oracle: run every root-to-leaf path as its own chain from S0. Returns (o, states [T, HV, dk, dv])."""
    q, k, v, g, beta = _prep(q, k, v, g, beta, scale)
    par = [int(p) for p in torch.as_tensor(parents).tolist()]
    t, hv, dv = v.shape
    o_all = torch.empty(t, hv, dv, dtype=v.dtype, device=v.device)
    s_all = torch.empty(t, hv, q.shape[-1], dv, dtype=v.dtype, device=v.device)
    done = [False] * t
    for leaf in _leaves(par):
        path, n = [], leaf
        while n >= 0:
            path.append(n)
            n = par[n]
        path.reverse()
        S = state.to(v.dtype)[None]
        for n in path:
            o, S = gdn_step(S, q[n : n + 1], k[n : n + 1], v[n : n + 1], g[n : n + 1], beta[n : n + 1])
            if not done[n]:
                o_all[n], s_all[n], done[n] = o[0], S[0], True
    return o_all, s_all


def tree_gdn_slots(q, k, v, g, beta, state, parents, depths, scale=None):
    """Baseline: one full state per node; each depth level starts from its parents' stored states.

    Returns (o, slots [T, HV, dk, dv]). This is what serving engines do today; its cost is the
    T state copies, which `fork` avoids.
    """
    q, k, v, g, beta = _prep(q, k, v, g, beta, scale)
    parents = torch.as_tensor(parents, device=v.device)
    depths = torch.as_tensor(depths, device=v.device)
    t, hv, dv = v.shape
    o_all = torch.empty(t, hv, dv, dtype=v.dtype, device=v.device)
    slots = torch.empty(t, hv, q.shape[-1], dv, dtype=v.dtype, device=v.device)
    for d in range(int(depths.max()) + 1):
        nodes = torch.nonzero(depths == d).flatten()
        par = parents[nodes]
        S_parent = torch.where(
            (par >= 0)[:, None, None, None], slots[par.clamp(min=0)], state.to(v.dtype)[None].expand(len(nodes), -1, -1, -1)
        )
        o, S = gdn_step(S_parent, q[nodes], k[nodes], v[nodes], g[nodes], beta[nodes])
        o_all[nodes], slots[nodes] = o, S
    return o_all, slots
