"""Registers and spills of the tree GDN kernels, without a GPU: ``python -m workbench.bench.regs``.

A Triton kernel whose tiles do not fit the register file spills them to local memory, and a
latency-bound kernel (the tree GDN solve is one) pays for every spill on its critical path. This
compiles each kernel ahead of time for a Hopper target (``triton.compile`` with
``GPUTarget("cuda", 90, 32)``: no device needed) and reads the cubin's resource usage with the
``cuobjdump`` that ships in Triton's NVIDIA backend. It found the 3 KB-a-thread spill of the first
dense GDN solve and the 1.1 KB of its [64, 64] doubling inverse (kernels/NOTES.md, 2026-12-05).

Written to ``data/results/regs-cpu-<date>.json``. A resource count, not a timing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ..trace import write_json_atomic
from .results import RESULTS

# pointer and scalar types of the tree GDN kernels' arguments, by name (bf16 q / k / v as in a
# bf16 verify, fp32 gates and state, a uint8 ancestor mask, fp32 outputs and stash)
POINTER_TYPES = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Gin": "*fp32", "Beta": "*fp32", "S0": "*fp32",
                 "Anc": "*u8", "O": "*fp32", "SK": "*fp32", "SU": "*fp32", "SG": "*fp32", "Inv": "*fp32",
                 "P": "*fp32", "OffL": "*fp32", "OffM": "*fp32"}
FLOAT_SCALARS = {"scale"}


def cuobjdump_path() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def run_aot_probe(code: str, timeout: int = 600) -> dict:
    """Run ``code`` (ahead-of-time compiles; prints one JSON line last) in a subprocess without
    TRITON_INTERPRET, with the repository and its kernels importable; returns that JSON."""
    import json

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "kernels"), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"AOT probe failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def resource_usage(fn, constexprs: dict, num_warps: int, pointer_types: dict | None = None,
                   arch: int = 90) -> dict:
    """{'registers', 'stack_bytes', 'shared_bytes'} per thread / block of ``fn`` compiled for sm_<arch>.

    Arguments not in ``constexprs`` are typed from ``pointer_types`` (name -> '*fp32' ...), floats in
    FLOAT_SCALARS, and i32 otherwise."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from triton.runtime.jit import JITFunction

    if not isinstance(fn, JITFunction):
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} is not a compilable @triton.jit function "
                        f"(under TRITON_INTERPRET=1 kernels are interpreted: run with it unset)")
    tool = cuobjdump_path()
    if not tool.is_file():
        raise FileNotFoundError(f"no cuobjdump at {tool} (Triton's NVIDIA backend ships it)")
    types = dict(POINTER_TYPES, **(pointer_types or {}))
    unknown = set(constexprs) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"{fn.__name__} has no argument(s) {sorted(unknown)} (has {fn.arg_names})")
    sig = {n: "constexpr" if n in constexprs else types.get(n, "fp32" if n in FLOAT_SCALARS else "i32")
           for n in fn.arg_names}
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the launch default, silences a warning
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                            target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        report = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)], capture_output=True,
                                text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", report)
    stack = re.search(r"STACK:(\d+)", report)
    if not regs or not stack:
        raise RuntimeError(f"cuobjdump printed no REG / STACK for {fn.__name__}: {report[:300]!r}")
    return {"registers": int(regs.group(1)), "stack_bytes": int(stack.group(1)),
            "shared_bytes": int(kernel.metadata.shared)}


def gdn_cases(dk: int = 128, dv: int = 128) -> list[tuple[str, object, dict, int]]:
    """(label, kernel, constexprs, warps) of the tree GDN solve's kernels at their default settings
    and the dense solve's blocks (27B dims: dk = dv = 128)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))
    from tree_kernels._triton_common import next_pow2
    from tree_kernels.tree_gdn import triton as tg

    bk = max(16, next_pow2(dk))
    cases = []
    for bn in (16, 32, 64):
        d = tg.dense_config(bn, dv)
        bkc = min(bk, d["BKC"])
        cases.append((f"dense prepare BN {bn}", tg._gdn_dense_prepare_kernel,
                      dict(DK=dk, BK=bk, BKC=bkc, BN=bn, LOG2BN=bn.bit_length() - 1, PREC="tf32x3"), d["prep_warps"]))
        cases.append((f"dense apply BN {bn}", tg._gdn_dense_apply_kernel,
                      dict(DK=dk, DV=dv, BK=bk, BKC=bkc, BV=d["BV"], BN=bn, PREC="tf32x3"), d["num_warps"]))
    b = tg.blocked_config(65, dv)
    bs = b["BS"]
    prep = dict(DK=dk, DV=dv, BK=bk, BS=bs, PREC="tf32x3", PEEL=False, OFF=True, DOUBLING=False,
                LOG2BS=bs.bit_length() - 1, TP=0, BKC=min(bk, b["PREP_BKC"]), S0P=False, BVP=b["S0_BV"],
                S0_BKC=b["S0_BKC"])
    cases.append(("blocked prepare (off-diagonal blocks)", tg._gdn_prepare_kernel, prep, b["prep_warps"]))
    cases.append(("blocked prepare + S0 products (PRE_S0)", tg._gdn_prepare_kernel, dict(prep, S0P=True), b["prep_warps"]))
    cases.append(("blocked chain (off-diagonal blocks)", tg._gdn_fork_kernel,
                  dict(DK=dk, DV=dv, BK=bk, BV=b["BV"], BS=bs, PREC="tf32x3", PRE=True, PEEL=False, OFF=True, TP=0),
                  b["num_warps"]))
    for tw in (0, 64):  # 65 nodes: four earlier blocks at most, one wide dot of 64 columns
        for bv, warps in ((b["BV"], b["num_warps"]), (16, 2)):
            cases.append((f"PRE_S0 chain, TW {tw}, BV {bv}", tg._gdn_chain_kernel,
                          dict(DV=dv, BV=bv, BS=bs, PREC="tf32x3", TW=tw), warps))
    return cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.regs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    p.add_argument("--out", default=None, help="JSON path (default data/results/regs-cpu-<date>.json)")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("error: TRITON_INTERPRET is set: kernels are interpreted, not compiled; run with it unset", file=sys.stderr)
        return 2
    import triton
    from tqdm import tqdm

    cases = gdn_cases()
    rows = []
    for label, fn, const, warps in tqdm(cases, desc="compile", unit="kernel"):
        row = {"kernel": fn.__name__, "label": label, "num_warps": warps, "constexprs": const}
        try:
            row.update(resource_usage(fn, const, warps, arch=args.arch))
        except Exception as exc:  # report it; the other kernels still stand
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
        print(f"{label:40s} warps {warps}: " + (row.get("error") or
              f"{row['registers']} registers, {row['stack_bytes']} B stack (spill), {row['shared_bytes']} B shared"))
    out = Path(args.out) if args.out else RESULTS / f"regs-cpu-{dt.date.today().isoformat()}.json"
    write_json_atomic(out, {"benchmark": "regs", "date": dt.datetime.now().isoformat(timespec="seconds"),
                            "target": f"sm_{args.arch}", "triton": triton.__version__, "rows": rows})
    print(f"wrote {out}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
