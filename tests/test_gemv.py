"""The one-row linear layer (the AR step's GEMMs): the Triton GEMV against its reference and
F.linear, under TRITON_INTERPRET=1 on CPU, and its dispatch from the models."""

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "1")

import tree_kernels as tk  # noqa: E402
from tree_kernels.gemv import naive  # noqa: E402

triton_gemv = pytest.importorskip("tree_kernels.gemv.triton")


@pytest.mark.parametrize("n, k, config", [
    (37, 300, {}),  # ragged rows and K
    (64, 1024, {"BLOCK_N": 16, "BLOCK_K": 128}),
    (64, 1000, {"SPLIT_K": 3, "BLOCK_K": 128}),  # split-K: partials and the second launch
    (5, 77, {"BLOCK_N": 4, "BLOCK_K": 32, "SPLIT_K": 2}),
])
@pytest.mark.parametrize("with_bias", [False, True])
def test_triton_gemv_matches_the_reference(n, k, config, with_bias):
    g = torch.Generator().manual_seed(n * k)
    x = torch.randn(1, k, generator=g)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if with_bias else None
    # fp32 inputs: the same sum in another order, so only rounding apart
    torch.testing.assert_close(triton_gemv.gemv(x, w, b, config), naive.gemv(x, w, b), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(naive.gemv(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    # bf16: within one rounding of the bf16 output
    xb, wb = x.bfloat16(), w.bfloat16()
    bb = None if b is None else b.bfloat16()
    got, want = triton_gemv.gemv(xb, wb, bb, config).float(), naive.gemv(xb, wb, bb).float()
    assert got.dtype == torch.float32 and ((got - want).abs() <= 2 ** -7 * want.abs() + 1e-2).all()


def test_gemv_rejects_shapes_that_do_not_fit():
    x, w = torch.randn(1, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"x must be \[1, K\]"):
        naive.gemv(torch.randn(2, 8), w)
    with pytest.raises(ValueError, match=r"weight \(4, 9\)"):
        triton_gemv.gemv(x, torch.randn(4, 9))
    with pytest.raises(ValueError, match="bias"):
        triton_gemv.gemv(x, w, torch.randn(5))
    with pytest.raises(ValueError, match="contiguous"):
        triton_gemv.gemv(x, torch.randn(8, 4).t())


@pytest.mark.parametrize("m, n, k, config", [
    (17, 37, 300, {}),  # ragged everything, one row block of 32
    (65, 100, 256, {"BLOCK_N": 32, "BLOCK_K": 64}),
    (129, 64, 128, {"MAX_BLOCK_M": 64}),  # three row blocks
    (2, 5, 77, {"BLOCK_N": 16, "BLOCK_K": 32}),
    # the "swap" layouts: weight rows on the MMA's M side, x's rows a main block + a tail block
    (17, 37, 304, {"LAYOUT": "swap"}),  # main 16 + tail 16 for one row
    (65, 100, 256, {"LAYOUT": "swap", "BLOCK_N": 32, "BLOCK_K": 64}),  # 64 + 16, ragged N
    (16, 64, 128, {"LAYOUT": "swap"}),  # no tail
    (50, 70, 200, {"LAYOUT": "swap", "SPLIT_K": 3, "BLOCK_K": 32}),  # 32 + 32 (18 rows), split K, ragged last slice
    (330, 20, 64, {"LAYOUT": "swap", "BLOCK_N": 16, "BLOCK_K": 32}),  # two launches: 320 rows + 10
    (65, 100, 256, {"LAYOUT": "swap_tma", "BLOCK_N": 32, "BLOCK_K": 64}),  # TMA tiles, zero past M / N
    (33, 70, 208, {"LAYOUT": "swap_tma", "SPLIT_K": 3, "BLOCK_K": 32}),  # TMA + split K, K past the last tile
    (65, 64, 128, {"LAYOUT": "swap_tma", "BLOCK_K": 32, "WARP_SPECIALIZE": True}),
    (9, 5, 77, {"LAYOUT": "swap_tma", "BLOCK_N": 16, "BLOCK_K": 32}),  # rows not 16-byte aligned: pointer loads
])
@pytest.mark.parametrize("with_bias", [False, True])
def test_triton_few_rows_gemm_matches_the_reference(m, n, k, config, with_bias):
    g = torch.Generator().manual_seed(m * n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if with_bias else None
    torch.testing.assert_close(triton_gemv.gemm_few_rows(x, w, b, config), naive.gemm_few_rows(x, w, b), rtol=1e-5, atol=1e-4)
    xs = torch.randn(k, m, generator=g).t()  # a strided x is made contiguous, not misread
    torch.testing.assert_close(triton_gemv.gemm_few_rows(xs, w, b, config), naive.gemm_few_rows(xs, w, b), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"weight \(3, 7\)"):
        triton_gemv.gemm_few_rows(x, torch.randn(3, 7))


def test_swap_row_blocks_cover_the_rows_with_the_least_padding():
    assert [triton_gemv.swap_row_blocks(m) for m in (1, 16, 17, 33, 63, 65, 129, 257, 320)] == [
        (16, 0), (16, 0), (16, 16), (32, 16), (32, 32), (64, 16), (128, 16), (256, 16), (256, 64)]
    for m in range(1, 600):
        main, tail = triton_gemv.swap_row_blocks(m)
        assert main + tail >= m and main & (main - 1) == 0 and tail & (tail - 1) == 0 and (tail == 0 or tail >= 16)
    with pytest.raises(ValueError, match="LAYOUT must be"):
        triton_gemv.gemm_few_rows(torch.randn(3, 8), torch.randn(4, 8), None, {"LAYOUT": "cols"})


def test_few_rows_tuned_configs_come_from_a_bench_result_and_route_only_their_shapes(monkeypatch):
    # a bench.gemv result's few-rows rows: a shape and M where Triton beat every cuBLAS layout is
    # taken, one where it lost stays on cuBLAS; the lookup takes the smallest swept M >= the rows asked
    monkeypatch.setattr(triton_gemv, "FEW_ROWS_TUNED", {})
    result = {"device": "Dev", "few_rows": [
        {"N": 8, "K": 16, "M": 17, "best_triton": {"ms": 1.0, "config": {"LAYOUT": "swap", "BLOCK_N": 16}}, "best_cublas": {"ms": 2.0}, "linear_ms": 2.0},
        {"N": 8, "K": 16, "M": 65, "best_triton": {"ms": 3.0, "config": {"LAYOUT": "swap", "BLOCK_N": 32}}, "best_cublas": {"ms": 2.0}, "linear_ms": 2.0},
        {"N": 4, "K": 16, "M": 17, "best_triton": None, "best_cublas": {"ms": 2.0}, "linear_ms": 2.0},
        {"N": 4, "K": 16, "M": 65, "best_triton": {"ms": 1.0, "config": {"LAYOUT": "swap", "BLOCK_N": 64}}, "best_cublas": {"ms": 2.0}, "linear_ms": 2.0},
        {"N": 2, "K": 16, "M": 17, "linear_ms": None},  # not measured (failed): no entry
    ]}
    cublas = triton_gemv.CUBLAS_ROUTE
    assert triton_gemv.few_rows_routes(result) == {
        ("Dev", 8, 16, 17): {"LAYOUT": "swap", "BLOCK_N": 16}, ("Dev", 8, 16, 65): cublas,
        ("Dev", 4, 16, 17): cublas, ("Dev", 4, 16, 65): {"LAYOUT": "swap", "BLOCK_N": 64}}
    assert triton_gemv.FEW_ROWS_TUNED == {}  # few_rows_routes only reads
    # one shape measured twice (two projections of one size): a route only where both rows chose it
    twice = {"device": "Dev", "few_rows": [
        dict(_few_row(1.0, ms_lt=0.9), name="gdn_out"), dict(_few_row(1.0, ms_lt=0.95), name="attn_o"),
        dict(_few_row(1.0, ms_lt=0.9, m=17), name="gdn_out"), dict(_few_row(1.0, m=17), name="attn_o"),
        dict(_few_row(1.0, m=33), name="gdn_out"), dict(_few_row(1.0, ms_lt=0.9, m=33), name="attn_o")]}
    assert triton_gemv.few_rows_routes(twice) == {("Dev", 8, 16, 65): {"BACKEND": "cublaslt"},
                                                  ("Dev", 8, 16, 17): cublas, ("Dev", 8, 16, 33): cublas}
    assert triton_gemv.load_few_rows_tuned(result) == triton_gemv.FEW_ROWS_TUNED == triton_gemv.few_rows_routes(result)
    assert triton_gemv.routed_max_rows(triton_gemv.FEW_ROWS_TUNED) == 65
    assert triton_gemv.routed_max_rows(triton_gemv.FEW_ROWS_TUNED, device="Other") == 0
    assert triton_gemv.routed_max_rows({("Dev", 8, 16, 129): cublas, ("Dev", 8, 16, 17): {"LAYOUT": "swap"}}) == 17

    class FakeWeight:
        is_cuda, shape, device = True, (8, 16), "cuda:0"

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Dev")
    assert triton_gemv.few_rows_config_for(FakeWeight(), 9)["BLOCK_N"] == 16
    assert triton_gemv.few_rows_config_for(FakeWeight(), 9)["num_warps"] == triton_gemv.FEW_ROWS_CONFIG["num_warps"]
    assert triton_gemv.few_rows_config_for(FakeWeight(), 18) is None  # rounds up to 65, where cuBLAS won
    assert triton_gemv.few_rows_config_for(FakeWeight(), 66) is None  # no swept M >= 66: cuBLAS
    FakeWeight.shape = (4, 16)
    # 9 rows round up to 17, where cuBLAS won: not to 65's route, measured at 65 rows only
    assert triton_gemv.few_rows_config_for(FakeWeight(), 9) is None
    assert triton_gemv.few_rows_config_for(FakeWeight(), 40)["BLOCK_N"] == 64
    FakeWeight.shape = (2, 16)
    assert triton_gemv.few_rows_config_for(FakeWeight(), 9) is None  # not tuned: cuBLAS
    # on the CPU (interpreted) a tuned table routes nothing: tuned shapes are per device
    monkeypatch.setattr(triton_gemv, "FEW_ROWS_MAX", 64)
    calls = []
    real_few = triton_gemv.gemm_few_rows
    monkeypatch.setattr(triton_gemv, "gemm_few_rows", lambda *a, **kw: calls.append(a[0].shape) or real_few(*a, **kw))
    with tk.use_backend("triton"):
        three, w = torch.randn(3, 16).bfloat16(), torch.randn(8, 16).bfloat16()
        torch.testing.assert_close(tk.linear(three, w), F.linear(three, w), rtol=2e-2, atol=2e-2)
    assert calls == []
    monkeypatch.setattr(triton_gemv, "FEW_ROWS_TUNED", {})  # no table: every shape takes FEW_ROWS_CONFIG
    with tk.use_backend("triton"):
        tk.linear(three, w)
    assert calls == [(3, 16)]


def test_linear_dispatch_by_rows_dtype_and_gradients(monkeypatch):
    monkeypatch.setattr(triton_gemv, "FEW_ROWS_TUNED", {})  # no table: several rows take FEW_ROWS_CONFIG once switched on
    monkeypatch.setattr(triton_gemv, "FEW_ROWS_MAX", 0)
    calls = []
    real, real_few = triton_gemv.gemv, triton_gemv.gemm_few_rows
    monkeypatch.setattr(triton_gemv, "gemv", lambda *a, **kw: calls.append(("gemv", a[0].shape)) or real(*a, **kw))
    monkeypatch.setattr(triton_gemv, "gemm_few_rows", lambda *a, **kw: calls.append(("few", a[0].shape)) or real_few(*a, **kw))
    w = torch.randn(12, 40).bfloat16()
    with tk.use_backend("triton"):
        one = torch.randn(1, 40).bfloat16()
        torch.testing.assert_close(tk.linear(one, w), F.linear(one, w), rtol=2e-2, atol=2e-2)
        assert calls == [("gemv", (1, 40))]
        three = torch.randn(3, 40).bfloat16()
        tk.linear(three, w)  # several rows: cuBLAS's GEMM unless the few-rows GEMM is switched on
        assert calls == [("gemv", (1, 40))]
        monkeypatch.setattr(triton_gemv, "FEW_ROWS_MAX", 4)
        torch.testing.assert_close(tk.linear(three, w), F.linear(three, w), rtol=2e-2, atol=2e-2)
        assert calls[-1] == ("few", (3, 40))
        del calls[:]
        tk.linear(torch.randn(5, 40).bfloat16(), w)  # more rows than FEW_ROWS_MAX: cuBLAS's GEMM
        tk.linear(torch.randn(1, 40), w.float())  # fp32: F.linear
        with tk.use_gemv(False):
            tk.linear(one, w)
        wg = w.clone().requires_grad_()
        tk.linear(one, wg).float().sum().backward()  # gradients wanted: F.linear, which has a backward
        assert wg.grad is not None and calls == []
    with tk.use_backend("torch"):
        tk.linear(one, w)
    assert calls == []


def test_the_models_linears_take_the_gemv_in_the_ar_step(monkeypatch):  # (and the few-rows GEMM for the prompt)
    # the AR step of a bf16 hybrid target: every projection (packed or not) and the LM head go
    # through tree_kernels.linear with one row, and the logits match the F.linear route
    from workbench.random_models import random_target

    target = random_target("hybrid", seed=2, vocab_size=64).to(torch.bfloat16)
    seen = []
    real = triton_gemv.gemv
    monkeypatch.setattr(triton_gemv, "gemv", lambda x, w, b=None, c=None: seen.append(tuple(w.shape)) or real(x, w, b, c))
    ids = list(range(3, 12))
    with tk.use_backend("torch"):
        want = target.run_chain(ids, target.new_cache(32), logits="all").logits[-1]
    cache = target.new_cache(32)
    with tk.use_backend("torch"):
        target.run_chain(ids[:-1], cache, logits="last")
    with tk.use_backend("triton"):
        got = target.run_chain(ids[-1:], cache, logits="last").logits[-1]
    layers = len(target.model.layers)
    assert (target.config.vocab_size, target.config.hidden_size) in seen and len(seen) >= 3 * layers
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)


def test_bench_gemv_rows_and_summaries_on_cpu(monkeypatch):
    # bench.gemv's bookkeeping without a GPU: the CUDA-graph timer replaced by a fake, the Triton
    # kernels interpreted; every variant gets a row (time, bandwidth, error) and the summaries
    # pick the best Triton config and the cuBLAS row, and weigh shapes by their layers
    import argparse

    from workbench.bench import gemv

    monkeypatch.setattr(gemv, "time_per_call_ms", lambda fn, copies, calls, repeats: (fn(0), 0.01)[1])
    monkeypatch.setattr(gemv, "triton_configs", lambda n: [dict(BLOCK_N=4, BLOCK_K=32, num_warps=1, num_stages=1, SPLIT_K=1),
                                                           dict(BLOCK_N=8, BLOCK_K=32, num_warps=1, num_stages=1, SPLIT_K=2)])
    asked = []
    monkeypatch.setattr(gemv, "few_rows_configs", lambda n, layouts: asked.append(layouts) or [
        dict(BLOCK_N=16, BLOCK_K=32, num_warps=1, num_stages=1), dict(LAYOUT="swap", BLOCK_N=16, BLOCK_K=32, num_warps=1, num_stages=1)])
    args = argparse.Namespace(device="cpu", l2_bytes=1, calls=2, repeats=1, few_skip_triton=False, few_layouts="rows,swap")
    one = gemv.bench_shape("toy", 24, 64, args, bandwidth=100.0)
    triton_rows = [r for r in one["rows"] if r["variant"] == "triton"]
    assert len(triton_rows) == 2 and all(r["max_rel_err"] < 2e-2 for r in triton_rows)
    assert one["linear_ms"] == 0.01 and one["best_triton"] in triton_rows and one["copies"] == 2
    assert {r["variant"] for r in one["rows"]} >= {"linear", "mv", "w_at_xt", "triton"}
    few = gemv.bench_few_rows("toy", 24, 64, [3, 17], args, bandwidth=100.0)
    assert [s["M"] for s in few] == [3, 17] and all(s["best_triton"]["max_rel_err"] < 2e-2 for s in few)
    assert asked == [("rows", "swap")] * 2 and all(len([r for r in s["rows"] if r["variant"] == "triton"]) == 2 for s in few)
    # a wrong config is never the best, however fast
    rows = [{"variant": "linear", "ms": 2.0, "max_rel_err": 0.0}, {"variant": "triton", "ms": 0.5, "max_rel_err": 0.3},
            {"variant": "triton", "ms": 1.0, "max_rel_err": 1e-3}, {"variant": "triton", "ms": 0.1, "max_rel_err": float("nan")}]
    picked = gemv._summary(rows, name="x")
    assert picked["best_triton"]["ms"] == 1.0 and rows[1]["wrong"] and rows[3]["wrong"] and "wrong" not in rows[2]
    # the cuBLAS call layouts (W x^T, cuBLASLt, M padded to 16) compute the same rows
    for s in few:
        layouts = {r["variant"]: r for r in s["rows"] if r["variant"] != "triton"}
        assert set(layouts) == {"linear", "w_at_xt", "linear_cublaslt", "linear_m_padded"}
        assert s["best_cublas"] in layouts.values()
        lt = layouts.pop("linear_cublaslt")  # a CPU build has no cuBLASLt: its row says so
        assert lt.get("max_rel_err", 0.0) < 1e-2 and ("error" not in lt or "cuBLASLt" in lt["error"])
        assert all(r["max_rel_err"] < 1e-2 for r in layouts.values()), layouts
        assert layouts["linear_m_padded"]["config"] == {"M": 16 if s["M"] == 3 else 32}
    one["layers"], few[0]["layers"] = 3, 2
    assert gemv._step_gemm_ms([one]) == {"linear": 0.03, "best_of_linear_and_triton": 0.03}
    assert gemv._step_gemm_ms([few[0]])["linear"] == 0.02 and gemv._step_gemm_ms([few[0]])["best_cublas_layout"] == 0.02


def _few_row(ms_linear, ms_lt=None, ms_triton=None, ms_other=None, n=8, k=16, m=65):
    rows = [{"variant": "linear", "ms": ms_linear}]
    if ms_lt is not None:
        rows.append({"variant": "linear_cublaslt", "ms": ms_lt})
    if ms_other is not None:
        rows.append({"variant": "w_at_xt", "ms": ms_other})
    cublas = min((r for r in rows), key=lambda r: r["ms"])
    best = {"ms": ms_triton, "config": {"LAYOUT": "swap_tma", "BLOCK_N": 64}} if ms_triton is not None else None
    return {"N": n, "K": k, "M": m, "rows": rows, "linear_ms": ms_linear, "best_cublas": cublas, "best_triton": best}


def test_few_rows_route_takes_the_fastest_route_that_beats_cublas_by_the_margin():
    route = triton_gemv.few_rows_route
    assert route(_few_row(1.0, ms_lt=0.9, ms_triton=0.95)) == (0.9, {"BACKEND": "cublaslt"})
    assert route(_few_row(1.0, ms_lt=0.9, ms_triton=0.8)) == (0.8, {"LAYOUT": "swap_tma", "BLOCK_N": 64})
    # within the margin of F.linear: keep F.linear
    assert route(_few_row(1.0, ms_lt=0.995)) == (1.0, None)
    # Triton faster than F.linear but not than another cuBLAS layout measured: not taken
    assert route(_few_row(1.0, ms_triton=0.9, ms_other=0.85)) == (1.0, None)
    # a cuBLASLt row that was wrong or failed is no route
    bad = _few_row(1.0, ms_lt=0.5)
    bad["rows"][1]["wrong"] = True
    assert route(bad) == (1.0, None)
    assert route({"N": 1, "K": 1, "M": 1, "linear_ms": None}) == (None, None)
    table = {}
    old = dict(triton_gemv.FEW_ROWS_TUNED)
    try:
        triton_gemv.FEW_ROWS_TUNED.clear()
        table = triton_gemv.load_few_rows_tuned({"device": "Dev", "few_rows": [_few_row(1.0, ms_lt=0.9), _few_row(1.0, n=4)]})
    finally:
        triton_gemv.FEW_ROWS_TUNED.clear()
        triton_gemv.FEW_ROWS_TUNED.update(old)
    assert table == {("Dev", 8, 16, 65): {"BACKEND": "cublaslt"}, ("Dev", 4, 16, 65): triton_gemv.CUBLAS_ROUTE}


def test_the_summed_verify_gemms_take_the_routes_the_table_would(monkeypatch):
    from workbench.bench import gemv as bench_gemv

    monkeypatch.setattr(triton_gemv, "FEW_ROWS_TUNED", {})
    # two projections of one shape disagree (cuBLASLt wins on one row only): both stay on F.linear;
    # a shape of its own takes its Triton route
    rows = [dict(_few_row(1.0, ms_lt=0.9, ms_triton=2.0), layers=2), dict(_few_row(1.1, ms_lt=1.105), layers=3),
            dict(_few_row(2.0, ms_lt=2.0, ms_triton=1.5, n=4), layers=1)]
    got = bench_gemv._step_gemm_ms(rows)
    assert got["linear"] == pytest.approx(1.0 * 2 + 1.1 * 3 + 2.0)
    assert got["tuned_routes"] == pytest.approx(1.0 * 2 + 1.1 * 3 + 1.5)
    rows[1] = dict(_few_row(1.1, ms_lt=0.95), layers=3)  # now both rows pick cuBLASLt
    assert bench_gemv._step_gemm_ms(rows)["tuned_routes"] == pytest.approx(0.9 * 2 + 0.95 * 3 + 1.5)


def test_linear_sends_a_cublaslt_route_through_cublaslt(monkeypatch):
    calls = []
    monkeypatch.setattr(triton_gemv, "FEW_ROWS_MAX", 64)
    monkeypatch.setattr(triton_gemv, "few_rows_config_for", lambda w, m: {**triton_gemv.FEW_ROWS_CONFIG, "BACKEND": "cublaslt"})
    monkeypatch.setattr(triton_gemv, "linear_cublaslt", lambda x, w, b=None: calls.append(x.shape) or F.linear(x, w, b))
    monkeypatch.setattr(triton_gemv, "gemm_few_rows", lambda *a, **kw: pytest.fail("a cuBLASLt route ran the Triton GEMM"))
    three, w = torch.randn(3, 16).bfloat16(), torch.randn(8, 16).bfloat16()
    with tk.use_backend("triton"):
        torch.testing.assert_close(tk.linear(three, w), F.linear(three, w))
    assert calls == [(3, 16)]


def test_linear_cublaslt_restores_the_preferred_blas_library_even_when_the_call_fails(monkeypatch):
    settings = ["cublas"]

    def preferred(backend=None):
        if backend is not None:
            settings.append(backend)
        return settings[-1]

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred)
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    torch.testing.assert_close(triton_gemv.linear_cublaslt(x, w), F.linear(x, w))
    assert settings == ["cublas", "cublaslt", "cublas"]
    with pytest.raises(RuntimeError):
        triton_gemv.linear_cublaslt(x, torch.randn(8, 15))
    assert settings[-1] == "cublas"


def test_the_committed_few_rows_routes_are_what_their_source_result_gives():
    # few_rows_tuned.py is generated (bench.gemv --tuned-from); a hand edit or a stale copy fails here
    import json
    from pathlib import Path

    from tree_kernels.gemv import few_rows_tuned
    from workbench.bench import gemv as bench_gemv

    if not few_rows_tuned.SOURCES:
        assert few_rows_tuned.TABLE == {}
        return
    root = Path(__file__).resolve().parents[1]
    results = [(src, json.loads((root / src).read_text())) for src in few_rows_tuned.SOURCES]
    assert bench_gemv.TUNED_MODULE.read_text() == bench_gemv.tuned_module_source(results)
    devices = {result["device"] for _, result in results}
    assert few_rows_tuned.TABLE and all(key[0] in devices for key in few_rows_tuned.TABLE)
    # and they are the default routes, for those rows only
    assert triton_gemv.FEW_ROWS_TUNED == few_rows_tuned.TABLE


def test_tuned_module_source_round_trips_through_python(tmp_path):
    from workbench.bench import gemv as bench_gemv

    result = {"device": "Dev", "few_rows": [dict(_few_row(1.0, ms_lt=0.9), name="mlp_down"),
                                            dict(_few_row(1.0, ms_triton=0.5, n=6, m=17), name="gdn_in"),
                                            dict(_few_row(1.0, n=4), name="attn_o")]}
    other = {"device": "Dev2", "few_rows": [dict(_few_row(1.0, ms_triton=0.5), name="mlp_down")]}
    text = bench_gemv.tuned_module_source([("data/results/x.json", result), ("data/results/y.json", other)])
    namespace = {}
    exec(compile(text, "few_rows_tuned.py", "exec"), namespace)
    assert namespace["SOURCES"] == ("data/results/x.json", "data/results/y.json")
    assert namespace["TABLE"].pop(("Dev2", 8, 16, 65)) == {"LAYOUT": "swap_tma", "BLOCK_N": 64}
    assert namespace["TABLE"] == {("Dev", 8, 16, 65): {"BACKEND": "cublaslt"},
                                  ("Dev", 6, 16, 17): {"LAYOUT": "swap_tma", "BLOCK_N": 64},
                                  ("Dev", 4, 16, 65): {"BACKEND": "cublas"}}  # swept, cuBLAS kept
    assert "# attn_o" in text and "# gdn_in" in text
    result["few_rows"].append(dict(_few_row(1.0, n=4), name="gdn_out"))  # a second projection of attn_o's shape
    assert "# attn_o, gdn_out" in bench_gemv.tuned_module_source([("x.json", result)])
    with pytest.raises(ValueError, match="repeats a device"):
        bench_gemv.tuned_module_source([("x.json", result), ("z.json", result)])
    with pytest.raises(ValueError, match="z.json: no few_rows section"):
        bench_gemv.tuned_module_source([("x.json", result), ("z.json", {"device": "Dev3"})])


def test_small_weights_take_the_triton_few_rows_gemm_only_with_the_switch(monkeypatch):
    calls = []
    real_few = triton_gemv.gemm_few_rows
    monkeypatch.setattr(triton_gemv, "gemm_few_rows", lambda *a, **kw: calls.append(a[1].shape) or real_few(*a, **kw))
    w, x = torch.randn(96, 64).bfloat16(), torch.randn(9, 64).bfloat16()
    with tk.use_backend("triton"):
        tk.linear(x, w)
        assert calls == []  # off by default: cuBLAS (F.linear)
        with tk.use_small_gemm(True):
            got = tk.linear(x, w)
            assert calls == [w.shape]
            assert triton_gemv.few_rows_config_for(torch.empty(triton_gemv.SMALL_WEIGHT_MAX + 1, 1), 9) != \
                {**triton_gemv.FEW_ROWS_CONFIG, **triton_gemv.SMALL_WEIGHT_ROUTE}  # a big weight keeps its route
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)
