"""Warming L2 with the leading bytes of a weight before the GEMM that reads it: the reference.

In a verify pass every GDN layer runs ~60 us of latency-bound tree kernels (conv, prepare, fork,
norm) between two weight-streaming GEMMs, and every attention layer ~40 us; HBM sits nearly idle
there. Read on a side stream in that window, the first part of the next output projection's weight
is in L2 when its GEMM starts. The read changes nothing the model computes, so the one thing to
check is that exactly the asked-for bytes were read: kernel and reference both return the XOR of
the range's 32-bit words (exact and independent of order), the kernel as one partial per program.

Shapes: ``weight`` any contiguous tensor; ``nbytes`` how many leading bytes to read, capped at the
tensor's size and rounded down to whole 64-byte units (16 words, so the kernel's loads stay 16-byte
vectors; a weight is many MB, the rounding loses nothing that matters).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["prefetch_words", "l2_prefetch_checksum"]


def prefetch_words(weight: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The int32 words the prefetch reads: the first ``nbytes`` of ``weight``'s storage, rounded
    down to whole 64-byte units. Raises on a tensor whose bytes are not one contiguous range of words."""
    if not weight.is_contiguous():
        raise ValueError(f"l2_prefetch: weight of shape {tuple(weight.shape)} is not contiguous")
    total = weight.numel() * weight.element_size()
    if total % 4 or weight.data_ptr() % 4:
        raise ValueError(f"l2_prefetch: weight of {total} bytes at {weight.data_ptr():#x} is not whole 32-bit words")
    if nbytes < 0:
        raise ValueError(f"l2_prefetch: nbytes must be >= 0, got {nbytes}")
    words = min(int(nbytes), total) // 64 * 16
    return weight.reshape(-1).view(torch.uint8).view(torch.int32)[:words]


def l2_prefetch_checksum(weight: torch.Tensor, nbytes: int) -> int:
    """XOR of the words a prefetch of ``nbytes`` reads (0 for none)."""
    words = prefetch_words(weight, nbytes).cpu().numpy()
    return int(np.bitwise_xor.reduce(words)) if words.size else 0
