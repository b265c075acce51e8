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


def test_bench_gemv_rows_and_summaries_on_cpu(monkeypatch):
    # bench.gemv's bookkeeping without a GPU: the CUDA-graph timer replaced by a fake, the Triton
    # kernels interpreted; every variant gets a row (time, bandwidth, error) and the summaries
    # pick the best Triton config and the cuBLAS row, and weigh shapes by their layers
    import argparse
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")
    from workbench.bench import gemv

    monkeypatch.setattr(gemv, "time_per_call_ms", lambda fn, copies, calls, repeats: (fn(0), 0.01)[1])
    monkeypatch.setattr(gemv, "triton_configs", lambda n: [dict(BLOCK_N=4, BLOCK_K=32, num_warps=1, num_stages=1, SPLIT_K=1),
                                                           dict(BLOCK_N=8, BLOCK_K=32, num_warps=1, num_stages=1, SPLIT_K=2)])
    monkeypatch.setattr(gemv, "few_rows_configs", lambda: [dict(BLOCK_N=16, BLOCK_K=32, num_warps=1, num_stages=1)])
    args = argparse.Namespace(device="cpu", l2_bytes=1, calls=2, repeats=1)
    one = gemv.bench_shape("toy", 24, 64, args, bandwidth=100.0)
    triton_rows = [r for r in one["rows"] if r["variant"] == "triton"]
    assert len(triton_rows) == 2 and all(r["max_rel_err"] < 2e-2 for r in triton_rows)
    assert one["linear_ms"] == 0.01 and one["best_triton"] in triton_rows and one["copies"] == 2
    assert {r["variant"] for r in one["rows"]} >= {"linear", "mv", "w_at_xt", "triton"}
    few = gemv.bench_few_rows("toy", 24, 64, [3, 17], args, bandwidth=100.0)
    assert [s["M"] for s in few] == [3, 17] and all(s["best_triton"]["max_rel_err"] < 2e-2 for s in few)
    one["layers"], few[0]["layers"] = 3, 2
    assert gemv._step_gemm_ms([one]) == {"linear": 0.03, "best_of_linear_and_triton": 0.03}
    assert gemv._step_gemm_ms([few[0]])["linear"] == 0.02
