"""The path of the Layer running now, in eager mode: what a policy's layer rules
(``Policy.layers`` / ``Policy.paddle_layers``) match a wrapped op by.

A path is the model's own structure, the child names from the model called (the outermost
``Layer`` call) down to the layer whose ``forward`` runs the op: ``2``, ``encoder.layers.3.ffn``,
the paths ``Layer.named_sublayers`` gives and the static runtime names a layer by
(``paddle_amp.layer_paths``, ``amp_adapters.rules.layers.layer_paths``: depth first, a shared layer
keeps its first path). The model's own ``forward`` has no path (its root).

``Layer.__call__`` is wrapped only while a region whose policy has layer rules is open
(``dispatch.push`` counts them): a region without them pays nothing per layer call. A
layer not under the model called (a layer called from a function) keeps its caller's path.

A region opened inside a Layer's ``forward`` (the model was called before the region
wrapped ``Layer.__call__``) finds the Layer calls already running on the Python stack
(``adopt``): the outermost is the model called, and the paths inside the region count from
it, as they would had the region been opened around the model's call.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

from amp_adapters.rules.layers import layer_paths


class _Calls(threading.local):
    """The Layer calls open in this thread: (root, {id(layer): path}) and the paths."""

    def __init__(self) -> None:
        self.root: Optional[tuple] = None
        self.paths: list = []


_calls = _Calls()
_trees: "weakref.WeakKeyDictionary[Any, tuple[tuple, dict[int, str]]]" = \
    weakref.WeakKeyDictionary()
_native: list = []  # Layer.__call__ as it was when the wrapper went in
_over_ours: list = []  # patches of Layer.__call__ found over ours at leave() (they call it)
_open = [0]  # regions with layer rules open, in all threads
_lock = threading.Lock()


def current() -> Optional[str]:
    """The path of the innermost Layer running now in this thread (None: no layer under a
    model, or the model's own forward)."""
    paths = _calls.paths
    return paths[-1] if paths else None


def _tree(root: Any) -> dict[int, str]:
    """{id(layer): path} under ``root``, kept until its layers change (a layer added, or
    one replaced by another: keyed on the sublayers' ids, not their count)."""
    ids = tuple(id(layer) for layer in root.sublayers())
    kept = _trees.get(root)
    if kept is None or kept[0] != ids:
        kept = (ids, layer_paths(root, lambda layer: layer.named_children()))
        _trees[root] = kept
    return kept[1]


def _call(layer: Any, *inputs: Any, **kwargs: Any) -> Any:
    native = _native[0]
    calls = _calls
    outermost = calls.root is None
    if outermost:
        calls.root = (layer, _tree(layer))
    tree = calls.root[1]
    path = tree.get(id(layer))
    calls.paths.append(path or (calls.paths[-1] if calls.paths else None))
    try:
        return native(layer, *inputs, **kwargs)
    finally:
        calls.paths.pop()
        if outermost:
            calls.root = None


def enter() -> None:
    """A region with layer rules opens: wrap ``Layer.__call__`` (the first one)."""
    import paddle
    with _lock:
        if not _open[0]:
            current_call = paddle.nn.Layer.__call__
            if current_call is not _call and current_call not in _over_ours:
                _native[:] = [current_call]  # (a patch made over ours calls ours: it stays)
                paddle.nn.Layer.__call__ = _call
        _open[0] += 1


def leave() -> None:
    """A region with layer rules closes: the last one out puts ``Layer.__call__`` back (only
    our own wrapper: a patch another tool made since stays)."""
    import paddle
    with _lock:
        _open[0] -= 1
        if not _open[0] and paddle.nn.Layer.__call__ is _call:
            paddle.nn.Layer.__call__ = _native[0]
        elif not _open[0] and paddle.nn.Layer.__call__ is not _native[0]:
            _over_ours.append(paddle.nn.Layer.__call__)  # made over ours: never our native


def _running_calls() -> list:
    """The Layers whose call is running in this thread now, outermost first: the frames of
    Paddle's own ``Layer.__call__`` on the Python stack (by its file and name: whatever
    wrappers a tool put over it, every call of a Layer runs it)."""
    import sys
    from paddle.nn.layer import layers
    where = layers.__file__
    found = []
    f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code.co_name == "__call__" and code.co_filename == where:
            layer = f.f_locals.get("self")
            if layer is not None and (not found or found[-1] is not layer):
                found.append(layer)
        f = f.f_back
    return found[::-1]


def adopt() -> Optional[tuple]:
    """A region with layer rules opens while no Layer call is tracked in this thread: the
    Layer calls running (``_running_calls``, a region opened inside a ``forward``) become
    the tracked ones, the outermost as the model called, each with its path, as ``_call``
    would have tracked them. Returns what ``release`` puts back (None: nothing running, or a
    call tracked already)."""
    calls = _calls
    if calls.root is not None:
        return None
    running = _running_calls()
    if not running:
        return None
    saved = (calls, calls.root, calls.paths)
    tree = _tree(running[0])
    paths: list = []
    for layer in running:
        paths.append(tree.get(id(layer)) or (paths[-1] if paths else None))
    calls.root, calls.paths = (running[0], tree), paths
    return saved


def release(saved: Optional[tuple]) -> None:
    """Put back what ``adopt`` replaced (None: nothing)."""
    if saved is not None:
        calls, calls.root, calls.paths = saved


class detached:
    """A model called afresh inside another Layer's call (the doctor examines the model
    from a hook of the loss): its paths count from it, not from the call running now."""

    def __enter__(self) -> None:
        self._saved = (_calls.root, _calls.paths)
        _calls.root, _calls.paths = None, []

    def __exit__(self, *exc: Any) -> None:
        _calls.root, _calls.paths = self._saved
