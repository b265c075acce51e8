"""Exact tree verification through recurrent layers: fork == paths == slots, unsafe leaks.

Kernel level (the torch references in tree_kernels) and model level (a random hybrid target,
against decoding every root-to-leaf path token by token).
"""

import pytest
import torch
from trees import TREE_CASES, random_tree

from tree_kernels.tree_conv import naive as conv
from tree_kernels.tree_gdn import naive as gdn
from workbench.random_models import random_target
from workbench.tree import Tree, compile_chain, compile_tree
from workbench.verify import sequential_tree_logits


def gdn_inputs(t, h=2, hv=6, dk=8, dv=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(t, h, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(t, h, dk, generator=g), dim=-1)
    v = torch.randn(t, hv, dv, generator=g)
    gate = -torch.rand(t, hv, generator=g) * 2.0
    beta = torch.rand(t, hv, generator=g)
    S0 = torch.randn(hv, dk, dv, generator=g)
    return q, k, v, gate, beta, S0


@pytest.mark.parametrize("n,depth,shape", TREE_CASES)
def test_gdn_fork_equals_paths_and_slots(n, depth, shape):
    tree = random_tree(n, depth, seed=n, shape=shape)
    c = compile_tree(tree, 0)
    q, k, v, g, beta, S0 = gdn_inputs(n, seed=n)
    o_fork, stash = gdn.tree_gdn_fork(q, k, v, g, beta, S0, c.anc)
    o_paths, states = gdn.tree_gdn_paths(q, k, v, g, beta, S0, c.parents)
    o_slots, slots = gdn.tree_gdn_slots(q, k, v, g, beta, S0, c.parents, c.depths)
    assert (o_fork - o_paths).abs().max() < 1e-5
    assert (o_slots - o_paths).abs().max() < 1e-5
    assert (slots - states).abs().max() < 1e-5
    # committing any node from the stash equals the sequential recurrence along its path
    for node in {n - 1, n // 2, tree.leaves()[0]}:
        path = tree.path_to(node)
        _, seq_states = gdn.gdn_chain_sequential(q[path], k[path], v[path], g[path], beta[path], S0)
        assert (gdn.tree_gdn_commit(stash, S0, path) - seq_states[-1]).abs().max() < 1e-5
    assert (gdn.tree_gdn_node_states(stash, S0, c.anc) - states).abs().max() < 1e-5


def test_gdn_fork_on_a_chain_is_the_sequential_recurrence():
    q, k, v, g, beta, S0 = gdn_inputs(40)
    chain = compile_chain(list(range(40)), 0)
    o, _ = gdn.tree_gdn_fork(q, k, v, g, beta, S0, chain.anc)
    o_seq, _ = gdn.gdn_chain_sequential(q, k, v, g, beta, S0)
    assert (o - o_seq).abs().max() < 1e-5


def test_gdn_flattened_order_leaks_sibling_state():
    tree = Tree.from_parents([1, 2, 3, 4], [-1, 0, 0, 2])  # node 2 is a non-first sibling
    c = compile_tree(tree, 0)
    q, k, v, g, beta, S0 = gdn_inputs(4, seed=5)
    o_paths, _ = gdn.tree_gdn_paths(q, k, v, g, beta, S0, c.parents)
    o_flat, _ = gdn.tree_gdn_fork(q, k, v, g, beta, S0, c.flattened().anc)
    assert (o_flat[:2] - o_paths[:2]).abs().max() < 1e-5  # the first chain is unaffected
    assert (o_flat[2:] - o_paths[2:]).abs().max() > 1e-2  # the sibling and its child are not


def test_gdn_exp_is_selected_before_the_mask():
    """Large decays off the ancestor relation would overflow exp(G_n - G_m): must stay finite."""
    tree = Tree.from_parents(list(range(6)), [-1, 0, 0, 1, 2, 2])
    c = compile_tree(tree, 0)
    q, k, v, g, beta, S0 = gdn_inputs(6)
    g = torch.tensor([[-1.0], [-200.0], [-0.1], [-300.0], [-0.2], [-90.0]]).expand(6, 6).contiguous()
    o, stash = gdn.tree_gdn_fork(q, k, v, g, beta, S0, c.anc)
    o_paths, _ = gdn.tree_gdn_paths(q, k, v, g, beta, S0, c.parents)
    assert torch.isfinite(o).all() and (o - o_paths).abs().max() < 1e-4


@pytest.mark.parametrize("n,depth,shape", TREE_CASES)
@pytest.mark.parametrize("width", [2, 4])
def test_tree_conv_equals_per_path_conv(n, depth, shape, width):
    tree = random_tree(n, depth, seed=n + width, shape=shape)
    c = compile_tree(tree, 0)
    g = torch.Generator().manual_seed(n)
    x, state = torch.randn(n, 10, generator=g), torch.randn(10, width - 1, generator=g)
    w, b = torch.randn(10, width, generator=g), torch.randn(10, generator=g)
    y = conv.tree_conv1d(x, state, w, b, c.conv_table(width))
    y_ref = conv.tree_conv1d_paths(x, state, w, b, c.parents)
    assert (y - y_ref).abs().max() < 1e-5
    node = n - 1
    path = tree.path_to(node)
    expected = torch.cat([state, x[path].t()], dim=1)[:, -(width - 1):]
    assert torch.equal(conv.tree_conv_commit(x, state, path), expected)


# ---------------------------------------------------------------------------------- model level


@pytest.fixture(scope="module")
def hybrid():
    return random_target("hybrid", seed=11, vocab_size=97, linear_value_heads=6, linear_key_dim=8, linear_value_dim=12)


@pytest.fixture(scope="module")
def next_moe():
    return random_target("qwen3_next", seed=12, vocab_size=97)


def prefilled(target, n_prefix):
    cache = target.new_cache(n_prefix + 300)
    if n_prefix:
        target.run_chain(torch.randint(0, target.config.vocab_size, (n_prefix,), generator=torch.Generator().manual_seed(1)), cache)
    return cache


@pytest.mark.parametrize("n,depth,shape", TREE_CASES)
@pytest.mark.parametrize("prefix", [0, 9])
def test_model_fork_equals_paths_per_node(hybrid, n, depth, shape, prefix):
    tree = random_tree(n, depth, seed=3 * n + prefix, shape=shape)
    cache = prefilled(hybrid, prefix)
    logits = {}
    for mode in ("fork", "paths", "slots"):
        c = cache.clone()
        logits[mode] = hybrid(compile_tree(tree, prefix), c, mode).logits
    assert (logits["fork"] - logits["paths"]).abs().max() < 1e-5
    assert (logits["slots"] - logits["paths"]).abs().max() < 1e-5


@pytest.mark.parametrize("target_name", ["hybrid", "next_moe"])
def test_model_fork_equals_sequential_decoding_and_commit_is_exact(target_name, request):
    target = request.getfixturevalue(target_name)
    tree = random_tree(24, 6, seed=2, shape="mixed")
    cache = prefilled(target, 7)
    oracle = sequential_tree_logits(target, cache, tree)
    fork_cache = cache.clone()
    out = target(compile_tree(tree, 7), fork_cache, "fork")
    assert (out.logits - oracle).abs().max() < 1e-5
    # commit a path ending in a non-first sibling's subtree, then decode on: equals sequential decoding
    node = max(n for n in range(len(tree)) if any(tree.parents[m] == tree.parents[n] and m < n for m in range(1, n)) or n == 0)
    path = tree.path_to(node)
    fork_cache.commit(path)
    seq_cache = cache.clone()
    target.run_chain([tree.tokens[m] for m in path], seq_cache)
    for a, b in zip(fork_cache.layers, seq_cache.layers):
        if hasattr(a, "state"):
            assert (a.state - b.state).abs().max() < 1e-5
            assert (a.conv_state - b.conv_state).abs().max() < 1e-5  # inputs of later layers carry rounding
        else:
            assert a.length == b.length
            assert (a.k[: a.length] - b.k[: b.length]).abs().max() < 1e-5
    nxt = [5, 17, 3]
    assert (target.run_chain(nxt, fork_cache).logits - target.run_chain(nxt, seq_cache).logits).abs().max() < 1e-5


def test_model_unsafe_differs_from_paths_on_a_non_first_sibling(hybrid):
    tree = Tree.from_parents([3, 10, 20, 30, 40], [-1, 0, 0, 2, 1])
    cache = prefilled(hybrid, 5)
    paths = hybrid(compile_tree(tree, 5), cache.clone(), "paths").logits
    unsafe = hybrid(compile_tree(tree, 5), cache.clone(), "unsafe").logits
    assert (unsafe[:2] - paths[:2]).abs().max() < 1e-5  # root and first child: nothing leaked yet
    assert (unsafe[2] - paths[2]).abs().max() > 1e-2  # node 2 inherited its sibling's state


def test_dense_target_has_no_leak():
    dense = random_target("dense", seed=4, vocab_size=97)
    tree = random_tree(30, 5, seed=1)
    cache = prefilled(dense, 6)
    a = dense(compile_tree(tree, 6), cache.clone(), "unsafe").logits
    b = dense(compile_tree(tree, 6), cache.clone(), "fork").logits
    assert (a - b).abs().max() < 1e-6


def test_long_prefill_chunks_match_single_pass(hybrid):
    ids = torch.randint(0, 97, (150,), generator=torch.Generator().manual_seed(3))
    c1, c2 = hybrid.new_cache(200), hybrid.new_cache(200)
    whole = hybrid.run_chain(ids, c1).logits  # 150 > 64: chunked fork
    parts = torch.cat([hybrid.run_chain(ids[i : i + 10], c2).logits for i in range(0, 150, 10)])
    assert (whole - parts).abs().max() < 1e-4


@pytest.mark.parametrize("mode", ["fork", "unsafe"])
def test_verify_tells_the_gdn_fork_its_tree_is_rooted(monkeypatch, mode):
    """The dense GDN kernel fits budget + 1 nodes only with the root peeled: the verify must pass
    rooted=True for draft trees (and for the flattened chain of unsafe), False for a forest."""
    import workbench.verify as verify

    seen = []
    real = verify.tk.tree_gdn_fork

    def spy(*args, **kw):
        seen.append(kw.get("rooted"))
        return real(*args, **kw)

    monkeypatch.setattr(verify.tk, "tree_gdn_fork", spy)
    tree = Tree.from_parents([5, 6, 7, 8, 9], [-1, 0, 0, 1, 2])
    c = compile_tree(tree, prefix_len=3)
    hv, dk, dv = 2, 4, 4
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 1, dk, generator=g), torch.randn(5, 1, dk, generator=g)
    v = torch.randn(5, hv, dv, generator=g)
    gate, beta = -torch.rand(5, hv, generator=g), torch.rand(5, hv, generator=g)
    s0 = torch.randn(hv, dk, dv, generator=g)
    verify.tree_recurrence(mode, q, k, v, gate, beta, s0, c)
    assert seen == [True]
    from dataclasses import replace

    verify.tree_recurrence(mode, q, k, v, gate, beta, s0, replace(c, rooted=False))
    assert seen[-1] == (mode == "unsafe")  # unsafe runs the flattened chain, rooted whatever the tree
