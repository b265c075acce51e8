"""Safetensors checkpoints in HF layout: header checks before any tensor is read, loading, saving.

Only safetensors are read (no pickles, no remote code). A checkpoint is checked against the
module it is loaded into by key and shape, from the file headers alone; every problem names
the key and, for shapes, both shapes.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model it is loaded into."""


@dataclass(frozen=True)
class TensorHeader:
    file: Path
    key: str  # the key inside the file
    shape: tuple[int, ...]
    dtype: str


def safetensors_files(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({directory / f for f in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index}: shard files listed but absent: {missing}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        hint = f" (found {pickles}: pickled weights are never loaded; convert them to safetensors)" if pickles else ""
        raise CheckpointError(f"{directory}: no *.safetensors files{hint}")
    return files


def read_headers(directory: str | Path) -> dict[str, TensorHeader]:
    headers: dict[str, TensorHeader] = {}
    for path in safetensors_files(directory):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                if key in headers:
                    raise CheckpointError(f"{directory}: key {key!r} appears in both {headers[key].file.name} and {path.name}")
                headers[key] = TensorHeader(path, key, tuple(sl.get_shape()), str(sl.get_dtype()))
    return headers


# A "source" says how one module tensor is made from checkpoint tensors.
@dataclass(frozen=True)
class Source:
    parts: tuple[TensorHeader, ...]
    combine: str = "direct"  # direct | stack (experts [E, ...]) | stack_gate_up (experts [E, 2I, H])

    @property
    def shape(self) -> tuple[int, ...]:
        if self.combine == "direct":
            return self.parts[0].shape
        first = self.parts[0].shape
        if self.combine == "stack":
            return (len(self.parts), *first)
        return (len(self.parts) // 2, 2 * first[0], *first[1:])


_EXPERT = re.compile(r"^(?P<layer>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def group_expert_keys(headers: dict[str, TensorHeader]) -> dict[str, Source]:
    """Map checkpoint keys to module keys, stacking per-expert matrices (hub layout) into the
    [E, 2I, H] / [E, H, I] tensors the module holds."""
    sources: dict[str, Source] = {}
    experts: dict[str, dict[str, dict[int, TensorHeader]]] = {}
    for key, h in headers.items():
        m = _EXPERT.match(key)
        if m:
            experts.setdefault(m["layer"], {}).setdefault(m["proj"], {})[int(m["e"])] = h
        else:
            sources[key] = Source((h,))
    for prefix, projs in experts.items():
        count = max(len(v) for v in projs.values())
        for proj in ("gate_proj", "up_proj", "down_proj"):
            have = projs.get(proj, {})
            missing = [e for e in range(count) if e not in have]
            if missing:
                raise CheckpointError(f"missing key {prefix}.{missing[0]}.{proj}.weight (experts {missing[:8]} absent)")
        gate = [projs["gate_proj"][e] for e in range(count)]
        up = [projs["up_proj"][e] for e in range(count)]
        down = [projs["down_proj"][e] for e in range(count)]
        for group in (gate, up, down):
            shapes = {g.shape for g in group}
            if len(shapes) > 1:
                raise CheckpointError(f"{prefix}: experts disagree on shape for {group[0].key.split('.')[-2]}: {sorted(shapes)}")
        sources[f"{prefix}.gate_up_proj"] = Source(tuple(gate + up), "stack_gate_up")
        sources[f"{prefix}.down_proj"] = Source(tuple(down), "stack")
    return sources


def check_against(module: nn.Module, sources: dict[str, Source], where: str, ignore: tuple[str, ...] = ()) -> None:
    """Every module tensor present with its shape, nothing left over: else one error naming all."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items() if k not in ignore}
    problems = []
    for key, shape in expected.items():
        if key not in sources:
            problems.append(f"missing key {key!r} (expected shape {list(shape)})")
        elif sources[key].shape != shape:
            problems.append(f"key {key!r}: checkpoint shape {list(sources[key].shape)} but the model needs {list(shape)}")
    extra = sorted(k for k in sources if k not in expected and k not in ignore)
    for key in extra[:20]:
        problems.append(f"unexpected key {key!r} (shape {list(sources[key].shape)})")
    if len(extra) > 20:
        problems.append(f"... and {len(extra) - 20} more unexpected keys")
    if problems:
        raise CheckpointError(f"{where}: checkpoint does not fit the model:\n  " + "\n  ".join(problems))


def _read(source: Source, files: dict[Path, object]) -> torch.Tensor:
    tensors = [files[p.file].get_tensor(p.key) for p in source.parts]  # type: ignore[attr-defined]
    if source.combine == "direct":
        return tensors[0]
    if source.combine == "stack":
        return torch.stack(tensors)
    half = len(tensors) // 2
    return torch.cat([torch.stack(tensors[:half]), torch.stack(tensors[half:])], dim=1)


def load_into(module: nn.Module, sources: dict[str, Source], ignore: tuple[str, ...] = ()) -> None:
    """Copy checked sources into the module's tensors (dtype and device of the module)."""
    state = module.state_dict()
    handles: dict[Path, object] = {}
    try:
        for src in sources.values():
            for p in src.parts:
                if p.file not in handles:
                    handles[p.file] = safe_open(str(p.file), framework="pt").__enter__()
        with torch.no_grad():
            for key, target in state.items():
                if key in ignore:
                    continue
                target.copy_(_read(sources[key], handles).to(target.dtype))
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------------------
# saving


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj) -> None:
    _atomic_write_bytes(Path(path), (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp, metadata={"format": "pt"})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unstack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of group_expert_keys: per-expert matrices, as hub checkpoints store them."""
    out = {}
    for key, t in state.items():
        if key.endswith(".mlp.experts.gate_up_proj"):
            prefix = key[: -len(".gate_up_proj")]
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"] = gate[e]
                out[f"{prefix}.{e}.up_proj.weight"] = up[e]
        elif key.endswith(".mlp.experts.down_proj"):
            prefix = key[: -len(".down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = t[e]
        else:
            out[key] = t
    return out
