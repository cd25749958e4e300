# make demo / make test work on a fresh machine: each creates .venv with Python 3.11 (MXNet
# 1.9.1 has no wheels, and numpy<1.24 does not build, on newer Pythons) and installs only what
# it needs (CPU builds; no torch: its oracle tests skip unless .ci/run or you install one).
PYTHON ?= $(shell tools/find_python 3.11)
VENV := .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install --progress-bar on
NO_PYTHON311 := Python 3.11 not found (MXNet 1.9.1 needs it): install it (pyenv install 3.11, apt install python3.11-venv, uv python install 3.11) or run make PYTHON=/path/to/python3.11
# What to do when the Python is not 3.11: one line that leads somewhere (not "run again").
NOT_PYTHON311 = MXNet 1.9.1 needs Python 3.11 (numpy<1.24 has no wheels for newer ones): make $(or $(MAKECMDGOALS),demo) PYTHON=/path/to/python3.11 (tools/find_python 3.11 finds one; without PYTHON= make looks for it itself). Paddle alone runs on 3.12 and 3.13: pip install '.[paddle3,demo]'
PYVERSION = $$($(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SITE ?= site
DEMO_PLOT ?= out/demo.png
# Paddle 3.3.1 lives in its own environments (one Paddle per process), on Python 3.11 and 3.13.
VENV3 := .venv-paddle3
PY3 := $(VENV3)/bin/python
PYTHON313 ?= $(shell tools/find_python 3.13)
VENV313 := .venv-paddle3-py313
PY313 := $(VENV313)/bin/python

# The tests whose expectation depends on what the CPU runs (kernels, bf16, speed, the doctor,
# the demo, reports): make test-cpu-classes runs them again as an AVX2 CPU and as an AVX-512
# CPU without bf16 instructions (AMP_ADAPTERS_CPU: the device truth answers as that class and
# oneDNN is limited to match, here and in every child).
DEVICE_TESTS := tests/core/test_cpu_class.py tests/core/test_fallback_info.py \
	tests/core/test_native_speed.py tests/mxnet/test_speed.py tests/mxnet/test_auto_device.py \
	tests/mxnet/test_bench_bf16.py tests/mxnet/test_bf16_convert.py tests/mxnet/test_device.py \
	tests/mxnet/test_doctor.py tests/mxnet/test_frozen_weight.py tests/mxnet/test_kernel_table.py \
	tests/mxnet/test_mxnet_device_book.py \
	tests/paddle/test_paddle_auto_device.py tests/paddle/test_paddle_bf16.py \
	tests/paddle/test_paddle_bf16_dropin.py tests/paddle/test_paddle_bf16_guard.py \
	tests/paddle/test_paddle_bf16_slow_grads.py tests/paddle/test_paddle_kernels_behind_casts.py \
	tests/paddle/test_paddle_speed.py tests/paddle/test_paddle_doctor.py \
	tests/paddle/test_dygraph_autocast.py tests/paddle/test_dygraph_training.py \
	tests/paddle/test_dygraph_auto.py \
	tests/paddle/test_dygraph_to_static.py tests/paddle/test_dygraph_report.py \
	tests/paddle/test_dygraph_o2.py tests/paddle/test_dygraph_conv2d.py tests/demo \
	tests/paddle/test_dygraph_partial_grad.py tests/paddle/test_dygraph_to_static_step.py \
	tests/paddle/test_dygraph_doctor.py tests/paddle/test_dygraph_fast_path.py \
	tests/paddle/test_dygraph_checkpoint_kill.py tests/paddle/test_paddle_device_book.py \
	tests/paddle/test_paddle_recompute_casts.py tests/paddle/test_dygraph_recast.py \
	tests/consistency/test_cast_reports.py tests/docs/test_doctor_page.py
CPU_CLASSES := avx2 avx512_core

.PHONY: demo test test-cpu-classes docs dist test-paddle3 test-paddle3-py311 test-paddle3-py313 bench bench-paddle3 clean

$(PY):
	@test -n "$(PYTHON)" || { echo "make: $(NO_PYTHON311)" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "make: PYTHON=$(PYTHON) is Python $(call PYVERSION,$(PYTHON)). $(NOT_PYTHON311)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo-installed: setup.cfg pyproject.toml | $(PY)
	@$(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "make: $(VENV) was made by Python $(call PYVERSION,$(PY)): rm -rf $(VENV) first. $(NOT_PYTHON311)" >&2; exit 1; }
	$(PIP_INSTALL) -e ".[mxnet,paddle,demo]"
	touch $@

$(VENV)/.test-installed: $(VENV)/.demo-installed
	$(PIP_INSTALL) -e ".[mxnet,paddle,demo,test]"
	touch $@

$(VENV3)/.installed: setup.cfg pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: $(NO_PYTHON311)" >&2; exit 1; }
	test -x $(PY3) || $(PYTHON) -m venv $(VENV3)
	$(PY3) -m pip install --progress-bar on -e ".[paddle3,test]"
	touch $@

$(VENV313)/.installed: setup.cfg pyproject.toml
	@test -n "$(PYTHON313)" || { echo "make: test-paddle3 needs Python 3.13 (pyenv install 3.13, uv python install 3.13) or make test-paddle3 PYTHON313=/path/to/python3.13; make test-paddle3-py311 runs the 3.11 half alone" >&2; exit 1; }
	test -x $(PY313) || $(PYTHON313) -m venv $(VENV313)
	$(PY313) -m pip install --progress-bar on -e ".[paddle3,test]"
	touch $@

$(VENV)/.docs-installed: setup.cfg pyproject.toml | $(PY)
	$(PIP_INSTALL) -e ".[docs]"
	touch $@

# The figure goes to out/ (untracked); make demo DEMO_PLOT=docs/demo.png refreshes the README's.
demo: $(VENV)/.demo-installed
	@mkdir -p $(dir $(DEMO_PLOT))
	$(VENV)/bin/amp-adapters demo --plot $(DEMO_PLOT)

# Two pytest workers (pytest-xdist) on the 2 cores `make test` is sized for: the suite is mostly
# single-threaded steps and child processes (about 0.6 of the serial time). --dist loadfile: each
# file's tests run in one worker in file order, its module fixtures built once; each worker
# measures into its own speed cache (conftest.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: $(VENV)/.test-installed
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-cpu-classes: $(VENV)/.test-installed
	set -e; for cls in $(CPU_CLASSES); do \
		echo "== the device-dependent tests as a CPU of class $$cls (AMP_ADAPTERS_CPU)"; \
		AMP_ADAPTERS_CPU=$$cls $(PY) -m pytest -q $(DEVICE_TESTS); \
	done

# The documentation site (MkDocs; the API reference from the docstrings), strict: a broken
# link, a missing reference or an unknown anchor fails. Opens as $(SITE)/index.html.
docs: $(VENV)/.docs-installed
	$(PY) -m mkdocs build --strict --site-dir $(SITE)

# The core and Paddle tests against Paddle 3.3.1, in PIR (its default) and in the legacy IR,
# on Python 3.11 and 3.13. conftest.py reads AMP_TEST_IR before importing paddle.
# AMP_MXNET_PYTHON: MXNet's Python, for the MXNet side of test_paddle_three_graphs.py.
test-paddle3: test-paddle3-py311 test-paddle3-py313

test-paddle3-py311: $(VENV3)/.installed $(VENV)/.test-installed
	AMP_TEST_IR=pir AMP_MXNET_PYTHON=$(abspath $(PY)) $(PY3) -m pytest -q tests/core tests/paddle tests/demo tests/docs
	AMP_TEST_IR=legacy $(PY3) -m pytest -q tests/paddle
	set -e; for cls in $(CPU_CLASSES); do \
		echo "== Paddle 3.3.1 (PIR): the device-dependent tests as a CPU of class $$cls"; \
		AMP_ADAPTERS_CPU=$$cls AMP_TEST_IR=pir $(PY3) -m pytest -q \
			$(filter tests/core/% tests/paddle/%,$(DEVICE_TESTS)); \
	done

test-paddle3-py313: $(VENV313)/.installed $(VENV)/.test-installed
	AMP_TEST_IR=pir AMP_MXNET_PYTHON=$(abspath $(PY)) $(PY313) -m pytest -q tests/core tests/paddle tests/demo tests/docs
	AMP_TEST_IR=legacy $(PY313) -m pytest -q tests/paddle

# Release: an sdist and a wheel in dist/ (python -m build builds the wheel from the sdist).
# .ci/run installs each into an empty venv and runs tools/smoke_installed.py there.
dist: | $(PY)
	$(PIP_INSTALL) "build==1.6.1"
	rm -rf dist
	$(PY) -m build --outdir dist

bench: $(VENV)/.test-installed
	$(PY) -m bench

# Paddle 3 only (not a `make bench` section): PIR beside the legacy IR; paste into RESULTS.md.
bench-paddle3: $(VENV3)/.installed
	$(PY3) -m bench.paddle_pir_overhead

clean:
	rm -rf $(VENV) $(VENV3) $(VENV313) *.egg-info out $(SITE) build dist
