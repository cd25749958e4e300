"""``paddle.jit.to_static`` under our regions: which program a call runs, and a legacy trace
made inside a region.

A region's decisions are built into the program traced under it (a PIR program through the
wrapped entry points, a legacy one by ``legacy.rewrite``). Paddle caches a traced program
by its inputs (``CacheKey``: the function, the input specs, the layer, training or not),
not by AMP state (3.3.1 neither; Paddle 2.6's own ``auto_cast`` around a ``to_static`` call
picks its AMP program at each call instead). So a program traced inside a region was run
outside it, bf16 where eager mode runs float32. Here the region active at the call (its
policy and device truth, or none) is part of the key: a call runs the program traced under
the same region state, as eager mode would decide, and a function called inside and
outside a region keeps one program for each.

A legacy program traced inside a region opened outside the function (``with auto_cast():
static_fn(x)``) is written as that region plans it, once traced (``ConcreteProgram
.from_func_spec``), as a PIR program gets it while traced: the ops a region opened inside
the function wrote stand.

A report's region (``cast_report``) keys a program of its own and logs the decisions built
into it (a cached one's are logged again: ``_replay_reports``).

``install()`` patches Paddle's ``CacheKey``, ``ConcreteProgram.from_func_spec``,
``ProgramCache.__getitem__`` and the AST
translator's ``convert_auto_cast``, once per process (at ``paddle_amp.dygraph``'s import: a
key made before would not carry the state).
"""
from __future__ import annotations

import functools
import itertools

from . import frames, legacy

_KEY = "paddle_amp.dygraph region"  # our entry in CacheKey.kwargs
_installed: list = []
_traces = itertools.count()


def install() -> None:
    """Key ``to_static``'s program cache by the active region, and write a legacy trace made
    in one (idempotent)."""
    if _installed:
        return
    try:
        from paddle.jit.dy2static.program_translator import CacheKey, ConcreteProgram
    except ImportError:  # a Paddle without dy2static: nothing to key
        return
    _installed.append(True)
    init, hash_ = CacheKey.__init__, CacheKey.__hash__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.kwargs[_KEY] = frames.state_key()

    @functools.wraps(hash_)
    def __hash__(self):
        return hash((hash_(self), self.kwargs.get(_KEY)))

    CacheKey.__init__, CacheKey.__hash__ = __init__, __hash__
    trace = ConcreteProgram.from_func_spec

    @functools.wraps(trace)
    def from_func_spec(*args, **kwargs):
        frame = frames.current()
        if frame is None or not frame.on:
            return trace(*args, **kwargs)
        with frames.tracing() as written:
            concrete = trace(*args, **kwargs)
        from paddle.base import framework, unique_name
        # in static mode (the trace is over: eager mode again), with names of its own (the
        # trace's name generator is gone: its names must not come again)
        with framework._dygraph_guard(None), unique_name.guard(f"amp_trace{next(_traces)}."):
            legacy.rewrite(frame, concrete.main_program.global_block(), 0, written)
        return concrete

    ConcreteProgram.from_func_spec = staticmethod(from_func_spec)
    _replay_reports()
    _keep_ours_when_paddle_amp_is_ours()


def _replay_reports() -> None:
    """A report's region (``cast_report``, the doctor) traces its own program (its key says
    so: ``frames.state_key``), and logs the decisions as they are built in; a second
    report of the same program finds it cached, built already: the decisions its trace
    logged are kept with the cache and logged again."""
    try:
        from paddle.jit.dy2static.program_translator import ProgramCache
    except ImportError:
        return
    get = ProgramCache.__getitem__

    @functools.wraps(get)
    def __getitem__(self, item):
        frame = frames.current()
        if frame is None or frame.log is None or not frame.on:
            return get(self, item)
        logs = self.__dict__.setdefault("_paddle_amp_reports", {})
        key, start = hash(item), len(frame.log)
        cached = key in self._caches
        out = get(self, item)
        if cached and key in logs:
            frame.log.extend(logs[key])
        elif not cached:
            logs[key] = tuple(frame.log[start:])
        return out

    ProgramCache.__getitem__ = __getitem__


def _keep_ours_when_paddle_amp_is_ours() -> None:
    """The AST translator swaps ``paddle.amp.auto_cast`` for Paddle's ``convert_auto_cast``
    (which only records the region, for auto-parallel) by identity: a script that pointed
    ``paddle.amp`` at ours (docs/dygraph.md) got Paddle's in a legacy program, and ran
    float32. Ours is ours there too."""
    try:
        from paddle.jit.dy2static import convert_operators
    except ImportError:
        return
    native = getattr(convert_operators, "convert_auto_cast", None)
    if native is None:
        return

    @functools.wraps(native)
    def convert_auto_cast(*args, **kwargs):
        import paddle
        from .auto_cast import auto_cast
        if getattr(paddle.amp, "auto_cast", None) is auto_cast:
            return auto_cast(*args, **kwargs)
        return native(*args, **kwargs)

    convert_operators.convert_auto_cast = convert_auto_cast
