"""PIR's O2 masters (``protocol.MastersIR``): a float32 parameter per low one, its gradient
cast up after the backward, the new value cast back into the parameter at the end."""
from __future__ import annotations

import paddle
from paddle.nn.initializer import Constant

from amp_adapters import dtype_name


class Masters:
    """``PirProgram``'s O2 emulated float32 masters."""


    def new_master(self, param, name: str):
        """A ``builtin.parameter`` in main, its init in the startup program (initialised from
        the parameter by ``MasterWeights.init_scope``)."""
        paddle.pir.reset_insertion_point_to_end()
        return paddle.static.create_parameter(
            list(param.shape), "float32", name=name,
            attr=paddle.ParamAttr(name=name, trainable=True,
                                  regularizer=getattr(param, "regularizer", None),
                                  need_clip=getattr(param, "need_clip", True)),
            default_initializer=Constant(0.0))

    def master_grad(self, grad):
        paddle.pir.reset_insertion_point_to_end()
        return paddle.cast(grad, "float32")

    def write_cast(self, src, dst) -> None:
        """The cast writes the parameter's variable itself (``set_persistable_value``, as
        Paddle's own passes write persistables), with no copy after it (``assign_out_``:
        about 0.9 ms per 2048x2048 parameter and step)."""
        paddle.pir.reset_insertion_point_to_end()
        paddle._pir_ops.set_persistable_value(paddle.cast(src, dtype_name(dst.dtype)), dst.name)
