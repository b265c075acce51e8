"""Dense Qwen3 (``qwen3``) and its mixture-of-experts sibling (``qwen3_moe``).

Pre-norm decoder: RMSNorm(w * x̂), attention with per-head q/k RMSNorm and full rotary, no
output gate; SwiGLU MLP, or routed top-k experts on the MoE layers. Every layer is attention,
so tree verify needs nothing but the ancestor mask.
"""

from __future__ import annotations

from .common import Attention, CausalLM, DecoderLayer, make_feed_forward
from .config import TargetConfig


class Qwen3ForCausalLM(CausalLM):
    def __init__(self, config: TargetConfig):
        if config.model_type not in ("qwen3", "qwen3_moe"):
            raise ValueError(f"Qwen3ForCausalLM cannot build model_type {config.model_type!r}")
        layers = [
            DecoderLayer(
                "self_attn",
                Attention(config, i, gated=False, zero_centered_norm=False),
                make_feed_forward(config, i),
                config.hidden_size,
                config.rms_norm_eps,
                zero_centered=False,
            )
            for i in range(config.num_hidden_layers)
        ]
        super().__init__(config, layers, zero_centered=False)
