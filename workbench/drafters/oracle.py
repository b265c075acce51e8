"""A synthetic drafter that knows the target's true continuation, for controlled experiments.

Random-weight targets accept almost nothing from a real drafter, so a losslessness test on
them proves nothing. This drafter is given the sequence the target itself produces (AR at the
same temperature and seed: with position-keyed sampling that is *the* continuation) and puts
the true token of each depth at a chosen rank:

    rank 0 with probability ``p``, else at rank ``rank``; absent altogether with probability ``miss``

The other candidates are random tokens with decreasing random probabilities. Accepted paths
then run through non-first siblings, which is exactly what breaks unsafe recurrent verify.
Everything is a pure function of (seed, absolute position, depth), so runs are reproducible.

Spec strings for the CLI: ``oracle`` or ``oracle:p=0.6,rank=2,miss=0.05,seed=1,block=16``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..tree import Draft


@dataclass
class OracleSpec:
    p: float = 0.6
    rank: int = 1
    miss: float = 0.0
    seed: int = 0
    block: int = 16
    spread: float = 1.0  # scale of the random log-probability gaps between ranks

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
        self.device = device

    def begin(self, prompt_ids, features, max_len) -> None:
        n = len(prompt_ids)
        if self.reference[:n] != list(prompt_ids):
            raise ValueError("oracle reference does not start with this prompt")

    def commit(self, accepted_ids, features) -> None:
        pass

    def _row(self, position: int, depth: int, k: int) -> tuple[list[int], list[float]]:
        s = self.spec
        rng = np.random.default_rng([s.seed, position, depth])
        true = self.reference[position] if position < len(self.reference) else None
        if true is not None and rng.random() < s.miss:
            true = None
        pool = rng.choice(self.vocab_size, size=min(self.vocab_size, k + 1), replace=False).tolist()
        others = [t for t in pool if t != true][:k]
        if true is not None:
            r = 0 if rng.random() < s.p else s.rank
            if r < k:
                others = others[:r] + [true] + others[r : k - 1]
            elif len(others) < k:  # a vocabulary of exactly k: the true token is the last one left
                others = others + [true]
        # decreasing log-probs: cumulative random gaps, renormalised over the k shown plus a rest
        gaps = np.concatenate([[0.0], np.cumsum(rng.exponential(s.spread, size=len(others) - 1))])
        logits = -gaps
        probs = np.exp(logits - logits.max())
        probs = 0.95 * probs / probs.sum()
        return others, np.log(probs).tolist()

    @torch.no_grad()
    def propose(self, bonus_token: int, position: int, k: int) -> Draft:
        """Depth d predicts the token at ``position + d`` (the bonus sits at ``position``)."""
        k = max(1, min(k, self.vocab_size))
        rows = [self._row(position + d, d, k) for d in range(1, self.block_size)]
        tokens = torch.tensor([r[0] for r in rows], dtype=torch.int64, device=self.device)
        logprobs = torch.tensor([r[1] for r in rows], dtype=torch.float32, device=self.device)
        return Draft(tokens, logprobs)
