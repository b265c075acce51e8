"""What an L2 warm-up buys a verify GEMM, in isolation: ``python -m workbench.bench.l2``.

Two measurements on the GPU (kernels/tree_kernels/l2_prefetch says why the warm-up exists):

1. the warm-up alone, 32 MB of a weight from a cold L2 (a 256 MB memset before each replay), for
   each setting of ``read_configs`` (register loads, per-line or per-4-KB prefetch instructions,
   4-132 programs, evict-last or plain), and the 65-row output-projection GEMM right after it: the
   best setting with at most 32 programs (read + GEMM) is written as ``best_read``;
2. the 65-row GEMMs that follow the tree kernels at Qwen3.6-27B dims (the GDN / attention output
   projection, 5120 x 6144, and for scale the MLP down projection, 5120 x 17408) timed after L2 was
   flushed and then warmed with the first 0 / 8 / 16 / 24 / 32 / 40 / 48 MB of their weight. Each is a
   CUDA graph of its own (flush, warm-up, GEMM), and CUDA events bracket the GEMM's replay only
   (the best setting, evict-last and plain).

Median of ``--repeats`` replays; ratios against the cold GEMM. Results:
data/results/l2-<device>-<date>.json (atomic). End to end (the warm-up beside the tree kernels, on a
side stream, in the captured verify) is ``bench.e2e --prefetch-variants``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from pathlib import Path

import torch

from ..trace import write_json_atomic
from .e2e import copy_bandwidth_gbs, device_name, log, versions

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"
MB = 1 << 20


def _graph(fn) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (autotune, cuBLAS handles) outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def timed_after(before, timed, repeats: int) -> float:
    """Median ms of ``timed``'s graph replayed right after L2 was flushed and ``before`` replayed."""
    flush = torch.empty(256 * MB // 4, dtype=torch.int32, device="cuda")
    g_before = _graph(before) if before is not None else None
    g_timed = _graph(timed)
    times = []
    for _ in range(repeats):
        flush.zero_()
        if g_before is not None:
            g_before.replay()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g_timed.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def read_configs() -> list[dict]:
    """The warm-up kernel's settings swept: register loads (the CPU-tested mode) with 32-132
    programs, then per-line and per-4-KB prefetch instructions with 4-32 (the bulk mode last: an
    instruction a driver refuses should cost only the rows after it)."""
    rows = [dict(PROGRAMS=p, BLOCK=b, num_warps=w, EVICT_LAST=e, PTX=0)
            for p in (32, 132) for b, w in ((2048, 4), (4096, 8)) for e in (True, False)]
    rows += [dict(PROGRAMS=p, BLOCK=b, num_warps=w, EVICT_LAST=e, PTX=1)
             for p in (8, 16, 32) for b, w in ((256, 4), (1024, 8)) for e in (True, False)]
    rows += [dict(PROGRAMS=p, BLOCK=b, num_warps=w, EVICT_LAST=True, PTX=2) for p in (4, 8, 16, 32) for b, w in ((64, 2), (256, 4))]
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.l2", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=65)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench.l2 times L2 on a GPU; this machine has none")
        return 2
    from tqdm import tqdm
    from tree_kernels.l2_prefetch import triton as lp

    dev = torch.device("cuda")
    result = {"benchmark": "l2", "date": dt.datetime.now().isoformat(timespec="seconds"), "device": device_name(),
              "versions": versions(), "statistic": f"median of {args.repeats} graph replays after a 256 MB L2 flush",
              "copy_bandwidth_gbs": copy_bandwidth_gbs(), "rows": args.rows, "read": [], "gemm": []}
    out = Path(args.out) if args.out else RESULTS / f"l2-{device_name().lower().replace(' ', '-')}-{dt.date.today().isoformat()}.json"
    w = torch.randn(5120, 6144, device=dev, dtype=torch.bfloat16)  # the GDN / attention output projection
    x = torch.randn(args.rows, 6144, device=dev, dtype=torch.bfloat16)
    y = torch.empty(args.rows, 5120, device=dev, dtype=torch.bfloat16)
    part = torch.zeros(256, dtype=torch.int32, device=dev)
    cold = timed_after(None, lambda: torch.matmul(x, w.t(), out=y), args.repeats)
    result["gemm_cold_ms"] = cold
    for cfg in tqdm(read_configs(), desc="warm-up read", unit="config"):
        row = {**cfg, "mbytes": 32}
        try:
            row["ms"] = timed_after(None, lambda: lp.l2_prefetch(w, 32 * MB, cfg, out=part), args.repeats)
            # a prefetch instruction retires when issued, not when its line arrives: the GEMM right
            # after says what the warm-up really did
            row["gemm_after_ms"] = timed_after(lambda: lp.l2_prefetch(w, 32 * MB, cfg, out=part),
                                               lambda: torch.matmul(x, w.t(), out=y), args.repeats)
            row["gemm_after_over_cold"] = row["gemm_after_ms"] / cold
            log(f"warm-up 32 MB {cfg}: {1e3 * row['ms']:.1f} us ({32 * MB / row['ms'] / 1e6:.0f} GB/s issued); "
                f"GEMM after it {1e3 * row['gemm_after_ms']:.1f} us vs {1e3 * cold:.1f} cold ({row['gemm_after_over_cold']:.3f}x)")
        except Exception as exc:  # a mode this card or driver refuses: reported, the others stand
            row["error"] = repr(exc)[:500]
            log(f"warm-up {cfg} failed: {exc!r}"[:300])
            torch.cuda.synchronize()
        result["read"].append(row)
        write_json_atomic(out, result, indent=2)
    ok = [r for r in result["read"] if "error" not in r and r["PROGRAMS"] <= 32]  # leave the tree kernels their SMs
    if not ok:
        print("error: no warm-up configuration ran")
        return 1
    best = min(ok, key=lambda r: r["ms"] + r["gemm_after_ms"])  # as if not overlapped at all
    result["best_read"] = {k: best[k] for k in ("PROGRAMS", "BLOCK", "num_warps", "EVICT_LAST", "PTX")}
    log(f"best warm-up (read + GEMM after, <= 32 programs): {result['best_read']}")
    write_json_atomic(out, result, indent=2)
    for name, (n, k) in (("gdn_out/attn_o", (5120, 6144)), ("mlp_down", (5120, 17408))):
        weight = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        x = torch.randn(args.rows, k, device=dev, dtype=torch.bfloat16)
        y = torch.empty(args.rows, n, device=dev, dtype=torch.bfloat16)
        gemm = lambda: torch.matmul(x, weight.t(), out=y)  # noqa: E731 - F.linear's cuBLAS call, into a fixed output
        cold = timed_after(None, gemm, args.repeats)
        for mb in tqdm((0, 8, 16, 24, 32, 40, 48), desc=name, unit="size"):
            for evict_last in (True, False):
                cfg = {**result["best_read"], "EVICT_LAST": evict_last}
                ms = cold if mb == 0 else timed_after(lambda: lp.l2_prefetch(weight, mb * MB, cfg, out=part), gemm, args.repeats)
                result["gemm"].append({"shape": name, "N": n, "K": k, "weight_mbytes": n * k * 2 / MB, "warm_mbytes": mb,
                                       "evict_last": evict_last, "ms": ms, "over_cold": ms / cold})
                if mb:
                    log(f"{name} [{args.rows} x {k}] x [{k} x {n}]: {1e3 * ms:.1f} us after {mb} MB warmed "
                        f"(evict_last={evict_last}) vs {1e3 * cold:.1f} cold ({ms / cold:.3f}x)")
        del weight
        write_json_atomic(out, result, indent=2)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
