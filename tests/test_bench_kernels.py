"""bench.kernels' ratio table from a result dict (the GPU measurements themselves run on the device)."""

from workbench.bench.kernels import best_ms, ratios


def test_best_ms_prefers_the_cold_graph_time():
    assert best_ms({"triton_fork_ms": 2.0, "triton_fork_cold_graph_ms": 1.0}, "triton_fork_ms") == 1.0
    assert best_ms({"triton_fork_ms": 2.0, "triton_fork_cold_graph_ms": None}, "triton_fork_ms") == 2.0


def test_gdn_variant_ratios_per_tree_size():
    gdn = {
        "65": {"triton_fork_cold_graph_ms": 0.07, "triton_fork_no_peel_cold_graph_ms": 0.084,
               "triton_fork_no_offdiag_cold_graph_ms": 0.0875},
        "17": {"triton_fork_cold_graph_ms": 0.03, "triton_fork_no_peel_cold_graph_ms": 0.045},
        "257": {"triton_fork_cold_graph_ms": 0.4, "triton_fork_offdiag_cold_graph_ms": 0.3},
        "129": {"triton_fork_cold_graph_ms": 0.1, "triton_fork_peel_cold_graph_ms": 0.11},
    }
    out = ratios({"gdn": gdn})
    assert out["gdn_no_peel_over_default_65"] == 1.2
    assert out["gdn_no_offdiag_over_default_65"] == 1.25
    assert out["gdn_no_peel_over_default_17"] == 1.5
    assert out["gdn_no_offdiag_over_default_17"] is None  # not measured at one block
    assert out["gdn_no_peel_over_default_129"] is None  # the default does not peel there
    assert out["gdn_peel_over_default_129"] == 1.1
    assert out["gdn_offdiag_over_default_257"] == 0.75  # stored blocks above 144 nodes, against the default


def test_decode_step_ratio():
    dg = {"1": {"triton_fork_cold_graph_ms": 0.02, "triton_commit_cold_graph_ms": 0.01,
                "triton_decode_step_cold_graph_ms": 0.0075}}
    out = ratios({"decode_gdn": dg})
    assert out["decode_gdn_fork_plus_commit_over_decode_step"] == 4.0



def test_doubling_sweep_ratio_takes_the_best_timed_config():
    gs = {"triton_fork_ms": 0.05, "doubling_sweep": [{"BS": 32, "cold_graph_ms": 0.04}, {"BS": 32, "error": "OutOfResources"},
                                                     {"BS": 16, "cold_graph_ms": 0.06}]}
    out = ratios({"gdn": {"65": gs}})
    assert out["gdn_doubling_best_over_default_65"] == 0.8
    assert "gdn_doubling_best_over_default_33" not in out
