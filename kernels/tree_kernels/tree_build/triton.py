"""DDTree construction in one Triton program: the frontier lives in registers, one pop per node.

Same tree, same order and the same fp32 scores as naive.py. The torch alternative (a beam per
depth, a top-k per depth and a global sort; ``workbench.tree.build_ddtree_static``) launches
about 9 kernels per depth, ~140 per round for a 16-token block, each a few microseconds even
inside a CUDA graph; here the whole build is one launch. The frontier holds at most budget + 1
entries (each pop removes one and adds at most two), kept as F = next_pow2(budget + 1) lanes of
one warp: a pop is two warp reductions (best score, then the tie key) and a few masked sums to
read the winner's fields. The emitted nodes stay in registers too and are written once at the
end, with one gather for their tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._pdl import pdl_enter, pdl_options
from .._triton_common import next_pow2

__all__ = ["tree_build"]


@triton.jit
def _tree_build_kernel(
    Tok, LogQ, Root, OutTok, OutPar, OutDep, OutScore, OutRank, OutValid,
    L, K, s_tok, s_lq,
    BUDGET: tl.constexpr, F: tl.constexpr, USE_GDC: tl.constexpr = False
):
    pdl_enter(USE_GDC)
    NEG: tl.constexpr = float("-inf")
    slot = tl.arange(0, F)
    first = tl.load(LogQ, mask=(L > 0) & (K > 0), other=NEG).to(tl.float32)
    first = tl.where(first != first, NEG, first)
    # frontier: score, parent's score, depth, parent node, rank; empty lanes score -inf
    f_score = tl.where(slot == 0, first, NEG)
    f_pscore = tl.zeros([F], dtype=tl.float32)
    f_depth = tl.where(slot == 0, 1, 0)
    f_parent = tl.zeros([F], dtype=tl.int32)
    f_rank = tl.zeros([F], dtype=tl.int32)
    n_used = 1
    # emitted nodes, by slot (invalid: depth 1, parent 0, rank 0, score 0)
    n_depth = tl.full([F], 1, dtype=tl.int32)
    n_parent = tl.zeros([F], dtype=tl.int32)
    n_rank = tl.zeros([F], dtype=tl.int32)
    n_score = tl.zeros([F], dtype=tl.float32)
    n_valid = tl.zeros([F], dtype=tl.int32)
    for i in range(1, BUDGET + 1):
        best = tl.max(f_score, axis=0)
        ok = best > NEG
        # ties: shallower, then the earlier-emitted parent, then the lower rank (unique per entry)
        key = tl.where(f_score == best, (f_depth * (BUDGET + 1) + f_parent) * K + f_rank, 2147483647)
        sel = (key == tl.min(key, axis=0)) & (f_score > NEG)  # none when nothing finite is left
        d = tl.sum(tl.where(sel, f_depth, 0), axis=0)
        r = tl.sum(tl.where(sel, f_rank, 0), axis=0)
        par = tl.sum(tl.where(sel, f_parent, 0), axis=0)
        ps = tl.sum(tl.where(sel, f_pscore, 0.0), axis=0)
        sib = tl.load(LogQ + (d - 1) * s_lq + r + 1, mask=ok & (r + 1 < K), other=NEG).to(tl.float32)
        sib = tl.where(sib != sib, NEG, sib)
        grow = ok & (d < L)
        child = tl.load(LogQ + d * s_lq, mask=grow, other=NEG).to(tl.float32)
        child = tl.where(child != child, NEG, child)
        here = tl.where(ok, slot == i, False)  # (a scalar condition: where, not &, broadcasts it)
        n_depth = tl.where(here, d, n_depth)
        n_parent = tl.where(here, par, n_parent)
        n_rank = tl.where(here, r, n_rank)
        n_score = tl.where(here, best, n_score)
        n_valid = tl.where(here, 1, n_valid)
        # the popped lane takes its next sibling; a fresh lane the first child
        f_score = tl.where(sel, ps + sib, f_score)
        f_rank = tl.where(sel, r + 1, f_rank)
        new = tl.where(grow, slot == n_used, False)
        f_score = tl.where(new, best + child, f_score)
        f_pscore = tl.where(new, best, f_pscore)
        f_depth = tl.where(new, d + 1, f_depth)
        f_parent = tl.where(new, i, f_parent)
        f_rank = tl.where(new, 0, f_rank)
        n_used += grow.to(tl.int32)
    out = slot <= BUDGET
    is_root = slot == 0
    live = (n_valid != 0) & (slot > 0) & out
    tok = tl.load(Tok + (n_depth - 1) * s_tok + n_rank, mask=live, other=0)
    root = tl.load(Root)
    tl.store(OutTok + slot, tl.where(is_root, root, tok), mask=out)
    tl.store(OutPar + slot, tl.where(is_root, -1, n_parent).to(tl.int64), mask=out)
    tl.store(OutDep + slot, tl.where(is_root, 0, n_depth).to(tl.int64), mask=out)
    tl.store(OutScore + slot, tl.where(is_root, 0.0, n_score), mask=out)
    tl.store(OutRank + slot, tl.where(is_root, -1, n_rank).to(tl.int64), mask=out)
    tl.store(OutValid + slot, tl.where(is_root, 1, n_valid).to(tl.int8), mask=out)


def tree_build(draft_tokens: torch.Tensor, draft_logprobs: torch.Tensor, budget: int, root_token) -> tuple:
    """One launch, no host sync (graph-capturable); ``root_token`` an int or a device scalar."""
    depth, k = draft_logprobs.shape
    if draft_tokens.shape != (depth, k):
        raise ValueError(f"tree_build: draft tokens {tuple(draft_tokens.shape)} and log-probs "
                         f"{tuple(draft_logprobs.shape)} differ")
    dev = draft_logprobs.device
    n = budget + 1
    toks = draft_tokens.to(torch.int64).contiguous()
    lq = draft_logprobs.contiguous()
    root = torch.as_tensor(root_token, device=dev).reshape(1).to(torch.int64)
    tokens = torch.empty(n, dtype=torch.int64, device=dev)
    parents, depths, ranks = torch.empty_like(tokens), torch.empty_like(tokens), torch.empty_like(tokens)
    scores = torch.empty(n, dtype=torch.float32, device=dev)
    valid = torch.empty(n, dtype=torch.bool, device=dev)
    if depth == 0 or k == 0:  # nothing to draft from: pointers must still be valid
        toks = torch.zeros(1, 1, dtype=torch.int64, device=dev)
        lq = torch.full((1, 1), float("-inf"), dtype=torch.float32, device=dev)
    f = max(16, next_pow2(n))
    _tree_build_kernel[(1,)](
        toks, lq, root, tokens, parents, depths, scores, ranks, valid.view(torch.int8),
        depth, k, toks.stride(0), lq.stride(0),
        BUDGET=budget, F=f, num_warps=1 if f <= 256 else 2, **pdl_options(toks)
    )
    return tokens, parents, depths, scores, ranks, valid
