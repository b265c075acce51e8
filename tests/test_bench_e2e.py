"""bench.e2e end to end on the CPU (tiny pair, a few tokens): the JSON it writes and the table it prints."""

import json

from workbench.bench import e2e


def test_e2e_pairs_on_cpu_write_rows_and_print_the_table(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    e2e.main(["--pairs", "tiny-hybrid:tiny-hybrid-dflash", "--n", "1", "--max-new-tokens", "6", "--budgets", "8",
              "--temperatures", "0", "--skip-hf", "--phase-prompts", "1", "--phase-budget", "8", "--both-norms", "--serial-host",
              "--twins", "pdl", "--dtype", "float32", "--out", str(out)])
    result = json.loads(out.read_text())
    rows = result["pairs"]["tiny-hybrid"]["rows"]
    variants = {r["variant"] for r in rows}
    # CPU: the run's own setting, the other, and the run's own with the host recording before queueing
    assert variants == {"reference_norms", "fused_norms", "reference_norms/serial_host", "reference_norms/pdl"}
    # each fork row of the run's own setting followed by its PDL twin, whose output is the AR row's
    own = [(r["method"], r["budget"], r["variant"]) for r in rows if r["variant"] in ("reference_norms", "reference_norms/pdl")
           and r["recurrent"] == "fork"]
    assert own == [(m, b, v) for m, b in (("ar", None), ("dflash", None), ("ddtree", 8))
                   for v in ("reference_norms", "reference_norms/pdl")]
    assert all(r["identical_to_ar"] == 1 for r in rows if r["variant"].endswith("/pdl"))
    serial = [r for r in rows if r["variant"].endswith("/serial_host")]
    assert [(r["method"], r["budget"]) for r in serial] == [("ar", None), ("dflash", None), ("ddtree", 8)]
    assert rows[0]["method"] == "ar" and rows[0]["variant"] == "reference_norms"
    for r in rows:
        assert r["tokens"] == 6 and r["tokens_per_second"] > 0
        if r["recurrent"] == "fork":  # fp32 on the CPU: exact, so every fork output is AR's
            assert r["identical_to_ar"] == 1, r
    unsafe = [r for r in rows if r["recurrent"] == "unsafe"]
    assert unsafe and all(r["variant"] == "reference_norms" for r in unsafe)
    assert result["pairs"]["tiny-hybrid"]["model_sha256"]  # budget auto checks these
    assert result["round_fusions"] == {"stacked_commit": True, "kv_commit_launch": True, "fused_conv_gates": True,
                                       "l2_prefetch": False, "l2_prefetch_bytes": 32 << 20, "pdl": False}
    printed = capsys.readouterr().out
    assert "tiny-hybrid: tokens/s" in printed and "fused_norms" in printed and "identical 1/1" in printed


def test_bench_ties_finds_the_first_divergence_and_reads_its_logits(tmp_path):
    # CPU smoke test of the divergence report: one prompt of one bundled pair, and a forced
    # divergence whose position, tokens and margins come from the reference logits
    from workbench.bench import ties
    from workbench.runner import load_target_and_tokenizer

    got = ties.main(["--pairs", "tiny-hybrid:tiny-hybrid-dflash", "--n", "1", "--max-new-tokens", "6", "--out", str(tmp_path / "t.json")])
    summary = got["pairs"]["tiny-hybrid"]["summary"]
    assert set(summary) == {"ar_gemv_vs_ar_cublas", "ddtree_gemv_vs_ar_gemv", "ddtree_cublas_vs_ar_cublas"}
    assert all(s["of"] == 1 for s in summary.values()) and (tmp_path / "t.json").exists()
    target, _ = load_target_and_tokenizer("tiny-hybrid", "cpu", "float32")
    prompt = [5, 6, 7]
    logits = target.run_chain(prompt + [9, 10], target.new_cache(16), logits="last").logits[-1]
    best = int(logits.argmax())
    worst = int(logits.argmin())
    d = ties.first_divergence(target, prompt, [9, 10, worst, 1], [9, 10, best, 1])
    assert d["position"] == 2 and d["tokens"] == [worst, best] and d["tokens_behind_top1"][1] == 0.0
    assert not d["near_tie"] and d["tokens_behind_top1"][0] > 0
    assert ties.first_divergence(target, prompt, [1, 2], [1, 2]) == {"identical": True}
    shorter = ties.first_divergence(target, prompt, [1, 2], [1, 2, 3])  # a prefix is not the same output
    assert not shorter["identical"] and shorter["position"] == 2 and not shorter["near_tie"]


def test_prefetch_variants_set_and_restore_the_warmup():
    """--prefetch-variants: "default" (the baseline every ratio is over) has the warm-up off, the
    others on at their sizes and load policy; every setting is back afterwards."""
    import tree_kernels as tk
    from tree_kernels.l2_prefetch import triton as lp

    from workbench.bench.e2e import prefetch_variants

    before = (tk.l2_prefetch_enabled(), tk.L2_PREFETCH_BYTES, lp.DEFAULT_CONFIG["EVICT_LAST"])
    seen = {}
    for label, make in prefetch_variants():
        with make():
            seen[label] = (tk.l2_prefetch_enabled(), tk.L2_PREFETCH_BYTES >> 20, lp.DEFAULT_CONFIG["EVICT_LAST"])
        assert (tk.l2_prefetch_enabled(), tk.L2_PREFETCH_BYTES, lp.DEFAULT_CONFIG["EVICT_LAST"]) == before
    assert list(seen)[0] == "default" and seen["default"][0] is False
    assert seen["l2_16mb"] == (True, 16, True) and seen["l2_48mb"] == (True, 48, True)
    assert seen["l2_32mb_evict_normal"] == (True, 32, False)


def test_gdn_variants_set_and_restore_the_blocked_solve():
    from tree_kernels.tree_gdn import triton as tg

    from workbench.bench.e2e import gdn_variants

    before = dict(tg.OFFDIAG_DEFAULTS)
    seen = {}
    for label, make in gdn_variants():
        with make():
            seen[label] = tg.blocked_config(65, 128)
        assert tg.OFFDIAG_DEFAULTS == before
    labels = list(seen)
    assert labels[0] == "default" and labels[-1] == "default_again" and seen["default"] == seen["default_again"]
    from workbench.bench.kernels import OFFDIAG_VARIANTS, offdiag_variant_configs

    assert labels[1:-1] == [label for label, extra in OFFDIAG_VARIANTS if extra]  # the one list both benches run
    assert dict(offdiag_variant_configs(65))["pre_s0_bv16_2w"] == seen["pre_s0_bv16_2w"]
    assert seen["pre_s0_bv16_2w"]["PRE_S0"] and seen["pre_s0_bv16_2w"]["BV"] == 16 and seen["pre_s0_bv16_2w"]["num_warps"] == 2
    assert seen["pre_s0_wide"]["WIDE_OFF"] and not seen["pre_s0"]["ROOT_PEEL"]


def test_pdl_variants_time_each_setting_with_the_switch_set_and_restore_it():
    """--pdl-variants: the AR step and the verify 17 / 65 built and timed under each PDL setting
    (off, on with the default exemption, on for the GEMMs only, on for all), twice interleaved; the switch
    and the exempt groups as each label says while its engines are built and timed, restored
    afterwards; each "on*" over the "off" of its round and each verify over its own AR step."""
    import tree_kernels as tk

    from workbench.bench.e2e import PDL_ORDER, PDL_SETTINGS, pdl_variants

    built = []

    class Engine:
        def __init__(self, method, budget):
            self.method, self.budget = method, budget
            self.setting = (tk.pdl_enabled(), tk.pdl_exempt())
            built.append(self)

        def _round_step(self):
            pass

    speed = {(False, frozenset({"tma"})): 1.0, (True, frozenset({"tma"})): 0.9, (True, frozenset()): 0.95,
             (True, frozenset({"tma", "rest"})): 0.8}

    def time_step(eng, name, fn):
        assert (tk.pdl_enabled(), tk.pdl_exempt()) == eng.setting and name == "round"
        base = 10.0 if eng.method == "ar" else 12.0 + eng.budget / 64
        return base * speed[eng.setting]

    before = (tk.pdl_enabled(), tk.pdl_exempt())
    got = pdl_variants([16, 32, 64], Engine, time_step, floor_ms=8.0)
    assert (tk.pdl_enabled(), tk.pdl_exempt()) == before and "error" not in got
    assert len(PDL_ORDER) == 2 * len(PDL_SETTINGS) and PDL_ORDER[0] == "off" and PDL_ORDER[-1] == "on_all_again"
    expected = []
    for label in PDL_ORDER:
        on, exempt = PDL_SETTINGS[label.removesuffix("_again")]
        expected += [(m, b, (on, frozenset(filter(None, exempt.split(","))))) for m, b in (("ar", 1), ("ddtree", 16), ("ddtree", 64))]
    assert [(e.method, e.budget, e.setting) for e in built] == expected
    assert got["on"]["ar_step_ms"] == 9.0 and got["off"]["verify_65_fork_ms"] == 13.0
    assert abs(got["on_over_off"]["verify_17_fork_ms"] - 0.9) < 1e-12 and abs(got["off"]["ar_step_over_floor"] - 1.25) < 1e-12
    assert abs(got["on_all_again_over_off_again"]["ar_step_ms"] - 0.95) < 1e-12
    assert abs(got["on_gemm_only_over_off"]["verify_65_fork_ms"] - 0.8) < 1e-12
    assert abs(got["off_again"]["verify_65_over_ar"] - 1.3) < 1e-12 and set(got["on_again_over_off_again"]) == {
        "ar_step_ms", "verify_17_fork_ms", "verify_65_fork_ms"}


def test_unknown_twins_are_refused_before_any_model_loads(capsys):
    import pytest

    with pytest.raises(SystemExit):
        e2e.main(["--twins", "pdl,warp_drive", "--skip-27b"])
    assert "warp_drive" in capsys.readouterr().err


def test_a_joined_twin_sets_each_of_its_switches_and_restores_them():
    import tree_kernels as tk

    assert e2e.unknown_twins("pdl,pdl+small_gemm,torch_round") == []
    assert e2e.unknown_twins("pdl+warp_drive") == ["warp_drive"]
    before = (tk.pdl_enabled(), tk.small_gemm_enabled(), tk.round_kernels_enabled())
    with e2e.twin_setting("fused_norms/pdl+small_gemm"):
        assert tk.pdl_enabled() and tk.small_gemm_enabled() and tk.round_kernels_enabled() == before[2]
    with e2e.twin_setting("fused_norms/torch_round"):
        assert not tk.round_kernels_enabled() and tk.pdl_enabled() == before[0]
    with e2e.twin_setting("fused_norms"):
        assert (tk.pdl_enabled(), tk.small_gemm_enabled(), tk.round_kernels_enabled()) == before
    assert (tk.pdl_enabled(), tk.small_gemm_enabled(), tk.round_kernels_enabled()) == before
