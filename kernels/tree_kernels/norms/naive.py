"""Plain-torch references of the decoder layer's row-wise work, in the exact operation order the
model families use (and transformers uses), so the CPU path is unchanged by the fused kernels.

    rms_norm         x * rsqrt(mean(x^2) + eps), then (1 + w) in fp32 (zero-centred: Qwen3.5/Next)
                     or w * (x̂ cast to x's dtype) (Qwen3)
    gated_rms_norm   the GDN output norm: w * (x̂ cast) * silu(gate), cast to x's dtype
    gdn_gates        l2norm(q), l2norm(k) (fp32), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)
    rotary           x * cos + rotate_half(x) * sin on the first R channels of each head (partial rotary)
    silu_mul         silu(gate) * up (the gated MLP's activation)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        return (normed * (1.0 + weight.float())).type_as(x)
    return weight * normed.to(x.dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool):
    """The residual add and the norm after it: (x + delta, rms_norm(x + delta))."""
    h = x + delta
    return h, rms_norm(h, weight, eps, zero_centered)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    if out_dtype is not None:
        x = x.to(out_dtype)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * normed.to(x.dtype) * F.silu(gate.float())).to(x.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gdn_gates(q, k, b, a, A_log, dt_bias, up_dtype=torch.float32):
    """q, k [T, H, dk] (any dtype) -> l2-normed in ``up_dtype``; b, a [T, HV] -> beta (b's dtype), g (fp32)."""
    qn = l2norm(q.to(up_dtype))
    kn = l2norm(k.to(up_dtype))
    beta = torch.sigmoid(b)
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return qn, kn, beta, g


def qk_norm_rotary(q, k, wq, wk, eps: float, zero_centered: bool, cos, sin):
    """Attention's q / k path: the per-head RMSNorm, then rotary, for each."""
    return (rotary(rms_norm(q, wq, eps, zero_centered), cos, sin),
            rotary(rms_norm(k, wk, eps, zero_centered), cos, sin))


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos, sin [T, R] with R <= D (rotate-half layout). Channels past R pass through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


def sigmoid_mul(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The attention output gate: x * sigmoid(gate)."""
    return x * torch.sigmoid(gate)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up
