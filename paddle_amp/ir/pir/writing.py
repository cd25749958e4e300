"""PIR's writing (``protocol.WritingIR``): a ``pd_op.cast`` inserted before the op (before
the ``builtin.combine`` of a list operand such as concat's); a low op's results retyped (its
infer-meta is not re-run, so never a result whose dtype an attribute fixes); operands that
were attributes in the legacy IR (scale factors, axes, shapes) never cast."""
from __future__ import annotations

import paddle

from ..protocol import Slot
from . import opnames
from .probe import PROBE
from .values import _parameters, _retype_combine, value_dtype


def _nested_ops(op) -> list:
    """Every op in ``op``'s blocks, and in theirs, recursively."""
    out = []
    for block in op.blocks():
        for inner in block.ops:
            out.append(inner)
            if inner.num_regions():
                out.extend(_nested_ops(inner))
    return out


def _fixed_dtype(op) -> bool:
    """True if ``op``'s result dtype is set by its ``dtype`` attribute (``sum(x,
    dtype='float32')``), not by its inputs: such a result keeps its declared dtype."""
    if not op.has_attr("dtype"):
        return False
    return not str(op.attrs()["dtype"]).endswith("UNDEFINED")


def _retyped(value, dtype: str):
    """``value``'s type with ``dtype`` as element type (a throwaway cast supplies the type)."""
    paddle.pir.set_insertion_point_after(value.get_defining_op())
    probe = paddle.cast(value, dtype)
    new = paddle.pir.create_shaped_type(probe.type(), value.shape)
    probe.get_defining_op().erase()
    paddle.pir.reset_insertion_point_to_end()
    return new


class Writing:
    """``PirProgram``'s writing."""


    def cast(self, before, value, dtype: str, plain: bool = False):
        """(``plain``: every cast is plain under PIR, ``use_onednn_casts``)"""
        paddle.pir.set_insertion_point(before)
        out = paddle.cast(value, dtype)
        self._inserted.add(out.get_defining_op().id())
        return out

    def round(self, before, value, low: str):
        return self.cast(before, self.cast(before, value, low), "float32")

    def set_input(self, slot: Slot, old, new) -> None:
        slot.owner.operand(slot.index).set_source(new)
        if slot.owner.name() == "builtin.combine":
            _retype_combine(slot.owner)

    def current(self, slot: Slot):
        return slot.owner.operand_source(slot.index)

    def rewire_within(self, op, old, new) -> None:
        for user in [op, *_nested_ops(op)]:
            for i, source in enumerate(user.operands_source()):
                if source.initialized() and source.is_same(old):
                    user.operand(i).set_source(new)

    def chain_cast(self, op) -> None:
        """Nothing: a PIR cast's input dtype is its operand's type."""

    def overwritten(self, op) -> set:
        """SSA: only an in-place op (``relu_``) overwrites values, its operands."""
        if not op.name().endswith("_"):
            return set()
        return {v.id for v in op.operands_source() if v.initialized()}

    def float_outputs(self, op, kept) -> list:
        keep = {opnames.snake(s) for s in kept}
        names = op.get_output_names()
        return [r for i, r in enumerate(op.results())
                if (names[i] if i < len(names) else "") not in keep
                and value_dtype(r) == "float32"]

    def retype(self, op, value, dtype: str) -> None:
        if not _fixed_dtype(op):  # its infer-meta is not re-run: only retype results
            value.set_type(_retyped(value, dtype))  # that follow the inputs

    def round_output(self, op, value, low: str):
        paddle.pir.set_insertion_point_after(op)
        mid = paddle.cast(value, low)
        back = paddle.cast(mid, "float32")
        self._inserted.update((mid.get_defining_op().id(), back.get_defining_op().id()))
        value.replace_all_uses_with(back)
        mid.get_defining_op().operand(0).set_source(value)
        return back

    probe = PROBE  # its device probe (``kernels``)

    def use_onednn(self, op) -> None:
        """Nothing to set: the executor picks a bf16 op's oneDNN kernel itself (3.3.1)."""

    def use_onednn_casts(self, plain_readers=frozenset()) -> None:
        """Nothing that can be set: 3.3.1's PIR picks a cast's plain kernel (it has one for
        bf16) whatever attribute the op carries; only the process-wide FLAGS_use_mkldnn,
        which moves every op, sends casts to oneDNN (``kernels.onednn_kernels`` has no
        cast under PIR: ``PirProbe.onednn_casts``)."""

    def require_grad(self, value) -> None:
        value.stop_gradient = False

    def set_param_dtype(self, names, dtype: str) -> None:
        for param in _parameters(self.program):
            if param.name in names and value_dtype(param) == "float32":
                param.set_type(_retyped(param, dtype))
