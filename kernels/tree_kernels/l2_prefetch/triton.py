"""The L2 warm-up read in Triton (see naive.py): program p streams one contiguous slice of the
words (neighbouring programs, neighbouring DRAM pages) in BLOCK-word tiles and keeps their XOR, so
the loads cannot be dropped as dead code; each program stores its XOR as one partial. With
EVICT_LAST the loads mark their lines to outlive the GEMM's own streaming reads in L2. On the GPU,
PTX 1 / 2 issue prefetch instructions instead of loads (per line / per 4 KB), which the interpreter
cannot run: the loads are what the CPU tests check; the prefetches are what the device measures.

Few programs on purpose: it runs beside the tree kernels on a side stream and must leave them their
SMs; the window it fills (~40-60 us) is longer than the read (32 MB at ~1-2 TB/s)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .naive import prefetch_words

__all__ = ["l2_prefetch", "DEFAULT_CONFIG"]

# unmeasured until the device run that sweeps it (bench.e2e --prefetch-variants)
DEFAULT_CONFIG = {"PROGRAMS": 32, "BLOCK": 2048, "num_warps": 4, "EVICT_LAST": True, "PTX": 0}


@triton.jit
def _l2_prefetch_kernel(W, Out, n_words, words_per_program, BLOCK: tl.constexpr, EVICT_LAST: tl.constexpr,
                        PTX: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * words_per_program
    if PTX == 0:  # loads: the data lands in registers and is XORed (the checksum tests compare)
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
    else:
        # GPU only (inline PTX; Out gets 0, no checksum): PTX 1 is one prefetch.global.L2 per
        # 128-byte line, PTX 2 one cp.async.bulk.prefetch.L2 per 4 KB; neither holds a register
        # waiting for the data, so a program keeps far more bytes in flight than its loads could
        STEP: tl.constexpr = 32 if PTX == 1 else 1024  # words per instruction
        ar = tl.arange(0, BLOCK) * STEP
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for off in range(0, words_per_program, BLOCK * STEP):
            idx = start + off + ar
            m = (idx < n_words) & ((off + ar) < words_per_program)
            ptr = W + tl.where(m, idx, start)  # a lane past the end prefetches the slice's first line again
            if PTX == 1:
                if EVICT_LAST:
                    acc |= tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                                     [ptr], dtype=tl.int32, is_pure=False, pack=1)
                else:
                    acc |= tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptr],
                                                     dtype=tl.int32, is_pure=False, pack=1)
            else:
                acc |= tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 4096;\n\tmov.u32 $0, 0;", "=r,l",
                                                 [ptr], dtype=tl.int32, is_pure=False, pack=1)
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
    ptx = int(cfg["PTX"])
    if ptx not in (0, 1, 2) or (ptx and weight.device.type != "cuda"):
        raise ValueError(f"l2_prefetch: PTX must be 0 (loads), or 1 / 2 (prefetch instructions, CUDA only), got {ptx} "
                         f"on {weight.device}")
    n = words.numel()
    step = (1, 32, 1024)[ptx]  # words per lane per iteration
    if ptx == 2:  # whole 4 KB chunks only: a bulk prefetch must not run past the tensor
        n = n // 1024 * 1024
    per = triton.cdiv(triton.cdiv(max(n, 1), programs), block * step) * block * step
    _l2_prefetch_kernel[(programs,)](words, out, n, per, BLOCK=block, EVICT_LAST=bool(cfg["EVICT_LAST"]), PTX=ptx,
                                     num_warps=int(cfg["num_warps"]))
    return out[:programs]
