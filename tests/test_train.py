"""The training recipe: the batched forward equals the model, the training-time drafter equals the
inference drafter, tokenizer and split, and the recipe itself on a tiny corpus (loss, resume, determinism)."""

import json

import pytest
import torch
import transformers
from safetensors import safe_open
from train_helpers import tiny_source

from tree_kernels.tree_gdn.naive import gdn_chain_sequential
from workbench.cli import main
from workbench.drafters.dflash import DFlashDrafter, load_dflash
from workbench.engine import GenerationConfig, generate
from workbench.models import load_target
from workbench.random_models import random_dflash, random_target
from workbench.train.checkpoint import has_checkpoint
from workbench.train.common import TrainError
from workbench.train.corpus import EOS_TOKEN, MASK_TOKEN, collect_documents, is_heldout, load_corpus, split_documents
from workbench.train.drafter import block_loss, block_logits, position_weights, sample_anchors, train_drafter
from workbench.train.export import check_card, export_target, shard_safetensors
from workbench.train.fast import batched_logits, chunk_gated_delta_rule, greedy_generate
from workbench.train.target import train_target
from workbench.train.zoo import pack_model, unpack

F64 = torch.float64


# ----------------------------------------------------------------------------------------------
# the maths: batched training forward == the workbench's inference forward


@pytest.mark.parametrize("t, chunk", [(1, 64), (50, 16), (131, 64), (64, 64)])
def test_chunked_gated_delta_rule_equals_the_sequential_recurrence(t, chunk):
    g = torch.Generator().manual_seed(t)
    b, h, hv, dk, dv = 2, 2, 4, 8, 6
    q = torch.nn.functional.normalize(torch.randn(b, t, h, dk, generator=g, dtype=F64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, t, h, dk, generator=g, dtype=F64), dim=-1)
    v = torch.randn(b, t, hv, dv, generator=g, dtype=F64)
    gate = -torch.rand(b, t, hv, generator=g, dtype=F64) * 2  # strong decay: exp(G) spans many orders
    beta = torch.rand(b, t, hv, generator=g, dtype=F64)
    s0 = torch.randn(b, hv, dk, dv, generator=g, dtype=F64)
    o, s = chunk_gated_delta_rule(q, k, v, gate, beta, 0.3, s0, chunk=chunk)
    for i in range(b):
        ref_o, ref_states = gdn_chain_sequential(q[i], k[i], v[i], gate[i], beta[i], s0[i], scale=0.3)
        assert (o[i] - ref_o).abs().max() < 1e-10
        assert (s[i] - ref_states[-1]).abs().max() < 1e-10


@pytest.mark.parametrize("kind", ["hybrid", "dense", "qwen3_next", "qwen3_5_moe_text"])
def test_batched_forward_equals_the_model(kind):
    model = random_target(kind, seed=1, vocab_size=200, eos_token_id=None, dtype=F64)
    tokens = torch.randint(0, 200, (3, 150), generator=torch.Generator().manual_seed(2))  # > 2 GDN chunks
    taps = (0, 2, 3)
    with torch.no_grad():
        logits, tap = batched_logits(model, tokens, taps)
        for i in range(3):
            ref = model.run_chain(tokens[i].tolist(), model.new_cache(160), taps=taps)
            # fp64 throughout, except that the model's attention reference computes in fp32
            assert (logits[i] - ref.logits).abs().max() < 1e-5
            assert (tap[i] - ref.taps).abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["hybrid", "dense"])
def test_batched_greedy_generation_equals_token_by_token_decoding(kind):
    model = random_target(kind, seed=3, vocab_size=200, eos_token_id=None, dtype=F64)
    prompts = torch.randint(0, 200, (3, 20), generator=torch.Generator().manual_seed(4))
    out = greedy_generate(model, prompts, 25)
    for i in range(3):
        ar = generate(model, prompts[i].tolist(), GenerationConfig(method="ar", max_new_tokens=25, trace_topk=0))
        assert out[i, 20:].tolist() == ar.generated_ids


@pytest.mark.parametrize("kind", ["hybrid", "dense"])
def test_training_block_forward_equals_the_inference_drafter(kind):
    """block_logits (training) and DFlashDrafter.propose (inference, context K/V cache + block) agree."""
    target = random_target(kind, seed=2, vocab_size=300, eos_token_id=None, dtype=F64)
    drafter = random_dflash(target, seed=3, num_layers=2, block_size=8).to(F64)
    drafter.reset_rotary()
    t = 60
    tokens = torch.randint(0, 256, (2, t), generator=torch.Generator().manual_seed(5))
    anchors = torch.tensor([[1, 20, 40], [9, 33, 52]])
    from workbench.train.fast import batched_hidden

    with torch.no_grad():
        _, features = batched_hidden(target, tokens, tuple(drafter.config.target_layer_ids))
        train_lp = torch.log_softmax(block_logits(drafter, target, tokens, features, anchors), -1)
    for b in range(2):
        for j in range(3):
            a = int(anchors[b, j])
            inference = DFlashDrafter(drafter, target)
            cache = target.new_cache(t + 10)
            out = target.run_chain(tokens[b, :a].tolist(), cache, taps=inference.target_layer_ids)
            inference.begin(tokens[b, :a].tolist(), out.taps, t + 10)
            draft = inference.propose(int(tokens[b, a]), a, k=300)  # every token: the whole distribution
            full = torch.zeros(7, 300, dtype=F64).scatter_(1, draft.tokens, draft.logprobs.to(F64))
            assert (full - train_lp[b, j]).abs().max() < 1e-5  # propose returns fp32 log-probs


def test_anchors_and_position_weighted_loss():
    g = torch.Generator().manual_seed(0)
    anchors = sample_anchors(torch.tensor([1, 30, 40]), 64, 16, 5, g)
    assert anchors.shape == (3, 5)
    assert (anchors[0] >= 1).all() and (anchors[1] >= 30).all() and (anchors <= 48).all()
    assert all(len(set(r.tolist())) == 5 for r in anchors[:2])  # distinct when there is room
    w = position_weights(16, 7.0)
    assert w.shape == (15,) and w[0] == 1 and torch.allclose(w[7], torch.exp(torch.tensor(-1.0)))
    labels = torch.tensor([[[3, 4, 5]]])
    perfect = torch.full((1, 1, 3, 10), -30.0).scatter_(-1, labels[..., None], 30.0)
    loss, metrics = block_loss(perfect, labels, 7.0)
    assert loss < 1e-6 and metrics["tau_est"] == 4.0 and metrics["acc1"] == 1.0
    wrong_second = perfect.clone()
    wrong_second[0, 0, 1] = perfect[0, 0, 1].flip(-1)
    loss2, metrics2 = block_loss(wrong_second, labels, 7.0)
    assert loss2 > 1 and metrics2["tau_est"] == 2.0


# ----------------------------------------------------------------------------------------------
# tokenizer and corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """`workbench train-tokenizer` on a tiny source tree: tokenizer + prepared corpus in one directory."""
    base = tmp_path_factory.mktemp("corpus")
    src = tiny_source(base / "src")
    out = base / "prepared"
    assert main(["train-tokenizer", "--out", str(out), "--source", str(src), "--vocab-size", "320",
                 "--heldout-fraction", "0.2", "--quiet"]) == 0
    return out, src


def test_tokenizer_special_tokens_and_round_trip(corpus):
    from tokenizers import Tokenizer

    out, _ = corpus
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.token_to_id(EOS_TOKEN) == 0 and tok.token_to_id(MASK_TOKEN) == 1
    assert tok.get_vocab_size() == 320
    text = "def f(x):\n    return {'a': x ** 2}  # café ☃\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text and 1 not in ids and 0 not in ids
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == EOS_TOKEN and cfg["mask_token"] == MASK_TOKEN


def test_heldout_split_is_by_path_and_excluded_from_training(corpus):
    out, src = corpus
    docs, skipped = collect_documents(src)
    assert "site-packages/thirdparty.py" not in {d[0] for d in docs} and not skipped
    train, heldout = split_documents(docs, 0.2)
    assert heldout and {d[0] for d in heldout} == {d[0] for d in docs if is_heldout(d[0], 0.2)}
    c = load_corpus(out)
    assert c.manifest["heldout_files"] == [d[0] for d in heldout]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    train_ids = [i for _, t in train for i in tok.encode(t, add_special_tokens=False).ids + [0]]
    assert c.train.tolist() == train_ids  # exactly the training files, each followed by EOS
    assert c.heldout.numel() == sum(len(tok.encode(t, add_special_tokens=False).ids) + 1 for _, t in heldout)
    # the tokenizer is trained on the training split only: retraining on it gives the same vocabulary
    from workbench.train.bpe import train_bpe

    assert train_bpe((t for _, t in train), 320).get_vocab() == tok.get_vocab()


# ----------------------------------------------------------------------------------------------
# the recipe on a tiny corpus


def _params(directory):
    with safe_open(str(directory / "checkpoint" / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _train(corpus_dir, out, steps, **kw):
    return train_target(config="test-hybrid", corpus_dir=corpus_dir, out=out, steps=steps, batch_size=3, seq_len=48, lr=3e-3,
                        warmup=2, checkpoint_every=3, eval_tokens=3000, quiet=True, **kw)


@pytest.fixture(scope="module")
def trained_target(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("target")
    model_dir = _train(corpus[0], out / "a", 12)
    return out, model_dir


def test_target_loss_decreases_and_the_card_is_complete(trained_target):
    out, model_dir = trained_target
    state = json.loads((out / "a" / "checkpoint" / "state.json").read_text())
    losses = [v for _, v in state["losses"]]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < losses[0] - 0.3
    card = check_card(model_dir)
    assert card["steps"] == 12 and card["heldout_loss"] > 0 and card["final_train_loss"] > 0
    assert set(card["files"]) >= {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md"}
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and cfg["model_type"] == "qwen3_5_text" and cfg["tie_word_embeddings"]
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 0


def test_resume_continues_identically_and_runs_are_deterministic(corpus, trained_target):
    out, _ = trained_target
    straight = _params(out / "a")
    _train(corpus[0], out / "b", 12, stop_at=7)  # interrupted after step 7 (not a checkpoint multiple) ...
    assert json.loads((out / "b" / "checkpoint" / "state.json").read_text())["step"] == 7
    _train(corpus[0], out / "b", 12)  # ... and resumed to the end in a new call
    resumed = _params(out / "b")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    losses_a = json.loads((out / "a" / "checkpoint" / "state.json").read_text())["losses"]
    losses_b = json.loads((out / "b" / "checkpoint" / "state.json").read_text())["losses"]
    assert losses_a == losses_b
    _train(corpus[0], out / "c", 3, seed=1)  # another seed gives other weights
    _train(corpus[0], out / "d", 3, seed=1)  # ... and the same seed the same ones
    c, d = _params(out / "c"), _params(out / "d")
    assert all(torch.equal(c[k], d[k]) for k in c) and not all(torch.equal(c[k], straight[k]) for k in c)


def test_a_changed_setting_refuses_to_resume(corpus, trained_target):
    out, _ = trained_target
    with pytest.raises(TrainError, match="other settings"):
        train_target(config="test-hybrid", corpus_dir=corpus[0], out=out / "a", steps=12, batch_size=5, seq_len=48, quiet=True)


def test_exported_target_loads_in_transformers_with_the_same_logits_even_sharded(trained_target, tmp_path):
    _, model_dir = trained_target
    ours = load_target(model_dir, "cpu", torch.float32)
    assert not any(p.requires_grad for p in ours.parameters())
    export_target(ours, tmp_path / "sharded", model_dir, max_shard_bytes=25_000)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 2 and all(s.stat().st_size < 40_000 for s in shards)
    for directory in (model_dir, tmp_path / "sharded"):
        mine = load_target(directory, "cpu", torch.float32)
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        ids = torch.randint(0, 320, (1, 40), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref = hf(ids).logits[0]
            got = mine.run_chain(ids[0].tolist(), mine.new_cache(48)).logits
        assert (ref - got).abs().max() < 1e-4


def test_drafter_recipe_trains_loads_and_drafts_losslessly(corpus, trained_target, tmp_path):
    _, target_dir = trained_target
    out = tmp_path / "drafter"
    kw = dict(target_dir=target_dir, corpus=corpus[0], out=out, batch_size=4, seq_len=48, blocks_per_seq=3, num_layers=1,
              intermediate_size=64, lr=3e-3, warmup=2, self_distill_count=6, distill_prompt_lens=(12, 20), distill_batch=3,
              checkpoint_every=4, quiet=True)
    model_dir = train_drafter(steps=12, **kw)
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    losses = [v for _, v in state["losses"]]
    assert sum(losses[-3:]) / 3 < losses[0]
    card = check_card(model_dir)
    assert card["block_size"] == 16 and card["target_layer_ids"] == [1, 2, 3] and card["mask_token_id"] == 1
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"] == {"mask_token_id": 1, "target_layer_ids": [1, 2, 3]}
    target = load_target(target_dir, "cpu", torch.float32)
    drafter = DFlashDrafter(load_dflash(model_dir, "cpu", torch.float32, target.config), target)
    prompt = [5, 6, 7, 8, 9, 10]
    ar = generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=30, stop_on_eos=False, trace_topk=0))
    for method in ("dflash", "ddtree"):
        gcfg = GenerationConfig(method=method, budget=16, max_new_tokens=30, stop_on_eos=False, trace_topk=0)
        assert generate(target, prompt, gcfg, drafter).generated_ids == ar.generated_ids
    # resuming a finished run is a no-op that exports the same weights
    again = train_drafter(steps=12, **kw)
    with safe_open(str(model_dir / "model.safetensors"), "pt") as a, safe_open(str(again / "model.safetensors"), "pt") as b:
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    # stage 2: fine-tune from it on task-shaped prompts with the target's features cached at generation
    ft = train_drafter(target_dir=target_dir, corpus=corpus[0], out=tmp_path / "ft", steps=6, batch_size=4, seq_len=40,
                       blocks_per_seq=3, lr=1e-3, warmup=1, self_distill_count=7, distill_prompts="docstrings",
                       distill_prompt_lens=(20, 12), distill_batch=3, cache_features=True, init_from=model_dir, quiet=True)
    card = check_card(ft)
    assert card["initialized_from"]["card_sha256"] and card["data"]["self_distilled_sequences"] == 7
    assert card["initialized_from"]["card"]["steps"] == 12  # the lineage is kept for the zoo's table
    with safe_open(str(tmp_path / "ft" / "distill.safetensors"), "pt") as f:  # 4 prompts of 20 tokens, 3 of 12
        assert sorted(f.get_tensor("prompt_lens").tolist()) == [12] * 3 + [20] * 4
    assert json.loads((ft / "config.json").read_text())["dflash_config"] == cfg["dflash_config"]  # shape taken from init
    drafter = DFlashDrafter(load_dflash(ft, "cpu", torch.float32, target.config), target)
    cfg_tree = GenerationConfig(method="ddtree", budget=16, max_new_tokens=30, stop_on_eos=False, trace_topk=0)
    assert generate(target, prompt, cfg_tree, drafter).generated_ids == ar.generated_ids


def test_docstring_prompts_are_cached_beside_the_corpus_for_another_machine(corpus, tmp_path):
    import shutil

    from workbench.train.corpus import load_corpus
    from workbench.train.drafter import docstring_bank, docstring_prompts

    copy = tmp_path / "corpus"
    shutil.copytree(corpus[0], copy)
    for cached in copy.glob("docstring-prompts-*"):  # other tests' banks
        cached.unlink()
    c = load_corpus(copy)
    bank = docstring_bank(c, copy, 20)
    assert bank.shape[1] == 20 and bank.shape[0] >= 4 and (copy / "docstring-prompts-20.safetensors").is_file()
    picked = docstring_prompts(c, copy, 20, 3, seed=5)
    assert picked.shape == (3, 20) and torch.equal(picked, docstring_prompts(c, copy, 20, 3, seed=5))
    assert all(any(torch.equal(row, b) for b in bank) for row in picked)
    # a machine whose files differ (another Python's stdlib): the cache serves it, a missing length fails clearly
    m = json.loads((copy / "corpus.json").read_text())
    m["root"] = str(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "other.py").write_text("def f():\n    \"\"\"Another library.\"\"\"\n")
    (copy / "corpus.json").write_text(json.dumps(m))
    moved = load_corpus(copy)
    assert torch.equal(docstring_bank(moved, copy, 20), bank)
    with pytest.raises(TrainError, match="fingerprint mismatch"):
        docstring_bank(moved, copy, 12)


def test_pack_and_unpack_round_trip(trained_target, tmp_path):
    _, model_dir = trained_target
    tars = pack_model(model_dir, tmp_path / "pack", limit=200_000)
    assert len(tars) >= 1 and all(t.stat().st_size <= 200_000 for t in tars)
    assert unpack(tmp_path / "pack", tmp_path / "zoo") == [model_dir.name]
    check_card(tmp_path / "zoo" / model_dir.name)


def test_a_tampered_file_fails_the_card_check(trained_target, tmp_path):
    import shutil

    _, model_dir = trained_target
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    (copy / "generation_config.json").write_text("{}\n")
    with pytest.raises(TrainError, match="generation_config.json"):
        check_card(copy)
    (copy / "extra.txt").write_text("x")
    with pytest.raises(TrainError, match="extra.txt"):
        check_card(copy)


# ----------------------------------------------------------------------------------------------
# the commands: bad input is refused before any heavy compute, naming the problem


def test_train_commands_refuse_bad_input(corpus, trained_target, tmp_path, capsys):
    _, target_dir = trained_target
    cases = [
        (["train-drafter", "--target", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--steps", "1"],
         "not a directory and not a bundled model"),
        (["train-drafter", "--target", str(target_dir), "--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "o"),
          "--steps", "1"], "--corpus"),
        (["train-drafter", "--target", str(target_dir), "--corpus", str(corpus[0]), "--out", str(tmp_path / "o"), "--steps", "1",
          "--target-layer-ids", "1,9"], "target_layer_ids [9] out of range"),
        (["train-drafter", "--target", str(target_dir), "--corpus", str(corpus[0]), "--out", str(tmp_path / "o"), "--steps", "1",
          "--seq-len", "10"], "no room for a block"),
        (["train-target", "--config", "no-such-preset", "--corpus", str(corpus[0]), "--out", str(tmp_path / "o"), "--steps", "1"],
         "not a known preset"),
        (["train-target", "--config", "test-dense", "--corpus", str(tmp_path), "--out", str(tmp_path / "o"), "--steps", "1"],
         "corpus manifest"),
    ]
    for argv, message in cases:
        assert main(argv + ["--quiet"]) == 2, argv
        assert message in capsys.readouterr().err
    (tmp_path / "nomask").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "nomask" / name).write_bytes((target_dir / name).read_bytes())
    assert main(["train-drafter", "--target", str(tmp_path / "nomask"), "--corpus", str(corpus[0]), "--out", str(tmp_path / "o"),
                 "--steps", "1", "--quiet"]) == 2
    assert "--mask-token-id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train-drafter", "--target", str(target_dir), "--out", str(tmp_path / "o"), "--steps", "0"])
    assert not has_checkpoint(tmp_path / "o" / "checkpoint")


def test_shard_limit_is_enforced(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(100, 100)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(TrainError, match="over the shard limit"):
        shard_safetensors(tmp_path, max_bytes=1000)


def test_auto_steps_are_fixed_inside_the_warmup_and_fill_the_budget():
    """steps='auto': the length is timed inside the warmup, so the learning rates equal a fixed-length run's."""
    from workbench.train.loop import Schedule, run_steps

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = torch.randn(64, 4)

    def loss_fn(step):
        return (model(data) - 1).pow(2).mean(), {}

    sched = Schedule(steps=0, lr=1e-2, warmup=80)
    state = run_steps(model=model, params_model=model, sched=sched, loss_fn=loss_fn, device=torch.device("cpu"),
                      checkpoint_dir=None, state={"hyper": {}}, checkpoint_every=1000, resume=False, max_seconds=1.0,
                      log=lambda m: None, desc="t", quiet=True, max_steps=400)
    n = state["schedule"]["steps"]
    assert 81 <= n <= 400 and state["auto_steps"]["fixed_at_step"] == 70 and state["step"] <= n
    fixed = Schedule(steps=n, lr=1e-2, warmup=80)
    lrs = [fixed.lr_at(s) for s in range(n)]
    assert lrs[:80] == [1e-2 * (s + 1) / 80 for s in range(80)]  # what the auto run used before knowing n
    with pytest.raises(TrainError, match="time budget"):
        run_steps(model=model, params_model=model, sched=sched, loss_fn=loss_fn, device=torch.device("cpu"), checkpoint_dir=None,
                  state={}, checkpoint_every=10, resume=False, max_seconds=None, log=print, desc="t", quiet=True)


def test_each_finetune_stage_starts_from_the_drafter_before_it(corpus, trained_target, tmp_path):
    """Stages chain: a second fine-tune starts from the first one's result (not the original
    drafter), and every stage's card summary stays in the lineage the zoo table reads."""
    import shutil
    from dataclasses import replace

    from workbench.train.zoo import SCALES, _lineage, finetune_pair

    _, target_dir = trained_target
    zoo = tmp_path / "zoo"
    shutil.copytree(target_dir, zoo / "tiny-hybrid")
    first = train_drafter(target_dir=zoo / "tiny-hybrid", corpus=corpus[0], out=tmp_path / "d", steps=4, batch_size=2,
                          seq_len=40, blocks_per_seq=2, lr=1e-3, warmup=1, num_layers=1, target_layer_ids=[1, 2, 3],
                          quiet=True)
    shutil.copytree(first, zoo / "tiny-hybrid-dflash")
    scale = replace(SCALES["test"], ft_distill=3, ft_distill_batch=3, ft_prompt_lens=(12,), ft_seq_len=40, ft_steps=3,
                    ft_batch=2, ft_warmup=1)
    steps = []
    for _ in range(2):
        finetune_pair("tiny-hybrid", zoo, tmp_path / "work", corpus[0], scale, "cpu", 0, True, None)
        card = check_card(zoo / "tiny-hybrid-dflash")
        steps.append([st["steps"] for st in _lineage(card)])
    assert steps == [[4, 3], [4, 3, 3]]
    assert len(list((tmp_path / "work").glob("tiny-hybrid-dflash-from-*"))) == 2
