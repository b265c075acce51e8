"""Cost-aware budget choice (``--budget auto``).

Speed-up peaks at an intermediate budget: acceptance grows with the tree, and so does the
verify cost. The best budget maximises tokens per second = tau(b) / round_time(b):

1. if a committed end-to-end measurement (``data/results/e2e-*.json``) covers this target on
   this device with the model files loaded now (sha256), take the budget with the highest measured DDTree (fork, T=0) tokens/s;
2. otherwise calibrate: a short generation at each candidate budget on the user's own prompt,
   timing whole rounds, and keep the fastest.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import torch

from .bench.results import RESULTS, e2e_results

CANDIDATES = (8, 16, 32, 64, 128, 256)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _recorded_hashes(result: dict, pair: dict) -> dict:
    """sha256 per ``<model dir name>/<file>`` the run recorded (per pair, or for the whole run)."""
    return {**result.get("models_measured", {}), **pair.get("model_sha256", {})}


def _models_unchanged(recorded: dict, models) -> bool:
    """Every recorded file of these models still has the recorded content (a retrained drafter
    makes an old measurement stale). Files the run did not record are not judged."""
    for model in models:
        directory = Path(getattr(model, "source_directory", "") or "")
        for key, sha in recorded.items():
            if not isinstance(sha, str) or "/" not in key:
                continue
            owner, fname = key.split("/", 1)
            if owner != directory.name:
                continue
            path = directory / fname
            if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha:
                return False
    return True


def measured_best_budget(target, drafter=None, results_dir: Path = RESULTS) -> tuple[int, dict] | None:
    """The fastest DDTree budget recorded for this target (and drafter) on this device, if any.

    A measurement counts only if it names this target, was taken on this device, and the model
    files it recorded (sha256) are the ones loaded now.
    """
    name = Path(getattr(target, "source_directory", "") or "").name
    device = _device_name(target.device)
    models = [target] + ([getattr(drafter, "model", drafter)] if drafter is not None else [])
    best = None
    variant = norms_variant(next(target.parameters()))  # the rows of the model variant this process runs
    for path, result in e2e_results(results_dir):  # oldest first: the newest match wins
        if result.get("device") != device or name not in result.get("pairs", {}):
            continue
        pair = result["pairs"][name]
        if not _models_unchanged(_recorded_hashes(result, pair), models):
            continue
        measured_dtype = result.get("settings", {}).get("dtype")
        if measured_dtype is not None and measured_dtype != str(target.dtype).removeprefix("torch."):
            continue  # a bf16 measurement says nothing about an fp32 run, and back
        rows = [r for r in pair["rows"] if r["method"] == "ddtree" and r["recurrent"] == "fork" and r["temperature"] == 0
                and r.get("variant", "reference_norms") == variant]
        if rows:
            top = max(rows, key=lambda r: r["tokens_per_second"])
            best = (int(top["budget"]), {"source": str(path), "table": {r["budget"]: r["tokens_per_second"] for r in rows}})
    return best


def norms_variant(x: torch.Tensor) -> str:
    """The label e2e results give the rows of a run on tensors like ``x``: the fused row-wise
    kernels on (``fused_norms``) or the torch chains (``reference_norms``; rows of older results
    without a label ran those)."""
    from tree_kernels import fused_norms_for

    return "fused_norms" if fused_norms_for(x) else "reference_norms"


def calibrate_budget(target, drafter, prompt_ids, config, candidates=CANDIDATES, tokens: int = 48) -> tuple[int, dict]:
    """Time a short generation at each candidate budget; return the fastest and the table."""
    from .engine import generate
    from .fastpath import FastEngine, FastPathUnsupported

    table = {}
    for budget in candidates:
        cfg = dataclasses.replace(config, method="ddtree", budget=budget, max_new_tokens=tokens, trace_topk=0, draft_trace_k=0)
        try:
            engine = FastEngine(target, drafter, cfg, max_len=len(prompt_ids) + tokens + 8)
            engine.generate(prompt_ids)  # warm-up (graph capture on CUDA)
            trace = engine.generate(prompt_ids)
        except FastPathUnsupported:
            generate(target, prompt_ids, cfg, drafter)
            trace = generate(target, prompt_ids, cfg, drafter)
        table[budget] = trace.tokens_per_second
    best = max(table, key=table.get)
    return best, {"source": "calibration", "table": table}


def auto_budget(target, drafter, prompt_ids, config) -> tuple[int, dict]:
    found = measured_best_budget(target, drafter)
    if found is not None:
        return found
    return calibrate_budget(target, drafter, prompt_ids, config)
