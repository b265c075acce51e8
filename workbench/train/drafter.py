"""DFlash drafter training against a frozen target.

Per step: a batch of sequences (corpus windows, and optionally the target's own greedy
continuations of corpus prompts: the "response text" it will be asked to draft at inference),
the frozen target's features at ``target_layer_ids`` (outputs of those decoder layers, through
``taps``), several random anchors per sequence. Each anchor ``a`` makes one block
``[x_a, MASK x (B-1)]`` at positions ``a .. a+B-1`` whose context is the features of tokens
``0 .. a-1``; attention is bidirectional inside the block and blocks never see each other.
The target's embedding embeds the block and the target's lm_head reads the last B-1 outputs;
the loss is cross-entropy on ``x_{a+1} .. x_{a+B-1}`` with per-position weight ``exp(-(k-1)/gamma)``.

``block_logits`` is the training-time forward; it equals what ``DFlashDrafter.propose`` computes
at inference for the same context (tests/test_train.py checks that).
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from ..drafters.dflash import DFlashDraftModel, check_pair, parse_dflash_config
from ..models import CausalLM, load_target
from ..models.config import load_target_config
from .common import Logger, TrainError, autocast_for, device_name, peak_memory, pick_device, seed_everything, sha256_file, versions
from .corpus import MASK_TOKEN, Corpus, check_corpus_tokenizer, is_prepared, load_corpus, prepare_corpus
from .export import export_drafter, utc_now, write_card
from .fast import batched_hidden, greedy_generate
from .loop import Schedule, parse_steps, run_steps, smoothed_loss, step_generator, windows_at
from .presets import drafter_config_dict


# ----------------------------------------------------------------------------------------------
# the training-time forward


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, N, H, D]; cos, sin [B, N, R] (per-row positions); channels past R pass through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


def check_trainable(config) -> None:
    if config.is_causal or any(t != "full_attention" for t in config.layer_types):
        raise TrainError("drafter training supports non-causal full_attention layers only (the DFlash default)")


def block_logits(drafter: DFlashDraftModel, target: CausalLM, tokens: torch.Tensor, features: torch.Tensor,
                 anchors: torch.Tensor) -> torch.Tensor:
    """tokens [B, T]; features [B, T, n_taps * H] (the target's taps at every position); anchors [B, nb]
    with 1 <= a <= T - block_size. Returns logits [B, nb, block_size - 1, V] for positions a+1 .. a+B-1."""
    c = drafter.config
    s = c.block_size
    b, t = tokens.shape
    nb = anchors.shape[1]
    if int(anchors.min()) < 1 or int(anchors.max()) > t - s:
        raise ValueError(f"anchors must lie in [1, {t - s}] for sequences of {t} tokens and blocks of {s}")
    dev = tokens.device
    ctx = drafter.hidden_norm(drafter.fc(features))  # [B, T, H]
    block = torch.full((b, nb, s), c.mask_token_id, dtype=torch.int64, device=dev)
    block[..., 0] = tokens.gather(1, anchors)
    x = target.embed(block.view(b, nb * s)) * c.input_embedding_scale  # [B, L, H]
    big = nb * s
    pos_q = (anchors[..., None] + torch.arange(s, device=dev)).view(b, big)
    cos_q, sin_q = drafter.rotary.cos_sin(pos_q.reshape(-1), x.dtype)
    cos_q, sin_q = cos_q.view(b, big, -1), sin_q.view(b, big, -1)
    cos_c, sin_c = drafter.rotary.cos_sin(torch.arange(t, device=dev), x.dtype)
    cos_k = torch.cat([cos_c.expand(b, -1, -1), cos_q], dim=1)
    sin_k = torch.cat([sin_c.expand(b, -1, -1), sin_q], dim=1)
    # visibility: context rows before the block's anchor, and the block's own rows (both directions)
    anchor_of_row = anchors.repeat_interleave(s, dim=1)  # [B, L]
    ctx_visible = torch.arange(t, device=dev)[None, None, :] < anchor_of_row[..., None]  # [B, L, T]
    block_id = torch.arange(big, device=dev) // s
    own = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)
    mask = torch.cat([ctx_visible, own], dim=-1)[:, None]  # [B, 1, L, T + L]
    for layer in drafter.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = _rope(a.q_norm(a.q_proj(h).view(b, big, a.heads, a.head_dim)), cos_q, sin_q)
        both = torch.cat([ctx.to(h.dtype), h], dim=1)
        k = _rope(a.k_norm(a.k_proj(both).view(b, t + big, a.kv_heads, a.head_dim)), cos_k, sin_k)
        v = a.v_proj(both).view(b, t + big, a.kv_heads, a.head_dim)
        group = a.heads // a.kv_heads
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.to(q.dtype).repeat_interleave(group, dim=2).transpose(1, 2),
            v.to(q.dtype).repeat_interleave(group, dim=2).transpose(1, 2),
            attn_mask=mask,
            scale=a.head_dim**-0.5,
        )
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, big, a.heads * a.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    hidden = drafter.norm(x).view(b, nb, s, -1)[:, :, 1:]
    logits = target.logits_from_hidden(hidden).float() * c.output_multiplier
    if c.final_logit_softcapping:
        logits = torch.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
    return logits


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def block_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float) -> tuple[torch.Tensor, dict]:
    """Position-decayed CE, normalised by the weights; plus the top-1 metrics of the blocks."""
    b, nb, d, v = logits.shape
    ce = F.cross_entropy(logits.reshape(-1, v), labels.reshape(-1), reduction="none").view(b, nb, d)
    w = position_weights(d + 1, gamma, logits.device)
    loss = (ce * w).sum(-1).mean() / w.sum()
    with torch.no_grad():
        correct = logits.argmax(-1) == labels
        run = correct.float().cumprod(-1).sum(-1)  # accepted drafts of a chain, if the labels were the target's choices
        metrics = {"acc1": float(correct[..., 0].float().mean()), "tau_est": 1.0 + float(run.mean())}
    return loss, metrics


def sample_anchors(lengths_lo: torch.Tensor, t: int, block: int, per_seq: int, g: torch.Generator) -> torch.Tensor:
    """Distinct anchors per row in [lo_row, t - block] (lo >= 1). [B, per_seq] int64."""
    rows = []
    for lo in lengths_lo.tolist():
        lo = max(1, int(lo))
        span = t - block - lo + 1
        if span < 1:
            raise TrainError(f"no room for a block of {block} after position {lo} in a sequence of {t} tokens")
        if span >= per_seq:
            pick = torch.randperm(span, generator=g)[:per_seq]
        else:
            pick = torch.randint(0, span, (per_seq,), generator=g)
        rows.append(pick + lo)
    return torch.stack(rows).sort(dim=1).values


# ----------------------------------------------------------------------------------------------
# self-distillation data: the target's own greedy continuations of corpus prompts


@torch.no_grad()
def self_distill(target: CausalLM, tokens: torch.Tensor, count: int, length: int, prompt_lens: list[int], batch: int,
                 seed: int, device, log=print, max_seconds: float | None = None, taps=(), prompt_bank: torch.Tensor | None = None):
    """``count`` sequences of ``length`` tokens: a corpus window of a (seeded) prompt length, then the
    target's greedy continuation. Returns (sequences [count, length], prompt lengths [count]).
    With ``max_seconds`` generation stops after the batch that crosses it (at least one batch).
    With ``taps`` the features of every position come too (bf16, from the generation's own passes):
    (sequences, prompt lengths, features). With ``prompt_bank`` [N, P] the prompts are its rows, in order.
    """
    import time

    t0 = time.time()
    if any(not 1 <= p < length for p in prompt_lens):
        raise TrainError(f"prompt lengths {prompt_lens} must lie in [1, {length})")
    device = torch.device(device)
    seqs, plens, feats = [], [], []
    done = 0
    i = 0
    while done < count:
        n = min(batch, count - done)
        g = step_generator(seed, i, stream=7)
        if prompt_bank is not None:
            n = min(n, prompt_bank.shape[0] - done)
            if n <= 0:
                break
            p = prompt_bank.shape[1]
            prompts = prompt_bank[done : done + n].to(device)
        else:
            p = prompt_lens[int(torch.randint(0, len(prompt_lens), (1,), generator=g))]
            prompts = windows_at(tokens, i, seed + 17, n, p).to(device)
        out = greedy_generate(target, prompts, length - p, autocast=autocast_for(device), taps=taps, tap_dtype=torch.bfloat16)
        if taps:
            out, f = out
            feats.append(f.cpu())
        seqs.append(out.cpu())
        plens.append(torch.full((n,), p, dtype=torch.int64))
        done += n
        i += 1
        log(f"self-distillation: {done}/{count} sequences (prompt {p} + {length - p} generated tokens)")
        if max_seconds is not None and time.time() - t0 > max_seconds and done < count:
            log(f"self-distillation: time budget of {max_seconds:.0f}s reached after {done} sequences")
            break
    if taps:
        return torch.cat(seqs), torch.cat(plens), torch.cat(feats)
    return torch.cat(seqs), torch.cat(plens)


def docstring_prompts(corpus: Corpus, tokenizer_dir: str | Path, length: int, count: int, seed: int) -> torch.Tensor:
    """Task-shaped prompts from the *training* files: the ``length`` tokens that end where a function's
    docstring ends (signature + docstring, and whatever precedes them), as HumanEval-style prompts look.
    ``count`` rows of the bank (:func:`docstring_bank`) in a seeded order."""
    bank = docstring_bank(corpus, tokenizer_dir, length)
    order = torch.randperm(bank.shape[0], generator=torch.Generator().manual_seed(seed))
    return bank[order[:count]]


def docstring_bank(corpus: Corpus, tokenizer_dir: str | Path, length: int) -> torch.Tensor:
    """Every docstring-ending prompt of ``length`` tokens in the training files, in file order [N, length].

    Built from the files the corpus was made from (they must match its fingerprint) and cached beside the
    corpus (``docstring-prompts-<length>.safetensors``, keyed by the train fingerprint and tokenizer), so a
    machine with another Python's standard library can train on a corpus carried to it."""
    import ast

    from tokenizers import Tokenizer

    from .common import atomic_write_bytes
    from .corpus import collect_documents, fingerprint, split_documents

    m = corpus.manifest
    tok_path = Path(tokenizer_dir) / "tokenizer.json"
    key = json.dumps({"length": length, "train": m["fingerprint"]["train"], "tokenizer": sha256_file(tok_path)}, sort_keys=True)
    cache = Path(corpus.directory) / f"docstring-prompts-{length}.safetensors"
    if cache.is_file():
        with safe_open(str(cache), framework="pt") as f:
            if (f.metadata() or {}).get("key") == key:
                return f.get_tensor("prompts").long()
    docs, _ = collect_documents(m["root"], tuple(m.get("suffixes") or (".py",)))
    train, _ = split_documents(docs, float(m["heldout_fraction"]))
    if fingerprint(train) != m["fingerprint"]["train"]:
        raise TrainError(f"{m['root']}: its files differ from the ones the corpus was built from (fingerprint mismatch), "
                         f"and {cache} holds no docstring prompts of {length} tokens for this corpus")
    tok = Tokenizer.from_file(str(tok_path))
    rows = []
    for rel, text in train:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        starts = [0]
        for line in text.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        ends = sorted({starts[node.body[0].end_lineno] for node in ast.walk(tree)
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node)
                       and node.body[0].end_lineno is not None and node.body[0].end_lineno < len(starts)})
        for end in ends:
            ids = tok.encode(text[max(0, end - 8 * length) : end], add_special_tokens=False).ids
            if len(ids) > length:  # drop the first (possibly cut) token and keep the last `length`
                rows.append(ids[-length:])
    if not rows:
        raise TrainError(f"no docstring prompt in the training files has {length} tokens before it")
    from .corpus import _storage_dtype

    bank = torch.tensor(rows, dtype=_storage_dtype(tok.get_vocab_size(with_added_tokens=True)))
    from safetensors.torch import save
    atomic_write_bytes(cache, save({"prompts": bank}, metadata={"key": key}))
    return bank.long()


# ----------------------------------------------------------------------------------------------
# the trainer


@torch.no_grad()
def init_drafter_(model: DFlashDraftModel, seed: int, std: float = 0.02) -> DFlashDraftModel:
    g = torch.Generator().manual_seed(seed)
    n = max(1, model.config.num_hidden_layers)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.fill_(1.0)
        elif p.dim() >= 2:
            s = std / math.sqrt(2 * n) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
            p.copy_(torch.randn(p.shape, generator=g) * s)
        else:
            p.zero_()
    return model


@dataclass
class DrafterHyper:
    batch_size: int = 64
    seq_len: int = 512
    blocks_per_seq: int = 16
    gamma: float = 7.0
    seed: int = 0
    self_distill: int = 0
    distill_fraction: float = 0.75


def resolve_corpus(corpus: str | Path, target_dir: Path, out: Path, log) -> Corpus:
    """A prepared corpus directory, or ``stdlib`` / a directory of ``.py`` files tokenized with the target's tokenizer."""
    if is_prepared(corpus):
        c = load_corpus(corpus)
    else:
        if str(corpus) != "stdlib" and not Path(corpus).is_dir():
            raise TrainError(f"--corpus {corpus}: expected 'stdlib', a directory of .py files, or a prepared corpus (corpus.json)")
        if not (target_dir / "tokenizer.json").is_file():
            raise TrainError(f"{target_dir}: no tokenizer.json to tokenize the corpus with")
        c = load_corpus(prepare_corpus(out / "corpus", target_dir, corpus, log=log))
    return c


def train_drafter(
    *,
    target_dir: str | Path,
    corpus: str | Path,
    out: str | Path,
    steps: int | str,
    batch_size: int = 64,
    seq_len: int = 512,
    blocks_per_seq: int = 16,
    block_size: int | None = None,
    gamma: float = 7.0,
    num_layers: int | None = None,
    intermediate_size: int | None = None,
    target_layer_ids: list[int] | None = None,
    mask_token_id: int | None = None,
    lr: float = 1e-3,
    warmup: int = 200,
    weight_decay: float = 0.1,
    self_distill_count: int = 0,
    distill_prompt_lens: tuple[int, ...] = (64, 128, 192, 256),
    distill_batch: int = 512,
    distill_fraction: float = 0.75,
    distill_seconds: float | None = None,
    distill_seed: int | None = None,
    distill_prompts: str = "windows",
    cache_features: bool = False,
    init_from: str | Path | None = None,
    seed: int = 0,
    device: str = "auto",
    checkpoint_every: int = 500,
    resume: bool = True,
    max_seconds: float | None = None,
    stop_at: int | None = None,
    max_steps: int | None = None,
    name: str | None = None,
    quiet: bool = False,
    log=None,
) -> Path:
    """Train a DFlash drafter for the target in ``target_dir``; writes ``out/checkpoint`` and ``out/model``."""
    target_dir, out = Path(target_dir), Path(out)
    log = log or Logger(out / "train.log", quiet=quiet, prefix="drafter: ")
    tcfg = load_target_config(target_dir)  # errors about the target come before anything heavy
    if mask_token_id is None:
        from tokenizers import Tokenizer

        tok_path = target_dir / "tokenizer.json"
        mask_token_id = Tokenizer.from_file(str(tok_path)).token_to_id(MASK_TOKEN) if tok_path.is_file() else None
        if mask_token_id is None:
            raise TrainError(f"{target_dir}: the tokenizer has no {MASK_TOKEN} token; pass --mask-token-id (a reserved token id)")
    if init_from is not None:  # the drafter's shape defaults to the one it starts from
        path = Path(init_from) / "config.json"
        if not path.is_file():
            raise TrainError(f"--init-from {init_from}: no config.json (expected a DFlash drafter directory)")
        start_cfg = parse_dflash_config(json.loads(path.read_text()), str(path))
        num_layers = num_layers or start_cfg.num_hidden_layers
        intermediate_size = intermediate_size or start_cfg.intermediate_size
        target_layer_ids = target_layer_ids or list(start_cfg.target_layer_ids)
        block_size = block_size or start_cfg.block_size
    num_layers, block_size = num_layers or 2, block_size or 16
    raw = drafter_config_dict(tcfg, mask_token_id, num_layers=num_layers, intermediate_size=intermediate_size,
                              target_layer_ids=target_layer_ids, block_size=block_size)
    dcfg = parse_dflash_config(raw)
    check_pair(dcfg, tcfg)
    check_trainable(dcfg)
    if seq_len < block_size + 2:
        raise TrainError(f"seq_len {seq_len} leaves no room for a block of {block_size}")
    if not gamma > 0:
        raise TrainError(f"gamma must be > 0, got {gamma}")
    if blocks_per_seq < 1 or batch_size < 1:
        raise TrainError("batch_size and blocks_per_seq must be >= 1")
    if not 0 <= distill_fraction <= 1:
        raise TrainError(f"distill_fraction must be in [0, 1], got {distill_fraction}")
    if distill_prompts not in ("windows", "docstrings"):
        raise TrainError(f"distill_prompts must be 'windows' or 'docstrings', got {distill_prompts!r}")
    if cache_features and self_distill_count < 1:
        raise TrainError("cache_features trains on self-distilled sequences only: give self_distill_count >= 1")
    if cache_features:
        distill_fraction = 1.0
    if init_from is not None:
        init_cfg = start_cfg
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "block_size", "mask_token_id", "target_layer_ids"):
            if getattr(init_cfg, key) != getattr(dcfg, key):
                raise TrainError(f"--init-from {init_from}: {key} is {getattr(init_cfg, key)}, this run needs {getattr(dcfg, key)}")
    data = resolve_corpus(corpus, target_dir, out, log)
    check_corpus_tokenizer(data, target_dir, tcfg.vocab_size)
    dev = pick_device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    seed_everything(seed)
    target = load_target(target_dir, dev, torch.float32)  # frozen (requires_grad False), fp32 master copy
    drafter = DFlashDraftModel(dcfg)
    init_drafter_(drafter, seed)
    if init_from is not None:  # fine-tuning: start from an existing drafter of the same shape
        from ..drafters.dflash import load_dflash

        start = load_dflash(init_from, "cpu", torch.float32, tcfg)
        with torch.no_grad():
            for k, v in drafter.state_dict().items():
                v.copy_(start.state_dict()[k])
    drafter = drafter.to(dev)
    drafter.reset_rotary()
    drafter.requires_grad_(True)
    params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {num_layers} layers, {params:,} parameters, taps {dcfg.target_layer_ids}, block {block_size}, "
        f"mask id {mask_token_id}; target {target_dir} on {device_name(dev)}")

    gen = gen_plen = None
    gen_seconds = 0.0
    distill_file = out / "distill.safetensors"
    dseed = seed if distill_seed is None else distill_seed
    distill_key = json.dumps([self_distill_count, seq_len, list(distill_prompt_lens), dseed, _target_fingerprint(target_dir),
                              distill_prompts])
    gen_feats = None
    if self_distill_count > 0 and resume and distill_file.is_file():
        with safe_open(str(distill_file), framework="pt") as f:
            if f.metadata().get("key") == distill_key:  # the set a resumed run trained on (generation may be time-bounded)
                gen, gen_plen = f.get_tensor("tokens").long(), f.get_tensor("prompt_lens").long()
                gen_seconds = float(f.metadata().get("seconds", 0))
                log(f"self-distillation: reusing {gen.shape[0]} sequences from {distill_file}")
    if self_distill_count > 0 and gen is None:
        import time

        t0 = time.time()
        target.eval()
        gen_taps = tuple(dcfg.target_layer_ids) if cache_features else ()
        if distill_prompts == "docstrings":  # each length its own bank, the count split between them
            parts = []
            for j, plen in enumerate(distill_prompt_lens):
                share = self_distill_count // len(distill_prompt_lens) + (j < self_distill_count % len(distill_prompt_lens))
                bank = docstring_prompts(data, data.directory, plen, share, dseed + j)
                log(f"self-distillation: {bank.shape[0]} docstring prompts of {plen} tokens from the training files")
                left = None if distill_seconds is None else max(1.0, distill_seconds - (time.time() - t0))
                parts.append(self_distill(target, data.train, bank.shape[0], seq_len, [plen], distill_batch, dseed + j, dev, log,
                                          left, taps=gen_taps, prompt_bank=bank))
            made = [torch.cat(col) for col in zip(*parts)]
        else:
            made = self_distill(target, data.train, self_distill_count, seq_len, list(distill_prompt_lens),
                                distill_batch, dseed, dev, log, distill_seconds, taps=gen_taps)
        gen, gen_plen = made[0], made[1]
        gen_feats = made[2] if cache_features else None
        gen_seconds = time.time() - t0
        out.mkdir(parents=True, exist_ok=True)
        save_file({"tokens": gen.to(torch.int32), "prompt_lens": gen_plen}, str(distill_file),
                  metadata={"key": distill_key, "seconds": f"{gen_seconds:.1f}"})
        log(f"self-distillation: {gen.shape[0]} sequences in {gen_seconds:.1f}s")
    if gen is not None:
        gen, gen_plen = gen.to(dev), gen_plen.to(dev)
    if cache_features and gen_feats is None:  # resumed: recompute the features of the saved sequences
        with torch.no_grad(), autocast_for(dev):
            gen_feats = torch.cat([batched_hidden(target, gen[i : i + distill_batch], tuple(dcfg.target_layer_ids))[1].to(torch.bfloat16)
                                   for i in range(0, gen.shape[0], distill_batch)])
    if gen_feats is not None and dev.type == "cuda" and gen_feats.numel() * 2 < 0.4 * torch.cuda.mem_get_info(dev)[0]:
        gen_feats = gen_feats.to(dev)  # a batch is then a device gather, not a host copy per step
    taps = tuple(dcfg.target_layer_ids)

    def batch_at(step):
        g = step_generator(seed, step, stream=3)
        use_gen = gen is not None and float(torch.rand((), generator=g)) < distill_fraction
        idx = None
        if use_gen:
            idx = torch.randint(0, gen.shape[0], (batch_size,), generator=g)
            tokens = gen[idx.to(dev)]
            lo = gen_plen[idx.to(dev)].cpu()
        else:
            tokens = windows_at(data.train, step, seed + 1, batch_size, seq_len).to(dev)
            lo = torch.ones(batch_size, dtype=torch.int64)
        anchors = sample_anchors(lo, seq_len, block_size, blocks_per_seq, g).to(dev)
        return tokens, anchors, use_gen, idx

    def loss_fn(step):
        tokens, anchors, use_gen, idx = batch_at(step)
        if gen_feats is not None and use_gen:
            features = gen_feats[idx.to(gen_feats.device)].to(dev).float()  # cached at generation: the target never runs here
        else:
            with torch.no_grad():
                _, features = batched_hidden(target, tokens, taps)
        logits = block_logits(drafter, target, tokens, features.detach(), anchors)
        offs = anchors[..., None] + torch.arange(1, block_size, device=dev)
        labels = tokens.gather(1, offs.view(batch_size, -1)).view(offs.shape)
        loss, metrics = block_loss(logits, labels, gamma)
        metrics["gen"] = int(use_gen)
        return loss, metrics

    hyper = asdict(DrafterHyper(batch_size, seq_len, blocks_per_seq, gamma, seed, self_distill_count, distill_fraction)) | {
        "config": raw, "target_sha256": _target_fingerprint(target_dir), "corpus": data.manifest["fingerprint"],
        "distill_prompt_lens": list(distill_prompt_lens), "distill_seed": dseed, "cache_features": cache_features,
        "distill_prompts": distill_prompts,
        "init_from": str(init_from) if init_from else None}
    state = {"kind": "drafter", "hyper": hyper}
    steps = parse_steps(steps)
    sched = Schedule(steps=steps, lr=lr, warmup=min(warmup, steps // 10) if steps else warmup, weight_decay=weight_decay)
    state = run_steps(model=drafter, params_model=drafter, sched=sched, loss_fn=loss_fn, device=dev,
                      checkpoint_dir=out / "checkpoint", state=state, checkpoint_every=checkpoint_every, resume=resume,
                      max_seconds=max_seconds, stop_at=stop_at, max_steps=max_steps, log=log, desc="train-drafter", quiet=quiet)
    drafter.eval()
    init_info = None
    if init_from is not None:
        ic = Path(init_from) / "card.json"
        init_info = {"directory": str(init_from), "card_sha256": sha256_file(ic) if ic.is_file() else None,
                     "card": json.loads(ic.read_text()) if ic.is_file() else None}
        if init_info["card"]:
            init_info["card"] = {k: init_info["card"].get(k) for k in ("name", "steps", "data", "device", "date", "training_seconds",
                                                                       "final_train_loss", "eval", "batch", "schedule",
                                                                       "tokens_seen", "initialized_from")}
    evals = {}
    fresh = fresh_plen = None
    if gen is not None:  # continuations of held-out prompts the drafter never saw: the number that predicts tau
        source = data.heldout if data.heldout.numel() > seq_len else data.train
        fresh, fresh_plen = self_distill(target, source, 64, seq_len, list(distill_prompt_lens), min(64, distill_batch),
                                         dseed + 777, dev, lambda m: None)
        fresh, fresh_plen = fresh.to(dev), fresh_plen.to(dev)
    for label, source, g_, p_ in (("corpus_heldout", data.heldout, None, None), ("self_distilled_train", None, gen, gen_plen),
                                  ("self_distilled_heldout_prompts", None, fresh, fresh_plen)):
        ev = evaluate_drafter(drafter, target, source, g_, p_, seq_len, block_size, gamma, seed, dev)
        if ev is not None:
            evals[label] = ev
    log(f"final: train loss (last 50 steps) {smoothed_loss(state):.4f}; " + "; ".join(
        f"{k}: loss {v['loss']:.4f}, tau_est {v['tau_est']:.2f}" for k, v in evals.items()) + peak_memory(dev))
    model_dir = export_drafter(drafter, out / "model")
    steps_done = int(state["step"])
    card = {
        "name": name or f"{target_dir.name}-dflash",
        "summary": f"A DFlash block-diffusion drafter (z-lab layout) trained with the ddtree-workbench recipe against the "
                   f"frozen target {target_dir.name}: features from target layers {list(taps)}, the target's embedding "
                   f"and lm_head, random anchors, block size {block_size}, position-decayed CE (gamma {gamma}).",
        "kind": "dflash-drafter",
        "initialized_from": init_info,
        "target": target_dir.name,
        "target_fingerprint": hyper["target_sha256"],
        "parameters": params,
        "dtype": "bfloat16",
        "layers": num_layers,
        "block_size": block_size,
        "target_layer_ids": list(taps),
        "mask_token_id": mask_token_id,
        "gamma": gamma,
        "data": {"corpus": {k: data.manifest.get(k) for k in ("source", "interpreter", "tokens", "fingerprint")},
                 "self_distilled_sequences": int(gen.shape[0]) if gen is not None else 0, "self_distill_fraction_of_batches": distill_fraction if gen is not None else 0.0,
                 "self_distill_prompt_lens": list(distill_prompt_lens) if gen is not None else [],
                 "self_distill_prompts": ("training-file windows" if distill_prompts == "windows" else
                                          "the tokens ending at a function docstring's end, from the training files"),
                 "self_distill_seconds": round(gen_seconds, 1)},
        "interpreter": data.manifest.get("interpreter"),
        "steps": steps_done,
        "steps_planned": state["schedule"]["steps"],
        "auto_steps": state.get("auto_steps"),
        "stopped_early": state.get("stopped_early", False),
        "batch": {"sequences": batch_size, "seq_len": seq_len, "blocks_per_sequence": blocks_per_seq},
        "tokens_seen": steps_done * batch_size * seq_len,
        "blocks_seen": steps_done * batch_size * blocks_per_seq,
        "schedule": state["schedule"],
        "precision": "bf16 autocast, fp32 master weights and AdamW state (CUDA); fp32 (CPU)",
        "seed": seed,
        "final_train_loss": smoothed_loss(state),
        "final_train_loss_note": "position-weighted block CE (nats), mean over the last 50 training steps",
        "eval": evals,
        "training_seconds": round(float(state["seconds"]), 1),
        "device": device_name(dev),
        "versions": versions(),
        "platform": platform.platform(),
        "date": utc_now(),
        "loss_curve": state["losses"][:: max(1, len(state["losses"]) // 100)],
    }
    write_card(model_dir, card)
    return model_dir


def _target_fingerprint(target_dir: Path) -> str:
    """sha256 over the target's config and weight files (the drafter is only valid for these weights)."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted(target_dir.iterdir()):
        if p.name == "config.json" or p.suffix == ".safetensors":
            h.update(p.name.encode() + bytes.fromhex(sha256_file(p)))
    return h.hexdigest()


@torch.no_grad()
def evaluate_drafter(drafter, target, tokens, gen, gen_plen, seq_len, block_size, gamma, seed, device, batches: int = 4,
                     batch_size: int = 16, blocks: int = 16) -> dict | None:
    """Block loss and the chain-acceptance estimate on held-out corpus windows or on the self-distilled set."""
    taps = tuple(drafter.config.target_layer_ids)
    total = {"loss": 0.0, "acc1": 0.0, "tau_est": 0.0}
    n = 0
    with autocast_for(device):
        for i in range(batches):
            g = step_generator(seed + 99, i, stream=5)
            if tokens is not None:
                if tokens.numel() < seq_len:
                    return None
                seqs = windows_at(tokens, i, seed + 99, batch_size, seq_len).to(device)
                lo = torch.ones(batch_size, dtype=torch.int64)
            else:
                if gen is None:
                    return None
                idx = torch.randint(0, gen.shape[0], (batch_size,), generator=g).to(device)
                seqs, lo = gen[idx], gen_plen[idx].cpu()
            anchors = sample_anchors(lo, seq_len, block_size, blocks, g).to(device)
            _, features = batched_hidden(target, seqs, taps)
            logits = block_logits(drafter, target, seqs, features, anchors)
            offs = anchors[..., None] + torch.arange(1, block_size, device=device)
            labels = seqs.gather(1, offs.view(seqs.shape[0], -1)).view(offs.shape)
            loss, metrics = block_loss(logits, labels, gamma)
            total["loss"] += float(loss)
            total["acc1"] += metrics["acc1"]
            total["tau_est"] += metrics["tau_est"]
            n += 1
    out = {k: v / n for k, v in total.items()}
    out["note"] = "tau_est = 1 + mean accepted run of top-1 drafts against the labels (target greedy tokens for self_distilled)"
    return out
