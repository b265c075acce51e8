"""End-to-end speed: ``python -m workbench.bench.e2e`` (meant for the GPU machine).

Part 1, bundled pairs (zoo), HumanEval prompts, T=0 and T=1: tokens/s and mean acceptance for
AR (ours), HF transformers ``generate`` (what users run today), DFlash chain, and DDTree at
each budget with ``fork`` and ``unsafe``, all through the fast path (CUDA graphs); host
overhead per round; the eager phase breakdown (draft / tree / verify / walk / commit) from
the reference engine with device syncs; greedy losslessness of the fast path against AR.

Part 2, Qwen3.6-27B dimensions with random bf16 weights built on the device: the AR step,
the verify pass for 16..256 tree nodes (fork and unsafe), the draft pass of a 5-layer DFlash
drafter; against the weight-read floor (weight bytes / measured copy bandwidth); then the
tokens/s each budget would give with the acceptance lengths measured in part 1, labelled a
projection.

Everything runs side by side in one process and is written atomically to
``data/results/e2e-<device>-<date>.json`` (or --out), with a table printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import hashlib
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from ..engine import GenerationConfig, generate
from ..trace import write_json_atomic

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            out[name] = None
    return out


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({platform.machine()})"


def round_fusions() -> dict:
    """The verify round's launch fusions this run's defaults used (each switchable by its environment variable)."""
    import tree_kernels as tk
    from tree_kernels import static as st

    from ..models import qwen3_5

    return {"stacked_commit": qwen3_5.stacked_commit_enabled(), "kv_commit_launch": st.kv_commit_launch_enabled(),
            "fused_conv_gates": tk.fused_conv_gates_enabled(), "l2_prefetch": tk.l2_prefetch_enabled(),
            "l2_prefetch_bytes": tk.L2_PREFETCH_BYTES, "pdl": tk.pdl_enabled()}


@contextlib.contextmanager
def l2_prefetch_setting(on: bool, nbytes: int, evict_last: bool):
    """The L2 warm-up of the output projections (tree_kernels.l2_prefetch_start) switched and sized for a block."""
    import tree_kernels as tk
    from tree_kernels.l2_prefetch import triton as lp

    old = (tk.L2_PREFETCH_BYTES, lp.DEFAULT_CONFIG["EVICT_LAST"])
    tk.L2_PREFETCH_BYTES, lp.DEFAULT_CONFIG["EVICT_LAST"] = int(nbytes), bool(evict_last)
    try:
        with tk.use_l2_prefetch(on):
            yield
    finally:
        tk.L2_PREFETCH_BYTES, lp.DEFAULT_CONFIG["EVICT_LAST"] = old


def gdn_variants() -> tuple:
    """(label, make_context) for ``interleaved``: the blocked GDN solve (stored off-diagonal blocks)
    at its defaults, then with each setting of bench.kernels.OFFDIAG_VARIANTS, and the defaults
    again last (drift over the run)."""
    from tree_kernels.tree_gdn import triton as tg

    from .kernels import OFFDIAG_VARIANTS

    variants = [(label, lambda s=settings: tg.blocked_variant(**s)) for label, settings in OFFDIAG_VARIANTS if settings]
    return (("default", contextlib.nullcontext), *variants, ("default_again", contextlib.nullcontext))


def prefetch_variants() -> tuple:
    """(label, make_context) for ``interleaved``: the warm-up off first (the "default" label is the
    baseline every ratio is over), then on at 16 / 32 / 48 MB of each weight, and 32 MB with plain
    (evict-normal) loads."""
    mb = 1 << 20
    return (("default", lambda: l2_prefetch_setting(False, 0, True)),
            ("l2_16mb", lambda: l2_prefetch_setting(True, 16 * mb, True)),
            ("l2_32mb", lambda: l2_prefetch_setting(True, 32 * mb, True)),
            ("l2_48mb", lambda: l2_prefetch_setting(True, 48 * mb, True)),
            ("l2_32mb_evict_normal", lambda: l2_prefetch_setting(True, 32 * mb, False)))


# label -> (PDL on, the kernel groups launched without it: tree_kernels.PDL_GROUPS); each setting
# twice, interleaved, so drift shows as off vs off_again
PDL_SETTINGS = {"off": (False, "tma"), "on": (True, "tma"), "on_gemm_only": (True, "tma,rest"), "on_all": (True, "")}
PDL_ORDER = (*PDL_SETTINGS, *(f"{label}_again" for label in PDL_SETTINGS))


def pdl_variants(budgets, engine_for, time_step, floor_ms: float) -> dict:
    """The AR step and the verify of 17 and 65 tokens (fork; those of ``budgets`` + 1 among them) with
    the Triton kernels launched with PDL (tree_kernels._pdl) and without, in PDL_ORDER: "on" with the
    default exemption (the TMA few-rows GEMM launched without PDL, at its full pipeline depth),
    "on_gemm_only" only the GEMV and the pointer-load few-rows GEMMs (the rest without), "on_all" every
    kernel. Each "on*" over the "off" of its round, and the verify over the AR step of its own
    setting. Errors are reported in the result: the default numbers stand."""
    import tree_kernels as tk

    got: dict = {"order": list(PDL_ORDER), "default_on": tk.pdl_enabled(), "default_exempt": sorted(tk.pdl_exempt()),
                 "settings": {k: {"pdl": on, "exempt": exempt} for k, (on, exempt) in PDL_SETTINGS.items()}}
    verify_budgets = [b for b in (16, 64) if b in budgets]
    try:
        for label in PDL_ORDER:
            on, exempt = PDL_SETTINGS[label.removesuffix("_again")]
            with tk.use_pdl(on), tk.use_pdl_exempt(exempt):
                row: dict = {}
                for method, budget in (("ar", 1), *(("ddtree", b) for b in verify_budgets)):
                    eng = engine_for(method, budget)
                    key = "ar_step_ms" if method == "ar" else f"verify_{budget + 1}_fork_ms"
                    row[key] = time_step(eng, "round", eng._round_step)
                    del eng
                    torch.cuda.empty_cache()
                row["ar_step_over_floor"] = row["ar_step_ms"] / floor_ms
                for b in verify_budgets:
                    row[f"verify_{b + 1}_over_ar"] = row[f"verify_{b + 1}_fork_ms"] / row["ar_step_ms"]
                got[label] = row
                log(f"27B dims, PDL {label}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
        for suffix in ("", "_again"):
            off = "off" + suffix
            for label in PDL_SETTINGS:
                if label == "off":
                    continue
                on = label + suffix
                got[f"{on}_over_{off}"] = {k: got[on][k] / got[off][k] for k in got[on] if k.endswith("_ms")}
                log(f"27B dims, PDL {on} / {off}: " + ", ".join(f"{k} {v:.3f}x" for k, v in got[f"{on}_over_{off}"].items()))
    except Exception as exc:
        got["error"] = repr(exc)[:2000]
        log(f"27B dims, PDL variants failed: {exc!r}"[:500])
    return got


def few_rows_default() -> dict:
    """Whether this run's verify GEMMs went through tuned few-rows routes by default (the committed table)."""
    try:
        from tree_kernels.gemv import triton as tgm
    except ImportError:  # no Triton: cuBLAS throughout
        return {"max_rows": 0, "tuned_routes_on_this_device": 0}
    here = device_name()
    return {"max_rows": tgm.FEW_ROWS_MAX, "tuned_routes_on_this_device": sum(
        1 for key, route in tgm.FEW_ROWS_TUNED.items() if key[0] == here and route != tgm.CUBLAS_ROUTE)}


def cuda_median_ms(fn, repeats: int = 50, warmup: int = 5) -> float:
    """Median over repeats of one call, timed with CUDA events (synchronised host clock on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    if torch.cuda.is_available():
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    else:
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    if not torch.cuda.is_available():
        return float("nan")
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = cuda_median_ms(lambda: dst.copy_(src), repeats=20, warmup=3)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


# ----------------------------------------------------------------------------------------------
# part 1: the bundled pairs


def _hf_generate_tokens_per_second(directory, prompts_ids, max_new, temperature, device, dtype) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()
    tokens = seconds = 0.0
    for i, ids in enumerate(prompts_ids):
        x = torch.tensor([ids], device=device)
        kwargs = dict(max_new_tokens=max_new, min_new_tokens=max_new, do_sample=temperature > 0, pad_token_id=0)
        if temperature > 0:
            kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        if i == 0:
            model.generate(x, **kwargs)  # warm-up
        torch.cuda.synchronize() if device.type == "cuda" else None
        t = time.perf_counter()
        out = model.generate(x, **kwargs)
        torch.cuda.synchronize() if device.type == "cuda" else None
        seconds += time.perf_counter() - t
        tokens += out.shape[1] - len(ids)
    del model
    return {"tokens_per_second": tokens / seconds, "tokens": tokens, "seconds": seconds}


def norm_variants(device) -> tuple[str, str]:
    """(the variant this process runs on ``device``, the other one): the fused row-wise kernels on or off."""
    from ..budget import norms_variant

    main = norms_variant(torch.empty(0, device=device))
    return main, ("reference_norms" if main == "fused_norms" else "fused_norms")


SERIAL = "/serial_host"  # variant suffix: FastEngine(overlap_host=False), the ablation of queueing ahead
# --twins: variant suffix -> the setting its rows run under (each a switch the other way from its default)
TWINS = {
    "pdl": lambda: __import__("tree_kernels").use_pdl(True),  # the Triton kernels with programmatic dependent launch
    "pdl_all": lambda: _pdl_exempting(""),  # with PDL for every kernel, the TMA few-rows GEMM included
    "pdl_gemm": lambda: _pdl_exempting("tma,rest"),  # with PDL for the GEMV and few-rows GEMMs only
    "torch_round": lambda: __import__("tree_kernels").use_round_kernels(False),  # the mask, conv table and walk as torch ops
    "small_gemm": lambda: __import__("tree_kernels").use_small_gemm(True),  # small weights' GEMMs through Triton
}


@contextlib.contextmanager
def _pdl_exempting(groups: str):
    import tree_kernels as tk

    with tk.use_pdl(True), tk.use_pdl_exempt(groups):
        yield


def unknown_twins(names: str | None) -> list[str]:
    """The parts of a --twins list (comma-separated; a twin may join settings with '+') not in TWINS."""
    return [part for twin in (names or "").split(",") if twin for part in twin.split("+") if part not in TWINS]


def twin_setting(variant: str):
    """The context a pairs row of ``variant`` runs in: its twin's settings (…/pdl, …/pdl+small_gemm), else none."""
    stack = contextlib.ExitStack()
    name = variant.rsplit("/", 1)[-1] if "/" in variant else ""
    parts = name.split("+") if name else []
    if all(part in TWINS for part in parts):
        for part in parts:
            stack.enter_context(TWINS[part]())
    return stack


def bench_pair(name, drafter_name, prompts, args, device) -> dict:
    import tree_kernels as tk

    from ..fastpath import FastEngine
    from ..runner import load_dflash_drafter, load_target_and_tokenizer

    target, tokenizer = load_target_and_tokenizer(name, str(device), args.dtype)
    drafter = load_dflash_drafter(drafter_name, target)
    files = {}
    for directory in (Path(target.source_directory), Path(drafter.model.source_directory)):
        for f in sorted(directory.glob("*.safetensors")):
            files[f"{directory.name}/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    ids = [tokenizer.encode(p) for p in prompts]
    max_len = max(len(i) for i in ids) + args.max_new_tokens + 8
    rows = []
    ar_outputs = {}
    for temperature in args.temperatures:
        budgets = args.budgets if temperature == 0 or args.t1_budgets is None else args.t1_budgets
        main, other = norm_variants(device)
        configs = [("ar", 1, "fork", main), ("dflash", 1, "fork", main)]
        configs += [("ddtree", b, m, main) for b in budgets for m in ("fork", "unsafe")]
        if args.both_norms and temperature == 0:  # the same engine with the fused-norm switch the other way
            configs += [("ar", 1, "fork", other), ("dflash", 1, "fork", other)]
            configs += [("ddtree", b, "fork", other) for b in budgets]
        if args.serial_host and temperature == 0:  # the host reads each round before queueing the next
            configs += [("ar", 1, "fork", main + SERIAL), ("dflash", 1, "fork", main + SERIAL)]
            configs += [("ddtree", b, "fork", main + SERIAL) for b in budgets]
        twins = [t for t in (getattr(args, "twins", None) or "").split(",") if t]
        if twins and temperature == 0:  # each fork row again right after it, once per twin setting
            configs = [c for row in configs for c in ((row, *((*row[:3], f"{main}/{t}") for t in twins))
                                                       if row[2:] == ("fork", main) else (row,))]
        for method, budget, mode, variant in configs:
            cfg = GenerationConfig(method=method, budget=budget, recurrent=mode, max_new_tokens=args.max_new_tokens,
                                   temperature=temperature, seed=0, trace_topk=0, draft_trace_k=0, stop_on_eos=False)
            with tk.use_fused_norms(variant.startswith("fused_norms")), twin_setting(variant):
                engine = FastEngine(target, drafter, cfg, max_len=max_len, overlap_host=not variant.endswith(SERIAL))
                engine.generate(ids[0])  # warm-up: captures the graphs
                gc.collect()
                tokens = seconds = host = busy = 0.0
                taus, identical, outputs = [], 0, []
                for x in ids:
                    trace = engine.generate(x)
                    tokens += len(trace.generated_ids)
                    seconds += trace.decode_seconds
                    host += trace.settings["host_seconds"]
                    busy += trace.settings["host_busy_seconds"]
                    taus += trace.acceptance_lengths
                    outputs.append(trace.generated_ids)
            key = (temperature,)
            if method == "ar" and variant == main:
                ar_outputs[key] = outputs
            else:
                for got, ref in zip(outputs, ar_outputs[key]):
                    identical += got == ref
            row = {
                "pair": name, "method": method, "budget": budget if method == "ddtree" else None, "recurrent": mode, "variant": variant,
                "temperature": temperature, "prompts": len(ids), "tokens": tokens,
                "tokens_per_second": tokens / seconds, "mean_acceptance": statistics.fmean(taus),
                # host_fraction: the device idle between rounds waiting on the host (device timestamps);
                # host_busy_fraction: the host's own time per round, hidden while a round is queued ahead
                "host_fraction": host / seconds, "host_busy_fraction": busy / seconds, "rounds": len(taus),
                "identical_to_ar": identical if (method, variant) != ("ar", main) else len(ids),
            }
            rows.append(row)
            log(f"{name} T={temperature} {method:6s} b={budget:4d} {mode:6s} {variant}: {row['tokens_per_second']:8.1f} tok/s "
                f"tau {row['mean_acceptance']:.2f} host {100 * row['host_fraction']:.1f}% (busy {100 * row['host_busy_fraction']:.0f}%) identical {row['identical_to_ar']}/{len(ids)}")
            # the engine (and its CUDA graphs) in cycles would otherwise be collected inside a later
            # row's timed loop, where freeing graphs stalls the host while the device idles
            del engine
            gc.collect()
    hf = {}
    if not args.skip_hf:
        for temperature in args.temperatures:
            try:
                hf[str(temperature)] = _hf_generate_tokens_per_second(target.source_directory, ids, args.max_new_tokens, temperature, device, target.dtype)
                log(f"{name} T={temperature} HF generate: {hf[str(temperature)]['tokens_per_second']:.1f} tok/s")
            except Exception as exc:  # report, never hide
                hf[str(temperature)] = {"error": repr(exc)}
    graph_phases = _graph_phases(target, drafter, ids, args) if args.graph_phases and device.type == "cuda" else {}
    for label, got in graph_phases.items():
        log(f"{name} graph phases per round (GPU ms, median), {label}: "
            + ", ".join(f"{k} {v:.3f}" for k, v in got.items() if isinstance(v, float)))
    # where the time goes: the reference engine with a device sync around every phase
    phases = {}
    for budget in (args.phase_budget,):
        cfg = GenerationConfig(method="ddtree", budget=budget, max_new_tokens=args.max_new_tokens, trace_topk=0, profile=True, stop_on_eos=False)
        totals, rounds = {}, 0
        # one untimed generation first: the eager path JIT-compiles its Triton kernels for each new
        # shape on first use, and that compile time is not a phase of a round
        generate(target, ids[0], cfg, drafter)
        for x in ids[: args.phase_prompts]:
            trace = generate(target, x, cfg, drafter)
            for k, v in trace.phase_totals().items():
                totals[k] = totals.get(k, 0.0) + v
            rounds += len(trace.rounds)
        phases[str(budget)] = {k: 1e3 * v / rounds for k, v in totals.items()}
        log(f"{name} eager phases per round (ms), budget {budget}: " + ", ".join(f"{k} {v:.3f}" for k, v in phases[str(budget)].items()))
    del target, drafter
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return {"rows": rows, "hf_generate": hf, "eager_phase_ms_per_round": phases, "graph_phase_ms_per_round": graph_phases,
            "model_sha256": files}


def _graph_phases(target, drafter, ids, args) -> dict:
    """The fast path's rounds with device timestamps between their phases (FastEngine(phase_events=True),
    the host reading each round before queueing the next): per method / budget, the median GPU ms
    per round of draft, tree, verify, walk, commit, pack and the round step whole, over the rounds
    of ``--phase-prompts`` prompts at T = 0 (fork)."""
    from ..fastpath import FastEngine

    out = {}
    configs = [("ar", 1), ("dflash", 1)] + [("ddtree", b) for b in args.budgets]
    for method, budget in configs:
        cfg = GenerationConfig(method=method, budget=budget, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0,
                               trace_topk=0, draft_trace_k=0, stop_on_eos=False)
        engine = FastEngine(target, drafter, cfg, max_len=max(len(i) for i in ids) + args.max_new_tokens + 8,
                            overlap_host=False, phase_events=True)
        engine.generate(ids[0])  # captures the graphs
        per_round: dict = {}
        taus = []
        for x in ids[: args.phase_prompts]:
            trace = engine.generate(x)
            taus += trace.acceptance_lengths
            for r in trace.rounds:
                for k, v in r.timings.items():
                    if k.startswith("gpu_"):
                        per_round.setdefault(k[4:-3], []).append(v)
        label = method if method != "ddtree" else f"ddtree_{budget}"
        out[label] = {k: statistics.median(v) for k, v in per_round.items()}
        out[label].update(rounds=len(taus), tau=statistics.fmean(taus))
        del engine
        gc.collect()
    return out


# ----------------------------------------------------------------------------------------------
# part 2: Qwen3.6-27B dimensions, random weights


QWEN36_27B = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "full_attention_interval": 4,
}


@torch.no_grad()
def _init_random_(module, std=0.02):
    for name, p in module.named_parameters():
        if name.endswith("A_log"):
            p.uniform_(0.0, 2.7)
        elif name.endswith("dt_bias"):
            p.fill_(1.0)
        elif "norm" in name:
            p.zero_() if p.dim() == 1 and "linear_attn.norm" not in name else p.fill_(1.0)
        else:
            p.normal_(0.0, std)


def kernel_category(name: str) -> str:
    n = name.lower()
    if any(t in n for t in ("gemm", "gemv", "cutlass", "sm90_xmma", "cublas", "nvjet", "splitk")):
        return "gemm"
    if n.startswith("_") or "triton" in n:  # our Triton kernels keep their python names (_tree_attn_kernel, ...)
        return "triton"
    if "memcpy" in n or "memset" in n or "copy" in n:
        return "copy"
    return "other"


def profile_step(step, graph_ms: float, repeats: int = 5) -> dict:
    """Where an eager step's GPU time goes, by kernel category (torch.profiler, CUDA activities):
    the sum of kernel durations per step against the captured step's replay time; what the
    replay takes beyond the kernels is launch gaps and dependencies."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
    by_cat: dict = {}
    top: dict = {}
    count = 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        cat = kernel_category(e.name)
        by_cat[cat] = by_cat.get(cat, 0.0) + us / 1e3 / repeats
        top[e.name] = top.get(e.name, 0.0) + us / 1e3 / repeats
        count += 1
    kernel_ms = sum(by_cat.values())
    out = {"repeats": repeats, "kernels_per_step": count / repeats, "kernel_ms_by_category": by_cat,
           "kernel_ms_total": kernel_ms, "graph_replay_ms": graph_ms, "replay_minus_kernels_ms": graph_ms - kernel_ms,
           "top_kernels_ms": dict(sorted(top.items(), key=lambda kv: -kv[1])[:15])}
    log(f"  profile: {out['kernels_per_step']:.0f} kernels, {kernel_ms:.2f} ms of kernels per step ("
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1]))
        + f"); graph replay {graph_ms:.2f} ms")
    return out


def bench_27b(args, device, taus_by_budget: dict) -> dict:
    from ..drafters.dflash import DFlashDraftModel, DFlashDrafter, dflash_config_dict, parse_dflash_config
    from ..fastpath import FastEngine
    from ..models import build_target, parse_target_config

    dtype = torch.bfloat16
    config = parse_target_config(dict(QWEN36_27B))
    t0 = time.perf_counter()
    with torch.device("meta"):
        target = build_target(config)
    # cast on meta first: to_empty then allocates bf16 directly (fp32 first is 108 GB, past an H100's 80)
    target = target.to(dtype).to_empty(device=device)
    target.tie_weights()
    target.reset_rotary()
    _init_random_(target)
    target.eval().requires_grad_(False)
    target.pack_projections()  # as load_target does: one GEMM per layer input
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    read_bytes = weight_bytes - target.model.embed_tokens.weight.numel() * 2  # decode reads one embedding row
    layer_ids = [1, 16, 31, 46, 61]
    draft_raw = dflash_config_dict(config, num_layers=5, target_layer_ids=layer_ids, mask_token_id=248070, block_size=16,
                                   heads=32, kv_heads=8, head_dim=128, intermediate_size=17408)
    with torch.device("meta"):
        dmodel = DFlashDraftModel(parse_dflash_config(draft_raw))
    dmodel = dmodel.to(dtype).to_empty(device=device)
    dmodel.reset_rotary()
    _init_random_(dmodel)
    dmodel.eval().requires_grad_(False)
    dmodel.pack_projections()
    drafter = DFlashDrafter(dmodel, target)
    log(f"27B dims: built {weight_bytes / 1e9:.1f} GB of bf16 weights in {time.perf_counter() - t0:.0f} s")
    bandwidth = copy_bandwidth_gbs()
    floor_ms = read_bytes / (bandwidth * 1e9) * 1e3
    prefix = args.prefix
    out = {"weight_gb": weight_bytes / 1e9, "read_gb_per_step": read_bytes / 1e9, "copy_bandwidth_gbs": bandwidth,
           "weight_read_floor_ms": floor_ms, "prefix": prefix, "drafter_layers": 5, "verify_ms": {}, "draft_ms": {}}

    def engine_for(method, budget, mode="fork"):
        cfg = GenerationConfig(method=method, budget=budget, recurrent=mode, max_new_tokens=8, trace_topk=0, draft_trace_k=0)
        engine = FastEngine(target, drafter, cfg, max_len=prefix + 64)
        g = torch.Generator(device=device).manual_seed(0)
        for c in engine.cache.layers:  # a committed prefix of random keys/values and states
            if hasattr(c, "k"):
                c.k.normal_(generator=g)
                c.v.normal_(generator=g)
                c.length = prefix
            else:
                c.state.normal_(generator=g).mul_(0.01)
                c.conv_state.normal_(generator=g)
        engine.cache.length = prefix
        engine.buf.position.fill_(prefix)
        engine.buf.bonus.fill_(11)
        if engine.drafter is not None:
            drafter.caches = dmodel.new_cache(prefix + 64)
            for c in drafter.caches:
                c.k.normal_(generator=g)
                c.v.normal_(generator=g)
            engine.buf.features.normal_(generator=g)
            engine.buf.count.fill_(3)
            lp = torch.log_softmax(torch.randn(engine.depth, config.vocab_size, device=device, generator=g) * 3, -1)
            top = torch.topk(lp, engine.k, -1)
            engine.buf.draft_tokens.copy_(top.indices)
            engine.buf.draft_logprobs.copy_(top.values)
        return engine

    def time_step(engine, name, fn):
        def once():
            engine.buf.position.fill_(prefix)  # every replay verifies at the same prefix length
            engine._run(name, fn)
        return cuda_median_ms(once, repeats=args.repeats, warmup=3)

    ar = engine_for("ar", 1)
    out["ar_step_ms"] = time_step(ar, "round", ar._round_step)
    out["ar_step_over_floor"] = out["ar_step_ms"] / floor_ms
    log(f"27B dims: AR step {out['ar_step_ms']:.2f} ms, floor {floor_ms:.2f} ms ({out['ar_step_over_floor']:.2f}x)")
    if args.profile:
        try:
            out["ar_step_profile"] = profile_step(ar._round_step, out["ar_step_ms"])
        except Exception as exc:  # a diagnostic: its failure must not cost the timings
            out["ar_step_profile"] = {"error": repr(exc)[:1000]}
            log(f"27B dims: profile failed: {exc!r}"[:400])
    del ar
    for budget in args.budgets_27b:
        for mode in ("fork", "unsafe"):
            eng = engine_for("ddtree", budget, mode)
            ms = time_step(eng, "round", eng._round_step)
            out["verify_ms"][f"{budget}/{mode}"] = ms
            if mode == "fork":
                out["draft_ms"][str(budget)] = time_step(eng, "draft", eng._draft_step)
            if args.profile and budget == 64:  # where the 65-token verify's time goes beyond the AR step's
                try:
                    out[f"verify_{budget + 1}_{mode}_profile"] = profile_step(lambda: (eng.buf.position.fill_(prefix), eng._round_step()), ms)
                except Exception as exc:
                    out[f"verify_{budget + 1}_{mode}_profile"] = {"error": repr(exc)[:1000]}
            log(f"27B dims: verify {budget + 1} tokens ({mode}) {ms:.2f} ms = {ms / out['ar_step_ms']:.2f}x AR step"
                + (f"; draft {out['draft_ms'][str(budget)]:.2f} ms" if mode == "fork" else ""))
            del eng
            torch.cuda.empty_cache()
    def variant(name: str, context) -> dict:
        """The AR step and the 65-token verify again inside ``context`` (a model variant)."""
        got: dict = {}
        try:
            with context:
                for method, budget in (("ar", 1), ("ddtree", 64)):
                    t1 = time.perf_counter()
                    eng = engine_for(method, budget)
                    ms = time_step(eng, "round", eng._round_step)
                    key = "ar_step_ms" if method == "ar" else "verify_65_fork_ms"
                    got[key] = ms
                    got[key.replace("_ms", "_setup_s")] = time.perf_counter() - t1  # compile + capture
                    log(f"27B dims, {name}: {key} {ms:.2f} ms (setup {time.perf_counter() - t1:.0f} s)")
                    del eng
            got["ar_step_over_floor"] = got["ar_step_ms"] / floor_ms
            got["verify_65_over_ar"] = got["verify_65_fork_ms"] / got["ar_step_ms"]
            got["ar_step_default_over_variant"] = out["ar_step_ms"] / got["ar_step_ms"]
        except Exception as exc:  # report it; the default numbers above still stand
            got["error"] = repr(exc)[:2000]
            log(f"27B dims, {name} failed: {exc!r}"[:500])
        return got

    if args.compile:  # the decoder layers through torch.compile (fused elementwise work)
        from ..fastpath import compiled_layers

        out["compiled"] = variant("compiled layers", compiled_layers(target))
        out["compiled_fused_norms"] = variant("compiled layers, fused norms", compiled_layers(target, fused_norms=True))
    out["norms"] = norm_variants(device)[0]  # what the numbers above ran with
    if args.both_norms:  # the fused-norm switch the other way (counts: data/results/launches-cpu-*.json)
        import tree_kernels as tk

        other = norm_variants(device)[1]
        out[other] = variant(other.replace("_", " "), tk.use_fused_norms(other == "fused_norms"))
    if args.decode_step:  # the AR step's GDN layers through the one-launch decode step
        from ..verify import gdn_decode_step_enabled, use_gdn_decode_step

        out["gdn_decode_step"] = variant("gdn decode step " + ("off" if gdn_decode_step_enabled() else "on"),
                                         use_gdn_decode_step(not gdn_decode_step_enabled()))
    if args.commit_in_forward:  # the AR step with its recurrent commit as separate launches again
        from ..fastpath import use_commit_in_forward

        out["commit_in_forward_off"] = variant("commit in forward off", use_commit_in_forward(False))
    def interleaved(name: str, variants, got: dict, budgets=(16, 64)) -> dict:
        """Verify budget + 1 tokens (fork; 17 and 65 unless told) under each (label, make_context)
        in turn, the first labelled "default"; every other variant's time over the default's,
        logged. Errors are reported in ``got``: the default numbers above still stand."""
        try:
            for budget in budgets:
                for label, make in variants:
                    with make():
                        eng = engine_for("ddtree", budget)
                        got[f"verify_{budget + 1}_fork_{label}_ms"] = time_step(eng, "round", eng._round_step)
                        del eng
                    log(f"27B dims, {name} {label}: verify {budget + 1} {got[f'verify_{budget + 1}_fork_{label}_ms']:.2f} ms")
                base = got[f"verify_{budget + 1}_fork_default_ms"]
                for label, _ in variants[1:]:
                    ms = got[f"verify_{budget + 1}_fork_{label}_ms"]
                    got[f"verify_{budget + 1}_{label}_over_default"] = ms / base
                    log(f"27B dims, {name} {label}: verify {budget + 1} {ms:.2f} ms vs default {base:.2f} ms ({ms / base:.3f}x)")
        except Exception as exc:
            got["error"] = repr(exc)[:2000]
            log(f"27B dims, {name} failed: {exc!r}"[:500])
        return got

    if args.gdn_blocked:  # the verify's GDN layers with the dense solve switched, interleaved with the default
        from tree_kernels.tree_gdn import triton as tg

        flipped = "off" if tg.DENSE_MAX_NODES else "on"
        out["gdn_dense_" + flipped] = interleaved(
            "gdn dense", (("default", contextlib.nullcontext), (flipped, lambda: tg.dense_fork(not tg.DENSE_MAX_NODES))),
            {"dense_max_nodes_default": tg.DENSE_MAX_NODES})
    if args.fusion_variants:  # the verify round's launch fusions, each switched off, interleaved with the default
        import tree_kernels as tk
        from tree_kernels.static import use_kv_commit_launch
        from tree_kernels.tree_conv import triton as tconv

        from ..models.qwen3_5 import use_stacked_commit

        def all_off():
            stack = contextlib.ExitStack()
            for ctx in (use_stacked_commit(False), use_kv_commit_launch(False), tk.use_fused_conv_gates(False)):
                stack.enter_context(ctx)
            return stack

        @contextlib.contextmanager
        def conv_gates_warps(n):
            old, tconv.GDN_GATES_WARPS = tconv.GDN_GATES_WARPS, n
            try:
                yield
            finally:
                tconv.GDN_GATES_WARPS = old

        variants = (("default", contextlib.nullcontext),
                    ("conv_gates_4_warps", lambda: conv_gates_warps(4)),  # the fused kernel where it spills
                    ("conv_gates_unfused", lambda: tk.use_fused_conv_gates(False)),  # tree conv + gates: two launches per GDN layer
                    ("per_layer_recurrent", lambda: use_stacked_commit(False)),  # GDN + conv commits: two per GDN layer
                    ("all_off", all_off))  # and the KV commit as seven torch launches per attention layer
        out["fusion_variants"] = interleaved("fusions", variants, {"conv_gates_warps_default": tconv.GDN_GATES_WARPS})
    if args.gdn_variants:  # the blocked GDN solve's undecided settings (33 / 65 nodes: the blocked route), interleaved
        from tree_kernels.tree_gdn import triton as tg

        # 33 / 65 nodes (those of them in --budgets-27b, else both)
        gdn_budgets = tuple(b for b in (32, 64) if b in args.budgets_27b) or (32, 64)
        out["gdn_blocked_variants"] = interleaved("gdn blocked", gdn_variants(), {"defaults": dict(tg.OFFDIAG_DEFAULTS)},
                                                  budgets=gdn_budgets)
    if args.prefetch_variants:  # the output projections' weights warmed into L2 during the tree kernels, interleaved
        if args.prefetch_config:  # e.g. bench.l2's best_read
            from tree_kernels.l2_prefetch import triton as lp

            lp.DEFAULT_CONFIG.update(json.loads(args.prefetch_config))
            log(f"27B dims: L2 warm-up kernel config {lp.DEFAULT_CONFIG}")
        fusions = round_fusions()
        out["l2_prefetch_variants"] = interleaved("l2 prefetch", prefetch_variants(), {
            "default_on": fusions["l2_prefetch"], "default_bytes": fusions["l2_prefetch_bytes"]})
        if args.profile:  # whether the out_proj / o_proj GEMMs got faster (kernel times by name)
            with l2_prefetch_setting(True, 32 << 20, True):
                eng = engine_for("ddtree", 64)
                try:
                    out["verify_65_fork_l2_prefetch_profile"] = profile_step(
                        lambda: (eng.buf.position.fill_(prefix), eng._round_step()), time_step(eng, "round", eng._round_step))
                except Exception as exc:
                    out["verify_65_fork_l2_prefetch_profile"] = {"error": repr(exc)[:1000]}
                del eng
    if args.pdl_variants:  # every Triton kernel launched with programmatic dependent launch, interleaved with it off
        out["pdl_variants"] = pdl_variants(args.budgets_27b, engine_for, time_step, floor_ms)
    if args.few_rows_tuned:  # the verify's GEMMs through the Triton few-rows GEMM where a sweep tuned it, interleaved with cuBLAS
        from tree_kernels.gemv import triton as tgm

        got = {"tuned_from": str(args.few_rows_tuned)}
        default_table = dict(tgm.FEW_ROWS_TUNED)  # the committed table, replaced by the file's for the comparison
        tgm.FEW_ROWS_TUNED.clear()
        try:
            tuned = tgm.load_few_rows_tuned(json.loads(Path(args.few_rows_tuned).read_text()), device=device_name())
            got["tuned"] = {f"N{n} K{k} M{m}": cfg for (_, n, k, m), cfg in tuned.items()}
            max_rows = tgm.routed_max_rows(tuned)
            if not max_rows:
                raise RuntimeError(f"{args.few_rows_tuned}: no shape where the few-rows GEMM beat cuBLAS on {device_name()}")
            for budget in (b for b in args.budgets_27b if b + 1 <= max_rows):
                for label, context in (("cublas", tgm.use_few_rows(0)), ("few_rows", tgm.use_few_rows(max_rows))):
                    with context:
                        eng = engine_for("ddtree", budget)
                        got[f"verify_{budget + 1}_fork_{label}_ms"] = time_step(eng, "round", eng._round_step)
                        del eng
                        torch.cuda.empty_cache()
                ms, base = got[f"verify_{budget + 1}_fork_few_rows_ms"], got[f"verify_{budget + 1}_fork_cublas_ms"]
                got[f"verify_{budget + 1}_few_rows_over_cublas"] = ms / base
                log(f"27B dims, few-rows GEMM: verify {budget + 1} {ms:.2f} ms vs cuBLAS {base:.2f} ms ({ms / base:.3f}x, "
                    f"{ms / out['ar_step_ms']:.2f}x AR)")
        except Exception as exc:
            got["error"] = repr(exc)[:2000]
            log(f"27B dims, few-rows GEMM failed: {exc!r}"[:500])
        finally:
            tgm.FEW_ROWS_TUNED.clear()
            tgm.FEW_ROWS_TUNED.update(default_table)
        out["few_rows_gemm"] = got
    if args.gemv:  # the one-row GEMMs through cuBLAS again instead of the Triton GEMV
        import tree_kernels as tk

        out["gemv_" + ("off" if tk.gemv_enabled() else "on")] = variant("gemv " + ("off" if tk.gemv_enabled() else "on"),
                                                                       tk.use_gemv(not tk.gemv_enabled()))
    # projection from measured acceptance (part 1, hybrid pair, T=0, fork)
    projection = {}
    for budget in args.budgets_27b:
        tau = taus_by_budget.get(budget)
        if tau is None:
            continue
        round_ms = out["verify_ms"][f"{budget}/fork"] + out["draft_ms"][str(budget)]
        projection[str(budget)] = {"tau": tau, "round_ms": round_ms, "tokens_per_second": 1e3 * tau / round_ms,
                                   "speedup_over_ar": (1e3 * tau / round_ms) / (1e3 / out["ar_step_ms"])}
    out["projection"] = {"note": "projection: 27B-dims timings x acceptance lengths measured on the bundled hybrid pair",
                         "ar_tokens_per_second": 1e3 / out["ar_step_ms"], "by_budget": projection}
    del target, drafter, dmodel
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", default="tiny-hybrid:tiny-hybrid-dflash,tiny-dense:tiny-dense-dflash")
    p.add_argument("--prompts", default="humaneval")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--budgets", default="8,16,32,64,128,256")
    p.add_argument("--budgets-27b", default="16,32,64,128,256")
    p.add_argument("--t1-budgets", default=None, help="DDTree budgets at T > 0 (default: --budgets)")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--phase-budget", type=int, default=64)
    p.add_argument("--phase-prompts", type=int, default=4)
    p.add_argument("--prefix", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-pairs", action="store_true")
    p.add_argument("--skip-27b", action="store_true")
    p.add_argument("--gdn-blocked", action="store_true",
                   help="27B dims: the 17- and 65-token verify with the GDN fork's dense kernel switched, interleaved with the default")
    p.add_argument("--commit-in-forward", action="store_true",
                   help="also time the 27B AR step with the recurrent commit after the forward (the route before it moved in place)")
    p.add_argument("--compile", action="store_true", help="also time the 27B steps with torch.compile'd layers")
    p.add_argument("--profile", action="store_true", help="27B dims: kernel time by category in the AR step (torch.profiler)")
    p.add_argument("--both-norms", action="store_true",
                   help="also time the other setting of the fused-norm switch (pairs at T=0; 27B AR step and 65-token verify)")
    p.add_argument("--prefetch-variants", action="store_true",
                   help="27B dims: verify 17 / 65 with the output projections' weights read into L2 on a side stream "
                        "during the tree kernels (16 / 32 / 48 MB, evict-last or plain loads), interleaved with it off")
    p.add_argument("--graph-phases", action="store_true",
                   help="bundled pairs: the fast path's rounds with device timestamps between phases (draft, tree, "
                        "verify, walk, commit, pack), GPU ms per round; the host reads each round before queueing the next")
    p.add_argument("--gdn-variants", action="store_true",
                   help="27B dims: verify 33 / 65 with the blocked GDN solve's undecided settings (bench.kernels."
                        "OFFDIAG_VARIANTS: the products with S0 in the prepare, the chain's value tile and warps), "
                        "interleaved with its defaults")
    p.add_argument("--prefetch-config", default=None,
                   help="JSON settings of the L2 warm-up kernel for --prefetch-variants (bench.l2 writes its best as best_read)")
    p.add_argument("--fusion-variants", action="store_true",
                   help="27B dims: verify 17 / 65 with the fused tree conv + gates, the stacked recurrent commit, and "
                        "all of them with the one-launch KV commit, switched off, interleaved with the default")
    p.add_argument("--decode-step", action="store_true",
                   help="27B dims: also the AR step and 65-token verify with the GDN decode-step switch the other way")
    p.add_argument("--gemv", action="store_true",
                   help="27B dims: also the AR step and 65-token verify with the Triton GEMV switch the other way (cuBLAS)")
    p.add_argument("--few-rows-tuned", default=None,
                   help="27B dims: a bench.gemv result; the verify at each budget again with its GEMMs through the few-rows "
                        "GEMM where that sweep beat cuBLAS, interleaved with cuBLAS")
    p.add_argument("--twins", default=None,
                   help="pairs at T=0: each fork row (AR, DFlash, DDTree) again right after it under each listed setting: "
                        "pdl (programmatic dependent launch), torch_round (the ancestor mask, conv table and walk as torch ops), small_gemm "
                        "(small weights' GEMMs through the Triton few-rows kernel), or settings joined by +; rows of "
                        "variant <norms>/<twin>, identical_to_ar against the AR row without it")
    p.add_argument("--pdl-variants", action="store_true",
                   help="27B dims: the AR step and verify 17 / 65 with every Triton kernel launched with programmatic "
                        "dependent launch (WORKBENCH_PDL) and without, off / on / off / on")
    p.add_argument("--serial-host", action="store_true",
                   help="pairs at T=0: also run with the host recording each round before queueing the next "
                        "(rows of variant <norms>/serial_host)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.budgets = [int(b) for b in args.budgets.split(",")]
    args.budgets_27b = [int(b) for b in args.budgets_27b.split(",")]
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    args.t1_budgets = [int(b) for b in args.t1_budgets.split(",")] if args.t1_budgets else None
    unknown = unknown_twins(args.twins)
    if unknown:
        p.error(f"--twins: unknown setting(s) {unknown}; known: {sorted(TWINS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from ..prompts import load_prompts

    result = {"benchmark": "e2e", "date": dt.datetime.now().isoformat(timespec="seconds"), "device": device_name(),
              "versions": versions(), "statistic": "median of repeats (27B dims); totals over prompts (pairs)",
              "settings": {k: v for k, v in vars(args).items()}, "pairs": {}, "few_rows_default": few_rows_default(),
              "round_fusions": round_fusions()}
    taus = {}
    slug = device_name().lower().replace(" ", "-")
    out = Path(args.out) if args.out else RESULTS / f"e2e-{slug}-{dt.date.today().isoformat()}.json"
    if not args.skip_pairs:
        prompts = load_prompts(args.prompts, args.n)
        for spec in args.pairs.split(","):
            name, drafter = spec.split(":")
            result["pairs"][name] = bench_pair(name, drafter, prompts, args, device)
            write_json_atomic(out, result, indent=2)  # what is measured is kept, even if a later part fails
        hybrid = next(iter(result["pairs"].values()))["rows"]
        taus = {r["budget"]: r["mean_acceptance"] for r in hybrid if r["method"] == "ddtree" and r["recurrent"] == "fork" and r["temperature"] == 0.0}
    if not args.skip_27b and device.type == "cuda":
        result["qwen36_27b_dims"] = bench_27b(args, device, taus)
    write_json_atomic(out, result, indent=2)
    print_table(result)
    print(f"wrote {out}")
    return result


def print_table(result: dict) -> None:
    for name, pair in result.get("pairs", {}).items():
        main_variant = pair["rows"][0].get("variant") if pair["rows"] else None  # the first AR row is the run's own setting
        ar = {r["temperature"]: r["tokens_per_second"] for r in pair["rows"] if r["method"] == "ar" and r.get("variant") == main_variant}
        print(f"\n{name}: tokens/s (speed-up over our AR), mean acceptance")
        for r in pair["rows"]:
            b = r["budget"] if r["budget"] is not None else "-"
            print(f"  T={r['temperature']:.0f} {r['method']:6s} {str(b):>4s} {r['recurrent']:6s} {r.get('variant', 'reference_norms'):15s} {r['tokens_per_second']:9.1f} "
                  f"({r['tokens_per_second'] / ar[r['temperature']]:.2f}x)  tau {r['mean_acceptance']:.2f}  host {100 * r['host_fraction']:.1f}%  "
                  f"identical {r['identical_to_ar']}/{r['prompts']}")
        for t, hf in pair["hf_generate"].items():
            if "tokens_per_second" in hf:
                print(f"  T={float(t):.0f} HF generate           {hf['tokens_per_second']:9.1f}")
    big = result.get("qwen36_27b_dims")
    if big:
        print(f"\nQwen3.6-27B dims: AR step {big['ar_step_ms']:.2f} ms = {big['ar_step_over_floor']:.2f}x the weight-read floor "
              f"({big['weight_read_floor_ms']:.2f} ms at {big['copy_bandwidth_gbs']:.0f} GB/s)")
        for key, ms in big["verify_ms"].items():
            print(f"  verify {key:>12s}: {ms:7.2f} ms = {ms / big['ar_step_ms']:.2f}x AR step")
        if "ar_step_ms" in big.get("compiled", {}):
            c = big["compiled"]
            print(f"  compiled layers: AR step {c['ar_step_ms']:.2f} ms = {c['ar_step_over_floor']:.2f}x floor; "
                  f"65-token verify {c['verify_65_fork_ms']:.2f} ms = {c['verify_65_over_ar']:.2f}x AR step")
        for other in ("fused_norms", "reference_norms"):
            if "ar_step_ms" not in big.get(other, {}):
                continue
            f = big[other]
            print(f"  {other.replace('_', ' ')}: AR step {f['ar_step_ms']:.2f} ms = {f['ar_step_over_floor']:.2f}x floor; "
                  f"65-token verify {f['verify_65_fork_ms']:.2f} ms = {f['verify_65_over_ar']:.2f}x AR step")
        for budget, pr in big["projection"]["by_budget"].items():
            print(f"  projection budget {budget}: tau {pr['tau']:.2f}, {pr['tokens_per_second']:.1f} tok/s = {pr['speedup_over_ar']:.2f}x AR")


if __name__ == "__main__":
    main()
