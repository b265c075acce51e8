# The two commands a fresh machine needs: `make demo` and `make test` (both set everything up).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lab clean

$(STAMP): pyproject.toml env/setup.sh env/requirements-torch-cpu.txt
	PYTHON=$(PYTHON) VENV=$(VENV) bash env/setup.sh
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/workbench demo --out out/demo

test: $(STAMP)
	$(BIN)/pytest

clean:
	rm -rf $(VENV) out .pytest_cache
