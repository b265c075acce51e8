# The two commands a fresh machine needs: `make demo` and `make test` (both set everything up).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup chromium demo test lab clean

$(STAMP): pyproject.toml env/setup.sh env/requirements-torch-cpu.txt
	PYTHON=$(PYTHON) VENV=$(VENV) bash env/setup.sh
	touch $(STAMP)

setup: $(STAMP) chromium

# the system browser for figure export and the browser test (apt where apt exists; skips cleanly elsewhere)
chromium:
	bash env/install-chromium.sh

# the tour: explorer, sibling states and a small benchmark grid through `workbench batch` -> out/demo/
demo: $(STAMP) chromium
	$(BIN)/workbench demo --out out/demo

test: $(STAMP) chromium
	$(BIN)/pytest

# JupyterLab on notebooks/ (LAB_ARGS="--no-browser --port 8899" and so on)
lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

clean:
	rm -rf $(VENV) out .pytest_cache
