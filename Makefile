# Everything a new machine needs: `make test` and `make demo` each build their own virtual environment.
# The CPU build of PyTorch is installed first so pip never pulls a multi-GB CUDA build; override TORCH for a GPU.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# the oldest PyTorch that pyproject.toml claims, with what its wheels need (NumPy 1.x, hence an older pyarrow/datasets;
# transformers 5 needs torch 2.6)
OLDEST_TORCH ?= torch==2.2.2 "numpy<2" "pyarrow<17" "datasets>=2.16,<3" "transformers<4.50"
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install test test-fast test-oldest-torch demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test,plot,demo,recipes,interop,glossary]"
	touch $@

install: $(VENV)/.installed

## test: the full test suite (what CI runs), one worker per core (pytest-xdist)
test: install
	$(PY) -m pytest -q -n auto --dist loadgroup $(PYTEST_ARGS)

## test-fast: skip the slow end-to-end tests
test-fast: install
	$(PY) -m pytest -q -n auto --dist loadgroup -m "not slow" $(PYTEST_ARGS)

## test-oldest-torch: the whole suite on OLDEST_TORCH in its own venv (the PyPI build: a few GB of CUDA libraries);
## the summary and the versions go to benchmarks/results/oldest_torch.txt
test-oldest-torch:
	bash -o pipefail -c '$(MAKE) test VENV=.venv-oldest-torch TORCH='"'"'$(OLDEST_TORCH)'"'"' 2>&1 | tail -n 3 > /tmp/tfcli-oldest.txt'; \
	status=$$?; { echo "make test-oldest-torch, $$(date -u '+%Y-%m-%d %H:%M') UTC, exit status $$status"; \
	.venv-oldest-torch/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|numpy|pyarrow|datasets|tokenizers|sacrebleu|transformers|ctranslate2) '; \
	cat /tmp/tfcli-oldest.txt; } > benchmarks/results/oldest_torch.txt; cat benchmarks/results/oldest_torch.txt; exit $$status

## demo: prepare -> train -> translate -> eval on the embedded corpus (a few minutes on a CPU)
demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash recipes/demo.sh

## bench: peer benchmarks (transformers + ctranslate2 come with the interop extra); BENCH_ARGS="--checkpoint RUN
## --peer-checkpoint POST_RUN" adds Multi30k test2016 by trained de-en models (docs/performance.md: Benchmarks)
bench: install
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-oldest-torch demo runs .pytest_cache
