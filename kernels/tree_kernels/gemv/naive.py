"""The one-row (and few-row) linear layer: the references.

Shapes: x [M, K] (M = 1 for ``gemv``, the AR step; a few rows for ``gemm_few_rows``, a tree
verify), weight [N, K] (an nn.Linear's, row-major), optional bias [N]. Returns
y [M, N] = x @ weight.T (+ bias) in x's dtype, accumulated in fp32. With so few rows every
weight is read once and used M times, so the time is the weight read and a kernel's only job
is to stream the rows at the memory's bandwidth.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gemv", "gemm_few_rows", "check_linear_inputs"]


def check_linear_inputs(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, one_row: bool) -> None:
    if x.dim() != 2 or (x.shape[0] != 1 if one_row else x.shape[0] < 1):
        raise ValueError(f"{op}: x must be {'[1, K]' if one_row else '[M, K] with M >= 1'}, got {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: weight {tuple(weight.shape)} does not take x {tuple(x.shape)} (want [N, {x.shape[1]}])")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"{op}: bias {tuple(bias.shape)} does not fit weight {tuple(weight.shape)}")


def _linear_fp32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_linear_inputs("gemv", x, weight, bias, one_row=True)
    return _linear_fp32(x, weight, bias)


def gemm_few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_linear_inputs("gemm_few_rows", x, weight, bias, one_row=False)
    return _linear_fp32(x, weight, bias)
