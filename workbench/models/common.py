"""Building blocks shared by the target families: norms, rotary, MLP, MoE, attention, the LM shell.

Every layer takes the new tokens of one forward as a ``CompiledTree``: prefill and decode are
chains (a degenerate tree), verify is a real tree. One code path per layer serves all three.
Tensors are batch-1 and tokens-first: hidden states are ``[T, hidden]``.

Module and parameter names mirror transformers' (``model.layers.3.self_attn.q_proj.weight``),
so an HF checkpoint's keys are this module's ``state_dict`` keys. For inference the projections
of one input (q/k/v, gate/up, the GDN in_proj_*) are packed into one GEMM each
(``pack_projections``) without changing those keys: each Linear's weight becomes a view of the
packed tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
import tree_kernels as tk
from torch import nn
from tree_kernels.static import kv_commit_static, kv_write_static, tree_attention_static

from ..tree import CompiledTree, compile_chain
from .config import TargetConfig

# ----------------------------------------------------------------------------------------------
# linear layers: one-row calls (the AR step's) take the Triton GEMV where Triton runs


class Linear(nn.Linear):
    """nn.Linear (same parameters, keys and hooks) whose forward is tree_kernels.linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tk.linear(x, self.weight, self.bias)


# packed projections: the Linear layers of one input as one GEMM (as serving engines do)


class PackedLinears:
    """Linear layers that read the same input, run as one GEMM over their concatenated rows.

    Built by :func:`pack_linears`: each Linear's ``weight`` (and ``bias``) is then a Parameter that
    is a row-slice view of ``self.weight`` (``self.bias``), so there is no second copy, the
    ``state_dict`` keys and values are unchanged, and in-place writes into a Linear's weight
    (checkpoint loads, optimizer steps) land in the packed tensor. The packed tensors are plain
    attributes: neither parameters nor buffers.
    """

    def __init__(self, linears: list[nn.Linear], weight: torch.Tensor, bias: torch.Tensor | None):
        self.linears, self.weight, self.bias = linears, weight, bias
        self.sizes = [lin.out_features for lin in linears]
        starts = [sum(self.sizes[:i]) for i in range(len(linears))]
        # where each Linear's weight (bias) starts, in bytes after the packed tensor's start
        self._offsets = [(r * weight.stride(0) * weight.element_size(), r * weight.element_size()) for r in starts]
        self.ok = True  # the last eager ``intact()``: what a compiled forward reads

    def intact(self) -> bool:
        """Every Linear still holds its slice: not after a reassigned weight or ``param.data = ...``
        (``.to()`` and friends pack again, see PackedModule._apply). Host-side pointer compares only."""
        w0 = self.weight.data_ptr()
        b0 = self.bias.data_ptr() if self.bias is not None else None
        for lin, (w_off, b_off) in zip(self.linears, self._offsets):
            if lin.weight.data_ptr() != w0 + w_off:
                return False
            if b0 is not None and (lin.bias is None or lin.bias.data_ptr() != b0 + b_off):
                return False
        return True

    def usable(self) -> bool:
        """Whether the packed GEMM may stand in for the separate ones now. Not when gradients are
        wanted (they would reach the packed tensor, not the Linears' parameters). Under
        ``torch.compile`` data pointers cannot be traced: the last eager check is used (the
        model refreshes it before running compiled layers, see PackableModel.check_packing)."""
        if torch.is_grad_enabled() and any(p.requires_grad for lin in self.linears for p in (lin.weight, lin.bias) if p is not None):
            return False
        if not torch.compiler.is_compiling():
            self.ok = self.intact()
        return self.ok

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The Linears' outputs, in order: column slices of one GEMM's output."""
        return list(tk.linear(x, self.weight, self.bias).split(self.sizes, dim=-1))


def pack_linears(*linears: nn.Linear) -> PackedLinears | None:
    """Concatenate the Linears' weights (and biases) along the output dim into one new tensor and
    make each Linear's parameters row-slice views of it. None (nothing changed) when they do not
    fit one GEMM: different input sizes, dtypes or devices, or only some with a bias."""
    weights = [lin.weight for lin in linears]
    biases = [lin.bias for lin in linears]
    with_bias = [b is not None for b in biases]
    if len(linears) < 2 or any(with_bias) != all(with_bias):
        return None
    if len({(w.shape[1], w.dtype, w.device) for w in weights}) != 1:
        return None
    if all(with_bias) and len({(b.dtype, b.device) for b in biases}) != 1:
        return None
    with torch.no_grad():
        weight = torch.cat([w.detach() for w in weights])
        bias = torch.cat([b.detach() for b in biases]) if all(with_bias) else None
    rows = 0
    for lin in linears:
        n = lin.out_features
        lin.weight = nn.Parameter(weight[rows : rows + n], requires_grad=lin.weight.requires_grad)
        if bias is not None:
            lin.bias = nn.Parameter(bias[rows : rows + n], requires_grad=lin.bias.requires_grad)
        rows += n
    return PackedLinears(list(linears), weight, bias)


class PackedModule(nn.Module):
    """A module whose Linear layers named in ``packable`` read the same input. ``pack()`` lets
    them run as one GEMM; ``projections(x)`` returns their outputs, packed or not."""

    packable: tuple[str, ...] = ()
    packed: PackedLinears | None = None

    def pack(self) -> None:
        self.packed = pack_linears(*(getattr(self, name) for name in self.packable))

    def projections(self, x: torch.Tensor) -> list[torch.Tensor]:
        p = self.packed
        if p is not None and p.usable():
            return p(x)
        return [getattr(self, name)(x) for name in self.packable]

    def _apply(self, fn, recurse=True):
        # .to() / .half() / .cuda() / to_empty() give every parameter its own new tensor: pack
        # again (the old packed tensor is freed). In-place ones (share_memory_) keep the views.
        super()._apply(fn, recurse)
        if self.packed is not None and not self.packed.intact():
            self.pack()
        return self


class PackableModel(nn.Module):
    """A whole model whose layers can pack their projections (CausalLM, the DFlash drafter)."""

    def packed_modules(self) -> list[PackedModule]:
        return [m for m in self.modules() if isinstance(m, PackedModule) and m.packed is not None]

    def pack_projections(self) -> "PackableModel":
        """Pack every layer's projections (inference; state_dict and parameter count unchanged)."""
        for m in self.modules():
            if isinstance(m, PackedModule):
                m.pack()
        return self

    def check_packing(self) -> None:
        """Refresh each pack's eager check, for layers run under torch.compile."""
        if not torch.compiler.is_compiling():
            for m in self.packed_modules():
                m.packed.ok = m.packed.intact()


# ----------------------------------------------------------------------------------------------
# norms


class RMSNorm(nn.Module):
    """RMSNorm in both conventions: ``w * x̂`` (Qwen3) or zero-centred ``(1 + w) * x̂`` (Qwen3.5/Next)."""

    def __init__(self, dim: int, eps: float, zero_centered: bool):
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None = None):
        """norm(x); with ``delta``, the pair (x + delta, norm(x + delta)): the residual add fused with
        the norm that reads it (one launch). Either way through the module call, so hooks see it."""
        # zero-centred: (x̂ (1 + w)) in fp32, then cast (the order transformers uses for these
        # models); plain: w * (x̂ cast to x's dtype). tree_kernels/norms/naive.py is the reference
        if delta is not None:
            return tk.add_rms_norm(x, delta, self.weight, self.eps, self.zero_centered)
        return tk.rms_norm(x, self.weight, self.eps, self.zero_centered)


# ----------------------------------------------------------------------------------------------
# rotary


class Rotary(nn.Module):
    """Rotary embedding on the first ``rotary_dim`` channels of each head (rotate-half layout)."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = attention_scaling

    @property
    def rotary_dim(self) -> int:
        return 2 * self.inv_freq.shape[0]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)

    _table: tuple | None = None  # (rows [L, 2, R]: cos and sin of positions 0..L-1, dtype)

    def build_table(self, length: int, dtype: torch.dtype) -> torch.Tensor:
        """cos_sin of positions 0 .. length - 1 at least, computed once (the same values, bit for
        bit), for ``table_rows``: a step of the fast path then gathers its rows in two launches
        instead of computing them in about eight. Returns the table: a CUDA graph captured with it
        reads that memory, so whoever captures keeps it (a later, longer table replaces it here
        without freeing it under an earlier engine's graphs)."""
        table = self._table
        if table is None or table[1] != dtype or table[0].device != self.inv_freq.device or table[0].shape[0] < length:
            cos, sin = self.cos_sin(torch.arange(length, device=self.inv_freq.device), dtype)
            self._table = table = (torch.stack([cos, sin], dim=1), dtype)
        return table[0]

    def table_rows(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos_sin through the table of ``build_table`` when it has this dtype and device, else
        computed. Positions past the table (never those of rows a cache holds: it is built to the
        cache's capacity) read its last row rather than out of bounds."""
        table = self._table
        if table is None or table[1] != dtype or table[0].device != positions.device:
            return self.cos_sin(positions, dtype)
        rows = table[0][positions.clamp(max=table[0].shape[0] - 1)]
        return rows[:, 0], rows[:, 1]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos, sin [T, R] with R <= D. Channels past R pass through (rotate-half layout;
    the reference is tree_kernels/norms/naive.py)."""
    return tk.rotary(x, cos, sin)


# ----------------------------------------------------------------------------------------------
# feed-forward


class MLP(PackedModule):
    packable = ("gate_proj", "up_proj")

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=False)
        self.up_proj = Linear(hidden, intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        gate, up = self.projections(x)  # packed: column slices of one [T, 2I] output (silu_mul reads strided rows)
        return self.down_proj(tk.silu_mul(gate, up))


class Experts(nn.Module):
    """Expert weights stacked as transformers holds them: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def forward(self, x: torch.Tensor, top_index: torch.Tensor, top_weight: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in torch.unique(top_index).tolist():
            token, slot = torch.where(top_index == e)
            gate, up = F.linear(x[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[e]) * top_weight[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out


class SparseMoE(nn.Module):
    """Routed top-k experts (softmax router, optional renormalisation) plus an optional gated shared expert."""

    def __init__(self, hidden, num_experts, top_k, intermediate, norm_topk_prob, shared_intermediate=0):
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = Linear(hidden, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden, intermediate)
        if shared_intermediate:
            self.shared_expert = MLP(hidden, shared_intermediate)
            self.shared_expert_gate = Linear(hidden, 1, bias=False)
        else:
            self.shared_expert = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float)
        top_weight, top_index = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_weight = top_weight / top_weight.sum(dim=-1, keepdim=True)
        out = self.experts(x, top_index, top_weight.to(x.dtype))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


def make_feed_forward(config: TargetConfig, layer: int) -> nn.Module:
    if config.is_moe_layer(layer):
        return SparseMoE(
            config.hidden_size,
            config.num_experts,
            config.num_experts_per_tok,
            config.moe_intermediate_size,
            True if config.model_type == "qwen3_5_moe_text" else config.norm_topk_prob,
            config.shared_expert_intermediate_size if config.model_type != "qwen3_moe" else 0,
        )
    return MLP(config.hidden_size, config.intermediate_size)


# ----------------------------------------------------------------------------------------------
# attention and its KV cache


class KVCache:
    """Contiguous K/V rows for one attention layer: committed prefix, then tentative tree rows."""

    def __init__(self, max_len: int, kv_heads: int, head_dim: int, dtype, device):
        self.k = torch.zeros(max_len, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[0]

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put the new rows after the committed prefix; return every row a query may read."""
        end = start + k.shape[0]
        if start != self.length:
            raise RuntimeError(f"KV cache holds {self.length} committed rows but the block starts at {start}")
        if end > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded ({end} rows needed)")
        self.k[start:end] = k
        self.v[start:end] = v
        return self.k[:end], self.v[:end]

    def clone(self) -> "KVCache":
        other = KVCache.__new__(KVCache)
        other.k, other.v, other.length = self.k.clone(), self.v.clone(), self.length
        return other

    def write_static(self, start: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fast path: rows at a device offset; every buffer row is returned (masked by the reader)."""
        kv_write_static(self.k, self.v, start, k, v)  # one launch on the Triton route
        return self.k, self.v

    def commit_static(self, start: torch.Tensor, path: torch.Tensor, count: torch.Tensor) -> None:
        """Fast path: move the first ``count`` rows of the (padded) path after the prefix (one
        launch on the Triton route)."""
        kv_commit_static(self.k, self.v, start, path, count)

    def commit(self, path: torch.Tensor) -> None:
        """Keep the accepted rows, contiguous after the prefix."""
        start = self.length
        rows = start + path
        n = path.shape[0]
        self.k[start : start + n] = self.k[rows]  # gather first (advanced indexing copies)
        self.v[start : start + n] = self.v[rows]
        self.length = start + n


class Attention(PackedModule):
    """Qwen attention: q/k RMSNorm per head, (partial) rotary, GQA, optional sigmoid output gate."""

    packable = ("q_proj", "k_proj", "v_proj")

    def __init__(self, config: TargetConfig, layer: int, gated: bool, zero_centered_norm: bool):
        super().__init__()
        h, d = config.num_attention_heads, config.head_dim
        self.heads, self.kv_heads, self.head_dim = h, config.num_key_value_heads, d
        self.gated = gated
        self.scale = d**-0.5
        self.window = config.sliding_window if config.layer_types[layer] == "sliding_attention" else None
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, h * d * (2 if gated else 1), bias=bias)
        self.k_proj = Linear(config.hidden_size, self.kv_heads * d, bias=bias)
        self.v_proj = Linear(config.hidden_size, self.kv_heads * d, bias=bias)
        self.o_proj = Linear(h * d, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, zero_centered_norm)
        self.k_norm = RMSNorm(d, config.rms_norm_eps, zero_centered_norm)

    def new_cache(self, max_len: int, dtype, device) -> KVCache:
        return KVCache(max_len, self.kv_heads, self.head_dim, dtype, device)

    def forward(self, x, tree: CompiledTree, cache: KVCache, cos, sin, mode: str):
        t = x.shape[0]
        q, k, v = self.projections(x)
        # a verify's attention leaves HBM idle for tens of us: warm L2 with o_proj meanwhile
        warmup = tk.l2_prefetch_start(self.o_proj.weight) if t > 1 else None
        if self.gated:  # gate: a strided [T, H, D] view, read in place by the fused gate below
            q, gate = q.view(t, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        # per-head q / k RMSNorm, then rotary (fused: one launch for all four; the q_norm / k_norm
        # modules hold the weights but are not called, so hooks on them do not fire)
        q, k = tk.qk_norm_rotary(q.reshape(t, self.heads, self.head_dim), k.view(t, self.kv_heads, self.head_dim),
                                 self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, self.q_norm.zero_centered, cos, sin)
        v = v.view(t, self.kv_heads, self.head_dim)
        if tree.prefix_t is None:
            keys, values = cache.write(tree.prefix_len, k, v)
            o = tk.tree_attention(q, keys, values, tree.anc, tree.prefix_len, self.scale, tree.positions, self.window)
        else:
            keys, values = cache.write_static(tree.prefix_t, k, v)
            o = tree_attention_static(q, keys, values, tree.anc, tree.prefix_t, self.scale, tree.positions, self.window)
        if self.gated:
            o = tk.sigmoid_mul(gate, o)  # o * sigmoid(gate)
        tk.l2_prefetch_join(warmup)
        return self.o_proj(o.reshape(t, self.heads * self.head_dim))


# ----------------------------------------------------------------------------------------------
# decoder layer and the causal LM shell


class DecoderLayer(nn.Module):
    def __init__(self, mixer_name: str, mixer: nn.Module, mlp: nn.Module, hidden: int, eps: float, zero_centered: bool):
        super().__init__()
        self.mixer_name = mixer_name
        self.add_module(mixer_name, mixer)  # "self_attn" or "linear_attn", as in HF checkpoints
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden, eps, zero_centered)
        self.post_attention_layernorm = RMSNorm(hidden, eps, zero_centered)

    @property
    def mixer(self) -> nn.Module:
        return getattr(self, self.mixer_name)

    def forward(self, x, tree, cache, cos, sin, mode, delta=None):
        """The layer on the residual stream ``x + delta`` (``delta`` None: just x). Returns the pair
        (residual, delta) whose sum is the layer's output: the last residual add is left to the next
        layer's input norm (or the final norm), which fuses it into its own launch."""
        if delta is None:
            normed = self.input_layernorm(x)
        else:
            x, normed = self.input_layernorm(x, delta)
        x, normed = self.post_attention_layernorm(x, self.mixer(normed, tree, cache, cos, sin, mode))
        return x, self.mlp(normed)


@dataclass
class ModelCache:
    """Everything a target keeps between forwards: one cache per layer, owned by that layer's type."""

    layers: list
    length: int = 0  # committed tokens
    capacity: int = 0
    # groups of layer caches sharing buffers, each able to commit its members in one go
    # (qwen3_5.RecurrentStack); a clone has none
    shared: list = field(default_factory=list)

    def clone(self) -> "ModelCache":
        """An independent copy of the committed state (oracles, what-if comparisons)."""
        return ModelCache([c.clone() for c in self.layers], self.length, self.capacity)

    def commit_static(self, start: torch.Tensor, path: torch.Tensor, count: torch.Tensor) -> None:
        """Fast path: commit a padded path (``count`` valid slots) with no host sync. The caller
        advances its device prefix length and, once it has synced, ``length``."""
        done = {id(c) for group in self.shared for c in group.commit_static(path, count)}
        for c in self.layers:
            if id(c) not in done:
                c.commit_static(start, path, count)

    def commit(self, path: list[int] | torch.Tensor) -> None:
        device = next((c.k.device for c in self.layers if isinstance(c, KVCache)), None)
        p = torch.as_tensor(path, dtype=torch.int64, device=device)
        for c in self.layers:
            c.commit(p)
        self.length += int(p.shape[0])


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [T, V] (or [1, V] with logits="last")
    taps: torch.Tensor | None = None  # [T, n_taps * hidden]: outputs of the requested layers
    states: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [T, HV, dk, dv] (record_states)


class CausalLM(PackableModel):
    """The shell every target family fills in: embeddings, decoder layers, final norm, lm_head."""

    def __init__(self, config: TargetConfig, layers: list[DecoderLayer], zero_centered: bool):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.model.layers = nn.ModuleList(layers)
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered)
        inv_freq, scaling = config.inv_freq()
        self.rotary = Rotary(inv_freq, scaling)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        # how a decoder layer is run: None calls it; the fast path may install a compiled
        # function of (layer, x, tree, cache, cos, sin, mode) shared by all layers of a kind
        self.layer_fn = None

    def tie_weights(self) -> None:
        """Share the embedding with lm_head when the config says so (again after to_empty / casts)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_rotary(self) -> None:
        """(Re)compute the rotary frequencies in fp32 on the model's device (after a dtype cast)."""
        inv_freq, scaling = self.config.inv_freq()
        self.rotary = Rotary(inv_freq.to(self.device), scaling)

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(tokens)

    def logits_from_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """lm_head on already-normed hidden states (the DFlash drafter uses the target's head)."""
        return self.lm_head(h)

    def new_cache(self, max_len: int) -> ModelCache:
        layers = [layer.mixer.new_cache(max_len, self.dtype, self.device) for layer in self.model.layers]
        return ModelCache(layers, 0, max_len)

    # -- the one forward ------------------------------------------------------------------------
    def forward(
        self,
        tree: CompiledTree,
        cache: ModelCache,
        mode: str = "fork",
        taps: list[int] | tuple[int, ...] = (),
        logits: str = "all",
        record_states: bool = False,
    ) -> ForwardOutput:
        """Run the new tokens of ``tree`` after the ``cache.length`` committed ones.

        Attention rows and recurrent stashes are tentative until ``cache.commit(path)``.
        """
        if tree.prefix_t is None and tree.prefix_len != cache.length:
            raise RuntimeError(f"tree starts at {tree.prefix_len} but the cache holds {cache.length} tokens")
        if self.layer_fn is not None:
            self.check_packing()  # a compiled layer function reads this check (no data pointers there)
        x = self.embed(tree.tokens)
        # a static tree (the fast path, positions on the device): its rows of the rotary table
        rope = self.rotary.table_rows if tree.prefix_t is not None else self.rotary.cos_sin
        cos, sin = rope(tree.positions, x.dtype)
        wanted = {layer: i for i, layer in enumerate(taps)}
        captured: list[torch.Tensor | None] = [None] * len(taps)
        states = {}
        run_layer = self.layer_fn or DecoderLayer.__call__
        delta = None  # each layer hands its last residual add to the next one's norm
        for i, (layer, layer_cache) in enumerate(zip(self.model.layers, cache.layers)):
            x, delta = run_layer(layer, x, tree, layer_cache, cos, sin, mode, delta)
            if i in wanted:
                captured[wanted[i]] = x + delta
            if record_states and hasattr(layer_cache, "pending") and layer_cache.pending is not None:
                states[i] = layer_cache.pending.node_states()
        h = x + delta  # the last layer's residual add stays its own launch: the final norm's input and
        # output are what a logit-lens hook on model.norm reads
        out = self.lm_head(self.model.norm(h if logits == "all" else h[-1:]))
        tap_tensor = torch.cat(captured, dim=-1) if taps else None  # type: ignore[arg-type]
        return ForwardOutput(out, tap_tensor, states)

    def run_chain(self, tokens, cache: ModelCache, taps=(), logits="all") -> ForwardOutput:
        """Prefill or plain decode: forward a chain after the cache and commit all of it."""
        chain = compile_chain(tokens, cache.length, self.device)
        out = self.forward(chain, cache, "fork", taps, logits)
        cache.commit(torch.arange(chain.size, device=self.device))
        return out
