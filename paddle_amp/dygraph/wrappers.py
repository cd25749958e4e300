"""The wrappers: ``paddle._C_ops``'s GEMM and convolution entry points (``matmul``,
``linear``, ``conv2d``) and the eager Tensor's ``@``, as they run inside a region that decides
(installed and removed by ``dispatch``): each call on float32 inputs in a region that keeps
the op float32 takes the fast path (below); any other call is planned in the innermost
region (``frames.Frame``) and run as its decision says (``_run``: the op's oneDNN route,
emulated, or as it is). A call on values of a PIR program being built is planned alike; a
call in SOT's simulation passes through untouched."""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from amp_adapters import OpDecision, ShapeClass

from . import frames as _f
from . import kernels, layer_paths
from .frames import (BY_RANK, Frame, _lock, _name, _open, _owners, _regions, _result_rank,
                     _slot, current, reopen)
from .recast import kept_source
from .stepcasts import cast_once

_originals: dict[str, Callable] = {}  # name -> what a wrapper calls (Paddle's op, or a patch)


def _round(x, low: str):
    cast = kernels.rounding_cast()
    return cast(cast(x, low), "float32")


def _in_program(x) -> bool:
    """``x`` is a value of a PIR program being built (``to_static``), whose executor picks a
    bf16 op's oneDNN kernel itself (Paddle 3.3.1): its low route is the op itself."""
    return _Tensor[1] is not None and isinstance(x, _Tensor[1])


def _wants_grad(a, ours: bool):
    """``a`` (a copy, unless it is a cast ``_run`` made) with ``stop_gradient`` off."""
    if not ours:
        from paddle import _C_ops
        a = _C_ops.assign(a)
    a.stop_gradient = False
    return a


def _run(d: OpDecision, inputs: tuple, plain: Callable, low: Callable):
    """``inputs`` through the op as ``d`` says: its low route, emulated, or plain."""
    cast = kernels.rounding_cast()
    low_dtype = d.low_dtype

    def cast_to(x, c):  # once per tensor and step, however many ops read it (stepcasts)
        return cast_once(x, ("cast", c), lambda t: cast(t, c))
    if d.emulated:  # an input stored low (an O2 weight) is only widened: exact
        args = tuple(cast_once(x, ("round", low_dtype), lambda t: _round(t, low_dtype))
                     if r else cast_to(x, c) if c else x
                     for x, r, c in zip(inputs, d.round_inputs, d.casts))
        out = plain(*args)
        return _round(out, low_dtype) if d.round_outputs else out
    if d.run_dtype is not None and d.run_dtype == d.low_dtype:
        args = tuple(cast_to(x, c) if c else x for x, c in zip(inputs, d.casts))
        if _in_program(args[0]) and any(not a.stop_gradient for a in args):
            # a PIR program runs the op itself, and oneDNN's bf16 matmul_v2_grad crashes
            # (SIGSEGV) if one operand wants no gradient: every operand then wants one (a
            # copy of a caller's own value). Eager mode's route never runs that kernel
            # (``kernels.matmul_v2``)
            args = tuple(a if not a.stop_gradient else _wants_grad(a, c is not None)
                         for a, c in zip(args, d.casts))
        return cast(low(*args), "float32")
    if d.needs_action:
        inputs = tuple(cast_to(x, c) if c else x for x, c in zip(inputs, d.casts))
    return plain(*inputs)


_MISSING = object()


def _kept(x, a, y, b) -> tuple:
    """For a GEMM of ``a``, ``b`` cast from ``x``, ``y``: the float32 operands the backward
    keeps anyway (``recast.kept_source``), whose low copies the GEMM need not keep; none
    while to_static's translator simulates this (it knows no ``grad_fn``), nor while a
    region is open in another thread (Paddle's saved-tensor hooks are one pair for the
    process, set and reset around each such GEMM: two threads would race on them)."""
    mine = _regions.frames
    if _in_sot[0]() or any(frames is not mine for frames in _owners.values()):
        return None, None
    return kept_source(x, a), kept_source(y, b)


def _planned(frame: Optional[Frame], op: str, x, y) -> Any:
    """The plan of ``op`` on ``x``, ``y`` (eager tensors, or values of a PIR program being
    built) in ``frame`` (None: run it as it is; ``_MISSING``: not ours to plan: no region,
    mixed precision off, SOT simulating, other values).

    Reading a Paddle dtype and hashing it costs about 1 us each (a pybind enum), more than a
    small op; so the region first looks the call up by its inputs' element sizes
    (``Frame.fast``), kept only for 4- and 8-byte floating inputs, where the size names one
    floating dtype. An integer input of the same size gets the same answer: run as it is
    (AMP never casts integers), or, for a plan that acts, the real dtypes are checked first."""
    if frame is None or _in_sot[0]() or not frame.on or not (
            isinstance(x, _Tensor[0]) and isinstance(y, _Tensor[0])):
        return _MISSING
    if frame.measured:
        return _by_shape(frame, (op, x.dtype, y.dtype), x, y)
    if frame.log is not None or frame.layered:
        return _noted(frame, (op, x.dtype, y.dtype), x, y)
    sizes = (op, x.element_size(), y.element_size())
    fast = frame.fast
    if sizes in fast:
        d, decision = fast[sizes]  # (the plan, the decision it came from: ``ran``)
        if d is BY_RANK:
            return _by_rank(frame, (op, x.dtype, y.dtype), x, y)
        if d is None or d.input_dtypes == (_name(x.dtype), _name(y.dtype)):
            frame.note(op, decision)
            return d
    key = (op, x.dtype, y.dtype)
    d = frame.plans[key] if key in frame.plans else frame.plan(key)
    decision = None if d is BY_RANK else frame.decisions[key]
    if sizes[1] in (4, 8) and sizes[2] in (4, 8) and _name(key[1]) and _name(key[2]):
        fast[sizes] = (d, decision)
    if d is BY_RANK:
        return _by_rank(frame, key, x, y)
    frame.note(op, decision)
    return d


def _noted(frame: Frame, key: tuple, x, y) -> Any:
    """The plan of ``key`` run by the Layer running now (its path, where the policy has
    layer rules), its decision appended to ``frame.log`` (a report's region, a doctor's)."""
    instance = layer_paths.current() if frame.layered else None
    full = key
    slot = _slot(key, instance)
    d = frame.plans[slot] if slot in frame.plans else frame.plan(key, None, instance)
    if d is BY_RANK:
        full = key + (x.ndim, y.ndim)
        slot = _slot(full, instance)
        d = frame.plans[slot] if slot in frame.plans else \
            frame.plan(key, full[-2:], instance)
    decision = frame.decisions[_slot(full, instance)]
    frame.note(key[0], decision)
    if frame.log is not None:
        frame.log.append(decision)
    return d


def _by_shape(frame: Frame, key: tuple, x, y) -> Any:
    """The plan of ``key`` for inputs of ``x``'s and ``y``'s shape class, under measured speed
    (an op is lowered only where it was measured faster at its shape class: decided once
    per shape class in a region, and per Layer path where the policy has layer rules), its
    decision logged in a report's region."""
    instance = layer_paths.current() if frame.layered else None
    shape = ShapeClass.of([x.shape, y.shape], _result_rank(len(x.shape), len(y.shape)))
    slot = _slot(key + (shape,), instance)
    d = frame.plans[slot] if slot in frame.plans else frame.plan(key, None, instance, shape)
    decision = frame.decisions[slot]
    frame.note(key[0], decision)
    if frame.log is not None:
        frame.log.append(decision)
    return d


def _by_rank(frame: Frame, key: tuple, x, y) -> Any:
    """The plan of ``key`` for inputs of ``x``'s and ``y``'s ranks (``Frame.plan``)."""
    full = key + (x.ndim, y.ndim)
    d = frame.plans[full] if full in frame.plans else frame.plan(key, full[-2:])
    frame.note(key[0], frame.decisions[full])
    return d


def _quiet_here(op: str, x, y) -> bool:
    """Whether ``op`` on ``x``, ``y`` runs as it is in this thread's innermost region: ``op``
    quiet there, and ``x``, ``y`` float32 eager tensors (the fast path's test; int32 runs as
    it is alike). If so, the region records its quiet decision for ``op``, once: the first
    such call since the region opened or recorded another decision for it; then ``op``'s
    fast path opens if every thread's innermost region agrees (``reopen``)."""
    frames = _regions.frames
    if not frames:
        return False
    frame = frames[-1]
    # (``in`` and ``[]``, not ``dict.get``: Paddle 2.6.2's SOT translator, simulating this
    # under ``to_static``, fails on ``get`` of a missing key)
    if op not in frame.quiet or not (isinstance(x, _EAGER) and isinstance(y, _EAGER) and
                                     x.element_size() + y.element_size() == 8):
        return False
    d = frame.quiet[op]
    if op not in frame.ran or frame.ran[op] is not d:
        frame.ran[op] = d
        with _lock:
            reopen(op)
    return True


# The wrappers take Paddle 3's keyword forms as named parameters, not ``**kw``: CPython 3.11
# calls a function with plain parameters only (no ``*args``, ``**kw``, keyword-only) through
# a specialized path, about 100 ns faster a call here.

def _matmul(x=_MISSING, y=_MISSING, transpose_x=False, transpose_y=False, name=None,
            out=None, input=None, other=None):  # noqa: A002  (Paddle's keyword names)
    """``_C_ops.matmul`` in a region: Paddle's positional form (``x, y, transpose_x,
    transpose_y``, and ``name``), and Paddle 3.3.1's keywords (``input``/``other``, the aliases
    of ``x``/``y``; ``out=``): the fast path, else planned (``_matmul_planned``)."""
    if _f.quick_gemm and isinstance(x, _EAGER) and isinstance(y, _EAGER) and \
            x.element_size() + y.element_size() == 8 and \
            out is None and input is None and other is None:
        return _originals["matmul"](x, y, transpose_x, transpose_y)
    if out is not None or input is not None or other is not None or x is _MISSING or \
            y is _MISSING:
        return _matmul_kw(x, y, transpose_x, transpose_y, out, input, other)
    return _matmul_planned(x, y, transpose_x, transpose_y)


# (each wrapper's planned path is a function of its own: a wrapper whose body makes a
# closure, such as ``plain`` below, pays for its cells on every call, fast path too)

def _matmul_planned(x, y, transpose_x: bool, transpose_y: bool):
    orig = _originals["matmul"]
    if _quiet_here("matmul_v2", x, y):
        return orig(x, y, transpose_x, transpose_y)
    frame = current()
    d = _planned(frame, "matmul_v2", x, y)
    if d is None or d is _MISSING:
        out = orig(x, y, transpose_x, transpose_y)
    else:
        plain = lambda a, b: orig(a, b, transpose_x, transpose_y)  # noqa: E731
        out = _run(d, (x, y), plain, plain if _in_program(x) else
                   lambda a, b: kernels.matmul_v2(a, b, transpose_x, transpose_y,
                                                  *_kept(x, a, y, b)))
    if frame is not None and frame.watched is not None:
        _watched(frame, d, (x, y), out)
    return out


def _linear(x=_MISSING, weight=_MISSING, bias=None, name=None,
            input=None):  # noqa: A002  (Paddle's keyword name)
    """``F.linear`` in eager mode (``_C_ops.linear(x, weight, bias)``; ``input`` the alias of
    ``x``): its GEMM decided as ``matmul_v2``, its bias add as the native's ``add``
    (promotion: float32 with a float32 bias)."""
    if _f.quick_gemm and isinstance(x, _EAGER) and isinstance(weight, _EAGER) and \
            x.element_size() + weight.element_size() == 8 and input is None:
        return _originals["linear"](x, weight, bias)
    if input is not None or x is _MISSING or weight is _MISSING:
        kw = {} if input is None else {"input": input}
        x, weight = _keywords("linear", (x, weight), (("x", "input"), ("weight",)),
                              (_MISSING, _MISSING), kw)
    return _linear_planned(x, weight, bias)


def _linear_planned(x, weight, bias):
    orig = _originals["linear"]
    if _quiet_here("matmul_v2", x, weight):
        return orig(x, weight, bias)
    frame = current()
    d = _planned(frame, "matmul_v2", x, weight)
    if d is None or d is _MISSING:
        out = orig(x, weight, bias)
    else:
        mm = _originals["matmul"]
        plain = lambda a, b: mm(a, b, False, False)  # noqa: E731
        out = _run(d, (x, weight), plain, plain if _in_program(x) else
                   lambda a, b: kernels.matmul_v2(a, b, False, False,
                                                  *_kept(x, a, weight, b)))
        out = out if bias is None else _originals["add"](out, bias)
    if frame is not None and frame.watched is not None:
        _watched(frame, d, (x, weight), out)
    return out


def _conv2d(x, weight, *args, **kw):
    """``conv2d`` (``nn.Conv2D``, ``F.conv2d``): decided, emulated when asked, on oneDNN in
    bf16 where its route's probe ran (``kernels.conv2d``: in Paddle 2.6.2 and 3.3.1 it does
    not, so a bf16 plan falls back to float32, and the warning says why)."""
    if _f.quick_conv and isinstance(x, _EAGER) and isinstance(weight, _EAGER) and \
            x.element_size() + weight.element_size() == 8:
        return _originals["conv2d"](x, weight, *args, **kw)
    return _conv2d_planned(x, weight, args, kw)


def _conv2d_planned(x, weight, args: tuple, kw: dict):
    orig = _originals["conv2d"]
    if _quiet_here("conv2d", x, weight):
        return orig(x, weight, *args, **kw)
    frame = current()
    d = _planned(frame, "conv2d", x, weight)
    if d is None or d is _MISSING:
        out = orig(x, weight, *args, **kw)
    else:
        plain = lambda a, b: orig(a, b, *args, **kw)  # noqa: E731
        out = _run(d, (x, weight), plain, plain if _in_program(x) else
                   lambda a, b: kernels.conv2d(a, b, *args, **kw))
    if frame is not None and frame.watched is not None:
        _watched(frame, d, (x, weight), out)
    return out


def _watched(frame: Frame, d: Any, inputs: tuple, out: Any) -> None:
    """A wrapped call in a region that keeps them (``Frame.watched``): its decision (the one
    ``_noted`` logged; None where the region planned nothing: mixed precision off, not
    eager tensors), inputs, result, and the path of the Layer running it (tracked where
    ``layer_paths`` is entered)."""
    decision = frame.log[-1] if d is not _MISSING and frame.log else None
    frame.watched.append((decision, inputs, out, layer_paths.current()))


def _keywords(op: str, given: tuple, names: tuple, defaults: tuple, kw: dict) -> tuple:
    """``given`` (the positional parameters, ``_MISSING`` or their default where not passed)
    with the keywords of ``kw`` mapped onto them as Paddle's signature does (each parameter
    by its name or alias, ``names``); ``name=`` dropped (a label only in eager mode); the
    keywords left stay in ``kw``. A parameter passed twice, or a required one missing, is
    the TypeError Python gives."""
    kw.pop("name", None)
    out = list(given)
    for i, aliases in enumerate(names):
        for alias in aliases:
            if alias in kw:
                if out[i] is not defaults[i]:
                    raise TypeError(f"{op}() got multiple values for argument {aliases[0]!r}")
                out[i] = kw.pop(alias)
        if out[i] is _MISSING:
            raise TypeError(f"{op}() missing required argument {aliases[0]!r}")
    return tuple(out)


def _matmul_kw(x, y, transpose_x, transpose_y, out, input, other):  # noqa: A002
    """``_C_ops.matmul`` called with Paddle 3.3.1's keywords (``paddle.matmul(x, y,
    transpose_x=False, transpose_y=False, name=None, *, out=None)``, ``input``/``other`` the
    aliases of ``x``/``y``), or without ``x`` or ``y``: the call planned as its positional
    form; ``out=`` receives the result as Paddle's does."""
    kw = {k: v for k, v in (("input", input), ("other", other)) if v is not None}
    x, y = _keywords("matmul", (x, y), (("x", "input"), ("y", "other")),
                     (_MISSING, _MISSING), kw)
    result = _matmul(x, y, transpose_x, transpose_y)
    if out is None:
        return result
    import paddle
    paddle.assign(result, output=out)
    return out


def _tensor_matmul(self, other):
    """``Tensor.__matmul__`` (``x @ w``) while the wrappers are installed: decided as
    ``paddle.matmul`` (Paddle's native AMP and a program lower it alike), with its fast
    path; parked outside every region (``_parked_call``)."""
    if _f.quick_gemm and isinstance(other, _EAGER) and \
            self.element_size() + other.element_size() == 8:
        return _originals["matmul"](self, other, False, False)
    if not _open[0]:
        return _parked_call("__matmul__", self, other)
    if isinstance(other, _EAGER):
        return _matmul(self, other)
    return _originals["__matmul__"](self, other)


def _tensor_rmatmul(self, other):
    """``Tensor.__rmatmul__`` (``other @ self``), as ``_tensor_matmul``."""
    if not _open[0]:
        return _parked_call("__rmatmul__", self, other)
    if isinstance(other, _EAGER):
        return _matmul(other, self)
    return _originals["__rmatmul__"](self, other)


def _parked_call(name: str, tensor, other):
    """A call of the Tensor operator ``name`` while no region decides (the wrappers parked:
    ``_uninstall``): Paddle's operators are put back (``_unpark``), and this call is
    Paddle's."""
    original = _originals[name]
    if not _in_sot[0]():  # (not while to_static's translator simulates this code)
        _unpark()
    return original(tensor, other)


# the eager Tensor's operators routed through the matmul wrapper while it is installed
_OPERATORS = {"__matmul__": _tensor_matmul, "__rmatmul__": _tensor_rmatmul}


_WRAPPERS = {"matmul": _matmul, "linear": _linear, "conv2d": _conv2d}
# the program ops the wrappers plan: the only readers an O2 parameter stored low may have
PLANNED_OPS = frozenset({"matmul_v2", "conv2d"})


_EAGER: Any = ()  # the eager Tensor class (set at the first install; () matches nothing)

# [(the classes a wrapper plans for: eager Tensor, PIR Value), PIR Value or None]: set at
# the first install
_Tensor: list = []
def _sot_if_loaded() -> bool:
    """SOT's ``in_sot()`` if SOT is loaded, else False, importing nothing (SOT simulates
    the wrappers' code, and an import there is not to be simulated). Importing
    ``paddle.jit.sot`` for the answer loaded 58 modules and ``unittest`` into every process
    training under a region (about 5 MiB of Python heap, measured; none in a float32
    process), and SOT cannot simulate this code before it is loaded. A dict lookup a
    planned call until SOT is loaded; once it is, the next install asks SOT directly
    (``_ask_sot``)."""
    psdb = sys.modules.get("paddle.jit.sot.psdb")
    return psdb is not None and psdb.in_sot()


def _ask_sot() -> None:
    """From the next call on, ask SOT's ``in_sot`` directly once SOT is loaded (at each
    install: a lookup)."""
    if _in_sot[0] is _sot_if_loaded:
        psdb = sys.modules.get("paddle.jit.sot.psdb")
        if psdb is not None:
            _in_sot[0] = psdb.in_sot


# SOT's in_sot(): True while to_static's bytecode translator simulates the wrapper (which
# then passes the op through, as the AST translator's program values do)
_in_sot: list = [_sot_if_loaded]


# (owner, name, wrapper): every entry point the wrappers go in, found at the first install
# (``paddle._C_ops``'s GEMM and convolution, the eager Tensor's ``@``; Paddle 2.6.2 has no
# ``__rmatmul__``): installing is a loop over it, each region that decides pays it twice.
#
# The Tensor's operators are parked, not removed, when the last region closes: setting an
# attribute of the eager Tensor class (as putting Paddle's ``__matmul__`` back does) makes
# CPython drop what it has cached of every Tensor attribute lookup, and refilling that costs a
# 4-Linear MLP's forward about 5-7 us, twice a step where a training loop enters a region
# every step. A parked operator puts Paddle's back at its first call outside every region
# (``_parked_call``); the next region finds its wrapper still there and sets nothing.
_SITES: list = []
_parked: set = set()  # the names of the operators the last region left wrapped (parked)


def _find_sites() -> None:
    global _EAGER
    from paddle import _C_ops
    from paddle.base import core
    _EAGER = core.eager.Tensor
    value = getattr(getattr(__import__("paddle"), "pir", None), "Value", None)
    value = value if isinstance(value, type) else None
    _Tensor.append((core.eager.Tensor,) + ((value,) if value is not None else ()))
    _Tensor.append(value)
    _originals.setdefault("add", getattr(_C_ops, "add"))
    _SITES.extend((_C_ops, name, wrapper) for name, wrapper in _WRAPPERS.items())
    _SITES.extend((_EAGER, name, wrapper) for name, wrapper in _OPERATORS.items()
                  if getattr(_EAGER, name, None) is not None)


def _install() -> None:
    if not _SITES:
        _find_sites()
    _ask_sot()
    for owner, name, wrapper in _SITES:
        _wrap(owner, name, wrapper)


def _wrap(owner: Any, name: str, wrapper: Callable) -> None:
    """Put ``wrapper`` in ``owner.name``, calling what is there now (Paddle's op, or a patch
    another tool made outside a region), unless what is there is a patch made over our
    wrapper while a region was open (``_over_ours``): that one calls ours already, so it
    stays, and is never taken for Paddle's op (the two would call each other for good)."""
    current = getattr(owner, name)
    if name in _parked:  # our wrapper was left here (``_uninstall``)
        _parked.discard(name)
        if current is not wrapper:  # a patch made over it since: it calls ours
            _over_ours.setdefault(name, []).append(current)
            return
    if current is wrapper:
        return
    over = _over_ours.get(name)
    if over and any(current is p for p in over):
        return
    _originals[name] = current
    setattr(owner, name, wrapper)


def _unwrap(owner: Any, name: str, wrapper: Callable) -> None:
    """Put back what ``_wrap`` found, if ``wrapper`` is still there; a patch another tool made
    over it since stays, remembered as one that calls ours (``_wrap``)."""
    current = getattr(owner, name, None)
    if current is wrapper:
        if name in _originals:
            setattr(owner, name, _originals[name])
    elif current is not None and current is not _originals.get(name):
        _over_ours.setdefault(name, []).append(current)


_over_ours: dict = {}  # name -> patches found over our wrapper at uninstall (they call it)


def _uninstall() -> None:
    """The last region that decides has closed (the caller holds ``_lock``): Paddle's op
    functions go back; the Tensor's operators stay, parked (``_SITES``). Only our own wrapper
    goes: a patch another tool made since stays."""
    for owner, name, wrapper in _SITES:
        if owner is not _EAGER:
            _unwrap(owner, name, wrapper)
        else:
            _parked.add(name)


def _unpark() -> None:
    """Put Paddle's Tensor operators back, if still no region decides."""
    with _lock:
        if not _open[0]:
            for owner, name, wrapper in _SITES:
                if owner is _EAGER and name in _parked:
                    _parked.discard(name)
                    _unwrap(owner, name, wrapper)
