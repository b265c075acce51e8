"""The device fast path of the round loop: static buffers, CUDA graphs, one host sync per round.

Same rounds as :func:`workbench.engine.generate` (the reference it is tested against), with
everything a round needs kept on the device:

    graph "draft"   bonus, position, last round's accepted features -> per-depth top-k
    graph "round"   top-k -> tree (static best-first) -> verify -> choices -> walk -> commit
    host            queue round i+1, read round i's result (the one sync), decide to stop, record the trace

Shapes are fixed per (method, budget): the tree always has ``budget + 1`` slots, attention
reads the whole KV buffer masked by a device prefix length, commits take a padded path. On
CUDA both steps are captured as graphs per budget bucket; elsewhere they run eagerly (same
code), which is how the CPU tests compare this path with the reference engine.

Supported: DFlash and oracle drafters (or AR) on dense and hybrid targets without MoE layers,
modes fork and unsafe. Anything else (paths/slots, MoE routing) runs in the reference engine.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import torch

from .engine import GenerationConfig, check_prompt, extend_generated
from .trace import RoundTrace, Trace
from .tree import CompiledTree, build_chain_static, build_ddtree_static, chain_skeleton, static_ancestor_mask
from .verify import Sampler, check_finite, choose_static, gdn_decode_step_enabled, walk_static


class FastPathUnsupported(ValueError):
    pass


_commit_in_forward = True


@contextlib.contextmanager
def use_commit_in_forward(enabled: bool = True):
    """Engines built inside the block commit the AR step in the forward (default) or not: the
    switch bench.e2e --commit-in-forward measures side by side."""
    global _commit_in_forward
    old, _commit_in_forward = _commit_in_forward, bool(enabled)
    try:
        yield
    finally:
        _commit_in_forward = old


@contextlib.contextmanager
def compiled_layers(target, enabled: bool = True, fused_norms: bool = False):
    """Run the target's decoder layers through ``torch.compile`` (fusing the many small
    elementwise kernels of a decode step) for the duration of the block.

    One compiled function serves every layer of a kind (parameters are inputs, not
    constants), so compile time does not grow with depth. Graph capture works on top.
    ``fused_norms`` (default off): the hand-fused Triton norms are opaque to inductor, so by
    default the layers run the plain-torch norms and inductor fuses them with their neighbours
    (the residual adds, the gate's SiLU, the dtype casts).
    """
    if not enabled:
        yield target
        return
    import torch._dynamo
    import tree_kernels as tk

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    old = target.layer_fn
    target.layer_fn = torch.compile(_call_layer, dynamic=False)
    try:
        with tk.use_fused_norms(fused_norms):
            yield target
    finally:
        target.layer_fn = old


def _call_layer(layer, x, tree, cache, cos, sin, mode, delta=None):
    return layer(x, tree, cache, cos, sin, mode, delta)


def check_supported(target, drafter, config: GenerationConfig) -> None:
    if config.recurrent not in ("fork", "unsafe"):
        raise FastPathUnsupported(f"the fast path runs recurrent modes fork and unsafe, not {config.recurrent!r}")
    if any(target.config.is_moe_layer(i) for i in range(target.config.num_hidden_layers)):
        raise FastPathUnsupported("the fast path does not run mixture-of-experts layers (their routing is data-dependent)")
    if config.method != "ar" and not hasattr(drafter, "propose_static"):
        raise FastPathUnsupported(f"the fast path needs a drafter with propose_static, not {type(drafter).__name__}")


@dataclass
class _Buffers:
    """Graph inputs and outputs: persistent device tensors updated in place."""

    position: torch.Tensor  # [] committed length = the bonus token's position
    bonus: torch.Tensor  # [] this round's root
    features: torch.Tensor  # [L + 1, n_taps * H] accepted features of the last round
    count: torch.Tensor  # [] valid rows in features (accepted nodes incl. root)
    draft_tokens: torch.Tensor  # [L, k]
    draft_logprobs: torch.Tensor  # [L, k]
    out: dict = field(default_factory=dict)  # tensors written by the round step


@dataclass
class _QueuedRound:
    slot: torch.Tensor  # host tensor the round's packed result is copied into
    start: "torch.cuda.Event | None"  # device timestamps around the round (CUDA only)
    end: "torch.cuda.Event | None"

    def wait(self) -> torch.Tensor:
        if self.end is not None:
            self.end.synchronize()
        return self.slot


# Device timestamps inside the captured steps (FastEngine(phase_events=True)): recorded as event
# nodes of the graphs, so each replay stamps the boundaries between a round's phases.
PHASE_MARKS = ("draft_start", "draft_end", "round_start", "tree", "verify", "walk", "commit", "round_end")
ROUND_PHASES = (("tree", "round_start", "tree"), ("verify", "tree", "verify"), ("walk", "verify", "walk"),
                ("commit", "walk", "commit"), ("pack", "commit", "round_end"))


def phase_ms(elapsed, drafted: bool) -> dict:
    """GPU ms of one round's phases from ``elapsed(a, b)`` (ms between marks a and b): the draft
    step (when one ran: the first round's drafts come from the prefill), the round step's tree
    build, verify forward, choices + walk, commit (caches, features, counters) and the packing of
    the host's result; ``round`` is the round step whole, ``gap`` the device time between the
    draft graph's end and the round graph's start."""
    out = {name: elapsed(a, b) for name, a, b in ROUND_PHASES}
    out["round"] = elapsed("round_start", "round_end")
    if drafted:
        out["draft"] = elapsed("draft_start", "draft_end")
        out["gap"] = elapsed("draft_end", "round_start")
    return out


def _record_event() -> "torch.cuda.Event":
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class FastEngine:
    """Generate with static shapes; CUDA graphs on CUDA (``use_graphs`` forces on/off)."""

    def __init__(self, target, drafter, config: GenerationConfig, max_len: int, use_graphs: bool | None = None,
                 overlap_host: bool = True, phase_events: bool = False):
        self.cfg = config.validate()
        self.overlap_host = overlap_host  # keep the device one round ahead of the host
        if phase_events and overlap_host:
            # a round queued ahead would stamp the marks again before the host read them
            raise ValueError("FastEngine: phase_events needs overlap_host=False (each round read before the next is queued)")
        check_supported(target, drafter, config)
        self.target = target
        self.drafter = drafter if config.method != "ar" else None
        self.device = target.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise FastPathUnsupported("CUDA graphs need a CUDA target")
        if phase_events and self.device.type != "cuda":
            raise FastPathUnsupported("phase_events are CUDA events: they need a CUDA target")
        # per-phase device timestamps (bench.e2e --graph-phases); None: no marks in the steps
        self._marks = ({m: torch.cuda.Event(enable_timing=True, external=True) for m in PHASE_MARKS}
                       if phase_events else None)
        self.sampler = Sampler(config.temperature, config.seed)
        self.block = self.drafter.block_size if self.drafter else 1
        self.depth = self.block - 1  # tree depth L
        self.nodes = {"ar": 1, "dflash": self.block, "ddtree": config.budget + 1}[config.method]
        self.k = min(target.config.vocab_size, config.budget if config.method == "ddtree" else 1)
        self.taps = tuple(self.drafter.target_layer_ids) if self.drafter else ()
        self.trace_k = min(self.k, config.draft_trace_k)
        self.max_len = max_len
        # room for one round queued ahead of the host past max_len (see _room_ahead)
        self.cache = target.new_cache(max_len + self.nodes + 2 + self._path_size)
        # each step gathers its rotary rows from a table (Rotary.table_rows), which the graphs read: kept here
        self._rotary_table = target.rotary.build_table(self.cache.capacity, target.dtype)
        hidden = target.config.hidden_size * max(1, len(self.taps))
        dev = self.device
        self.buf = _Buffers(
            position=torch.zeros((), dtype=torch.int64, device=dev),
            bonus=torch.zeros((), dtype=torch.int64, device=dev),
            features=torch.zeros(self.depth + 1, hidden, dtype=target.dtype, device=dev),
            count=torch.zeros((), dtype=torch.int64, device=dev),
            draft_tokens=torch.zeros(max(self.depth, 1), max(self.k, 1), dtype=torch.int64, device=dev),
            draft_logprobs=torch.zeros(max(self.depth, 1), max(self.k, 1), dtype=torch.float32, device=dev),
        )
        # a chain's parents, depths, ranks and validity never change: built once, outside the graphs
        self._chain = chain_skeleton(self.depth if config.method == "dflash" else 0, dev) if config.method != "ddtree" else None
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self._slots: list[torch.Tensor] | None = None  # host copies of the packed result, one per queued round
        # AR: the one node is always accepted, so the recurrent layers commit during the forward
        # (two launches fewer per GDN layer, seven per attention layer). Tied to the decode-step
        # switch so that use_gdn_decode_step(False) still measures the fork + commit route.
        self.commit_in_forward = config.method == "ar" and _commit_in_forward and gdn_decode_step_enabled()

    # -- the two steps (pure tensor code on the buffers) ---------------------------------------
    def _mark(self, name: str) -> None:
        if self._marks is not None:
            self._marks[name].record()

    def _draft_step(self) -> None:
        b = self.buf
        self._mark("draft_start")
        draft = self.drafter.propose_static(b.bonus, b.position, b.features, b.count, self.k)
        b.draft_tokens.copy_(draft.tokens)
        b.draft_logprobs.copy_(draft.logprobs)
        self._mark("draft_end")

    def _round_step(self) -> None:
        b, cfg = self.buf, self.cfg
        self._mark("round_start")
        if cfg.method == "ddtree":
            st = build_ddtree_static(b.draft_tokens, b.draft_logprobs, cfg.budget, b.bonus)
        elif cfg.method == "dflash":
            st = build_chain_static(b.draft_tokens, b.draft_logprobs, b.bonus, self._chain)
        else:
            st = build_chain_static(b.draft_tokens[:0], b.draft_logprobs[:0], b.bonus, self._chain)
        max_depth = self.depth if cfg.method != "ar" else 0
        anc = static_ancestor_mask(st.parents, max_depth)
        tree = CompiledTree(st.tokens, st.parents, st.depths, b.position + st.depths, anc, -1, cfg.method != "ddtree", b.position,
                            commit_in_forward=self.commit_in_forward, rooted=True)  # static trees: node 0 is the root
        self._mark("tree")
        out = self.target(tree, self.cache, cfg.recurrent, self.taps)
        self._mark("verify")
        choices = choose_static(self.sampler, out.logits, st.depths, b.position + 1, max_depth)
        walk = walk_static(st.tokens, st.parents, st.depths, st.valid, anc, choices, max_depth)
        self._mark("walk")
        if not tree.commit_in_forward:  # (AR: the forward already moved the recurrent state)
            self.cache.commit_static(b.position, walk.path, walk.count)
        if self.taps:
            b.features.copy_(out.taps[walk.path])
        b.count.copy_(walk.count)
        b.position.add_(walk.count)
        b.bonus.copy_(walk.bonus)
        self._mark("commit")
        finite = torch.isfinite(out.logits).all()
        # everything the host reads after the round, packed into one buffer: one transfer. The
        # parts are grouped by dtype (one concatenation and one fp64 conversion per group, about
        # 7 launches instead of two per part); _packed_layout gives the order _unpack reads
        ints = [walk.count.reshape(1), walk.bonus.reshape(1), walk.path, st.tokens, st.parents, st.depths, st.ranks,
                choices]
        flags = [finite.reshape(1), st.valid]
        floats = [st.scores]
        if cfg.trace_topk:
            top = torch.topk(torch.log_softmax(out.logits.float(), -1), min(cfg.trace_topk, out.logits.shape[-1]), -1)
            ints.append(top.indices)
            floats.append(top.values)
        if self.drafter is not None and cfg.draft_trace_k:
            ints.append(b.draft_tokens[:, : self.trace_k])
            floats.append(b.draft_logprobs[:, : self.trace_k])
        groups = [torch.cat([p.reshape(-1).to(dtype) for p in parts]) for parts, dtype in
                  ((ints, torch.int64), (flags, torch.bool), (floats, torch.float32))]
        b.out["packed"] = torch.cat([g.to(torch.float64) for g in groups])
        self._mark("round_end")

    def _launch_round(self, first: bool) -> None:
        """Queue one round: the draft step (the first round's drafts came from the prefill) and the round step."""
        if self.drafter is not None and not first:
            self._run("draft", self._draft_step)
        self._run("round", self._round_step)

    def _queue_round(self, first: bool, queued: list) -> "_QueuedRound":
        """Queue one round and a copy of its packed result into a host slot (two slots: a third
        round is queued only after the host has read the first)."""
        cuda = self.device.type == "cuda"
        start = _record_event() if cuda else None
        self._launch_round(first)
        packed = self.buf.out["packed"]
        if self._slots is None:
            self._slots = [torch.empty(packed.shape, dtype=packed.dtype, pin_memory=cuda) for _ in range(2)]
        slot = self._slots[len(queued) % 2]
        slot.copy_(packed, non_blocking=cuda)
        job = _QueuedRound(slot, start, _record_event() if cuda else None)
        queued.append(job)
        return job

    def _room_ahead(self, generated: int, context: int) -> bool:
        """Whether a round may be queued behind the one unread round: it must fit the context and
        the cache wherever that round ends (it advances by at most the path), and not be certain to
        go unused (every round adds at least one token)."""
        top = self.cache.length + self._path_size
        return (generated + 1 < self.cfg.max_new_tokens and top + self.block + 1 <= context
                and top + self.nodes + 2 <= self.cache.capacity)

    def _run(self, name: str, fn) -> None:
        if not self.use_graphs:
            fn()
            return
        graph = self.graphs.get(name)
        if graph is None:
            from tree_kernels._triton_common import scratch_scope

            # warm up on a side stream, then capture; replays reuse the captured memory. Kernel
            # scratch buffers are private to the graph (eager calls may regrow the shared ones)
            with scratch_scope(("graph", id(self), name)):
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                saved = self._snapshot()
                with torch.cuda.stream(stream):
                    fn()
                torch.cuda.current_stream().wait_stream(stream)
                self._restore(saved)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                self._restore(saved)
            self.graphs[name] = graph
        graph.replay()

    def _snapshot(self):
        """Everything a step mutates, so warm-up and capture leave no trace."""
        tensors = [self.buf.position, self.buf.bonus, self.buf.features, self.buf.count, self.buf.draft_tokens, self.buf.draft_logprobs]
        for c in self.cache.layers:
            tensors += [c.k, c.v] if hasattr(c, "k") else [c.state, c.conv_state]
        for c in getattr(self.drafter, "caches", []):
            tensors += [c.k, c.v]
        return [(t, t.clone()) for t in tensors]

    @staticmethod
    def _restore(saved) -> None:
        for t, copy in saved:
            t.copy_(copy)

    # -- generation ----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt_ids, tokenizer=None, progress=None) -> Trace:
        cfg = self.cfg
        prompt = check_prompt(prompt_ids, self.target)
        if len(prompt) + cfg.max_new_tokens > self.max_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({cfg.max_new_tokens}) exceeds the engine's max_len {self.max_len}")
        for c in self.cache.layers:  # a fresh generation: reset the committed state
            if hasattr(c, "k"):
                c.length = 0
            else:
                c.state.zero_()
                c.conv_state.zero_()
        self.cache.length = 0
        sync = self.device.type == "cuda"
        t0 = time.perf_counter()
        out = self.target.run_chain(prompt, self.cache, taps=self.taps, logits="last")
        check_finite(out.logits, "prefill", 0)
        bonus = int(self.sampler.choose(out.logits[-1:], torch.tensor([len(prompt)], device=self.device))[0])
        b = self.buf
        b.position.fill_(len(prompt))
        b.bonus.fill_(bonus)
        if self.drafter is not None:
            self.drafter.begin(prompt, out.taps, self.cache.capacity + self.block)
            first = self.drafter.propose(bonus, len(prompt), self.k)  # the prompt context, eagerly, once
            b.draft_tokens.copy_(first.tokens)
            b.draft_logprobs.copy_(first.logprobs)
        if sync:
            torch.cuda.synchronize()
        prefill_seconds = time.perf_counter() - t0

        generated, rounds, stop = [bonus], [], None
        eos = set(self.target.config.eos_token_ids) if cfg.stop_on_eos else set()
        context = self.target.config.max_position_embeddings
        if bonus in eos:
            stop = "eos"
        elif len(generated) >= cfg.max_new_tokens:
            stop = "max_new_tokens"
        # Rounds on the device's queue that the host has not read yet, oldest first. With
        # overlap_host the device is kept one round ahead: round i+1 is queued before the host
        # waits on round i, so the host's reading, stopping and recording run while the device
        # works (each round reads only device buffers the one before wrote).
        pending: deque[_QueuedRound] = deque()
        queued: list[_QueuedRound] = []
        host_busy, queued_ahead = 0.0, 0  # host time in the loop outside the waits; rounds queued ahead
        while stop is None:
            h0 = time.perf_counter()
            position = self.cache.length
            if not pending:
                if position + self.block + 1 > context:
                    stop = "context"
                    break
                pending.append(self._queue_round(first=not queued, queued=queued))
            if self.overlap_host and len(pending) == 1 and self._room_ahead(len(generated), context):
                pending.append(self._queue_round(first=False, queued=queued))
                queued_ahead += 1
            h1 = time.perf_counter()
            current = pending.popleft()
            packed = current.wait()  # the one host sync of the round
            h2 = time.perf_counter()
            got = self._unpack(packed.tolist())
            count = got["count"]
            if not got["finite"]:
                raise FloatingPointError(f"round {len(rounds)}: target logits contain NaN or inf; stopping")
            path = got["path"][:count]
            self.cache.length = position + count
            for c in self.cache.layers:
                if hasattr(c, "k"):
                    c.length = position + count
            new_tokens = [got["tokens"][n] for n in path[1:]] + [got["bonus"]]
            stop = extend_generated(generated, new_tokens, eos, cfg.max_new_tokens)
            timings = {"launch": h1 - h0, "sync": h2 - h1}
            if self._marks is not None:  # (serial host: this round's marks are not yet stamped again)
                marks = self._marks
                gpu = phase_ms(lambda a, b_: marks[a].elapsed_time(marks[b_]), drafted=self.drafter is not None and len(rounds) > 0)
                timings.update({f"gpu_{k}_ms": v for k, v in gpu.items()})
            rounds.append(self._round_trace(len(rounds), position, bonus, path, got, timings))
            if progress:
                progress(len(new_tokens))
            bonus = got["bonus"]
            host_busy += (h1 - h0) + (time.perf_counter() - h2)
        if sync:  # a round queued ahead and not needed still ran: its time is charged to the decode
            torch.cuda.synchronize()
        # the time the device sat idle between rounds, waiting for the host to queue the next one
        # (device timestamps); without them (CPU) the host's time in the loop outside the waits
        gaps = [a.end.elapsed_time(b.start) / 1e3 for a, b in zip(queued, queued[1:])] if sync else []
        host_seconds = sum(gaps) if sync else host_busy
        worst = max(range(len(gaps)), key=gaps.__getitem__) if gaps else None  # where the device waited longest
        decode_seconds = time.perf_counter() - t0 - prefill_seconds
        settings = asdict(cfg)
        settings.update(target=getattr(self.target, "source_directory", None), engine="fast", graphs=self.use_graphs,
                        host_seconds=host_seconds, host_busy_seconds=host_busy, rounds_queued=len(queued),
                        rounds_queued_ahead=queued_ahead, host_gap_max_seconds=gaps[worst] if gaps else 0.0,
                        host_gap_max_round=worst)
        settings["drafter"] = getattr(self.drafter, "name", None) if self.drafter is not None else None
        return Trace(
            prompt_ids=prompt, generated_ids=generated, rounds=rounds, settings=settings,
            prefill_seconds=prefill_seconds, decode_seconds=decode_seconds, stop_reason=stop,
            text=tokenizer.decode(generated) if tokenizer is not None else None,
            prompt_text=tokenizer.decode(prompt) if tokenizer is not None else None,
        )

    @property
    def _path_size(self) -> int:  # the padded path's slots in the packed buffer
        return (self.depth if self.cfg.method != "ar" else 0) + 1

    def _packed_layout(self) -> list[tuple[str, int, type]]:
        """(field, length, kind) in the packed buffer's order: the integers, the flags, the floats
        (as _round_step groups them)."""
        n, d = self.nodes, self._path_size
        topk = min(self.cfg.trace_topk, self.target.config.vocab_size) if self.cfg.trace_topk else 0
        drafts = self.drafter is not None and self.cfg.draft_trace_k
        ints = [("count", 1, int), ("bonus", 1, int), ("path", d, int), ("tokens", n, int), ("parents", n, int),
                ("depths", n, int), ("ranks", n, int), ("choices", n, int)]
        ints += [("top_tokens", n * topk, int)] if topk else []
        ints += [("draft_tokens", self.depth * self.trace_k, int)] if drafts else []
        floats = [("scores", n, float)]
        floats += [("top_logprobs", n * topk, float)] if topk else []
        floats += [("draft_logprobs", self.depth * self.trace_k, float)] if drafts else []
        return ints + [("finite", 1, bool), ("valid", n, bool)] + floats

    def _unpack(self, packed: list[float]) -> dict:
        got, i = {}, 0
        for name, size, kind in self._packed_layout():
            got[name] = [kind(x) for x in packed[i : i + size]]
            i += size
        if i != len(packed):
            raise RuntimeError(f"fast path: packed round result has {len(packed)} values, the layout {i}")
        for name in ("count", "bonus", "finite"):
            got[name] = got[name][0]
        for name, rows in (("top_tokens", self.nodes), ("top_logprobs", self.nodes), ("draft_tokens", self.depth),
                           ("draft_logprobs", self.depth)):
            if name in got:  # row-major [rows, k]
                k = len(got[name]) // rows
                got[name] = [got[name][r * k : (r + 1) * k] for r in range(rows)]
        return got

    def _round_trace(self, index, position, root, path, got, timings) -> RoundTrace:
        ids = [i for i, v in enumerate(got["valid"]) if v]
        remap = {old: new for new, old in enumerate(ids)}
        tree = {
            "tokens": [got["tokens"][i] for i in ids],
            "parents": [-1 if got["parents"][i] < 0 else remap[got["parents"][i]] for i in ids],
            "depths": [got["depths"][i] for i in ids],
            "scores": [got["scores"][i] for i in ids],
            "ranks": [got["ranks"][i] for i in ids],
        }
        return RoundTrace(
            index=index, prefix_len=position, root=root, tree=tree,
            draft_tokens=got.get("draft_tokens"), draft_logprobs=got.get("draft_logprobs"),
            target_top_tokens=[got["top_tokens"][i] for i in ids] if "top_tokens" in got else [],
            target_top_logprobs=[got["top_logprobs"][i] for i in ids] if "top_logprobs" in got else [],
            choices=[got["choices"][i] for i in ids], accepted=[remap[n] for n in path], bonus=got["bonus"], timings=timings,
        )
