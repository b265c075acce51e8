"""The data behind every figure: pure functions of traces (and, for sibling states, the target).

No plotly here (only torch and the engine), so the analyses also run where no viz extras are
installed. Figures in ``workbench.viz.figures`` draw what these functions return.

    round_view(round, tokenizer)            nodes with labels, draft probs, layout, accepted path
    draft_matrix(round, k, tokenizer)       the drafter's per-depth top-k (probabilities + labels)
    committed_tokens(trace, round)          text so far, each token tagged prompt / accepted / bonus
    trace_row(trace, **labels)              one tidy row per generation (benchmarks, batch tables)
    compare_round / compare_run             fork vs unsafe vs paths on the same tree and cache
    generation_diff                         what unsafe changes in a whole generation
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field

from ..trace import PHASES, RoundTrace, Trace
from ..tree import Tree

# ----------------------------------------------------------------------------------------------
# token labels

_UNUSED = re.compile(r"<\|unused_\d+\|>")


def token_label(tokenizer, token_id: int) -> str:
    """How a token reads on its own: its text with whitespace made visible, or ``⟨id⟩``.

    Byte-level tokenizers decode lone non-UTF-8 bytes to U+FFFD; those (and control
    characters) are shown by id so hover labels never hide what the token is.
    """
    token_id = int(token_id)
    if tokenizer is None:
        return f"⟨{token_id}⟩"
    try:
        text = tokenizer.token_text(token_id) if hasattr(tokenizer, "token_text") else tokenizer.decode([token_id])
    except Exception:  # an id the tokenizer cannot decode
        return f"⟨{token_id}⟩"
    if not text or "\ufffd" in text or _UNUSED.fullmatch(text):
        return f"⟨{token_id}⟩"
    text = text.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "␣")
    if any(not ch.isprintable() for ch in text):
        return f"⟨{token_id}⟩"
    return text


# ----------------------------------------------------------------------------------------------
# one round


def tree_layout(parents: list[int], ranks: list[int]) -> tuple[list[float], list[float]]:
    """Node-link layout: x = depth, y = leaf order of a rank-ordered DFS (rank 0 on top, y = 0).

    Leaves take consecutive rows; an internal node sits at the mean row of its children.
    """
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    for node in range(1, n):
        children[parents[node]].append(node)
    for c in children:
        c.sort(key=lambda m: (ranks[m], m))
    depth = [0] * n
    for node in range(1, n):
        depth[node] = depth[parents[node]] + 1
    y = [0.0] * n
    next_row = 0
    # iterative post-order DFS
    stack: list[tuple[int, bool]] = [(0, False)]
    while stack:
        node, done = stack.pop()
        if done or not children[node]:
            if children[node]:
                y[node] = sum(y[c] for c in children[node]) / len(children[node])
            else:
                y[node] = float(next_row)
                next_row += 1
            continue
        stack.append((node, True))
        for c in reversed(children[node]):
            stack.append((c, False))
    return [float(d) for d in depth], y


@dataclass
class NodeInfo:
    id: int
    token: int
    label: str
    parent: int
    depth: int
    rank: int
    score: float  # surrogate score: sum of draft log-probs along the path
    draft_prob: float | None  # q_d(token) = exp(score - parent's score); None for the root
    accepted: bool
    first_chain: bool  # the path is 0, 1, ..., n: flattened order is exact here
    target_pick: int  # what the target chose after this node
    target_pick_label: str
    target_top: list[tuple[str, float]]  # the target's top tokens after this node (label, prob)
    x: float
    y: float


@dataclass
class RoundView:
    index: int
    prefix_len: int
    nodes: list[NodeInfo]
    accepted: list[int]
    bonus: int
    bonus_label: str
    bonus_x: float
    bonus_y: float

    @property
    def size(self) -> int:
        return len(self.nodes)


def first_chain_mask(parents: list[int]) -> list[bool]:
    """Nodes whose root path is 0, 1, ..., n: the flattened order hands them their true parent."""
    out = [True] * len(parents)
    for n in range(1, len(parents)):
        out[n] = parents[n] == n - 1 and out[n - 1]
    return out


def round_view(rt: RoundTrace, tokenizer=None) -> RoundView:
    t = rt.tree
    tokens, parents, depths, scores, ranks = t["tokens"], t["parents"], t["depths"], t["scores"], t["ranks"]
    x, y = tree_layout(parents, ranks)
    accepted = set(rt.accepted)
    chain = first_chain_mask(parents)
    nodes = []
    for n in range(len(tokens)):
        p = parents[n]
        prob = math.exp(scores[n] - scores[p]) if p >= 0 else None
        top = []
        if rt.target_top_tokens and n < len(rt.target_top_tokens):
            top = [(token_label(tokenizer, tok), math.exp(lp)) for tok, lp in zip(rt.target_top_tokens[n], rt.target_top_logprobs[n])]
        pick = int(rt.choices[n])
        nodes.append(
            NodeInfo(n, int(tokens[n]), token_label(tokenizer, tokens[n]), int(p), int(depths[n]), int(ranks[n]),
                     float(scores[n]), prob, n in accepted, chain[n], pick, token_label(tokenizer, pick), top, x[n], y[n])
        )
    last = rt.accepted[-1]
    # the bonus hangs off the last accepted node, half a row down so it never sits on a child
    return RoundView(rt.index, rt.prefix_len, nodes, list(rt.accepted), int(rt.bonus), token_label(tokenizer, rt.bonus),
                     x[last] + 0.6, y[last] + 0.45)


@dataclass
class DraftMatrix:
    """The drafter's per-depth top-k for one round: rows are depths 1..L, columns ranks 0..k-1."""

    tokens: list[list[int]]
    probs: list[list[float]]
    labels: list[list[str]]
    accepted_cells: list[tuple[int, int]]  # (depth, rank) of each accepted draft node
    target_cells: list[tuple[int, int | None, str]]  # (depth, rank or None if not shown, label) of the target's pick

    @property
    def depth(self) -> int:
        return len(self.tokens)

    @property
    def k(self) -> int:
        return len(self.tokens[0]) if self.tokens else 0


def draft_matrix(rt: RoundTrace, k: int | None = 8, tokenizer=None) -> DraftMatrix:
    if rt.draft_tokens is None:
        raise ValueError(f"round {rt.index} has no draft (an AR run): nothing to show per position")
    kk = len(rt.draft_tokens[0]) if k is None else min(k, len(rt.draft_tokens[0]))
    tokens = [row[:kk] for row in rt.draft_tokens]
    probs = [[math.exp(v) for v in row[:kk]] for row in rt.draft_logprobs]
    labels = [[token_label(tokenizer, t) for t in row] for row in tokens]
    depths, ranks = rt.tree["depths"], rt.tree["ranks"]
    accepted_cells = [(depths[n], ranks[n]) for n in rt.accepted[1:] if ranks[n] < kk]
    target_cells = []
    for d in range(1, min(len(rt.accepted), len(tokens)) + 1):
        pick = int(rt.choices[rt.accepted[d - 1]])
        row = tokens[d - 1]
        target_cells.append((d, row.index(pick) if pick in row else None, token_label(tokenizer, pick)))
    return DraftMatrix(tokens, probs, labels, accepted_cells, target_cells)


# ----------------------------------------------------------------------------------------------
# a whole generation


def pick_round(trace: Trace, round_index: int = -1) -> int:
    """``round_index`` checked against the trace; -1 picks the first round whose accepted path
    went through a non-first sibling (the interesting case), else round 0."""
    n = len(trace.rounds)
    if n == 0:
        raise ValueError("the generation has no rounds (it stopped at the first token): nothing to show")
    if round_index == -1:
        return next((r.index for r in trace.rounds if r.through_sibling), 0)
    if not 0 <= round_index < n:
        raise ValueError(f"round_index {round_index} out of range: this generation has {n} rounds (0..{n - 1}, or -1)")
    return round_index


@dataclass
class CommittedToken:
    position: int  # absolute position in the sequence
    token: int
    label: str
    kind: str  # prompt | accepted (a draft token the target accepted) | bonus (the target's own pick)
    round: int  # the round that committed it (-1: prompt or the prefill's pick)


def committed_tokens(trace: Trace, upto_round: int | None = None, tokenizer=None) -> list[CommittedToken]:
    """The sequence after round ``upto_round`` (all rounds if None), each token tagged by origin."""
    out = [CommittedToken(i, t, token_label(tokenizer, t), "prompt", -1) for i, t in enumerate(trace.prompt_ids)]
    gen = trace.generated_ids
    if not gen:
        return out
    pos = len(trace.prompt_ids)
    out.append(CommittedToken(pos, gen[0], token_label(tokenizer, gen[0]), "bonus", -1))
    last = len(trace.rounds) - 1 if upto_round is None else upto_round
    i = 1
    for rt in trace.rounds[: last + 1]:
        new = [(t, "accepted") for t in rt.accepted_tokens] + [(rt.bonus, "bonus")]
        for tok, kind in new:
            if i >= len(gen):
                break
            out.append(CommittedToken(pos + i, gen[i], token_label(tokenizer, gen[i]), kind, rt.index))
            i += 1
    return out


def trace_row(trace: Trace, **labels) -> dict:
    """One tidy row per generation: settings, acceptance, speed and per-phase seconds."""
    s = trace.settings
    phases = trace.phase_totals()
    row = {
        "method": s.get("method"),
        "budget": s.get("budget") if s.get("method") == "ddtree" else None,
        "recurrent": s.get("recurrent"),
        "temperature": float(s.get("temperature", 0.0)),
        "seed": s.get("seed"),
        "max_new_tokens": s.get("max_new_tokens"),
        "target": s.get("target"),
        "drafter": s.get("drafter"),
        "new_tokens": len(trace.generated_ids),
        "rounds": len(trace.rounds),
        "tau": trace.mean_acceptance,
        "tokens_per_second": trace.tokens_per_second,
        "decode_seconds": trace.decode_seconds,
        "prefill_seconds": trace.prefill_seconds,
        "sibling_round_fraction": trace.sibling_round_fraction,
        "mean_tree_nodes": statistics.fmean(r.tree_size - 1 for r in trace.rounds) if trace.rounds else 0.0,
        "stop_reason": trace.stop_reason,
        "acceptance_lengths": trace.acceptance_lengths,
    }
    for p in PHASES:
        row[f"{p}_seconds"] = phases.get(p, 0.0)
    row.update(labels)
    return row


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ----------------------------------------------------------------------------------------------
# sibling states: fork vs unsafe vs paths on the same tree from the same committed cache


@dataclass
class SiblingComparison:
    """One round's tree verified three ways from one committed cache.

    ``kl_*`` are KL(fork ‖ mode) of the next-token distributions (softmax of the logits, T = 1)
    per node; ``state_div_*`` is ‖S_mode − S_paths‖_F / ‖S_paths‖_F per node and recurrent layer,
    paths being the obviously exact oracle (every root-to-leaf path run as its own chain).
    """

    round_index: int
    prefix_len: int
    tree: dict
    layers: list[int]  # recurrent (GDN) layer indices, the heatmap's columns
    first_chain: list[bool]
    kl_unsafe: list[float]
    kl_paths: list[float]
    top1_fork: list[int]
    top1_unsafe: list[int]
    state_div_unsafe: list[list[float]]  # [node][layer]
    state_div_fork: list[list[float]]
    choices_fork: list[int]
    choices_unsafe: list[int]
    accepted_fork: list[int]
    accepted_unsafe: list[int]
    bonus_fork: int
    bonus_unsafe: int
    trace_logprob_error: float | None = None  # replayed fork vs the trace's recorded top-k log-probs

    @property
    def size(self) -> int:
        return len(self.kl_unsafe)

    @property
    def flips(self) -> list[bool]:
        return [a != b for a, b in zip(self.top1_fork, self.top1_unsafe)]

    @property
    def decision_changed(self) -> list[bool]:
        """Nodes where the target's pick (the acceptance decision made there) differs."""
        return [a != b for a, b in zip(self.choices_fork, self.choices_unsafe)]

    @property
    def path_changed(self) -> bool:
        return self.accepted_fork != self.accepted_unsafe or self.bonus_fork != self.bonus_unsafe

    @property
    def committed_fork(self) -> list[int]:
        """Tokens the round commits after the root: accepted drafts + bonus."""
        t = self.tree["tokens"]
        return [t[n] for n in self.accepted_fork[1:]] + [self.bonus_fork]

    @property
    def committed_unsafe(self) -> list[int]:
        t = self.tree["tokens"]
        return [t[n] for n in self.accepted_unsafe[1:]] + [self.bonus_unsafe]

    def max_state_div(self, which: str = "unsafe") -> float:
        m = self.state_div_unsafe if which == "unsafe" else self.state_div_fork
        return max((v for row in m for v in row), default=0.0)

    def summary(self) -> dict:
        off = [not c for c in self.first_chain]
        kl_off = [k for k, o in zip(self.kl_unsafe, off) if o]
        kl_on = [k for k, o in zip(self.kl_unsafe, off) if not o]
        return {
            "round": self.round_index,
            "nodes": self.size,
            "off_chain_nodes": sum(off),
            "max_kl_fork_paths": max(self.kl_paths),
            "max_kl_fork_unsafe": max(self.kl_unsafe),
            "mean_kl_unsafe_off_chain": statistics.fmean(kl_off) if kl_off else 0.0,
            "max_kl_unsafe_first_chain": max(kl_on) if kl_on else 0.0,
            "top1_flips": sum(self.flips),
            "decisions_changed": sum(self.decision_changed),
            "max_state_div_unsafe": self.max_state_div("unsafe"),
            "max_state_div_fork": self.max_state_div("fork"),
            "accepted_fork": len(self.accepted_fork),
            "accepted_unsafe": len(self.accepted_unsafe),
            "path_changed": self.path_changed,
        }

    def node_rows(self) -> list[dict]:
        rows = []
        for n in range(self.size):
            row = {
                "round": self.round_index,
                "node": n,
                "depth": self.tree["depths"][n],
                "rank": self.tree["ranks"][n],
                "first_chain": self.first_chain[n],
                "kl_fork_unsafe": self.kl_unsafe[n],
                "kl_fork_paths": self.kl_paths[n],
                "top1_flip": self.flips[n],
                "decision_changed": self.decision_changed[n],
            }
            for j, layer in enumerate(self.layers):
                row[f"state_div_layer{layer}"] = self.state_div_unsafe[n][j]
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return asdict(self)


def _cache_capacity(trace: Trace) -> int:
    biggest = max((r.tree_size for r in trace.rounds), default=1)
    return len(trace.prompt_ids) + len(trace.generated_ids) + biggest + 2


def _round_committed(rt: RoundTrace) -> list[int]:
    """Tokens a round commits to the cache: the root and the accepted drafts (not the bonus)."""
    return [rt.tree["tokens"][n] for n in rt.accepted]


def committed_cache(target, trace: Trace, round_index: int):
    """The exact committed cache at the start of ``round_index``, rebuilt by replaying the
    committed tokens as one chain (the same tokens every exact mode commits)."""
    rt = trace.rounds[round_index]
    cache = target.new_cache(_cache_capacity(trace))
    prefix = list(trace.prompt_ids)
    for r in trace.rounds[:round_index]:
        prefix += _round_committed(r)
    if len(prefix) != rt.prefix_len:
        raise ValueError(f"trace is inconsistent: round {round_index} starts at {rt.prefix_len} but its rounds commit {len(prefix)} tokens")
    target.run_chain(prefix, cache)
    return cache


def _recurrent_layers(target) -> list[int]:
    return [i for i, t in enumerate(target.config.layer_types) if t == "linear_attention"]


def compare_round(target, trace: Trace, round_index: int, cache=None) -> SiblingComparison:
    """Verify round ``round_index``'s tree in fork, unsafe and paths from one committed cache
    (``cache.clone()`` per mode), recording per-node recurrent states."""
    import torch

    from ..tree import compile_tree
    from ..verify import Sampler, walk

    rt = trace.rounds[round_index]
    layers = _recurrent_layers(target)
    if not layers:
        raise ValueError("this target has no recurrent (linear-attention) layers: every recurrent mode is the same")
    if cache is None:
        cache = committed_cache(target, trace, round_index)
    if cache.length != rt.prefix_len:
        raise ValueError(f"cache holds {cache.length} tokens but round {round_index} starts at {rt.prefix_len}")
    tree = Tree.from_dict(rt.tree)
    sampler = Sampler(float(trace.settings.get("temperature", 0.0)), int(trace.settings.get("seed", 0)))
    out = {}
    with torch.no_grad():
        for mode in ("fork", "unsafe", "paths"):
            compiled = compile_tree(tree, rt.prefix_len, target.device)
            res = target(compiled, cache.clone(), mode, (), "all", record_states=True)
            accepted, bonus, choices = walk(tree, compiled, res.logits, sampler)
            out[mode] = (res.logits.double(), {k: v.double() for k, v in res.states.items()}, accepted, bonus, choices)
        fork_logits, fork_states = out["fork"][0], out["fork"][1]
        logp = torch.log_softmax(fork_logits, -1)
        p = logp.exp()

        def kl(mode):
            return (p * (logp - torch.log_softmax(out[mode][0], -1))).sum(-1).clamp(min=0).tolist()

        exact = out["paths"][1]

        def div(states):
            cols = []
            for layer in layers:
                d = (states[layer] - exact[layer]).flatten(1).norm(dim=1)
                ref = exact[layer].flatten(1).norm(dim=1).clamp(min=1e-30)
                cols.append((d / ref).tolist())
            return [list(r) for r in zip(*cols)]

        err = None
        if rt.target_top_tokens:
            idx = torch.tensor(rt.target_top_tokens, dtype=torch.int64, device=logp.device)
            rec = torch.tensor(rt.target_top_logprobs, dtype=torch.float64, device=logp.device)
            err = float((logp.gather(1, idx) - rec).abs().max())
        return SiblingComparison(
            round_index=rt.index,
            prefix_len=rt.prefix_len,
            tree=dict(rt.tree),
            layers=layers,
            first_chain=first_chain_mask(rt.tree["parents"]),
            kl_unsafe=kl("unsafe"),
            kl_paths=kl("paths"),
            top1_fork=fork_logits.argmax(-1).tolist(),
            top1_unsafe=out["unsafe"][0].argmax(-1).tolist(),
            state_div_unsafe=div(out["unsafe"][1]),
            state_div_fork=div(fork_states),
            choices_fork=[int(c) for c in out["fork"][4]],
            choices_unsafe=[int(c) for c in out["unsafe"][4]],
            accepted_fork=list(out["fork"][2]),
            accepted_unsafe=list(out["unsafe"][2]),
            bonus_fork=int(out["fork"][3]),
            bonus_unsafe=int(out["unsafe"][3]),
            trace_logprob_error=err,
        )


def compare_run(target, trace: Trace, rounds: list[int] | None = None, progress=None) -> list[SiblingComparison]:
    """``compare_round`` for many rounds (all by default), replaying the committed tokens once."""
    import torch

    wanted = sorted(set(range(len(trace.rounds)) if rounds is None else rounds))
    for r in wanted:
        if not 0 <= r < len(trace.rounds):
            raise ValueError(f"round {r} out of range: the generation has {len(trace.rounds)} rounds")
    results = []
    if not wanted:
        return results
    cache = target.new_cache(_cache_capacity(trace))
    with torch.no_grad():
        target.run_chain(list(trace.prompt_ids), cache)
        for rt in trace.rounds[: wanted[-1] + 1]:
            if rt.index in wanted:
                results.append(compare_round(target, trace, rt.index, cache))
                if progress:
                    progress(1)
            target.run_chain(_round_committed(rt), cache)
    return results


def run_summary(comparisons: list[SiblingComparison]) -> dict:
    """Whole-run numbers for the sibling-state view."""
    if not comparisons:
        return {"rounds": 0}
    s = [c.summary() for c in comparisons]
    return {
        "rounds": len(s),
        "rounds_with_off_chain_nodes": sum(1 for x in s if x["off_chain_nodes"]),
        "rounds_path_changed": sum(1 for x in s if x["path_changed"]),
        "total_top1_flips": sum(x["top1_flips"] for x in s),
        "total_nodes": sum(x["nodes"] for x in s),
        "max_kl_fork_paths": max(x["max_kl_fork_paths"] for x in s),
        "max_kl_fork_unsafe": max(x["max_kl_fork_unsafe"] for x in s),
        "max_kl_unsafe_first_chain": max(x["max_kl_unsafe_first_chain"] for x in s),
        "max_state_div_unsafe": max(x["max_state_div_unsafe"] for x in s),
        "max_state_div_fork": max(x["max_state_div_fork"] for x in s),
        "tau_fork": statistics.fmean(x["accepted_fork"] for x in s),
        "tau_unsafe_same_trees": statistics.fmean(x["accepted_unsafe"] for x in s),
    }


@dataclass
class GenerationDiff:
    """Whole generations under several recurrent modes against AR (same settings otherwise)."""

    ar_tokens: list[int]
    tokens: dict[str, list[int]]
    acceptance: dict[str, list[int]]
    tau: dict[str, float]
    first_difference: dict[str, int | None]  # vs AR, in generated-token positions
    changed: dict[str, list[int]] = field(default_factory=dict)  # positions differing from AR

    @property
    def identical(self) -> dict[str, bool]:
        return {m: d is None for m, d in self.first_difference.items()}

    def summary(self) -> dict:
        return {
            "identical_to_ar": self.identical,
            "first_difference": self.first_difference,
            "changed_tokens": {m: len(v) for m, v in self.changed.items()},
            "tau": self.tau,
            "new_tokens": {m: len(v) for m, v in self.tokens.items()},
        }


def generation_diff(session, prompt, modes=("fork", "unsafe"), **settings) -> GenerationDiff:
    """Generate with each recurrent mode (and AR) under the same settings; compare the tokens."""
    ar = session.generate(prompt, method="ar", **{k: v for k, v in settings.items() if k not in ("method", "budget", "recurrent")})
    tokens, acc, tau, first, changed = {}, {}, {}, {}, {}
    for mode in modes:
        t = session.generate(prompt, recurrent=mode, **settings)
        tokens[mode] = list(t.generated_ids)
        acc[mode] = t.acceptance_lengths
        tau[mode] = t.mean_acceptance
        first[mode] = first_difference(ar.generated_ids, t.generated_ids)
        n = max(len(ar.generated_ids), len(t.generated_ids))
        a, b = ar.generated_ids, t.generated_ids
        changed[mode] = [i for i in range(n) if i >= len(a) or i >= len(b) or a[i] != b[i]]
    return GenerationDiff(list(ar.generated_ids), tokens, acc, tau, first, changed)


def verdict(run: dict, diff: GenerationDiff | None = None, mode: str = "unsafe") -> str:
    """One plain sentence answering 'is unsafe mode good enough?' from the measured numbers."""
    parts = []
    if run.get("rounds"):
        parts.append(
            f"on the same trees and caches, {mode} changed the accepted path in {run['rounds_path_changed']} of "
            f"{run['rounds']} rounds and flipped the top-1 token at {run['total_top1_flips']} of {run['total_nodes']} nodes "
            f"(max KL(fork‖{mode}) {run['max_kl_fork_unsafe']:.3g}; fork vs paths {run['max_kl_fork_paths']:.1e})"
        )
    if diff is not None and mode in diff.first_difference:
        d = diff.first_difference[mode]
        parts.append(
            f"the {mode} generation is identical to AR" if d is None
            else f"the {mode} generation leaves AR's output at token {d} ({len(diff.changed[mode])} tokens differ; "
                 f"τ {diff.tau[mode]:.2f} vs fork {diff.tau.get('fork', float('nan')):.2f})"
        )
    bad = (run.get("rounds_path_changed", 0) > 0) or (diff is not None and diff.first_difference.get(mode) is not None)
    head = f"{mode} is NOT good enough: " if bad else f"{mode} matched the exact result on this run (which says nothing about other runs): "
    return head + "; ".join(parts) + "."
