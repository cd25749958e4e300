"""Smoke test of an installed amp-adapters (a built wheel or sdist in an empty venv), run by
that venv's Python from outside the checkout: `.ci/run` after `make dist`.

Checks that the code comes from the installed package, its version and metadata, the data
files the core reads (the op tables), every package and the console script."""
import importlib.metadata as metadata
import importlib.util
import os
import subprocess
import sys

import amp_adapters
from amp_adapters import Policy, categorize

here = os.path.dirname(os.path.abspath(amp_adapters.__file__))
assert "site-packages" in here, f"amp_adapters imported from {here}, not the installed package"
meta = metadata.metadata("amp-adapters")
assert amp_adapters.__version__ == meta["Version"], (amp_adapters.__version__, meta["Version"])
assert meta["Requires-Python"] == ">=3.11", meta["Requires-Python"]
classifiers = meta.get_all("Classifier")
assert "Programming Language :: Python :: 3.13" in classifiers, classifiers
for package in ("mxnet_amp", "paddle_amp", "amp_demo"):  # found, not imported (no framework)
    assert importlib.util.find_spec(package) is not None, package
for data in ("py.typed", "rules/oplists/canonical.toml", "rules/oplists/native.toml"):
    assert os.path.exists(os.path.join(here, data)), data
assert categorize(Policy.preset("O1"), "mxnet", "dot").category == "lower"
assert categorize(Policy.preset("mxnet-native"), "mxnet", "dot").category == "promote"
exe = os.path.join(os.path.dirname(sys.executable), "amp-adapters")
out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
assert out.strip() == f"amp-adapters {amp_adapters.__version__}", out
out = subprocess.run([exe, "explain", "matmul_v2", "--framework", "paddle"],
                     capture_output=True, text=True, check=True).stdout
assert "policy paddle-native" in out and "category: lower" in out, out
print(f"smoke test passed: amp-adapters {amp_adapters.__version__} from {here}")
