"""PIR's recomputed casts (``protocol.RecomputeIR``): the program's ops as the core's ``OpUse``
(values by id; the rewrite's casts by the ids it recorded, the backward as what
``end_forward`` did not see), and a ``Recast`` written as a ``pd_op.cast`` in front of the
first gradient op reading the copy (plain, as every cast under PIR)."""
from __future__ import annotations

import paddle

from amp_adapters.rules.recompute import OpUse, Recast

from .values import value_dtype
from .writing import _nested_ops


class Recompute:
    """``PirProgram``'s recomputed casts."""

    def op_uses(self) -> list[OpUse]:
        self._listed = list(self.block.ops)
        forward = self._forward
        out = []
        for op in self._listed:
            each = [op, *_nested_ops(op)]
            backward = forward is not None and op.id() not in forward
            cast = (op.operand_source(0).id, op.result(0).id) \
                if op.id() in self._inserted and not backward else None
            out.append(OpUse(
                frozenset(v.id for o in each for v in o.operands_source() if v.initialized()),
                frozenset(v.id for o in each for v in o.results()) | self.overwritten(op),
                backward, cast))
        return out

    def recast(self, plan: tuple[Recast, ...]) -> None:
        ops = self._listed
        try:
            for r in sorted(plan, key=lambda r: r.at, reverse=True):
                cast = ops[r.cast]
                paddle.pir.set_insertion_point(ops[r.at])
                new = paddle.cast(cast.operand_source(0), value_dtype(cast.result(0)))
                self._inserted.add(new.get_defining_op().id())
                self._recasts.add(new.get_defining_op().id())
                for j in r.readers:
                    self.rewire_within(ops[j], cast.result(0), new)
        finally:
            paddle.pir.reset_insertion_point_to_end()
