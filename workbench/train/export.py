"""Writing trained models in HF layout: bf16, sharded to a size limit, with a model card.

    export_target(model, dir, tokenizer_dir, card)   config.json, model-0000k-of-0000n.safetensors + index,
                                                     tokenizer.json / tokenizer_config.json, generation_config.json
    export_drafter(model, dir, card)                 the z-lab DFlash layout (config.json + safetensors)
    write_card(dir, card)                            README.md, then card.json with sha256 and size of every file
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..drafters.dflash import DFlashDraftModel, parse_dflash_config, save_dflash
from ..models import CausalLM, build_target, save_target
from .common import TrainError, sha256_file, write_json

MAX_SHARD_BYTES = 12 * 2**20  # each file stays well under the 15 MiB limit
CARD_NAME = "card.json"


def _bf16_copy_target(model: CausalLM) -> CausalLM:
    with torch.device("meta"):
        clone = build_target(model.config)
    clone = clone.to_empty(device="cpu").to(torch.bfloat16)
    clone.tie_weights()
    with torch.no_grad():
        src = model.state_dict()
        for k, v in clone.state_dict().items():
            v.copy_(src[k].detach().cpu().to(torch.bfloat16))
    clone.reset_rotary()
    return clone.eval().requires_grad_(False)


def shard_safetensors(directory: Path, max_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Split ``directory/model.safetensors`` into HF shards with an index when it exceeds ``max_bytes``."""
    single = directory / "model.safetensors"
    if single.stat().st_size <= max_bytes:
        return [single.name]
    with safe_open(str(single), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if nbytes > max_bytes:
            raise TrainError(f"tensor {key} alone is {nbytes} bytes, over the shard limit of {max_bytes}")
        if size + nbytes > max_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key]
        size += nbytes
    n = len(shards)
    weight_map, names = {}, []
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        names.append(name)
        weight_map.update({k: name for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(directory / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    single.unlink()
    return names


def export_target(model: CausalLM, directory: str | Path, tokenizer_dir: str | Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    directory = Path(directory)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    clone = _bf16_copy_target(model)
    clone.config.raw["dtype"] = "bfloat16"
    save_target(clone, directory)
    shard_safetensors(directory, max_shard_bytes)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = Path(tokenizer_dir) / name
        if not src.is_file():
            raise TrainError(f"{tokenizer_dir}: no {name} to ship with the target")
        shutil.copyfile(src, directory / name)
    eos = model.config.raw.get("eos_token_id")
    gen = {"eos_token_id": eos, "pad_token_id": model.config.raw.get("pad_token_id", eos), "do_sample": False}
    write_json(directory / "generation_config.json", gen)
    return directory


def export_drafter(model: DFlashDraftModel, directory: str | Path) -> Path:
    directory = Path(directory)
    if directory.exists():
        shutil.rmtree(directory)
    with torch.device("meta"):
        clone = DFlashDraftModel(parse_dflash_config(model.config.raw))
    clone = clone.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        src = model.state_dict()
        for k, v in clone.state_dict().items():
            v.copy_(src[k].detach().cpu().to(torch.bfloat16))
    clone.config.raw["dtype"] = "bfloat16"
    save_dflash(clone, directory)
    return directory


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _readme(card: dict) -> str:
    lines = [f"# {card.get('name', 'model')}", "", card.get("summary", ""), ""]
    rows = [(k, v) for k, v in card.items() if k not in ("files", "summary", "name", "loss_curve") and not isinstance(v, (dict, list))]
    if rows:
        lines += ["| field | value |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows] + [""]
    for k, v in card.items():
        if isinstance(v, (dict, list)) and k not in ("files", "loss_curve"):
            lines += [f"## {k}", "", "```json", json.dumps(v, indent=2), "```", ""]
    lines += ["Every file's sha256 and size is recorded in `card.json` (tests/test_zoo.py checks them).", ""]
    return "\n".join(lines)


def write_card(directory: str | Path, card: dict) -> dict:
    """README.md from the card, then card.json listing the sha256 and size of every other file."""
    directory = Path(directory)
    for path in directory.iterdir():
        if path.is_file():
            os.chmod(path, 0o644)  # the model savers write through mkstemp (0600)
    (directory / "README.md").write_text(_readme(card))
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != CARD_NAME:
            files[path.name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    card = dict(card, files=files)
    write_json(directory / CARD_NAME, card)
    return card


def check_card(directory: str | Path) -> dict:
    """Every file listed with the right size and hash, and nothing unlisted: else TrainError naming the file."""
    directory = Path(directory)
    path = directory / CARD_NAME
    if not path.is_file():
        raise TrainError(f"{directory}: no {CARD_NAME}")
    card = json.loads(path.read_text())
    listed = card.get("files") or {}
    present = {p.name for p in directory.iterdir() if p.is_file() and p.name != CARD_NAME}
    if present != set(listed):
        raise TrainError(f"{directory}: files {sorted(present ^ set(listed))} are not both present and in the card")
    for name, meta in listed.items():
        p = directory / name
        if p.stat().st_size != meta["bytes"]:
            raise TrainError(f"{p}: {p.stat().st_size} bytes, the card says {meta['bytes']}")
        if sha256_file(p) != meta["sha256"]:
            raise TrainError(f"{p}: sha256 differs from the card")
    return card


def tempdir(prefix: str = "wb-train-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
