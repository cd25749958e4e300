"""The legacy IR's device probe: tiny legacy programs that ask this CPU what it runs.

``kernels`` holds the recipes (which op, on which tiny inputs) and assembles the device
profile; this file builds and runs them as legacy programs (raw ``append_op``: Paddle 3's
functional API builds PIR values by default, even under the legacy-IR guard), with the
oneDNN attributes the native bf16 rewrite sets (``onednn_attrs``, also what
``LegacyProgram.use_onednn`` sets), between the casts a rewrite inserts, and times one op
in bf16 against float32 (``time``, for ``speed``). Each run is a host sync (a fetch).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional

import numpy as np
import paddle
from paddle.base import unique_name

from amp_adapters.rules.device import Cost
from amp_adapters.services.quiet import stderr_silenced

from ...env import to_low
from ..protocol import ONEDNN_DTYPE
from ..timed import cost_of



def onednn_attrs(op=None) -> dict:
    """The attributes the native bf16 rewrite sets on a bf16 op, in the spellings the
    installed Paddle knows (2.6: ``use_mkldnn``/``mkldnn_data_type``; 3.x also accepts
    ``use_onednn``/``onednn_data_type``); for ``op``, only those it has."""
    out = {}
    for use, kind in (("use_mkldnn", "mkldnn_data_type"), ("use_onednn", "onednn_data_type")):
        if op is None or op.has_attr(use):
            out[use] = True
        if op is None or op.has_attr(kind):
            out[kind] = ONEDNN_DTYPE
    if op is None:  # a new op: the spellings this version's op makers declare
        out = {k: v for k, v in out.items() if k in _known_attrs()}
    return out


@functools.lru_cache(maxsize=None)
def _known_attrs() -> frozenset[str]:
    """Which oneDNN attribute spellings this Paddle's legacy ops carry (read off a matmul_v2)."""
    with static_mode():
        block = paddle.static.Program().global_block()
        x = block.create_var(name="x", dtype="float32", shape=[1, 1])
        op = block.append_op(type="matmul_v2", inputs={"X": [x], "Y": [x]},
                             outputs={"Out": [block.create_var(name="y", dtype="float32")]})
        return frozenset(a for a in ("use_mkldnn", "mkldnn_data_type", "use_onednn",
                                     "onednn_data_type") if op.has_attr(a))


def _cast(block, src, dst, onednn: bool = True) -> None:
    """A legacy ``cast`` of ``src`` into ``dst``, with the oneDNN attributes if ``onednn``."""
    block.append_op(type="cast", inputs={"X": [src]}, outputs={"Out": [dst]},
                    attrs={"in_dtype": src.dtype, "out_dtype": dst.dtype,
                           **(onednn_attrs() if onednn else {})})


@contextlib.contextmanager
def static_mode():
    """Static mode in the legacy IR (``OldIrGuard``; Paddle 2.6 has no other) for the block,
    with its own unique names (a probe never shifts the user's). Scoped: the tracer is set
    aside for the block (``_dygraph_guard(None)``), not switched off process-wide as
    ``paddle.enable_static()`` does, which, from a probe run inside another guard (a region
    first opened while ``to_static`` traces), left dynamic mode on for good: a later
    ``paddle.enable_static()`` no longer turned it off."""
    from paddle.base import framework
    guard: Callable = getattr(getattr(paddle, "pir_utils", None), "OldIrGuard",
                              contextlib.nullcontext)
    with framework._dygraph_guard(None), guard(), unique_name.guard():
        yield


class LegacyProbe:
    """``protocol.Probe`` for the legacy IR (one per process: ``LegacyProgram.probe``)."""

    name = "legacy"
    onednn_casts = True  # a cast goes to oneDNN by its own attributes (``casts_round_trip``)

    def available(self) -> bool:
        return True

    def runs(self, op: str, recipe, backward: bool, cast_in: Optional[str] = None) -> bool:
        """Whether ``op`` built by ``recipe`` runs in bf16 on oneDNN (forward, and backward
        with ``backward``), its results finite; with ``cast_in`` ("onednn" or "plain"),
        between the casts a rewrite puts around it (``_build``). An error (no primitive for
        this CPU, a dtype the kernel refuses) is the answer False, never raised."""
        inputs, outputs, attrs = recipe
        try:
            with static_mode(), stderr_silenced():
                main, startup = paddle.static.Program(), paddle.static.Program()
                with paddle.static.program_guard(main, startup):
                    fetch = _build(main.global_block(), op, inputs, outputs, attrs, backward,
                                   cast_in)
                exe = paddle.static.Executor(paddle.CPUPlace())
                exe.run(startup)
                feed = {f"probe_{name}": to_low(np.ones(shape), ONEDNN_DTYPE)
                        if low and not cast_in else np.ones(shape, np.float32)
                        for name, (shape, low) in inputs.items()}
                got = exe.run(main, feed=feed, fetch_list=fetch)
            return all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in got)
        except Exception:  # noqa: BLE001 - any failure to build or run is "no kernel here"
            return False

    def casts_round_trip(self, x: np.ndarray) -> Optional[tuple[set, np.ndarray]]:
        """``x`` cast to bf16 and back by two casts with the oneDNN attributes: (the kinds
        of primitive oneDNN's log shows, the float32 values back), or None where that fails."""
        from ...onednn_log import executed, onednn_log
        try:
            with static_mode(), stderr_silenced(), onednn_log() as log:
                main = paddle.static.Program()
                block = main.global_block()
                v = {n: block.create_var(name=f"probe_{n}", dtype=d, shape=list(x.shape))
                     for n, d in (("x", "float32"), ("low", ONEDNN_DTYPE), ("back", "float32"))}
                v["x"].desc.set_need_check_feed(False)
                _cast(block, v["x"], v["low"])
                _cast(block, v["low"], v["back"])
                exe = paddle.static.Executor(paddle.CPUPlace())
                back, = exe.run(main, feed={"probe_x": x}, fetch_list=[v["back"]])
        except Exception:  # noqa: BLE001 - any failure to build or run is "no"
            return None
        return {kind for kind, _ in executed(log)}, np.asarray(back, np.float32)

    def time(self, op: str, inputs: dict, attrs: dict, training: bool, dtype: str,
             onednn: bool, cast_in: Optional[str], place: Any = None) -> Cost:
        """``op`` on float32 parameters of the shapes ``inputs`` ({slot: shape}) with
        ``attrs``, in ``dtype`` behind casts (``cast_in``: "onednn" or "plain") with a
        oneDNN cast of its result back to float32 where casts go there (and the oneDNN
        attributes on the op with ``onednn``), against the op in float32: forward, and
        with ``training`` forward and backward too (``timed.cost_of``; one Executor,
        each startup run once, every run fetches the loss: a host sync). Raises what the
        build or a run raises."""
        def build(main, startup, low: bool, backward: bool):
            return _timed(main, startup, op, inputs, attrs, backward, dtype if low else None,
                          onednn, cast_in)
        with static_mode(), stderr_silenced():
            return cost_of(build, training, place)


def _timed(main, startup, op: str, inputs: dict, attrs: dict, backward: bool,
           low: Optional[str], onednn: bool, cast_in: Optional[str]):
    """``time``'s program: the op on parameters (each initialised once by ``startup``),
    the mean of its float32 result as the loss, and its backward with ``backward``; in
    ``low`` (None: float32) behind casts."""
    block, init = main.global_block(), startup.global_block()
    cast_onednn = cast_in == "onednn"
    feeds = {}
    for slot, shape in inputs.items():
        name = f"timed_{slot}"
        feeds[slot] = block.create_parameter(name=name, shape=list(shape), dtype="float32")
        out = init.create_var(name=name, shape=list(shape), dtype="float32", persistable=True)
        init.append_op(type="uniform_random", outputs={"Out": [out]},
                       attrs={"shape": list(shape), "dtype": out.dtype, "min": -1.0,
                              "max": 1.0, "seed": 1})
        if low:
            lowered = block.create_var(name=f"{name}_low", dtype=low, shape=list(shape))
            _cast(block, feeds[slot], lowered, onednn=cast_onednn)
            feeds[slot] = lowered
    first = block.create_var(name="timed_out", dtype=low or "float32")
    block.append_op(type=op, inputs={k: [v] for k, v in feeds.items()},
                    outputs={_OUT.get(op, "Out"): [first]},
                    attrs={**attrs, **(onednn_attrs() if low and onednn else {})})
    if low:
        wide = block.create_var(name="timed_wide", dtype="float32")
        _cast(block, first, wide, onednn=cast_onednn)
        first = wide
    loss = block.create_var(name="timed_loss", dtype="float32", shape=[1])
    block.append_op(type="mean", inputs={"X": [first]}, outputs={"Out": [loss]})
    if backward:
        with paddle.static.program_guard(main, startup):
            paddle.base.backward.append_backward(loss)
    return loss


_OUT = {"conv2d": "Output"}  # the op's result slot, where it is not "Out"


def _build(block, op: str, inputs, outputs, attrs, backward: bool,
           cast_in: Optional[str] = None) -> list:
    """The recipe's op and, for ``backward``, its gradients, as raw legacy ops; with
    ``cast_in`` ("onednn" or "plain"), its bf16 inputs cast from float32 feeds by such
    casts, and its result cast to float32 by a oneDNN cast (so the casts' gradients read
    what the op's gradient kernel leaves, and the other way round)."""
    def var(name, dtype, shape=None, **kw):
        return block.create_var(name=f"probe_{name}", dtype=dtype, shape=shape, **kw)

    feeds = {slot: var(slot, ONEDNN_DTYPE if low and not cast_in else "float32", list(shape),
                       stop_gradient=not backward)
             for slot, (shape, low) in inputs.items()}
    for v in feeds.values():
        v.desc.set_need_check_feed(False)
    for slot, (shape, low) in inputs.items():
        if low and cast_in:
            src, feeds[slot] = feeds[slot], var(f"{slot}_low", ONEDNN_DTYPE, list(shape),
                                                stop_gradient=not backward)
            _cast(block, src, feeds[slot], onednn=cast_in == "onednn")
    outs = {slot: var(f"{slot}_out", ONEDNN_DTYPE if i == 0 else "float32")
            for i, slot in enumerate(outputs)}
    block.append_op(type=op, inputs={k: [v] for k, v in feeds.items()},
                    outputs={k: [v] for k, v in outs.items()},
                    attrs={**attrs, **onednn_attrs()})
    first = outs[outputs[0]]
    if not backward:
        return [first]
    wide, loss = var("wide", "float32"), var("loss", "float32", [1])
    _cast(block, first, wide, onednn=cast_in is not None)
    block.append_op(type="mean", inputs={"X": [wide]}, outputs={"Out": [loss]})
    grads = paddle.base.backward.append_backward(loss)
    return [first, *(g for _, g in grads)]


PROBE = LegacyProbe()
