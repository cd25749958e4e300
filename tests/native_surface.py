"""The public names of a native module, for the drop-in conformance tests.

Public: no leading underscore, and either listed in ``__all__``, or a
submodule of the native package, or a function/class defined in the native
package, or plain data (the list constants users read). What a module merely
imports from elsewhere (``np``, ``logging``, ``core``...) is not its surface.
"""
import importlib
import inspect
import types


def public_names(module_name: str, package: str) -> dict[str, str]:
    """{name: kind} for ``module_name``; kind is module, callable or the data's type name."""
    mod = importlib.import_module(module_name)
    listed = set(getattr(mod, "__all__", None) or ())
    out = {}
    for name, value in vars(mod).items():
        if name.startswith("_"):
            continue
        if isinstance(value, types.ModuleType):
            if value.__name__.startswith(package + "."):
                out[name] = "module"
        elif inspect.isclass(value) or callable(value):
            if name in listed or (getattr(value, "__module__", "") or "").startswith(package):
                out[name] = "callable"
        elif name in listed or isinstance(value, (list, dict, set, frozenset, tuple)):
            out[name] = type(value).__name__
    return out


def missing(native_module: str, native_package: str, ours_module: str) -> list[str]:
    """Native public names that ``ours_module`` lacks, or has as another kind of thing."""
    ours = importlib.import_module(ours_module)
    gaps = []
    for name, kind in sorted(public_names(native_module, native_package).items()):
        if not hasattr(ours, name):
            gaps.append(f"{ours_module}.{name} (missing)")
            continue
        value = getattr(ours, name)
        if kind == "module" and not isinstance(value, types.ModuleType):
            gaps.append(f"{ours_module}.{name} (not a module)")
        elif kind == "callable" and not callable(value):
            gaps.append(f"{ours_module}.{name} (not callable)")
        elif kind not in ("module", "callable") and isinstance(value, types.ModuleType):
            gaps.append(f"{ours_module}.{name} (a module, natively {kind})")
    return gaps


def signature_gaps(native_module: str, native_package: str, ours_module: str) -> list[str]:
    """Native public functions whose parameters ours does not take in the same order, by the
    same names (a positional call would bind differently). Ours may add keyword parameters
    after the native's; a stub that takes ``*args`` (an unsupported internal) is not held
    to a signature."""
    ours = importlib.import_module(ours_module)
    native = importlib.import_module(native_module)
    gaps = []
    for name, kind in sorted(public_names(native_module, native_package).items()):
        theirs, mine = getattr(native, name), getattr(ours, name, None)
        if kind != "callable" or not inspect.isfunction(theirs) or mine is None:
            continue
        try:
            want, got = _params(theirs), _params(mine)
        except (TypeError, ValueError):
            continue
        if "*" not in got and got[:len(want)] != want:
            gaps.append(f"{ours_module}.{name}{tuple(got)}: natively {tuple(want)}")
    return gaps


def method_gaps(native_cls: type, ours_cls: type) -> list[str]:
    """``signature_gaps`` for the public methods of a native class and ours (the decorated
    optimizer users call ``amp_init``/``minimize`` on)."""
    gaps = []
    for name in sorted(n for n in vars(native_cls) if not n.startswith("_")):
        theirs, mine = getattr(native_cls, name), getattr(ours_cls, name, None)
        if not inspect.isfunction(theirs):
            continue
        if mine is None:
            gaps.append(f"{ours_cls.__name__}.{name}: missing")
            continue
        want, got = _params(theirs), _params(mine)
        if "*" not in got and got[:len(want)] != want:
            gaps.append(f"{ours_cls.__name__}.{name}{tuple(got)}: natively {tuple(want)}")
    return gaps


def _params(fn) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = inspect.signature(fn).parameters.values()
    return [p.name if p.kind in kinds else "*" for p in params
            if p.kind in kinds or p.kind == inspect.Parameter.VAR_POSITIONAL]
