"""The one-program DDTree builder (tree_kernels.tree_build) against its reference under
TRITON_INTERPRET=1, and both against the host heap builder and the torch beam builder."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import tree_kernels as tk  # noqa: E402
from tree_kernels.tree_build import naive  # noqa: E402
from tree_kernels.tree_build import triton as impl  # noqa: E402

from workbench.tree import Draft, build_ddtree, build_ddtree_static  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - a GPU run of the same file
    pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton needs the interpreter or a GPU")

FIELDS = ("tokens", "parents", "depths", "scores", "ranks", "valid")


def draft(depth, k, vocab=300, seed=0, quantize=None):
    """A drafter's per-depth top-k (sorted); ``quantize`` rounds the log-probs to force ties."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(depth, vocab, generator=g) * 3, -1)
    if quantize:
        lp = torch.round(lp * quantize) / quantize
    top = torch.topk(lp, k, -1)
    return top.indices, top.values


def assert_same(got, ref):
    for name, a, b in zip(FIELDS, got, ref):
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
        assert torch.equal(a, b), (name, a.tolist(), b.tolist())


def assert_well_formed(out, depth):
    tokens, parents, depths, scores, ranks, valid = out
    assert parents[0] == -1 and depths[0] == 0 and ranks[0] == -1 and bool(valid[0])
    for i in range(1, len(tokens)):
        p = int(parents[i])
        assert 0 <= p < i, (i, p)  # topological
        if valid[i]:
            assert bool(valid[p]) and depths[i] == depths[p] + 1 and 1 <= depths[i] <= depth
            assert scores[i] <= scores[p]
            assert scores[i] <= scores[i - 1] or not valid[i - 1]  # best-first
        else:  # invalid slots trail and are inert
            assert not valid[i:].any() and p == 0 and depths[i] == 1 and tokens[i] == 0 and ranks[i] == 0


@pytest.mark.parametrize("depth,k,budget", [(15, 16, 16), (15, 32, 32), (15, 64, 64), (4, 3, 30), (1, 5, 8),
                                             (3, 1, 10), (6, 8, 1), (15, 256, 256), (2, 40, 200)])
def test_kernel_matches_reference_and_host_builder(depth, k, budget):
    tokens, lq = draft(depth, k, seed=depth * 1000 + k + budget)
    got = impl.tree_build(tokens, lq, budget, torch.tensor(7))
    ref = naive.tree_build(tokens, lq, budget, 7)
    assert_same(got, ref)
    assert_well_formed(got, depth)
    # continuous scores: no ties, so the host heap builder makes the same tree in the same order
    host = build_ddtree(Draft(tokens, lq), budget, 7)
    n = int(got[5].sum())
    assert n == min(budget + 1, len(host.tokens))
    assert got[0][:n].tolist() == host.tokens and got[1][:n].tolist() == host.parents
    assert got[2][:n].tolist() == host.depths and got[4][:n].tolist() == host.ranks
    assert torch.allclose(got[3][:n].double(), torch.tensor(host.scores, dtype=torch.float64), atol=1e-5)
    # and the torch beam builder (the CPU fast path) bit for bit, invalid slots included
    beam = build_ddtree_static(tokens, lq, budget, torch.tensor(7))
    assert_same(got, tuple(getattr(beam, f) for f in FIELDS))


@pytest.mark.parametrize("quantize,seed", [(2, 0), (1, 1), (4, 2)])
def test_ties_break_the_same_way_in_kernel_and_reference(quantize, seed):
    # coarse log-probs: many equal scores across depths and cousins, the tie rule decides the tree
    tokens, lq = draft(12, 24, seed=seed, quantize=quantize)
    assert len(set(lq.flatten().tolist())) < lq.numel() / 3
    got = impl.tree_build(tokens, lq, 48, torch.tensor(3))
    assert_same(got, naive.tree_build(tokens, lq, 48, 3))
    assert_well_formed(got, 12)
    # the same set of scores as the host builder (only the order among equals may differ)
    host = build_ddtree(Draft(tokens, lq), 48, 3)
    assert sorted(got[3].tolist()) == sorted(float(torch.tensor(s, dtype=torch.float32)) for s in host.scores)


def test_non_finite_log_probs_leave_invalid_slots():
    tokens, lq = draft(5, 6, seed=4)
    lq = lq.clone()
    lq[0, 2:] = float("-inf")  # only two first tokens
    lq[1, 5] = float("nan")  # NaN counts as -inf
    lq[3:] = float("-inf")  # nothing past depth 3
    got = impl.tree_build(tokens, lq, 100, torch.tensor(1))
    assert_same(got, naive.tree_build(tokens, lq, 100, 1))
    assert_well_formed(got, 5)
    valid = int(got[5].sum()) - 1
    assert valid == 2 * (1 + 5 + 5 * 6)  # each of 2 roots: itself, 5 finite depth-2 children, 6 at depth 3
    assert not got[5][valid + 1:].any()
    beam = build_ddtree_static(tokens, lq, 100, torch.tensor(1))
    assert torch.equal(beam.valid, got[5]) and torch.equal(beam.parents, got[1]) and torch.equal(beam.depths, got[2])


def test_empty_draft_gives_the_root_and_invalid_slots():
    for shape in [(0, 4), (3, 0)]:
        got = impl.tree_build(torch.zeros(shape, dtype=torch.int64), torch.zeros(shape), 5, torch.tensor(9))
        assert_same(got, naive.tree_build(torch.zeros(shape, dtype=torch.int64), torch.zeros(shape), 5, 9))
        assert got[0][0] == 9 and got[5].tolist() == [True] + [False] * 5


def test_kernel_reads_strided_and_half_inputs():
    tokens, lq = draft(8, 20, seed=6)
    wide_tok, wide_lq = torch.zeros(8, 40, dtype=torch.int64), torch.zeros(8, 40)
    wide_tok[:, :20], wide_lq[:, :20] = tokens, lq
    assert_same(impl.tree_build(wide_tok[:, :20], wide_lq[:, :20], 24, 5), naive.tree_build(tokens, lq, 24, 5))
    half = lq.to(torch.bfloat16)
    assert_same(impl.tree_build(tokens, half, 24, 5), naive.tree_build(tokens, half, 24, 5))


def test_dispatch_and_fast_path_builder_use_the_kernel_when_triton_is_chosen(monkeypatch):
    tokens, lq = draft(6, 10, seed=8)
    calls = []
    original = impl.tree_build

    def spy(*a):
        calls.append(1)
        return original(*a)

    monkeypatch.setattr(impl, "tree_build", spy)
    with tk.use_backend("torch"):
        assert_same(tk.tree_build(tokens, lq, 12, 2), naive.tree_build(tokens, lq, 12, 2))
        build_ddtree_static(tokens, lq, 12, torch.tensor(2))
    assert not calls
    with tk.use_backend("triton"):
        st = build_ddtree_static(tokens, lq, 12, torch.tensor(2))
    assert calls == [1]
    assert_same(tuple(getattr(st, f) for f in FIELDS), naive.tree_build(tokens, lq, 12, 2))


def test_budget_and_shapes_are_checked():
    tokens, lq = draft(3, 4)
    with pytest.raises(ValueError, match="budget"):
        build_ddtree_static(tokens, lq, 0, torch.tensor(0))
    with pytest.raises(ValueError, match="draft tokens"):
        impl.tree_build(tokens[:, :3], lq, 4, 0)
    assert math.isfinite(float(naive.tree_build(tokens, lq, 4, 0)[3].sum()))
