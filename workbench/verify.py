"""Verification: the recurrent-modes switch the hybrid layers call, the sampler, and the walk.

Recurrent modes (tree-recurrence.md) for verifying a tree through a recurrent layer:

    fork    exact and fast: ancestor-masked WY form, a small stash, no per-node states
    unsafe  flattened order: each node inherits the state of the node before it (the leak)
    paths   oracle: each root-to-leaf path run as its own chain from the committed state
    slots   serving-engine baseline: one state copy per node, each child from its parent

Sampling is Gumbel-max with noise keyed on (seed, absolute position, token id) by an integer
hash, so a committed token is an exact sample from softmax(logits / T) given its prefix and,
for a fixed seed, every lossless method produces the very text AR sampling produces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import tree_kernels as tk
from tree_kernels.tree_conv import naive as conv_naive
from tree_kernels.tree_gdn import naive as gdn_naive

from .tree import CompiledTree, Tree, follow

RECURRENT_MODES = ("fork", "unsafe", "paths", "slots")
CHAIN_CHUNK = 64  # long chains (prefill) run fork chunk by chunk, one tree of <= 64 nodes each


def check_mode(mode: str) -> str:
    if mode not in RECURRENT_MODES:
        raise ValueError(f"recurrent mode {mode!r}: expected one of {', '.join(RECURRENT_MODES)}")
    return mode


# ----------------------------------------------------------------------------------------------
# recurrent layers on a tree


class PendingRecurrence:
    """What a recurrent layer keeps from a verify pass until the walk says which node to commit."""

    def commit(self, path: list[int]) -> torch.Tensor:  # state after path[-1]
        raise NotImplementedError

    def node_states(self) -> torch.Tensor:  # [T, HV, dk, dv], for diagnostics
        raise NotImplementedError


@dataclass
class _StashPending(PendingRecurrence):
    """fork / unsafe: commit from the (k, u, G) stash of each chunk."""

    stashes: list[gdn_naive.TreeGDNStash]
    start_states: list[torch.Tensor]
    starts: list[int]
    anc: torch.Tensor  # ancestor mask the stash was solved with (chain for unsafe)
    flat: bool  # unsafe: the committed state is the flattened-order state at the node

    def commit(self, path: list[int]) -> torch.Tensor:
        last = int(path[-1])
        if self.flat or len(self.stashes) > 1:
            # the state at `last` in the order the stash was built: everything before it in flat order
            c = max(i for i, s in enumerate(self.starts) if s <= last)
            local = list(range(0, last - self.starts[c] + 1))
            return tk.tree_gdn_commit(self.stashes[c], self.start_states[c], local)
        return tk.tree_gdn_commit(self.stashes[0], self.start_states[0], path)

    def node_states(self) -> torch.Tensor:
        parts = []
        for c, stash in enumerate(self.stashes):
            end = self.starts[c + 1] if c + 1 < len(self.starts) else self.anc.shape[0]
            a = self.anc[self.starts[c] : end, self.starts[c] : end]
            parts.append(gdn_naive.tree_gdn_node_states(stash, self.start_states[c], a))
        return torch.cat(parts)


@dataclass
class _StatesPending(PendingRecurrence):
    """paths / slots: every node's state is already there."""

    states: torch.Tensor

    def commit(self, path: list[int]) -> torch.Tensor:
        return self.states[int(path[-1])]

    def node_states(self) -> torch.Tensor:
        return self.states


def tree_recurrence(mode, q, k, v, g, beta, state, tree: CompiledTree, scale=None):
    """Gated delta rule over the tree's nodes in the given mode. Returns (o fp32, pending)."""
    if mode == "paths":
        o, states = gdn_naive.tree_gdn_paths(q, k, v, g, beta, state, tree.parents, scale)
        return o, _StatesPending(states)
    if mode == "slots":
        o, states = gdn_naive.tree_gdn_slots(q, k, v, g, beta, state, tree.parents, tree.depths, scale)
        return o, _StatesPending(states)
    check_mode(mode)
    flat = mode == "unsafe"
    anc = tree.flattened().anc if flat else tree.anc
    n = tree.size
    if (tree.is_chain or flat) and n > CHAIN_CHUNK:
        outs, stashes, starts, start_states = [], [], [], []
        s = state
        for lo in range(0, n, CHAIN_CHUNK):
            hi = min(n, lo + CHAIN_CHUNK)
            o, stash = tk.tree_gdn_fork(q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi], beta[lo:hi], s, anc[lo:hi, lo:hi], scale)
            outs.append(o)
            stashes.append(stash)
            starts.append(lo)
            start_states.append(s)
            s = tk.tree_gdn_commit(stash, s, list(range(hi - lo)))
        return torch.cat(outs), _StashPending(stashes, start_states, starts, anc, True)
    o, stash = tk.tree_gdn_fork(q, k, v, g, beta, state, anc, scale)
    return o, _StashPending([stash], [state], [0], anc, flat)


def tree_conv(mode, x, conv_state, weight, bias, tree: CompiledTree, activation="silu"):
    """Short causal conv over the tree's nodes: tree-aware in all modes but unsafe."""
    if mode == "paths":
        return conv_naive.tree_conv1d_paths(x, conv_state, weight, bias, tree.parents, activation)
    view = tree.flattened() if mode == "unsafe" else tree
    return tk.tree_conv1d(x, conv_state, weight, bias, view.conv_table(weight.shape[-1]), activation)


def conv_commit_path(mode: str, path: list[int]) -> list[int]:
    """The inputs whose conv state survives a commit: the path, or everything before it in unsafe."""
    return list(range(int(path[-1]) + 1)) if mode == "unsafe" else list(path)


# ----------------------------------------------------------------------------------------------
# sampling

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors holding values < 2**32 (no int64 overflow:
    both multipliers are < 2**31)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def gumbel_noise(seed: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [len(positions), vocab], a pure function of (seed, position, token)."""
    device = positions.device
    s = _mix32(torch.tensor(int(seed) & _M32, dtype=torch.int64, device=device) ^ 0x2545F491)
    h = _mix32(s ^ (positions.to(torch.int64) & _M32))  # [N]
    ids = torch.arange(vocab, dtype=torch.int64, device=device)
    bits = _mix32(_mix32(h[:, None] ^ ids[None, :]) ^ 0x68E31DA4)
    u = (bits.double() + 0.5) / 4294967296.0  # in (0, 1), never 0 or 1
    return (-torch.log(-torch.log(u))).float()


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or math.isnan(t) or t < 0 or math.isinf(t):
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")

    def choose(self, logits: torch.Tensor, next_positions: torch.Tensor) -> torch.Tensor:
        """The token each row picks for the position ``next_positions[row]``. [N] int64."""
        if self.temperature == 0:
            return torch.argmax(logits, dim=-1)
        # siblings share a position: draw each position's noise once
        unique, inverse = torch.unique(next_positions, return_inverse=True)
        noise = gumbel_noise(self.seed, unique, logits.shape[-1])[inverse]
        return torch.argmax(logits.float() / self.temperature + noise, dim=-1)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution ``choose`` samples from (T > 0), for tests and diagnostics."""
        return torch.softmax(logits.float() / self.temperature, dim=-1)


class NonFiniteLogitsError(FloatingPointError):
    pass


def check_finite(logits: torch.Tensor, what: str, round_index: int) -> None:
    if not bool(torch.isfinite(logits).all()):
        rows = torch.nonzero(~torch.isfinite(logits).all(dim=-1)).flatten().tolist()
        raise NonFiniteLogitsError(
            f"round {round_index}: {what} logits contain NaN or inf (rows {rows[:8]}{'...' if len(rows) > 8 else ''}); "
            "stopping instead of walking them"
        )


def walk(tree: Tree, compiled: CompiledTree, logits: torch.Tensor, sampler: Sampler) -> tuple[list[int], int, list[int]]:
    """Target choices at every node (one batched pick, one host sync), then follow them.

    Returns (accepted node ids with the root first, bonus token, choices per node).
    """
    choices = sampler.choose(logits, compiled.positions + 1).tolist()
    accepted, bonus = follow(tree, choices)
    return accepted, bonus, choices


# ----------------------------------------------------------------------------------------------
# the model-level oracle


@torch.no_grad()
def sequential_tree_logits(target, cache, tree: Tree) -> torch.Tensor:
    """Obviously exact tree logits: decode every root-to-leaf path token by token from its own
    copy of the committed cache. [N, V]. Slow; what tests and diagnostics compare against."""
    logits = [None] * len(tree)
    for leaf in tree.leaves():
        branch = cache.clone()
        for n in tree.path_to(leaf):
            out = target.run_chain([tree.tokens[n]], branch)
            if logits[n] is None:
                logits[n] = out.logits[-1]
    return torch.stack(logits)
