"""Count the kernels one fast-path step launches: ``python -m workbench.bench.launches`` (CPU).

A decode step of a large target is bound by its weight reads plus a fixed cost per kernel (a few
microseconds each even inside a CUDA graph), so the number of kernels per decoder layer is the
lever on the AR step. This counts them without a GPU: the fast path's round step runs eagerly on a
random-weight hybrid model in the Qwen3.6 layer pattern (3 GDN : 1 attention), with every aten op
that would launch a kernel counted (views and metadata ops excluded) and every Triton launch
counted (the Triton kernels run under ``TRITON_INTERPRET=1``), per decoder layer, per cache commit
and for the rest of the step; for DDTree also the draft step of a one-layer DFlash drafter. Then the per-layer counts are scaled to a 64-layer Qwen3.6-27B step
(48 GDN + 16 attention layers). Measured with the fused row-wise kernels (``tree_kernels.norms``)
off and on, side by side; written to ``data/results/launches-cpu-<date>.json``.

A count, not a timing: what the kernels cost on a GPU is for ``bench.e2e`` to measure.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from ..trace import write_json_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"
# aten ops that only make views or read metadata: no kernel on a GPU
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "split", "split_with_sizes", "slice", "select",
    "unsqueeze", "squeeze", "expand", "detach", "alias", "permute", "unbind", "lift_fresh", "empty", "empty_like",
    "empty_strided", "_reshape_alias", "resolve_conj", "resolve_neg", "unflatten", "narrow", "promote_types",
    "is_same_size", "size", "stride", "dim", "sym_size", "sym_stride", "_local_scalar_dense", "chunk", "movedim",
    "view_as", "expand_as", "contiguous",
}


class KernelCounter(TorchDispatchMode):
    """Counts dispatched aten ops that would launch a kernel, by name, into the current bucket."""

    def __init__(self):
        super().__init__()
        self.buckets: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.bucket = "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in NO_KERNEL:
            self.buckets[self.bucket][name] += 1
        return func(*args, **(kwargs or {}))


def _patch_triton(counter: KernelCounter):
    """Count every interpreted Triton launch into the counter's bucket (its internals uncounted)."""
    import triton.runtime.interpreter as interp

    original = interp.InterpretedFunction.run

    def run(self, *args, **kwargs):
        counter.buckets[counter.bucket]["triton:" + self.fn.__name__] += 1
        with _disable_current_modes():
            return original(self, *args, **kwargs)

    interp.InterpretedFunction.run = run
    return lambda: setattr(interp.InterpretedFunction, "run", original)


def count_step(method: str, budget: int, fused: bool, seed: int = 0) -> dict:
    """Kernels of one round step (and the draft step for DDTree) of the fast path, by bucket."""
    import tree_kernels as tk

    from ..drafters.dflash import DFlashDrafter
    from ..engine import GenerationConfig
    from ..fastpath import FastEngine
    from ..random_models import random_dflash, random_target

    target = random_target("hybrid", seed=seed, vocab_size=300, eos_token_id=None)
    kinds = [layer.mixer_name for layer in target.model.layers]
    prompt = [1, 2, 3, 4, 5, 6]
    drafter = None
    if method != "ar":  # a one-layer DFlash drafter, block 16 (the zoo's block size)
        drafter = DFlashDrafter(random_dflash(target, seed=seed, num_layers=1, block_size=16), target)
    cfg = GenerationConfig(method=method, budget=budget, max_new_tokens=8, trace_topk=0, draft_trace_k=0)
    counter = KernelCounter()
    restore = _patch_triton(counter)
    try:
        with tk.use_backend("triton"), tk.use_fused_norms(fused), torch.no_grad():
            engine = FastEngine(target, drafter, cfg, max_len=96, use_graphs=False)
            engine.generate(prompt)  # fills the caches and the draft buffers
            hooks = []
            for i, layer in enumerate(target.model.layers):
                def enter(mod, inp, i=i):
                    counter.bucket = f"layer{i}"

                def leave(mod, inp, out):
                    counter.bucket = "other"

                hooks += [layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave)]
            for i, cache in enumerate(engine.cache.layers):
                original = cache.commit_static

                def commit(*a, original=original, i=i):
                    counter.bucket = f"commit{i}"
                    try:
                        return original(*a)
                    finally:
                        counter.bucket = "other"

                cache.commit_static = commit
            for group in engine.cache.shared:  # layers committed together (RecurrentStack): one bucket, not per layer
                original = group.commit_static

                def shared_commit(*a, original=original):
                    counter.bucket = "commit_shared"
                    try:
                        return original(*a)
                    finally:
                        counter.bucket = "other"

                group.commit_static = shared_commit
            counter.buckets.clear()  # the Triton launches of the warm-up generation above are not the step's
            counter.bucket = "other"
            with counter:
                engine._round_step()
                if drafter is not None:
                    counter.bucket = "draft"
                    engine._draft_step()
                    counter.bucket = "other"
            for h in hooks:
                h.remove()
    finally:
        restore()
    total = lambda names: sum(sum(counter.buckets[n].values()) for n in names)  # noqa: E731
    by_kind = {}
    once = 0  # work the first layer of a kind does for the whole step (masks, gather tables): not per layer
    for kind in sorted(set(kinds)):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        layer_counts = [total([f"layer{i}"]) for i in idx]
        commit_counts = [total([f"commit{i}"]) for i in idx]
        once += sum(layer_counts) - len(idx) * min(layer_counts) + sum(commit_counts) - len(idx) * min(commit_counts)
        example = counter.buckets[f"layer{idx[-1]}"]
        by_kind[kind] = {
            "layers": len(idx), "per_layer_forward": min(layer_counts), "per_layer_commit": min(commit_counts),
            "triton_launches_per_layer": sum(v for k, v in example.items() if k.startswith("triton:")),
            "top_ops": dict(example.most_common(12)),
        }
    return {
        "method": method, "budget": budget if method == "ddtree" else None, "fused_norms": fused, "layer_kinds": kinds,
        "per_kind": by_kind, "rest_of_round_step": total(["other"]) + once, "draft_step": total(["draft"]),
        "stacked_commit": total(["commit_shared"]),  # the same whatever the number of layers
        "rest_top_ops": dict(counter.buckets["other"].most_common(40)),
        "round_step_total": total([b for b in counter.buckets if b != "draft"]),
    }


def scale_to_27b(step: dict, gdn_layers: int = 48, attention_layers: int = 16) -> int:
    k = step["per_kind"]
    per = {"linear_attn": gdn_layers, "self_attn": attention_layers}
    return step["rest_of_round_step"] + step.get("stacked_commit", 0) + sum(
        n * (k[name]["per_layer_forward"] + k[name]["per_layer_commit"]) for name, n in per.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.launches", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.budget < 1:
        print("launches: error: --budget must be >= 1", file=sys.stderr)
        return 2
    rows = []
    for method in ("ar", "ddtree"):
        for fused in (False, True):
            step = count_step(method, args.budget, fused)
            step["qwen36_27b_round_step_kernels"] = scale_to_27b(step)
            rows.append(step)
            k = step["per_kind"]
            print(f"{method:6s} fused={str(fused):5s}: GDN layer {k['linear_attn']['per_layer_forward']} + commit "
                  f"{k['linear_attn']['per_layer_commit']}, attention layer {k['self_attn']['per_layer_forward']} + commit "
                  f"{k['self_attn']['per_layer_commit']}, rest {step['rest_of_round_step']}, stacked commit {step['stacked_commit']}; 27B round step ~"
                  f"{step['qwen36_27b_round_step_kernels']} kernels" + (f"; draft step {step['draft_step']}" if method != "ar" else ""))
    ratios = {}
    for method in ("ar", "ddtree"):
        off, on = (next(r for r in rows if r["method"] == method and r["fused_norms"] == f) for f in (False, True))
        ratios[f"{method}_27b_kernels_fused_over_unfused"] = round(on["qwen36_27b_round_step_kernels"] / off["qwen36_27b_round_step_kernels"], 3)
    import platform

    from .e2e import versions

    result = {
        "benchmark": "launches", "what": "kernels launched per fast-path step (counted, not timed)",
        "method": "aten ops that would launch a kernel (views/metadata excluded) + Triton launches, eager fast-path step "
                  "on a random hybrid model (3 GDN : 1 attention), Triton under TRITON_INTERPRET=1; 27B: per-layer counts "
                  "x (48 GDN + 16 attention) + the rest of the step",
        "date": dt.datetime.now().isoformat(timespec="seconds"), "device": f"cpu ({platform.machine()})",
        "versions": versions(),
        "rows": rows, "ratios": ratios,
    }
    out = Path(args.out) if args.out else RESULTS / f"launches-cpu-{dt.date.today().isoformat()}.json"
    write_json_atomic(out, result, indent=2)
    print(ratios)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
