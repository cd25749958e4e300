"""Layer paths in static programs: which layer of the model made a parameter.

A static program keeps no trace of the ``paddle.nn.Layer`` tree it was built from: its
ops carry neither the layer's path (legacy name scopes are process-wide counters, PIR
has none, and PIR's ``struct_name`` holds class names only), and its parameter names come
from a counter (``linear_2.w_0`` the first time, ``linear_6.w_0`` when the same model is
built again in the process). What ties an op to its layer is the parameters it reads.
So, once paddle_amp is imported, ``Layer.__call__`` in static mode notes, when the
outermost layer being called returns (the model: every parameter exists by then, lazily
built ones too), the path of the layer that owns each parameter: the child names
(``Layer.named_children``) from that root, ``2`` or ``encoder.layers.3.ffn``, the paths
``Layer.named_sublayers`` gives (``amp_adapters.rules.layers.layer_paths``: depth first, a
shared layer keeps its first path). An op reading ``linear_2.w_0`` then has ``2`` among
its instance names.

The paths are kept per program (the default main program while the model was called),
never by parameter name alone: two programs built under ``unique_name.guard()`` both
have a ``linear_0.w_0``, owned by different layers. A copy of a program
(``Program.clone``, both IRs: an eval program cloned for test, the doctor's replay) gets
its source's paths (``note_copy``; ``watch_clones`` wraps ``clone``). Without a Layer tree
(``paddle.static.nn.fc``,
``create_parameter``) there is no path: an op is named by its parameters, output
variables and name scope, as before. In dynamic mode the wrapper only calls through.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable, Optional

import paddle

from amp_adapters.rules.layers import layer_paths

_by_program: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()


class _Calling(threading.local):
    depth: int = 0  # the Layer calls open in static mode on this thread


_calling = _Calling()


def note_model(root: Any, program: Any = None) -> dict[str, str]:
    """Note the path of the layer owning each parameter of ``root`` (a ``paddle.nn.Layer``)
    for ``program`` (default: the default main program); returns {parameter name: path}.
    A parameter of ``root`` itself has no path and is not noted."""
    found: dict[str, str] = {}
    paths = layer_paths(root, lambda layer: layer.named_children())
    for layer in root.sublayers():
        path = paths.get(id(layer))
        if not path:
            continue
        for p in layer.parameters(include_sublayers=False):
            name = getattr(p, "name", None)
            if isinstance(name, str) and name:
                found.setdefault(name, path)
    if found:
        program = program if program is not None else paddle.static.default_main_program()
        _by_program.setdefault(program, {}).update(found)
    return found


def note_copy(source: Any, copy: Any) -> None:
    """``copy`` (a clone of ``source``: its parameters keep their names) has ``source``'s
    paths."""
    found = _by_program.get(source)
    if found:
        _by_program.setdefault(copy, {}).update(found)


def paths_of(program: Any, names: Iterable[str]) -> tuple[str, ...]:
    """The layer paths of those of ``names`` that are parameters a model noted in
    ``program`` (or in the program it is a copy of) owns, each once, in order."""
    own = _by_program.get(program) if program is not None else None
    out: list[str] = []
    for n in names:
        path = (own or {}).get(n)
        if path and path not in out:
            out.append(path)
    return tuple(out)


def path_of(program: Any, param: str) -> Optional[str]:
    """The layer path of parameter ``param`` in ``program``, or None."""
    found = paths_of(program, (param,))
    return found[0] if found else None


def watch_layers() -> None:
    """Wrap ``paddle.nn.Layer.__call__`` (once, when paddle_amp is imported): in static mode
    the outermost call notes its model's paths (``note_model``) when it returns; in dynamic
    mode it calls straight through."""
    layer = paddle.nn.Layer
    native = layer.__call__
    if getattr(native, "_paddle_amp_paths", False):
        return

    def __call__(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        if paddle.in_dynamic_mode():
            return native(self, *inputs, **kwargs)
        _calling.depth += 1
        try:
            out = native(self, *inputs, **kwargs)
        finally:
            _calling.depth -= 1
        if _calling.depth == 0:
            note_model(self)
        return out

    __call__.__doc__ = native.__doc__
    __call__.__wrapped__ = native  # type: ignore[attr-defined]
    __call__._paddle_amp_paths = True  # type: ignore[attr-defined]
    layer.__call__ = __call__


def watch_clones() -> None:
    """Wrap ``clone`` of the program classes of both IRs (once, when paddle_amp is
    imported): a clone has its source's layer paths (``note_copy``)."""
    from .ir import program_types
    for cls in dict.fromkeys(program_types()):
        native = getattr(cls, "clone", None)  # Paddle 2.6's PIR program has none
        if native is None or getattr(native, "_paddle_amp_paths", False):
            continue

        def clone(self: Any, *args: Any, _native: Any = native, **kwargs: Any) -> Any:
            copy = _native(self, *args, **kwargs)
            note_copy(self, copy)
            return copy

        clone.__doc__ = native.__doc__
        clone.__wrapped__ = native  # type: ignore[attr-defined]
        clone._paddle_amp_paths = True  # type: ignore[attr-defined]
        cls.clone = clone


watch_layers()
watch_clones()
