"""The legacy IR's writing (``protocol.WritingIR``): casts inserted at the walk's position,
inputs renamed, outputs retyped or rounded, oneDNN's attributes."""
from __future__ import annotations

from typing import AbstractSet, Optional

from paddle.base import core, framework, unique_name

from amp_adapters.rules.dtypes import SHORT_NAMES

from ...env import DTYPE_OF, VARTYPE_OF
from ..protocol import Slot
from .probe import PROBE, onednn_attrs
from .values import _ROLE, Cursor

_NAMESCOPE = core.op_proto_and_checker_maker.kOpNameScopeAttrName()


def _ops_within(op) -> list:
    """Every op in ``op``'s sub-block, and in theirs, recursively (none: no sub-block)."""
    out = []
    if not op.has_attr("sub_block"):
        return out
    for inner in op._block_attr("sub_block").ops:
        out.append(inner)
        out.extend(_ops_within(inner))
    return out


def insert_op(block, i: int, kind: str, inputs: dict, outputs: dict, role,
              ints: Optional[dict] = None, attrs: Optional[dict] = None) -> None:
    """An op of type ``kind`` at position ``i``, straight into the desc (its vars exist), with
    ``role``, the int32 attributes ``ints`` and the other ``attrs``; the op's own defaults
    for the rest."""
    desc = block.desc._insert_op(i)
    desc.set_type(kind)
    for slot, names in inputs.items():
        desc.set_input(slot, names)
    for slot, names in outputs.items():
        desc.set_output(slot, names)
    for name, value in {**(ints or {}), _ROLE: role}.items():
        desc._set_int32_attr(name, int(value))
    desc._set_attr(_NAMESCOPE, framework._full_name_scope())
    for name, value in (attrs or {}).items():
        desc._set_attr(name, value)
    desc.check_attrs()  # the op's defaults (a cast's use_mkldnn, ...)
    block.ops.insert(i, framework.Operator(block, desc))


def _insert_cast_op(block, i: int, src: str, out: str, in_dtype, out_dtype, role,
                    attrs: dict) -> None:
    """A ``cast`` op at position ``i`` with ``attrs`` besides its dtypes (oneDNN's:
    ``LegacyProgram._cast_attrs``)."""
    insert_op(block, i, "cast", {"X": [src]}, {"Out": [out]}, role,
              {"in_dtype": in_dtype, "out_dtype": out_dtype}, attrs)


class Writing:
    """``LegacyProgram``'s writing."""


    def _at(self, op) -> Cursor:
        """The cursor on ``op``: the walk's own when it stands there (always, in the rewrite),
        else ``op`` found in the block."""
        cursor = self.cursor
        return cursor if cursor is not None and cursor.op is op else Cursor.find(self.block, op)

    def _insert_cast(self, i: int, src: str, target: str, stem: str, role: int,
                     plain: bool = False) -> str:
        var = self.block._var_recursive(src)
        out = self.block.create_var(name=unique_name.generate(stem), dtype=VARTYPE_OF[target],
                                    shape=var.shape, lod_level=var.lod_level, persistable=False,
                                    stop_gradient=var.stop_gradient)
        _insert_cast_op(self.block, i, var.name, out.name, var.dtype, out.dtype, role,
                        {} if plain else self._cast_attrs(var.dtype, out.dtype))
        return out.name

    def cast(self, before, value: str, dtype: str, plain: bool = False) -> str:
        at = self._at(before)
        out = self._insert_cast(at.at, value, dtype, f"{value}.cast_{SHORT_NAMES[dtype]}",
                                at.role, plain)
        at.at += 1
        return out

    def round(self, before, value: str, low: str) -> str:
        at = self._at(before)
        mid = self._insert_cast(at.at, value, low, f"{value}.emul_{SHORT_NAMES[low]}", at.role)
        out = self._insert_cast(at.at + 1, mid, "float32", f"{value}.emul", at.role)
        at.at += 2
        return out

    def set_input(self, slot: Slot, old: str, new: str) -> None:
        slot.owner._rename_input(old, new)

    def current(self, slot: Slot) -> str:
        return slot.owner.input(slot.name)[slot.index]

    def rewire_within(self, op, old: str, new: str) -> None:
        for each in [op, *_ops_within(op)]:
            each._rename_input(old, new)

    def chain_cast(self, op) -> None:
        op._set_attr("in_dtype", self.block._var_recursive(op.input("X")[0]).dtype)

    def overwritten(self, op) -> set:
        return set(op.output_arg_names)

    def float_outputs(self, op, kept) -> list:
        """XShape, the shape-only output of reshape2/flatten/transpose2..., holds no data."""
        return [name for slot in op.output_names if slot not in kept and slot != "XShape"
                for name in op.output(slot) if self.dtype(name) == "float32"]

    def retype(self, op, value: str, dtype: str) -> None:
        self.block._find_var_recursive(value).desc.set_dtype(VARTYPE_OF[dtype])

    def round_output(self, op, value: str, low: str) -> str:
        var = self.block._find_var_recursive(value)
        raw = self.block.create_var(name=unique_name.generate(f"{value}.raw"), dtype=var.dtype,
                                    shape=var.shape, lod_level=var.lod_level, persistable=False,
                                    stop_gradient=var.stop_gradient)
        op._rename_output(value, raw.name)
        at = self._at(op)
        mid = self._insert_cast(at.at + 1, raw.name, low, f"{value}.emul_{SHORT_NAMES[low]}",
                                at.role)
        _insert_cast_op(self.block, at.at + 2, mid, var.name, VARTYPE_OF[low], var.dtype,
                        at.role, self._cast_attrs(VARTYPE_OF[low], var.dtype))
        at.at += 2
        return value

    probe = PROBE  # its device probe (``kernels``)

    def use_onednn(self, op) -> None:
        for name, value in onednn_attrs(op).items():
            op._set_attr(name, value)

    def use_onednn_casts(self, plain_readers: AbstractSet[str] = frozenset()) -> None:
        self._onednn_casts = True
        self._plain_readers = frozenset(plain_readers)

    def _cast_attrs(self, in_dtype, out_dtype) -> dict:
        """oneDNN's attributes for a cast between float32 and bfloat16, once the walk asked
        for them (``use_onednn_casts``); a cast's gradient op copies them."""
        pair = {DTYPE_OF.get(in_dtype), DTYPE_OF.get(out_dtype)}
        return onednn_attrs() if self._onednn_casts and pair == {"float32", "bfloat16"} else {}

    def require_grad(self, value: str) -> None:
        self.block._var_recursive(value).stop_gradient = False

    def set_param_dtype(self, names, dtype: str) -> None:
        for name in names:
            if self.block.has_var(name):
                self.block.var(name).desc.set_dtype(VARTYPE_OF[dtype])
