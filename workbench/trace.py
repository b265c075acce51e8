"""What a run records: the one thing notebooks, figures and benchmarks read.

Plain data (lists, numbers, strings), JSON round-trippable, written atomically.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .tree import Tree

PHASES = ("draft", "tree", "verify", "walk", "commit")


@dataclass
class RoundTrace:
    index: int
    prefix_len: int  # committed tokens before the round = attention position of the root
    root: int  # the bonus token the round starts from
    tree: dict  # Tree.to_dict(): tokens, parents, depths, scores, ranks
    draft_tokens: list[list[int]] | None  # [depth][rank] drafter candidates (None for AR)
    draft_logprobs: list[list[float]] | None
    target_top_tokens: list[list[int]]  # [node][k] target's top tokens after each node
    target_top_logprobs: list[list[float]]
    choices: list[int]  # the target's pick after each node (argmax, or the sample at T > 0)
    accepted: list[int]  # accepted node ids, root first
    bonus: int  # the target's pick after the last accepted node: next round's root
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase

    def tree_obj(self) -> Tree:
        return Tree.from_dict(self.tree)

    @property
    def accepted_tokens(self) -> list[int]:
        return [self.tree["tokens"][n] for n in self.accepted[1:]]

    @property
    def acceptance_length(self) -> int:
        """Tokens this round commits: accepted drafts plus the bonus (AR: 1)."""
        return len(self.accepted)

    @property
    def through_sibling(self) -> bool:
        """Did the accepted path pass through a non-first sibling (a rank > 0 candidate)?"""
        ranks = self.tree["ranks"]
        return any(ranks[n] > 0 for n in self.accepted[1:])

    @property
    def tree_size(self) -> int:
        return len(self.tree["tokens"])


@dataclass
class Trace:
    prompt_ids: list[int]
    generated_ids: list[int]  # new tokens only, the prompt excluded
    rounds: list[RoundTrace]
    settings: dict  # method, budget, temperature, seed, recurrent, max_new_tokens, target, drafter
    prefill_seconds: float
    decode_seconds: float
    stop_reason: str  # max_new_tokens | eos | context
    text: str | None = None
    prompt_text: str | None = None

    @property
    def acceptance_lengths(self) -> list[int]:
        return [r.acceptance_length for r in self.rounds]

    @property
    def mean_acceptance(self) -> float:
        a = self.acceptance_lengths
        return float(statistics.fmean(a)) if a else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over decode wall time (prefill excluded, as DFlash/DDTree report)."""
        return len(self.generated_ids) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def sibling_round_fraction(self) -> float:
        r = [x.through_sibling for x in self.rounds]
        return sum(r) / len(r) if r else 0.0

    def phase_totals(self) -> dict[str, float]:
        totals = {p: 0.0 for p in PHASES}
        for r in self.rounds:
            for k, v in r.timings.items():
                totals[k] = totals.get(k, 0.0) + v
        return totals

    def summary(self) -> dict:
        return {
            "text": self.text,
            "token_ids": list(self.generated_ids),
            "acceptance_lengths": self.acceptance_lengths,
            "mean_acceptance": self.mean_acceptance,
            "tokens_per_second": self.tokens_per_second,
            "rounds": len(self.rounds),
            "new_tokens": len(self.generated_ids),
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "stop_reason": self.stop_reason,
            "sibling_round_fraction": self.sibling_round_fraction,
            "phase_seconds": self.phase_totals(),
            "settings": self.settings,
        }

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        d = dict(d)
        d["rounds"] = [RoundTrace(**r) for r in d["rounds"]]
        return cls(**d)

    def save(self, path: str | Path) -> Path:
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        return cls.from_dict(json.loads(Path(path).read_text()))


def write_json_atomic(path: str | Path, obj, indent: int | None = None) -> Path:
    """Write JSON next to the target and rename it into place: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=indent)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
