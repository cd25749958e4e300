"""The install paths: extras that bring what each use needs and never torch, a Makefile that
installs only what each target needs and finds a Python 3.11, and the files a user expects."""
import configparser
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def extras():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    raw = cfg["options.extras_require"]
    return {name: [re.split(r"[<>=!~ ;\[]", line.strip())[0].lower()
                   for line in raw[name].splitlines() if line.strip()] for name in raw}


def test_the_documented_extras_exist():
    assert {"mxnet", "paddle", "demo", "test", "gpu"} <= set(extras())


def test_no_extra_pulls_torch():
    """torch from PyPI is the CUDA build plus ~17 nvidia wheels; it is an optional oracle."""
    for name, packages in extras().items():
        assert "torch" not in packages, name


def test_paddle_and_demo_are_enough_for_the_paddle_demo():
    """pip install ".[paddle,demo]" then amp-adapters demo --framework paddle: the demo's
    imports (scikit-learn for the data, matplotlib for --plot) come with "demo"."""
    e = extras()
    assert {"scikit-learn", "matplotlib"} <= set(e["demo"])
    assert "paddlepaddle" in e["paddle"] and "setuptools" in e["paddle"]  # Paddle imports it
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert "amp-adapters[demo,docs]" in cfg["options.extras_require"]["test"]  # demo and docs
    # tests run under test, with the demo's pins (one list, not two copies)


def test_gpu_extra_swaps_the_framework_builds():
    assert {"mxnet-cu112", "paddlepaddle-gpu"} <= set(extras()["gpu"])


def make_dry_run(target, **variables):
    args = ["make", "-n", "-C", str(ROOT), target] + [f"{k}={v}" for k, v in variables.items()]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MAKEFLAGS=""))
    return r


@pytest.fixture
def no_venv(tmp_path):
    """The Makefile's view of a fresh clone: VENV in an empty directory."""
    return {"VENV": str(tmp_path / "venv")}


def test_make_demo_installs_only_the_demo_and_never_torch(no_venv):
    r = make_dry_run("demo", **no_venv)
    assert r.returncode == 0, r.stderr
    installs = [line for line in r.stdout.splitlines() if "-m pip install" in line]
    assert installs and all("torch" not in line and " -q" not in line for line in installs)
    assert all("--progress-bar on" in line for line in installs)
    assert any('".[mxnet,paddle,demo]"' in line for line in installs)
    assert not any("test]" in line for line in installs)
    assert "docs/demo.png" not in r.stdout  # the tracked figure is not rewritten


def test_make_test_installs_no_torch_and_runs_two_workers(no_venv):
    r = make_dry_run("test", **no_venv)
    assert r.returncode == 0, r.stderr
    installs = [line for line in r.stdout.splitlines() if "-m pip install" in line]
    assert any("test]" in line for line in installs) and not any("torch" in i for i in installs)
    runs = [line for line in r.stdout.splitlines() if "-m pytest" in line]
    assert runs and "-n 2 --dist loadfile" in runs[-1], runs  # pytest-xdist, from "test"
    assert "pytest-xdist" in extras()["test"]


def test_make_without_python311_says_so_in_one_line(no_venv):
    r = subprocess.run(["make", "-C", str(ROOT), "demo", "PYTHON=", *[f"{k}={v}" for k, v in
                                                                       no_venv.items()]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    ours = [line for line in r.stderr.splitlines()  # make's own "*** Error" lines aside
            if not re.match(r"make(\[\d+\])?: (\*\*\*|Entering|Leaving)", line)]
    assert len(ours) == 1 and "Python 3.11 not found" in ours[0], r.stderr
    assert not Path(no_venv["VENV"]).exists()  # nothing half-made


def test_find_python_names_a_matching_interpreter_or_nothing():
    script = str(ROOT / "tools" / "find_python")
    r = subprocess.run([script, "2.1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    import sys
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    r = subprocess.run([script, mine], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:  # found (it may not be on PATH in an unusual environment)
        found = subprocess.run([r.stdout.strip(), "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=60).stdout.strip()
        assert found == str(tuple(sys.version_info[:2]))


def test_license_changelog_and_an_untracked_figure_path():
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "CHANGELOG.md").exists()
    assert "out/" in (ROOT / ".gitignore").read_text().split()


def test_every_make_install_shows_progress(no_venv):
    """No -q: a 100 s install with no output looks hung."""
    for target in ("demo", "test", "docs", "test-paddle3"):
        r = make_dry_run(target, **no_venv, VENV3=no_venv["VENV"] + "3",
                         VENV313=no_venv["VENV"] + "313", PYTHON313="python3.13")
        assert r.returncode == 0, r.stderr
        installs = [line for line in r.stdout.splitlines() if "-m pip install" in line]
        assert installs, target
        for line in installs:
            assert " -q" not in line and "--progress-bar on" in line, (target, line)


def test_make_with_a_wrong_python_names_the_way_out_not_the_same_step(no_venv, tmp_path):
    """make PYTHON=<not 3.11> once said "rm -rf .venv and run again", which repeats the same
    message: now it says which PYTHON= to pass, and where Paddle alone runs."""
    import sys
    if sys.version_info[:2] == (3, 11):
        wrong = subprocess.run([str(ROOT / "tools" / "find_python"), "3.12"],
                               capture_output=True, text=True).stdout.strip() or \
            subprocess.run([str(ROOT / "tools" / "find_python"), "3.13"],
                           capture_output=True, text=True).stdout.strip()
        if not wrong:
            pytest.skip("no Python other than 3.11 on this machine to pass as PYTHON=")
    else:
        wrong = sys.executable
    r = subprocess.run(["make", "-C", str(ROOT), "demo", f"PYTHON={wrong}",
                        *[f"{k}={v}" for k, v in no_venv.items()]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "PYTHON=/path/to/python3.11" in r.stderr and "tools/find_python 3.11" in r.stderr
    assert "run again" not in r.stderr and "[paddle3,demo]" in r.stderr
    assert not Path(no_venv["VENV"]).exists()  # nothing half-made


def test_the_version_lives_in_one_place():
    """amp_adapters/_version.py (the package's face and the CLI import it); setup.cfg reads
    it (attr:), nothing else spells it."""
    import amp_adapters
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["metadata"]["version"] == "attr: amp_adapters._version.__version__"
    assert amp_adapters.__version__ == "0.2.0"
    assert f"\n## {amp_adapters.__version__}\n" in (ROOT / "CHANGELOG.md").read_text()
    for path in [ROOT / "pyproject.toml", ROOT / "Makefile", ROOT / "mkdocs.yml"]:
        assert amp_adapters.__version__ not in path.read_text(), path


def test_package_metadata_is_complete():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    meta = cfg["metadata"]
    classifiers = meta["classifiers"]
    for python in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {python}" in classifiers
    assert "Development Status ::" in classifiers and "Typing :: Typed" in classifiers
    assert cfg["options"]["python_requires"] == ">=3.11"
    assert meta["long_description"] == "file: README.md" and meta["license"] == "Apache-2.0"
    assert meta["long_description_content_type"] == "text/markdown"
