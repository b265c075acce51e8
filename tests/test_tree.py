"""The tree stage: builders against brute force, compiled masks and tables against naive versions."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.tree import (
    Draft,
    Tree,
    ancestor_bitmask,
    ancestor_mask,
    build_chain,
    build_ddtree,
    build_tree,
    compile_chain,
    compile_tree,
    conv_gather_table,
    follow,
)


def random_draft(depth, k, seed, vocab=1000, ties=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(depth, vocab, generator=g)
    if ties:  # coarse values make equal scores common, exercising the tie-break
        logits = (logits * 2).round()
    logp = torch.log_softmax(logits, -1)
    top = torch.topk(logp, k, dim=-1)
    return Draft(top.indices, top.values)


def brute_force_prefixes(draft, budget):
    """Every rank tuple up to full depth, scored as the builder scores them, best `budget` kept."""
    depth, k = draft.tokens.shape
    logq = draft.logprobs.double().tolist()
    items = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            s = 0.0
            for i, r in enumerate(ranks):
                s += logq[i][r]
            items.append((-s, ranks))
    items.sort()
    return [r for _, r in items[:budget]]


def rank_tuples(tree):
    out = []
    for n in range(1, len(tree)):
        out.append(tuple(tree.ranks[m] for m in tree.path_to(n)[1:]))
    return out


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(1, 4),
    k=st.integers(1, 4),
    budget=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    ties=st.booleans(),
)
def test_ddtree_is_exactly_the_top_budget_prefixes(depth, k, budget, seed, ties):
    draft = random_draft(depth, k, seed, ties=ties)
    tree = build_ddtree(draft, budget, root_token=7)
    expected = brute_force_prefixes(draft, budget)
    got = rank_tuples(tree)
    assert got == expected  # same set, and pop order equals sorted (score, ranks) order
    # topological, tokens match their ranks, scores are path sums
    for n in range(1, len(tree)):
        p = tree.parents[n]
        assert 0 <= p < n
        assert tree.depths[n] == tree.depths[p] + 1
        assert tree.tokens[n] == int(draft.tokens[tree.depths[n] - 1, tree.ranks[n]])
        assert math.isclose(tree.scores[n], tree.scores[p] + float(draft.logprobs[tree.depths[n] - 1, tree.ranks[n]]), abs_tol=1e-6)


def test_ddtree_budget_larger_than_all_prefixes():
    draft = random_draft(2, 2, 0)
    tree = build_ddtree(draft, 100, 0)
    assert len(tree) == 1 + 2 + 4


def test_chain_is_the_argmax_chain():
    draft = random_draft(6, 5, 3)
    chain = build_chain(draft, root_token=11)
    assert chain.tokens == [11] + draft.tokens[:, 0].tolist()
    assert chain.parents == [-1, 0, 1, 2, 3, 4, 5]
    assert chain.is_chain()
    # a budget-L DDTree can differ from the chain, but the chain is DDTree with k = 1
    k1 = Draft(draft.tokens[:, :1], draft.logprobs[:, :1])
    assert build_ddtree(k1, 6, 11).tokens == chain.tokens


def test_budget_is_validated():
    draft = random_draft(3, 3, 0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="budget"):
            build_ddtree(draft, bad, 0)
    with pytest.raises(ValueError, match="method"):
        build_tree("beam", draft, 0, 4)


def naive_ancestors(parents):
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    return anc


def random_parents(n, seed, wide=False):
    g = torch.Generator().manual_seed(seed)
    parents = [-1]
    for i in range(1, n):
        hi = 1 if wide and torch.rand(1, generator=g).item() < 0.5 else i
        parents.append(int(torch.randint(0, hi, (1,), generator=g)))
    return parents


@pytest.mark.parametrize("n,seed,wide", [(1, 0, False), (5, 1, False), (40, 2, True), (130, 3, False), (300, 4, True)])
def test_ancestor_mask_bitmask_and_conv_table(n, seed, wide):
    parents = random_parents(n, seed, wide)
    p = torch.tensor(parents)
    anc = ancestor_mask(p)
    assert torch.equal(anc, naive_ancestors(parents))
    bits = ancestor_bitmask(anc)
    assert bits.shape == (n, (n + 63) // 64)
    for i in range(n):
        for j in range(n):
            word = int(bits[i, j // 64]) & ((1 << 64) - 1)
            assert bool((word >> (j % 64)) & 1) == bool(anc[i, j])
    for width in (2, 3, 4):
        table = conv_gather_table(p, width)
        for i in range(n):
            window, j, back = [], i, 0
            while len(window) < width:
                if j >= 0:
                    window.append(j)
                    j = parents[j]
                else:
                    back -= 1
                    window.append(back)
            assert table[i].tolist() == window[::-1]


def test_compile_positions_and_chain():
    tree = Tree.from_parents([5, 6, 7, 8], [-1, 0, 0, 1])
    c = compile_tree(tree, prefix_len=10)
    assert c.positions.tolist() == [10, 11, 11, 12]
    assert not c.is_chain
    chain = compile_chain([1, 2, 3], prefix_len=4)
    assert chain.positions.tolist() == [4, 5, 6] and chain.is_chain
    assert torch.equal(chain.anc, torch.ones(3, 3, dtype=torch.bool).tril())
    flat = c.flattened()
    assert flat.parents.tolist() == [-1, 0, 1, 2] and torch.equal(flat.positions, c.positions)
    assert c.rooted and chain.rooted and flat.rooted  # node 0 is every node's ancestor in all three


def test_follow_takes_matching_children_and_returns_the_bonus():
    #        0
    #      /   \
    #  1(a=10) 2(b=11)
    #    |
    #  3(c=12)
    tree = Tree.from_parents([99, 10, 11, 12], [-1, 0, 0, 1])
    assert follow(tree, [11, 0, 42, 0]) == ([0, 2], 42)  # through the second sibling
    assert follow(tree, [10, 12, 0, 77]) == ([0, 1, 3], 77)
    assert follow(tree, [5, 0, 0, 0]) == ([0], 5)
