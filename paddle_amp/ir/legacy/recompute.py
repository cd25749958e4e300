"""The legacy IR's recomputed casts (``protocol.RecomputeIR``): the program's ops as the core's
``OpUse`` (the rewrite's forward casts told by their var-name suffixes, the backward by op
role), and a ``Recast`` written as a cast op of the backward role in front of the first
gradient op reading the copy, with the forward cast's oneDNN attributes (the same rounding)."""
from __future__ import annotations

from paddle.base import core, unique_name

from amp_adapters.rules.recompute import OpUse, Recast

from .doctor import inserted_cast
from .values import RECAST, is_forward, role
from .writing import _insert_cast_op, _ops_within, insert_op

_BACKWARD = int(core.op_proto_and_checker_maker.OpRole.Backward)
_ONEDNN = ("use_mkldnn", "mkldnn_data_type", "use_onednn", "onednn_data_type")


class Recompute:
    """``LegacyProgram``'s recomputed casts."""

    def op_uses(self) -> list[OpUse]:
        self._listed = list(self.block.ops)
        out = []
        for op in self._listed:
            each = [op, *_ops_within(op)]
            cast = (op.input("X")[0], op.output("Out")[0]) \
                if inserted_cast(op) and is_forward(op) else None
            out.append(OpUse(frozenset(n for o in each for n in o.input_arg_names),
                             frozenset(n for o in each for n in o.output_arg_names),
                             bool(int(role(op)) & _BACKWARD), cast))
        # the fed vars (``paddle.static.data`` fed by ``exe.run``: no op of the block writes
        # them) stay in the scope the whole step (measured: alive at the step's peak): read,
        # as it were, at its end. One a ``read`` op fills is an op's output like any other
        written = {n for op in self._listed for n in op.output_arg_names}
        fed = frozenset(v.name for v in self.block.vars.values()
                        if v.is_data and v.name not in written)
        return out + [OpUse(fed, frozenset(), backward=True)] if fed else out

    def recast(self, plan: tuple[Recast, ...]) -> None:
        """Each new cast reads its source through two ops of the backward: ``depend`` on
        ``Recast.after`` (this executor runs an op as soon as its inputs are ready, so a cast
        of a forward value alone ran in the forward and its copy was kept as before:
        measured, the same peak), then ``share_data`` under a new name (no copy): a cast on
        oneDNN reads its input through a layout transfer the executor makes once per var
        name, so a cast of the source itself read the forward's transfer, a float32 copy
        then kept until the backward (measured: a higher peak)."""
        ops = self._listed  # positions as ``op_uses`` listed them: written from the last on
        for r in sorted(plan, key=lambda r: r.at, reverse=True):
            if r.after is None:
                continue  # nothing to wait for: it would run in the forward
            cast = ops[r.cast]
            var = self.block._var_recursive(r.dst)
            new = self.block.create_var(name=unique_name.generate(f"{r.dst}{RECAST}"),
                                        dtype=var.dtype, shape=var.shape,
                                        lod_level=var.lod_level, persistable=False,
                                        stop_gradient=True)
            src = self.block._var_recursive(cast.input("X")[0])
            waited = self.block.create_var(name=unique_name.generate(f"{src.name}.waited"),
                                           dtype=src.dtype, shape=src.shape,
                                           lod_level=src.lod_level, persistable=False,
                                           stop_gradient=True)
            _insert_cast_op(self.block, r.at, waited.name, new.name,
                            cast.attr("in_dtype"), cast.attr("out_dtype"), _BACKWARD,
                            {a: cast.attr(a) for a in _ONEDNN if cast.has_attr(a)})
            insert_op(self.block, r.at, "share_data", {"X": [src.name]},
                      {"Out": [waited.name]}, _BACKWARD)
            insert_op(self.block, r.at, "depend", {"X": [src.name], "Dep": [r.after]},
                      {"Out": [src.name]}, _BACKWARD)
            for j in r.readers:
                self.rewire_within(ops[j], r.dst, new.name)
