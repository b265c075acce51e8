"""A batched forward of the workbench's own targets, for training and bulk generation.

The inference classes run one sequence, tokens first (``[T, hidden]``), with tree caches. Training
wants ``[B, T]`` batches with gradients. This module runs the *same modules and parameters*
batched; it reimplements only the sequence mixers:

    attention     causal SDPA over the batch (q/k norms, partial rotary, GQA, output gate as the model)
    Gated DeltaNet  the chunked WY form of the gated delta rule (chunks of 64, one triangular solve
                  per chunk, the state carried chunk to chunk): the chain case of the ancestor-masked
                  form in tree-recurrence.md, so the maths is the model's ``fork`` mode exactly
    short conv    a causal depthwise ``F.conv1d``

Everything else (projections, norms, MLP / MoE, embeddings, lm_head) is the model's own module.
``tests/test_train.py`` checks logits and taps against ``CausalLM.forward`` (run_chain) and the
prefill + decode path against token-by-token decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tree_kernels.norms.naive import l2norm

from ..models.common import Attention, CausalLM
from ..models.qwen3_5 import GatedDeltaNet

GDN_CHUNK = 64


# ----------------------------------------------------------------------------------------------
# gated delta rule, batched


def _expand(x: torch.Tensor, hv: int) -> torch.Tensor:
    h = x.shape[2]
    return x if h == hv else x.repeat_interleave(hv // h, dim=2)


def chunk_gated_delta_rule(q, k, v, g, beta, scale, state=None, chunk: int = GDN_CHUNK):
    """Gated delta rule over whole sequences, chunk by chunk.

    q, k [B, T, H, dk]; v [B, T, HV, dv]; g, beta [B, T, HV]; state [B, HV, dk, dv] or None (zeros).
    Computed in fp32 (fp64 stays fp64). Returns (o [B, T, HV, dv], final state [B, HV, dk, dv]).

    Within a chunk (positions i, j; G = cumulative log decay):
        L[i, j] = beta_i exp(G_i - G_j) k_i.k_j  (j < i),   (I + L) [U | W] = [beta v | beta exp(G) k]
        u = U - W S,   o = exp(G) (q S) + (exp(G_i - G_j) q_i.k_j)_{j <= i} u
        S' = exp(G_last) S + sum_j exp(G_last - G_j) k_j u_j^T
    """
    up = torch.promote_types(v.dtype, torch.float32)
    b, t, hv, dv = v.shape
    dk = q.shape[-1]
    q = _expand(q.to(up), hv) * scale
    k = _expand(k.to(up), hv)
    v, g, beta = v.to(up), g.to(up), beta.to(up)
    pad = (-t) % chunk
    if pad:  # zero k, v, q, beta and zero log decay: padded steps leave the state untouched
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (t + pad) // chunk

    def blocks(x):  # [B, T, HV, d] -> [B, HV, N, C, d]
        return x.view(b, n, chunk, hv, -1).permute(0, 3, 1, 2, 4)

    qc, kc, vc = blocks(q), blocks(k), blocks(v)
    gc = g.view(b, n, chunk, hv).permute(0, 3, 1, 2)  # [B, HV, N, C]
    bc = beta.view(b, n, chunk, hv).permute(0, 3, 1, 2)
    G = gc.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()
    diff = G[..., :, None] - G[..., None, :]
    # select before exp: above the diagonal G_i - G_j > 0 and may overflow
    decay = torch.exp(torch.where(lower, diff, torch.full_like(diff, float("-inf"))))
    strict = lower & ~torch.eye(chunk, dtype=torch.bool, device=v.device)
    L = torch.where(strict, bc[..., None] * decay * (kc @ kc.transpose(-1, -2)), torch.zeros_like(decay))
    eG = torch.exp(G)[..., None]
    rhs = torch.cat([bc[..., None] * vc, bc[..., None] * eG * kc], dim=-1)
    eye = torch.eye(chunk, dtype=up, device=v.device)
    UW = torch.linalg.solve_triangular(eye + L, rhs, upper=False, unitriangular=True)
    U, W = UW[..., :dv], UW[..., dv:]
    QK = decay * (qc @ kc.transpose(-1, -2))
    to_end = torch.exp(G[..., -1:] - G)[..., None]  # [B, HV, N, C, 1]
    S = torch.zeros(b, hv, dk, dv, dtype=up, device=v.device) if state is None else state.to(up)
    outs = []
    for c in range(n):
        u = U[:, :, c] - W[:, :, c] @ S
        outs.append(eG[:, :, c] * (qc[:, :, c] @ S) + QK[:, :, c] @ u)
        S = torch.exp(G[:, :, c, -1])[..., None, None] * S + (kc[:, :, c] * to_end[:, :, c]).transpose(-1, -2) @ u
    o = torch.stack(outs, dim=2).permute(0, 2, 3, 1, 4).reshape(b, n * chunk, hv, dv)
    return o[:, :t], S


def gated_delta_step(q, k, v, g, beta, scale, state):
    """One token for a batch of states: q, k [B, H, dk]; v [B, HV, dv]; g, beta [B, HV]; state [B, HV, dk, dv]."""
    up = state.dtype
    hv = v.shape[1]
    q = _expand(q[:, None].to(up), hv)[:, 0] * scale
    k = _expand(k[:, None].to(up), hv)[:, 0]
    S = state * torch.exp(g.to(up))[..., None, None]
    u = beta.to(up)[..., None] * (v.to(up) - torch.einsum("bhkv,bhk->bhv", S, k))
    S = S + k[..., :, None] * u[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


# ----------------------------------------------------------------------------------------------
# caches for batched prefill + decode (bulk greedy generation)


@dataclass
class BatchedCache:
    capacity: int
    length: int = 0
    kv: dict = field(default_factory=dict)  # layer -> (k [B, cap, kv, d], v)
    state: dict = field(default_factory=dict)  # layer -> S [B, HV, dk, dv]
    conv: dict = field(default_factory=dict)  # layer -> last W-1 conv inputs [B, W-1, C]


def _rotary_batched(x, cos, sin):
    """x [B, T, H, D]; cos, sin [T, R] (shared positions)."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos[None, :, None, :] + rotated * sin[None, :, None, :]
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


def attention_forward(attn: Attention, x, cos, sin, positions, cache: BatchedCache | None, layer: int):
    b, t, _ = x.shape
    h, kvh, d = attn.heads, attn.kv_heads, attn.head_dim
    q, k, v = attn.projections(x)  # one GEMM when the model is packed (inference), else one each
    if attn.gated:
        q, gate = q.view(b, t, h, 2 * d).chunk(2, dim=-1)
        gate = gate.reshape(b, t, h * d)
    q = attn.q_norm(q.reshape(b, t, h, d))
    k = attn.k_norm(k.view(b, t, kvh, d))
    v = v.view(b, t, kvh, d)
    q, k = _rotary_batched(q, cos, sin), _rotary_batched(k, cos, sin)
    start = 0
    if cache is not None:
        start = cache.length
        if layer not in cache.kv:
            shape = (b, cache.capacity, kvh, d)
            cache.kv[layer] = (torch.zeros(shape, dtype=k.dtype, device=k.device), torch.zeros(shape, dtype=v.dtype, device=v.device))
        kc, vc = cache.kv[layer]
        kc[:, start : start + t] = k
        vc[:, start : start + t] = v
        k, v = kc[:, : start + t], vc[:, : start + t]
    key_pos = torch.arange(start + t, device=x.device)
    mask = None
    causal = True
    if attn.window is not None or start > 0:
        visible = key_pos[None, :] <= positions[:, None]
        if attn.window is not None:
            visible &= (positions[:, None] - key_pos[None, :]) < attn.window
        mask, causal = visible[None, None], False
    group = h // kvh
    kk = k.to(q.dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    vv = v.to(q.dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=mask, is_causal=causal and mask is None, scale=attn.scale)
    o = o.transpose(1, 2).reshape(b, t, h * d)
    if attn.gated:
        o = o * torch.sigmoid(gate)
    return attn.o_proj(o)


def gdn_forward(gdn: GatedDeltaNet, x, cache: BatchedCache | None, layer: int):
    b, t, hidden = x.shape
    mixed, z, bb, a = gdn.project(x.reshape(b * t, hidden))  # the model's own projections (fused or not)
    mixed = mixed.view(b, t, -1)
    z = z.view(b, t, gdn.hv, gdn.dv)
    bb, a = bb.view(b, t, gdn.hv), a.view(b, t, gdn.hv)
    w = gdn.conv1d.weight[:, 0, :]  # [C, W]
    width = w.shape[-1]
    if cache is not None and layer in cache.conv:
        history = torch.cat([cache.conv[layer].to(mixed.dtype), mixed], dim=1)
    else:
        history = F.pad(mixed, (0, 0, width - 1, 0))
    if cache is not None:
        cache.conv[layer] = history[:, -(width - 1) :].detach().clone()
    conv = F.conv1d(history.transpose(1, 2).to(w.dtype), w[:, None, :], groups=w.shape[0])  # [B, C, T]
    conv = F.silu(conv).transpose(1, 2).to(mixed.dtype)
    q, k, v = torch.split(conv, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
    up = torch.promote_types(x.dtype, torch.float32)
    q = l2norm(q.reshape(b, t, gdn.hk, gdn.dk).to(up))
    k = l2norm(k.reshape(b, t, gdn.hk, gdn.dk).to(up))
    v = v.reshape(b, t, gdn.hv, gdn.dv)
    beta = torch.sigmoid(bb)
    g = -gdn.A_log.float().exp() * F.softplus(a.float() + gdn.dt_bias)
    state = cache.state.get(layer) if cache is not None else None
    scale = gdn.dk**-0.5
    device_type = x.device.type
    with torch.autocast(device_type, enabled=False):  # the recurrence is fp32, as in the model
        if t == 1 and state is not None:
            o, S = gated_delta_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], scale, state)
            o = o[:, None]
        else:
            o, S = chunk_gated_delta_rule(q, k, v, g, beta, scale, state)
    if cache is not None:
        cache.state[layer] = S.detach()
    o = gdn.norm(o.to(x.dtype), z)
    return gdn.out_proj(o.reshape(b, t, gdn.value_dim))


def _feed_forward(mlp, x):
    b, t, hdim = x.shape
    return mlp(x.reshape(b * t, hdim)).view(b, t, hdim)  # per-token (dense MLP or routed experts)


def batched_hidden(model: CausalLM, tokens: torch.Tensor, taps=(), cache: BatchedCache | None = None):
    """tokens [B, T] -> (final-normed hidden [B, T, H], taps [B, T, n_taps * H] or None).

    With ``cache`` the tokens continue after ``cache.length`` committed ones (all rows alike).
    """
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [batch, time], got shape {tuple(tokens.shape)}")
    start = cache.length if cache is not None else 0
    t = tokens.shape[1]
    x = model.embed(tokens)
    positions = torch.arange(start, start + t, device=tokens.device)
    cos, sin = model.rotary.cos_sin(positions, x.dtype)
    wanted = {layer: i for i, layer in enumerate(taps)}
    captured = [None] * len(taps)
    for i, layer in enumerate(model.model.layers):
        h = layer.input_layernorm(x)
        if layer.mixer_name == "linear_attn":
            mixed = gdn_forward(layer.mixer, h, cache, i)
        else:
            mixed = attention_forward(layer.mixer, h, cos, sin, positions, cache, i)
        x = x + mixed
        x = x + _feed_forward(layer.mlp, layer.post_attention_layernorm(x))
        if i in wanted:
            captured[wanted[i]] = x
    if cache is not None:
        cache.length = start + t
    tap_tensor = torch.cat(captured, dim=-1) if taps else None
    return model.model.norm(x), tap_tensor


def batched_logits(model: CausalLM, tokens: torch.Tensor, taps=(), cache: BatchedCache | None = None):
    h, tap_tensor = batched_hidden(model, tokens, taps, cache)
    return model.lm_head(h), tap_tensor


@torch.no_grad()
def greedy_generate(model: CausalLM, prompts: torch.Tensor, new_tokens: int, autocast=None, taps=(), tap_dtype=None):
    """Greedy continuations of equal-length prompts [B, P] -> [B, P + new_tokens] (prefill, then decode).

    With ``taps`` also returns the tapped layers' outputs at every position but the last
    ([B, P + new_tokens, n_taps * H], last row zero: that token is never fed back), as the
    DFlash drafter's context features: (tokens, features).
    """
    import contextlib

    ctx = autocast if autocast is not None else contextlib.nullcontext()
    b, p = prompts.shape
    cache = BatchedCache(capacity=p + new_tokens)
    out = torch.empty(b, p + new_tokens, dtype=torch.int64, device=prompts.device)
    out[:, :p] = prompts
    feats = None
    with ctx:
        logits, tap = batched_logits(model, prompts, taps, cache=cache)
        if taps:
            feats = torch.zeros(b, p + new_tokens, tap.shape[-1], dtype=tap_dtype or tap.dtype, device=prompts.device)
            feats[:, :p] = tap
        nxt = logits[:, -1].float().argmax(-1)
        for i in range(new_tokens):
            out[:, p + i] = nxt
            if i + 1 == new_tokens:
                break
            logits, tap = batched_logits(model, nxt[:, None], taps, cache=cache)
            if taps:
                feats[:, p + i] = tap[:, 0]
            nxt = logits[:, -1].float().argmax(-1)
    return (out, feats) if taps else out
