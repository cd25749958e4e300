# make demo / make test work on a fresh machine with only Python 3.11:
# each creates .venv if missing and installs what it needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Paddle 3.3.1 (legacy program IR) lives in a second environment: one Paddle per process.
VENV3 := .venv-paddle3
PY3 := $(VENV3)/bin/python

.PHONY: demo test test-paddle3 bench clean

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[mxnet,paddle,test]" "torch==2.13.0"
	touch $@

$(VENV3)/.installed: setup.cfg pyproject.toml
	test -x $(PY3) || $(PYTHON) -m venv $(VENV3)
	$(PY3) -m pip install -q -e ".[test]" "paddlepaddle==3.3.1" "numpy<2"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/amp-adapters demo --plot docs/demo.png

test: $(VENV)/.installed
	$(PY) -m pytest -q

# The Paddle and core tests again, against Paddle 3.3.1 with the legacy IR.
test-paddle3: $(VENV3)/.installed
	FLAGS_enable_pir_api=0 $(PY3) -m pytest -q tests/core tests/paddle

bench: $(VENV)/.installed
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(VENV3) *.egg-info
