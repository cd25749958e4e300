"""The legacy IR's O2 masters (``protocol.MastersIR``): a float32 parameter per low one,
its gradient cast up after the backward, the new value cast back at the end."""
from __future__ import annotations

from paddle.base import core, unique_name

from .values import _ROLE


class Masters:
    """``LegacyProgram``'s O2 emulated float32 masters."""


    def new_master(self, param, name: str):
        return self.block.create_parameter(
            name=name, shape=param.shape, dtype="float32", trainable=True,
            optimize_attr=param.optimize_attr, regularizer=param.regularizer,
            need_clip=getattr(param, "need_clip", True))

    def master_grad(self, grad):
        """A plain cast where ``grad`` comes from the gradient op of a plain reader (its layout
        is one oneDNN's cast cannot read: ``use_onednn_casts``)."""
        g32 = self.block.create_var(name=unique_name.generate(f"{grad.name}.fp32"),
                                    dtype="float32", shape=grad.shape, persistable=False)
        writer = next((op for op in reversed(self.block.ops)
                       if grad.name in op.output_arg_names), None) if self._plain_readers \
            else None
        plain = writer is not None and writer.type.removesuffix("_grad") in self._plain_readers
        self.block.append_op(type="cast", inputs={"X": [grad]}, outputs={"Out": [g32]},
                             attrs={"in_dtype": grad.dtype, "out_dtype": g32.dtype,
                                    _ROLE: int(core.op_proto_and_checker_maker.OpRole.Backward),
                                    **({} if plain else
                                       self._cast_attrs(grad.dtype, g32.dtype))})
        return g32

    def write_cast(self, src, dst) -> None:
        with self.program._optimized_guard([]):
            self.block.append_op(type="cast", inputs={"X": [src]}, outputs={"Out": [dst]},
                                 attrs={"in_dtype": src.dtype, "out_dtype": dst.dtype,
                                        **self._cast_attrs(src.dtype, dst.dtype)})
