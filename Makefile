# Everything a new machine needs: `make test` and `make demo` each build their own virtual environment.
# The CPU build of PyTorch is installed first so pip never pulls a multi-GB CUDA build; override TORCH for a GPU.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install test test-fast demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,plot,demo,recipes]"
	touch $@

install: $(VENV)/.installed

## test: the full test suite (what CI runs)
test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

## test-fast: skip the slow end-to-end tests
test-fast: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

## demo: prepare -> train -> translate -> eval on the embedded corpus (a few minutes on a CPU)
demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash recipes/demo.sh

## bench: peer benchmarks (installs transformers + ctranslate2 into the venv); BENCH_ARGS="--checkpoint RUN
## --peer-checkpoint POST_RUN" adds Multi30k test2016 by trained de-en models (README: Benchmarks)
bench: install
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) demo runs .pytest_cache
