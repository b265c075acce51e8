"""bench/launches counts a step's kernels: Triton launches land in the layer that makes them, the
fused row-wise kernels replace the elementwise chains, and the 27B scaling is the stated sum."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from workbench.bench.launches import count_step, scale_to_27b  # noqa: E402
from workbench.models.qwen3_5 import use_stacked_commit  # noqa: E402


def test_counts_per_layer_and_the_fused_kernels_cut_them():
    off, on = count_step("ar", 1, fused=False), count_step("ar", 1, fused=True)
    gdn_off, gdn_on = off["per_kind"]["linear_attn"], on["per_kind"]["linear_attn"]
    # unfused: the conv and the decode step; fused: the decode step takes the gates in, + the gated
    # norm, two add+RMSNorms (each takes the residual add before it), SiLU-mul
    assert gdn_off["triton_launches_per_layer"] == 2 and gdn_on["triton_launches_per_layer"] == 6
    assert gdn_on["per_layer_forward"] < gdn_off["per_layer_forward"] - 20
    assert on["per_kind"]["self_attn"]["per_layer_forward"] < off["per_kind"]["self_attn"]["per_layer_forward"]
    # AR commits in the forward (the one node is always accepted): no commit launches at all;
    # a tree commits every GDN layer's state and conv window in two launches (RecurrentStack),
    # the KV rows in one launch per attention layer; without the stack, two per GDN layer
    assert gdn_off["per_layer_commit"] == 0 and off["per_kind"]["self_attn"]["per_layer_commit"] == 0
    assert off["stacked_commit"] == 0
    tree = count_step("ddtree", 4, fused=True)
    assert tree["per_kind"]["linear_attn"]["per_layer_commit"] == 0 and tree["stacked_commit"] == 2
    assert tree["per_kind"]["self_attn"]["per_layer_commit"] == 1
    with use_stacked_commit(False):
        unstacked = count_step("ddtree", 4, fused=True)
    assert unstacked["per_kind"]["linear_attn"]["per_layer_commit"] == 2 and unstacked["stacked_commit"] == 0
    assert scale_to_27b(unstacked) == scale_to_27b(tree) + 48 * 2 - 2
    k = off["per_kind"]
    expected = off["rest_of_round_step"] + 48 * (k["linear_attn"]["per_layer_forward"] + k["linear_attn"]["per_layer_commit"]) \
        + 16 * (k["self_attn"]["per_layer_forward"] + k["self_attn"]["per_layer_commit"])
    assert scale_to_27b(off) == expected and scale_to_27b(on) < expected
