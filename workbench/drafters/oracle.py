"""A synthetic drafter that knows the target's true continuation, for controlled experiments.

Random-weight targets accept almost nothing from a real drafter, so a losslessness test on
them proves nothing. This drafter is given the sequence the target itself produces (AR at the
same temperature and seed: with position-keyed sampling that is *the* continuation) and puts
the true token of each depth at a chosen rank:

    rank 0 with probability ``p``, else at rank ``rank``; absent altogether with probability ``miss``

The other candidates are distinct random tokens with decreasing random probabilities.
Accepted paths then run through non-first siblings, which is exactly what breaks unsafe
recurrent verify. Every draw is a hash of (seed, absolute position, depth): runs are
reproducible, and the drafter is plain tensor code (it runs inside the device fast path too).

Spec strings for the CLI: ``oracle`` or ``oracle:p=0.6,rank=2,miss=0.05,seed=1,block=16``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..tree import Draft
from ..verify import hash_uniform


@dataclass
class OracleSpec:
    p: float = 0.6
    rank: int = 1
    miss: float = 0.0
    seed: int = 0
    block: int = 16
    spread: float = 1.0  # mean log-probability gap between consecutive ranks

    @classmethod
    def parse(cls, spec: str) -> "OracleSpec":
        if spec != "oracle" and not spec.startswith("oracle:"):
            raise ValueError(f"not an oracle drafter spec: {spec!r}")
        out = cls()
        body = spec.partition(":")[2]
        for item in filter(None, (s.strip() for s in body.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key not in cls.__dataclass_fields__:
                raise ValueError(f"oracle option {item!r}: expected key=value with key in {list(cls.__dataclass_fields__)}")
            kind = type(getattr(out, key))
            try:
                setattr(out, key, kind(value))
            except ValueError as exc:
                raise ValueError(f"oracle option {key}={value!r}: not a {kind.__name__}") from exc
        out.validate()
        return out

    def validate(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"oracle p must be in [0, 1], got {self.p}")
        if not 0.0 <= self.miss <= 1.0:
            raise ValueError(f"oracle miss must be in [0, 1], got {self.miss}")
        if self.rank < 0:
            raise ValueError(f"oracle rank must be >= 0, got {self.rank}")
        if self.block < 2:
            raise ValueError(f"oracle block must be >= 2, got {self.block}")
        if self.spread <= 0:
            raise ValueError(f"oracle spread must be > 0, got {self.spread}")


class OracleDrafter:
    kind = "oracle"
    needs_features = False
    target_layer_ids: list[int] = []

    def __init__(self, reference: list[int], vocab_size: int, spec: OracleSpec | None = None, device="cpu"):
        self.spec = spec or OracleSpec()
        self.spec.validate()
        self.reference = [int(t) for t in reference]
        self.vocab_size = int(vocab_size)
        self.block_size = self.spec.block
        self.device = torch.device(device)
        # the continuation, padded with -1 ("unknown") a block past its end
        self.ref = torch.tensor(self.reference + [-1] * (self.block_size + 1), dtype=torch.int64, device=self.device)

    def begin(self, prompt_ids, features, max_len) -> None:
        n = len(prompt_ids)
        if self.reference[:n] != list(prompt_ids):
            raise ValueError("oracle reference does not start with this prompt")

    def commit(self, accepted_ids, features) -> None:
        pass

    @torch.no_grad()
    def propose(self, bonus_token, position, k: int) -> Draft:
        """Depth d predicts the token at ``position + d`` (the bonus sits at ``position``)."""
        s = self.spec
        k = max(1, min(k, self.vocab_size))
        depth = torch.arange(1, self.block_size, device=self.device)  # [L]
        pos = torch.as_tensor(position, device=self.device) + depth
        true = self.ref[pos.clamp(max=self.ref.shape[0] - 1)]
        u_rank, u_miss = hash_uniform(s.seed, pos, depth, torch.tensor(1)), hash_uniform(s.seed, pos, depth, torch.tensor(2))
        present = (true >= 0) & (u_miss >= s.miss)
        rank = torch.where(u_rank < s.p, 0, s.rank)
        # k distinct random tokens other than the true one: the top-k of per-token hash scores
        vocab = torch.arange(self.vocab_size, device=self.device)
        noise = hash_uniform(s.seed, pos[:, None], depth[:, None], vocab[None, :] + 3)
        noise = torch.where(vocab[None, :] == true[:, None], -1.0, noise)
        others = torch.topk(noise, k, dim=-1).indices  # [L, k]
        slot = torch.arange(k, device=self.device)[None, :]
        insert = present[:, None] & (rank[:, None] < k)
        shifted = torch.cat([others[:, :1], others[:, :-1]], dim=1)  # slot j > rank takes others[j - 1]
        tokens = torch.where(slot < rank[:, None], others, torch.where(slot == rank[:, None], true[:, None], shifted))
        tokens = torch.where(insert, tokens, others)
        # decreasing log-probs: random exponential gaps, 0.95 of the mass on the k shown
        gaps = -torch.log(hash_uniform(s.seed, pos[:, None], depth[:, None], slot + 7 + self.vocab_size)) * s.spread
        logits = -torch.cumsum(torch.where(slot == 0, 0.0, gaps), dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1) + torch.log(torch.tensor(0.95, dtype=torch.float64))
        return Draft(tokens, logprobs.float())

    def propose_static(self, bonus, position, features, count, k: int) -> Draft:
        return self.propose(bonus, position, k)
