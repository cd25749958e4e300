# make demo / make test work on a fresh machine with only Python 3.11:
# each creates .venv if missing and installs what it needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Paddle 3.3.1 lives in its own environments (one Paddle per process), on Python 3.11 and 3.13.
VENV3 := .venv-paddle3
PY3 := $(VENV3)/bin/python
# the first python3.13 that runs (a pyenv shim on PATH may not, while pyenv's build does)
PYTHON313 ?= $(shell for p in python3.13 $$HOME/.pyenv/versions/3.13*/bin/python3.13; do \
	"$$p" -c "" 2>/dev/null && { command -v "$$p"; break; }; done)
VENV313 := .venv-paddle3-py313
PY313 := $(VENV313)/bin/python

.PHONY: demo test test-paddle3 test-paddle3-py311 test-paddle3-py313 bench bench-paddle3 clean

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[mxnet,paddle,test]" "torch==2.13.0"
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

demo: $(VENV)/.installed
	$(VENV)/bin/amp-adapters demo --plot docs/demo.png

test: $(VENV)/.installed
	$(PY) -m pytest -q

# The core and Paddle tests against Paddle 3.3.1, in PIR (its default) and in the legacy IR,
# on Python 3.11 and 3.13. conftest.py reads AMP_TEST_IR before importing paddle.
test-paddle3: test-paddle3-py311 test-paddle3-py313

test-paddle3-py311: $(VENV3)/.installed
	AMP_TEST_IR=pir $(PY3) -m pytest -q tests/core tests/paddle
	AMP_TEST_IR=legacy $(PY3) -m pytest -q tests/paddle

test-paddle3-py313: $(VENV313)/.installed
	AMP_TEST_IR=pir $(PY313) -m pytest -q tests/core tests/paddle
	AMP_TEST_IR=legacy $(PY313) -m pytest -q tests/paddle

bench: $(VENV)/.installed
	$(PY) -m bench

# Paddle 3 only (not a `make bench` section): PIR beside the legacy IR; paste into RESULTS.md.
bench-paddle3: $(VENV3)/.installed
	$(PY3) -m bench.paddle_pir_overhead

clean:
	rm -rf $(VENV) $(VENV3) $(VENV313) *.egg-info
