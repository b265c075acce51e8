"""bench.regs: a kernel's registers and spills from an ahead-of-time sm_90 compile (no GPU).

The compile runs in a subprocess: the test session runs Triton interpreted (TRITON_INTERPRET=1),
where kernels are not compilable."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
from workbench.bench import regs  # noqa: E402

pytestmark = pytest.mark.skipif(not regs.cuobjdump_path().is_file(), reason="Triton ships no cuobjdump here")
ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
sys.path.insert(0, {tests!r})
import regs_kernels as k
from workbench.bench import regs
t = {{"X": "*fp32", "Y": "*fp32"}}
out = {{"small": regs.resource_usage(k.scale_kernel, {{"BLOCK": 256}}, 4, t),
        "big": regs.resource_usage(k.big_tile_kernel, {{"N": 128}}, 1, t)}}
try:
    regs.resource_usage(k.scale_kernel, {{"BLOK": 256}}, 4, t)
except ValueError as exc:
    out["bad"] = str(exc)
print(json.dumps(out))
"""


def compiled_env():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    return env


def test_a_small_kernel_fits_a_huge_tile_spills_and_a_wrong_name_is_named():
    code = PROBE.format(tests=str(ROOT / "tests"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=compiled_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0 < got["small"]["registers"] <= 255 and got["small"]["stack_bytes"] == 0
    assert got["big"]["stack_bytes"] > 0  # a 128 x 128 fp32 tile live on 32 threads spills
    assert "no argument(s) ['BLOK']" in got["bad"]


def test_interpreted_kernels_are_refused_with_the_reason(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert regs.main(["--out", os.devnull]) == 2
    with pytest.raises(TypeError, match="TRITON_INTERPRET"):
        regs.resource_usage(lambda: None, {}, 4)
