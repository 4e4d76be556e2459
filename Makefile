# easyad: every target does its own set-up in .venv (created on first use).
#   make tour    the tour of the library (python -m easyad)
#   make test    the test suite (what CI runs)
#   make docs    the documentation site, strict (warnings are errors) -> docs/_build/html
#   make bench   the benchmarks against plain floats and peer libraries (.venv-bench)
#   make examples  the nn examples (regression, classifier), plots in examples/out/
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: tour test docs bench build examples clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "setuptools>=77" "Cython>=3.0" wheel "numpy>=1.24"
	$(BIN)/python -m pip install -q pytest hypothesis sympy mypy "scipy>=1.10" "torch==2.13.0"
	$(BIN)/python -m pip install -q "sphinx>=7" "myst-parser>=2" furo "matplotlib>=3.7"
	$(BIN)/python -m pip install -q pyopencl pocl-binary-distribution
	$(BIN)/python -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

# codegen + cythonize + compile, each step only when its inputs changed
build: $(VENV)/.deps
	$(BIN)/python setup.py -q build_ext --inplace

tour: build
	$(BIN)/python -m easyad

test: build
	$(BIN)/python -m pytest

# the same strict build tests/test_docs_site.py runs; figures: docs/scripts/*.py
docs: build
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html
	@echo "open docs/_build/html/index.html"

# the 'examples' extra (tqdm, matplotlib), on top of the test environment
$(VENV)/.examples: pyproject.toml $(VENV)/.deps
	$(BIN)/python -m pip install -q tqdm matplotlib
	touch $@

examples: build $(VENV)/.examples
	$(BIN)/python examples/regression.py --out examples/out
	$(BIN)/python examples/classifier.py --out examples/out

BENCH := .venv-bench
$(BENCH)/.deps: benchmarks/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(BENCH)
	$(BENCH)/bin/python -m pip install -q "setuptools>=77" "Cython>=3.0" wheel
	$(BENCH)/bin/python -m pip install -q -r benchmarks/requirements.txt
	$(BENCH)/bin/python -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

bench: $(BENCH)/.deps build
	$(BENCH)/bin/python benchmarks/run.py

clean:
	rm -rf build $(VENV) $(BENCH) easyad/*.so easyad/_core.c docs/_build docs/_generated
