"""The round loop: one function serves AR (no draft), DFlash (a chain) and DDTree (a tree).

    draft   = drafter.propose(bonus, position, k)          per-depth top-k log-probs
    tree    = build_tree(method, draft, bonus, budget)     DDTree best-first, a chain, or the root alone
    verify  = target(compile_tree(tree), cache, mode)      one pass: ancestor mask + tree recurrences
    path    = walk(tree, verify.logits, sampler)           accepted nodes + the next bonus token
    commit  cache.commit(path); drafter.commit(...)        KV rows, recurrent/conv state of the last node
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from .trace import RoundTrace, Trace
from .tree import build_tree, compile_tree
from .verify import RECURRENT_MODES, Sampler, check_finite, walk

METHODS = ("ar", "dflash", "ddtree")


@dataclass
class GenerationConfig:
    method: str = "ddtree"
    budget: int = 32  # DDTree node budget (root excluded)
    temperature: float = 0.0
    seed: int = 0
    recurrent: str = "fork"
    max_new_tokens: int = 128
    stop_on_eos: bool = True
    trace_topk: int = 5  # target top-k per node recorded in the trace (0: none)
    draft_trace_k: int = 8  # drafter candidates per depth recorded at least
    profile: bool = False  # synchronise the device around phases so timings are exact

    def validate(self) -> "GenerationConfig":
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r}: expected one of {', '.join(METHODS)}")
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"budget must be an integer >= 1, got {self.budget!r}")
        if self.recurrent not in RECURRENT_MODES:
            raise ValueError(f"recurrent mode {self.recurrent!r}: expected one of {', '.join(RECURRENT_MODES)}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        return self


def check_prompt(prompt_ids, target) -> list[int]:
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("empty prompt: at least one token is needed")
    v = target.config.vocab_size
    bad = [t for t in ids if not 0 <= t < v]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary (size {v})")
    limit = target.config.max_position_embeddings
    if len(ids) >= limit:
        raise ValueError(f"prompt of {len(ids)} tokens does not fit the model's context of {limit} positions")
    return ids


def extend_generated(generated: list[int], new_tokens: list[int], eos: set[int], max_new_tokens: int) -> str | None:
    """Append a round's tokens, cutting at the first EOS or at max_new_tokens; the stop reason, if any."""
    for t in new_tokens:
        generated.append(t)
        if t in eos:
            return "eos"
        if len(generated) >= max_new_tokens:
            return "max_new_tokens"
    return None


class _Clock:
    """Phase timer; with ``sync`` it waits for the device so GPU work lands in the right phase."""

    def __init__(self, device: torch.device, sync: bool):
        self.sync = sync and device.type == "cuda"
        self.last = self.now()

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self) -> float:
        t = self.now()
        dt, self.last = t - self.last, t
        return dt


def _topk_lists(logits: torch.Tensor, k: int) -> tuple[list, list]:
    if k <= 0:
        return [], []
    top = torch.topk(torch.log_softmax(logits.float(), dim=-1), min(k, logits.shape[-1]), dim=-1)
    return top.indices.tolist(), top.values.tolist()


@torch.no_grad()
def generate(
    target,
    prompt_ids,
    config: GenerationConfig | None = None,
    drafter=None,
    tokenizer=None,
    progress: Callable[[int], None] | None = None,
) -> Trace:
    """Generate after ``prompt_ids`` with the configured method; returns the full trace."""
    cfg = (config or GenerationConfig()).validate()
    prompt = check_prompt(prompt_ids, target)
    if cfg.method != "ar" and drafter is None:
        raise ValueError(f"method {cfg.method!r} needs a drafter")
    device = target.device
    vocab = target.config.vocab_size
    block = drafter.block_size if cfg.method != "ar" else 1
    context = target.config.max_position_embeddings
    cache = target.new_cache(min(context, len(prompt) + cfg.max_new_tokens) + max(cfg.budget, block) + 2)
    taps = tuple(drafter.target_layer_ids) if cfg.method != "ar" and drafter.needs_features else ()
    sampler = Sampler(cfg.temperature, cfg.seed)
    eos = set(target.config.eos_token_ids) if cfg.stop_on_eos else set()
    draft_k = min(vocab, max(cfg.budget if cfg.method == "ddtree" else 1, cfg.draft_trace_k))

    clock = _Clock(device, cfg.profile)
    start = clock.now()
    out = target.run_chain(prompt, cache, taps=taps, logits="last")
    check_finite(out.logits, "prefill", 0)
    bonus = int(sampler.choose(out.logits[-1:], torch.tensor([len(prompt)], device=device))[0])
    if cfg.method != "ar":
        drafter.begin(prompt, out.taps, cache.capacity)
    prefill_seconds = clock.lap()

    generated, rounds, stop = [bonus], [], None
    if progress:
        progress(1)
    if bonus in eos:
        stop = "eos"
    elif len(generated) >= cfg.max_new_tokens:
        stop = "max_new_tokens"
    while stop is None:
        r = len(rounds)
        position = cache.length  # the root (this round's bonus token) sits here
        if position + block + 1 > context:
            stop = "context"
            break
        timings = {}
        # 1. draft: one drafter pass gives every depth's top-k
        draft = drafter.propose(bonus, position, draft_k) if cfg.method != "ar" else None
        if draft is not None and bool(torch.isnan(draft.logprobs).any()):
            raise FloatingPointError(f"round {r}: drafter log-probs contain NaN; stopping")
        timings["draft"] = clock.lap()
        # 2. tree: best-first under the budget, the argmax chain, or the root alone
        tree = build_tree(cfg.method, draft, bonus, cfg.budget)
        compiled = compile_tree(tree, position, device)
        timings["tree"] = clock.lap()
        # 3. verify: the whole tree in one target pass
        verified = target(compiled, cache, cfg.recurrent, taps)
        check_finite(verified.logits, "target", r)
        timings["verify"] = clock.lap()
        # 4. walk: follow the target's own choices through the tree
        accepted, new_bonus, choices = walk(tree, compiled, verified.logits, sampler)
        top_tokens, top_logprobs = _topk_lists(verified.logits, cfg.trace_topk)
        timings["walk"] = clock.lap()
        # 5. commit: keep the accepted path's KV rows and the last accepted node's recurrent state
        cache.commit(accepted)
        if cfg.method != "ar":
            idx = torch.tensor(accepted, device=device)
            drafter.commit([tree.tokens[n] for n in accepted], verified.taps[idx] if taps else None)
        timings["commit"] = clock.lap()

        rounds.append(
            RoundTrace(
                index=r,
                prefix_len=position,
                root=bonus,
                tree=tree.to_dict(),
                draft_tokens=draft.tokens.tolist() if draft is not None else None,
                draft_logprobs=draft.logprobs.tolist() if draft is not None else None,
                target_top_tokens=top_tokens,
                target_top_logprobs=top_logprobs,
                choices=[int(c) for c in choices],
                accepted=accepted,
                bonus=new_bonus,
                timings=timings,
            )
        )
        new_tokens = [tree.tokens[n] for n in accepted[1:]] + [new_bonus]
        stop = extend_generated(generated, new_tokens, eos, cfg.max_new_tokens)
        if progress:
            progress(len(new_tokens))
        bonus = new_bonus
    decode_seconds = clock.now() - start - prefill_seconds

    settings = asdict(cfg)
    settings["target"] = getattr(target, "source_directory", None)
    settings["drafter"] = getattr(drafter, "name", getattr(drafter, "kind", None)) if drafter is not None else None
    return Trace(
        prompt_ids=prompt,
        generated_ids=generated,
        rounds=rounds,
        settings=settings,
        prefill_seconds=prefill_seconds,
        decode_seconds=decode_seconds,
        stop_reason=stop,
        text=tokenizer.decode(generated) if tokenizer is not None else None,
        prompt_text=tokenizer.decode(prompt) if tokenizer is not None else None,
    )
