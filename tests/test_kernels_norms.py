"""The fused row-wise kernels (tree_kernels.norms) against their references under TRITON_INTERPRET=1,
and a whole hybrid and dense model giving the same logits with them on and off."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import tree_kernels as tk  # noqa: E402
from tree_kernels.norms import naive  # noqa: E402
from tree_kernels.norms import triton as impl  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - a GPU run of the same file
    pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton needs the interpreter or a GPU")


def close(a, b, tol, half_inputs=False):
    """Full precision: within ``tol``. Half types anywhere: within a few rounding steps, relative
    and elementwise (the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest, and
    the plain RMSNorm rounds twice)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    diff = (a.float() - b.float()).abs()
    if a.dtype == torch.float32 and not half_inputs:
        assert diff.max().item() <= tol
    else:
        # up to three roundings of at most 2^-7 relative each (a truncation near a binade bottom)
        assert bool((diff <= b.float().abs() * 3 * 2.0**-7 + 1e-6).all()), diff.max().item()


@pytest.mark.parametrize("shape", [(5, 24), (3, 4, 16), (1, 7, 40), (2, 3, 2, 16)])
@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("zero_centered", [True, False])
def test_rms_norm_matches_reference(shape, dtype, wdtype, zero_centered):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    w = (torch.randn(shape[-1], generator=g) * 0.5).to(wdtype)
    ref = naive.rms_norm(x, w, 1e-6, zero_centered)
    got = impl.rms_norm(x, w, 1e-6, zero_centered)
    # fp32: reduction order only; half types: at most one rounding step of the output
    close(got, ref, 1e-5, half_inputs=dtype != torch.float32)


def test_rms_norm_reads_strided_rows():
    x = torch.randn(6, 5, 32)[:, ::2, :16]  # neither dim contiguous but the last
    w = torch.randn(16)
    close(impl.rms_norm(x, w, 1e-6, True), naive.rms_norm(x, w, 1e-6, True), 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm_matches_reference(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, 20, generator=g).to(dtype)
    z = torch.randn(4, 6, 40, generator=g).to(dtype)[..., :20]  # a strided gate, as a projection split gives
    w = (1 + 0.1 * torch.randn(20, generator=g)).to(dtype)
    ref = naive.gated_rms_norm(x, z, w, 1e-6)
    close(impl.gated_rms_norm(x, z, w, 1e-6), ref, 1e-5, half_inputs=dtype != torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("zero_centered", [True, False])
def test_add_rms_norm_is_the_residual_add_then_the_norm(dtype, zero_centered):
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(5, 40, generator=g) * 3).to(dtype)
    delta = torch.randn(5, 40, generator=g).to(dtype)
    w = (torch.randn(40, generator=g) * 0.5).to(dtype)
    h_ref, y_ref = naive.add_rms_norm(x, delta, w, 1e-6, zero_centered)
    assert torch.equal(h_ref, x + delta) and torch.equal(y_ref, naive.rms_norm(x + delta, w, 1e-6, zero_centered))
    h, y = impl.add_rms_norm(x, delta, w, 1e-6, zero_centered)
    close(h, h_ref, 1e-6, half_inputs=dtype != torch.float32)
    close(y, y_ref, 1e-5, half_inputs=dtype != torch.float32)
    with pytest.raises(ValueError, match="delta"):
        impl.add_rms_norm(x, delta[:, :8], w, 1e-6, zero_centered)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("hq,hk,d,r", [(6, 2, 32, 8), (4, 4, 16, 16), (3, 1, 40, 10)])
def test_qk_norm_rotary_is_the_norms_then_rotary(dtype, zero_centered, hq, hk, d, r):
    """Attention's q / k path in one launch (GQA: fewer key heads; partial rotary; a head dim that
    is not a power of two) against rms_norm then rotary, each on q and on k."""
    g = torch.Generator().manual_seed(hq * d + r)
    t = 5
    qkv = (torch.randn(t, (hq + hk) * d + 3, generator=g) * 2).to(dtype)  # strided views, as the packed projection gives
    q, k = qkv[:, : hq * d].view(t, hq, d), qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    wq, wk = (torch.randn(d, generator=g) * 0.3).to(dtype), (torch.randn(d, generator=g) * 0.3).to(dtype)
    ang = torch.randn(t, r // 2, generator=g)
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([ang.sin()] * 2, -1).to(dtype)
    q_ref, k_ref = naive.qk_norm_rotary(q, k, wq, wk, 1e-6, zero_centered, cos, sin)
    assert torch.equal(q_ref, naive.rotary(naive.rms_norm(q, wq, 1e-6, zero_centered), cos, sin))
    q_got, k_got = impl.qk_norm_rotary(q, k, wq, wk, 1e-6, zero_centered, cos, sin)
    # the same roundings as the two kernels it replaces, so bit for bit the same as them
    assert torch.equal(q_got, impl.rotary(impl.rms_norm(q, wq, 1e-6, zero_centered), cos, sin))
    assert torch.equal(k_got, impl.rotary(impl.rms_norm(k, wk, 1e-6, zero_centered), cos, sin))
    # and close to the reference: half types round the norm, each rotary product and their sum
    # (which the interpreter truncates), up to a few bf16 steps of the largest element
    tol = 1e-5 if dtype == torch.float32 else 4 * 2.0**-7 * max(1.0, q_ref.abs().max().item())
    assert (q_got.float() - q_ref.float()).abs().max() <= tol and (k_got.float() - k_ref.float()).abs().max() <= tol
    with pytest.raises(ValueError, match="qk_norm_rotary"):
        impl.qk_norm_rotary(k, q, wq, wk, 1e-6, zero_centered, cos, sin) if hk < hq else impl.qk_norm_rotary(q, k, wq[:4], wk, 1e-6, zero_centered, cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_mul_is_the_attention_output_gate(dtype):
    g = torch.Generator().manual_seed(8)
    t, h, d = 3, 5, 24
    qg = (torch.randn(t, h, 2 * d, generator=g) * 3).to(dtype)
    gate = qg.chunk(2, dim=-1)[1]  # strided rows and heads, as the gated q projection gives
    x = torch.randn(t, h, d, generator=g).to(dtype)
    ref = naive.sigmoid_mul(gate, x)
    assert torch.equal(ref, x * torch.sigmoid(gate))
    close(impl.sigmoid_mul(gate, x), ref, 1e-6, half_inputs=dtype != torch.float32)
    with pytest.raises(ValueError, match="sigmoid_mul"):
        impl.sigmoid_mul(gate[:, :2], x)


def test_gated_rms_norm_casts_an_fp32_input_as_it_loads():
    """The GDN layer hands the recurrence's fp32 output to the norm with the activations' dtype:
    the same as casting first (one launch fewer)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 24, generator=g)  # fp32, as the recurrence returns it
    z = torch.randn(3, 4, 24, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(24, generator=g)).bfloat16()
    ref = naive.gated_rms_norm(x.bfloat16(), z, w, 1e-6)
    assert torch.equal(naive.gated_rms_norm(x, z, w, 1e-6, torch.bfloat16), ref)
    got = impl.gated_rms_norm(x, z, w, 1e-6, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    # four roundings to bf16 (x, x-hat, w x-hat, y) that the interpreter truncates: 4 steps of 2^-7
    diff = (got.float() - ref.float()).abs()
    assert bool((diff <= ref.float().abs() * 4 * 2.0**-7 + 1e-6).all()), diff.max().item()
    same = impl.gated_rms_norm(x, z.float(), w.float(), 1e-6, torch.float32)  # no cast asked: plain fp32
    close(same, naive.gated_rms_norm(x, z.float(), w.float(), 1e-6), 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_gates_match_reference(dtype):
    g = torch.Generator().manual_seed(4)
    t, h, hv, dk = 5, 3, 9, 12
    mixed = torch.randn(t, 2 * h * dk + 7, generator=g).to(dtype)
    q = mixed[:, : h * dk].reshape(t, h, dk)  # slices of the conv output, as the model passes them
    k = mixed[:, h * dk : 2 * h * dk].reshape(t, h, dk)
    b = torch.randn(t, hv, generator=g).to(dtype)
    a = torch.cat([torch.randn(t, hv - 2, generator=g) * 4, torch.tensor([[30.0, -40.0]] * t)], 1).to(dtype)  # both softplus tails
    A_log = torch.rand(hv, generator=g).to(dtype)
    dt_bias = torch.randn(hv, generator=g).to(dtype)
    ref = naive.gdn_gates(q, k, b, a, A_log, dt_bias)
    got = impl.gdn_gates(q, k, b, a, A_log, dt_bias)
    for name, r, o in zip(("q", "k", "beta", "g"), ref, got):
        assert r.dtype == o.dtype, name
        rel = ((o.float() - r.float()).abs() / (r.float().abs() + 1e-30)).max().item()
        assert rel < (1e-5 if r.dtype == torch.float32 else 2 * 2.0**-8), (name, rel)


def test_dispatch_is_on_where_triton_runs_off_by_switch_and_never_on_the_gradient_path(monkeypatch):
    x = torch.randn(3, 16)
    w = torch.randn(16, requires_grad=True)
    calls = []
    monkeypatch.setattr(impl, "rms_norm", lambda *a: calls.append(1) or naive.rms_norm(*a))
    with tk.use_backend("torch"), torch.no_grad():
        tk.rms_norm(x, w, 1e-6, True)
        assert not calls and not tk.fused_norms_for(x)  # CPU tensors under auto/torch: the reference
    with tk.use_backend("triton"), tk.use_fused_norms():
        y = tk.rms_norm(x, w, 1e-6, True)
        assert not calls and y.requires_grad  # weights that need gradients: the reference
        with torch.no_grad():
            tk.rms_norm(x, w, 1e-6, True)
        assert calls == [1] and tk.fused_norms_for(x)
        with tk.use_fused_norms(False), torch.no_grad():  # the switch (WORKBENCH_FUSED_NORMS=0)
            tk.rms_norm(x, w, 1e-6, True)
        assert calls == [1] and tk.fused_norms_enabled()


def test_fused_norms_are_the_default_unless_the_environment_says_no():
    import subprocess
    import sys

    code = "import tree_kernels as tk; print(tk.fused_norms_enabled())"
    for env_value, expected in ((None, "True"), ("0", "False"), ("off", "False"), ("1", "True")):
        env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_FUSED_NORMS"}
        if env_value is not None:
            env["WORKBENCH_FUSED_NORMS"] = env_value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        assert out.strip() == expected, (env_value, out)


@pytest.mark.parametrize("kind", ["hybrid", "dense"])
def test_a_model_gives_the_same_logits_with_the_fused_kernels(kind):
    from workbench.random_models import random_target
    from workbench.tree import Tree, compile_tree

    target = random_target(kind, seed=5, vocab_size=96)
    ids = list(range(3, 20))
    with torch.no_grad():
        ref = target.run_chain(ids, target.new_cache(40)).logits
        with tk.use_backend("triton"), tk.use_fused_norms():
            got = target.run_chain(ids, target.new_cache(40)).logits
    assert (got - ref).abs().max().item() < 1e-4


def test_fast_path_with_every_triton_kernel_equals_the_reference_engine():
    """What a GPU run executes (static fast path, tree kernels + fused norms in Triton, here
    interpreted) against the reference engine on the torch references: the same tokens and trees."""
    from workbench.drafters.oracle import OracleDrafter, OracleSpec
    from workbench.engine import GenerationConfig, generate
    from workbench.fastpath import FastEngine
    from workbench.random_models import random_target

    target = random_target("hybrid", seed=7, vocab_size=200, eos_token_id=None)
    prompt = [4, 8, 15, 16, 23, 42]
    with tk.use_backend("torch"):
        ref_seq = prompt + generate(target, prompt, GenerationConfig(method="ar", max_new_tokens=30, trace_topk=0)).generated_ids
        drafter = OracleDrafter(ref_seq, 200, OracleSpec(p=0.5, rank=1, block=8, seed=1))
        cfg = GenerationConfig(method="ddtree", budget=12, max_new_tokens=16, trace_topk=0, draft_trace_k=0)
        ref = generate(target, prompt, cfg, drafter)
    with torch.no_grad(), tk.use_backend("triton"), tk.use_fused_norms():
        fast = FastEngine(target, drafter, cfg, max_len=64, use_graphs=False).generate(prompt)
    assert fast.generated_ids == ref.generated_ids == ref_seq[len(prompt) : len(prompt) + 16]
    assert [r.accepted for r in fast.rounds] == [r.accepted for r in ref.rounds]
    assert any(r.through_sibling for r in fast.rounds)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,r", [(16, 16), (32, 8), (24, 12)])
def test_rotary_matches_reference(dtype, d, r):
    g = torch.Generator().manual_seed(d + r)
    t, h = 5, 3
    x = torch.randn(t, 2 * h, d, generator=g).to(dtype)[:, ::2]  # a strided head dim, as q from a split
    ang = torch.randn(t, r // 2, generator=g)
    cos, sin = torch.cat([ang, ang], -1).cos().to(dtype), torch.cat([ang, ang], -1).sin().to(dtype)
    got, ref = impl.rotary(x, cos, sin), naive.rotary(x, cos, sin)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    # each product and the sum are rounded: the bound scales with the terms (they can cancel)
    xa = x.float().abs()
    partner = torch.cat([xa[..., r // 2 : r], xa[..., : r // 2]], -1)
    terms = torch.cat([xa[..., :r] * cos.float().abs()[:, None] + partner * sin.float().abs()[:, None], xa[..., r:]], -1)
    step = 2.0**-23 if dtype == torch.float32 else 2.0**-7
    assert bool(((got.float() - ref.float()).abs() <= 3 * step * terms + 1e-6).all())
    assert torch.equal(got[..., r:], x[..., r:])  # channels past R pass through untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_reference(dtype):
    g = torch.Generator().manual_seed(9)
    both = torch.randn(7, 2 * 1500, generator=g).to(dtype) * 3
    gate, up = both[:, :1500], both[:, 1500:]  # strided rows, more than one block
    close(impl.silu_mul(gate, up), naive.silu_mul(gate, up), 1e-4, half_inputs=dtype != torch.float32)  # values up to ~100
