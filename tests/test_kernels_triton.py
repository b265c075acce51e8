"""Triton tree kernels against their torch references, on CPU under TRITON_INTERPRET=1.

The interpreter runs the very kernel bodies the GPU compiles (grids, masks, block loops,
split-K tickets), with numpy arithmetic. Shapes are small so the file stays quick, but cover
what breaks kernels: odd head counts, value/key head ratio 3, dk != dv, non-power-of-two
dims, prefix 0 and > 0, trees of 1..256 nodes (several solve blocks), conv widths 2..4,
sliding windows, split-K merges. Outputs are allocated NaN-poisoned so an element a kernel
forgets to write fails the comparison.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch
from trees import random_tree

# The interpreter is chosen when a function is decorated, and that includes triton.language's
# own @jit helpers (tl.zeros, tl.sum, ...), decorated when triton is first imported: so the
# variable must be set before triton is imported at all. It is put back afterwards for the
# rest of this process (and set again while these tests run). If something imported triton earlier, the kernels cannot be
# interpreted here and the file re-runs itself in a fresh interpreter (see the last test).
_IN_PROCESS = "triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") == "1"
_MODULES = ("tree_kernels.tree_gdn.triton", "tree_kernels.tree_conv.triton", "tree_kernels.tree_attention.triton")
_old = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    pytest.importorskip("triton")
    for _name in _MODULES:
        if _name in sys.modules:
            importlib.reload(sys.modules[_name])
        else:
            importlib.import_module(_name)
finally:
    if _old is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _old

import tree_kernels as tk  # noqa: E402
from tree_kernels import _triton_common  # noqa: E402
from tree_kernels.tree_attention import naive as attn_naive  # noqa: E402
from tree_kernels.tree_attention import triton as attn_tr  # noqa: E402
from tree_kernels.tree_conv import naive as conv_naive  # noqa: E402
from tree_kernels.tree_conv import triton as conv_tr  # noqa: E402
from tree_kernels.tree_gdn import naive as gdn_naive  # noqa: E402
from tree_kernels.tree_gdn import triton as gdn_tr  # noqa: E402
from workbench.tree import Tree, compile_chain, compile_tree  # noqa: E402


class _PoisonTorch:
    """``torch`` as the kernel wrappers see it, except that ``empty`` comes back NaN-filled."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*size, dtype=None, device=None, **kw):
        x = torch.empty(*size, dtype=dtype, device=device, **kw)
        return x.fill_(float("nan") if x.is_floating_point() else -7)

    @staticmethod
    def empty_like(x, **kw):
        y = torch.empty_like(x, **kw)
        return y.fill_(float("nan") if y.is_floating_point() else -7)


@pytest.fixture(autouse=True, scope="module")
def interpret_env():
    """The interpreter reads the variable again while it runs (lazy imports): keep it set here."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if old is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = old


@pytest.fixture(autouse=True)
def poisoned(request, monkeypatch, interpret_env):
    if not _IN_PROCESS and request.node.name != "test_file_in_a_fresh_interpreter":
        pytest.skip("triton was imported before TRITON_INTERPRET was set: covered by the subprocess run")
    p = _PoisonTorch()
    for mod in (gdn_tr, conv_tr, attn_tr, _triton_common):
        monkeypatch.setattr(mod, "torch", p)
    _triton_common._SCRATCH.clear()  # split-K partials re-allocated poisoned
    yield
    _triton_common._SCRATCH.clear()


def maxdiff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.isfinite(a).all(), "non-finite (unwritten?) kernel output"
    return (a.double() - b.double()).abs().max().item()


# --------------------------------------------------------------------------------- gated delta rule

GDN_TREES = [
    (1, 1, "mixed"),
    (2, 1, "wide"),
    (7, 3, "mixed"),
    (16, 16, "deep"),
    (33, 2, "wide"),
    (64, 16, "mixed"),
    (100, 5, "wide"),
    (256, 16, "mixed"),
]
# (key heads, value/key ratio, dk, dv)
GDN_SHAPES = [(1, 3, 8, 12), (3, 1, 16, 8), (3, 3, 12, 20)]


def gdn_inputs(t, h, r, dk, dv, seed, vdtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hv = h * r
    q = torch.nn.functional.normalize(torch.randn(t, h, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(t, h, dk, generator=g), dim=-1)
    v = torch.randn(t, hv, dv, generator=g).to(vdtype)
    gate = -torch.rand(t, hv, generator=g) * 2.0
    beta = torch.rand(t, hv, generator=g).to(vdtype)
    s0 = torch.randn(hv, dk, dv, generator=g)
    return q, k, v, gate, beta, s0


def check_gdn(tree, shape, seed, config=None, vdtype=torch.float32, tol=2e-5):
    c = compile_tree(tree, 0)
    n = len(tree)
    q, k, v, gate, beta, s0 = gdn_inputs(n, *shape, seed=seed, vdtype=vdtype)
    o, st = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=config)
    o_ref, st_ref = gdn_naive.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc)
    assert o.dtype == torch.float32 and st.u.dtype == torch.float32
    assert maxdiff(o, o_ref) < tol
    assert maxdiff(st.u, st_ref.u) < tol
    assert maxdiff(st.G, st_ref.G) < 1e-5
    assert maxdiff(st.k, st_ref.k) == 0.0
    # commit: equals the reference commit and the sequential recurrence along the path
    for node in sorted({0, n - 1, n // 2, tree.leaves()[0]}):
        path = tree.path_to(node)
        s = gdn_tr.tree_gdn_commit(st, s0, path)
        assert maxdiff(s, gdn_naive.tree_gdn_commit(st_ref, s0, path)) < tol
        # a device index tensor (the accepted node is read in the kernel: no host sync)
        assert maxdiff(gdn_tr.tree_gdn_commit(st, s0, torch.tensor(path)), s) < 1e-6
        if node == n - 1:
            _, seq = gdn_naive.gdn_chain_sequential(q[path], k[path], v[path], gate[path], beta[path], s0)
            assert maxdiff(s, seq[-1]) < 1e-4
    return o, st


@pytest.mark.parametrize("n,depth,shape", GDN_TREES)
def test_gdn_fork_and_commit_match_reference(n, depth, shape):
    tree = random_tree(n, depth, seed=n + 1, shape=shape)
    for i, dims in enumerate(GDN_SHAPES if n <= 100 else GDN_SHAPES[:1]):
        # BS=16: blocked solve with read-back of earlier blocks (n > 16); BV below dv: column split
        check_gdn(tree, dims, seed=10 * n + i, config={"BS": 16, "BV": 16})
    # the variant with the gates and diagonal inverses precomputed by a second launch
    check_gdn(tree, GDN_SHAPES[2 if n <= 100 else 0], seed=n + 7, config={"BS": 16, "BV": 16, "PRE_INVERSE": True})
    if n <= 64:
        check_gdn(tree, GDN_SHAPES[2], seed=n, config=None)  # the default (GPU) configuration


@pytest.mark.parametrize("bs,pre", [(16, False), (32, False), (16, True), (32, True)])
def test_gdn_block_size_and_solve_variant_do_not_change_the_result(bs, pre):
    tree = random_tree(70, 8, seed=4)
    o16, st16 = check_gdn(tree, (1, 3, 8, 12), seed=1, config={"BS": 16, "BV": 16})
    o, st = check_gdn(tree, (1, 3, 8, 12), seed=1, config={"BS": bs, "BV": 16, "PRE_INVERSE": pre})
    assert maxdiff(o, o16) < 1e-5 and maxdiff(st.G, st16.G) < 1e-6


def test_gdn_blocked_config_takes_the_prepare_launch_only_for_several_blocks():
    from tree_kernels.tree_gdn import triton as tg

    # one diagonal block after the peeled root
    assert not tg.blocked_config(17, 128).get("PRE_INVERSE", False)
    big = tg.blocked_config(18, 128)
    assert big["PRE_INVERSE"] and big["BS"] == 16 and big["BV"] == 32 and big["PRE_OFFDIAG"]
    assert tg.blocked_config(17, 128)["ROOT_PEEL"] and not big["ROOT_PEEL"]  # the peel pays only without stored blocks
    assert tg.blocked_config(257, 128)["PRE_OFFDIAG"]
    assert not tg.blocked_config(258, 128)["PRE_OFFDIAG"]  # nb^2 stored blocks: not measured
    assert tg.blocked_config(64, 12)["BV"] == 16  # never wider than dv needs
    # the blocked default on a tree of several blocks equals the single-launch kernel and the reference
    tree = random_tree(40, 6, seed=9)
    o_blocked, _ = check_gdn(tree, (1, 3, 8, 12), seed=2, config=tg.blocked_config(40, 12))
    o_single, _ = check_gdn(tree, (1, 3, 8, 12), seed=2, config={"PRE_INVERSE": False})
    assert maxdiff(o_blocked, o_single) < 1e-5


def test_gdn_default_config_is_dense_for_one_block_after_a_known_root(monkeypatch):
    from tree_kernels.tree_gdn import triton as tg

    dev = torch.device("cpu")
    assert tg.default_config(9, 48, 128, dev)["DENSE"] and tg.default_config(9, 48, 128, dev)["BN"] == 16
    assert tg.default_config(17, 48, 128, dev, rooted=True)["BN"] == 16  # budget 16 + the root
    assert not tg.default_config(17, 48, 128, dev)["DENSE"]  # no known root: 17 nodes are two blocks
    assert not tg.default_config(33, 48, 128, dev, rooted=True)["DENSE"]  # measured slower than blocked
    assert not tg.default_config(1, 48, 128, dev)["DENSE"]
    with tg.dense_fork(True):  # the comparison switch reaches the kernels' largest tile
        assert tg.default_config(65, 48, 128, dev, rooted=True)["BN"] == 64
        assert not tg.default_config(65, 48, 128, dev)["DENSE"]
        assert not tg.default_config(66, 48, 128, dev, rooted=True)["DENSE"]
    assert tg.DENSE_MAX_NODES == 16  # restored
    monkeypatch.setattr(tg, "DENSE_MAX_NODES", 0)
    assert not tg.default_config(9, 48, 128, dev, rooted=True)["DENSE"]


def _gdn_case(n, shape, seed):
    return gdn_inputs(n, *shape, seed=seed)


@pytest.mark.parametrize("n", [2, 9, 17, 33, 64, 65])
@pytest.mark.parametrize("shape", [(1, 3, 8, 12), (3, 3, 12, 20)])
def test_gdn_dense_kernel_equals_the_reference_and_the_blocked_solve(n, shape):
    """The one-block kernel (recursive-doubling inverse, no chain) against the torch reference and
    the blocked solve, with the root peeled (rooted) or not (n <= 64)."""
    from tree_kernels.tree_gdn import triton as tg

    tree = random_tree(n, 8, seed=n + 3, shape="mixed")
    c = compile_tree(tree, 0)
    q, k, v, gate, beta, s0 = _gdn_case(n, shape, seed=n)
    o_ref, st_ref = gdn_naive.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc)
    o_blk, st_blk = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=tg.blocked_config(n, shape[3]))
    for rooted in ([True, False] if n <= 64 else [True]):
        with tg.dense_fork(True):
            cfg = tg.default_config(n, shape[0] * shape[1], shape[3], torch.device("cpu"), rooted)
            assert cfg["DENSE"]
            o, st = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, rooted=rooted)
        assert maxdiff(o, o_ref) < 2e-5 and maxdiff(st.u, st_ref.u) < 2e-5
        assert maxdiff(st.G, st_ref.G) < 1e-5 and maxdiff(st.k, st_ref.k) == 0.0
        assert maxdiff(o, o_blk) < 2e-5 and maxdiff(st.u, st_blk.u) < 2e-5
        path = tree.path_to(n - 1)
        assert maxdiff(gdn_tr.tree_gdn_commit(st, s0, path), gdn_naive.tree_gdn_commit(st_ref, s0, path)) < 2e-5


def _chains_anc(sizes):
    """Ancestor-or-self mask of chains side by side (node 0 is not every node's ancestor)."""
    n = sum(sizes)
    anc = torch.zeros(n, n, dtype=torch.bool)
    lo = 0
    for m in sizes:
        anc[lo:lo + m, lo:lo + m] = torch.ones(m, m, dtype=torch.bool).tril()
        lo += m
    return anc


def test_gdn_dense_kernel_on_a_forest_peels_nothing_and_stays_exact():
    anc = _chains_anc([7, 12, 5])
    q, k, v, gate, beta, s0 = _gdn_case(24, (1, 3, 8, 12), seed=5)
    o_ref, st_ref = gdn_naive.tree_gdn_fork(q, k, v, gate, beta, s0, anc)
    o, st = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, anc, config={"DENSE": True})
    assert maxdiff(o, o_ref) < 2e-5 and maxdiff(st.u, st_ref.u) < 2e-5 and maxdiff(st.G, st_ref.G) < 1e-5


def test_gdn_dense_kernel_poisons_a_tree_wrongly_declared_rooted():
    """65 nodes only fit after a peeled root: a forest passed as rooted gets NaN, not wrong numbers."""
    anc = _chains_anc([30, 35])
    q, k, v, gate, beta, s0 = _gdn_case(65, (1, 3, 8, 12), seed=6)
    o, _ = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, anc, rooted=True, config={"DENSE": True})
    assert torch.isnan(o[:64]).all()
    with pytest.raises(ValueError, match="BN=16 is smaller than the 65 nodes"):
        gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, anc, rooted=True, config={"DENSE": True, "BN": 16})


@pytest.mark.parametrize("n", [17, 33, 65])
@pytest.mark.parametrize("pre", [False, True])
def test_gdn_root_peel_equals_the_unpeeled_solve(n, pre):
    """16 k + 1 nodes (a budget plus the root): peeled, the root's step runs in registers and the
    blocks start at node 1; the result is the unpeeled solve's and the reference's."""
    tree = random_tree(n, 8, seed=n, shape="mixed")
    base = {"BS": 16, "BV": 16, "PRE_INVERSE": pre}
    o_peel, st_peel = check_gdn(tree, (1, 3, 8, 12), seed=n, config=dict(base, ROOT_PEEL=True))
    o_flat, st_flat = check_gdn(tree, (1, 3, 8, 12), seed=n, config=dict(base, ROOT_PEEL=False))
    assert maxdiff(o_peel, o_flat) < 1e-5 and maxdiff(st_peel.u, st_flat.u) < 1e-5
    assert maxdiff(st_peel.G, st_flat.G) < 1e-6 and maxdiff(st_peel.k, st_flat.k) == 0.0


@pytest.mark.parametrize("n", [33, 65, 100])
def test_gdn_precomputed_off_diagonal_blocks_equal_the_solve(n):
    """PRE_OFFDIAG: the prepare launch also stores L_bc and M_bc (they do not depend on u), so the
    solve's chain is two dots a step; same result as the blocked solve and the reference."""
    tree = random_tree(n, 8, seed=n + 5, shape="mixed")
    base = {"BS": 16, "BV": 16, "PRE_INVERSE": True}
    o_off, st_off = check_gdn(tree, (1, 3, 8, 12), seed=n, config=dict(base, PRE_OFFDIAG=True))
    o_blk, st_blk = check_gdn(tree, (1, 3, 8, 12), seed=n, config=base)
    assert maxdiff(o_off, o_blk) < 1e-5 and maxdiff(st_off.u, st_blk.u) < 1e-5
    check_gdn(tree, (3, 3, 12, 20), seed=n + 1, config=dict(base, PRE_OFFDIAG=True, ROOT_PEEL=False))


@pytest.mark.parametrize("n,bs", [(33, 16), (65, 16), (100, 16), (65, 32)])
def test_gdn_state_products_in_the_prepare_equal_the_solve(n, bs):
    """PRE_S0: the prepare's extra programs take every block's K_b S0 and Q_b S0 (dk = 40 in chunks
    of 16, dv = 20 in value tiles of 16: both ragged) and store the right-hand side and the output
    before the u terms; the chain kernel starts from them, its earlier-block terms a dot per block or
    one wide dot (WIDE_OFF; 100 nodes at BS 16 are past its 128 and take the loop). Same o, stash and
    commits as without, and the reference's (check_gdn); a peeled root takes the fork kernel's own
    products (no S0P), still exact."""
    tree = random_tree(n, 8, seed=n + 17, shape="mixed")
    base = {"BS": bs, "BV": 16, "PRE_INVERSE": True, "PRE_OFFDIAG": True, "ROOT_PEEL": False}
    o_plain, st_plain = check_gdn(tree, (2, 3, 40, 20), seed=n, config=base)
    for extra in ({"S0_BV": 16, "S0_BKC": 16}, {"S0_BV": 32, "S0_BKC": 64, "WIDE_OFF": True},
                  {"S0_BV": 16, "S0_BKC": 16, "WIDE_SCANS": True, "WIDE_OFF": True, "num_warps": 2}):
        o_s0, st_s0 = check_gdn(tree, (2, 3, 40, 20), seed=n, config=dict(base, PRE_S0=True, **extra))
        assert maxdiff(o_s0, o_plain) < 1e-5 and maxdiff(st_s0.u, st_plain.u) < 1e-5
        assert maxdiff(st_s0.k, st_plain.k) == 0.0 and maxdiff(st_s0.G, st_plain.G) < 5e-6  # (wide scans: another sum order)
    check_gdn(tree, (1, 3, 8, 12), seed=n, config=dict(base, PRE_S0=True, ROOT_PEEL=True))
    # a forest: the unpeeled route's products still hold (S0 is every root's state)
    anc = _chains_anc([n // 2, n - n // 2])
    q, k, v, gate, beta, s0 = _gdn_case(n, (1, 3, 8, 12), seed=7)
    o, st = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, anc, config=dict(base, PRE_S0=True))
    o_ref, st_ref = gdn_naive.tree_gdn_fork(q, k, v, gate, beta, s0, anc)
    assert maxdiff(o, o_ref) < 2e-5 and maxdiff(st.u, st_ref.u) < 2e-5


def test_gdn_state_products_are_a_blocked_variant():
    with gdn_tr.blocked_variant(PRE_S0=True, S0_BV=32):
        cfg = gdn_tr.blocked_config(65, 128)
        assert cfg["PRE_S0"] and cfg["S0_BV"] == 32 and not cfg["ROOT_PEEL"]


@pytest.mark.parametrize("n,bs", [(33, 16), (65, 32), (100, 32)])
def test_gdn_prepare_doubling_inverse_equals_forward_substitution(n, bs):
    """PREP_DOUBLING: the prepare launch inverts each diagonal block by recursive doubling (dots
    only) instead of forward substitution, so blocks of 32 rows are affordable; same result as the
    forward-substitution prepare and the reference, peeled and not."""
    tree = random_tree(n, 8, seed=n + 7, shape="mixed")
    base = {"BS": bs, "BV": 16, "PRE_INVERSE": True, "PRE_OFFDIAG": True}
    for peel in (False, True):
        o_dbl, st_dbl = check_gdn(tree, (1, 3, 8, 12), seed=n, config=dict(base, PREP_DOUBLING=True, ROOT_PEEL=peel))
        o_fs, st_fs = check_gdn(tree, (1, 3, 8, 12), seed=n, config=dict(base, ROOT_PEEL=peel))
        assert maxdiff(o_dbl, o_fs) < 1e-5 and maxdiff(st_dbl.u, st_fs.u) < 1e-5


@pytest.mark.parametrize("n", [17, 33, 65, 100, 129])
def test_gdn_wide_mask_scans_equal_the_looped_scans(n):
    """WIDE_SCANS: the prepare's path sums and both kernels' root test from one wide load of the
    mask instead of a loop over blocks; the same solve (peeled and not, stored off-diagonal blocks
    or not), a forest still taking the unpeeled route. 129 nodes are past WIDE_SCANS_MAX_NODES:
    the loops run there and the result must not change either."""
    tree = random_tree(n, 8, seed=n + 11, shape="mixed")
    for base in ({"BS": 16, "BV": 16, "PRE_INVERSE": True, "PRE_OFFDIAG": True}, {"BS": 16, "BV": 16, "PRE_INVERSE": True}):
        for peel in (True, False):
            cfg = dict(base, ROOT_PEEL=peel)
            o_wide, st_wide = check_gdn(tree, (1, 3, 8, 12), seed=n, config=dict(cfg, WIDE_SCANS=True))
            o_loop, st_loop = check_gdn(tree, (1, 3, 8, 12), seed=n, config=cfg)
            assert maxdiff(o_wide, o_loop) < 1e-5 and maxdiff(st_wide.u, st_loop.u) < 1e-5
            assert maxdiff(st_wide.G, st_loop.G) < 5e-6  # fp32 sums of the same terms in another order (|G| ~ 10)
    if n == 65:  # a forest (node 0 not everyone's ancestor) through the peeled, wide route
        anc = _chains_anc([30, 35])
        q, k, v, gate, beta, s0 = _gdn_case(65, (1, 3, 8, 12), seed=6)
        cfg = {"BS": 16, "BV": 16, "PRE_INVERSE": True, "PRE_OFFDIAG": True, "ROOT_PEEL": True, "WIDE_SCANS": True}
        o, _ = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, anc, config=cfg)
        assert maxdiff(o, gdn_naive.tree_gdn_fork(q, k, v, gate, beta, s0, anc)[0]) < 2e-5


def test_gdn_blocked_variant_switches_the_default_config():
    with gdn_tr.blocked_variant(WIDE_SCANS=True, ROOT_PEEL=True, PREP_BKC=32, prep_warps=4):
        cfg = gdn_tr.blocked_config(65, 128)
        assert cfg["WIDE_SCANS"] and cfg["ROOT_PEEL"] and cfg["PRE_OFFDIAG"] and cfg["PREP_BKC"] == 32
        assert cfg["prep_warps"] == 4
        assert "WIDE_SCANS" not in gdn_tr.blocked_config(300, 128)  # no stored blocks: not these settings
    assert gdn_tr.blocked_config(65, 128)["PREP_BKC"] == gdn_tr.OFFDIAG_DEFAULTS["PREP_BKC"]
    with pytest.raises(ValueError, match="unknown setting.*'PEEL'"):
        with gdn_tr.blocked_variant(PEEL=True):
            pass


@pytest.mark.parametrize("n", [33, 65])
def test_gdn_prepare_in_dk_chunks_equals_the_whole_dk_prepare(n):
    """PREP_BKC: the prepare's K K^T and Q K^T summed over dk in chunks (dk = 40 in chunks of 16:
    the last chunk ragged); the same solve as the whole-dk prepare, peeled, wide scans, 2 warps."""
    tree = random_tree(n, 8, seed=n + 13, shape="mixed")
    base = {"BS": 16, "BV": 16, "PRE_INVERSE": True, "PRE_OFFDIAG": True}
    o_whole, st_whole = check_gdn(tree, (2, 3, 40, 12), seed=n, config=base)
    for extra in ({"PREP_BKC": 16}, {"PREP_BKC": 16, "ROOT_PEEL": True, "WIDE_SCANS": True, "prep_warps": 2}):
        o_chunk, st_chunk = check_gdn(tree, (2, 3, 40, 12), seed=n, config=dict(base, **extra))
        assert maxdiff(o_chunk, o_whole) < 1e-5 and maxdiff(st_chunk.u, st_whole.u) < 1e-5


def test_gdn_blocked_solve_refuses_a_block_size_that_is_not_a_power_of_two():
    tree = random_tree(20, 4, seed=3)
    q, k, v, gate, beta, s0 = gdn_inputs(20, 1, 3, 8, 12, seed=3)
    with pytest.raises(ValueError, match="BS=24"):
        gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, compile_tree(tree, 0).anc, config={"BS": 24, "PRE_INVERSE": True})


def _forest_anc(trees):
    """Block-diagonal ancestor mask of several trees side by side: node 0 is not everyone's ancestor."""
    ancs = [compile_tree(t, 0).anc for t in trees]
    n = sum(a.shape[0] for a in ancs)
    anc = torch.zeros(n, n, dtype=torch.bool)
    o = 0
    for a in ancs:
        anc[o:o + a.shape[0], o:o + a.shape[0]] = a
        o += a.shape[0]
    return anc


@pytest.mark.parametrize("pre", [False, True, "offdiag"])
def test_gdn_fork_on_a_forest_is_exact(pre):
    """The peel is chosen from the mask on the device: a forest (two roots) takes the unpeeled path
    and still equals the reference; a single isolated node first, then a tree, and the reverse."""
    for trees in ([random_tree(1, 1, seed=1), random_tree(24, 6, seed=2)],
                  [random_tree(20, 6, seed=3), random_tree(14, 4, seed=4)]):
        anc = _forest_anc(trees)
        n = anc.shape[0]
        q, k, v, gate, beta, s0 = gdn_inputs(n, 1, 3, 8, 12, seed=n)
        cfg = {"BS": 16, "BV": 16, "PRE_INVERSE": bool(pre), "PRE_OFFDIAG": pre == "offdiag"}
        o, st = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, anc, config=cfg)
        o_ref, st_ref = gdn_naive.tree_gdn_fork(q, k, v, gate, beta, s0, anc)
        assert maxdiff(o, o_ref) < 2e-5 and maxdiff(st.u, st_ref.u) < 2e-5 and maxdiff(st.G, st_ref.G) < 1e-5
        second = len(trees[0])
        path = [second + i for i in trees[1].path_to(len(trees[1]) - 1)]
        s = gdn_tr.tree_gdn_commit(st, s0, path)
        _, seq = gdn_naive.gdn_chain_sequential(q[path], k[path], v[path], gate[path], beta[path], s0)
        assert maxdiff(s, seq[-1]) < 1e-4


def test_gdn_model_dtypes():
    """v and beta in bf16 (as the model passes them): the kernel upcasts like the reference."""
    tree = random_tree(40, 6, seed=2)
    check_gdn(tree, (2, 3, 16, 24), seed=3, config={"BS": 16, "BV": 16}, vdtype=torch.bfloat16)
    check_gdn(tree, (2, 3, 16, 24), seed=3, config={"BS": 16, "BV": 16, "PRE_INVERSE": True}, vdtype=torch.bfloat16)


def test_gdn_exp_is_selected_before_the_mask():
    tree = Tree.from_parents(list(range(6)), [-1, 0, 0, 1, 2, 2])
    c = compile_tree(tree, 0)
    q, k, v, gate, beta, s0 = gdn_inputs(6, 1, 3, 8, 8, seed=0)
    gate = torch.tensor([[-1.0], [-200.0], [-0.1], [-300.0], [-0.2], [-90.0]]).expand(6, 3).contiguous()
    o, _ = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config={"BS": 16, "BV": 16})
    o_paths, _ = gdn_naive.tree_gdn_paths(q, k, v, gate, beta, s0, c.parents)
    assert maxdiff(o, o_paths) < 1e-4


def test_gdn_flattened_order_is_not_the_tree():
    """The kernel really uses the mask: the flattened (unsafe) chain gives different outputs."""
    tree = Tree.from_parents([1, 2, 3, 4], [-1, 0, 0, 2])
    c = compile_tree(tree, 0)
    q, k, v, gate, beta, s0 = gdn_inputs(4, 1, 1, 8, 8, seed=5)
    o_tree, _ = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc)
    o_flat, _ = gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, c.flattened().anc)
    o_paths, _ = gdn_naive.tree_gdn_paths(q, k, v, gate, beta, s0, c.parents)
    assert maxdiff(o_tree, o_paths) < 1e-5
    assert maxdiff(o_flat[2:], o_paths[2:]) > 1e-2


def test_gdn_long_chain_through_the_verify_chunks():
    """Prefill-style chains > CHAIN_CHUNK nodes run chunk by chunk (fork + commit over ranges 0..P-1)."""
    from workbench.verify import tree_recurrence

    n = 150
    q, k, v, gate, beta, s0 = gdn_inputs(n, 1, 3, 8, 12, seed=9)
    chain = compile_chain(list(range(n)), 0)
    with tk.use_backend("torch"):
        o_ref, pend_ref = tree_recurrence("fork", q, k, v, gate, beta, s0, chain)
        s_ref = pend_ref.commit(list(range(n)))
        mid_ref = pend_ref.commit(list(range(100)))
    with tk.use_backend("triton"):
        o, pend = tree_recurrence("fork", q, k, v, gate, beta, s0, chain)
        s = pend.commit(list(range(n)))
        mid = pend.commit(list(range(100)))
    assert maxdiff(o, o_ref) < 1e-4
    assert maxdiff(s, s_ref) < 1e-4
    assert maxdiff(mid, mid_ref) < 1e-4
    _, seq = gdn_naive.gdn_chain_sequential(q, k, v, gate, beta, s0)
    assert maxdiff(s, seq[-1]) < 1e-3


# --------------------------------------------------------------------------------------- conv1d

CONV_TREES = [(1, 1, "mixed"), (2, 1, "wide"), (7, 3, "mixed"), (16, 16, "deep"), (33, 2, "wide"), (100, 5, "wide"), (256, 16, "mixed")]


@pytest.mark.parametrize("n,depth,shape", CONV_TREES)
@pytest.mark.parametrize("width", [2, 3, 4])
def test_tree_conv_matches_reference(n, depth, shape, width):
    tree = random_tree(n, depth, seed=n * width, shape=shape)
    c = compile_tree(tree, 5)
    g = torch.Generator().manual_seed(n + width)
    ch = 37  # not a multiple of the channel block
    x, state = torch.randn(n, ch, generator=g), torch.randn(ch, width - 1, generator=g)
    w, b = torch.randn(ch, width, generator=g), torch.randn(ch, generator=g)
    idx = c.conv_table(width)
    y = conv_tr.tree_conv1d(x, state, w, b, idx, block_c=16)
    assert maxdiff(y, conv_naive.tree_conv1d(x, state, w, b, idx)) < 1e-5
    assert maxdiff(y, conv_naive.tree_conv1d_paths(x, state, w, b, c.parents)) < 1e-5
    y_lin = conv_tr.tree_conv1d(x, state, w, None, idx, activation=None)
    assert maxdiff(y_lin, conv_naive.tree_conv1d(x, state, w, None, idx, activation=None)) < 1e-5
    for node in sorted({0, n - 1, n // 2, tree.leaves()[-1]}):
        path = tree.path_to(node)
        ref = conv_naive.tree_conv_commit(x, state, path)
        assert torch.equal(conv_tr.tree_conv_commit(x, state, path, block_c=16), ref)
        assert torch.equal(conv_tr.tree_conv_commit(x, state, torch.tensor(path, dtype=torch.int32), block_c=16), ref)
    chain = list(range(min(n, 3)))  # the range fast case (no index tensor), short and long
    assert torch.equal(conv_tr.tree_conv_commit(x, state, chain), conv_naive.tree_conv_commit(x, state, chain))


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_decode_step_equals_a_one_node_tree_conv_then_commit(width, dtype):
    """The AR step's conv: one token's output and the window moved by one, in one launch (in
    place when out is the state), the same as the tree conv of a one-node chain and its commit."""
    g = torch.Generator().manual_seed(width)
    ch = 300  # not a multiple of the channel block
    x = torch.randn(1, ch, generator=g).to(dtype)
    state = torch.randn(ch, width - 1, generator=g).to(dtype)
    w3, b = torch.randn(ch, 1, width, generator=g).to(dtype), torch.randn(ch, generator=g).to(dtype)
    w = w3[:, 0, :]  # the model's strided view of conv1d.weight
    c = compile_chain([5], 9)
    y_tree = conv_tr.tree_conv1d(x, state, w, b, c.conv_table(width))
    y_ref, s_ref = conv_naive.conv1d_decode_step(x, state, w, b)
    assert torch.equal(s_ref, conv_naive.tree_conv_commit(x, state, [0]))
    assert maxdiff(y_ref.float(), conv_naive.tree_conv1d(x, state, w, b, c.conv_table(width)).float()) == 0
    y, s = conv_tr.conv1d_decode_step(x, state, w, b, block_c=128)
    assert torch.equal(y, y_tree) and torch.equal(s, s_ref)  # same fp32 sum in the same order as the tree kernel
    buf = state.clone()
    with tk.use_backend("triton"):
        y_in, s_in = tk.conv1d_decode_step(x, buf, w, None, activation=None, out=buf)
    assert s_in is buf and torch.equal(buf, s_ref)
    assert torch.equal(y_in, conv_tr.tree_conv1d(x, state, w, None, c.conv_table(width), activation=None))
    buf_ref = state.clone()  # the reference route honours out too
    _, s_ref_in = tk.conv1d_decode_step(x, buf_ref, w, b, out=buf_ref)
    assert s_ref_in is buf_ref and torch.equal(buf_ref, s_ref)


def test_conv_decode_step_names_the_bad_shape():
    x, state, w = torch.randn(2, 8), torch.randn(8, 3), torch.randn(8, 4)
    with pytest.raises(ValueError, match="one token"):
        conv_tr.conv1d_decode_step(x, state, w)
    with pytest.raises(ValueError, match="one token"):
        conv_naive.conv1d_decode_step(x, state, w)
    with pytest.raises(ValueError, match="out must be"):
        conv_tr.conv1d_decode_step(x[:1], state, w, out=state.double())
    with pytest.raises(ValueError, match="width 5"):
        conv_tr.conv1d_decode_step(x[:1], torch.randn(8, 4), torch.randn(8, 5))


def test_tree_conv_bf16_and_strided_weight():
    """The model passes conv1d.weight[:, 0, :] (a strided view) and bf16 activations."""
    tree = random_tree(30, 4, seed=7)
    c = compile_tree(tree, 3)
    g = torch.Generator().manual_seed(3)
    ch, width = 300, 4
    x = torch.randn(30, ch, generator=g).bfloat16()
    state = torch.randn(ch, width - 1, generator=g).bfloat16()
    w3 = torch.randn(ch, 1, width, generator=g).bfloat16()
    y = conv_tr.tree_conv1d(x, state, w3[:, 0, :], None, c.conv_table(width))
    ref32 = conv_naive.tree_conv1d(x.float(), state.float(), w3[:, 0, :].float(), None, c.conv_table(width))
    assert y.dtype == torch.bfloat16
    assert maxdiff(y.float(), ref32) < 2e-2 * max(1.0, ref32.abs().max().item())
    ref = conv_naive.tree_conv1d(x, state, w3[:, 0, :], None, c.conv_table(width))  # bf16 reference
    assert maxdiff(y.float(), ref.float()) < 4e-2 * max(1.0, ref32.abs().max().item())


# ------------------------------------------------------------------------------------ attention

ATTN_CASES = [
    # n, depth, shape, prefix, hq, hkv, d, window
    (1, 1, "mixed", 0, 3, 1, 16, None),
    (2, 1, "wide", 9, 6, 2, 24, None),
    (7, 3, "mixed", 0, 5, 5, 16, None),
    (16, 16, "deep", 40, 6, 2, 32, 8),
    (33, 2, "wide", 70, 3, 1, 16, None),
    (64, 16, "mixed", 37, 4, 2, 64, 20),
    (100, 5, "wide", 5, 2, 1, 16, 3),
    (256, 16, "mixed", 3, 1, 1, 16, None),
    (5, 2, "mixed", 20, 6, 2, 256, None),  # the production head dim (its own default blocks)
]


def attn_inputs(n, prefix, hq, hkv, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, hq, d, generator=g).to(dtype)
    # cache rows as the model has them: a contiguous view of a larger buffer
    kbuf = torch.randn(prefix + n + 11, hkv, d, generator=g).to(dtype)
    vbuf = torch.randn(prefix + n + 11, hkv, d, generator=g).to(dtype)
    return q, kbuf[: prefix + n], vbuf[: prefix + n]


@pytest.mark.parametrize("n,depth,shape,prefix,hq,hkv,d,window", ATTN_CASES)
def test_tree_attention_matches_reference(n, depth, shape, prefix, hq, hkv, d, window):
    tree = random_tree(n, depth, seed=n + prefix, shape=shape)
    c = compile_tree(tree, prefix)
    q, k, v = attn_inputs(n, prefix, hq, hkv, d, seed=n)
    ref = attn_naive.tree_attention(q, k, v, c.anc, prefix, 0.3, c.positions, window)
    small = {"BLOCK_M": 16, "BLOCK_N": 16}
    runs = [
        dict(num_splits=1, config=small),
        dict(num_splits=3, config=small, bitmask=c.bitmask()),
        dict(num_splits=None, config=small),
        dict(num_splits=3, config=dict(small, MERGE="launch")),  # the merge as its own launch
    ]
    if n <= 64:
        runs.append(dict())  # the default (GPU) configuration
    for kw in runs:
        o = attn_tr.tree_attention(q, k, v, c.anc, prefix, 0.3, c.positions, window, **kw)
        assert o.dtype == q.dtype
        assert maxdiff(o, ref) < 1e-5, kw
        counters = _triton_common._SCRATCH[("attn_counter", "cpu", torch.int32, None)]
        assert int(counters.abs().sum()) == 0  # tickets reset for the next launch


@pytest.mark.parametrize("merge", ["ticket", "launch"])
def test_tree_attention_one_node_split_writes_and_merges_only_real_rows(merge):
    """The AR step's shape (one node, a GQA group of 3 in a 16-row block, split over the keys):
    correct, and the split partials of the 13 padding rows are neither written nor read, with
    the merge in the last split's program (ticket) or as its own launch."""
    from workbench.tree import Tree

    c = compile_tree(Tree.from_parents([5], [-1]), 100)
    q, k, v = attn_inputs(1, 100, 6, 2, 64, seed=3)
    ref = attn_naive.tree_attention(q, k, v, c.anc, 100, None, c.positions, None)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "MERGE": merge}
    attn_tr.tree_attention(q, k, v, c.anc, 100, None, c.positions, None, num_splits=4, config=cfg)
    part_o = _triton_common._SCRATCH[("attn_part_o", "cpu", torch.float32, None)]
    part_l = _triton_common._SCRATCH[("attn_part_l", "cpu", torch.float32, None)]
    part_o.fill_(7.0)
    part_l.fill_(float("nan"))  # a padding row read by the merge would poison nothing but must not be read
    o = attn_tr.tree_attention(q, k, v, c.anc, 100, None, c.positions, None, num_splits=4, config=cfg)
    assert maxdiff(o, ref) < 1e-5
    splits = 4
    po = part_o[: splits * 2 * 16 * 64].view(splits, 2, 16, 64)
    pl = part_l[: splits * 2 * 16].view(splits, 2, 16)
    assert bool((po[:, :, 3:] == 7.0).all()) and bool(pl[:, :, 3:].isnan().all())  # padding untouched
    assert not bool((po[:, :, :3] == 7.0).any()) and bool(pl[:, :, :3].isfinite().all())  # real rows written


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tree_attention_half_types_and_mask_is_used(dtype):
    tree = random_tree(24, 4, seed=1)
    c = compile_tree(tree, 50)
    q, k, v = attn_inputs(24, 50, 6, 2, 32, seed=2, dtype=dtype)
    o = attn_tr.tree_attention(q, k, v, c.anc, 50, None, c.positions, None, num_splits=2, config={"BLOCK_M": 32, "BLOCK_N": 32})
    ref = attn_naive.tree_attention(q.float(), k.float(), v.float(), c.anc, 50, None, c.positions, None)
    assert o.dtype == dtype and maxdiff(o.float(), ref) < 2e-2
    # a chain mask over the same block (every earlier node visible) gives other outputs
    flat = attn_naive.tree_attention(q.float(), k.float(), v.float(), c.flattened().anc, 50, None, c.positions, None)
    assert maxdiff(o.float(), flat) > 5e-2


def test_tree_attention_production_head_dim_bf16_defaults():
    """D = 256 in bf16 takes its own default blocks (BLOCK_M = 128) and the split-K merge."""
    tree = random_tree(9, 3, seed=4)
    c = compile_tree(tree, 150)
    q, k, v = attn_inputs(9, 150, 6, 2, 256, seed=5, dtype=torch.bfloat16)
    assert attn_tr.default_config(9, 6, 2, 256, torch.bfloat16)["BLOCK_M"] == 128
    o = attn_tr.tree_attention(q, k, v, c.anc, 150, None, c.positions, None, num_splits=2)
    ref = attn_naive.tree_attention(q.float(), k.float(), v.float(), c.anc, 150, None, c.positions, None)
    assert o.dtype == torch.bfloat16 and maxdiff(o.float(), ref) < 2e-2


@pytest.mark.parametrize("nodes", [1, 2])
def test_tree_attention_decode_default_takes_small_row_blocks(nodes):
    """The AR step (one node) and two-node trees at D = 256, bf16: 16-row blocks, split over the keys
    through the device prefix over a longer buffer (as the fast path calls it), matching the reference."""
    from tree_kernels.static import tree_attention_static

    cfg = attn_tr.default_config(nodes, 6, 2, 256, torch.bfloat16)
    assert cfg["BLOCK_M"] == 16 and attn_tr.default_config(6, 6, 2, 256, torch.bfloat16)["BLOCK_M"] == 128  # 18 rows
    q, k, v = attn_inputs(nodes, 150, 6, 2, 256, seed=7, dtype=torch.bfloat16)
    kbuf = torch.cat([k, torch.full((9, 2, 256), float("nan"), dtype=k.dtype)])  # rows past P + T: never read
    vbuf = torch.cat([v, torch.full((9, 2, 256), float("nan"), dtype=v.dtype)])
    anc = torch.tril(torch.ones(nodes, nodes, dtype=torch.bool))
    pos = torch.arange(150, 150 + nodes)
    with tk.use_backend("triton"):
        o = tree_attention_static(q, kbuf, vbuf, anc, torch.tensor(150), None, pos, None)
    ref = attn_naive.tree_attention(q.float(), k.float(), v.float(), anc, 150, None, pos, None)
    assert o.dtype == torch.bfloat16 and maxdiff(o.float(), ref) < 2e-2
    with tk.use_backend("triton"):  # the other merge gives the same rows
        other = "ticket" if cfg.get("MERGE", "ticket") == "launch" else "launch"
        o2 = attn_tr.tree_attention(q, kbuf, vbuf, anc, torch.tensor(150), None, pos, None, config=dict(cfg, MERGE=other))
    assert maxdiff(o2.float(), o.float()) < 2e-2 and maxdiff(o2.float(), ref) < 2e-2
    with pytest.raises(ValueError, match="MERGE"):
        attn_tr.tree_attention(q, kbuf, vbuf, anc, torch.tensor(150), None, pos, None, config=dict(cfg, MERGE="tree"))


# ------------------------------------------------------------------------------------- dispatch


def test_dispatch_follows_the_backend(monkeypatch):
    calls = []

    def spy(name, real):
        def f(*a, **kw):
            calls.append(name)
            return real(*a, **kw)

        return f

    monkeypatch.setattr(attn_tr, "tree_attention", spy("attn", attn_tr.tree_attention))
    monkeypatch.setattr(conv_tr, "tree_conv1d", spy("conv", conv_tr.tree_conv1d))
    monkeypatch.setattr(gdn_tr, "tree_gdn_fork", spy("fork", gdn_tr.tree_gdn_fork))
    tree = random_tree(5, 2, seed=0)
    c = compile_tree(tree, 4)
    q, k, v = attn_inputs(5, 4, 2, 1, 16, seed=0)
    x, st, w = torch.randn(5, 8), torch.randn(8, 3), torch.randn(8, 4)
    gq, gk, gv, gg, gb, s0 = gdn_inputs(5, 1, 2, 8, 8, seed=0)

    def run_all():
        a = tk.tree_attention(q, k, v, c.anc, 4, None, c.positions, None)
        b = tk.tree_conv1d(x, st, w, None, c.conv_table(4))
        o, _ = tk.tree_gdn_fork(gq, gk, gv, gg, gb, s0, c.anc)
        return a, b, o

    with tk.use_backend("auto"):  # CPU tensors: the torch references
        ref = run_all()
    assert calls == []
    with tk.use_backend("triton"):
        out = run_all()
    assert calls == ["attn", "conv", "fork"]
    for a, b in zip(out, ref):
        assert maxdiff(a, b) < 1e-5
    calls.clear()
    with tk.use_backend("triton"):  # fp64 always stays on the reference
        tk.tree_gdn_fork(gq.double(), gk.double(), gv.double(), gg.double(), gb.double(), s0.double(), c.anc)
    assert calls == []


# ------------------------------------------------------------------------------- model level


def test_model_generation_with_triton_kernels_equals_ar():
    """The round loop on a random hybrid target with every tree kernel forced to Triton
    (interpreted) generates exactly what AR with the torch references generates."""
    from workbench.drafters.oracle import OracleDrafter, OracleSpec
    from workbench.engine import GenerationConfig, generate
    from workbench.random_models import random_target

    target = random_target("hybrid", seed=5, vocab_size=300, eos_token_id=None)
    prompt = [5, 17, 42, 99, 3, 250, 7]
    new = 14
    with tk.use_backend("torch"):
        ref = prompt + generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=new + 8, trace_topk=0)).generated_ids
    spec = OracleSpec(p=0.5, rank=1, block=8, seed=3)
    cfg = GenerationConfig(method="ddtree", budget=12, recurrent="fork", max_new_tokens=new, trace_topk=0)
    with tk.use_backend("triton"):
        trace = generate(target, prompt, cfg, OracleDrafter(ref, target.config.vocab_size, spec))
    assert trace.generated_ids == ref[len(prompt) : len(prompt) + new]
    assert any(r.through_sibling for r in trace.rounds)  # accepted paths leave the first chain
    # AR through the one-launch GDN decode step (interpreted Triton) generates the same text
    from workbench.verify import use_gdn_decode_step

    with tk.use_backend("triton"), use_gdn_decode_step(True):
        ar_step = generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=new, trace_topk=0))
    assert ar_step.generated_ids == ref[len(prompt) : len(prompt) + new]


def test_file_in_a_fresh_interpreter():
    """Only when triton was imported before this module: run the whole file in a subprocess."""
    if _IN_PROCESS:
        return  # the tests above ran in this process
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# the fast path's static-shape entry points (device prefix length, padded paths with a device count)


def test_static_entry_points_dispatch_to_triton_and_match_the_references():
    from tree_kernels import static as st

    g = torch.Generator().manual_seed(11)
    tree = random_tree(23, 6, seed=5)
    c = compile_tree(tree, 9)
    cap = 9 + 23 + 13  # the whole buffer, rows past P + T hold garbage the kernel must not read
    q = torch.randn(23, 6, 32, generator=g)
    k_all, v_all = torch.randn(cap, 2, 32, generator=g), torch.randn(cap, 2, 32, generator=g)
    k_all[9 + 23 :] = float("nan")
    v_all[9 + 23 :] = float("nan")
    prefix_t = torch.tensor(9)
    ref = attn_naive.tree_attention(q, k_all[: 9 + 23], v_all[: 9 + 23], c.anc, 9, positions=c.positions)
    with tk.use_backend("triton"):
        got = st.tree_attention_static(q, k_all, v_all, c.anc, prefix_t, positions=c.positions)
        got_w = st.tree_attention_static(q, k_all, v_all, c.anc, prefix_t, positions=c.positions, window=7)
    assert (got - ref).abs().max() < 1e-4
    ref_w = attn_naive.tree_attention(q, k_all[: 9 + 23], v_all[: 9 + 23], c.anc, 9, positions=c.positions, window=7)
    assert (got_w - ref_w).abs().max() < 1e-4
    # GDN and conv commits of a padded path with the valid length on the device
    qq, kk = torch.nn.functional.normalize(torch.randn(2, 23, 3, 16, generator=g), dim=-1)
    v = torch.randn(23, 9, 24, generator=g)
    gate, beta = -torch.rand(23, 9, generator=g), torch.rand(23, 9, generator=g)
    S0 = torch.randn(9, 16, 24, generator=g)
    _, stash = gdn_naive.tree_gdn_fork(qq, kk, v, gate, beta, S0, c.anc)
    path = tree.path_to(20)
    padded = torch.tensor(path + [0] * (7 - len(path)))
    valid = torch.arange(7) < len(path)
    x, state = torch.randn(23, 40, generator=g), torch.randn(40, 3, generator=g)
    count = torch.tensor(len(path))
    with tk.use_backend("triton"):
        s_got = st.tree_gdn_commit_padded(stash, S0, padded, valid)
        c_got = st.conv_commit_static(False, x, state, padded, count)
        f_got = st.conv_commit_static(True, x, state, padded, count)
    assert (s_got - gdn_naive.tree_gdn_commit(stash, S0, path)).abs().max() < 1e-4
    assert torch.equal(c_got, conv_naive.tree_conv_commit(x, state, path))
    assert torch.equal(f_got, conv_naive.tree_conv_commit(x, state, list(range(21))))


def test_commits_in_place_equal_the_out_of_place_commits():
    """The fast path commits into the state buffers themselves (no copy): the same values."""
    from tree_kernels import static as st

    g = torch.Generator().manual_seed(12)
    tree = random_tree(30, 7, seed=8)
    c = compile_tree(tree, 0)
    qq, kk = torch.nn.functional.normalize(torch.randn(2, 30, 2, 16, generator=g), dim=-1)
    v = torch.randn(30, 6, 24, generator=g)
    gate, beta = -torch.rand(30, 6, generator=g), torch.rand(30, 6, generator=g)
    S0 = torch.randn(6, 16, 24, generator=g)
    _, stash = gdn_naive.tree_gdn_fork(qq, kk, v, gate, beta, S0, c.anc)
    for node in (0, 17, 29):
        path = tree.path_to(node)
        padded = torch.tensor(path + [0] * (8 - len(path)))
        count = torch.tensor(len(path))
        ref = gdn_naive.tree_gdn_commit(stash, S0, path)
        state = S0.clone()
        with tk.use_backend("triton"):
            got = st.tree_gdn_commit_static(stash, state, padded, count, out=state)
        assert got is state and (state - ref).abs().max() < 1e-4
        for flat, width in ((False, 4), (True, 4), (False, 2)):
            x, conv = torch.randn(30, 40, generator=g), torch.randn(40, width - 1, generator=g)
            want = conv_naive.tree_conv_commit(x, conv, list(range(path[-1] + 1)) if flat else path)
            buf = conv.clone()
            with tk.use_backend("triton"):
                got = st.conv_commit_static(flat, x, buf, padded, count, out=buf)
            assert got is buf and torch.equal(buf, want), (node, flat, width)


@pytest.mark.parametrize("n, h, r, dk, dv, width, dtype", [(23, 2, 3, 16, 24, 4, torch.float32), (5, 4, 1, 32, 32, 3, torch.bfloat16),
                                                             (40, 1, 2, 64, 40, 2, torch.float32), (1, 3, 2, 16, 16, 4, torch.bfloat16)])
def test_tree_conv_with_gdn_gates_in_one_launch_equals_conv_then_gates(n, h, r, dk, dv, width, dtype):
    """The GDN layer's tree conv + SiLU and its gates in one launch: q, k l2-normed per head
    (channel blocks of whole heads; key heads 3 take a one-head block), v as the conv gives it,
    beta and g for every node (the extra program column), the inputs kept in x_out; against the
    tree conv followed by the torch gates, on a tree whose table reads the conv state too."""
    from tree_kernels.norms import naive as norms_naive

    tree = random_tree(n, min(n, 6), seed=n + dk, shape="mixed")
    c = compile_tree(tree, 3)
    g = torch.Generator().manual_seed(n * width + dk)
    hv, key_dim = h * r, h * dk
    ch = 2 * key_dim + hv * dv
    x = torch.randn(n, ch + 5, generator=g).to(dtype)[:, :ch]  # strided rows, as the packed projection gives
    state, w = torch.randn(ch, width - 1, generator=g).to(dtype), torch.randn(ch, width, generator=g).to(dtype)
    b, a = torch.randn(n, hv, generator=g).to(dtype), (torch.randn(n, hv, generator=g) * 8).to(dtype)
    A_log, dt_bias = torch.randn(hv, generator=g), torch.randn(hv, generator=g)
    idx = c.conv_table(width)
    y = conv_tr.tree_conv1d(x, state, w, None, idx)  # (equal to the torch conv to bf16 rounding: tested above)
    assert maxdiff(y, conv_naive.tree_conv1d(x, state, w, None, idx)) < (1e-5 if dtype == torch.float32 else 0.05)
    want = norms_naive.gdn_gates(y[:, :key_dim].reshape(n, h, dk), y[:, key_dim : 2 * key_dim].reshape(n, h, dk),
                                 b, a, A_log, dt_bias)
    keep = torch.zeros(n, ch, dtype=dtype)
    q, k, v, beta, gg = conv_tr.tree_conv1d_gdn_gates(x, state, w, idx, b, a, A_log, dt_bias, key_dim, dk, x_out=keep)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # (the interpreter truncates to bf16 where torch rounds)
    assert q.shape == (n, h, dk) and v.shape == (n, hv * dv) and q.dtype == torch.float32
    assert maxdiff(q, want[0]) < 1e-5 and maxdiff(k, want[1]) < 1e-5  # the same rounded conv outputs, normed in fp32
    assert torch.equal(v, y[:, 2 * key_dim :])
    assert beta.dtype == dtype and maxdiff(beta, want[2]) < tol
    assert maxdiff(gg, want[3]) < 1e-6 * want[3].abs().max().clamp(min=1)  # fp32, g down to about -25
    assert torch.equal(keep, x)
    # the dispatcher: the same on both routes
    with tk.use_backend("triton"), tk.use_fused_norms():
        got = tk.tree_conv1d_gdn_gates(x, state, w, idx, b, a, A_log, dt_bias, key_dim, dk)
    with tk.use_backend("torch"):
        ref = tk.tree_conv1d_gdn_gates(x, state, w, idx, b, a, A_log, dt_bias, key_dim, dk)
    for one, other in zip(got, ref):
        assert maxdiff(one, other) < tol * other.abs().max().clamp(min=1)
    with pytest.raises(ValueError, match="head dim 24 must be a power of two"):
        conv_tr.tree_conv1d_gdn_gates(x, state, w, idx, b, a, A_log, dt_bias, 48, 24)
    with pytest.raises(ValueError, match="b .* do not fit"):
        conv_tr.tree_conv1d_gdn_gates(x, state, w, idx, b[:, :1], a, A_log, dt_bias, key_dim, dk)


def test_gdn_gates_block_takes_whole_heads_dividing_the_key_channels():
    assert conv_tr.gdn_gates_block(2048, 128) == 256  # Qwen3.6-27B: 16 key heads of 128
    assert conv_tr.gdn_gates_block(3 * 64, 64) == 64  # 3 heads: one per block
    assert conv_tr.gdn_gates_block(512, 512) == 512  # one head wider than the limit
    assert conv_tr.gdn_gates_block(96, 24) is None and conv_tr.gdn_gates_block(100, 64) is None


@pytest.mark.parametrize("node", [0, 17, 29])
def test_stacked_commits_of_every_layer_equal_the_per_layer_commits(node):
    """RecurrentStack's commit: the GDN states and conv windows of L layers, each with its own
    stash / inputs, committed in one launch each (in place), equal each layer committed alone;
    the torch route (a loop over layers) equals them too. Layers differ, so a kernel reading
    layer 0's stash for every layer, or writing every result into layer 0, fails here."""
    from tree_kernels import static as st

    g = torch.Generator().manual_seed(node + 3)
    tree = random_tree(30, 7, seed=8)
    c = compile_tree(tree, 0)
    n_layers, hv = 3, 6
    stashes, states, xs, convs = [], [], [], []
    for _ in range(n_layers):
        qq, kk = torch.nn.functional.normalize(torch.randn(2, 30, 2, 16, generator=g), dim=-1)
        v = torch.randn(30, hv, 24, generator=g)
        gate, beta = -torch.rand(30, hv, generator=g), torch.rand(30, hv, generator=g)
        S0 = torch.randn(hv, 16, 24, generator=g)
        stashes.append(gdn_naive.tree_gdn_fork(qq, kk, v, gate, beta, S0, c.anc)[1])
        states.append(S0)
        xs.append(torch.randn(30, 40, generator=g))
        convs.append(torch.randn(40, 3, generator=g))
    path = tree.path_to(node)
    padded, count = torch.tensor(path + [5] * (8 - len(path))), torch.tensor(len(path))
    want_s = torch.stack([gdn_naive.tree_gdn_commit(stashes[i], states[i], path) for i in range(n_layers)])
    want_c = torch.stack([conv_naive.tree_conv_commit(xs[i], convs[i], path) for i in range(n_layers)])
    stacked = gdn_naive.TreeGDNStash(k=torch.stack([s.k for s in stashes]), u=torch.stack([s.u for s in stashes]),
                                     G=torch.stack([s.G for s in stashes]))
    for backend in ("triton", "torch"):
        s_buf, c_buf = torch.stack(states), torch.stack(convs)
        with tk.use_backend(backend):
            assert st.tree_gdn_commit_layers_static(stacked, s_buf, padded, count) is s_buf
            assert st.conv_commit_layers_static(torch.stack(xs), c_buf, padded, count) is c_buf
        assert (s_buf - want_s).abs().max() < 1e-4, backend
        assert torch.equal(c_buf, want_c), backend
    with pytest.raises(ValueError, match="states must be contiguous fp32"):
        gdn_tr.tree_gdn_commit_layers(stacked, torch.stack(states)[:2], padded, count)
    with pytest.raises(ValueError, match="conv states must be contiguous"):
        conv_tr.tree_conv_commit_layers(torch.stack(xs), torch.stack(convs)[:, :7], padded, count)


def test_fork_and_conv_write_into_given_buffers():
    """The stacked commit's inputs: the fork writes its stash into ``stash_out`` (a layer's slice
    of stacked buffers) and the tree conv also stores its inputs in ``x_out``, on both routes,
    with the same outputs as without; buffers of the wrong shape are refused by name."""
    tree = random_tree(21, 5, seed=4)
    c = compile_tree(tree, 0)
    q, k, v, gate, beta, s0 = gdn_inputs(21, 1, 3, 8, 12, seed=5)
    g = torch.Generator().manual_seed(1)
    x, conv_state, w = torch.randn(21, 37, generator=g), torch.randn(37, 3, generator=g), torch.randn(37, 4, generator=g)
    for backend in ("triton", "torch"):
        with tk.use_backend(backend):
            o_ref, stash_ref = tk.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc)
            big = gdn_naive.TreeGDNStash(k=torch.zeros(2, 21, 3, 8), u=torch.zeros(2, 21, 3, 12), G=torch.zeros(2, 21, 3))
            out = gdn_naive.TreeGDNStash(k=big.k[1], u=big.u[1], G=big.G[1])
            o, stash = tk.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, stash_out=out)
            assert stash.k is out.k and stash.u is out.u and stash.G is out.G
            assert torch.equal(o, o_ref), backend
            for name in ("k", "u", "G"):
                assert torch.equal(getattr(out, name), getattr(stash_ref, name)), (backend, name)
            assert not big.k[0].any()  # the other layer's slice untouched
            with pytest.raises(ValueError, match="stash_out.u must be"):
                tk.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, stash_out=gdn_naive.TreeGDNStash(k=out.k, u=out.k, G=out.G))
            y_ref = tk.tree_conv1d(x, conv_state, w, None, c.conv_table(4))
            keep = torch.zeros(2, 21, 37)
            y = tk.tree_conv1d(x, conv_state, w, None, c.conv_table(4), x_out=keep[0])
            assert torch.equal(y, y_ref) and torch.equal(keep[0], x) and not keep[1].any(), backend
            with pytest.raises(ValueError, match="x_out must be"):
                tk.tree_conv1d(x, conv_state, w, None, c.conv_table(4), x_out=keep[0, :5])


@pytest.mark.parametrize("h, r, dk, dv, dtype", [(2, 1, 16, 32, torch.float32), (2, 3, 24, 40, torch.float32),
                                                  (1, 4, 32, 64, torch.bfloat16)])
def test_gdn_decode_step_equals_the_reference_and_a_one_node_fork_then_commit(h, r, dk, dv, dtype):
    g = torch.Generator().manual_seed(dk + dv + r)
    hv = h * r
    q, k = torch.nn.functional.normalize(torch.randn(2, 1, h, dk, generator=g), dim=-1).to(dtype)
    v = torch.randn(1, hv, dv, generator=g).to(dtype)
    gate, beta = (-torch.rand(1, hv, generator=g)).to(dtype), torch.rand(1, hv, generator=g).to(dtype)
    S0 = torch.randn(hv, dk, dv, generator=g)
    o_ref, S_ref = gdn_naive.gdn_decode_step(q, k, v, gate, beta, S0)
    # the same maths as the tree route it replaces on the AR step: fork a one-node tree, commit node 0
    o_tree, stash = gdn_naive.tree_gdn_fork(q, k, v, gate, beta, S0, torch.ones(1, 1, dtype=torch.bool))
    assert (o_ref - o_tree).abs().max() < 1e-5
    assert (S_ref - gdn_naive.tree_gdn_commit(stash, S0, [0])).abs().max() < 1e-5
    for block_v in (None, 16):  # one value block, or several with a ragged last one (dv 40)
        o, S = gdn_tr.gdn_decode_step(q, k, v, gate, beta, S0, block_v=block_v)
        assert o.dtype == S.dtype == torch.float32 and o.shape == (1, hv, dv) and S.shape == (hv, dk, dv)
        assert (o - o_ref).abs().max() < 1e-4 and (S - S_ref).abs().max() < 1e-4, block_v
    state = S0.clone()
    with tk.use_backend("triton"):
        o_in, S_in = tk.gdn_decode_step(q, k, v, gate, beta, state, out=state)  # in place
    assert S_in is state and (state - S_ref).abs().max() < 1e-4 and (o_in - o_ref).abs().max() < 1e-4


@pytest.mark.parametrize("h, r, dk, dv, dtype", [(2, 1, 16, 32, torch.float32), (2, 3, 24, 40, torch.float32),
                                                  (1, 4, 32, 64, torch.bfloat16)])
def test_gdn_decode_step_gated_equals_the_gates_then_the_decode_step(h, r, dk, dv, dtype):
    """The AR step's fused launch: raw q, k (not l2-normed), raw b, a; the same as gdn_gates and
    gdn_decode_step one after the other (the references), in place when out is the state."""
    from tree_kernels.norms import naive as norms_naive

    g = torch.Generator().manual_seed(dk + r)
    hv = h * r
    mixed = torch.randn(1, 2 * h * dk + 5, generator=g).to(dtype)  # q, k as strided slices of the conv output
    q, k = mixed[:, : h * dk].reshape(1, h, dk), mixed[:, h * dk : 2 * h * dk].reshape(1, h, dk)
    v = torch.randn(1, hv, dv, generator=g).to(dtype)
    ba = (torch.randn(1, 2 * hv, generator=g) * 3).to(dtype)  # b, a as column slices of the packed projection
    b, a = ba[:, :hv], ba[:, hv:]
    A_log, dt_bias = torch.randn(hv, generator=g), torch.randn(hv, generator=g)
    S0 = torch.randn(hv, dk, dv, generator=g)
    qn, kn, beta, gate = norms_naive.gdn_gates(q, k, b, a, A_log, dt_bias, torch.float32)
    o_ref, S_ref = gdn_naive.gdn_decode_step(qn, kn, v, gate, beta, S0)
    o, S = gdn_tr.gdn_decode_step_gated(q, k, v, b, a, A_log, dt_bias, S0, block_v=16)
    assert o.shape == (1, hv, dv) and S.shape == (hv, dk, dv)
    # bf16: beta is rounded to b's dtype, which the interpreter truncates where torch (and the GPU)
    # rounds to nearest: one bf16 step of beta (2^-8 relative) in o and S
    tol = 1e-4 if dtype == torch.float32 else 1e-2 * max(1.0, S_ref.abs().max().item()) * 2.0**-1
    assert (o - o_ref).abs().max() < tol and (S - S_ref).abs().max() < tol
    state = S0.clone()
    with tk.use_backend("triton"):
        o_in, S_in = tk.gdn_decode_step_gated(q, k, v, b, a, A_log, dt_bias, state, out=state)
    assert S_in is state and (state - S_ref).abs().max() < tol and (o_in - o_ref).abs().max() < tol
    state_ref = S0.clone()  # the reference route of the dispatcher (gates, then the decode step)
    o_r, _ = tk.gdn_decode_step_gated(q, k, v, b, a, A_log, dt_bias, state_ref, out=state_ref)
    assert torch.equal(state_ref, S_ref.to(state_ref.dtype)) and (o_r - o_ref).abs().max() < 1e-6
    with pytest.raises(ValueError, match="A_log"):
        gdn_tr.gdn_decode_step_gated(q, k, v, b, a, A_log[:1], dt_bias, S0)


def test_gdn_decode_steps_follow_the_sequential_chain_and_check_shapes():
    g = torch.Generator().manual_seed(3)
    t, h, hv, dk, dv = 5, 2, 4, 16, 24
    q, k = torch.nn.functional.normalize(torch.randn(2, t, h, dk, generator=g), dim=-1)
    v, gate, beta = torch.randn(t, hv, dv, generator=g), -torch.rand(t, hv, generator=g), torch.rand(t, hv, generator=g)
    S0 = torch.randn(hv, dk, dv, generator=g)
    o_chain, states = gdn_naive.gdn_chain_sequential(q, k, v, gate, beta, S0)
    state = S0.clone()
    for i in range(t):
        o, _ = gdn_tr.gdn_decode_step(q[i : i + 1], k[i : i + 1], v[i : i + 1], gate[i : i + 1], beta[i : i + 1], state, out=state)
        assert (o[0] - o_chain[i]).abs().max() < 1e-4 and (state - states[i]).abs().max() < 1e-4, i
    with pytest.raises(ValueError, match="one token"):
        gdn_tr.gdn_decode_step(q[:2], k[:2], v[:2], gate[:2], beta[:2], S0)
    with pytest.raises(ValueError, match="state"):
        gdn_naive.gdn_decode_step(q[:1], k[:1], v[:1], gate[:1], beta[:1], S0[:, :8])
    with pytest.raises(ValueError, match="out must be"):
        gdn_tr.gdn_decode_step(q[:1], k[:1], v[:1], gate[:1], beta[:1], S0, out=S0.double())


# ------------------------------------------------------------------------------------- kv write

@pytest.mark.parametrize("t, dtype", [(1, torch.bfloat16), (5, torch.float32)])
def test_kv_write_static_puts_the_rows_at_the_device_offset(t, dtype):
    """The fast path's K/V cache write, one launch: rows start .. start + t - 1 of both buffers
    take the new rows (v a strided view, as the packed projection gives), nothing else moves."""
    from tree_kernels.kv_write import naive as kv_naive
    from tree_kernels.kv_write import triton as kv_tr

    g = torch.Generator().manual_seed(t)
    hkv, d, cap = 3, 20, 40
    kb, vb = torch.randn(cap, hkv, d, generator=g).to(dtype), torch.randn(cap, hkv, d, generator=g).to(dtype)
    k = torch.randn(t, hkv, d, generator=g).to(dtype)
    v = torch.randn(t, hkv * d + 7, generator=g).to(dtype)[:, : hkv * d].view(t, hkv, d)
    start = torch.tensor(17)
    want_k, want_v = kb.clone(), vb.clone()
    kv_naive.kv_write_static(want_k, want_v, start, k, v)
    assert torch.equal(want_k[17 : 17 + t], k) and torch.equal(want_v[17 : 17 + t], v)
    got_k, got_v = kb.clone(), vb.clone()
    kv_tr.kv_write_static(got_k, got_v, start, k, v, block=16)  # several chunks per row
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    with pytest.raises(ValueError, match="do not fit"):
        kv_tr.kv_write_static(got_k, got_v, start, k[:, :2], v)


@pytest.mark.parametrize("count, dtype", [(1, torch.bfloat16), (4, torch.float32), (6, torch.bfloat16)])
def test_kv_commit_static_moves_the_accepted_rows_down_in_one_launch(count, dtype):
    """The commit after the walk: rows start + path[i] land at start + i for the first ``count``
    slots. The path's rows overlap their targets (slot 1 reads row start + 2 while slot 2 writes
    it), so a version that wrote before reading everything would show here; the padded slots
    past ``count`` (junk indices) move nothing, and the Triton kernel equals the reference."""
    from tree_kernels.kv_write import naive as kv_naive
    from tree_kernels.kv_write import triton as kv_tr

    g = torch.Generator().manual_seed(count)
    hkv, d, cap, start = 3, 20, 40, 11
    kb, vb = torch.randn(cap, hkv, d, generator=g).to(dtype), torch.randn(cap, hkv, d, generator=g).to(dtype)
    path = torch.tensor([0, 2, 3, 5, 9, 10, 7, 7])  # slots past count: junk the walk leaves there
    want_k, want_v = kb.clone(), vb.clone()
    rows = start + path[:count]
    want_k[start : start + count] = kb[rows]
    want_v[start : start + count] = vb[rows]
    for impl, kw in ((kv_naive, {}), (kv_tr, {"block": 16}), (kv_tr, {})):  # several column chunks, then the default
        got_k, got_v = kb.clone(), vb.clone()
        impl.kv_commit_static(got_k, got_v, torch.tensor(start), path, torch.tensor(count), **kw)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), (impl.__name__, kw)
    with pytest.raises(ValueError, match="path must be 1-D"):
        kv_tr.kv_commit_static(got_k, got_v, torch.tensor(start), path[None], torch.tensor(count))
    with pytest.raises(ValueError, match="must be equal"):
        kv_tr.kv_commit_static(got_k, got_v[:, :2], torch.tensor(start), path, torch.tensor(count))


def test_gdn_dense_kernel_refuses_a_block_beyond_its_largest():
    from tree_kernels.tree_gdn import triton as tg

    anc = _chains_anc([70])
    q, k, v, gate, beta, s0 = _gdn_case(70, (1, 3, 8, 12), seed=7)
    with pytest.raises(ValueError, match="BN=128 is larger than the 64 nodes"):
        gdn_tr.tree_gdn_fork(q, k, v, gate, beta, s0, anc, rooted=True, config={"DENSE": True})
    assert tg.DENSE_LARGEST == 64
