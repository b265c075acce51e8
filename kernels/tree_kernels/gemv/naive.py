"""The one-row (and few-row) linear layer: the references.

Shapes: x [1, K], weight [N, K] (an nn.Linear's, row-major), optional bias [N]. Returns
y [1, N] = x @ weight.T (+ bias) in x's dtype, accumulated in fp32. This is the AR step's GEMM:
one token reads every weight once, so its time is the weight read and the kernel's only job is
to stream the rows at the memory's bandwidth.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["gemv", "gemm_few_rows", "check_gemv_inputs", "check_few_rows_inputs"]


def check_gemv_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"gemv: x must be [1, K], got {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"gemv: weight {tuple(weight.shape)} does not take x {tuple(x.shape)} (want [N, {x.shape[1]}])")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"gemv: bias {tuple(bias.shape)} does not fit weight {tuple(weight.shape)}")


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_gemv_inputs(x, weight, bias)
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


def check_few_rows_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.shape[0] < 1:
        raise ValueError(f"gemm_few_rows: x must be [M, K] with M >= 1, got {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"gemm_few_rows: weight {tuple(weight.shape)} does not take x {tuple(x.shape)} (want [N, {x.shape[1]}])")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"gemm_few_rows: bias {tuple(bias.shape)} does not fit weight {tuple(weight.shape)}")


def gemm_few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] = x [M, K] @ weight.T (+ bias) for the few rows of a tree verify (M up to ~128):
    still a weight read, so the same job as the GEMV with the rows side by side."""
    check_few_rows_inputs(x, weight, bias)
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)
