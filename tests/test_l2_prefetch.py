"""The L2 warm-up read (tree_kernels.l2_prefetch): the Triton kernel reads exactly the asked-for
bytes (its XOR partials against the reference's, under TRITON_INTERPRET=1 on CPU), bad input is
refused before any launch, and in a model it reads each output projection of a multi-token forward
once, never in a one-token step, and changes no output."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")

import tree_kernels as tk  # noqa: E402
from tree_kernels.l2_prefetch import naive  # noqa: E402

lp = pytest.importorskip("tree_kernels.l2_prefetch.triton")


def _xor(partials: torch.Tensor) -> int:
    return int(np.bitwise_xor.reduce(partials.cpu().numpy()))


@pytest.mark.parametrize("nbytes", [0, 60, 64, 1000, 37 * 130 * 2, 10**9])
@pytest.mark.parametrize("config", [{}, {"PROGRAMS": 3, "BLOCK": 64}, {"PROGRAMS": 1, "BLOCK": 16, "EVICT_LAST": False},
                                    {"PROGRAMS": 50, "BLOCK": 16}])  # more programs than tiles: the last ones read nothing
def test_prefetch_reads_exactly_the_asked_bytes(nbytes, config):
    w = torch.randn(37, 130, generator=torch.Generator().manual_seed(nbytes % 97)).bfloat16()
    partials = lp.l2_prefetch(w, nbytes, config)
    assert partials.dtype == torch.int32 and partials.numel() == {**lp.DEFAULT_CONFIG, **config}["PROGRAMS"]
    assert _xor(partials) == naive.l2_prefetch_checksum(w, nbytes)
    words = naive.prefetch_words(w, nbytes)
    assert words.numel() == min(nbytes, w.numel() * 2) // 64 * 16  # whole 64-byte units, capped at the tensor


def test_the_checksum_sees_every_byte_in_range_and_none_beyond():
    """A word flipped inside the range changes the kernel's answer, one just past it does not (so
    a kernel skipping a tile or reading one too many fails above)."""
    w = torch.zeros(64, 64, dtype=torch.bfloat16)
    words = w.view(-1).view(torch.int32)
    nbytes = 1024  # words 0..255
    base = _xor(lp.l2_prefetch(w, nbytes, {"PROGRAMS": 3, "BLOCK": 32}))
    for i, inside in ((0, True), (97, True), (255, True), (256, False), (2047, False)):
        words[i] = 0x5A5A
        got = _xor(lp.l2_prefetch(w, nbytes, {"PROGRAMS": 3, "BLOCK": 32}))
        assert (got != base) == inside, i
        words[i] = 0


def test_prefetch_refuses_bad_input_by_name():
    w = torch.zeros(8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="not contiguous"):
        lp.l2_prefetch(w.t(), 64)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        lp.l2_prefetch(w, -1)
    with pytest.raises(ValueError, match="BLOCK a power of two.*48"):
        lp.l2_prefetch(w, 64, {"BLOCK": 48})
    with pytest.raises(ValueError, match="out must be int32"):
        lp.l2_prefetch(w, 64, out=torch.zeros(64, dtype=torch.float32))
    with pytest.raises(ValueError, match="not whole 32-bit words"):
        naive.prefetch_words(torch.zeros(3, dtype=torch.bfloat16), 4)


def test_the_switch_is_off_unless_asked():
    assert tk.l2_prefetch_enabled() is (os.environ.get("WORKBENCH_L2_PREFETCH", "0") not in ("0", "false", "off", "no"))
    w = torch.zeros(8, 16)
    with tk.use_l2_prefetch(False), tk.use_backend("triton"):
        assert tk.l2_prefetch_start(w) is None
    tk.l2_prefetch_join(None)  # nothing pending: nothing to wait for


def test_a_model_forward_warms_each_output_projection_once_and_changes_nothing(monkeypatch):
    from workbench.models.common import Attention
    from workbench.models.qwen3_5 import GatedDeltaNet
    from workbench.random_models import random_target

    target = random_target("hybrid", seed=3, vocab_size=64)
    projections = {id(m.out_proj.weight if isinstance(m, GatedDeltaNet) else m.o_proj.weight): type(m).__name__
                   for m in target.modules() if isinstance(m, (GatedDeltaNet, Attention))}
    assert set(projections.values()) == {"GatedDeltaNet", "Attention"}
    read = []
    monkeypatch.setattr(tk, "L2_PREFETCH_MIN_BYTES", 0)  # the tiny model's weights are all below the real floor
    real = lp.l2_prefetch
    monkeypatch.setattr(lp, "l2_prefetch", lambda w, n, config=None, out=None: read.append(id(w)) or real(w, n, config, out))
    prompt = [5, 9, 2, 33, 17, 8]
    logits = {}
    for on in (False, True):
        with torch.no_grad(), tk.use_backend("triton"), tk.use_l2_prefetch(on):
            cache = target.new_cache(16)
            read.clear()
            chain = target.run_chain(prompt, cache).logits
            multi = sorted(read)
            read.clear()
            step = target.run_chain([4], cache).logits  # one token: no window to fill, nothing read
            logits[on] = chain, step
            assert not read
            assert multi == (sorted(projections) if on else [])
    assert torch.equal(logits[True][0], logits[False][0]) and torch.equal(logits[True][1], logits[False][1])
    monkeypatch.setattr(tk, "L2_PREFETCH_MIN_BYTES", 4 << 20)
    with torch.no_grad(), tk.use_backend("triton"), tk.use_l2_prefetch(True):
        read.clear()
        target.run_chain(prompt, target.new_cache(16))
        assert not read  # weights under the floor: nothing to gain, nothing read


def test_the_l2_benchmark_says_it_needs_a_gpu(capsys):
    from workbench.bench import l2

    if torch.cuda.is_available():  # pragma: no cover - the device runs it for real
        pytest.skip("a GPU is present")
    assert l2.main(["--repeats", "1"]) == 2
    assert "no" in capsys.readouterr().out


PTX_PROBE = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tree_kernels.l2_prefetch import triton as lp
sig = {"W": "*i32", "Out": "*i32", "n_words": "i32", "words_per_program": "i32", "BLOCK": "constexpr",
       "EVICT_LAST": "constexpr", "PTX": "constexpr"}
out = {}
for ptx, evict in ((0, True), (1, True), (1, False), (2, True)):
    k = triton.compile(ASTSource(fn=lp._l2_prefetch_kernel, signature=sig, constexprs={"BLOCK": 256, "EVICT_LAST": evict, "PTX": ptx}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    lines = k.asm["ptx"].splitlines()
    out[f"{ptx}/{evict}"] = {"prefetch": sorted({l.strip().split(" [")[0] for l in lines if l.strip().startswith(("prefetch.", "cp.async.bulk.prefetch"))}),
                             "loads": sum("ld.global" in l for l in lines)}
print(json.dumps(out))
"""


def test_the_prefetch_instructions_compile_for_hopper():
    """PTX 1 / 2 cannot be interpreted; an ahead-of-time sm_90 compile (a subprocess without
    TRITON_INTERPRET) shows each mode emits its instruction, with its eviction hint, and no loads."""

    from workbench.bench import regs

    if not regs.cuobjdump_path().parent.is_dir():
        pytest.skip("no Triton NVIDIA backend here")
    got = regs.run_aot_probe(PTX_PROBE)
    assert got["0/True"]["prefetch"] == [] and got["0/True"]["loads"] > 0
    assert got["1/True"]["prefetch"] == ["prefetch.global.L2::evict_last"] and got["1/True"]["loads"] == 0
    assert got["1/False"]["prefetch"] == ["prefetch.global.L2"]
    assert got["2/True"]["prefetch"] == ["cp.async.bulk.prefetch.L2.global"] and got["2/True"]["loads"] == 0


def test_prefetch_instructions_are_refused_off_the_gpu():
    with pytest.raises(ValueError, match="PTX must be 0.*CUDA only.*got 1 on cpu"):
        lp.l2_prefetch(torch.zeros(64, 16), 4096, {"PTX": 1})
    with pytest.raises(ValueError, match="got 3"):
        lp.l2_prefetch(torch.zeros(64, 16), 4096, {"PTX": 3})


def test_a_bad_size_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv("WORKBENCH_L2_PREFETCH_MB", "lots")
    with pytest.raises(ValueError, match="WORKBENCH_L2_PREFETCH_MB='lots': expected a number of megabytes"):
        tk._env_megabytes("WORKBENCH_L2_PREFETCH_MB", 32)
    monkeypatch.setenv("WORKBENCH_L2_PREFETCH_MB", "-1")
    with pytest.raises(ValueError, match="must be >= 0"):
        tk._env_megabytes("WORKBENCH_L2_PREFETCH_MB", 32)
    monkeypatch.setenv("WORKBENCH_L2_PREFETCH_MB", "1.5")
    assert tk._env_megabytes("WORKBENCH_L2_PREFETCH_MB", 32) == 3 << 19
    monkeypatch.delenv("WORKBENCH_L2_PREFETCH_MB")
    assert tk._env_megabytes("WORKBENCH_L2_PREFETCH_MB", 32) == 32 << 20
