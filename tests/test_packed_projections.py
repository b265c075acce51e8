"""Packed projections: each layer's Linear layers of one input run as one GEMM (q/k/v, gate/up,
the GDN in_proj_*; the drafter's k/v and gate/up), with the checkpoint names, the same state_dict
and no second copy of the weights. Packed and unpacked models must agree everywhere."""

import pytest
import torch
from torch import nn

from workbench.drafters.dflash import DFlashDrafter, load_dflash, save_dflash
from workbench.engine import GenerationConfig, generate
from workbench.fastpath import FastEngine
from workbench.models import load_target, save_target
from workbench.models.common import PackedModule
from workbench.random_models import random_dflash, random_target

F64 = torch.float64
IDS = [3, 17, 200, 42, 9, 9, 101, 250, 7, 64, 18, 33, 5]
# the Linear groups each kind packs, by module path suffix
GROUPS = {
    "hybrid": {"linear_attn": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
               "self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")},
    "dense": {"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")},
    "qwen3_next": {"linear_attn": ("in_proj_qkvz", "in_proj_ba"), "self_attn": ("q_proj", "k_proj", "v_proj"),
                   "shared_expert": ("gate_proj", "up_proj")},
}


def pair(kind, seed=3, **dims):
    dims = {"vocab_size": 300, "eos_token_id": None} | dims
    return random_target(kind, seed, **dims), random_target(kind, seed, pack=False, **dims)


def logits(model, ids=IDS):
    with torch.no_grad():
        return model.run_chain(ids, model.new_cache(64)).logits


def draft_logprobs(target, model, ids=IDS):
    """A DFlash proposal after a prefill: every depth's full distribution."""
    drafter = DFlashDrafter(model, target)
    with torch.no_grad():
        out = target.run_chain(ids, target.new_cache(64), taps=drafter.target_layer_ids)
        drafter.begin(ids, out.taps, 64)
        return drafter.propose(5, len(ids), k=300).logprobs


def storage_bytes(model) -> int:
    """Bytes of all distinct storages behind the parameters (a second copy would show here)."""
    seen = {}
    for p in model.parameters():
        s = p.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class LinearCalls:
    """Counts forward calls of the packable Linear layers (the packed path never calls them)."""

    def __init__(self, model):
        self.count = 0
        self.handles = [getattr(m, name).register_forward_hook(self._hook)
                        for m in model.modules() if isinstance(m, PackedModule) for name in m.packable]

    def _hook(self, *_):
        self.count += 1

    def close(self):
        for h in self.handles:
            h.remove()


@pytest.mark.parametrize("kind", ["hybrid", "dense", "qwen3_next"])
def test_packed_target_matches_unpacked_with_the_same_state_dict_and_no_extra_memory(kind):
    packed, plain = pair(kind)
    # every group packed, its Linears' weights row views of the one packed tensor, in order
    found = {}
    for name, m in packed.named_modules():
        if isinstance(m, PackedModule):
            assert m.packed is not None, name
            found.setdefault(name.split(".")[-1], m.packable)
            rows = 0
            for lin in (getattr(m, n) for n in m.packable):
                assert lin.weight.untyped_storage().data_ptr() == m.packed.weight.untyped_storage().data_ptr()
                assert torch.equal(lin.weight, m.packed.weight[rows : rows + lin.out_features])
                rows += lin.out_features
            assert rows == m.packed.weight.shape[0]
    assert found == GROUPS[kind]
    # checkpoint view unchanged: the same keys in the same order, the same tensors, nothing added
    a, b = packed.state_dict(), plain.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert [n for n, _ in packed.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert [n for n, _ in packed.named_buffers()] == [n for n, _ in plain.named_buffers()]
    assert storage_bytes(packed) == storage_bytes(plain)
    # the same logits, and the packed GEMMs are what ran
    calls = LinearCalls(packed)
    got = logits(packed)
    calls.close()
    assert calls.count == 0
    assert (got - logits(plain)).abs().max().item() < 1e-5


def test_packed_drafter_matches_unpacked():
    target, _ = pair("hybrid", seed=4)
    packed = random_dflash(target, seed=2, num_layers=2, block_size=6)
    plain = random_dflash(target, seed=2, num_layers=2, block_size=6, pack=False)
    assert [type(m).__name__ for m in packed.packed_modules()] == ["DFlashAttention", "MLP"] * 2
    assert packed.layers[0].self_attn.packable == ("k_proj", "v_proj")
    a, b = packed.state_dict(), plain.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert storage_bytes(packed) == storage_bytes(plain)
    calls = LinearCalls(packed)
    got = draft_logprobs(target, packed)
    calls.close()
    assert calls.count == 0
    assert (got - draft_logprobs(target, plain)).abs().max().item() < 1e-5


@pytest.mark.parametrize("group,i,j", [("linear_attn", 2, 3), ("self_attn", 1, 2), ("mlp", 0, 1)])
def test_a_wrong_split_order_would_be_seen(monkeypatch, group, i, j):
    """The comparisons above can fail: outputs of two equal-width Linears handed out swapped
    (b/a, k/v, gate/up, as a wrong split order would) change the logits."""
    from workbench.models.common import PackedLinears

    packed, plain = pair("hybrid")
    call = PackedLinears.__call__
    target = getattr(packed.model.layers[3 if group == "self_attn" else 0], group).packed

    def swapped(self, x):
        out = call(self, x)
        if self is target:
            out[i], out[j] = out[j], out[i]
        return out

    monkeypatch.setattr(PackedLinears, "__call__", swapped)
    assert target.sizes[i] == target.sizes[j]
    assert (logits(packed) - logits(plain)).abs().max().item() > 1e-3


def test_in_place_loads_land_in_the_packed_tensor():
    packed, _ = pair("hybrid", seed=3)
    _, other = pair("hybrid", seed=8)
    packed.load_state_dict(other.state_dict())
    assert packed.packed_modules() and all(m.packed.intact() for m in packed.packed_modules())
    assert (logits(packed) - logits(other)).abs().max().item() < 1e-5


@pytest.mark.parametrize("kind", ["hybrid", "dense"])
def test_casts_pack_again_and_broken_aliasing_falls_back(kind):
    packed, plain = pair(kind)
    packed, plain = packed.to(F64), plain.to(F64)
    packed.reset_rotary()
    plain.reset_rotary()
    mods = packed.packed_modules()
    assert mods and all(m.packed.weight.dtype == F64 and m.packed.intact() for m in mods)  # packed again in fp64
    assert storage_bytes(packed) == storage_bytes(plain)  # the fp32 packed tensors are gone with their views
    assert (logits(packed) - logits(plain)).abs().max().item() < 1e-10
    # a reassigned weight and a swapped .data: those modules run their separate GEMMs again
    mlp, attn = packed.model.layers[0].mlp, packed.model.layers[-1].self_attn
    with torch.no_grad():
        mlp.up_proj.weight = nn.Parameter(mlp.up_proj.weight * 1.5, requires_grad=False)
        attn.v_proj.weight.data = attn.v_proj.weight.data * -2.0
        plain.model.layers[0].mlp.up_proj.weight.mul_(1.5)
        plain.model.layers[-1].self_attn.v_proj.weight.mul_(-2.0)
    assert not mlp.packed.intact() and not attn.packed.intact()
    calls = LinearCalls(packed)
    got = logits(packed)
    calls.close()
    assert calls.count == 5  # one chain forward: gate/up of that MLP, q/k/v of that attention
    assert (got - logits(plain)).abs().max().item() < 1e-10


def test_gradients_take_the_separate_gemms_and_optimizer_steps_update_the_packed_tensor():
    """A packed model trained anyway (the training loop, workbench.train, builds unpacked ones)."""
    from workbench.train.target import lm_loss

    packed, plain = pair("hybrid")
    models = (packed.train().requires_grad_(True), plain.train().requires_grad_(True))
    windows = torch.tensor([IDS, IDS[::-1]])
    for model in models:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            opt.zero_grad()
            lm_loss(model, windows).backward()
            opt.step()
    mlp = packed.model.layers[0].mlp
    assert mlp.gate_proj.weight.grad is not None and mlp.packed.intact()
    a, b = packed.state_dict(), plain.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5  # the same step on both
    for model in models:
        model.eval().requires_grad_(False)
    calls = LinearCalls(packed)
    got = logits(packed)  # the packed GEMMs, reading the updated weights
    calls.close()
    assert calls.count == 0
    assert (got - logits(plain)).abs().max().item() < 1e-4


@pytest.mark.parametrize("kind", ["hybrid", "dense"])
def test_greedy_generation_gives_the_same_tokens(kind):
    packed, plain = pair(kind, seed=5)
    prompt = [4, 8, 15, 16, 23, 42]
    ar = GenerationConfig(method="ar", max_new_tokens=24, trace_topk=0)
    ref = generate(plain, prompt, ar).generated_ids
    assert generate(packed, prompt, ar).generated_ids == ref
    d_packed = DFlashDrafter(random_dflash(packed, seed=2, block_size=6), packed)
    d_plain = DFlashDrafter(random_dflash(plain, seed=2, block_size=6, pack=False), plain)
    cfg = GenerationConfig(method="ddtree", budget=12, max_new_tokens=24, trace_topk=0, draft_trace_k=0)
    a, b = generate(packed, prompt, cfg, d_packed), generate(plain, prompt, cfg, d_plain)
    assert a.generated_ids == b.generated_ids == ref
    assert [r.tree["tokens"] for r in a.rounds] == [r.tree["tokens"] for r in b.rounds]
    fast = FastEngine(packed, d_packed, cfg, max_len=96).generate(prompt)
    assert fast.generated_ids == ref


def test_loaders_pack_and_checkpoints_round_trip(tmp_path):
    packed, plain = pair("hybrid")
    save_target(packed, tmp_path / "t")
    save_dflash(random_dflash(packed, seed=1, block_size=6), tmp_path / "d")
    target = load_target(tmp_path / "t", "cpu", torch.float32)
    drafter = load_dflash(tmp_path / "d", "cpu", torch.float32, target.config)
    assert len(target.packed_modules()) == 8 and len(drafter.packed_modules()) == 2
    assert (logits(target) - logits(plain)).abs().max().item() < 1e-5
    ref = random_dflash(plain, seed=1, block_size=6, pack=False)
    assert (draft_logprobs(target, drafter) - draft_logprobs(plain, ref)).abs().max().item() < 1e-5


def compiled_run(model, ids=IDS):
    """Logits with the decoder layers under torch.compile (as fastpath.compiled_layers, eager
    backend: no C++ compiler needed) and Dynamo's counters of that run."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from workbench.fastpath import _call_layer

    torch._dynamo.reset()
    counters.clear()
    model.layer_fn = torch.compile(_call_layer, backend="eager", dynamic=False)
    try:
        out = logits(model, ids)
        return out, {k: dict(v) for k, v in counters.items()}
    finally:
        model.layer_fn = None
        torch._dynamo.reset()


def test_compiled_layers_trace_the_packed_gemms_whole_and_see_broken_aliasing():
    """Under torch.compile the data-pointer check cannot be traced (Dynamo would give up on the
    layer): the model refreshes it eagerly and the compiled layers read that."""
    packed, plain = pair("hybrid", num_layers=8)
    got, stats = compiled_run(packed)
    ref, ref_stats = compiled_run(plain)
    assert (got - ref).abs().max().item() < 1e-5
    assert not stats.get("graph_break") and not stats.get("unimplemented")
    assert stats["frames"] == ref_stats["frames"]  # one graph per layer kind, as unpacked
    assert stats["stats"]["unique_graphs"] == ref_stats["stats"]["unique_graphs"]
    mlp = packed.model.layers[1].mlp
    with torch.no_grad():
        mlp.gate_proj.weight.data = mlp.gate_proj.weight.data * 3.0
        plain.model.layers[1].mlp.gate_proj.weight.mul_(3.0)
    got, _ = compiled_run(packed)
    assert (got - logits(plain)).abs().max().item() < 1e-5
