"""Tree-verify kernels at Qwen3.6-27B dims, side by side: ``python -m workbench.bench.kernels``.

Per tree size (16 / 64 / 128 nodes, a DDTree-shaped tree), prefix 4096, bf16, one layer:

- tree GDN: the Triton fork + commit; the torch reference fork; the per-node-slot baseline
  (torch ``tree_gdn_slots`` and the bare copy of T states it implies); fla's
  ``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` on a chain of T tokens
  (when fla-core is importable).
- tree attention: Triton; the torch reference; SDPA with a bool mask; SDPA decode of one query.
- tree conv1d (10240 channels, width 4): Triton conv + commit; the torch references.

Timings are medians: ``X_ms`` from ``triton.testing.do_bench`` (eager; it flushes L2 before every
call, and shows host launch time when the host is the bottleneck), ``X_cold_graph_ms`` from CUDA
graph replays with L2 flushed before each (GPU time, inputs from HBM: what the targets are
compared with), ``X_warm_graph_ms`` from ``do_bench_cudagraph`` (L2 warm), ``X_host_us`` the host
time to enqueue one call. A block-configuration sweep runs at T = 64. Every bf16 kernel output is
compared with an fp32 reference on the same inputs (max abs error, and relative to max |ref|).
Then greedy losslessness on the GPU: a random bf16 hybrid target, the oracle drafter, DDTree +
fork with the Triton kernels against AR; each divergence is checked for a near-tie of the top-2
logits. Results: data/results/kernels-<device>-<date>.json (written atomically, also after each
section so a cut-short run keeps what it measured) and a table on stdout. ``--only`` runs some
sections (e.g. one process each), ``--merge a.json b.json ...`` combines their files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import platform
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from ..trace import write_json_atomic

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"

# Qwen3.6-27B per-layer dims
GDN = dict(h=16, hv=48, dk=128, dv=128)
ATTN = dict(hq=24, hkv=4, d=256)
CONV = dict(c=10240, w=4)
LOSSLESS_KEYS = ("ddtree_triton_vs_ar_triton", "ddtree_triton_vs_ar_torch", "ar_triton_vs_ar_torch", "ddtree_reference_norms_vs_ar_torch")
NORM_ROWS = (1, 65)  # the AR step and a 64-node verify
DECODE_ROWS = (1, 2)  # the AR step's one query, a two-node tree
BUILD_BUDGETS = (16, 64, 256)
TARGETS_MS = {"gdn": 0.05, "attention": 0.08, "conv": 0.02}
ISSUE_BASELINES_MS = {"fla_chunk_64": 0.53, "fla_fused_recurrent_64": 0.12, "slot_copy_floor_64": 0.10,
                      "sdpa_bool_mask_64": 0.44, "sdpa_decode_1": 0.06}


def log(msg: str) -> None:
    print(msg, flush=True)


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({platform.machine()})"


def device_slug() -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in device_name().lower()).strip("-")


# ----------------------------------------------------------------------------------- timing


def median_ms(fn, rep_ms: int) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median"))


def graph_ms(fn, rep_ms: int) -> float | None:
    import triton.testing

    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    except Exception as exc:  # some baselines cannot be captured
        log(f"    (graph timing failed: {type(exc).__name__}: {exc})")
        return None


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Measured device copy bandwidth (read + write) in GB/s."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 200)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def kernel_us(fn, repeats: int = 20) -> dict:
    """GPU microseconds per call of each kernel ``fn`` launches (torch.profiler, eager): which
    launch of a multi-launch op holds the time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    out: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            out[e.name] = out.get(e.name, 0.0) + us / repeats
    return out


def err(out: torch.Tensor, ref: torch.Tensor) -> dict:
    d = (out.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item()
    return {"max_abs": d, "max_rel": d / scale if scale else None, "ref_max": scale, "finite": bool(torch.isfinite(out).all())}


def cold_graph_ms(fn, n: int = 40) -> float | None:
    """Median GPU time of ``fn`` replayed from a CUDA graph with L2 flushed before each replay:
    no host launch overhead (as in a graph-captured forward), inputs from HBM."""
    try:
        flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            flush.zero_()
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
        del graph
        return float(times[len(times) // 2])
    except Exception as exc:
        log(f"    (cold graph timing failed: {type(exc).__name__}: {str(exc)[:200]})")
        torch.cuda.synchronize()
        return None


def host_us(fn, n: int = 50) -> float:
    """Host time to enqueue one call (the launch overhead an eager forward pays)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt_ = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt_ / n * 1e6


def timed(name: str, row: dict, fn, rep_ms: int, graph: bool = False) -> None:
    """``name``: eager do_bench median (L2 flushed; includes host launch time when the host is the
    bottleneck). With ``graph``: ``_cold_graph`` (CUDA graph, L2 flushed), ``_warm_graph``
    (do_bench_cudagraph, L2 warm), ``_host_us``."""
    try:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        row[name + "_first_call_s"] = time.perf_counter() - t0
        row[name] = median_ms(fn, rep_ms)
        if graph:
            row[name.replace("_ms", "") + "_cold_graph_ms"] = cold_graph_ms(fn)
            row[name.replace("_ms", "") + "_warm_graph_ms"] = graph_ms(fn, rep_ms)
            row[name.replace("_ms", "") + "_host_us"] = host_us(fn)
    except Exception as exc:
        row[name] = None
        row[name + "_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        log(f"    {name} failed: {type(exc).__name__}: {str(exc)[:300]}")


def out_of_resources(key, cfg: dict) -> bool:
    """Whether a kernel wrapper had to drop ``cfg`` (OutOfResources) and ran a smaller config. The
    wrapper records the config it merged (``cfg`` plus its defaults) under its own key, whose last
    element is the tensors' device ("cuda:0" where a bench may say "cuda"): so a recorded config
    matches when it holds every item of ``cfg`` and its key names the same kernel, shape and device
    type."""
    from tree_kernels._triton_common import _FAILED_CONFIGS

    def kernel_and_device_type(k):
        return tuple(k[:-1]) + (str(k[-1]).split(":")[0],)

    wanted, items = kernel_and_device_type(key), set(cfg.items())
    return any(kernel_and_device_type(k) == wanted and items <= set(ran) for k, ran in _FAILED_CONFIGS)


def best_ms(row: dict, name: str):
    """The comparison number: cold-graph time where measured, else the eager median."""
    base = name.replace("_ms", "")
    v = row.get(base + "_cold_graph_ms")
    return v if isinstance(v, (int, float)) else row.get(name)


# ----------------------------------------------------------------------------------- inputs


def make_tree(n: int, seed: int = 0):
    from ..tree import Draft, build_ddtree

    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(15, 4096, generator=g) * 2.0, -1)
    top = torch.topk(logp, max(1, n - 1), dim=-1)
    tree = build_ddtree(Draft(top.indices, top.values), max(1, n - 1), 0)
    return tree


def deepest_path(tree) -> list[int]:
    node = max(range(len(tree)), key=lambda i: tree.depths[i])
    return tree.path_to(node)


def gdn_inputs(t: int, dev, seed: int = 0):
    g = torch.Generator(device=dev).manual_seed(seed)
    h, hv, dk, dv = GDN["h"], GDN["hv"], GDN["dk"], GDN["dv"]
    q = F.normalize(torch.randn(t, h, dk, device=dev, generator=g), dim=-1)
    k = F.normalize(torch.randn(t, h, dk, device=dev, generator=g), dim=-1)
    v = torch.randn(t, hv, dv, device=dev, generator=g).bfloat16()
    gate = -torch.rand(t, hv, device=dev, generator=g) * 0.5 - 0.01
    beta = torch.rand(t, hv, device=dev, generator=g).bfloat16()
    s0 = torch.randn(hv, dk, dv, device=dev, generator=g) * 0.1
    return q, k, v, gate, beta, s0


# ----------------------------------------------------------------------------------- sections


def sweep_gdn_configs(label: str, configs: list[dict], call, reference, error_key: str) -> list[dict]:
    """Each tree GDN config run once (its max error against ``reference`` under ``error_key``) and
    timed as a cold graph; a config the wrapper had to shrink (OutOfResources) or that fails is
    recorded with its error, not timed."""
    records = []
    for cfg in configs:
        rec = dict(cfg)
        try:
            fn = lambda cfg=cfg: call(cfg)  # noqa: E731
            o2, _ = fn()
            if out_of_resources(("gdn_fork", GDN["dk"], GDN["dv"], str(o2.device)), cfg):
                raise RuntimeError("OutOfResources (the wrapper fell back to a smaller config)")
            rec[error_key] = (o2 - reference).abs().max().item()
            rec["cold_graph_ms"] = cold_graph_ms(fn, 20)
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        records.append(rec)
        log(f"    {label} {rec}")
    return records


# The blocked solve with stored off-diagonal blocks at its defaults and with each setting
# tree_gdn.triton.OFFDIAG_DEFAULTS leaves undecided: timed here in isolation (--only gdn_offdiag)
# and in the 27B verify (bench.e2e --gdn-variants). The wide scans, the peel with stored blocks and
# the prepare's dk chunks / warps were decided on 2026-12-07 (kernels-nvidia-h100-2026-12-07-gdn-offdiag.json,
# e2e-nvidia-h100-2026-12-07-27b-gdn-variants.json: no default changed); now the products with S0
# in the prepare (PRE_S0), with the chain's value tile and warps, which its smaller steps may change.
_S0 = {"PRE_S0": True}
OFFDIAG_VARIANTS = (
    ("default", {}), ("pre_s0", _S0), ("pre_s0_bv16", dict(_S0, BV=16)), ("pre_s0_2w", dict(_S0, num_warps=2)),
    ("pre_s0_bv16_2w", dict(_S0, BV=16, num_warps=2)), ("pre_s0_wide", dict(_S0, WIDE_OFF=True)),
    ("pre_s0_wide_bv16_2w", dict(_S0, WIDE_OFF=True, BV=16, num_warps=2)),
)


def offdiag_variant_configs(t: int) -> list[tuple[str, dict]]:
    """OFFDIAG_VARIANTS as full configs of the blocked solve at t nodes."""
    from tree_kernels.tree_gdn import triton as tg

    base = tg.blocked_config(t, GDN["dv"])
    return [(label, dict(base, **extra)) for label, extra in OFFDIAG_VARIANTS]


def bench_gdn_offdiag(t: int) -> dict:
    """``offdiag_variant_configs`` at one tree size: error against the fp32 reference, cold graph
    ms, and GPU us per launch (prepare, chain) of each."""
    from tree_kernels.tree_gdn import triton as tg
    from tree_kernels.tree_gdn import naive

    from ..tree import compile_tree

    dev = torch.device("cuda")
    tree = make_tree(t)
    c = compile_tree(tree, 4096, dev)
    q, k, v, gate, beta, s0 = gdn_inputs(t, dev)
    o_ref, _ = naive.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc)
    log(f"  GDN off-diagonal variants, T={t}")
    rows = {}
    for label, cfg in offdiag_variant_configs(t):
        call = lambda cfg=cfg: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=cfg)  # noqa: E731
        rec = sweep_gdn_configs(label, [cfg], lambda cfg: call(cfg), o_ref, "max_abs_vs_fp32_ref")[0]
        try:
            rec["kernel_us"] = kernel_us(call)
        except Exception as exc:
            rec["kernel_us_error"] = repr(exc)[:300]
        rows[label] = rec
    base = rows["default"].get("cold_graph_ms")
    for label, rec in rows.items():
        if base and rec.get("cold_graph_ms"):
            rec["over_default"] = rec["cold_graph_ms"] / base
            log(f"    {label}: {1e3 * rec['cold_graph_ms']:.1f} us ({rec['over_default']:.3f}x), per launch "
                f"{ {k[:24]: round(v, 1) for k, v in rec.get('kernel_us', {}).items()} }")
    return {"nodes": len(tree), "variants": rows}


def bench_gdn(t: int, rep: int, fla, sweep: bool = True) -> dict:
    from tree_kernels.tree_gdn import triton as tg
    from tree_kernels.tree_gdn import naive

    from ..tree import compile_tree

    dev = torch.device("cuda")
    tree = make_tree(t)
    c = compile_tree(tree, 4096, dev)
    q, k, v, gate, beta, s0 = gdn_inputs(t, dev)
    path = deepest_path(tree)
    path_t = torch.tensor(path, device=dev)
    row: dict = {"nodes": len(tree), "max_depth": tree.max_depth, "path_len": len(path),
                 "default_config": tg.default_config(t, GDN["hv"], GDN["dv"], dev, rooted=True)}
    log(f"  GDN T={t}")
    # correctness vs the fp32 reference on the same inputs; the default as the verify calls it (a
    # draft tree is rooted: budget + 1 nodes fit the dense kernel)
    o, st = tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, rooted=True)
    o_ref, st_ref = naive.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc)
    s_commit = tg.tree_gdn_commit(st, s0, path_t)
    s_ref = naive.tree_gdn_commit(st_ref, s0, path)
    o_paths, _ = naive.tree_gdn_paths(q.double(), k.double(), v.double(), gate.double(), beta.double(), s0.double(), c.parents)
    row["err_o_vs_fp32_ref"] = err(o, o_ref)
    row["err_o_vs_fp64_paths"] = err(o, o_paths)
    row["err_o_torch_ref_vs_fp64_paths"] = err(o_ref, o_paths)
    row["err_commit_vs_fp32_ref"] = err(s_commit, s_ref)
    row["err_u_vs_fp32_ref"] = err(st.u, st_ref.u)
    timed("triton_fork_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, rooted=True), rep, graph=True)
    # the blocked solve (the default before the dense kernel), side by side
    blocked = tg.blocked_config(t, GDN["dv"])
    o_blk, _ = tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=blocked)
    row["err_blocked_o_vs_fp32_ref"] = err(o_blk, o_ref)
    timed("triton_fork_blocked_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=blocked), rep, graph=True)
    if not row["default_config"].get("DENSE") and t - 1 <= tg.DENSE_LARGEST:
        # the dense solve where the default is blocked (it measured slower there): still timed
        dense = {"DENSE": True}
        o_dn, _ = tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=dense, rooted=True)
        row["err_dense_o_vs_fp32_ref"] = err(o_dn, o_ref)
        timed("triton_fork_dense_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=dense, rooted=True), rep, graph=True)
    try:  # per launch (the dense solve's prepare and apply; the blocked prepare and chain)
        row["kernel_us_default"] = kernel_us(lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, rooted=True))
        row["kernel_us_blocked"] = kernel_us(lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=blocked))
        log(f"    per launch: default {row['kernel_us_default']}, blocked {row['kernel_us_blocked']}")
    except Exception as exc:
        row["kernel_us_error"] = repr(exc)[:300]
    if row["default_config"].get("DENSE"):
        variants = [dict(BV=bv, num_warps=nw) for bv, nw in ((16, 4), (32, 4), (64, 4), (16, 8), (32, 8), (64, 8), (128, 8))]
        variants += [dict(prep_warps=pw) for pw in (2, 4, 8, 16)] + [dict(BKC=bkc) for bkc in (16, 64)]
        row["dense_sweep"] = sweep_gdn_configs(
            "dense", [dict(row["default_config"], **var) for var in variants],
            lambda cfg: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=cfg, rooted=True), o_ref, "max_abs_vs_fp32_ref")
    # the single-launch kernel (the default before PRE_INVERSE was measured), for the ratio
    single = {"PRE_INVERSE": False, "BV": 64}
    o_single, _ = tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=single)
    row["err_single_launch_o_vs_fp32_ref"] = err(o_single, o_ref)
    timed("triton_fork_single_launch_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=single), rep, graph=True)
    # the default with the root peel flipped (peeled: blocks from node 1), for trees of 16 k + 1 nodes
    default_peels = tg.blocked_config(t, GDN["dv"]).get("ROOT_PEEL", True)
    flip = "no_peel" if default_peels else "peel"
    flipped = dict(tg.blocked_config(t, GDN["dv"]), ROOT_PEEL=not default_peels)
    o_np, _ = tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=flipped)
    row[f"err_{flip}_o_vs_fp32_ref"] = err(o_np, o_ref)
    timed(f"triton_fork_{flip}_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=flipped), rep, graph=True)
    if t > 17:  # without the prepare launch storing the u-independent off-diagonal blocks
        offd = dict(tg.blocked_config(t, GDN["dv"]), PRE_INVERSE=True, PRE_OFFDIAG=False)
        o_off, _ = tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=offd)
        row["err_no_offdiag_o_vs_fp32_ref"] = err(o_off, o_ref)
        timed("triton_fork_no_offdiag_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=offd), rep, graph=True)
    if t > 17 and not tg.blocked_config(t, GDN["dv"]).get("PRE_OFFDIAG"):
        # the default stores no off-diagonal blocks here (nb^2 of them); time them stored anyway
        ond = dict(tg.blocked_config(t, GDN["dv"]), PRE_INVERSE=True, PRE_OFFDIAG=True)
        o_on, _ = tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=ond)
        row["err_offdiag_o_vs_fp32_ref"] = err(o_on, o_ref)
        timed("triton_fork_offdiag_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=ond), rep, graph=True)
    if t > 17:  # the prepare launch's warps per program (one by default)
        for pw in (2, 4):
            cfg_pw = dict(tg.blocked_config(t, GDN["dv"]), prep_warps=pw)
            timed(f"triton_fork_prep_warps{pw}_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=cfg_pw), rep, graph=True)
    if t > 17:
        # diagonal blocks inverted by recursive doubling in the prepare launch (dots, no row chain),
        # which makes 32-row blocks affordable: half the serial solve steps of BS 16
        base = dict(tg.blocked_config(t, GDN["dv"]), PREP_DOUBLING=True)
        variants = [dict(BS=16, ROOT_PEEL=False), dict(BS=32, ROOT_PEEL=False), dict(BS=32, ROOT_PEEL=True)]
        variants += [dict(BS=32, ROOT_PEEL=peel, **extra) for peel in (False, True)
                     for extra in (dict(BV=64), dict(num_warps=8), dict(prep_warps=4), dict(BV=64, num_warps=8), dict(BV=16))]
        row["doubling_sweep"] = sweep_gdn_configs(
            "doubling", [dict(base, **var) for var in variants],
            lambda cfg: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=cfg), o_ref, "max_abs_vs_fp32_ref")
    timed("triton_commit_ms", row, lambda: tg.tree_gdn_commit(st, s0, path_t), rep, graph=True)
    if sweep and t == 64:
        # around the default (PRE_INVERSE, BS 16, BV 32, 4 warps); the earlier sweeps (BS 32 is 6-11x
        # slower, BV 128 slower) are in the committed kernels-*.json
        sweep_cfgs = [{"BS": 16, "BV": bv, "num_warps": nw, "PRE_INVERSE": True, "prep_warps": pw}
                      for bv, nw, pw in ((32, 4, 1), (16, 4, 1), (16, 2, 1), (32, 2, 1), (32, 8, 1), (64, 8, 1), (16, 8, 1), (32, 4, 2))]
        row["sweep"] = sweep_gdn_configs(
            "sweep", sweep_cfgs, lambda cfg: tg.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc, config=cfg), o, "max_abs_vs_default")
    timed("torch_fork_ms", row, lambda: naive.tree_gdn_fork(q, k, v, gate, beta, s0, c.anc), rep)
    timed("torch_commit_ms", row, lambda: naive.tree_gdn_commit(st_ref, s0, path), rep)
    timed("torch_slots_ms", row, lambda: naive.tree_gdn_slots(q, k, v, gate, beta, s0, c.parents, c.depths), rep)
    src = torch.randn(t, *s0.shape, device=dev)
    dst = torch.empty_like(src)
    timed("slot_copy_ms", row, lambda: dst.copy_(src), rep, graph=True)  # T state copies: the slots floor
    row["slot_copy_bytes"] = 2 * src.numel() * 4
    del src, dst
    if fla is not None:
        chunk, fused = fla
        qb, kb = q.bfloat16()[None], k.bfloat16()[None]
        vb, gb, bb = v[None], gate[None], beta[None]
        h0 = s0[None].contiguous()
        sc = GDN["dk"] ** -0.5
        try:
            oc, _ = chunk(qb, kb, vb, gb, bb, scale=sc, initial_state=h0, output_final_state=True)
            chain = compile_tree(type(tree).from_parents(list(range(t)), list(range(-1, t - 1))), 0, dev)
            o_chain, _ = naive.tree_gdn_fork(q.bfloat16().float(), k.bfloat16().float(), v, gate, beta, s0, chain.anc)
            row["fla_chunk_err_vs_fp32_chain"] = err(oc[0].float(), o_chain)
        except Exception as exc:
            row["fla_chunk_error"] = f"{type(exc).__name__}: {exc}"
        fc = lambda: chunk(qb, kb, vb, gb, bb, scale=sc, initial_state=h0, output_final_state=True)  # noqa: E731
        ff = lambda: fused(qb, kb, vb, gb, bb, scale=sc, initial_state=h0, output_final_state=True)  # noqa: E731
        timed("fla_chunk_ms", row, fc, rep)
        timed("fla_fused_recurrent_ms", row, ff, rep)
        # graph timings last: a capture that fails must not cost the eager numbers above
        for name, fn in (("fla_fused_recurrent", ff), ("fla_chunk", fc)):
            row[name + "_cold_graph_ms"] = cold_graph_ms(fn)
            row[name + "_host_us"] = host_us(fn)
    return row


def bench_attention(t: int, rep: int, prefix: int, sweep: bool = True) -> dict:
    from tree_kernels.tree_attention import triton as ta
    from tree_kernels.tree_attention import naive

    from ..tree import compile_tree

    dev = torch.device("cuda")
    hq, hkv, d = ATTN["hq"], ATTN["hkv"], ATTN["d"]
    tree = make_tree(t)
    c = compile_tree(tree, prefix, dev)
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(t, hq, d, device=dev, generator=g).bfloat16()
    kbuf = torch.randn(prefix + 512, hkv, d, device=dev, generator=g).bfloat16()
    vbuf = torch.randn(prefix + 512, hkv, d, device=dev, generator=g).bfloat16()
    k, v = kbuf[: prefix + t], vbuf[: prefix + t]
    scale = d**-0.5
    row: dict = {"nodes": len(tree), "prefix": prefix, "kv_bytes": 2 * k.numel() * 2}
    log(f"  attention T={t}")
    o = ta.tree_attention(q, k, v, c.anc, prefix, scale, c.positions, None)
    ref = naive.tree_attention(q.float(), k.float(), v.float(), c.anc, prefix, scale, c.positions, None)
    row["err_vs_fp32_ref"] = err(o.float(), ref)
    ob = ta.tree_attention(q, k, v, c.anc, prefix, scale, c.positions, None, bitmask=c.bitmask())
    row["err_bitmask_vs_fp32_ref"] = err(ob.float(), ref)
    ow = ta.tree_attention(q, k, v, c.anc, prefix, scale, c.positions, 1024)
    row["err_window1024_vs_fp32_ref"] = err(ow.float(), naive.tree_attention(q.float(), k.float(), v.float(), c.anc, prefix, scale, c.positions, 1024))
    row["err_torch_bf16_ref_vs_fp32_ref"] = err(naive.tree_attention(q, k, v, c.anc, prefix, scale, c.positions, None).float(), ref)
    n_m, n_s, _ = ta.plan(t, hq, hkv, d, prefix + t, 0, dev, ta.default_config(t, hq, hkv, d, q.dtype))
    row["grid"] = [n_m, hkv, n_s]
    row["default_config"] = ta.default_config(t, hq, hkv, d, q.dtype)
    timed("triton_ms", row, lambda: ta.tree_attention(q, k, v, c.anc, prefix, scale, c.positions, None), rep, graph=True)
    if sweep and t == 64:
        row["sweep"] = []
        for bm, bn, nw, ns, waves, merge in ((64, 64, 8, 2, 2.0, "ticket"), (128, 64, 8, 2, 1.0, "ticket"), (128, 64, 8, 2, 2.0, "ticket"),
                                             (128, 64, 8, 2, 1.0, "launch"), (128, 64, 8, 2, 2.0, "launch"), (128, 64, 8, 2, 4.0, "launch")):
            if True:
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": ns, "waves": waves, "MERGE": merge}
                rec = dict(cfg)
                try:
                    fn = lambda: ta.tree_attention(q, k, v, c.anc, prefix, scale, c.positions, None, config=cfg)  # noqa: E731
                    o2 = fn()
                    if out_of_resources(("attention", d, str(q.dtype), str(dev)), cfg):
                        raise RuntimeError("OutOfResources (the wrapper fell back to a smaller config)")
                    rec["max_abs_vs_fp32_ref"] = (o2.float() - ref).abs().max().item()
                    rec["cold_graph_ms"] = cold_graph_ms(fn, 20)
                except Exception as exc:
                    rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                row["sweep"].append(rec)
                log(f"    sweep {rec}")
    timed("torch_ms", row, lambda: naive.tree_attention(q, k, v, c.anc, prefix, scale, c.positions, None), rep)
    from tree_kernels.tree_attention.naive import tree_visibility

    mask = tree_visibility(c.anc, prefix)[None, None]  # [1, 1, T, S]
    q4 = q.transpose(0, 1)[None]  # [1, Hq, T, D]
    k4, v4 = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    kr, vr = k4.repeat_interleave(hq // hkv, 1), v4.repeat_interleave(hq // hkv, 1)
    try:
        os_ = F.scaled_dot_product_attention(q4, kr, vr, attn_mask=mask, scale=scale)
        row["sdpa_mask_err_vs_fp32_ref"] = err(os_[0].transpose(0, 1).float(), ref)
    except Exception as exc:
        row["sdpa_mask_error"] = f"{type(exc).__name__}: {exc}"
    timed("sdpa_bool_mask_ms", row, lambda: F.scaled_dot_product_attention(q4, kr, vr, attn_mask=mask, scale=scale), rep, graph=True)
    timed("sdpa_bool_mask_gqa_ms", row,
          lambda: F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale, enable_gqa=True), rep, graph=True)
    q1 = q4[:, :, :1]
    kp, vp = k4[:, :, :prefix], v4[:, :, :prefix]
    timed("sdpa_decode_1q_ms", row, lambda: F.scaled_dot_product_attention(q1, kp, vp, scale=scale, enable_gqa=True), rep, graph=True)
    return row


def bench_decode_attention(t: int, rep: int, prefix: int, sweep: bool = True) -> dict:
    """The AR step's attention (t = 1; t = 2 a two-node tree) as the fast path calls it: the device
    prefix length over the whole cache buffer. The default config beside smaller row blocks (a
    block holds t x group (node, head) rows: 6 of them at t = 1) and SDPA's one-query decode."""
    from tree_kernels.static import tree_attention_static
    from tree_kernels.tree_attention import naive
    from tree_kernels.tree_attention import triton as ta

    dev = torch.device("cuda")
    hq, hkv, d = ATTN["hq"], ATTN["hkv"], ATTN["d"]
    cap = prefix + 512  # the fast path's buffer: rows past P + t are never read
    g = torch.Generator(device=dev).manual_seed(3)
    q = torch.randn(t, hq, d, device=dev, generator=g).bfloat16()
    kbuf = torch.randn(cap, hkv, d, device=dev, generator=g).bfloat16()
    vbuf = torch.randn(cap, hkv, d, device=dev, generator=g).bfloat16()
    anc = torch.tril(torch.ones(t, t, dtype=torch.bool, device=dev))  # a chain
    pos = torch.arange(prefix, prefix + t, device=dev)
    prefix_t = torch.tensor(prefix, device=dev)
    scale = d**-0.5
    ref = naive.tree_attention(q.float(), kbuf[: prefix + t].float(), vbuf[: prefix + t].float(), anc, prefix, scale, pos, None)
    row: dict = {"nodes": t, "prefix": prefix, "buffer_rows": cap, "kv_bytes": 2 * (prefix + t) * hkv * d * 2}
    log(f"  decode attention T={t}")
    row["default_config"] = ta.default_config(t, hq, hkv, d, q.dtype)
    row["err_vs_fp32_ref"] = err(tree_attention_static(q, kbuf, vbuf, anc, prefix_t, scale, pos, None).float(), ref)
    timed("triton_ms", row, lambda: tree_attention_static(q, kbuf, vbuf, anc, prefix_t, scale, pos, None), rep, graph=True)
    if sweep:
        row["sweep"] = []
        # MERGE "launch": the split partials merged by their own launch, all splits at once
        for bm, bn, nw, waves, merge in ((128, 64, 8, 1.0, "ticket"), (16, 64, 4, 1.0, "ticket"), (16, 64, 4, 2.0, "ticket"),
                                         (16, 64, 4, 1.0, "launch"), (16, 64, 4, 2.0, "launch"), (16, 64, 4, 4.0, "launch"),
                                         (16, 32, 4, 4.0, "launch"), (16, 32, 4, 8.0, "launch"), (16, 64, 2, 4.0, "launch")):
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": 2, "waves": waves, "MERGE": merge}
            rec = dict(cfg)
            try:
                fn = lambda: ta.tree_attention(q, kbuf, vbuf, anc, prefix_t, scale, pos, None, config=cfg)  # noqa: E731
                rec["max_abs_vs_fp32_ref"] = (fn().float() - ref).abs().max().item()
                if out_of_resources(("attention", d, str(q.dtype), str(dev)), cfg):
                    raise RuntimeError("OutOfResources (the wrapper fell back to a smaller config)")
                rec["cold_graph_ms"] = cold_graph_ms(fn, 20)
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            row["sweep"].append(rec)
            log(f"    sweep {rec}")
    q4 = q.transpose(0, 1)[None]
    kp, vp = kbuf[:prefix].transpose(0, 1)[None], vbuf[:prefix].transpose(0, 1)[None]
    if t == 1:
        timed("sdpa_decode_ms", row, lambda: F.scaled_dot_product_attention(q4, kp, vp, scale=scale, enable_gqa=True), rep, graph=True)
    return row


def bench_decode_gdn(t: int, rep: int) -> dict:
    """The GDN fork + commit for the AR step's single node (t = 1; t = 2 a chain): the default
    config beside narrower value blocks (more programs: a T = 1 program has one node's work)."""
    from tree_kernels.tree_gdn import naive
    from tree_kernels.tree_gdn import triton as tg

    dev = torch.device("cuda")
    q, k, v, gate, beta, s0 = gdn_inputs(t, dev, seed=t)
    anc = torch.tril(torch.ones(t, t, dtype=torch.bool, device=dev))
    path = torch.arange(t, device=dev)
    count = torch.tensor(t, device=dev)
    row: dict = {"nodes": t, "default_config": tg.default_config(t, GDN["hv"], GDN["dv"], dev)}
    log(f"  decode gdn T={t}")
    o_ref, _ = naive.tree_gdn_fork(q, k, v.float(), gate, beta.float(), s0, anc)
    o, stash = tg.tree_gdn_fork(q, k, v, gate, beta, s0, anc)
    row["err_o_vs_fp32_ref"] = err(o, o_ref)
    timed("triton_fork_ms", row, lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, anc), rep, graph=True)
    out = torch.empty_like(s0)
    timed("triton_commit_ms", row, lambda: tg.tree_gdn_commit(stash, s0, path, count=count, out=out), rep, graph=True)
    if t == 1:  # the one-launch decode step that replaces fork + commit on the AR step (the default)
        o_dec, s_dec = tg.gdn_decode_step(q, k, v, gate, beta, s0)
        row["err_decode_o_vs_fp32_ref"] = err(o_dec, o_ref)
        row["err_decode_state_vs_fp32_ref"] = err(s_dec, naive.gdn_decode_step(q, k, v.float(), gate, beta.float(), s0)[1])
        dec_out = torch.empty_like(s0)
        timed("triton_decode_step_ms", row, lambda: tg.gdn_decode_step(q, k, v, gate, beta, s0, out=dec_out), rep, graph=True)
        row["decode_sweep"] = []
        for bv, nw in ((32, 4), (64, 4), (16, 4), (16, 2), (32, 2), (16, 1)):
            rec = {"BV": bv, "num_warps": nw}
            try:
                fn = lambda: tg.gdn_decode_step(q, k, v, gate, beta, s0, out=dec_out, block_v=bv, num_warps=nw)  # noqa: E731
                rec["cold_graph_ms"] = cold_graph_ms(fn, 20)
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            row["decode_sweep"].append(rec)
            log(f"    decode step sweep {rec}")
    row["sweep"] = []
    for bv, nw in ((64, 4), (32, 4), (16, 4), (16, 2), (32, 2), (16, 1)):
        cfg = {"BS": 16, "BV": bv, "num_warps": nw}
        rec = dict(cfg)
        try:
            fn = lambda: tg.tree_gdn_fork(q, k, v, gate, beta, s0, anc, config=cfg)  # noqa: E731
            rec["max_abs_vs_fp32_ref"] = (fn()[0] - o_ref).abs().max().item()
            rec["cold_graph_ms"] = cold_graph_ms(fn, 20)
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        row["sweep"].append(rec)
        log(f"    fork sweep {rec}")
    row["commit_sweep"] = []
    for bk, bv, nw in ((64, 64, 4), (32, 32, 4), (32, 64, 4), (16, 64, 4), (32, 32, 2)):
        rec = {"BK": bk, "BV": bv, "num_warps": nw}
        try:
            fn = lambda: tg.tree_gdn_commit(stash, s0, path, count=count, out=out, block_k=bk, block_v=bv, num_warps=nw)  # noqa: E731
            rec["cold_graph_ms"] = cold_graph_ms(fn, 20)
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        row["commit_sweep"].append(rec)
        log(f"    commit sweep {rec}")
    return row


def bench_tree_build(budget: int, rep: int, depth: int = 15) -> dict:
    """Building the DDTree of ``budget`` nodes from a 16-token block's top-``budget`` per depth:
    the one-program Triton kernel against the torch beam builder (what the fast path ran before)."""
    import tree_kernels as tk
    from tree_kernels.tree_build import naive
    from tree_kernels.tree_build import triton as tb

    from ..tree import build_ddtree_static

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(budget)
    lp = torch.log_softmax(torch.randn(depth, 4096, device=dev, generator=g) * 3, -1)
    top = torch.topk(lp, budget, -1)
    toks, lq = top.indices, top.values.float()
    root = torch.tensor(5, device=dev)
    row: dict = {"budget": budget, "depth": depth}
    log(f"  tree build budget={budget}")
    got = tb.tree_build(toks, lq, budget, root)
    ref = naive.tree_build(toks, lq, budget, 5)
    row["same_as_reference"] = all(bool(torch.equal(a.cpu(), b.cpu())) for a, b in zip(got, ref))
    with tk.use_backend("torch"):
        beam = build_ddtree_static(toks, lq, budget, root)
        timed("torch_beam_ms", row, lambda: build_ddtree_static(toks, lq, budget, root), rep, graph=True)
    row["same_as_torch_beam"] = bool(torch.equal(beam.tokens, got[0]) and torch.equal(beam.parents, got[1]))
    timed("triton_ms", row, lambda: tb.tree_build(toks, lq, budget, root), rep, graph=True)
    return row


def bench_gemm(rep: int, bw_gbs: float) -> dict:
    """The AR step's GEMMs at 27B dims (one token): cuBLAS time per weight against its read floor
    (bytes / measured copy bandwidth), each projection group separate and packed into one GEMM."""
    dev = torch.device("cuda")
    hid, inter = 5120, 17408
    h, hv, dk, dv = GDN["h"], GDN["hv"], GDN["dk"], GDN["dv"]
    qh, kvh, hd = ATTN["hq"], ATTN["hkv"], ATTN["d"]
    groups = {
        "gdn_in": [2 * h * dk + hv * dv, hv * dv, hv, hv],  # qkv, z, b, a
        "gdn_out": [hv * dv],
        "attn_qkv": [2 * qh * hd, kvh * hd, kvh * hd],  # q with its output gate, k, v
        "attn_out": [qh * hd],
        "mlp_gate_up": [inter, inter],
        "mlp_down": [inter],
        "lm_head": [248320],
    }
    x = torch.randn(1, hid, device=dev, dtype=torch.bfloat16)
    row: dict = {}
    for name, outs in groups.items():
        log(f"  gemm {name} {outs}")
        k_in = hid if not name.endswith("_out") and name != "mlp_down" else outs[0]
        n_out = outs if not (name.endswith("_out") or name == "mlp_down") else [hid]
        ws = [torch.randn(n, k_in, device=dev, dtype=torch.bfloat16) * 0.02 for n in n_out]
        xin = x if k_in == hid else torch.randn(1, k_in, device=dev, dtype=torch.bfloat16)
        nbytes = sum(w.numel() * 2 for w in ws)
        rec: dict = {"k": k_in, "n": n_out, "weight_bytes": nbytes, "floor_ms": nbytes / (bw_gbs * 1e9) * 1e3}
        rec["separate_cold_graph_ms"] = cold_graph_ms(lambda: [F.linear(xin, w) for w in ws])
        if len(ws) > 1:
            packed = torch.cat(ws)
            rec["packed_cold_graph_ms"] = cold_graph_ms(lambda: F.linear(xin, packed))
            del packed
        for key in ("separate", "packed"):
            v = rec.get(key + "_cold_graph_ms")
            if isinstance(v, (int, float)):
                rec[key + "_over_floor"] = v / rec["floor_ms"]
        row[name] = rec
        log(f"    {rec}")
        del ws
    per_layer = {"gdn": ("gdn_in", "gdn_out", "mlp_gate_up", "mlp_down"), "attention": ("attn_qkv", "attn_out", "mlp_gate_up", "mlp_down")}
    for variant in ("separate", "packed"):
        total = floor = 0.0
        for kind, n_layers in (("gdn", 48), ("attention", 16)):
            for gname in per_layer[kind]:
                v = row[gname].get(variant + "_cold_graph_ms") or row[gname].get("separate_cold_graph_ms")
                total += n_layers * v
                floor += n_layers * row[gname]["floor_ms"]
        total += row["lm_head"]["separate_cold_graph_ms"]
        floor += row["lm_head"]["floor_ms"]
        row[f"step_{variant}_ms"] = total
        row["step_floor_ms"] = floor
        row[f"step_{variant}_over_floor"] = total / floor
    return row


def bench_conv(t: int, rep: int) -> dict:
    from tree_kernels.tree_conv import triton as tc
    from tree_kernels.tree_conv import naive

    from ..tree import compile_tree

    dev = torch.device("cuda")
    ch, w = CONV["c"], CONV["w"]
    tree = make_tree(t)
    c = compile_tree(tree, 4096, dev)
    g = torch.Generator(device=dev).manual_seed(2)
    x = torch.randn(t, ch, device=dev, generator=g).bfloat16()
    state = torch.randn(ch, w - 1, device=dev, generator=g).bfloat16()
    w3 = (torch.randn(ch, 1, w, device=dev, generator=g) * 0.5).bfloat16()
    weight = w3[:, 0, :]
    idx = c.conv_table(w)
    path = deepest_path(tree)
    path_t = torch.tensor(path, device=dev)
    row: dict = {"nodes": len(tree)}
    log(f"  conv T={t}")
    y = tc.tree_conv1d(x, state, weight, None, idx)
    ref = naive.tree_conv1d(x.float(), state.float(), weight.float(), None, idx)
    row["err_vs_fp32_ref"] = err(y.float(), ref)
    row["err_torch_bf16_ref_vs_fp32_ref"] = err(naive.tree_conv1d(x, state, weight, None, idx).float(), ref)
    row["commit_exact"] = bool(torch.equal(tc.tree_conv_commit(x, state, path_t), naive.tree_conv_commit(x, state, path)))
    timed("triton_ms", row, lambda: tc.tree_conv1d(x, state, weight, None, idx), rep, graph=True)
    timed("triton_commit_ms", row, lambda: tc.tree_conv_commit(x, state, path_t), rep, graph=True)
    timed("torch_ms", row, lambda: naive.tree_conv1d(x, state, weight, None, idx), rep)
    timed("torch_commit_ms", row, lambda: naive.tree_conv_commit(x, state, path), rep)
    return row


def bench_norms(t: int, rep: int, device: str = "cuda") -> dict:
    """The fused row-wise kernels at 27B dims for ``t`` rows (1 = the AR step, 65 = a 64-node verify):
    bf16 output vs the fp32 reference on the same inputs, and fused vs the torch reference per call."""
    from tree_kernels.norms import naive
    from tree_kernels.norms import triton as fused

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(t)
    bf = torch.bfloat16
    hid, inter = 5120, 17408
    h, hv, dk, dv = GDN["h"], GDN["hv"], GDN["dk"], GDN["dv"]
    qh, hd, rot = ATTN["hq"], ATTN["d"], ATTN["d"] // 4  # partial rotary factor 0.25

    def rnd(*shape, dtype=bf):
        return torch.randn(*shape, device=dev, generator=g).to(dtype)

    x, w = rnd(t, hid), rnd(hid) * 0.1
    o, z, wg = rnd(t, hv, dv), rnd(t, hv, dv), 1 + 0.1 * rnd(dv)
    mixed = rnd(t, 2 * h * dk)
    q, k = mixed[:, : h * dk].view(t, h, dk), mixed[:, h * dk:].view(t, h, dk)
    b, a, A_log, dt_bias = rnd(t, hv), rnd(t, hv), torch.rand(hv, device=dev, generator=g) * 2.7, torch.ones(hv, device=dev)
    xr = rnd(t, qh, hd)
    ang = torch.rand(t, rot // 2, device=dev, generator=g) * 6.28
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(bf), torch.cat([ang.sin()] * 2, -1).to(bf)
    gu = rnd(t, 2 * inter)
    gate, up = gu[:, :inter], gu[:, inter:]

    def f32(fn, *xs):
        return fn(*[y.float() if torch.is_tensor(y) and y.is_floating_point() else y for y in xs])

    cases = {
        "rms_norm": (lambda m: m.rms_norm(x, w, 1e-6, True), lambda: f32(naive.rms_norm, x, w, 1e-6, True)),
        "gated_rms_norm": (lambda m: m.gated_rms_norm(o, z, wg, 1e-6), lambda: f32(naive.gated_rms_norm, o, z, wg, 1e-6)),
        "gdn_gates": (lambda m: m.gdn_gates(q, k, b, a, A_log, dt_bias), lambda: f32(naive.gdn_gates, q, k, b, a, A_log, dt_bias)),
        "rotary": (lambda m: m.rotary(xr, cos, sin), lambda: f32(naive.rotary, xr, cos, sin)),
        "silu_mul": (lambda m: m.silu_mul(gate, up), lambda: f32(naive.silu_mul, gate, up)),
    }
    row: dict = {"rows": t}
    log(f"  norms T={t}")
    for name, (call, ref32) in cases.items():
        rec: dict = {}
        try:
            got, ref = call(fused), ref32()
            got = got if isinstance(got, tuple) else (got,)
            ref = ref if isinstance(ref, tuple) else (ref,)
            rec["err_vs_fp32_ref"] = [err(a_, b_) for a_, b_ in zip(got, ref)]
            plain = call(naive)
            plain = plain if isinstance(plain, tuple) else (plain,)
            rec["err_torch_ref_vs_fp32_ref"] = [err(a_, b_) for a_, b_ in zip(plain, ref)]
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        timed("fused_ms", rec, lambda: call(fused), rep, graph=True)
        timed("torch_ms", rec, lambda: call(naive), rep, graph=True)
        row[name] = rec
        log(f"    {name}: fused {rec.get('fused_cold_graph_ms')} ms vs torch {rec.get('torch_cold_graph_ms')} ms (cold graph)")
    return row


# ----------------------------------------------------------------------------------- losslessness


@torch.no_grad()
def lossless(n_prompts: int, new_tokens: int, budget: int, device: str = "cuda", dims: dict | None = None) -> dict:
    import tree_kernels as tk

    from ..drafters.oracle import OracleDrafter, OracleSpec
    from ..engine import GenerationConfig, generate
    from ..random_models import random_target
    from .ties import first_divergence

    dev = torch.device(device)
    dims = dims or dict(vocab_size=4096, hidden_size=1024, num_layers=8, heads=8, kv_heads=2, head_dim=128,
                intermediate_size=2048, linear_key_heads=4, linear_value_heads=12, linear_key_dim=128,
                linear_value_dim=128, conv_width=4, eos_token_id=None)
    target = random_target("hybrid", seed=7, **dims).to(dev, torch.bfloat16)
    target.reset_rotary()
    spec = OracleSpec(p=0.5, rank=1, block=16, seed=3)
    g = torch.Generator().manual_seed(42)
    out = {"dims": dims, "dtype": "bfloat16", "budget": budget, "new_tokens": new_tokens, "oracle": vars(spec), "prompts": []}
    for i in range(n_prompts):
        prompt = torch.randint(0, dims["vocab_size"], (int(torch.randint(4, 40, (1,), generator=g)),), generator=g).tolist()
        rec: dict = {"prompt_len": len(prompt)}
        with tk.use_backend("torch"):
            ar_torch = generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=new_tokens + 16, trace_topk=0)).generated_ids
        with tk.use_backend("triton"):
            ar_triton = generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=new_tokens + 16, trace_topk=0)).generated_ids
            ref = prompt + ar_triton
            cfg = GenerationConfig(method="ddtree", budget=budget, recurrent="fork", max_new_tokens=new_tokens, trace_topk=0)
            t0 = time.perf_counter()
            trace = generate(target, prompt, cfg, OracleDrafter(ref, dims["vocab_size"], spec, dev))
            rec["ddtree_s"] = time.perf_counter() - t0
            with tk.use_fused_norms(False):  # the Triton tree kernels with the torch norm chains
                refnorm_ids = generate(target, prompt, cfg, OracleDrafter(ref, dims["vocab_size"], spec, dev)).generated_ids
        tree_ids = trace.generated_ids
        rec["mean_acceptance"] = trace.mean_acceptance
        rec["through_sibling_rounds"] = sum(r.through_sibling for r in trace.rounds)
        rec["rounds"] = len(trace.rounds)
        for name, other in (("ddtree_triton_vs_ar_triton", ar_triton[:new_tokens]), ("ddtree_triton_vs_ar_torch", ar_torch[:new_tokens]),
                            ("ar_triton_vs_ar_torch", ar_torch[:new_tokens]), ("ddtree_reference_norms_vs_ar_torch", ar_torch[:new_tokens])):
            a = refnorm_ids if "reference_norms" in name else tree_ids if name.startswith("ddtree") else ar_triton[:new_tokens]
            with tk.use_backend("torch"):  # the logits at a divergence from the torch references
                entry = first_divergence(target, prompt, a, other)
            rec[name] = entry
        out["prompts"].append(rec)
        log(f"    prompt {i}: " + ", ".join(f"{k}={'same' if rec[k]['identical'] else 'diverged@' + str(rec[k]['position'])}"
                                           for k in LOSSLESS_KEYS)
            + f", acceptance {rec['mean_acceptance']:.2f}, sibling rounds {rec['through_sibling_rounds']}/{rec['rounds']}")
    for key in LOSSLESS_KEYS:
        recs = [p[key] for p in out["prompts"]]
        out[key] = {"identical": sum(r["identical"] for r in recs), "of": len(recs),
                    "diverged_all_near_ties": all(r.get("near_tie", True) for r in recs)}
    return out


# ----------------------------------------------------------------------------------- report


def floors(bw_gbs: float, prefix: int) -> dict:
    """FLOPs and minimum bytes per layer for a 64-node tree; floor = bytes / measured bandwidth."""
    t = 64
    h, hv, dk, dv = GDN["h"], GDN["hv"], GDN["dk"], GDN["dv"]
    gdn_bytes = hv * dk * dv * 4 + t * (2 * h * dk * 4 + hv * dv * 2 + hv * 4 + hv * 2) + t * hv * (dv * 4 + dv * 4 + dk * 4 + 4)
    gdn_flops = 2 * hv * (2 * t * dk * dv + 2 * t * t * dk + 2 * t * t * dv) + hv * t**3 / 3
    hq, hkv, d = ATTN["hq"], ATTN["hkv"], ATTN["d"]
    s = prefix + t
    attn_bytes = 2 * s * hkv * d * 2 + 2 * t * hq * d * 2
    attn_flops = 4 * t * hq * s * d
    ch, w = CONV["c"], CONV["w"]
    conv_bytes = 2 * t * ch * 2 + ch * (w + w - 1) * 2
    conv_flops = 2 * t * ch * w
    f = lambda b: b / (bw_gbs * 1e9) * 1e3  # noqa: E731
    return {
        "gdn": {"flops": gdn_flops, "bytes": gdn_bytes, "floor_ms": f(gdn_bytes)},
        "attention": {"flops": attn_flops, "bytes": attn_bytes, "floor_ms": f(attn_bytes)},
        "conv": {"flops": conv_flops, "bytes": conv_bytes, "floor_ms": f(conv_bytes)},
    }


ROWS = {
    "gdn": [("triton fork", "triton_fork_ms"), ("triton fork, single launch", "triton_fork_single_launch_ms"), ("triton fork, off-diagonal blocks in the chain", "triton_fork_no_offdiag_ms"), ("triton fork, off-diagonal blocks stored", "triton_fork_offdiag_ms"), ("triton fork, unpeeled", "triton_fork_no_peel_ms"), ("triton fork, root peeled", "triton_fork_peel_ms"), ("triton commit", "triton_commit_ms"), ("torch fork (reference)", "torch_fork_ms"),
            ("torch commit (reference)", "torch_commit_ms"), ("torch slots (baseline)", "torch_slots_ms"),
            ("slot copy: T states r+w", "slot_copy_ms"), ("fla chunk (chain of T)", "fla_chunk_ms"),
            ("fla fused_recurrent (chain)", "fla_fused_recurrent_ms")],
    "attention": [("triton", "triton_ms"), ("torch (reference)", "torch_ms"), ("sdpa bool mask (kv repeated)", "sdpa_bool_mask_ms"),
                  ("sdpa bool mask (enable_gqa)", "sdpa_bool_mask_gqa_ms"), ("sdpa decode, 1 query", "sdpa_decode_1q_ms")],
    "conv": [("triton", "triton_ms"), ("triton commit", "triton_commit_ms"), ("torch (reference)", "torch_ms"),
             ("torch commit (reference)", "torch_commit_ms")],
    "decode": [("triton (fast-path call)", "triton_ms"), ("sdpa decode, 1 query", "sdpa_decode_ms")],
    "decode_gdn": [("triton fork", "triton_fork_ms"), ("triton commit", "triton_commit_ms"),
                   ("triton decode step", "triton_decode_step_ms")],
    "tree_build": [("triton (one program)", "triton_ms"), ("torch beam builder", "torch_beam_ms")],
}
ERRS = {"decode_gdn": "err_o_vs_fp32_ref", "gdn": "err_o_vs_fp32_ref", "attention": "err_vs_fp32_ref", "conv": "err_vs_fp32_ref", "decode": "err_vs_fp32_ref",
        "tree_build": "-"}


def table(result: dict) -> str:
    fmt = lambda x, f="{:.4f}": f.format(x) if isinstance(x, (int, float)) else "-"  # noqa: E731
    lines = [f"{'kernel':<38}{'T':>5}{'eager ms':>10}{'cold graph':>12}{'warm graph':>12}{'host us':>9}  notes"]
    for sec, rows in ROWS.items():
        for t, row in result.get(sec, {}).items():
            if "error" in row:
                lines.append(f"{sec + ' (failed)':<38}{t:>5}  {row['error'][:80]}")
                continue
            for label, key in rows:
                b = key.replace("_ms", "")
                note = ""
                if key.startswith("triton") and "commit" not in key:
                    e = row.get("err_single_launch_o_vs_fp32_ref" if "single_launch" in key
                            else "err_decode_o_vs_fp32_ref" if "decode_step" in key else ERRS[sec], {})
                    note = f"max err {fmt(e.get('max_abs'), '{:.2e}')} (rel {fmt(e.get('max_rel'), '{:.1e}')}) vs fp32 ref"
                if row.get(key + "_error"):
                    note = row[key + "_error"][:60]
                lines.append(f"{sec + ' ' + label:<38}{t:>5}{fmt(row.get(key)):>10}{fmt(row.get(b + '_cold_graph_ms')):>12}"
                             f"{fmt(row.get(b + '_warm_graph_ms')):>12}{fmt(row.get(b + '_host_us'), '{:.0f}'):>9}  {note}")
    lines.append("ratios at T=64 (cold graph where measured, else eager):")
    for k, v in result.get("ratios", {}).items():
        lines.append(f"  {k}: {v}")
    return "\n".join(lines)


def ratios(result: dict) -> dict:
    out = {}
    g, a, c = result.get("gdn", {}).get("64", {}), result.get("attention", {}).get("64", {}), result.get("conv", {}).get("64", {})

    def r(x, y):
        return round(x / y, 3) if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else None

    tg_, ta_, tc_ = best_ms(g, "triton_fork_ms"), best_ms(a, "triton_ms"), best_ms(c, "triton_ms")
    out["gdn_fork_ms_over_target_0.05"] = r(tg_, TARGETS_MS["gdn"])
    out["gdn_single_launch_over_default"] = r(best_ms(g, "triton_fork_single_launch_ms"), tg_)
    for size in ("17", "33", "65", "129"):  # 16 k + 1 nodes: where the peeled root saves a block
        gs = result.get("gdn", {}).get(size, {})
        out[f"gdn_no_peel_over_default_{size}"] = r(best_ms(gs, "triton_fork_no_peel_ms"), best_ms(gs, "triton_fork_ms"))
        out[f"gdn_no_offdiag_over_default_{size}"] = r(best_ms(gs, "triton_fork_no_offdiag_ms"), best_ms(gs, "triton_fork_ms"))
    for size in ("33", "65", "129", "257"):  # where the default does not peel: peeled over it
        gs = result.get("gdn", {}).get(size, {})
        out[f"gdn_peel_over_default_{size}"] = r(best_ms(gs, "triton_fork_peel_ms"), best_ms(gs, "triton_fork_ms"))
    for size in ("257",):  # above 144 nodes the default leaves the off-diagonal blocks in the chain
        gs = result.get("gdn", {}).get(size, {})
        out[f"gdn_offdiag_over_default_{size}"] = r(best_ms(gs, "triton_fork_offdiag_ms"), best_ms(gs, "triton_fork_ms"))
    for size, gs in result.get("gdn", {}).items():  # the best doubling-prepare config against the default
        timed_ok = [rec["cold_graph_ms"] for rec in gs.get("doubling_sweep", []) if isinstance(rec.get("cold_graph_ms"), (int, float))]
        if timed_ok:
            out[f"gdn_doubling_best_over_default_{size}"] = r(min(timed_ok), best_ms(gs, "triton_fork_ms"))
    out["gdn_fla_chunk_over_triton"] = r(best_ms(g, "fla_chunk_ms"), tg_)
    out["gdn_fla_fused_recurrent_over_triton"] = r(best_ms(g, "fla_fused_recurrent_ms"), tg_)
    out["gdn_slot_copy_over_triton"] = r(best_ms(g, "slot_copy_ms"), tg_)
    out["gdn_torch_slots_over_triton"] = r(best_ms(g, "torch_slots_ms"), tg_)
    out["gdn_torch_ref_over_triton"] = r(best_ms(g, "torch_fork_ms"), tg_)
    out["attention_ms_over_target_0.08"] = r(ta_, TARGETS_MS["attention"])
    out["attention_sdpa_mask_over_triton"] = r(best_ms(a, "sdpa_bool_mask_ms"), ta_)
    out["attention_sdpa_decode_over_triton"] = r(best_ms(a, "sdpa_decode_1q_ms"), ta_)
    out["conv_ms_over_target_0.02"] = r(tc_, TARGETS_MS["conv"])
    out["conv_torch_over_triton"] = r(best_ms(c, "torch_ms"), tc_)
    dec = result.get("decode", {}).get("1", {})
    out["decode_attention_sdpa_over_triton"] = r(best_ms(dec, "sdpa_decode_ms"), best_ms(dec, "triton_ms"))
    dg = result.get("decode_gdn", {}).get("1", {})
    fork_commit = [best_ms(dg, "triton_fork_ms"), best_ms(dg, "triton_commit_ms")]
    if all(isinstance(x, (int, float)) for x in fork_commit):
        out["decode_gdn_fork_plus_commit_over_decode_step"] = r(sum(fork_commit), best_ms(dg, "triton_decode_step_ms"))
    for b, row in result.get("tree_build", {}).items():
        out[f"tree_build_{b}_torch_beam_over_triton"] = r(best_ms(row, "torch_beam_ms"), best_ms(row, "triton_ms"))
    gemm = result.get("gemm", {})
    out["gemm_step_separate_over_floor"] = r(gemm.get("step_separate_ms"), gemm.get("step_floor_ms"))
    out["gemm_step_packed_over_floor"] = r(gemm.get("step_packed_ms"), gemm.get("step_floor_ms"))
    return out


def merge(paths: list[str], out: Path | None) -> dict:
    """Combine the JSON of several runs (e.g. one process per section) into one result."""
    import json

    result: dict = {}
    for p in paths:
        part = json.loads(Path(p).read_text())
        for k, v in part.items():
            if k in ("gdn", "attention", "conv", "norms", "decode", "decode_gdn", "tree_build"):
                if v:
                    result.setdefault(k, {}).update(v)
            elif k in ("lossless", "gemm"):
                result[k] = v
            elif k != "ratios":
                result.setdefault(k, v)
    result["ratios"] = ratios(result)
    result["merged_from"] = [Path(p).name for p in paths]
    if out is None:
        day = str(result.get("date", dt.date.today().isoformat()))[:10]
        out = RESULTS / f"kernels-{''.join(ch if ch.isalnum() else '-' for ch in result.get('device', 'gpu').lower())}-{day}.json"
    write_json_atomic(out, result, indent=2)
    log(table(result))
    log(f"wrote {out}")
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="16,64,128")
    p.add_argument("--prefix", type=int, default=4096)
    p.add_argument("--rep-ms", type=int, default=60)
    p.add_argument("--no-sweep", action="store_true", help="skip the small block-configuration sweeps at T = 64")
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--lossless-prompts", type=int, default=6)
    p.add_argument("--lossless-tokens", type=int, default=64)
    p.add_argument("--lossless-budget", type=int, default=32)
    p.add_argument("--only", default="gdn,conv,attention,decode,decode_gdn,norms,tree_build,gemm,lossless")
    p.add_argument("--merge", nargs="+", default=None, help="combine result files instead of measuring")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out) if args.out else None)
    if not torch.cuda.is_available():
        raise SystemExit("workbench.bench.kernels needs a CUDA device")
    import triton

    torch.manual_seed(0)
    sizes = [int(s) for s in args.sizes.split(",")]
    only = args.only.split(",")
    out = Path(args.out) if args.out else RESULTS / f"kernels-{device_slug()}-{dt.date.today().isoformat()}.json"
    props = torch.cuda.get_device_properties(0)
    result: dict = {
        "device": device_name(), "sm_count": props.multi_processor_count, "torch": torch.__version__,
        "triton": triton.__version__, "date": dt.datetime.now().isoformat(timespec="seconds"),
        "shapes": {"gdn": GDN, "attention": ATTN, "conv": CONV, "prefix": args.prefix, "sizes": sizes, "dtype": "bfloat16"},
        "targets_ms_64": TARGETS_MS, "issue_baselines_ms": ISSUE_BASELINES_MS,
        "timing": ("X_ms: triton.testing.do_bench median, L2 flushed before each call, eager (host launch time shows "
                   "when the host is the bottleneck); X_cold_graph_ms: median of CUDA-graph replays with L2 flushed "
                   "before each (GPU time, inputs from HBM); X_warm_graph_ms: do_bench_cudagraph median (L2 warm); "
                   "X_host_us: host time to enqueue one call"),
    }

    def save():
        write_json_atomic(out, result, indent=2)

    bw = copy_bandwidth_gbs()
    result["copy_bandwidth_gbs"] = bw
    result["floors_64"] = floors(bw, args.prefix)
    log(f"{result['device']}: torch {torch.__version__}, triton {triton.__version__}, copy bandwidth {bw:.0f} GB/s")
    fla = None
    if "gdn" in only and not args.no_fla:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

            import fla as fla_mod

            fla = (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule)
            result["fla_version"] = getattr(fla_mod, "__version__", "?")
        except Exception as exc:
            result["fla_version"] = None
            log(f"fla not available ({type(exc).__name__}: {exc}): skipping the fla baselines")
    sweep = not args.no_sweep
    sections = {"gdn": lambda t: bench_gdn(t, args.rep_ms, fla, sweep), "conv": lambda t: bench_conv(t, args.rep_ms),
                "norms": lambda t: bench_norms(t, args.rep_ms),
                "attention": lambda t: bench_attention(t, args.rep_ms, args.prefix, sweep),
                "decode": lambda t: bench_decode_attention(t, args.rep_ms, args.prefix, sweep),
                "decode_gdn": lambda t: bench_decode_gdn(t, args.rep_ms),
                "tree_build": lambda b: bench_tree_build(b, args.rep_ms), "gdn_offdiag": bench_gdn_offdiag}
    for name in only:
        if name == "lossless":
            if args.lossless_prompts <= 0:
                continue
            try:
                result["lossless"] = lossless(args.lossless_prompts, args.lossless_tokens, args.lossless_budget)
            except Exception as exc:
                result["lossless"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
                log(traceback.format_exc())
            save()
            for key in LOSSLESS_KEYS:
                if key in result["lossless"]:
                    log(f"lossless {key}: {result['lossless'][key]}")
            continue
        if name == "gemm":
            try:
                result["gemm"] = bench_gemm(args.rep_ms, bw)
            except Exception as exc:
                result["gemm"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
                log(traceback.format_exc())
            save()
            continue
        result[name] = {}
        for t in {"norms": NORM_ROWS, "decode": DECODE_ROWS, "decode_gdn": DECODE_ROWS, "tree_build": BUILD_BUDGETS}.get(name, sizes):
            try:
                result[name][str(t)] = sections[name](t)
            except Exception as exc:
                result[name][str(t)] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
                log(traceback.format_exc())
            save()
    result["ratios"] = ratios(result)
    save()
    log(table(result))
    log(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
