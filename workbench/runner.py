"""Library entry points the CLI, notebooks and benchmarks share.

    resolve_model_dir("tiny-hybrid")         a path, or a name in the bundled zoo (data/zoo/)
    load_target_and_tokenizer(dir)           the model and its tokenizer
    drafter_for(spec, target, prompt, cfg)   a DFlash checkpoint directory, or ``oracle[:opts]``
    run_prompt(...)                          one generation -> Trace
    audit(...)                               AR against a method over a prompt set
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch

from .drafters.dflash import DFlashDrafter, load_dflash
from .drafters.oracle import OracleDrafter, OracleSpec
from .engine import GenerationConfig, generate
from .models import load_target
from .tokenizer import Tokenizer
from .trace import Trace

REPO_ROOT = Path(__file__).resolve().parent.parent
ZOO_DIR = REPO_ROOT / "data" / "zoo"
DEFAULT_TARGET = "tiny-hybrid"
DEFAULT_DRAFTER = "tiny-hybrid-dflash"


def resolve_model_dir(name: str | Path) -> Path:
    """A directory path as given, else a name in the bundled zoo."""
    path = Path(name)
    if path.is_dir():
        return path
    zoo = ZOO_DIR / str(name)
    if zoo.is_dir():
        return zoo
    known = sorted(p.name for p in ZOO_DIR.iterdir() if p.is_dir()) if ZOO_DIR.is_dir() else []
    raise FileNotFoundError(f"{name}: not a directory and not a bundled model (zoo has: {known or 'nothing'})")


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype | None:
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected auto or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def load_target_and_tokenizer(target: str | Path, device: str = "auto", dtype=None):
    directory = resolve_model_dir(target)
    dev = pick_device(device)
    model = load_target(directory, dev, pick_dtype(dtype, dev))
    tokenizer = None
    if (directory / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_directory(directory, model.config.eos_token_ids)
    return model, tokenizer


def is_oracle(spec: str | None) -> bool:
    return spec is not None and (spec == "oracle" or str(spec).startswith("oracle:"))


def load_dflash_drafter(spec: str | Path, target) -> DFlashDrafter:
    model = load_dflash(resolve_model_dir(spec), target.device, target.dtype, target.config)
    drafter = DFlashDrafter(model, target)
    drafter.name = str(spec)
    return drafter


def reference_continuation(target, prompt_ids: list[int], config: GenerationConfig, extra: int) -> list[int]:
    """What the target itself generates (AR, same temperature and seed), ``extra`` tokens past the run."""
    ar = dataclasses.replace(config, method="ar", max_new_tokens=config.max_new_tokens + extra, trace_topk=0)
    return list(prompt_ids) + generate(target, prompt_ids, ar).generated_ids


def drafter_for(spec, target, prompt_ids: list[int], config: GenerationConfig, reference: list[int] | None = None, loaded=None):
    """A drafter for one prompt: a loaded DFlash drafter (reused), or an oracle that knows the continuation."""
    if config.method == "ar":
        return None
    if is_oracle(spec):
        o = OracleSpec.parse(str(spec))
        ref = reference or reference_continuation(target, prompt_ids, config, o.block)
        drafter = OracleDrafter(ref, target.config.vocab_size, o, target.device)
        drafter.name = str(spec)
        return drafter
    if loaded is not None:
        return loaded
    if spec is None:
        raise ValueError(f"method {config.method!r} needs --drafter (a DFlash directory or 'oracle')")
    return load_dflash_drafter(spec, target)


def encode_prompt(tokenizer: Tokenizer | None, prompt: str) -> list[int]:
    if tokenizer is None:
        raise ValueError("this target has no tokenizer.json: text prompts cannot be encoded")
    if not prompt:
        raise ValueError("empty prompt")
    return tokenizer.encode(prompt)


def run_prompt(target, tokenizer, drafter_spec, prompt: str | list[int], config: GenerationConfig, progress=None, loaded_drafter=None) -> Trace:
    ids = prompt if isinstance(prompt, list) else encode_prompt(tokenizer, prompt)
    drafter = drafter_for(drafter_spec, target, ids, config, loaded=loaded_drafter)
    return generate(target, ids, config, drafter, tokenizer, progress)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def audit(
    target,
    tokenizer,
    drafter_spec,
    prompts: list[str] | list[list[int]],
    config: GenerationConfig,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Run AR and ``config.method`` on every prompt; count identical outputs, locate divergences.

    AR runs at the same temperature and seed: with position-keyed sampling a lossless method
    reproduces it token for token at any temperature (T = 0 is the usual audit).
    """
    config.validate()
    loaded = None if is_oracle(drafter_spec) or config.method == "ar" else load_dflash_drafter(drafter_spec, target)
    rows, identical, divergent, taus, siblings = [], 0, [], [], []
    for i, prompt in enumerate(prompts):
        ids = prompt if isinstance(prompt, list) else encode_prompt(tokenizer, prompt)
        extra = OracleSpec.parse(str(drafter_spec)).block if is_oracle(drafter_spec) else 0
        reference = reference_continuation(target, ids, config, extra)
        # AR stops at EOS like the method does; past max_new_tokens it only feeds the oracle
        expected = reference[len(ids) : len(ids) + config.max_new_tokens]
        drafter = drafter_for(drafter_spec, target, ids, config, reference=reference, loaded=loaded)
        trace = generate(target, ids, dataclasses.replace(config, trace_topk=0), drafter, tokenizer)
        got = trace.generated_ids
        pos = first_difference(expected, got)
        taus.append(trace.mean_acceptance)
        siblings.append(trace.sibling_round_fraction)
        if pos is None:
            identical += 1
        else:
            row = {
                "prompt_index": i,
                "position": pos,
                "ar_token": expected[pos] if pos < len(expected) else None,
                "method_token": got[pos] if pos < len(got) else None,
            }
            if tokenizer is not None:
                row["ar_text"] = tokenizer.decode(expected[: pos + 1])[-40:]
                row["method_text"] = tokenizer.decode(got[: pos + 1])[-40:]
            divergent.append(row)
        rows.append({"prompt_index": i, "identical": pos is None, "mean_acceptance": trace.mean_acceptance})
        if progress:
            progress(1)
    return {
        "prompts": len(prompts),
        "identical": identical,
        "divergent": divergent,
        "method": config.method,
        "recurrent": config.recurrent,
        "budget": config.budget,
        "temperature": config.temperature,
        "max_new_tokens": config.max_new_tokens,
        "mean_acceptance": sum(taus) / len(taus) if taus else 0.0,
        "sibling_round_fraction": sum(siblings) / len(siblings) if siblings else 0.0,
        "per_prompt": rows,
    }
