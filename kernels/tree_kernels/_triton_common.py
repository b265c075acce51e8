"""Small host-side helpers shared by the Triton tree kernels (imported only with triton).

Nothing here launches a kernel: device properties, index tensors that are reused across the
layers of one verify round (the accepted path is the same for every layer), and scratch
buffers that persist between launches (split-K partials and arrival counters).
"""

from __future__ import annotations

import contextlib

from collections import OrderedDict

import torch

_SM_COUNT: dict = {}
_INDEX_CACHE: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
_INDEX_CACHE_SIZE = 8
_SCRATCH: dict = {}


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the device (a nominal 132 on CPU, for interpreter runs)."""
    if device.type != "cuda":
        return 132
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SM_COUNT:
        _SM_COUNT[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SM_COUNT[key]


def index_tensor(values, device: torch.device) -> torch.Tensor:
    """An int64 device tensor of ``values``, cached: every layer of a round commits the same path,
    so the host-to-device copy happens once per round instead of once per layer."""
    key = (str(device), tuple(int(x) for x in values))
    t = _INDEX_CACHE.get(key)
    if t is None:
        t = torch.tensor(key[1], dtype=torch.int64, device=device)
        _INDEX_CACHE[key] = t
        if len(_INDEX_CACHE) > _INDEX_CACHE_SIZE:
            _INDEX_CACHE.popitem(last=False)
    else:
        _INDEX_CACHE.move_to_end(key)
    return t


def path_operand(path, device: torch.device) -> tuple[torch.Tensor | None, int, bool]:
    """(device index tensor or None, length, is the range 0..P-1) for a commit path.

    Device tensors are used as they are (no host sync: the kernels read the last node
    themselves); host lists become a cached device tensor, or nothing when they are 0..P-1.
    """
    if isinstance(path, torch.Tensor):
        if path.dim() != 1 or path.numel() == 0:
            raise ValueError(f"commit path must be a non-empty 1-d tensor, got shape {tuple(path.shape)}")
        if path.device != device:
            path = path.to(device)
        if path.dtype not in (torch.int32, torch.int64):
            path = path.to(torch.int64)
        return path.contiguous(), path.numel(), False
    path = [int(p) for p in path]
    if not path:
        raise ValueError("commit path is empty")
    if path == list(range(len(path))):
        return None, len(path), True
    return index_tensor(path, device), len(path), False


def scratch(name: str, numel: int, dtype: torch.dtype, device: torch.device, zero: bool = False) -> torch.Tensor:
    """A grow-only buffer kept between launches (same stream: launches never overlap).

    ``zero``: the buffer is zero-filled when (re)allocated; kernels that use it as counters
    must leave it zero again when they finish.
    """
    key = (name, str(device), dtype, _SCOPE[-1])
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < numel:
        size = max(int(numel), 1024)
        buf = torch.zeros(size, dtype=dtype, device=device) if zero else torch.empty(size, dtype=dtype, device=device)
        _SCRATCH[key] = buf
    return buf


def mask_as_uint8(mask: torch.Tensor) -> torch.Tensor:
    """A 0/1 mask as uint8 for a kernel's loads: a free reinterpretation of a bool tensor eagerly;
    under torch.compile a cast (inductor cannot lower a bool -> uint8 dtype view)."""
    if mask.dtype == torch.bool and not torch.compiler.is_compiling():
        return mask.view(torch.uint8)
    return (mask != 0).to(torch.uint8)


def as_last_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Kernels take arbitrary leading strides but need unit stride in the last dimension."""
    return x if x.stride(-1) == 1 else x.contiguous()


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 operands: 3xTF32 on tensor cores (about fp32 accuracy); half types: native (the
    setting only matters for fp32 operands, "tf32" is Triton's default there)."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


_FAILED_CONFIGS: set = set()


def launch_with_fallback(launch, configs: list[dict], key) -> dict:
    """Run ``launch(cfg)`` with the first config that fits the device.

    A config whose kernel needs more shared memory (or registers) than the device has raises
    OutOfResources when it is first launched; it is remembered (per ``key``) and the next,
    smaller one is tried. Returns the config that ran.
    """
    from triton.runtime.errors import OutOfResources

    last = None
    for cfg in configs:
        k = (key, tuple(sorted(cfg.items())))
        if k in _FAILED_CONFIGS:
            continue
        try:
            launch(cfg)
            return cfg
        except OutOfResources as exc:
            _FAILED_CONFIGS.add(k)
            last = exc
    raise last if last is not None else RuntimeError("no kernel configuration left to try")


_SCOPE: list = [None]


@contextlib.contextmanager
def scratch_scope(tag):
    """Private scratch buffers for a CUDA graph: the graph keeps pointing at the buffers it was
    captured with, so later eager calls (which may grow the shared ones) must not touch them."""
    _SCOPE.append(tag)
    try:
        yield
    finally:
        _SCOPE.pop()
