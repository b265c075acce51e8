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

import contextlib
import math
import os
from dataclasses import dataclass

import torch
import tree_kernels as tk
from tree_kernels import static as static_kernels
from tree_kernels.tree_conv import naive as conv_naive
from tree_kernels.tree_gdn import naive as gdn_naive

from .tree import CompiledTree, Tree, follow

RECURRENT_MODES = ("fork", "unsafe", "paths", "slots")
# long chains (prefill, and unsafe's flattened trees) run fork chunk by chunk, one chain of <= 65 nodes
# each: the kernel peels the first node (an ancestor of the rest), so 65 is 4 blocks of 16
CHAIN_CHUNK = 65

# A one-node tree (the AR step) in fork / unsafe takes the one-launch decode step (the state read
# once, no stash) instead of fork + commit: on by default since its H200 measurement (2026-12-03,
# 27B dims, bench.e2e --decode-step side by side: AR step 16.37 ms against 17.24 ms; the kernel
# 7.6 us against 30.6 us for fork + commit, cold graph). WORKBENCH_GDN_DECODE_STEP=0 or
# use_gdn_decode_step(False) turns it off.
_decode_step = os.environ.get("WORKBENCH_GDN_DECODE_STEP", "1").lower() in ("1", "true", "on", "yes")


def gdn_decode_step_enabled() -> bool:
    return _decode_step


@contextlib.contextmanager
def use_gdn_decode_step(enabled: bool = True):
    global _decode_step
    old, _decode_step = _decode_step, bool(enabled)
    try:
        yield
    finally:
        _decode_step = old


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

    def commit_static(self, path: torch.Tensor, count: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``commit`` for a padded device path with ``count`` valid slots (no host sync). With
        ``out`` (the committed state itself), the kernel may write in place: check the result."""
        if not self.flat and len(self.stashes) == 1:
            return static_kernels.tree_gdn_commit_static(self.stashes[0], self.start_states[0], path, count, out)
        # flattened order: the state at the last node counts everything before it in flat order;
        # every chunk proposes its candidate and the one holding the last node is taken
        last = path.gather(0, (count - 1).reshape(1))[0]
        candidates = []
        for c, stash in enumerate(self.stashes):
            n = stash.G.shape[0]
            local = torch.arange(n, device=path.device)
            valid = (self.starts[c] + local) <= last
            candidates.append(static_kernels.tree_gdn_commit_padded(stash, self.start_states[c], local, valid))
        chunk = torch.div(last, CHAIN_CHUNK, rounding_mode="floor")  # chunks start at multiples of CHAIN_CHUNK
        return torch.stack(candidates).index_select(0, chunk.reshape(1))[0]

    def node_states(self) -> torch.Tensor:
        parts = []
        for c, stash in enumerate(self.stashes):
            end = self.starts[c + 1] if c + 1 < len(self.starts) else self.anc.shape[0]
            a = self.anc[self.starts[c] : end, self.starts[c] : end]
            parts.append(gdn_naive.tree_gdn_node_states(stash, self.start_states[c], a))
        return torch.cat(parts)


@dataclass
class _StepPending(PendingRecurrence):
    """A one-node tree run by the decode step: the only state to commit is already computed."""

    next_state: torch.Tensor  # [HV, dk, dv]

    def commit(self, path: list[int]) -> torch.Tensor:
        if [int(n) for n in path] != [0]:
            raise ValueError(f"a one-node tree commits path [0], got {list(path)}")
        return self.next_state

    def commit_static(self, path: torch.Tensor, count: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.next_state  # the walk of a one-node tree always accepts its root

    def node_states(self) -> torch.Tensor:
        return self.next_state[None]


@dataclass
class _StatesPending(PendingRecurrence):
    """paths / slots: every node's state is already there."""

    states: torch.Tensor

    def commit(self, path: list[int]) -> torch.Tensor:
        return self.states[int(path[-1])]

    def commit_static(self, path: torch.Tensor, count: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.states.index_select(0, path.gather(0, (count - 1).reshape(1)))[0]

    def node_states(self) -> torch.Tensor:
        return self.states


def pending_uses_stash(pending: PendingRecurrence | None, stash: gdn_naive.TreeGDNStash) -> bool:
    """Whether a fork's pending commit reads exactly ``stash`` (the buffers it was asked to write)."""
    return (isinstance(pending, _StashPending) and not pending.flat and len(pending.stashes) == 1
            and pending.stashes[0].k is stash.k and pending.stashes[0].u is stash.u and pending.stashes[0].G is stash.G)


def tree_recurrence(mode, q, k, v, g, beta, state, tree: CompiledTree, scale=None, stash_out=None):
    """Gated delta rule over the tree's nodes in the given mode. Returns (o fp32, pending).

    ``stash_out``: buffers a single-stash fork writes its stash into (RecurrentStack); the other
    routes ignore it (``pending_uses_stash`` tells which happened)."""
    if tree.commit_in_forward:  # that step takes its gates in the same launch: gdn_decode_in_place
        raise ValueError("a commit_in_forward tree goes through gdn_decode_in_place (raw q, k, b, a), not tree_recurrence")
    if mode == "paths":
        o, states = gdn_naive.tree_gdn_paths(q, k, v, g, beta, state, tree.parents, scale)
        return o, _StatesPending(states)
    if mode == "slots":
        o, states = gdn_naive.tree_gdn_slots(q, k, v, g, beta, state, tree.parents, tree.depths, scale)
        return o, _StatesPending(states)
    check_mode(mode)
    n = tree.size
    if n == 1 and _decode_step:  # the AR step: fork and unsafe are the same one-token recurrence
        o, next_state = tk.gdn_decode_step(q, k, v, g, beta, state, scale)
        return o, _StepPending(next_state)
    flat = mode == "unsafe"
    anc = tree.flattened().anc if flat else tree.anc
    if (tree.is_chain or flat) and n > CHAIN_CHUNK:
        outs, stashes, starts, start_states = [], [], [], []
        s = state
        for lo in range(0, n, CHAIN_CHUNK):
            hi = min(n, lo + CHAIN_CHUNK)
            o, stash = tk.tree_gdn_fork(q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi], beta[lo:hi], s, anc[lo:hi, lo:hi], scale,
                                        rooted=True)  # a slice of a chain
            outs.append(o)
            stashes.append(stash)
            starts.append(lo)
            start_states.append(s)
            s = tk.tree_gdn_commit(stash, s, torch.arange(hi - lo, device=v.device))
        return torch.cat(outs), _StashPending(stashes, start_states, starts, anc, True)
    # the flattened order is a chain: rooted whatever the tree
    extra = {"stash_out": stash_out} if stash_out is not None and not flat else {}
    o, stash = tk.tree_gdn_fork(q, k, v, g, beta, state, anc, scale, rooted=flat or tree.rooted, **extra)
    return o, _StashPending([stash], [state], [0], anc, flat)


def gdn_decode_in_place(mode, q, k, v, b, a, A_log, dt_bias, state, tree: CompiledTree, scale=None):
    """The fast path's AR step (``tree.commit_in_forward``) from the raw q, k, b, a: the gates and
    the one-token recurrence in one launch, the state updated in place. Returns (o fp32, None):
    nothing pends, the state is committed."""
    _check_commit_in_forward(mode, tree)
    o, _ = tk.gdn_decode_step_gated(q, k, v, b, a, A_log, dt_bias, state, scale, out=state)
    return o, None


def _check_commit_in_forward(mode: str, tree: CompiledTree) -> None:
    if tree.size != 1 or mode not in ("fork", "unsafe"):
        raise ValueError(f"commit_in_forward is for one-node trees in fork / unsafe, got {tree.size} nodes in {mode!r}")


def tree_conv(mode, x, conv_state, weight, bias, tree: CompiledTree, activation="silu", x_out=None):
    """Short causal conv over the tree's nodes: tree-aware in all modes but unsafe. ``x_out``
    (fork / unsafe): also keep the inputs there (RecurrentStack's buffers)."""
    if tree.commit_in_forward:  # the fast path's AR step: the window moves in place
        _check_commit_in_forward(mode, tree)
        return tk.conv1d_decode_step(x, conv_state, weight, bias, activation, out=conv_state)[0]
    if mode == "paths":
        return conv_naive.tree_conv1d_paths(x, conv_state, weight, bias, tree.parents, activation)
    view = tree.flattened() if mode == "unsafe" else tree
    extra = {"x_out": x_out} if x_out is not None else {}
    return tk.tree_conv1d(x, conv_state, weight, bias, view.conv_table(weight.shape[-1]), activation, **extra)


def tree_conv_gates(mode, x, conv_state, weight, tree: CompiledTree, b, a, A_log, dt_bias, key_dim: int, dk: int, x_out=None):
    """A GDN layer's tree conv (SiLU) and gates: (l2-normed q, k [T, H, dk], v [T, value_dim], beta, g).
    fork / unsafe: one launch on the fused Triton route (tk.tree_conv1d_gdn_gates); paths: the
    per-path oracle conv, then the gates."""
    if mode == "paths":
        return tk.gdn_gates_of_conv(tree_conv(mode, x, conv_state, weight, None, tree), b, a, A_log, dt_bias, key_dim, dk)
    view = tree.flattened() if mode == "unsafe" else tree
    return tk.tree_conv1d_gdn_gates(x, conv_state, weight, view.conv_table(weight.shape[-1]), b, a, A_log, dt_bias,
                                    key_dim, dk, x_out=x_out)


def conv_commit_static(mode: str, x, conv_state, path: torch.Tensor, count: torch.Tensor, out=None) -> torch.Tensor:
    return static_kernels.conv_commit_static(mode == "unsafe", x, conv_state, path, count, out)


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


def _mix32_int(x: int) -> int:
    """_mix32 on a Python int (the seed is mixed on the host: no tensor is created for it)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def gumbel_noise(seed: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [len(positions), vocab], a pure function of (seed, position, token)."""
    device = positions.device
    s = _mix32_int((int(seed) & _M32) ^ 0x2545F491)
    h = _mix32((positions.to(torch.int64) & _M32) ^ s)  # [N]
    ids = torch.arange(vocab, dtype=torch.int64, device=device)
    bits = _mix32(_mix32(h[:, None] ^ ids[None, :]) ^ 0x68E31DA4)
    u = (bits.double() + 0.5) / 4294967296.0  # in (0, 1), never 0 or 1
    return (-torch.log(-torch.log(u))).float()


def hash_uniform(seed: int, *keys: torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1), a pure function of the seed and integer key tensors (broadcast).

    Device-agnostic and graph-capturable: how the oracle drafter draws its "randomness"."""
    h = _mix32_int((int(seed) & _M32) ^ 0x1B873593)
    out = None
    for key in keys:
        x = (key.to(torch.int64) & _M32) ^ (h if out is None else out)
        out = _mix32(_mix32(x) ^ 0x68E31DA4)
    return (out.double() + 0.5) / 4294967296.0


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


# ----------------------------------------------------------------------------------------------
# static-shape walk for the device fast path


def choose_static(sampler: Sampler, logits: torch.Tensor, depths: torch.Tensor, next_base: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``Sampler.choose`` with no host sync: noise drawn for positions next_base + 0..max_depth and
    gathered by node depth (siblings share a position, so they share the noise)."""
    if sampler.temperature == 0:
        return torch.argmax(logits, dim=-1)
    positions = next_base + torch.arange(max_depth + 1, device=logits.device)
    noise = gumbel_noise(sampler.seed, positions, logits.shape[-1])[depths]
    return torch.argmax(logits.float() / sampler.temperature + noise, dim=-1)


@dataclass
class StaticWalk:
    path: torch.Tensor  # [max_depth + 1] node ids along the accepted path (slots past count: 0)
    count: torch.Tensor  # [] accepted nodes including the root (1..max_depth + 1)
    bonus: torch.Tensor  # [] the target's choice at the last accepted node
    last: torch.Tensor  # [] the last accepted node


def walk_static(tokens, parents, depths, valid, anc, choices, max_depth: int) -> StaticWalk:
    """The walk as tensor ops: a node is accepted when it and all its ancestors match the
    target's choice at their parent. Siblings carry distinct tokens, so the accepted set is a
    path; its deepest node is the last accepted one. One Triton launch where Triton runs
    (tree_kernels.tree_walk), else the torch reference."""
    path, count, bonus, last = tk.tree_walk(tokens, parents, depths, valid, anc, choices, max_depth)
    return StaticWalk(path=path, count=count, bonus=bonus, last=last)
