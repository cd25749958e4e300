"""Blocks whose graph was traced before ``init`` or under it: what ``init``/``reset`` do to them.

A hybridized block caches the graph it traced on its first forward (with the
ops ``init`` patched, or without). Patching later changes nothing in that
graph, so:

- ``reset()`` clears the cache of every block whose traced graph contains AMP
  casts: its next forward traces again, in float32 (``restore_float32``);
- ``init()`` remembers the graph of every block traced before it, so
  ``cast_report`` describes what actually runs (``traced_without_amp``), and
  the first forward of such a block after ``init``, still on that float32
  graph, warns once naming it (``block.hybridize()`` again re-traces it).

The warning is decided by use, not by existence: ``init`` finds the blocks
traced before it with ``gc.get_objects()``, which also returns blocks that are
dead but not yet collected (the demo's fp32 network, say), so ``init`` only
remembers them (weakly) and a block warns when it is called again. ``init``
wraps ``HybridBlock._build_cache`` to record the blocks traced under it, which
is all ``reset`` looks at, and ``HybridBlock._call_cached_op`` for that
warning (a dict lookup per forward, nothing once no block traced before
``init`` is alive). ``SymbolBlock``s (e.g. from ``convert_hybrid_block``) are
left alone: their graph is their definition. No host sync.
"""
from __future__ import annotations

import gc
import json
import warnings
import weakref
from typing import Any

import mxnet as mx
from mxnet.gluon import HybridBlock, SymbolBlock

_CASTS = ("amp_cast", "amp_multicast")


def block_graph(block: Any) -> tuple[list, mx.sym.Symbol]:
    """The (inputs, symbol) a hybridized block traced, or a clear error."""
    if not isinstance(block, HybridBlock):
        raise TypeError(f"expected a gluon HybridBlock, got {type(block).__name__}")
    if not block._cached_graph:
        raise RuntimeError("the block has no traced graph yet: call block.hybridize() and run "
                           "one forward pass first")
    return block._cached_graph


# block -> the cached graph it had when init found it (traced without AMP)
_before_init: "weakref.WeakKeyDictionary[HybridBlock, Any]" = weakref.WeakKeyDictionary()
_warned: "weakref.WeakSet[HybridBlock]" = weakref.WeakSet()
_under_amp: "weakref.WeakSet[HybridBlock]" = weakref.WeakSet()  # traced while init was on
# block -> {input variable: shape} of the arrays it was traced with under init (what measured
# speed planned at; ``cast_report`` plans again at the same shape classes)
traced_shapes: "weakref.WeakKeyDictionary[HybridBlock, dict]" = weakref.WeakKeyDictionary()


def traced_blocks() -> list[HybridBlock]:
    """Every live hybridized block with a cached (traced) graph, except SymbolBlocks."""
    wanted: dict[type, bool] = {}  # per type, not per object: ~30 ms for 150k objects
    out = []
    for o in gc.get_objects():
        t = type(o)
        ok = wanted.get(t)
        if ok is None:
            ok = wanted[t] = issubclass(t, HybridBlock) and not issubclass(t, SymbolBlock)
        if ok and o._cached_graph:
            out.append(o)
    return out


def has_amp_casts(block: HybridBlock) -> bool:
    """Whether the block's cached graph has the casts ``init``'s wrappers insert."""
    nodes = json.loads(block._cached_graph[1].tojson(remove_amp_cast=False))["nodes"]
    return any(n.get("op") in _CASTS for n in nodes)


def remember_traced_before_init() -> None:
    """Remember the (float32) graph of every block traced before ``init``. Nothing is said
    here: a block found by the scan may be garbage not yet collected; it warns when it
    is run on that graph after ``init`` (``record_tracing``)."""
    for block in traced_blocks():
        if not has_amp_casts(block):
            _before_init[block] = block._cached_graph


def _warn_if_stale(block: HybridBlock) -> None:
    """Warn once per block that runs, after ``init``, the graph it traced before it."""
    if block in _warned or not traced_without_amp(block):
        return
    _warned.add(block)
    warnings.warn(
        f"mxnet_amp: block {block.name!r} ({type(block).__name__}) was hybridized and run "
        f"before mxnet_amp.init(), so its cached graph runs without AMP (float32); call "
        f"{block.name}.hybridize() again (or build the model after init) to apply the "
        f"policy", stacklevel=4)


def traced_without_amp(block: HybridBlock) -> bool:
    """True if ``block`` still runs a graph traced before ``init`` (no AMP casts)."""
    graph = _before_init.get(block)
    return graph is not None and block._cached_graph is graph


def record_tracing() -> list[tuple[Any, str, Any]]:
    """Wrap ``HybridBlock._build_cache`` (where a block traces its graph) to remember each
    block traced from now on, and ``HybridBlock._call_cached_op`` (every hybridized
    forward) to warn about a block still on a graph traced before ``init``; returns the
    patches as (class, attribute, original) for ``reset`` to undo. Costs one WeakSet
    insert per trace, and per forward a dict lookup while a block traced before ``init``
    is alive."""
    original_build = HybridBlock._build_cache
    original_call = HybridBlock._call_cached_op

    def _build_cache(block: HybridBlock, *args: Any) -> Any:
        _under_amp.add(block)
        return original_build(block, *args)

    def _call_cached_op(block: HybridBlock, *args: Any) -> Any:
        if _before_init:
            _warn_if_stale(block)
        return original_call(block, *args)

    HybridBlock._build_cache = _build_cache
    HybridBlock._call_cached_op = _call_cached_op
    return [(HybridBlock, "_build_cache", original_build),
            (HybridBlock, "_call_cached_op", original_call)]


def restore_float32() -> list[str]:
    """Clear the cache of every block traced under ``init`` whose graph has AMP casts; its
    next forward traces in float32. Returns their names."""
    cleared = []
    for block in list(_under_amp):
        if block._cached_graph and not isinstance(block, SymbolBlock) and \
                has_amp_casts(block):
            block._clear_cached_op()
            cleared.append(block.name)
    _under_amp.clear()
    _before_init.clear()
    traced_shapes.clear()
    return cleared
