# easyad: every target does its own set-up in .venv (created on first use).
#   make tour    the tour of the library (python -m easyad): build tools, numpy, pyopencl only
#   make test    the test suite (what CI runs): adds the test references, a working OpenCL
#                device and ruff (make lint), then runs pytest
#   make docs    the documentation site, strict (warnings are errors) -> docs/_build/html
#   make bench   the benchmarks against plain floats and peer libraries (.venv-bench); prints
#                only: `make bench-write` also rewrites the committed benchmarks/results/*.md
#   make examples  the nn examples (regression, classifier, replayed training, the digits
#                  CNN, a character-level transformer on docs/*.md), plots in examples/out/;
#                  the SciPy fits (examples/scientific.py); implicit differentiation
#                  (examples/implicit.py)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install -q

.PHONY: tour test lint docs bench bench-write build examples clean opencl

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# what running easyad needs: the build tools, numpy, and the 'opencl' extra (pyopencl, PoCL)
# The checkout goes on the venv's path by a .pth file: what an editable install gives,
# without pip compiling the core once more (make build compiles it, once).
$(VENV)/.deps-run: pyproject.toml | $(BIN)/python
	@echo "easyad: installing the build tools, numpy, pyopencl and PoCL into $(VENV) (once, about a minute) ..."
	$(PIP) "setuptools>=77" "Cython>=3.0" wheel "numpy>=1.24"
	$(PIP) pyopencl pocl-binary-distribution
	$(BIN)/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_path('purelib'), \
		'easyad-checkout.pth').write_text('$(CURDIR)\n')"
	touch $@

# the test references and tools on top: sympy, scipy, PyTorch 2.13.0 (CPU), mypy, ruff, sphinx,
# dask and distributed (tests/test_dask.py's LocalCluster),
# and what the examples need (tqdm, matplotlib, scikit-learn's bundled digits), so
# tests/test_nn.py::test_examples_run and tests/test_nn_examples.py run
$(VENV)/.deps-test: pyproject.toml Makefile $(VENV)/.deps-run
	@echo "easyad: installing the test references and tools (sympy, scipy, PyTorch, ruff, sphinx, tqdm) into $(VENV) (once, a few minutes) ..."
	$(PIP) pytest pytest-xdist hypothesis sympy mypy ruff "scipy>=1.10" "torch==2.13.0"
	$(PIP) "dask[array]>=2024.1" "distributed>=2024.1"
	$(PIP) "sphinx>=7" "myst-parser>=2" furo "matplotlib>=3.7" tqdm sphinx-mathjax-offline
	$(PIP) scikit-learn threadpoolctl
	touch $@

# codegen (codegen/ -> easyad/_generated/) + cythonize + compile, each step only when its
# inputs changed (setup.py announces the long ones, with their time)
build: $(VENV)/.deps-run
	$(BIN)/python setup.py -q build_ext --inplace

tour: build
	$(BIN)/python -m easyad

# a working OpenCL device for the tests: probes, and installs the system's PoCL where it can
opencl: build
	bash .ci/ensure-opencl $(BIN)/python

# over TEST_WORKERS processes (pytest-xdist), a test file to a process: files share
# module-level state (recordings, warnings once per process) that per-test scheduling would split
TEST_WORKERS ?= 2
test: build $(VENV)/.deps-test opencl lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# the linter (rules in pyproject.toml [tool.ruff])
lint: $(VENV)/.deps-test
	$(BIN)/python -m ruff check .

# the same strict build tests/test_docs_site.py runs; figures: docs/scripts/*.py
docs: build $(VENV)/.deps-test
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html
	@echo "open docs/_build/html/index.html"

# the 'examples' extra (tqdm, matplotlib, scikit-learn, threadpoolctl), on top of the test
# environment
$(VENV)/.examples: pyproject.toml $(VENV)/.deps-test
	$(PIP) tqdm matplotlib scikit-learn threadpoolctl
	touch $@

examples: build $(VENV)/.examples
	$(BIN)/python examples/regression.py --out examples/out
	$(BIN)/python examples/classifier.py --out examples/out
	$(BIN)/python examples/replayed_training.py
	$(BIN)/python examples/digits_cnn.py --out examples/out
	$(BIN)/python examples/text_attention.py --out examples/out
	$(BIN)/python examples/scientific.py
	$(BIN)/python examples/implicit.py
	$(BIN)/python examples/distributed_training.py
	$(BIN)/python examples/multistart.py
	$(BIN)/python examples/monte_carlo.py

BENCH := .venv-bench
$(BENCH)/.deps: benchmarks/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(BENCH)
	$(BENCH)/bin/python -m pip install -q "setuptools>=77" "Cython>=3.0" wheel
	$(BENCH)/bin/python -m pip install -q -r benchmarks/requirements.txt
	$(BENCH)/bin/python -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

bench: $(BENCH)/.deps build
	$(BENCH)/bin/python benchmarks/run.py

bench-write: $(BENCH)/.deps build
	$(BENCH)/bin/python benchmarks/run.py --write

clean:
	rm -rf build $(VENV) $(BENCH) easyad/*.so easyad/_core.c easyad/_generated docs/_build \
		docs/_generated
