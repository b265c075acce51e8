"""bench.kernels' ratio table from a result dict (the GPU measurements themselves run on the device)."""

from workbench.bench.kernels import best_ms, out_of_resources, ratios


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


def test_out_of_resources_matches_the_merged_config_the_wrapper_recorded(monkeypatch):
    """The wrapper records the config it merged with its defaults, keyed by the tensors' device
    ("cuda:0"); a sweep asks with the items it set and "cuda". A config that was not dropped, or
    one of another kernel shape, does not match."""
    from tree_kernels import _triton_common

    failed = {(("gdn_fork", 128, 128, "cuda:0"), tuple(sorted({"BS": 32, "BV": 64, "num_warps": 8, "PRE_INVERSE": True}.items())))}
    monkeypatch.setattr(_triton_common, "_FAILED_CONFIGS", failed)
    assert out_of_resources(("gdn_fork", 128, 128, "cuda"), {"BS": 32, "BV": 64})
    assert out_of_resources(("gdn_fork", 128, 128, "cuda:0"), {"BS": 32, "BV": 64, "num_warps": 8})
    assert not out_of_resources(("gdn_fork", 128, 128, "cuda"), {"BS": 32, "BV": 32})
    assert not out_of_resources(("gdn_fork", 128, 64, "cuda"), {"BS": 32, "BV": 64})
    assert not out_of_resources(("attention", 128, 128, "cuda"), {"BS": 32, "BV": 64})


def test_sweep_gdn_configs_records_the_error_a_dropped_config_and_a_failure(monkeypatch):
    import torch
    from tree_kernels import _triton_common

    from workbench.bench.kernels import GDN, sweep_gdn_configs

    dropped = {"BS": 32, "BV": 64}
    monkeypatch.setattr(_triton_common, "_FAILED_CONFIGS",
                        {(("gdn_fork", GDN["dk"], GDN["dv"], "cpu"), tuple(sorted(dict(dropped, num_warps=4).items())))})
    reference = torch.zeros(3)

    def call(cfg):
        if cfg["BV"] == 128:
            raise ValueError("BV=128 refused")
        return torch.full((3,), float(cfg["BV"]) * 1e-3), None

    recs = sweep_gdn_configs("test", [{"BS": 16, "BV": 32}, dropped, {"BS": 16, "BV": 128}], call, reference, "max_abs")
    assert abs(recs[0]["max_abs"] - 0.032) < 1e-6  # measured before the cold-graph timing (a GPU's; it fails here)
    assert "OutOfResources" in recs[1]["error"] and "max_abs" not in recs[1]
    assert recs[2]["error"] == "ValueError: BV=128 refused"
