"""The AR step's GEMMs at Qwen3.6-27B dims, side by side: ``python -m workbench.bench.gemv``.

One token (x [1, K], bf16) through each weight the 27B AR step reads: the packed GDN input
projection, the GDN output projection, the packed attention q/k/v, attention's output, the
packed MLP gate/up, the MLP down projection and the LM head. Each is timed as cuBLAS through
``F.linear`` (what the model runs), ``torch.mv``, ``W @ x.T``, ``F.linear`` with cuBLASLt
preferred, and the Triton GEMV (kernels/tree_kernels/gemv) over a sweep of its block, warp,
stage and split-K settings. Timing: a CUDA graph of ``--calls`` calls that cycle through enough
copies of the weight to keep L2 cold, replayed ``--repeats`` times; the median per call. Reported
per variant: ms, GB/s of weight read and the fraction of the measured copy bandwidth; the max
error against an fp32 reference. Results: data/results/gemv-<device>-<date>.json (atomic).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..trace import write_json_atomic
from .e2e import QWEN36_27B, copy_bandwidth_gbs, device_name, log, versions

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"


def shapes_27b() -> dict[str, tuple[int, int, int]]:
    """name -> (N, K, layers that have it) for the 27B AR step."""
    c = QWEN36_27B
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    key, val, hv = c["linear_num_key_heads"] * c["linear_key_head_dim"], c["linear_num_value_heads"] * c["linear_value_head_dim"], c["linear_num_value_heads"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    layers = c["num_hidden_layers"]
    attn = layers // c["full_attention_interval"]
    return {
        "gdn_in_qkvzba": (2 * key + 2 * val + 2 * hv, h, layers - attn),
        "gdn_out": (h, val, layers - attn),
        "attn_qgkv": (2 * q + 2 * kv, h, attn),
        "attn_o": (h, q, attn),
        "mlp_gate_up": (2 * inter, h, layers),
        "mlp_down": (h, inter, layers),
        "lm_head": (v, h, 1),
    }


def triton_configs(n: int) -> list[dict]:
    base = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st, SPLIT_K=1)
            for bn, bk, w, st in itertools.product((4, 8, 16), (256, 512, 1024), (4, 8), (2, 4))]
    if n <= 8192:  # few rows: split K so that every SM has work
        base += [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=3, SPLIT_K=sp)
                 for bn, bk, w, sp in itertools.product((4, 8, 16), (256, 512), (4, 8), (2, 4, 8))]
    return base


def few_rows_configs(n: int = 0, layouts: tuple[str, ...] = ("swap", "swap_tma")) -> list[dict]:
    """The few-rows GEMM's sweep. "rows" (x's rows on the MMA's M side: the 2026-12-03 kernel, 1.2-2.3x
    behind cuBLAS at 65 / 129 rows) only when asked; the "swap" layouts (the weight's rows on the
    MMA's M side, BLOCK_N >= 64 for a Hopper warpgroup) with pointer loads and with TMA tiles."""
    out = []
    if "rows" in layouts:
        out += [dict(LAYOUT="rows", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=4)
                for bn, bk, w in itertools.product((32, 64, 128), (128, 256), (4, 8))]
    if "swap" in layouts:  # pointer loads: 255 registers a thread already at BLOCK_N 64 (sm_90 AOT), so few configs
        out += [dict(LAYOUT="swap", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st, SPLIT_K=1)
                for bn, bk, w, st in ((64, 128, 4, 3), (64, 64, 4, 4), (128, 64, 8, 3))]
    if "swap_tma" in layouts:  # TMA tiles: 66 registers, the stages in shared memory (36-52 KB a stage)
        out += [dict(LAYOUT="swap_tma", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st, SPLIT_K=1)
                for bn, bk, w, st in ((64, 128, 4, 3), (64, 128, 4, 4), (64, 128, 4, 5), (64, 64, 4, 6), (64, 64, 4, 8),
                                      (128, 64, 4, 4), (128, 64, 4, 6), (128, 128, 4, 3), (128, 128, 8, 4), (64, 256, 4, 3))]
        out += [dict(LAYOUT="swap_tma", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT_K=1, WARP_SPECIALIZE=True)]
    if n <= 8192:  # 5120 outputs are 80 programs of 64: split K so that every SM streams
        out += [dict(LAYOUT=lay, BLOCK_N=64, BLOCK_K=bk, num_warps=4, num_stages=st, SPLIT_K=sp)
                for lay in ("swap", "swap_tma") if lay in layouts
                for bk, st, sp in ((128, 4, 2), (128, 4, 3), (64, 6, 2))]
    return out


def time_per_call_ms(fn_of_copy, copies: int, calls: int, repeats: int) -> float:
    """CUDA-graph replay of ``calls`` calls (cycling through the weight copies), median per call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn_of_copy(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn_of_copy(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    del graph
    return statistics.median(times)


def _weights(n: int, k: int, args) -> list[torch.Tensor]:
    """Copies of one random [N, K] bf16 weight, enough of them to span 3x L2 (so each call reads HBM)."""
    copies = max(2, -(-3 * args.l2_bytes // (n * k * 2)))
    return [torch.randn(n, k, device=args.device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]


def _time_variants(variants, x, weights, args, bandwidth) -> list[dict]:
    """variants: (label, config, fn of the weight copy's index, cuBLASLt preferred). One row each:
    ms per call, GB/s of weight read, its fraction of the copy bandwidth, max error against fp32."""
    ref = F.linear(x.float(), weights[0].float())
    scale = ref.abs().max().item() or 1.0
    nbytes = weights[0].numel() * weights[0].element_size()
    rows = []
    for label, config, fn, lt in variants:
        try:
            if lt:
                torch.backends.cuda.preferred_blas_library("cublaslt")
            err = (fn(0).float() - ref).abs().max().item() / scale
            ms = time_per_call_ms(fn, len(weights), args.calls, args.repeats)
        except Exception as exc:  # report, never hide
            rows.append({"variant": label, "config": config, "error": repr(exc)[:300]})
            continue
        finally:
            if lt:
                torch.backends.cuda.preferred_blas_library("cublas")
        gbs = nbytes / (ms * 1e-3) / 1e9
        rows.append({"variant": label, "config": config, "ms": ms, "gb_per_s": gbs, "of_copy_bandwidth": gbs / bandwidth,
                     "max_rel_err": err})
    return rows


# a config whose output is further than this from the fp32 reference (relative to its largest
# entry; bf16 rounding gives ~3e-3) is wrong, and never picked however fast
MAX_REL_ERR = 2e-2


def _summary(rows: list[dict], **fields) -> dict:
    """The rows with the best (correct) Triton config and cuBLAS (``linear``) picked out and compared."""
    for r in rows:
        if "ms" in r and not r["max_rel_err"] <= MAX_REL_ERR:
            r["wrong"] = True
    ok = [r for r in rows if "ms" in r and not r.get("wrong")]
    best = min((r for r in ok if r["variant"] == "triton"), key=lambda r: r["ms"], default=None)
    linear = next((r for r in ok if r["variant"] == "linear"), None)
    return {**fields, "rows": rows, "best_triton": best, "linear_ms": linear and linear["ms"],
            "best_triton_over_linear": best and linear and best["ms"] / linear["ms"]}


def _log_summary(s: dict, what: str) -> None:
    best, lin = s["best_triton"], s["linear_ms"]
    if best and lin:
        others = ", ".join(f"{r['variant']} {r['ms'] * 1e3:.1f}" for r in s["rows"] if "ms" in r and r["variant"] not in ("linear", "triton"))
        log(f"{s['name']:14s} {what}: linear {lin * 1e3:7.1f} us{', ' + others if others else ''}; "
            f"triton best {best['ms'] * 1e3:.1f} us ({100 * best['of_copy_bandwidth']:.0f}%) {best['config']}")


def bench_few_rows(name, n, k, rows_list, args, bandwidth) -> list[dict]:
    """A tree verify's M rows through the same weights: cuBLAS (F.linear) against the Triton
    few-rows GEMM's configs."""
    from tree_kernels.gemv import triton as tg

    weights = _weights(n, k, args)
    out = []
    for m in rows_list:
        x = torch.randn(m, k, device=args.device, dtype=torch.bfloat16)
        pad = -m % 16  # M rounded up to 16: cuBLAS's tiles for an odd M (65 = a budget of 64 + the root)
        xp = torch.cat([x, x.new_zeros(pad, k)]) if pad else x
        variants = [("linear", None, lambda i: F.linear(x, weights[i]), False),
                    ("w_at_xt", None, lambda i: torch.matmul(weights[i], x.t()).t(), False),
                    ("linear_cublaslt", None, lambda i: F.linear(x, weights[i]), True),
                    ("linear_m_padded", {"M": m + pad}, lambda i: F.linear(xp, weights[i])[:m], False)]
        if not args.few_skip_triton:
            variants += [("triton", c, lambda i, c=c: tg.gemm_few_rows(x, weights[i], None, c), False)
                         for c in few_rows_configs(n, tuple(args.few_layouts.split(",")))]
        summary = _summary(_time_variants(variants, x, weights, args, bandwidth), name=name, M=m, N=n, K=k)
        cublas = [r for r in summary["rows"] if "ms" in r and r["variant"] != "triton"]
        summary["best_cublas"] = min(cublas, key=lambda r: r["ms"], default=None)
        out.append(summary)
        _log_summary(out[-1], f"M={m:4d}")
    del weights
    _empty_cache(args)
    return out


def bench_shape(name, n, k, args, bandwidth) -> dict:
    """One token through the weight: cuBLAS four ways against the Triton GEMV's configs."""
    from tree_kernels.gemv import triton as tg

    weights = _weights(n, k, args)
    x = torch.randn(1, k, device=args.device, dtype=torch.bfloat16)
    linear = lambda i: F.linear(x, weights[i])  # noqa: E731
    variants = [("linear", None, linear, False),
                ("mv", None, lambda i: torch.mv(weights[i], x[0]).view(1, n), False),
                ("w_at_xt", None, lambda i: torch.matmul(weights[i], x.t()).view(1, n), False),
                ("linear_cublaslt", None, linear, True)]
    variants += [("triton", c, lambda i, c=c: tg.gemv(x, weights[i], None, c), False) for c in triton_configs(n)]
    summary = _summary(_time_variants(variants, x, weights, args, bandwidth), name=name, N=n, K=k,
                       weight_mb=n * k * 2 / 1e6, copies=len(weights))
    _log_summary(summary, f"N={n:6d} K={k:5d}")
    del weights
    _empty_cache(args)
    return summary


def _empty_cache(args) -> None:
    if args.device == "cuda":
        torch.cuda.empty_cache()


def _step_gemm_ms(rows: list[dict]) -> dict:
    """A step's GEMM time (each shape x its layers) through cuBLAS, and through the faster of
    cuBLAS and the best Triton config per shape."""
    mine = [s for s in rows if s["linear_ms"]]
    best = [min(s["linear_ms"], s["best_triton"]["ms"] if s["best_triton"] else float("inf")) for s in mine]
    out = {"linear": sum(s["linear_ms"] * s["layers"] for s in mine),
           "best_of_linear_and_triton": sum(b * s["layers"] for b, s in zip(best, mine))}
    if all(s.get("best_cublas") for s in mine):  # the few-rows section: any cuBLAS call layout per shape
        from tree_kernels.gemv import triton as tg

        out["best_cublas_layout"] = sum(s["best_cublas"]["ms"] * s["layers"] for s in mine)
        # what tree_kernels.linear does with this result loaded as its tuned table (few_rows_routes:
        # one route per shape and M, also where two projections share a shape)
        routes = tg.few_rows_routes({"device": "", "few_rows": mine})
        out["tuned_routes"] = sum(_route_ms(s, routes[("", s["N"], s["K"], s["M"])]) * s["layers"] for s in mine)
    return out


def _route_ms(row: dict, route: dict) -> float:
    """One few-rows row's time through ``route`` (as few_rows_routes chose it for the row's shape and M):
    the row's own best route where the table kept it, else F.linear."""
    from tree_kernels.gemv import triton as tg

    ms, own = tg.few_rows_route(row)
    return ms if (own or tg.CUBLAS_ROUTE) == route else row["linear_ms"]


TUNED_MODULE = Path(__file__).resolve().parents[2] / "kernels" / "tree_kernels" / "gemv" / "few_rows_tuned.py"


def tuned_module_source(results: list[tuple[str, dict]]) -> str:
    """The text of kernels/tree_kernels/gemv/few_rows_tuned.py for bench.gemv results, given as
    (path, result), one per card: the routes few_rows_routes takes from each few-rows section, keyed
    (device, N, K, M), and the files they came from. Generated, never edited by hand (a test
    regenerates it from SOURCES and compares)."""
    from tree_kernels.gemv import triton as tg

    devices = [result.get("device") for _, result in results]
    for path, result in results:
        if not result.get("few_rows"):
            raise ValueError(f"{path}: no few_rows section to take routes from")
    if len(set(devices)) != len(devices):
        raise ValueError(f"one bench.gemv result per card: {devices} repeats a device")
    sources = tuple(path for path, _ in results)
    lines = ['"""The few-rows GEMM routes tree_kernels.linear takes by default: (device name, N, K, M) -> a',
             "Triton config or {'BACKEND': 'cublaslt'} where the sweep in SOURCES found one faster than F.linear",
             "(gemv.triton.few_rows_route), else {'BACKEND': 'cublas'} (fewer rows round up to the next swept M).",
             f"Generated by `python -m workbench.bench.gemv --tuned-from {' '.join(sources)}`; do not edit.", '"""', "",
             f"SOURCES = {sources!r}", "TABLE = {"]
    for _, result in results:
        names: dict[tuple, list] = {}  # one shape may serve several projections
        for row in result["few_rows"]:
            shape_names = names.setdefault((row["N"], row["K"]), [])
            if row.get("name", "") not in shape_names:
                shape_names.append(row.get("name", ""))
        for (device, n, k, m), route in tg.few_rows_routes(result).items():
            lines.append(f"    ({device!r}, {n}, {k}, {m}): {route!r},  # {', '.join(names[(n, k)])}")
    return "\n".join(lines + ["}", ""])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--l2-bytes", type=int, default=60 << 20, help="copies of each weight span at least 3x this")
    p.add_argument("--only", default="", help="comma-separated shape names")
    p.add_argument("--rows", default="17,65,129", help="few-rows section: the verify's M values ('' skips it)")
    p.add_argument("--skip-gemv", action="store_true", help="only the few-rows section")
    p.add_argument("--few-skip-triton", action="store_true", help="few-rows section: cuBLAS call layouts only")
    p.add_argument("--few-layouts", default="swap,swap_tma", help="few-rows section: the Triton layouts swept (rows, swap, swap_tma)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tuned-from", nargs="+", default=None, help="no timing: write the default few-rows routes "
                   "(kernels/tree_kernels/gemv/few_rows_tuned.py) from these committed bench.gemv results, one per card")
    args = p.parse_args(argv)
    if args.tuned_from:
        results = []
        for src in map(Path, args.tuned_from):
            if not src.is_file():
                raise SystemExit(f"{src}: no such file")
            results.append((src.resolve().relative_to(RESULTS.parents[1]).as_posix(), json.loads(src.read_text())))
        try:
            text = tuned_module_source(results)
        except ValueError as exc:
            raise SystemExit(str(exc))
        tmp = TUNED_MODULE.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(TUNED_MODULE)
        from tree_kernels.gemv import triton as tg

        for rel, result in results:
            routes = tg.few_rows_routes(result)
            kept = sum(1 for route in routes.values() if route == tg.CUBLAS_ROUTE)
            log(f"{rel}: {len(routes) - kept} routes off plain cuBLAS, {kept} swept rows left on it ({result['device']})")
        log(f"wrote {TUNED_MODULE}")
        return {"sources": [rel for rel, _ in results]}
    if not torch.cuda.is_available():
        raise SystemExit("bench.gemv needs a CUDA device")
    args.device = "cuda"
    shapes = shapes_27b()
    wanted = [s for s in args.only.split(",") if s] or list(shapes)
    unknown = [s for s in wanted if s not in shapes]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; known: {sorted(shapes)}")
    bandwidth = copy_bandwidth_gbs()
    now = dt.datetime.now()
    result = {"benchmark": "gemv", "date": now.isoformat(timespec="seconds"), "device": device_name(), "versions": versions(),
              "statistic": f"median over {args.repeats} replays of a graph of {args.calls} calls, per call",
              "copy_bandwidth_gbs": bandwidth, "shapes": []}
    out = args.out or RESULTS / f"gemv-{device_name().replace(' ', '-').lower()}-{now.date()}.json"
    t0 = time.perf_counter()
    for name in wanted if not args.skip_gemv else []:
        n, k, layers = shapes[name]
        row = bench_shape(name, n, k, args, bandwidth)
        row["layers"] = layers
        result["shapes"].append(row)
        write_json_atomic(out, result)
    if result["shapes"]:  # the AR step's GEMM time with each shape's cuBLAS call against its best Triton config
        result["ar_step_gemm_ms"] = g = _step_gemm_ms(result["shapes"])
        log(f"AR-step GEMMs: linear {g['linear']:.2f} ms, best of linear/triton per shape {g['best_of_linear_and_triton']:.2f} ms "
            f"({time.perf_counter() - t0:.0f} s)")
    rows_list = [int(m) for m in args.rows.split(",") if m]
    if rows_list:
        result["few_rows"] = []
        for name in wanted:
            n, k, layers = shapes[name]
            for row in bench_few_rows(name, n, k, rows_list, args, bandwidth):
                row["layers"] = layers
                result["few_rows"].append(row)
            write_json_atomic(out, result)
        result["verify_gemm_ms"] = {}
        for m in rows_list:
            result["verify_gemm_ms"][str(m)] = g = _step_gemm_ms([s for s in result["few_rows"] if s["M"] == m])
            log(f"verify GEMMs, {m} rows: linear {g['linear']:.2f} ms, best of linear/triton per shape {g['best_of_linear_and_triton']:.2f} ms"
                + (f", best cuBLAS layout per shape {g['best_cublas_layout']:.2f} ms, tuned routes {g['tuned_routes']:.2f} ms"
                   if "best_cublas_layout" in g else ""))
    write_json_atomic(out, result)
    return result


if __name__ == "__main__":
    main()
