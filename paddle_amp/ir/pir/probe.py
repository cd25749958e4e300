"""PIR's device probe: tiny PIR programs that ask this CPU what it runs (Paddle 3 only).

``kernels`` holds the recipes (which op, on which tiny inputs, in the legacy vocabulary)
and assembles the device profile; this file builds them as PIR programs (the functional
API, ``_CALLS``), whose executor picks a bf16 op's oneDNN kernel itself, and times one op
in bf16 against float32 (``time``, for ``speed``). PIR has no per-op switch that sends a
cast to oneDNN (``PirProgram.use_onednn_casts``), so its casts are the executor's choice.
Each run is a host sync (a fetch).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import numpy as np
import paddle
from paddle.base import unique_name

from amp_adapters.rules.device import Cost
from amp_adapters.services.quiet import stderr_silenced

from ..protocol import ONEDNN_DTYPE
from ..timed import cost_of



def _matmul(i: dict, a: dict):
    return paddle.matmul(i["X"], i["Y"], transpose_x=bool(a.get("trans_x", a.get("transpose_X"))),
                         transpose_y=bool(a.get("trans_y", a.get("transpose_Y"))))


def _conv2d(i: dict, a: dict):
    return paddle.nn.functional.conv2d(i["Input"], i["Filter"], stride=a.get("strides", 1),
                                       padding=a.get("paddings", 0),
                                       dilation=a.get("dilations", 1), groups=a.get("groups", 1))


# legacy op name -> the PIR call on its inputs (by legacy slot) and attributes; the recipes
# of ``kernels`` are tiny, so a fixed normalized shape is theirs (layer_norm)
_CALLS: dict[str, Callable] = {
    "matmul_v2": _matmul,
    "matmul": _matmul,
    "mul": lambda i, a: paddle.matmul(i["X"], i["Y"]),
    "conv2d": _conv2d,
    "layer_norm": lambda i, a: paddle.nn.functional.layer_norm(i["X"], [4], i["Scale"],
                                                               i["Bias"]),
    "reshape2": lambda i, a: paddle.reshape(i["X"], [-1, 3]),
    "relu": lambda i, a: paddle.nn.functional.relu(i["X"]),
    "elementwise_add": lambda i, a: paddle.add(i["X"], i["Y"]),
    "elementwise_sub": lambda i, a: paddle.subtract(i["X"], i["Y"]),
    "elementwise_mul": lambda i, a: paddle.multiply(i["X"], i["Y"]),
}
# the ops ``time`` builds at any shape (PIR has no legacy ``mul``: a matmul there)
_TIMED = ("matmul_v2", "matmul", "conv2d")


@contextlib.contextmanager
def static_mode():
    """Static mode in PIR (``IrGuard``) for the block, with its own unique names; scoped
    (``_dygraph_guard(None)``), not ``paddle.enable_static()``'s process-wide switch (see the
    legacy IR's ``static_mode``)."""
    from paddle.base import framework
    with framework._dygraph_guard(None), paddle.pir_utils.IrGuard(), unique_name.guard():
        yield


class PirProbe:
    """``protocol.Probe`` for PIR (one per process: ``PirProgram.probe``)."""

    name = "pir"
    onednn_casts = False  # no per-op switch: a cast's kernel is the executor's choice

    def available(self) -> bool:
        """PIR exists here (Paddle 3; Paddle 2.6 has only the legacy IR)."""
        return hasattr(getattr(paddle, "pir_utils", None), "IrGuard")

    def runs(self, op: str, recipe, backward: bool, cast_in: Optional[str] = None) -> bool:
        """The recipe's op in a tiny PIR program, its bf16 result read by a bf16 op after it:
        Paddle 3.3.1's PIR oneDNN conv2d leaves float32 data in its bf16 output, which only a
        reader in bf16 finds ("does not match the type of data"). Every input needs a
        gradient (oneDNN's matmul_grad dies on one that needs none: ``rewrite``). ``cast_in``
        has no meaning here (no cast route to choose). Any failure is False."""
        inputs, _, attrs = recipe
        if not self.available() or op not in _CALLS:
            return False
        try:
            with static_mode(), stderr_silenced():
                main, startup = paddle.static.Program(), paddle.static.Program()
                with paddle.static.program_guard(main, startup):
                    feeds, xs = {}, []
                    for slot, (shape, low) in inputs.items():
                        x = paddle.static.data(f"probe_{slot}", list(shape), "float32")
                        x.stop_gradient = not backward
                        xs.append(x)
                        feeds[slot] = paddle.cast(x, ONEDNN_DTYPE) if low else x
                    out = _CALLS[op](feeds, attrs)
                    loss = paddle.mean(paddle.cast(paddle.scale(out, 2.0), "float32"))
                    fetch = [loss]
                    if backward:
                        fetch += [g for g in paddle.static.gradients([loss], xs) if g is not None]
                exe = paddle.static.Executor(paddle.CPUPlace())
                exe.run(startup)
                feed = {f"probe_{slot}": np.ones(shape, np.float32)
                        for slot, (shape, _) in inputs.items()}
                got = exe.run(main, feed=feed, fetch_list=fetch)
            return all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in got)
        except Exception:  # noqa: BLE001 - any failure to build or run is "no kernel here"
            return False

    def casts_round_trip(self, x: np.ndarray) -> None:
        """No cast can be sent to oneDNN by itself under PIR (``onednn_casts``)."""
        return None

    def time(self, op: str, inputs: dict, attrs: dict, training: bool, dtype: str,
             onednn: bool, cast_in: Optional[str], place: Any = None) -> Optional[Cost]:
        """``op`` on float32 parameters of the shapes ``inputs`` ({slot: shape}) with
        ``attrs``, in ``dtype`` behind casts and its result cast back to float32, against
        the op in float32: forward, and with ``training`` forward and backward too
        (``paddle.static.gradients``; ``timed.cost_of``; one Executor, each startup run
        once, every run fetches the loss: a host sync). The executor picks the kernels
        (``onednn`` and ``cast_in`` have nothing to set). None for an op it cannot build at
        any shape; raises what the build or a run raises."""
        if not self.available() or op not in _TIMED:
            return None
        def build(main, startup, low: bool, backward: bool):
            with paddle.static.program_guard(main, startup):
                params = {slot: paddle.static.create_parameter(
                    list(shape), "float32", name=f"timed_{slot}",
                    default_initializer=paddle.nn.initializer.Uniform(-1.0, 1.0))
                    for slot, shape in inputs.items()}
                ins = {k: paddle.cast(v, dtype) for k, v in params.items()} if low else params
                out = _CALLS[op](ins, attrs)
                loss = paddle.mean(paddle.cast(out, "float32") if low else out)
                if backward:
                    paddle.static.gradients([loss], list(params.values()))
            return loss
        with static_mode(), stderr_silenced():
            return cost_of(build, training, place)


PROBE = PirProbe()
