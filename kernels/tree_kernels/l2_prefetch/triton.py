"""The L2 warm-up read in Triton (see naive.py): program p streams one contiguous slice of the
words (neighbouring programs, neighbouring DRAM pages) in BLOCK-word tiles and keeps their XOR, so
the loads cannot be dropped as dead code; each program stores its XOR as one partial. With
EVICT_LAST the loads mark their lines to outlive the GEMM's own streaming reads in L2.

Few programs on purpose: it runs beside the tree kernels on a side stream and must leave them their
SMs; the window it fills (~40-60 us) is longer than the read (32 MB at ~1-2 TB/s)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .naive import prefetch_words

__all__ = ["l2_prefetch", "DEFAULT_CONFIG"]

# unmeasured until the device run that sweeps it (bench.e2e --prefetch-variants)
DEFAULT_CONFIG = {"PROGRAMS": 32, "BLOCK": 2048, "num_warps": 4, "EVICT_LAST": True}


@triton.jit
def _l2_prefetch_kernel(W, Out, n_words, words_per_program, BLOCK: tl.constexpr, EVICT_LAST: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * words_per_program
    ar = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for off in range(0, words_per_program, BLOCK):
        idx = start + off + ar
        m = (idx < n_words) & ((off + ar) < words_per_program)
        if EVICT_LAST:
            x = tl.load(W + idx, mask=m, other=0, eviction_policy="evict_last")
        else:
            x = tl.load(W + idx, mask=m, other=0)
        acc = acc ^ x
    tl.store(Out + pid, tl.xor_sum(acc, axis=0))


def l2_prefetch(weight: torch.Tensor, nbytes: int, config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Read the first ``nbytes`` of ``weight`` (one launch on the current stream). Returns the
    per-program XOR partials (int32 [PROGRAMS]; their XOR is naive.l2_prefetch_checksum), written
    into ``out`` when given (a persistent scratch: nothing reads it but tests)."""
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    words = prefetch_words(weight, nbytes)
    programs, block = int(cfg["PROGRAMS"]), int(cfg["BLOCK"])
    if programs < 1 or block < 1 or block & (block - 1):
        raise ValueError(f"l2_prefetch: PROGRAMS must be >= 1 and BLOCK a power of two, got {programs}, {block}")
    if out is None:
        out = torch.zeros(programs, dtype=torch.int32, device=weight.device)
    elif out.dtype != torch.int32 or out.numel() < programs or out.device != weight.device:
        raise ValueError(f"l2_prefetch: out must be int32 with >= {programs} elements on {weight.device}, "
                         f"got {out.dtype} [{out.numel()}] on {out.device}")
    n = words.numel()
    per = triton.cdiv(triton.cdiv(max(n, 1), programs), block) * block
    _l2_prefetch_kernel[(programs,)](words, out, n, per, BLOCK=block, EVICT_LAST=bool(cfg["EVICT_LAST"]),
                                     num_warps=int(cfg["num_warps"]))
    return out[:programs]
