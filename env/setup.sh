#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment on a fresh machine.
# torch is pinned first so a CPU machine takes the CPU build (an unpinned torch pulls CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -r env/requirements-torch-cpu.txt
"$VENV/bin/python" -m pip install -q -e ".[${EXTRAS}]"
"$VENV/bin/python" -c "import torch, transformers, tree_kernels, workbench; print('env ok: torch', torch.__version__, 'transformers', transformers.__version__)"
# the system chromium for figure export (make demo / make test also run this and stop if apt fails)
bash env/install-chromium.sh || echo "warning: chromium could not be installed; static figure export will not work" >&2
