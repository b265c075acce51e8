"""Programmatic dependent launch (tree_kernels._pdl): the switch, every launch site, the peeled
first weight tile, and where the wait sits in the compiled kernels.

Under TRITON_INTERPRET=1 the switch runs the same kernel code as on the GPU (the peeled tile
included) with the grid-dependency instructions left out, so CPU runs with it on must give
bitwise what they give with it off. Where the wait sits (nothing but weight reads before it) is
checked on an ahead-of-time sm_90 compile, which needs no GPU.
"""

import ast
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import tree_kernels as tk  # noqa: E402

pdl = pytest.importorskip("tree_kernels._pdl")
from tree_kernels.gemv import triton as gemv_triton  # noqa: E402
from workbench.engine import GenerationConfig  # noqa: E402
from workbench.fastpath import FastEngine  # noqa: E402
from workbench.random_models import random_dflash, random_target  # noqa: E402
from workbench.drafters.dflash import DFlashDrafter  # noqa: E402

KERNELS = Path(tk.__file__).parent
# the L2 warm-up runs on a side stream beside the tree kernels: no programmatic edge to order
NOT_PDL = {"l2_prefetch"}
# the kernels that read their first weight tile before the wait, and how that load reads
WEIGHT_STREAMING = {"_gemv_kernel": "tl.load(w_rows", "_few_rows_swap_kernel": "tl.load(w_rows",
                    "_few_rows_swap_tma_kernel": "w_desc.load("}


def _kernel_sources():
    for path in sorted(KERNELS.glob("*/triton.py")):
        if path.parent.name not in NOT_PDL:
            yield path, ast.parse(path.read_text())


def test_every_kernel_waits_first_and_every_launch_asks_for_pdl():
    """Each @triton.jit kernel takes USE_GDC and calls pdl_enter(USE_GDC) as its first statement
    (after a docstring), or, for the weight-streaming GEMV, right after reading its first weight
    tile; every launch of one of them passes **pdl_options(...). A kernel or launch added without
    them fails here."""
    kernels, launches = {}, []
    for path, tree in _kernel_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    "jit" in ast.unparse(d) for d in node.decorator_list):
                kernels[node.name] = (path, node)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel")):
                launches.append((path, node))
    assert len(kernels) >= 25 and len(launches) >= len(kernels)
    for name, (path, fn) in kernels.items():
        args = [a.arg for a in fn.args.args]
        assert args[-1] == "USE_GDC", (path.name, name)
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        first = ast.unparse(body[0])
        if name in WEIGHT_STREAMING:  # the peel: only address arithmetic and the weight tile's load before the wait
            peel = next(s for s in body if isinstance(s, ast.If) and ast.unparse(s.test) == "USE_GDC")
            wait = next(i for i, s in enumerate(peel.body) if "pdl_enter" in ast.unparse(s))
            before = ast.unparse(peel.body[:wait])
            assert before.count(".load(") == 1 and WEIGHT_STREAMING[name] in before, (name, before)
            assert all(".load(" not in ast.unparse(s) and "tl.store" not in ast.unparse(s) for s in body[:body.index(peel)])
        else:
            assert first == "pdl_enter(USE_GDC)", (path.name, name, first)
    for path, call in launches:
        assert call.func.value.id in kernels, (path.name, call.func.value.id)
        assert any(k.arg is None and ast.unparse(k.value).startswith("pdl_options(") for k in call.keywords), (
            path.name, call.lineno, call.func.value.id)


LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg"}


def test_every_launch_keyword_is_a_kernel_parameter_or_a_launch_option():
    """A keyword a kernel does not take (one left behind when a parameter moves to another kernel)
    passes silently under the interpreter the CPU tests run, and only the GPU would refuse or drop
    it. Every named keyword of every launch is one of the kernel's parameters or a launch option."""
    kernels, launches = {}, []
    for path, tree in _kernel_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel"):
                kernels[node.name] = {a.arg for a in node.args.args}
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel")):
                launches.append((path, node))
    assert launches
    for path, call in launches:
        params = kernels[call.func.value.id]
        unknown = {k.arg for k in call.keywords if k.arg is not None} - params - LAUNCH_OPTIONS
        assert not unknown, (path.name, call.lineno, call.func.value.id, sorted(unknown))


def test_pdl_options_follow_the_switch():
    x = torch.zeros(1)
    with tk.use_pdl(False):
        assert pdl.pdl_options(x) == {}
    with tk.use_pdl(True):
        assert pdl.pdl_options(x) == ({"USE_GDC": True} if pdl.INTERPRETED else {})  # a CPU tensor: no launch attribute
    assert not pdl.pdl_capable(torch.device("cpu"))


def test_an_exempt_group_launches_without_pdl_while_it_is_on():
    """The per-kernel choice: a launch in an exempt group (backend.PDL_GROUPS) gets no PDL keywords
    while the switch is on, others do; the TMA GEMM's stages follow what its launch gets; an unknown
    group is refused by name, from the environment variable's parser too."""
    x = torch.zeros(1)
    on = {"USE_GDC": True} if pdl.INTERPRETED else {}
    before = tk.pdl_exempt()
    with tk.use_pdl(True):
        with tk.use_pdl_exempt("tma"):
            assert pdl.pdl_options(x, ("gemm", "tma")) == {} and pdl.pdl_options(x, ("gemm",)) == on
            assert gemv_triton.tma_stages(4, pdl.pdl_options(x, gemv_triton.TMA_GEMM)) == 4
        with tk.use_pdl_exempt(["gemm"]):
            assert pdl.pdl_options(x, ("gemm", "tma")) == {} and pdl.pdl_options(x, ("gemm",)) == {}
            assert pdl.pdl_options(x) == on
        with tk.use_pdl_exempt("tma,rest"):  # the GEMMs only
            assert pdl.pdl_options(x) == {} and pdl.pdl_options(x, ("rest",)) == {}
            assert pdl.pdl_options(x, ("gemm",)) == on and pdl.pdl_options(x, ("gemm", "tma")) == {}
        with tk.use_pdl_exempt(""):
            assert pdl.pdl_options(x, ("gemm", "tma")) == on
            if pdl.INTERPRETED:
                assert gemv_triton.tma_stages(4, pdl.pdl_options(x, gemv_triton.TMA_GEMM)) == 3
    with pytest.raises(ValueError, match="'mlp'"):
        tk.set_pdl_exempt("tma,mlp")
    with pytest.raises(ValueError, match="'conv'"):
        pdl.pdl_options(x, ("conv",))
    assert tk.pdl_exempt() == before  # restored by every block above, and untouched by the refused set
    from tree_kernels import backend
    assert backend._parse_pdl_groups(" tma, ", "test") == frozenset({"tma"})  # the default's spelling parses


@pytest.mark.parametrize("exempt", ["tma", "gemm", "", "tma,rest"])
def test_the_few_rows_routes_give_the_same_bits_whichever_groups_are_exempt(exempt):
    """A GEMM launched without PDL between kernels launched with it: same bits as everything off."""
    g = torch.Generator().manual_seed(7)
    x, w, b = torch.randn(33, 208, generator=g), torch.randn(70, 208, generator=g), torch.randn(70, generator=g)
    cfgs = [{"LAYOUT": "swap_tma", "SPLIT_K": 3, "BLOCK_K": 32}, {"LAYOUT": "swap", "BLOCK_K": 64}, {"LAYOUT": "rows"}]
    with tk.use_pdl(False):
        off = [gemv_triton.gemm_few_rows(x, w, b, c) for c in cfgs] + [gemv_triton.gemv(x[:1], w, b)]
    with tk.use_pdl(True), tk.use_pdl_exempt(exempt):
        on = [gemv_triton.gemm_few_rows(x, w, b, c) for c in cfgs] + [gemv_triton.gemv(x[:1], w, b)]
    for a, c in zip(off, on):
        assert torch.equal(a, c)


@pytest.mark.parametrize("n, k, config", [(37, 300, {}), (64, 1000, {"SPLIT_K": 3, "BLOCK_K": 128}),
                                          (5, 77, {"BLOCK_N": 4, "BLOCK_K": 32, "SPLIT_K": 2}), (8, 16, {"BLOCK_K": 32})])
def test_the_gemv_with_its_first_tile_peeled_gives_the_same_bits(n, k, config):
    """With PDL the GEMV reads its first weight tile before the wait and runs the loop from the
    second: the same products summed in the same order, so the same bits (bf16 and fp32; one
    tile only, and split-K slices, included)."""
    g = torch.Generator().manual_seed(n + k)
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b = torch.randn(1, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
        with tk.use_pdl(False):
            off = gemv_triton.gemv(x, w, b, config)
        with tk.use_pdl(True):
            on = gemv_triton.gemv(x, w, b, config)
        assert torch.equal(on, off), (dtype, (on - off).abs().max())


@pytest.mark.parametrize("m, n, k, config", [
    (65, 100, 256, {"LAYOUT": "swap", "BLOCK_N": 32, "BLOCK_K": 64}),  # main 64 + tail 16
    (16, 64, 128, {"LAYOUT": "swap"}),  # no tail
    (33, 70, 208, {"LAYOUT": "swap_tma", "SPLIT_K": 3, "BLOCK_K": 32}),  # TMA + split K
    (65, 64, 128, {"LAYOUT": "swap_tma", "BLOCK_K": 32, "WARP_SPECIALIZE": True}),
    (17, 37, 64, {"LAYOUT": "swap_tma", "BLOCK_K": 64}),  # one K tile: the peel is the whole loop
])
def test_the_few_rows_gemm_with_its_first_tile_peeled_gives_the_same_bits(m, n, k, config):
    g = torch.Generator().manual_seed(m * n)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    with tk.use_pdl(False):
        off = gemv_triton.gemm_few_rows(x, w, b, config)
    with tk.use_pdl(True):
        on = gemv_triton.gemm_few_rows(x, w, b, config)
    assert torch.equal(on, off), (on - off).abs().max()
    torch.testing.assert_close(off, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-3)


def test_a_generation_with_pdl_is_the_generation_without():
    """Every kernel of the fast path (tree build, norms, attention, GDN, conv, commits, the draft
    pass) launched through pdl_options: the same tokens, accepted paths and draft log-probs as
    with the switch off."""
    target = random_target("hybrid", seed=3, vocab_size=300, eos_token_id=None)
    drafter = DFlashDrafter(random_dflash(target, seed=1, block_size=5, num_layers=1), target)
    prompt = list(range(20, 34))
    runs = {}
    for on in (False, True):
        for method in ("ddtree", "ar"):
            cfg = GenerationConfig(method=method, budget=9, max_new_tokens=10, trace_topk=0, draft_trace_k=4)
            with torch.no_grad(), tk.use_backend("triton"), tk.use_pdl(on):
                runs[on, method] = FastEngine(target, drafter, cfg, max_len=64, use_graphs=False).generate(prompt)
    for method in ("ddtree", "ar"):
        a, b = runs[False, method], runs[True, method]
        assert a.generated_ids == b.generated_ids and len(a.generated_ids) == 10
        assert [r.accepted for r in a.rounds] == [r.accepted for r in b.rounds]
        assert [r.draft_logprobs for r in a.rounds] == [r.draft_logprobs for r in b.rounds]


PTX_PROBE = r"""
import json, os, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tree_kernels.gemv import triton as gm
from tree_kernels.norms import triton as nm

def ptx(fn, sig, constexprs):
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    return [l.strip() for l in k.asm["ptx"].splitlines()]

def where(lines):
    wait = next((i for i, l in enumerate(lines) if l.startswith("griddepcontrol.wait")), None)
    before = lines[:wait] if wait is not None else []
    return {"wait": wait is not None, "launch": any(l.startswith("griddepcontrol.launch_dependents") for l in lines),
            "loads_before": sum("ld.global" in l for l in before), "stores_before": sum("st.global" in l for l in before)}

gemv_sig = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "N": "i32", "K": "i32", "k_per_split": "i32",
            "stride_w": "i32", "HAS_BIAS": "constexpr", "PARTIAL": "constexpr", "BLOCK_N": "constexpr",
            "BLOCK_K": "constexpr", "USE_GDC": "constexpr"}
norm_sig = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "n1": "i32", "sx0": "i32", "sx1": "i32", "D": "i32", "eps": "fp32",
            "BLOCK": "constexpr", "ZERO_CENTERED": "constexpr", "USE_GDC": "constexpr"}
swap_sig = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "M": "i32", "N": "i32", "K": "i32", "k_per_split": "i32",
            "sxm": "i32", "swn": "i32", "sym": "i32", **{c: "constexpr" for c in ("HAS_BIAS", "PARTIAL", "DOT_FP32", "BLOCK_N",
            "BLOCK_K", "M_MAIN", "M_TAIL", "USE_GDC")}}
out = {}
for use in (False, True):
    out[f"swap/{use}"] = where(ptx(gm._few_rows_swap_kernel, swap_sig, {"HAS_BIAS": False, "PARTIAL": False, "DOT_FP32": False,
                                   "BLOCK_N": 128, "BLOCK_K": 128, "M_MAIN": 64, "M_TAIL": 16, "USE_GDC": use}))
    out[f"gemv/{use}"] = where(ptx(gm._gemv_kernel, gemv_sig, {"HAS_BIAS": True, "PARTIAL": False, "BLOCK_N": 8,
                                                                "BLOCK_K": 512, "USE_GDC": use}))
    out[f"norm/{use}"] = where(ptx(nm._rms_norm_kernel, norm_sig, {"BLOCK": 1024, "ZERO_CENTERED": True, "USE_GDC": use}))
print(json.dumps(out))
"""


def test_the_compiled_kernels_wait_before_touching_what_earlier_kernels_write():
    """sm_90 AOT compile (a subprocess without TRITON_INTERPRET): with USE_GDC the RMSNorm emits
    griddepcontrol.wait before any global load or store, and launch_dependents; the GEMV reads
    (only) its first weight tile before the wait and stores nothing there; without USE_GDC neither
    instruction is emitted. The few-rows "swap" GEMM as the GEMV."""

    from workbench.bench import regs

    if not regs.cuobjdump_path().parent.is_dir():
        pytest.skip("no Triton NVIDIA backend here")
    got = regs.run_aot_probe(PTX_PROBE)
    for name in ("gemv", "norm", "swap"):
        assert not got[f"{name}/False"]["wait"] and not got[f"{name}/False"]["launch"]
        assert got[f"{name}/True"]["wait"] and got[f"{name}/True"]["launch"]
        assert got[f"{name}/True"]["stores_before"] == 0
    assert got["norm/True"]["loads_before"] == 0
    assert got["gemv/True"]["loads_before"] >= 1  # the weight tile, in flight while the kernel before finishes
    assert got["swap/True"]["loads_before"] >= 1


SMEM_PROBE = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tree_kernels.gemv import triton as gm
from tree_kernels.gemv.few_rows_tuned import TABLE

out = []
for (dev, n, k, m), cfg in TABLE.items():
    if cfg.get("LAYOUT") != "swap_tma":
        continue
    main, tail = gm.swap_row_blocks(m)
    bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
    cx = {"HAS_BIAS": False, "PARTIAL": False, "DOT_FP32": False, "BLOCK_N": bn, "BLOCK_K": bk, "M_MAIN": main,
          "M_TAIL": tail, "WARP_SPECIALIZE": False}
    sig = {"x_desc": f"tensordesc<bf16[{main}, {bk}]>", "xt_desc": f"tensordesc<bf16[{max(tail, 16)}, {bk}]>",
           "w_desc": f"tensordesc<bf16[{bn}, {bk}]>", "B": "*bf16", "Y": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "k_per_split": "i32", "sym": "i32", **{c: "constexpr" for c in [*cx, "USE_GDC"]}}
    row = {"shape": [n, k, m]}
    for use in (False, True):
        stages = gm.tma_stages(cfg["num_stages"], {"USE_GDC": True} if use else {})
        kernel = triton.compile(ASTSource(fn=gm._few_rows_swap_tma_kernel, signature=sig, constexprs={**cx, "USE_GDC": use}),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["num_warps"], "num_stages": stages})
        row[str(use)] = kernel.metadata.shared
    out.append(row)
print(json.dumps(out))
"""


def test_the_tma_routes_with_pdl_fit_the_shared_memory_they_have_without():
    """sm_90 AOT compile of every committed TMA few-rows route at the stages its launch takes, with PDL
    and without: the peeled first tile must not push a route past what it uses without PDL (the
    65-row LM-head route at its 4 stages once needed 266 KB with PDL and failed to launch on an H100,
    whose limit is 227 KB)."""
    from workbench.bench import regs

    if not regs.cuobjdump_path().parent.is_dir():
        pytest.skip("no Triton NVIDIA backend here")
    rows = regs.run_aot_probe(SMEM_PROBE)
    assert rows, "no TMA route in few_rows_tuned.TABLE to check"
    for row in rows:
        assert row["True"] <= row["False"] <= 232448, row
