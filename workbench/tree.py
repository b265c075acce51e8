"""Draft trees: the structure DDTree verifies, and the small pure functions around it.

Stages (each a pure function, no model anywhere in this file):

    build   draft per-depth top-k  -> Tree            (build_ddtree, build_chain, build_root_only)
    compile Tree + prefix length   -> CompiledTree    (positions, ancestor mask, bitmask, conv table)
    follow  Tree + target choices  -> accepted path   (follow)

Conventions. Node 0 is the root: the last bonus token, not yet in any cache. Nodes are in
pop order, which is topological (``parents[n] < n``); the root's parent is -1, meaning "the
committed prefix". A node at depth d sits at attention position ``prefix_len + d``; siblings
share a position.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch
import tree_kernels as tk

__all__ = [
    "Draft",
    "Tree",
    "CompiledTree",
    "build_ddtree",
    "build_chain",
    "build_root_only",
    "build_tree",
    "compile_tree",
    "compile_chain",
    "ancestor_mask",
    "ancestor_bitmask",
    "conv_gather_table",
    "follow",
]


@dataclass(frozen=True)
class Draft:
    """What a drafter proposes for one round: top-k candidates for each depth 1..L.

    ``tokens[d-1, r]`` is the rank-r candidate for depth d; ``logprobs`` is sorted descending
    along each row (log q_d of that candidate).
    """

    tokens: torch.Tensor  # [L, k] int64
    logprobs: torch.Tensor  # [L, k] float32

    def __post_init__(self):
        if self.tokens.shape != self.logprobs.shape or self.tokens.dim() != 2:
            raise ValueError(
                f"Draft tokens {tuple(self.tokens.shape)} and logprobs {tuple(self.logprobs.shape)} "
                "must both be [depth, k]"
            )

    @property
    def depth(self) -> int:
        return self.tokens.shape[0]

    @property
    def k(self) -> int:
        return self.tokens.shape[1]


@dataclass(frozen=True)
class Tree:
    """A draft tree in topological order. Plain Python lists: trees are small and built on CPU."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    scores: list[float]  # surrogate score: sum of draft log-probs along the path (root 0)
    ranks: list[int]  # rank of the node's token among its depth's candidates (root -1)
    _children: list[dict[int, int]] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def size(self) -> int:
        """Number of nodes including the root."""
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def children(self) -> list[dict[int, int]]:
        """children()[n] maps a token to the child of n that carries it (unique per parent)."""
        if self._children is None:
            kids: list[dict[int, int]] = [dict() for _ in self.tokens]
            for n in range(1, len(self.tokens)):
                kids[self.parents[n]][self.tokens[n]] = n
            object.__setattr__(self, "_children", kids)
        return self._children  # type: ignore[return-value]

    def path_to(self, node: int) -> list[int]:
        """Node ids from the root to ``node`` inclusive."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def leaves(self) -> list[int]:
        has_child = [False] * len(self.tokens)
        for n in range(1, len(self.tokens)):
            has_child[self.parents[n]] = True
        return [n for n, c in enumerate(has_child) if not c]

    def is_chain(self) -> bool:
        return all(p == n - 1 for n, p in enumerate(self.parents))

    def to_dict(self) -> dict:
        return {
            "tokens": list(self.tokens),
            "parents": list(self.parents),
            "depths": list(self.depths),
            "scores": [float(s) for s in self.scores],
            "ranks": list(self.ranks),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Tree":
        return cls(list(d["tokens"]), list(d["parents"]), list(d["depths"]), list(d["scores"]), list(d["ranks"]))

    @classmethod
    def from_parents(cls, tokens: list[int], parents: list[int]) -> "Tree":
        """A tree from explicit tokens and parents (tests, hand-made trees). Scores are 0."""
        depths = []
        for n, p in enumerate(parents):
            if n == 0 and p != -1:
                raise ValueError("node 0 must be the root (parent -1)")
            if n > 0 and not 0 <= p < n:
                raise ValueError(f"node {n} has parent {p}: parents must satisfy 0 <= parent < node")
            depths.append(0 if p < 0 else depths[p] + 1)
        return cls(list(tokens), list(parents), depths, [0.0] * len(tokens), [-1] + [0] * (len(tokens) - 1))


# ----------------------------------------------------------------------------------------------
# build


def _check_budget(budget: int) -> None:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an integer >= 1, got {budget!r}")


def build_ddtree(draft: Draft, budget: int, root_token: int) -> Tree:
    """DDTree best-first construction: exactly the top-``budget`` prefixes by surrogate score.

    A prefix is a tuple of ranks (r_1..r_d); its score is sum_d log q_d(candidate r_d). Pop the
    best prefix, emit it as a node, push its next sibling (same depth, rank + 1) and its first
    child (depth + 1, rank 0). Scores never rise along a path or along a sibling run, so the
    popped set is closed under parent and previous sibling: a tree. Ties go to the
    lexicographically smaller rank tuple (heap order on (-score, ranks)).
    """
    _check_budget(budget)
    depth, k = draft.tokens.shape
    tokens_at = draft.tokens.tolist()
    logq = draft.logprobs.double().tolist()
    tree_tokens, parents, depths, scores, ranks = [int(root_token)], [-1], [0], [0.0], [-1]
    if depth == 0 or k == 0:
        return Tree(tree_tokens, parents, depths, scores, ranks)
    # heap entries: (-score, rank tuple, parent node)
    heap: list[tuple[float, tuple[int, ...], int]] = [(-logq[0][0], (0,), 0)]
    while heap and len(tree_tokens) - 1 < budget:
        neg_score, prefix, parent = heapq.heappop(heap)
        d, r = len(prefix), prefix[-1]
        node = len(tree_tokens)
        tree_tokens.append(tokens_at[d - 1][r])
        parents.append(parent)
        depths.append(d)
        scores.append(-neg_score)
        ranks.append(r)
        if r + 1 < k:
            heapq.heappush(heap, (-(scores[parent] + logq[d - 1][r + 1]), prefix[:-1] + (r + 1,), parent))
        if d < depth:
            heapq.heappush(heap, (neg_score - logq[d][0], prefix + (0,), node))
    return Tree(tree_tokens, parents, depths, scores, ranks)


def build_chain(draft: Draft, root_token: int, length: int | None = None) -> Tree:
    """The DFlash chain: the rank-0 candidate at every depth (optionally only the first ``length``)."""
    depth = draft.depth if length is None else min(length, draft.depth)
    tokens = [int(root_token)] + [int(t) for t in draft.tokens[:depth, 0].tolist()]
    steps = draft.logprobs[:depth, 0].double().tolist()
    scores = [0.0]
    for s in steps:
        scores.append(scores[-1] + s)
    return Tree(tokens, list(range(-1, depth)), list(range(depth + 1)), scores, [-1] + [0] * depth)


def build_root_only(root_token: int) -> Tree:
    """Autoregressive decoding: a tree with nothing but the root."""
    return Tree([int(root_token)], [-1], [0], [0.0], [-1])


def build_tree(method: str, draft: Draft | None, root_token: int, budget: int) -> Tree:
    """One entry point for the three methods the engine runs."""
    if method == "ar":
        return build_root_only(root_token)
    if draft is None:
        raise ValueError(f"method {method!r} needs a draft")
    if method == "dflash":
        return build_chain(draft, root_token)
    if method == "ddtree":
        return build_ddtree(draft, budget, root_token)
    raise ValueError(f"unknown method {method!r}: expected 'ar', 'dflash' or 'ddtree'")


# ----------------------------------------------------------------------------------------------
# compile


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """anc[n, m] = m is an ancestor-or-self of n. [N, N] bool. Parents are topological."""
    n = parents.shape[0]
    anc = torch.zeros(n, n, dtype=torch.bool, device=parents.device)
    rows = torch.arange(n, device=parents.device)
    cur = rows.clone()
    alive = torch.ones(n, dtype=torch.bool, device=parents.device)
    # walk every node up one level per step: at most max_depth + 1 vectorised steps
    while bool(alive.any()):
        anc[rows[alive], cur[alive]] = True
        nxt = torch.where(alive, parents[cur.clamp(min=0)], torch.full_like(cur, -1))
        alive = nxt >= 0
        cur = nxt
    return anc


def ancestor_bitmask(anc: torch.Tensor) -> torch.Tensor:
    """Pack each ancestor row into int64 words: bit (m % 64) of word m // 64. [N, ceil(N/64)]."""
    n = anc.shape[0]
    words = (n + 63) // 64
    if anc.device.type == "cpu":
        import numpy as np

        packed = np.packbits(anc.numpy(), axis=1, bitorder="little")  # [N, ceil(N/8)] uint8
        packed = np.pad(packed, ((0, 0), (0, words * 8 - packed.shape[1])))
        return torch.from_numpy(packed.view("<i8").copy())
    padded = torch.zeros(n, words * 64, dtype=torch.int64, device=anc.device)
    padded[:, :n] = anc.to(torch.int64)
    bits = torch.ones(64, dtype=torch.int64, device=anc.device) << torch.arange(64, device=anc.device)
    # bit 63 is the sign bit: 1 << 63 wraps to -2**63, and the sum stays two's complement
    return (padded.view(n, words, 64) * bits).sum(-1)


def conv_gather_table(parents: torch.Tensor, width: int) -> torch.Tensor:
    """Window of a short causal conv on a tree: idx[n, W-1] = n, idx[n, W-2] = parent, ...

    Past the root the window continues into the committed conv state: -1 is the most recent
    committed input, -2 the one before, and so on (so ``idx + W - 1`` indexes the row of
    ``cat([conv_state.T, x])``). One Triton launch where Triton runs, else W - 1 gather steps
    (tree_kernels.conv_gather_table, tree_mask/naive.py).
    """
    return tk.conv_gather_table(parents, width)


@dataclass
class CompiledTree:
    """The tree as model inputs for one verify pass over ``prefix_len`` committed tokens."""

    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64, -1 = committed prefix
    depths: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64 = prefix_len + depth
    anc: torch.Tensor  # [N, N] bool, ancestor-or-self
    prefix_len: int
    is_chain: bool
    # device fast path: the prefix length as a device scalar; attention then reads the whole
    # cache buffer, masked by it, so shapes stay static across rounds (CUDA-graph capturable)
    prefix_t: torch.Tensor | None = None
    # the AR step of the fast path: a one-node tree whose root is accepted whatever it predicts, so
    # recurrent layers move their conv window and state in place during the forward and no commit
    # follows (attention's KV row is already where a commit would put it)
    commit_in_forward: bool = False
    # node 0 is an ancestor of every node (one root: every draft tree, every chain); lets the GDN
    # fork peel the root so that budget + 1 nodes still fit one dense block
    rooted: bool = False
    _conv_tables: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _bitmask: torch.Tensor | None = field(default=None, repr=False)
    _flat: "CompiledTree | None" = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def conv_table(self, width: int) -> torch.Tensor:
        if width not in self._conv_tables:
            self._conv_tables[width] = conv_gather_table(self.parents, width)
        return self._conv_tables[width]

    def bitmask(self) -> torch.Tensor:
        if self._bitmask is None:
            self._bitmask = ancestor_bitmask(self.anc)
        return self._bitmask

    def flattened(self) -> "CompiledTree":
        """The same tokens treated as a chain in flat order: what 'unsafe' recurrent layers see."""
        if self._flat is None:
            n = self.size
            self._flat = CompiledTree(
                self.tokens,
                torch.arange(-1, n - 1, device=self.device),
                torch.arange(n, device=self.device),
                self.positions,
                torch.ones(n, n, dtype=torch.bool, device=self.device).tril(),
                self.prefix_len,
                True,
                self.prefix_t,
                rooted=True,
            )
        return self._flat


def compile_tree(tree: Tree, prefix_len: int, device: torch.device | str = "cpu") -> CompiledTree:
    parents = torch.tensor(tree.parents, dtype=torch.int64, device=device)
    depths = torch.tensor(tree.depths, dtype=torch.int64, device=device)
    chain = tree.is_chain()
    anc = (
        torch.ones(len(tree), len(tree), dtype=torch.bool, device=device).tril()
        if chain
        else ancestor_mask(parents)
    )
    return CompiledTree(
        torch.tensor(tree.tokens, dtype=torch.int64, device=device),
        parents,
        depths,
        depths + prefix_len,
        anc,
        prefix_len,
        chain,
        rooted=len(tree) > 0,  # a Tree has one root, node 0 (from_parents refuses any other parent -1)
    )


def compile_chain(tokens: torch.Tensor | list[int], prefix_len: int, device: torch.device | str = "cpu") -> CompiledTree:
    """A run of tokens that all get committed (prefill, plain decode) as a degenerate tree."""
    tokens = torch.as_tensor(tokens, dtype=torch.int64, device=device).reshape(-1)
    n = tokens.shape[0]
    ar = torch.arange(n, device=tokens.device)
    return CompiledTree(
        tokens,
        ar - 1,
        ar,
        ar + prefix_len,
        torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril(),
        prefix_len,
        True,
        rooted=True,
    )


# ----------------------------------------------------------------------------------------------
# follow


def follow(tree: Tree, choices: list[int]) -> tuple[list[int], int]:
    """Walk the tree along the target's choices.

    ``choices[n]`` is the token the target picks after node n (argmax at T=0, a sample at T>0).
    From the root, move to the child carrying that token while one exists. Returns the accepted
    node ids (root first) and the bonus token: the first choice no child matches.
    """
    kids = tree.children()
    node, accepted = 0, [0]
    while True:
        token = int(choices[node])
        child = kids[node].get(token)
        if child is None:
            return accepted, token
        accepted.append(child)
        node = child


# ----------------------------------------------------------------------------------------------
# static-shape versions for the device fast path (no Python heap, no host sync, graph-capturable)


@dataclass
class StaticTree:
    """A tree of exactly ``budget + 1`` node slots as device tensors, in best-first order.

    ``valid`` marks real nodes (a slot is invalid only when the draft has too few finite
    candidates); invalid slots carry token 0 and never match a target choice.
    """

    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64, -1 for the root
    depths: torch.Tensor  # [N] int64
    scores: torch.Tensor  # [N] float32
    ranks: torch.Tensor  # [N] int64, -1 for the root
    valid: torch.Tensor  # [N] bool

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    def to_tree(self) -> Tree:
        """The host-side Tree (valid nodes only; for traces and tests)."""
        keep = self.valid.cpu()
        ids = torch.nonzero(keep).flatten().tolist()
        remap = {old: new for new, old in enumerate(ids)}
        par = self.parents.cpu().tolist()
        return Tree(
            [int(self.tokens[i]) for i in ids],
            [-1 if par[i] < 0 else remap[par[i]] for i in ids],
            [int(self.depths[i]) for i in ids],
            [float(self.scores[i]) for i in ids],
            [int(self.ranks[i]) for i in ids],
        )


def build_ddtree_static(draft_tokens: torch.Tensor, draft_logprobs: torch.Tensor, budget: int, root_token: torch.Tensor) -> StaticTree:
    """The top-``budget`` prefixes with static shapes, on whatever device the draft lives.

    A per-depth beam of width ``budget`` holds every prefix that can be in the global top
    set (a prefix's parent always scores at least as high). The global selection is a stable
    sort on score over (depth, beam) order, so ties go to the shallower prefix and every
    selected node's parent is selected. Same nodes in the same order as :func:`build_ddtree`
    when no scores tie (the host builder breaks ties by rank tuple instead).

    Where Triton runs, ``tree_kernels.tree_build`` instead: the best-first pops in one program
    (one launch where this costs ~9 kernels per depth), the same fp32 scores; ties go to the
    shallower prefix, then the earlier-emitted parent, then the lower rank.
    """
    _check_budget(budget)
    if tk.use_triton(draft_logprobs):  # one launch instead of ~9 kernels per depth
        return StaticTree(*tk.tree_build(draft_tokens, draft_logprobs, budget, root_token))
    depth, k = draft_logprobs.shape
    device = draft_logprobs.device
    b = budget
    neg_inf = torch.full((), float("-inf"), device=device)  # a fill, not a host copy (graph capture)
    logq = draft_logprobs.float()
    # depth 1: the first b candidates (padded with -inf when k < b)
    first = torch.full((b,), float("-inf"), device=device)
    first[: min(b, k)] = logq[0, : min(b, k)]
    beam_scores, beam_parent = [first], [torch.full((b,), -1, dtype=torch.int64, device=device)]
    ranks = torch.zeros(b, dtype=torch.int64, device=device)
    ranks[: min(b, k)] = torch.arange(min(b, k), device=device)
    beam_rank = [ranks]
    for d in range(1, depth):
        cand = (beam_scores[-1][:, None] + logq[d][None, :]).reshape(-1)  # [b * k]
        cand = torch.where(torch.isnan(cand), neg_inf, cand)
        if cand.shape[0] < b:
            cand = torch.cat([cand, neg_inf.expand(b - cand.shape[0])])
        top = torch.topk(cand, b, sorted=True)
        beam_scores.append(top.values)
        beam_parent.append(torch.div(top.indices, k, rounding_mode="floor").clamp(max=b - 1))
        beam_rank.append(top.indices % k)
    scores = torch.stack(beam_scores)  # [L, b]
    parent_beam = torch.stack(beam_parent)
    rank = torch.stack(beam_rank)
    flat = scores.reshape(-1)
    # nodes in descending score, ties to the shallower prefix: the host builder's pop order
    # (up to ties), and topological because a parent never scores below its child
    flat_of_node = torch.sort(-flat, stable=True).indices[:b]
    node_of = torch.zeros(depth * b, dtype=torch.int64, device=device)
    node_of[flat_of_node] = torch.arange(1, b + 1, device=device)
    d_of = torch.div(flat_of_node, b, rounding_mode="floor")
    parent_flat = (d_of - 1) * b + parent_beam.reshape(-1)[flat_of_node]
    parents = torch.where(d_of == 0, torch.zeros_like(d_of), node_of[parent_flat.clamp(min=0)])
    tok = draft_tokens[d_of, rank.reshape(-1)[flat_of_node].clamp(max=k - 1)]
    node_scores = flat[flat_of_node]
    valid = torch.isfinite(node_scores)
    root = torch.as_tensor(root_token, device=device).reshape(1).to(torch.int64)
    # invalid slots as the kernel leaves them: a depth-1 child of the root, token 0, rank 0
    zero = torch.zeros_like(tok)
    return StaticTree(
        tokens=torch.cat([root, torch.where(valid, tok, zero)]),
        parents=torch.cat([torch.full((1,), -1, dtype=torch.int64, device=device), torch.where(valid, parents, zero)]),
        depths=torch.cat([torch.zeros(1, dtype=torch.int64, device=device), torch.where(valid, d_of + 1, zero + 1)]),
        scores=torch.cat([torch.zeros(1, device=device), torch.where(valid, node_scores, torch.zeros_like(node_scores))]),
        ranks=torch.cat([torch.full((1,), -1, dtype=torch.int64, device=device), torch.where(valid, rank.reshape(-1)[flat_of_node], zero)]),
        valid=torch.cat([torch.ones(1, dtype=torch.bool, device=device), valid]),
    )


@dataclass
class ChainSkeleton:
    """What a chain of ``depth`` drafts has whatever the tokens: built once (an engine's static
    buffers), so a round builds only its tokens and scores (the AR step's one-node tree: one launch)."""

    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    valid: torch.Tensor
    zero_score: torch.Tensor  # [1] float32


def chain_skeleton(depth: int, device) -> ChainSkeleton:
    ar = torch.arange(depth + 1, device=device)
    return ChainSkeleton(parents=ar - 1, depths=ar, ranks=torch.where(ar == 0, -1, 0),
                         valid=torch.ones(depth + 1, dtype=torch.bool, device=device),
                         zero_score=torch.zeros(1, device=device))


def build_chain_static(draft_tokens: torch.Tensor, draft_logprobs: torch.Tensor, root_token: torch.Tensor,
                       skeleton: ChainSkeleton | None = None) -> StaticTree:
    """The chain of the drafts' first choices under ``root_token``; ``skeleton`` (chain_skeleton of
    this depth) reuses the parts that do not depend on the drafts. Nothing it returns aliases an
    input: the round that builds it overwrites the root token's buffer."""
    depth = draft_tokens.shape[0]
    device = draft_tokens.device
    sk = skeleton if skeleton is not None else chain_skeleton(depth, device)
    if sk.depths.shape[0] != depth + 1:
        raise ValueError(f"chain skeleton of {sk.depths.shape[0] - 1} drafts for a chain of {depth}")
    root = torch.as_tensor(root_token, device=device).reshape(1).to(torch.int64)
    scores = sk.zero_score if depth == 0 else torch.cat([sk.zero_score, torch.cumsum(draft_logprobs[:, 0].float(), 0)])
    return StaticTree(tokens=torch.cat([root, draft_tokens[:, 0]]), parents=sk.parents, depths=sk.depths,
                      scores=scores, ranks=sk.ranks, valid=sk.valid)


def static_ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """ancestor_mask with a fixed number of steps, no data-dependent loop (no host sync): one
    Triton launch where Triton runs, else pointer doubling (tree_kernels.ancestor_mask,
    tree_mask/naive.py)."""
    return tk.ancestor_mask(parents, max_depth)
