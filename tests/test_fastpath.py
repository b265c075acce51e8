"""The device fast path (static shapes, no host syncs) against the reference engine and builders.

On CPU the fast path runs eagerly; on CUDA the same steps are captured as graphs (checked on
the GPU machine by the e2e benchmark). Everything here compares with the reference code.
"""

import os

# the "triton" backend rows run the kernels interpreted on CPU (as test_gemv and the kernel tests);
# set before any Triton kernel module is imported, so this file also passes run alone
os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_tree import random_draft  # noqa: E402

from tree_kernels import static as static_kernels  # noqa: E402
from tree_kernels.tree_attention import naive as attention  # noqa: E402
from tree_kernels.tree_conv import naive as conv  # noqa: E402
from tree_kernels.tree_gdn import naive as gdn  # noqa: E402
from workbench.drafters.dflash import DFlashDrafter  # noqa: E402
from workbench.drafters.oracle import OracleDrafter, OracleSpec  # noqa: E402
from workbench.engine import GenerationConfig, generate  # noqa: E402
from workbench.fastpath import FastEngine, FastPathUnsupported  # noqa: E402
from workbench.random_models import random_dflash, random_target  # noqa: E402
from workbench.tree import build_chain_static, build_ddtree, build_ddtree_static, compile_chain, compile_tree, follow, static_ancestor_mask, ancestor_mask  # noqa: E402
from workbench.verify import walk_static  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(depth=st.integers(1, 6), k=st.integers(1, 8), budget=st.integers(1, 60), seed=st.integers(0, 10_000))
def test_static_builder_equals_host_builder(depth, k, budget, seed):
    draft = random_draft(depth, k, seed)
    host = build_ddtree(draft, budget, 3)
    dev = build_ddtree_static(draft.tokens, draft.logprobs, budget, torch.tensor(3)).to_tree()
    # no ties in continuous random scores: the same nodes in the same (best-first) order
    assert dev.tokens == host.tokens and dev.parents == host.parents and dev.ranks == host.ranks
    assert dev.depths == host.depths


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(1, 40))
def test_static_builder_with_ties_is_still_a_tree_of_the_right_size(seed, budget):
    draft = random_draft(4, 5, seed, ties=True)
    st_tree = build_ddtree_static(draft.tokens, draft.logprobs, budget, torch.tensor(0))
    tree = st_tree.to_tree()
    host = build_ddtree(draft, budget, 0)
    assert len(tree) == len(host)
    assert sorted(tree.scores) == pytest.approx(sorted(host.scores))  # same multiset of scores
    assert all(0 <= p < n for n, p in enumerate(tree.parents) if n)
    assert torch.equal(static_ancestor_mask(st_tree.parents, 4), ancestor_mask(st_tree.parents))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_static_walk_equals_follow(backend):
    """The walk on the device (torch reference, and the one-launch Triton kernel interpreted)
    against the host walk over the same tree and choices."""
    import tree_kernels as tk

    g = torch.Generator().manual_seed(0)
    for seed in range(50):
        draft = random_draft(5, 6, seed, vocab=20)
        st_tree = build_ddtree_static(draft.tokens, draft.logprobs, 30, torch.tensor(3))
        tree = st_tree.to_tree()
        anc = static_ancestor_mask(st_tree.parents, 5)
        choices = torch.randint(0, 20, (len(tree),), generator=g)
        kids = tree.children()
        for n in range(len(tree)):  # follow a random child most of the time
            if kids[n] and torch.rand(1, generator=g) < 0.8:
                choices[n] = list(kids[n])[int(torch.randint(0, len(kids[n]), (1,), generator=g))]
        with tk.use_backend(backend):
            walk = walk_static(st_tree.tokens, st_tree.parents, st_tree.depths, st_tree.valid, anc, choices, 5)
        accepted, bonus = follow(tree, choices.tolist())
        assert walk.path[: int(walk.count)].tolist() == accepted and int(walk.bonus) == bonus


def random_static_tree(budget: int, depth: int, k: int, seed: int):
    """A DDTree over a random draft of ``depth`` positions x ``k`` candidates; budget 0 gives the
    one-node tree of the AR step (an empty chain after the root)."""
    if budget:
        draft = random_draft(depth, k, seed, vocab=50)
        return build_ddtree_static(draft.tokens, draft.logprobs, budget, torch.tensor(7))
    return build_chain_static(torch.zeros(0, 1, dtype=torch.int64), torch.zeros(0, 1), torch.tensor(7))


@pytest.mark.parametrize("budget, depth, k", [(0, 0, 1), (8, 4, 3), (64, 16, 8), (256, 16, 16), (40, 3, 2)])
def test_the_walk_kernel_equals_its_reference(budget, depth, k):
    """tree_walk in one Triton program against the torch reference on random static trees: one
    node (the AR step), several row and column blocks (257 nodes), padding slots (a tree that runs
    out of finite candidates: budget 40 from 3 x 2), choices that follow deep paths and ones that
    reject at the root; path, count, bonus and last all equal."""
    from tree_kernels.tree_walk import naive as walk_naive
    from tree_kernels.tree_walk import triton as walk_triton

    g = torch.Generator().manual_seed(budget + depth)
    for trial in range(6):
        st_tree = random_static_tree(budget, depth, k, trial)
        n = st_tree.tokens.shape[0]
        anc = static_ancestor_mask(st_tree.parents, depth)
        choices = torch.randint(0, 50, (n,), generator=g)
        if trial % 2:  # follow a child of most nodes, so long paths are accepted
            for i in range(1, n):
                if torch.rand(1, generator=g) < 0.8:
                    choices[int(st_tree.parents[i])] = st_tree.tokens[i]
        args = (st_tree.tokens, st_tree.parents, st_tree.depths, st_tree.valid, anc, choices, depth)
        want, got = walk_naive.tree_walk(*args), walk_triton.tree_walk(*args)
        for name, w, o in zip(("path", "count", "bonus", "last"), want, got):
            assert torch.equal(w, o), (name, trial, w, o)
    assert int(want[1]) >= 1


@pytest.mark.parametrize("budget, depth, k", [(0, 0, 1), (8, 4, 3), (64, 16, 8), (256, 16, 16), (40, 3, 2), (30, 9, 1)])
def test_the_ancestor_mask_kernel_equals_pointer_doubling_and_the_walk_up(budget, depth, k):
    """The one-launch ancestor mask and conv gather table (interpreted Triton) against the pointer-doubling reference and
    the host walk up the parents (ancestor_mask of the host tree): one node, several tiles (257
    nodes), padding slots, a chain (k = 1)."""
    from tree_kernels.tree_mask import naive as mask_naive
    from tree_kernels.tree_mask import triton as mask_triton

    for trial in range(4):
        st_tree = random_static_tree(budget, depth, k, trial)
        want = mask_naive.ancestor_mask(st_tree.parents, depth)
        got = mask_triton.ancestor_mask(st_tree.parents, depth)
        assert got.dtype == torch.bool and torch.equal(got, want), trial
        assert torch.equal(got, ancestor_mask(st_tree.parents))
        for width in (1, 2, 4, 5):  # the conv window: inside the tree, through the root, into the conv state
            table = mask_triton.conv_gather_table(st_tree.parents, width)
            assert torch.equal(table, mask_naive.conv_gather_table(st_tree.parents, width)), (trial, width)
    with pytest.raises(ValueError, match="parents must be int64"):
        mask_triton.ancestor_mask(st_tree.parents.int(), depth)
    with pytest.raises(ValueError, match="width must be >= 1"):
        mask_triton.conv_gather_table(st_tree.parents, 0)


def test_static_kernels_equal_references():
    g = torch.Generator().manual_seed(1)
    from trees import random_tree

    tree = random_tree(20, 5, seed=3)
    c = compile_tree(tree, 7)
    q = torch.randn(20, 4, 16, generator=g)
    k_all = torch.randn(40, 2, 16, generator=g)
    v_all = torch.randn(40, 2, 16, generator=g)
    ref = attention.tree_attention(q, k_all[:27], v_all[:27], c.anc, 7, positions=c.positions, window=5)
    got = static_kernels.tree_attention_static(q, k_all, v_all, c.anc, torch.tensor(7), positions=c.positions, window=5)
    assert (ref - got).abs().max() < 1e-5
    # GDN commit from a padded path, conv commit from a padded path (and flat for unsafe)
    qq, kk = torch.nn.functional.normalize(torch.randn(2, 20, 2, 8, generator=g), dim=-1)
    v, gate, beta, S0 = torch.randn(20, 4, 6, generator=g), -torch.rand(20, 4, generator=g), torch.rand(20, 4, generator=g), torch.randn(4, 8, 6, generator=g)
    _, stash = gdn.tree_gdn_fork(qq, kk, v, gate, beta, S0, c.anc)
    path = tree.path_to(17)
    padded = torch.tensor(path + [0] * (8 - len(path)))
    valid = torch.arange(8) < len(path)
    assert (static_kernels.tree_gdn_commit_padded(stash, S0, padded, valid) - gdn.tree_gdn_commit(stash, S0, path)).abs().max() < 1e-5
    x, state = torch.randn(20, 10, generator=g), torch.randn(10, 3, generator=g)
    count = torch.tensor(len(path))
    assert torch.equal(static_kernels.conv_commit_static(False, x, state, padded, count), conv.tree_conv_commit(x, state, path))
    assert torch.equal(static_kernels.conv_commit_static(True, x, state, padded, count), conv.tree_conv_commit(x, state, list(range(18))))


def same_rounds(ref, fast):
    assert fast.generated_ids == ref.generated_ids
    assert [r.tree["tokens"] for r in fast.rounds] == [r.tree["tokens"] for r in ref.rounds]
    assert [r.accepted for r in fast.rounds] == [r.accepted for r in ref.rounds]
    assert [r.bonus for r in fast.rounds] == [r.bonus for r in ref.rounds]


@pytest.mark.parametrize("kind", ["hybrid", "dense"])
def test_fast_path_equals_reference_engine_with_the_oracle(kind):
    target = random_target(kind, seed=5, vocab_size=300, eos_token_id=None)
    for prompt in (list(range(10, 30)), [5, 9, 1]):
        for temperature in (0.0, 0.9):
            ref_seq = prompt + generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=60, temperature=temperature, seed=3)).generated_ids
            for method, budget in (("ar", 1), ("dflash", 1), ("ddtree", 24), ("ddtree", 70)):
                for mode in ("fork", "unsafe"):
                    drafter = OracleDrafter(ref_seq, 300, OracleSpec(p=0.5, rank=1, block=8))
                    cfg = GenerationConfig(method=method, budget=budget, recurrent=mode, max_new_tokens=48, temperature=temperature, seed=3)
                    same_rounds(generate(target, prompt, cfg, drafter), FastEngine(target, drafter, cfg, max_len=200).generate(prompt))


def test_fast_path_equals_reference_engine_with_a_dflash_drafter_and_reuses_the_engine():
    target = random_target("hybrid", seed=6, vocab_size=300, eos_token_id=None)
    drafter = DFlashDrafter(random_dflash(target, seed=2, block_size=6), target)
    cfg = GenerationConfig(method="ddtree", budget=16, max_new_tokens=40, trace_topk=3)
    engine = FastEngine(target, drafter, cfg, max_len=200)
    for prompt in ([1, 2, 3, 4], list(range(40, 70))):  # the same engine serves several prompts
        ref = generate(target, prompt, cfg, drafter)
        fast = engine.generate(prompt)
        same_rounds(ref, fast)
        assert [r.target_top_tokens for r in fast.rounds] == [r.target_top_tokens for r in ref.rounds]
        assert [r.draft_tokens for r in fast.rounds] == [[row[:8] for row in r.draft_tokens] for r in ref.rounds]


def test_unsupported_configurations_are_refused():
    target = random_target("hybrid", seed=6, vocab_size=300, eos_token_id=None)
    drafter = OracleDrafter([1, 2, 3], 300)
    with pytest.raises(FastPathUnsupported, match="fork and unsafe"):
        FastEngine(target, drafter, GenerationConfig(recurrent="paths"), max_len=64)
    moe = random_target("qwen3_next", seed=1, vocab_size=300)
    with pytest.raises(FastPathUnsupported, match="mixture-of-experts"):
        FastEngine(moe, drafter, GenerationConfig(), max_len=64)
    with pytest.raises(FastPathUnsupported, match="CUDA graphs need a CUDA target"):
        FastEngine(target, drafter, GenerationConfig(), max_len=64, use_graphs=True)


@pytest.mark.slow
def test_compiled_layers_give_the_same_generation():
    from workbench.fastpath import compiled_layers

    target = random_target("hybrid", seed=5, vocab_size=300, eos_token_id=None, num_layers=4)
    prompt = list(range(10, 30))
    ref_seq = prompt + generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=40)).generated_ids
    drafter = OracleDrafter(ref_seq, 300, OracleSpec(p=0.5, rank=1, block=6))
    cfg = GenerationConfig(method="ddtree", budget=8, max_new_tokens=24)
    ref = generate(target, prompt, cfg, drafter)
    with compiled_layers(target):
        fast = FastEngine(target, drafter, cfg, max_len=100).generate(prompt)
    same_rounds(ref, fast)
    assert target.layer_fn is None  # restored on exit


def test_buffers_keep_their_identity_across_generations():
    """A captured CUDA graph keeps the addresses it was captured with: every buffer the steps
    read or write must be updated in place, across rounds and across prompts (this once broke
    on the GPU: a prefill reassigned the recurrent state and the next replay read freed memory)."""
    target = random_target("hybrid", seed=6, vocab_size=300, eos_token_id=None)
    drafter = DFlashDrafter(random_dflash(target, seed=2, block_size=6), target)
    engine = FastEngine(target, drafter, GenerationConfig(method="ddtree", budget=8, max_new_tokens=12), max_len=100)

    def addresses():
        out = []
        for c in engine.cache.layers:
            out += [c.k.data_ptr(), c.v.data_ptr()] if hasattr(c, "k") else [c.state.data_ptr(), c.conv_state.data_ptr()]
        out += [c.k.data_ptr() for c in drafter.caches]
        return out

    engine.generate([1, 2, 3])
    first = addresses()
    engine.generate(list(range(30, 60)))
    assert addresses() == first


@pytest.mark.parametrize("n,depth,shape", [(1, 1, "mixed"), (9, 8, "deep"), (17, 16, "deep"), (64, 16, "mixed"), (100, 3, "wide"), (257, 15, "mixed")])
def test_static_ancestor_mask_by_pointer_doubling_equals_the_walk(n, depth, shape):
    from trees import random_tree

    tree = random_tree(n, depth, seed=n, shape=shape)
    parents = torch.tensor(tree.parents)
    ref = ancestor_mask(parents)
    for max_depth in sorted({tree.max_depth, tree.max_depth + 1, 15}):
        if max_depth >= tree.max_depth:
            assert torch.equal(static_ancestor_mask(parents, max_depth), ref), max_depth


@pytest.mark.parametrize("eos, context", [(None, 4096), (7, 4096), (None, 40)])
def test_queueing_the_next_round_before_recording_changes_nothing(eos, context):
    # the host queues round i+1 before it records round i's trace: every recorded array must still be
    # round i's (it comes from the one packed read), and the stops (max_new_tokens, eos, context) the same
    target = random_target("hybrid", seed=8, vocab_size=40, eos_token_id=eos, max_position_embeddings=context)
    drafter = DFlashDrafter(random_dflash(target, seed=4, block_size=6, mask_token_id=39), target)
    cfg = GenerationConfig(method="ddtree", budget=12, max_new_tokens=30, temperature=0.9, seed=2, trace_topk=2, draft_trace_k=3)
    for prompt, max_len in (([3, 1, 4, 1, 5], 200), (list(range(20)), 64)):
        overlapped = FastEngine(target, drafter, cfg, max_len=max_len).generate(prompt)
        serial = FastEngine(target, drafter, cfg, max_len=max_len, overlap_host=False).generate(prompt)
        assert overlapped.generated_ids == serial.generated_ids and overlapped.stop_reason == serial.stop_reason
        same_rounds(serial, overlapped)
        assert [r.draft_tokens for r in overlapped.rounds] == [r.draft_tokens for r in serial.rounds]
        assert [r.target_top_tokens for r in overlapped.rounds] == [r.target_top_tokens for r in serial.rounds]
        assert [r.prefix_len for r in overlapped.rounds] == [r.prefix_len for r in serial.rounds]
        # the overlapped engine did queue rounds ahead (all but the first when nothing bounds it);
        # the serial one never; a round queued ahead and not needed is the only extra
        ahead, queued = overlapped.settings["rounds_queued_ahead"], overlapped.settings["rounds_queued"]
        assert serial.settings["rounds_queued_ahead"] == 0 and serial.settings["rounds_queued"] == len(serial.rounds)
        assert ahead >= len(overlapped.rounds) // 2 and queued - len(overlapped.rounds) in (0, 1)
    assert serial.stop_reason == {(None, 4096): "max_new_tokens", (7, 4096): "eos", (None, 40): "context"}[eos, context]


def test_rounds_queued_ahead_stay_inside_the_cache():
    # max_len leaves no slack: a round queued ahead must still fit wherever the unread round ends
    # (the CPU KV cache raises on a write past its capacity), and stop exactly as the serial engine
    target = random_target("hybrid", seed=3, vocab_size=40, eos_token_id=None)
    drafter = DFlashDrafter(random_dflash(target, seed=5, block_size=6, mask_token_id=39), target)
    prompt = [5, 6, 7, 8]
    for method in ("ar", "dflash", "ddtree"):
        cfg = GenerationConfig(method=method, budget=8, max_new_tokens=25, temperature=0.0, trace_topk=0, draft_trace_k=0)
        engine = FastEngine(target, drafter, cfg, max_len=len(prompt) + 25)
        with pytest.raises(ValueError, match="max_len"):
            engine.generate(prompt + [9])
        got = engine.generate(prompt)
        want = FastEngine(target, drafter, cfg, max_len=len(prompt) + 25, overlap_host=False).generate(prompt)
        assert got.generated_ids == want.generated_ids and len(got.generated_ids) == 25
        assert got.settings["rounds_queued_ahead"] > 0


def test_the_gdn_decode_step_on_the_ar_route_changes_no_token():
    # a one-node tree may take the one-launch decode step instead of fork + commit: AR (reference
    # engine and fast path, fork and unsafe) generates the same tokens, close logits; DDTree untouched
    from workbench.verify import _StepPending, tree_recurrence, use_gdn_decode_step

    target = random_target("hybrid", seed=9, vocab_size=300, eos_token_id=None)
    prompt = list(range(30, 50))
    for temperature in (0.0, 0.9):
        cfg = GenerationConfig(method="ar", max_new_tokens=40, temperature=temperature, seed=1, trace_topk=2)
        ref = generate(target, prompt, cfg)
        with use_gdn_decode_step(True):
            for mode in ("fork", "unsafe"):
                c = GenerationConfig(method="ar", max_new_tokens=40, temperature=temperature, seed=1, trace_topk=2, recurrent=mode)
                for got in (generate(target, prompt, c), FastEngine(target, None, c, max_len=120).generate(prompt)):
                    assert got.generated_ids == ref.generated_ids, (temperature, mode)
                    assert all(max(abs(a - b) for a, b in zip(x[0], y[0])) < 1e-4
                               for x, y in zip([r.target_top_logprobs for r in got.rounds], [r.target_top_logprobs for r in ref.rounds]))
    drafter = DFlashDrafter(random_dflash(target, seed=3, block_size=6), target)
    tree_cfg = GenerationConfig(method="ddtree", budget=8, max_new_tokens=24, trace_topk=0)
    off = generate(target, prompt, tree_cfg, drafter)
    with use_gdn_decode_step(True):  # trees of more than one node keep fork + commit
        assert FastEngine(target, drafter, tree_cfg, max_len=120).generate(prompt).generated_ids == off.generated_ids
    g = torch.Generator().manual_seed(0)
    q, k = torch.nn.functional.normalize(torch.randn(2, 1, 2, 8, generator=g), dim=-1)
    v, gate, beta, S0 = torch.randn(1, 4, 8, generator=g), -torch.rand(1, 4, generator=g), torch.rand(1, 4, generator=g), torch.randn(4, 8, 8, generator=g)
    one = compile_chain([5], 0)  # the AR step's one-node tree
    with use_gdn_decode_step(True):
        o, pending = tree_recurrence("fork", q, k, v, gate, beta, S0, one)
    assert isinstance(pending, _StepPending)
    o_ref, stash = gdn.tree_gdn_fork(q, k, v, gate, beta, S0, one.anc)
    assert (o - o_ref).abs().max() < 1e-5 and (pending.commit([0]) - gdn.tree_gdn_commit(stash, S0, [0])).abs().max() < 1e-5
    with pytest.raises(ValueError, match="commits path"):
        pending.commit([0, 1])


def test_the_ar_step_commits_in_the_forward_with_the_same_tokens_and_caches():
    """AR on the fast path: the one node is always accepted, so the conv window and the GDN state
    move in place during the forward and no commit follows. Same tokens, logits and final caches
    as the forward + commit route; trees of several nodes never take it."""
    from dataclasses import replace

    from workbench.fastpath import use_commit_in_forward
    from workbench.verify import gdn_decode_in_place, tree_conv, tree_recurrence, use_gdn_decode_step

    target = random_target("hybrid", seed=12, vocab_size=300, eos_token_id=None)
    prompt = list(range(40, 60))
    cfg = GenerationConfig(method="ar", max_new_tokens=30, temperature=0.9, seed=4, trace_topk=2)
    with use_commit_in_forward(False):
        off = FastEngine(target, None, cfg, max_len=100)
    on = FastEngine(target, None, cfg, max_len=100)
    assert on.commit_in_forward and not off.commit_in_forward
    t_off, t_on = off.generate(prompt), on.generate(prompt)
    assert t_on.generated_ids == t_off.generated_ids
    assert [r.target_top_logprobs for r in t_on.rounds] == [r.target_top_logprobs for r in t_off.rounds]
    n = len(prompt) + len(t_on.generated_ids)
    for a, b in zip(on.cache.layers, off.cache.layers):
        if hasattr(a, "k"):
            assert torch.equal(a.k[:n], b.k[:n]) and torch.equal(a.v[:n], b.v[:n])
        else:
            assert torch.equal(a.state, b.state) and torch.equal(a.conv_state, b.conv_state)
    with use_gdn_decode_step(False):  # the switch that measures the old route turns it off too
        assert not FastEngine(target, None, cfg, max_len=100).commit_in_forward
    drafter = DFlashDrafter(random_dflash(target, seed=3, block_size=6), target)
    assert not FastEngine(target, drafter, GenerationConfig(method="ddtree", budget=8), max_len=100).commit_in_forward
    two = replace(compile_chain([5, 6], 0), commit_in_forward=True)
    g = torch.Generator().manual_seed(0)
    q, k = torch.nn.functional.normalize(torch.randn(2, 2, 2, 8, generator=g), dim=-1)
    v, gate, beta = torch.randn(2, 4, 8, generator=g), -torch.rand(2, 4, generator=g), torch.rand(2, 4, generator=g)
    A_log, dt_bias, S0 = torch.zeros(4), torch.ones(4), torch.randn(4, 8, 8, generator=g)
    with pytest.raises(ValueError, match="one-node trees.*2 nodes"):
        gdn_decode_in_place("fork", q, k, v, beta, gate, A_log, dt_bias, S0, two)
    with pytest.raises(ValueError, match="gdn_decode_in_place"):  # never silently left pending
        tree_recurrence("fork", q[:1], k[:1], v[:1], gate[:1], beta[:1], S0, replace(compile_chain([5], 0), commit_in_forward=True))
    with pytest.raises(ValueError, match="one-node trees.*'paths'"):
        tree_conv("paths", torch.randn(1, 6), torch.randn(6, 3), torch.randn(6, 4), None, replace(compile_chain([5], 0), commit_in_forward=True))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_stacked_recurrent_commit_gives_the_tokens_of_the_per_layer_commits(backend, monkeypatch):
    """The fast path commits every GDN layer's state and conv window in two launches
    (RecurrentStack) when each layer's fork wrote into the stack: the same tokens and accepted
    paths as the per-layer commits (use_stacked_commit(False)) and the reference engine, every
    DDTree round through the stacked commit (counted), the AR rounds (commit in the forward) never."""
    import tree_kernels as tk
    from workbench.models import qwen3_5

    target = random_target("hybrid", seed=5, vocab_size=200, eos_token_id=None)
    prompt = [3, 9, 27, 81, 11]
    with tk.use_backend("torch"):
        ref_seq = prompt + generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=24, trace_topk=0)).generated_ids
    drafter = OracleDrafter(ref_seq, 200, OracleSpec(p=0.5, rank=1, block=6, seed=2))
    calls = []
    real = static_kernels.tree_gdn_commit_layers_static
    monkeypatch.setattr(static_kernels, "tree_gdn_commit_layers_static", lambda *a: calls.append(1) or real(*a))
    runs = {}
    for stacked in (True, False):
        for method in ("ddtree", "ar"):
            cfg = GenerationConfig(method=method, budget=10, max_new_tokens=14, trace_topk=0, draft_trace_k=0)
            calls.clear()
            with torch.no_grad(), tk.use_backend(backend), qwen3_5.use_stacked_commit(stacked):
                engine = FastEngine(target, drafter, cfg, max_len=48, use_graphs=False)
                trace = engine.generate(prompt)
            gdn_layers = sum(isinstance(c, qwen3_5.RecurrentCache) for c in engine.cache.layers)
            assert len(engine.cache.shared) == (1 if stacked else 0) and gdn_layers >= 2
            if stacked:
                assert len(engine.cache.shared[0].members) == gdn_layers
            if stacked and method == "ddtree":  # (one round more may run: the device is kept a round ahead)
                assert len(trace.rounds) <= len(calls) <= len(trace.rounds) + 1
            else:
                assert not calls, (stacked, method)
            runs[stacked, method] = trace
            assert trace.generated_ids == ref_seq[len(prompt) : len(prompt) + 14], (stacked, method)
    assert [r.accepted for r in runs[True, "ddtree"].rounds] == [r.accepted for r in runs[False, "ddtree"].rounds]
    assert any(r.through_sibling for r in runs[True, "ddtree"].rounds)


def test_the_round_fusions_are_on_unless_the_environment_says_no():
    """The three switches bench.e2e compares (stacked commit, KV commit launch, fused conv + gates):
    on by default, off for a process started with their variables at 0."""
    import os
    import subprocess
    import sys

    code = ("import tree_kernels as tk, tree_kernels.static as st; from workbench.models import qwen3_5 as q; "
            "print(q.stacked_commit_enabled(), st.kv_commit_launch_enabled(), tk.fused_conv_gates_enabled())")
    env = dict(os.environ)
    for name in ("WORKBENCH_STACKED_COMMIT", "WORKBENCH_KV_COMMIT_LAUNCH", "WORKBENCH_FUSED_CONV_GATES"):
        env.pop(name, None)
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    env.update(WORKBENCH_STACKED_COMMIT="0", WORKBENCH_KV_COMMIT_LAUNCH="0", WORKBENCH_FUSED_CONV_GATES="0")
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert on == ["True"] * 3 and off == ["False"] * 3


def test_phase_ms_reads_each_phase_between_its_marks():
    """The per-phase GPU times of a round (FastEngine(phase_events=True)) from the marks' stamps:
    each phase between its two marks, the draft and the draft-to-round gap only when a draft ran."""
    from workbench.fastpath import PHASE_MARKS, phase_ms

    stamp = {m: float(i * i) for i, m in enumerate(PHASE_MARKS)}  # distinct gaps: a wrong pair shows
    got = phase_ms(lambda a, b: stamp[b] - stamp[a], drafted=True)
    assert got["draft"] == stamp["draft_end"] - stamp["draft_start"]
    assert got["gap"] == stamp["round_start"] - stamp["draft_end"]
    assert got["verify"] == stamp["verify"] - stamp["tree"] and got["commit"] == stamp["commit"] - stamp["walk"]
    parts = sum(got[k] for k in ("tree", "verify", "walk", "commit", "pack"))
    assert got["round"] == pytest.approx(parts)  # the phases tile the round step
    assert "draft" not in phase_ms(lambda a, b: stamp[b] - stamp[a], drafted=False)


def test_phase_events_need_cuda_and_a_serial_host():
    target = random_target("hybrid", seed=1, vocab_size=64, eos_token_id=None)
    cfg = GenerationConfig(method="ar", max_new_tokens=4, trace_topk=0, draft_trace_k=0)
    with pytest.raises(ValueError, match="phase_events needs overlap_host=False"):
        FastEngine(target, None, cfg, max_len=32, use_graphs=False, phase_events=True)
    with pytest.raises(FastPathUnsupported, match="phase_events are CUDA events"):
        FastEngine(target, None, cfg, max_len=32, use_graphs=False, overlap_host=False, phase_events=True)
    engine = FastEngine(target, None, cfg, max_len=32, use_graphs=False, overlap_host=False)
    trace = engine.generate([3, 5, 7])  # no marks: the rounds carry host timings only
    assert trace.rounds and all(not any(k.startswith("gpu_") for k in r.timings) for r in trace.rounds)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("causal", [False, True])
def test_static_drafts_through_tree_attention_equal_the_reference_drafts(backend, causal):
    """The fast path's draft pass reads the drafter's cache through the tree-attention kernel (the
    block as a tree over the committed prefix: all-ones or, causal, lower-triangular): the same
    drafts, round for round, as the reference engine's masked SDPA (tokens exactly, log-probs to
    rounding), for a non-causal and a causal drafter, on the torch references and the Triton
    kernels (interpreted on CPU)."""
    import dataclasses

    import tree_kernels as tk

    target = random_target("hybrid", seed=8, vocab_size=300, eos_token_id=None)
    model = random_dflash(target, seed=4, block_size=6, num_layers=2)
    model.config = dataclasses.replace(model.config, is_causal=causal)
    for layer in model.layers:
        layer.self_attn.causal = causal
    drafter = DFlashDrafter(model, target)
    cfg = GenerationConfig(method="ddtree", budget=12, max_new_tokens=20, trace_topk=0, draft_trace_k=6)
    prompt = list(range(40, 60))
    with tk.use_backend("torch"):
        ref = generate(target, prompt, cfg, drafter)
    with torch.no_grad(), tk.use_backend(backend):
        fast = FastEngine(target, drafter, cfg, max_len=100, use_graphs=False).generate(prompt)
    assert [r.draft_tokens for r in fast.rounds] == [[row[:6] for row in r.draft_tokens] for r in ref.rounds]
    for f, r in zip(fast.rounds, ref.rounds):
        assert np.allclose(f.draft_logprobs, [row[:6] for row in r.draft_logprobs], atol=2e-4)
    assert fast.generated_ids == ref.generated_ids


def test_the_rotary_table_rows_are_the_computed_ones_and_outlive_a_longer_table():
    """Rotary.table_rows (the fast path's static trees) gives cos_sin's values bit for bit, past
    the table's end its last row; a longer table built later (another engine) leaves the first
    one's tensor intact for the engine that captured with it; a table of another dtype is not used."""
    target = random_target("hybrid", seed=2, vocab_size=300, eos_token_id=None)
    rot = target.rotary
    first = rot.build_table(40, torch.float32)
    assert rot.build_table(30, torch.float32) is first  # covered: reused
    pos = torch.tensor([0, 5, 5, 6, 39, 17])
    cos, sin = rot.table_rows(pos, torch.float32)
    want_cos, want_sin = rot.cos_sin(pos, torch.float32)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    past = rot.table_rows(torch.tensor([45]), torch.float32)[0]
    assert torch.equal(past, rot.cos_sin(torch.tensor([39]), torch.float32)[0])
    kept = first.clone()
    longer = rot.build_table(80, torch.float32)
    assert longer is not first and torch.equal(first, kept) and torch.equal(longer[:40], first)
    assert torch.equal(rot.table_rows(torch.tensor([70]), torch.float32)[1], rot.cos_sin(torch.tensor([70]), torch.float32)[1])
    half = rot.table_rows(pos, torch.bfloat16)  # no bf16 table: computed
    assert torch.equal(half[0], rot.cos_sin(pos, torch.bfloat16)[0])
    engine = FastEngine(target, None, GenerationConfig(method="ar", max_new_tokens=4, trace_topk=0), max_len=200, use_graphs=False)
    assert engine._rotary_table.shape[0] >= engine.cache.capacity and rot._table[0] is engine._rotary_table


def test_a_chain_from_its_skeleton_is_the_chain_built_whole_and_aliases_nothing():
    from workbench.tree import chain_skeleton

    g = torch.Generator().manual_seed(4)
    for depth in (0, 1, 7):
        toks, lps = torch.randint(0, 99, (depth, 3), generator=g), torch.randn(depth, 3, generator=g)
        root = torch.tensor(5)
        whole = build_chain_static(toks, lps, root)
        fast = build_chain_static(toks, lps, root, chain_skeleton(depth, "cpu"))
        for name in ("tokens", "parents", "depths", "scores", "ranks", "valid"):
            assert torch.equal(getattr(whole, name), getattr(fast, name)), (depth, name)
        root.fill_(9)  # the round overwrites the bonus buffer after building its tree
        assert int(fast.tokens[0]) == 5
    with pytest.raises(ValueError, match="skeleton of 7 drafts for a chain of 2"):
        build_chain_static(toks[:2], lps[:2], root, chain_skeleton(7, "cpu"))
