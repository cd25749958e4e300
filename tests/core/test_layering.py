"""The house's dependency rules, read from the source and checked in a fresh interpreter.

- ``amp_adapters`` (the core) imports the standard library, numpy and itself:
  no framework, no backend, not the demo, not even lazily (no computed import).
- ``mxnet_amp`` never imports Paddle and ``paddle_amp`` never imports MXNet.
- ``amp_demo`` is the only package that imports both backends, and only its framework
  trainers do (MXNet's, Paddle's static and Paddle's dygraph).
- No import cycle between modules at import time.
- The core has two floors: the policy kernel (``RULES``) and its services (``SERVICES``).
  Every core module is on one of them, and no kernel module imports a service, not even
  lazily inside a function: the kernel decides, the services measure, keep and tell.
"""
import ast
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("amp_adapters", "mxnet_amp", "paddle_amp", "amp_demo")
FRAMEWORKS = {"mxnet": "mxnet", "paddle": "paddle"}
BACKENDS = {"mxnet": "mxnet_amp", "paddle": "paddle_amp"}
OUTSIDE_THE_CORE = {"mxnet", "paddle", "mxnet_amp", "paddle_amp", "amp_demo", "torch"}

# the core's floors, by module (a package counts with everything in it)
RULES = (  # the policy kernel: it decides
    "amp_adapters.rules.policy",
    "amp_adapters.rules.policyfile",
    "amp_adapters.rules.oplists",
    "amp_adapters.rules.planner",
    "amp_adapters.rules.device",
    "amp_adapters.rules.isa",
    "amp_adapters.rules.dtypes",
    "amp_adapters.rules.errors",
    "amp_adapters.rules.configcheck",
    "amp_adapters.rules.toml_duplicates",
    "amp_adapters.rules.params",
    "amp_adapters.rules.recompute",
    "amp_adapters.rules.layers",
    "amp_adapters.rules.scaler",
    "amp_adapters.rules.loss_scale",
)
SERVICES = (  # its services: they measure, keep and tell
    "amp_adapters.services.speedbook",
    "amp_adapters.services.speed_source",  # the speed source a runtime supplies
    "amp_adapters.services.measure_process",
    "amp_adapters.services.timing",
    "amp_adapters.services.memory",
    "amp_adapters.services.batch_fit",
    "amp_adapters.services.native_speed",
    "amp_adapters.services.speed_report",
    "amp_adapters.services.report",
    "amp_adapters.services.native_diff",
    "amp_adapters.services.checkpoint",
    "amp_adapters.services.cli",
    "amp_adapters.services.doctor",
    "amp_adapters.services.quiet",
    "amp_adapters.services.fallback",
    "amp_adapters.services.device_book",  # a backend's kernel answers, asked in its child
)
BESIDE = ("amp_adapters._version",)  # the version string: imports nothing, read by all


def modules(package: str) -> dict[str, Path]:
    """{dotted module name: path} of every module of ``package``."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(absolute module name, line, at import time) for every import in ``path``.

    Relative imports are resolved; ``from pkg import name`` also counts
    ``pkg.name`` (a submodule, when it is one); ``importlib.import_module`` /
    ``__import__`` with a literal count as imports, with anything else as
    ``<computed>``. "At import time" is False inside a function body.
    """
    tree = ast.parse(path.read_text("utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node, top_level):
        for child in ast.iter_child_nodes(node):
            inner = top_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, top_level) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                found.append((base, child.lineno, top_level))
                found.extend((f"{base}.{a.name}", child.lineno, top_level) for a in child.names)
            elif isinstance(child, ast.Call):
                fn = child.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if name in ("import_module", "__import__"):
                    arg = child.args[0] if child.args else None
                    literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                    found.append((arg.value if literal else "<computed>", child.lineno,
                                  top_level))
            visit(child, inner)

    visit(tree, True)
    return found


def top(name: str) -> str:
    return name.split(".")[0]


def test_the_core_imports_only_the_standard_library_numpy_and_itself():
    allowed = set(sys.stdlib_module_names) | {"numpy", "amp_adapters", "__future__"}
    bad = [f"{module}:{line} imports {name}"
           for module, path in modules("amp_adapters").items()
           for name, line, _ in imports(module, path) if top(name) not in allowed]
    assert bad == []


def test_the_scan_sees_what_the_old_core_did():
    """The scanner is not blind: the demo module the core used to hold is caught."""
    old = ('import importlib\nfrom . import demo\n'
           'def train(framework):\n'
           '    return importlib.import_module(f"{framework}_amp.demo")\n'
           'def plot():\n    import mxnet_amp.demo\n')
    path = ROOT / "amp_adapters" / "__scan_probe__.py"
    try:
        path.write_text(old)
        found = {(name, top_level) for name, _, top_level in
                 imports("amp_adapters.__scan_probe__", path)}
    finally:
        path.unlink()
    assert {("amp_adapters.demo", True), ("<computed>", False), ("mxnet_amp.demo", False)} \
        <= found


# each floor is a package with its own file map, once the modules stand in it
FLOOR_PACKAGES = tuple(sorted({m.rpartition(".")[0].replace(".", "/") for m in RULES + SERVICES}
                              - {"amp_adapters"}))
MAPPED = PACKAGES + FLOOR_PACKAGES


def floor(module: str):
    """"rules" or "services" for a core module (None: on no floor)."""
    for name, members in (("rules", RULES), ("services", SERVICES)):
        if any(module == m or module.startswith(m + ".") for m in members):
            return name
    return None


def kernel_imports_of_services(found: dict[str, Path]) -> list[str]:
    return [f"{module}:{line} imports {name}{'' if top_level else ' (inside a function)'}"
            for module, path in found.items() if floor(module) == "rules"
            for name, line, top_level in imports(module, path)
            if floor(name) == "services" or name == "<computed>"]


def test_every_core_module_is_on_one_floor():
    """A new core module says where it belongs: the kernel (it decides) or a service."""
    core = [m for m in modules("amp_adapters") if m not in ("amp_adapters",) + BESIDE and not any(
        listed.startswith(m + ".") for listed in RULES + SERVICES)]  # not a floor's package
    assert [m for m in core if floor(m) is None] == [], \
        "tests/core/test_layering.py: put these core modules in RULES or SERVICES"
    assert not set(RULES) & set(SERVICES)


def test_the_kernel_imports_no_service_not_even_lazily():
    assert kernel_imports_of_services(modules("amp_adapters")) == []


def test_the_floor_scan_sees_a_lazy_import_of_a_service():
    """The scanner is not blind: a kernel module reaching the speed book inside a function
    (as a device truth read there would) is caught, by relative and by absolute name."""
    probe = ROOT / "amp_adapters" / "__floor_probe__.py"
    package, target = RULES[0].split(".")[:-1], SERVICES[0].split(".")
    common = next(i for i, (a, b) in enumerate(zip(package + [""], target)) if a != b)
    relative = "." * (len(package) - common + 1) + ".".join(target[common:])
    try:  # "from .speedbook import machine", wherever the floors put the two
        probe.write_text(f"def machine():\n    from {relative} import machine\n"
                         f"    import {SERVICES[0]}\n    return machine()\n")
        found = {RULES[0]: probe}
        bad = kernel_imports_of_services(found)
    finally:
        probe.unlink()
    assert {int(b.split(":")[1].split()[0]) for b in bad} == {2, 3}, bad  # both lines
    assert all("(inside a function)" in b for b in bad), bad


@pytest.mark.parametrize("framework, other", [("mxnet", "paddle"), ("paddle", "mxnet")])
def test_a_backend_never_imports_the_other_framework_or_the_demo(framework, other):
    forbidden = {FRAMEWORKS[other], BACKENDS[other], "amp_demo"}
    bad = [f"{module}:{line} imports {name}"
           for module, path in modules(BACKENDS[framework]).items()
           for name, line, _ in imports(module, path)
           if top(name) in forbidden or name == "<computed>"]
    assert bad == []


def test_the_demo_is_the_only_package_that_imports_both_backends():
    def reached(package):
        return {top(name) for module, path in modules(package).items()
                for name, _, _ in imports(module, path)}

    both = {p for p in PACKAGES if {"mxnet_amp", "paddle_amp"} <= reached(p)}
    assert both == {"amp_demo"}
    for module, path in modules("amp_demo").items():  # and in it, one trainer each
        names = {top(name) for name, _, _ in imports(module, path)}
        for fw in ("mxnet", "paddle"):
            if names & {FRAMEWORKS[fw], BACKENDS[fw]}:  # Paddle's: static and dygraph
                assert module in (f"amp_demo.{fw}_trainer", f"amp_demo.{fw}_dygraph_trainer"), \
                    module


def import_cycles(packages, lazy: bool = False) -> list[str]:
    """The import cycles among the modules of ``packages``: at import time, or (``lazy``)
    counting the imports inside functions too (a loop tied by a lazy import is still one)."""
    graph = {}
    known = {m for p in packages for m in modules(p)}
    for package in packages:
        for module, path in modules(package).items():
            deps = set()
            for name, _, top_level in imports(module, path):
                if not (top_level or lazy) or name == "<computed>":
                    continue
                # importing a.b.c runs a, a.b and a.b.c; a package's own submodules importing
                # the package itself are what Python resolves, not a cycle.
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    dep = ".".join(parts[:i])
                    if dep in known and dep != module and not module.startswith(dep + "."):
                        deps.add(dep)
            graph[module] = deps
    state, cycles = {}, []

    def walk(node, stack):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                walk(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return cycles


def test_no_import_cycle_at_import_time():
    assert import_cycles(PACKAGES) == []


def test_no_import_cycle_in_the_library_even_lazily():
    """A lazy import does not untie a loop: the core and the backends form none (the demo,
    a command above the library, is not held to it here)."""
    assert import_cycles(("amp_adapters", "mxnet_amp", "paddle_amp"), lazy=True) == []


def test_the_kernel_tables_read_the_device_from_the_kernel():
    """Which ops run low is a decision: each runtime's kernel table (``kernels.py``) reads
    the device truth (``rules.isa.machine``) from the policy kernel, not from the speed book
    (a service: measured speed kept)."""
    bad = [f"{module}:{line} imports {name}"
           for package in ("mxnet_amp", "paddle_amp")
           for module, path in modules(package).items() if module.endswith(".kernels")
           for name, line, _ in imports(module, path)
           if name.startswith("amp_adapters.services.speedbook")]
    assert bad == []


def test_no_floor_imports_the_package_face():
    """``amp_adapters/__init__.py`` stands above both floors (it re-exports them): a module
    on a floor taking a name from it is an arrow back up (the version is ``_version``)."""
    bad = [f"{module}:{line} imports {name}"
           for module, path in modules("amp_adapters").items() if floor(module)
           for name, line, _ in imports(module, path) if name == "amp_adapters"]
    assert bad == []


PROBE = r"""
import contextlib, importlib, io, pkgutil, sys
import amp_adapters
for info in pkgutil.walk_packages(amp_adapters.__path__, "amp_adapters."):
    importlib.import_module(info.name)
from amp_adapters.services import cli
import amp_demo.command
runs = [["lists", "--framework", "mxnet"], ["lists", "--framework", "paddle"],
        ["explain", "softmax", "--framework", "paddle"], ["demo", "--help"]]
if "--numpy-demo" in sys.argv:
    runs.append(["demo", "--framework", "numpy", "--steps", "3"])
for argv in runs:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(argv, commands={"demo": amp_demo.command.register})
        except SystemExit:
            pass
cli.build_parser()  # and whatever the installed entry points load
print(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1].split(","))))
"""


def test_at_run_time_the_core_and_the_demo_command_load_no_backend():
    """Every core module, the CLI's lists/explain, ``demo --help`` and the numpy demo, in a
    fresh interpreter: neither framework nor backend ends up in ``sys.modules``."""
    try:
        import sklearn  # noqa: F401
        extra = ["--numpy-demo"]
    except ImportError:
        extra = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    r = subprocess.run([sys.executable, "-c", PROBE, ",".join(sorted(OUTSIDE_THE_CORE -
                                                                     {"amp_demo"})), *extra],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def file_map(text: str) -> dict[str, set[str]]:
    """{package: names} from a Layout block: a line at column 0 opens a package ("pkg/"),
    indented lines name its files (``x.py``) and sub-packages (``oplists/``)."""
    out, package = {}, None
    for line in text.splitlines():
        if line[:1].strip():
            package = line.split()[0].rstrip("/")
            out.setdefault(package, set())
        elif package and line.strip():
            out[package].update(named_files(line))
    return out


def named_files(text: str) -> set[str]:
    """``x.py`` and ``dir/`` (a word, a slash, then a space) named in ``text``."""
    return {py or f"{d}/" for py, d in re.findall(r"(\w+\.py)\b|(\w+)/(?=\s|$)", text, re.M)}


def module_files(package: str) -> set[str]:
    names = {p.name for p in (ROOT / package).glob("*.py")} - {"__init__.py", "__main__.py"}
    return names | {p.parent.name + "/" for p in (ROOT / package).glob("*/__init__.py")}


def test_the_readme_layout_names_every_file_of_the_packages():
    """A file added, renamed or removed needs its line in the Layout block of docs/design.md
    (moved there from the README)."""
    readme = (ROOT / "docs" / "design.md").read_text("utf-8")
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    layout = file_map(block)
    for package in MAPPED:
        named, actual = layout.get(package, set()), module_files(package)
        assert sorted(actual - named) == [], \
            f"docs/design.md ## Layout: add a line for these files of {package}/"
        assert sorted(named - actual) == [], \
            f"docs/design.md ## Layout names files that {package}/ does not have"


@pytest.mark.parametrize("package", MAPPED)
def test_each_package_docstring_states_its_file_map(package):
    """The same, for the ``Files:`` section of each package's docstring."""
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text("utf-8")))
    assert "Files:" in doc, f"{package}/__init__.py docstring: add a 'Files:' section"
    named, actual = named_files(doc.split("Files:", 1)[1]), module_files(package)
    assert sorted(actual - named) == [], \
        f"{package}/__init__.py docstring 'Files:': add a line for these files"
    assert sorted(named - actual) == [], \
        f"{package}/__init__.py docstring 'Files:' names files the package does not have"
