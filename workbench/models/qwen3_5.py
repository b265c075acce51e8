"""Hybrid Qwen3.5 / Qwen3.6 text (``qwen3_5_text``, ``qwen3_5_moe_text``) and Qwen3-Next (``qwen3_next``).

Layers alternate Gated DeltaNet (``linear_attention``) and gated attention (``full_attention``),
3:1 by default. Norms are zero-centred (1 + w). Attention has an output gate (q_proj is twice
as wide), per-head q/k RMSNorm and partial rotary. The GDN mixer:

    x -> in_proj -> (q, k, v | z | b, a)
    q, k, v -> short causal depthwise conv1d (+ SiLU)      <- on a tree: gather table, per mode
    q, k -> l2norm;  beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
    o = gated delta rule (q, k, v, g, beta; state S)        <- on a tree: fork / unsafe / paths / slots
    out = out_proj(RMSNormGated(o, z))

Qwen3-Next fuses the projections (in_proj_qkvz, in_proj_ba) grouped per key head; the maths
after the split is identical. Either way ``pack()`` runs all of the layer's input projections
as one GEMM (common.PackedModule).
"""

from __future__ import annotations

import torch
import tree_kernels as tk
from torch import nn
from tree_kernels import static as static_kernels
from tree_kernels import tree_conv_commit
from tree_kernels.backend import Switch
from tree_kernels.tree_gdn.naive import TreeGDNStash

from .. import verify
from ..tree import CompiledTree
from .common import Attention, CausalLM, DecoderLayer, Linear, PackedModule, make_feed_forward
from .config import TargetConfig


class GatedRMSNorm(nn.Module):
    """RMSNorm (weight ones, not zero-centred) then a SiLU gate, as the GDN output norm."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, gate, dtype=None):
        """``dtype``: normalise x.to(dtype) (the fused kernel casts as it loads)."""
        return tk.gated_rms_norm(x, gate, self.weight, self.eps, dtype)


# The fast path's commit of every GDN layer in two launches (RecurrentStack) instead of two per
# layer. WORKBENCH_STACKED_COMMIT=0 or use_stacked_commit(False) (read when a cache is made) keeps
# the per-layer commits, which bench.e2e --fusion-variants times side by side.
_stacked_commit = Switch("WORKBENCH_STACKED_COMMIT")
stacked_commit_enabled, use_stacked_commit = _stacked_commit.enabled, _stacked_commit.use


class RecurrentCache:
    """A GDN layer's state: S [HV, dk, dv] in fp32 and the conv window [C, W-1].

    A verify pass leaves ``pending`` (how to rebuild any node's state) and the conv inputs;
    ``commit(path)`` keeps the accepted node's state and the conv inputs along its path.
    """

    def __init__(self, heads_v, dk, dv, conv_channels, conv_width, dtype, device):
        # fp32 (fp64 for an fp64 model): the state accumulates over the whole sequence
        self.state = torch.zeros(heads_v, dk, dv, dtype=torch.promote_types(dtype, torch.float32), device=device)
        self.conv_state = torch.zeros(conv_channels, conv_width - 1, dtype=dtype, device=device)
        self.pending: verify.PendingRecurrence | None = None
        self.pending_conv_inputs: torch.Tensor | None = None
        self.pending_mode = "fork"
        self.stack: RecurrentStack | None = None  # set when the state lives in a stack's buffers
        self.stack_index = 0
        self.stacked_nodes: int | None = None  # the last forward's tree size, if it wrote its stash into the stack

    def clone(self) -> "RecurrentCache":
        other = RecurrentCache.__new__(RecurrentCache)
        other.state, other.conv_state = self.state.clone(), self.conv_state.clone()
        other.pending, other.pending_conv_inputs, other.pending_mode = None, None, "fork"
        other.stack, other.stack_index, other.stacked_nodes = None, 0, None  # a clone commits on its own
        return other

    def commit_static(self, start: torch.Tensor, path: torch.Tensor, count: torch.Tensor) -> None:
        """Fast path: in-place commit of a padded path (no host sync, graph-capturable). The
        Triton commits write into the state buffers themselves; the references return copies."""
        state = self.pending.commit_static(path, count, out=self.state)
        if state is not self.state:
            self.state.copy_(state)
        conv = verify.conv_commit_static(self.pending_mode, self.pending_conv_inputs, self.conv_state, path, count, out=self.conv_state)
        if conv is not self.conv_state:
            self.conv_state.copy_(conv)

    def commit(self, path: torch.Tensor) -> None:
        if self.pending is None:
            raise RuntimeError("commit without a forward pass")
        nodes = path.tolist()
        # in place: a captured CUDA graph keeps the addresses of these buffers
        self.state.copy_(self.pending.commit(nodes))
        self.conv_state.copy_(
            tree_conv_commit(self.pending_conv_inputs, self.conv_state, verify.conv_commit_path(self.pending_mode, nodes))
        )
        self.pending = None
        self.pending_conv_inputs = None


class RecurrentStack:
    """Every GDN layer's recurrent buffers, layer-major, so that one launch commits them all.

    The layers' RecurrentCaches keep views: their state is ``state[l]`` ([L, HV, dk, dv]), their
    conv window ``conv_state[l]`` ([L, C, W-1]). A fast-path forward in ``fork`` mode writes each
    layer's stash and conv inputs into slice l of the buffers for its tree size (``tree_buffers``);
    when every layer did, ``commit_static`` commits the states in one launch and the conv windows
    in another (per layer: 96 launches at 27B dims, each paying a launch and a chain of dependent
    loads for 6 MB). Otherwise the layers commit one by one, as they would without a stack.
    """

    def __init__(self, caches: list[RecurrentCache]):
        self.members = caches
        self.state = torch.stack([c.state for c in caches])
        self.conv_state = torch.stack([c.conv_state for c in caches])
        for i, c in enumerate(caches):
            c.state, c.conv_state, c.stack, c.stack_index = self.state[i], self.conv_state[i], self, i
        # per (tree size, input dtype): allocated once and kept, since captured CUDA graphs hold
        # their addresses (one or two sizes per engine)
        self._buffers: dict[tuple, tuple[TreeGDNStash, torch.Tensor]] = {}

    @staticmethod
    def fits(caches: list[RecurrentCache]) -> bool:
        """Whether the caches can share buffers: at least two, every shape and dtype equal."""
        if len(caches) < 2:
            return False
        c0 = caches[0]
        return all(c.state.shape == c0.state.shape and c.state.dtype == c0.state.dtype and c.conv_state.shape == c0.conv_state.shape
                   and c.conv_state.dtype == c0.conv_state.dtype and c.state.device == c0.state.device for c in caches)

    def tree_buffers(self, t: int, x_dtype: torch.dtype) -> tuple[TreeGDNStash, torch.Tensor]:
        """(stash [L, T, ...] fp32, conv inputs [L, T, C]) for trees of ``t`` nodes."""
        key = (t, x_dtype)
        if key not in self._buffers:
            n, hv, dk, dv = self.state.shape
            dev = self.state.device
            stash = TreeGDNStash(k=torch.empty(n, t, hv, dk, dtype=torch.float32, device=dev),
                                 u=torch.empty(n, t, hv, dv, dtype=torch.float32, device=dev),
                                 G=torch.empty(n, t, hv, dtype=torch.float32, device=dev))
            x = torch.empty(n, t, self.conv_state.shape[1], dtype=x_dtype, device=dev)
            self._buffers[key] = (stash, x)
        return self._buffers[key]

    def commit_static(self, path: torch.Tensor, count: torch.Tensor) -> list[RecurrentCache]:
        """Commit every layer in two launches if the last forward stacked them all (the layers
        committed; else nothing is done and none are returned)."""
        sizes = {c.stacked_nodes for c in self.members}
        if len(sizes) != 1 or None in sizes or self.state.dtype != torch.float32:
            return []
        t = sizes.pop()
        stash, x = self.tree_buffers(t, self.members[0].pending_conv_inputs.dtype)
        static_kernels.tree_gdn_commit_layers_static(stash, self.state, path, count)
        static_kernels.conv_commit_layers_static(x, self.conv_state, path, count)
        return self.members


class GatedDeltaNet(PackedModule):
    def __init__(self, config: TargetConfig, fused_projections: bool):
        super().__init__()
        self.hk, self.hv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_width = config.linear_conv_kernel_dim
        self.fused = fused_projections
        hidden = config.hidden_size
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_width, groups=self.conv_dim, bias=False)
        if fused_projections:
            self.in_proj_qkvz = Linear(hidden, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = Linear(hidden, 2 * self.hv, bias=False)
            self.packable = ("in_proj_qkvz", "in_proj_ba")
        else:
            self.in_proj_qkv = Linear(hidden, self.conv_dim, bias=False)
            self.in_proj_z = Linear(hidden, self.value_dim, bias=False)
            self.in_proj_b = Linear(hidden, self.hv, bias=False)
            self.in_proj_a = Linear(hidden, self.hv, bias=False)
            self.packable = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, hidden, bias=False)

    def new_cache(self, max_len: int, dtype, device) -> RecurrentCache:
        return RecurrentCache(self.hv, self.dk, self.dv, self.conv_dim, self.conv_width, dtype, device)

    def project(self, x: torch.Tensor):
        """x [T, hidden] -> conv inputs [T, conv_dim], z [T, HV, dv], b, a [T, HV]."""
        t = x.shape[0]
        if not self.fused:
            qkv, z, b, a = self.projections(x)  # packed: column slices of one GEMM's output
            return qkv, z.view(t, self.hv, self.dv), b, a
        r = self.hv // self.hk
        qkvz, ba = self.projections(x)
        qkvz = qkvz.view(t, self.hk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = torch.split(qkvz, [self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        b, a = torch.split(ba.view(t, self.hk, 2 * r), [r, r], dim=-1)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        return mixed, z.reshape(t, self.hv, self.dv), b.reshape(t, self.hv), a.reshape(t, self.hv)

    def forward(self, x, tree: CompiledTree, cache: RecurrentCache, cos, sin, mode: str):
        t = x.shape[0]
        mixed, z, b, a = self.project(x)
        # a verify's tree kernels below leave HBM idle for tens of us: warm L2 with out_proj meanwhile
        warmup = tk.l2_prefetch_start(self.out_proj.weight) if t > 1 else None
        # the fast path in fork mode writes the stash and conv inputs into the stack's buffers,
        # so that the commit after the walk is one launch for every layer (RecurrentStack)
        stacked = None
        if cache.stack is not None and tree.prefix_t is not None and mode == "fork" and not tree.commit_in_forward:
            stash_l, x_all = cache.stack.tree_buffers(t, mixed.dtype)
            i = cache.stack_index
            stacked = TreeGDNStash(k=stash_l.k[i], u=stash_l.u[i], G=stash_l.G[i]), x_all[i]
        weight, x_out = self.conv1d.weight[:, 0, :], stacked[1] if stacked else None
        if tree.commit_in_forward:  # the AR step: gates, recurrence and the state's update, one launch
            conv_out = verify.tree_conv(mode, mixed, cache.conv_state, weight, None, tree)
            q, k, v = torch.split(conv_out, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
            q, k = q.reshape(t, self.hk, self.dk), k.reshape(t, self.hk, self.dk)
            o, pending = verify.gdn_decode_in_place(mode, q, k, v.reshape(t, self.hv, self.dv), b, a, self.A_log, self.dt_bias,
                                                    cache.state, tree, scale=self.dk**-0.5)
        else:
            # the tree conv, then l2-normed q, k (fp32), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)
            q, k, v, beta, g = verify.tree_conv_gates(mode, mixed, cache.conv_state, weight, tree, b, a, self.A_log,
                                                      self.dt_bias, self.key_dim, self.dk, x_out=x_out)
            o, pending = verify.tree_recurrence(mode, q, k, v.reshape(t, self.hv, self.dv), g, beta, cache.state, tree,
                                                scale=self.dk**-0.5, stash_out=stacked[0] if stacked else None)
        cache.pending, cache.pending_conv_inputs, cache.pending_mode = pending, mixed, mode
        # stacked only if the fork really wrote there (a one-node tree takes the decode step instead)
        cache.stacked_nodes = t if stacked and verify.pending_uses_stash(pending, stacked[0]) else None
        o = self.norm(o, z, x.dtype)  # o is fp32: the norm rounds it to the activations' dtype first
        tk.l2_prefetch_join(warmup)
        return self.out_proj(o.reshape(t, self.value_dim))


class Qwen3_5ForCausalLM(CausalLM):
    """Qwen3.5 / Qwen3.6 text, their MoE variants, and Qwen3-Next."""

    def __init__(self, config: TargetConfig):
        if not config.is_hybrid:
            raise ValueError(f"Qwen3_5ForCausalLM cannot build model_type {config.model_type!r}")
        fused = config.model_type == "qwen3_next"
        layers = []
        for i, kind in enumerate(config.layer_types):
            if kind == "linear_attention":
                name, mixer = "linear_attn", GatedDeltaNet(config, fused)
            else:
                name, mixer = "self_attn", Attention(config, i, gated=True, zero_centered_norm=True)
            layers.append(
                DecoderLayer(name, mixer, make_feed_forward(config, i), config.hidden_size, config.rms_norm_eps, True)
            )
        super().__init__(config, layers, zero_centered=True)

    def new_cache(self, max_len: int):
        cache = super().new_cache(max_len)
        recurrent = [c for c in cache.layers if isinstance(c, RecurrentCache)]
        if _stacked_commit.on and RecurrentStack.fits(recurrent):
            cache.shared.append(RecurrentStack(recurrent))
        return cache
