# make demo / make test work on a fresh machine: each creates .venv with Python 3.11 (MXNet
# 1.9.1 has no wheels, and numpy<1.24 does not build, on newer Pythons) and installs only what
# it needs (CPU builds; no torch: its oracle tests skip unless .ci/run or you install one).
PYTHON ?= $(shell tools/find_python 3.11)
VENV := .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install --progress-bar on
NO_PYTHON311 := Python 3.11 not found (MXNet 1.9.1 needs it): install it (pyenv install 3.11, apt install python3.11-venv, uv python install 3.11) or run make PYTHON=/path/to/python3.11
DEMO_PLOT ?= out/demo.png
# Paddle 3.3.1 lives in its own environments (one Paddle per process), on Python 3.11 and 3.13.
VENV3 := .venv-paddle3
PY3 := $(VENV3)/bin/python
PYTHON313 ?= $(shell tools/find_python 3.13)
VENV313 := .venv-paddle3-py313
PY313 := $(VENV313)/bin/python

.PHONY: demo test test-paddle3 test-paddle3-py311 test-paddle3-py313 bench bench-paddle3 clean

$(PY):
	@test -n "$(PYTHON)" || { echo "make: $(NO_PYTHON311)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: setup.cfg pyproject.toml | $(PY)
	@$(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "make: $(VENV) is not Python 3.11: rm -rf $(VENV) and run make again" >&2; exit 1; }
	$(PIP_INSTALL) -e ".[mxnet,paddle,demo]"
	touch $@

$(VENV)/.test-installed: $(VENV)/.demo-installed
	$(PIP_INSTALL) -e ".[mxnet,paddle,demo,test]"
	touch $@

$(VENV3)/.installed: setup.cfg pyproject.toml
	test -x $(PY3) || $(PYTHON) -m venv $(VENV3)
	$(PY3) -m pip install -q -e ".[paddle3,test]"
	touch $@

$(VENV313)/.installed: setup.cfg pyproject.toml
	test -n "$(PYTHON313)" || { echo "make test-paddle3 needs python3.13 on PATH (or PYTHON313=...)"; exit 1; }
	test -x $(PY313) || $(PYTHON313) -m venv $(VENV313)
	$(PY313) -m pip install -q -e ".[paddle3,test]"
	touch $@

# The figure goes to out/ (untracked); make demo DEMO_PLOT=docs/demo.png refreshes the README's.
demo: $(VENV)/.demo-installed
	@mkdir -p $(dir $(DEMO_PLOT))
	$(VENV)/bin/amp-adapters demo --plot $(DEMO_PLOT)

test: $(VENV)/.test-installed
	$(PY) -m pytest -q

# The core and Paddle tests against Paddle 3.3.1, in PIR (its default) and in the legacy IR,
# on Python 3.11 and 3.13. conftest.py reads AMP_TEST_IR before importing paddle.
# AMP_MXNET_PYTHON: MXNet's Python, for the MXNet side of test_paddle_three_graphs.py.
test-paddle3: test-paddle3-py311 test-paddle3-py313

test-paddle3-py311: $(VENV3)/.installed $(VENV)/.test-installed
	AMP_TEST_IR=pir AMP_MXNET_PYTHON=$(abspath $(PY)) $(PY3) -m pytest -q tests/core tests/paddle
	AMP_TEST_IR=legacy $(PY3) -m pytest -q tests/paddle

test-paddle3-py313: $(VENV313)/.installed $(VENV)/.test-installed
	AMP_TEST_IR=pir AMP_MXNET_PYTHON=$(abspath $(PY)) $(PY313) -m pytest -q tests/core tests/paddle
	AMP_TEST_IR=legacy $(PY313) -m pytest -q tests/paddle

bench: $(VENV)/.test-installed
	$(PY) -m bench

# Paddle 3 only (not a `make bench` section): PIR beside the legacy IR; paste into RESULTS.md.
bench-paddle3: $(VENV3)/.installed
	$(PY3) -m bench.paddle_pir_overhead

clean:
	rm -rf $(VENV) $(VENV3) $(VENV313) *.egg-info out
