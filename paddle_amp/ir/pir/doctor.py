"""The doctor's PIR operations (``ProgramIR.doctor_ops`` and the rest).

PIR values have no names and a clone's values are new objects, so the doctor's
ops are seen through ``OpView``: an op in the doctor's (legacy) vocabulary, its
values named by where they are made (``%<op position>.<result>``; data and
parameters by their own names; a parameter's gradient ``<param>@GRAD``; a
value's gradient ``<value>@GRAD`` where a grad op says whose it is). A clone
keeps its ops in order, so a name means the same value in the program, its
clone and the clone's float32 twin.
"""
from __future__ import annotations

from typing import Optional

import paddle

from . import opnames
from .probe import static_mode
from .values import value_dtype


def _own_name(value) -> Optional[str]:
    maker = value.get_defining_op()
    if maker is not None and maker.name() in ("pd_op.data", "builtin.parameter"):
        return value.name
    return None


def _io_names(op) -> tuple:
    """(input names, output names) of ``op``; empty for an op with no yaml info (builtin)."""
    try:
        return list(op.get_input_names()), list(op.get_output_names())
    except ValueError:
        return [], []


class Naming:
    """The names of the values of one program's global block, by position."""

    def __init__(self, program, grads: dict) -> None:
        self.ops = list(program.global_block().ops)
        self.by_id: dict = {}
        self.values: dict = {}
        for i, op in enumerate(self.ops):
            for j, r in enumerate(op.results()):
                name = _own_name(r) or grads.get((i, j)) or f"%{i}.{j}"
                self.by_id[r.id] = name
                self.values[name] = r

    def name(self, value) -> Optional[str]:
        if value is None or not value.initialized():
            return None
        return self.by_id.get(value.id)


class OpView:
    """One op, as the doctor reads it (``type``, ``input``/``output`` by slot, the names)."""

    def __init__(self, op, naming: Naming, pos: int) -> None:
        self.op, self.pos, self.type = op, pos, opnames.legacy_name(op.name())
        ins, outs = _io_names(op)
        self._in: dict = {}
        for i, v in enumerate(op.operands_source()):
            slot = opnames.camel(ins[i] if i < len(ins) else str(i))
            if v.initialized() and v.is_combine():
                vs = list(v.get_defining_op().operands_source())
            else:
                vs = [v]
            self._in[slot] = [n for n in map(naming.name, vs) if n]
        self._out = {opnames.camel(outs[j] if j < len(outs) else str(j)): [naming.name(r)]
                     for j, r in enumerate(op.results()) if naming.name(r)}
        if self.type == "cast":  # the doctor reads a cast's X and Out
            self._in.setdefault("X", next(iter(self._in.values()), []))
            self._out.setdefault("Out", next(iter(self._out.values()), []))
        self.output_names = list(self._out)
        self.input_arg_names = [n for ns in self._in.values() for n in ns]
        self.output_arg_names = [n for ns in self._out.values() for n in ns]

    def input(self, slot: str) -> list:
        return self._in.get(slot, [])

    def output(self, slot: str) -> list:
        return self._out.get(slot, [])


def grad_names(program, forward: frozenset, backward: int, param_grads: dict) -> dict:
    """(op position, result index) -> ``<name>@GRAD``: the parameters' gradients
    (``param_grads``: grad value id -> parameter name), then the values a grad op
    (``<f>_grad``, among the ops before position ``backward``) reads or makes as a gradient
    of its forward op ``<f>`` (the op of ``forward``, by op id, whose operands and results
    it reads under the same names): its ``x_grad`` is the gradient of that op's ``x``."""
    ops = list(program.global_block().ops)
    made = {}  # value id -> (position, result index)
    for i, op in enumerate(ops):
        for j, r in enumerate(op.results()):
            made[r.id] = (i, j)

    def name(value) -> Optional[str]:
        if not value.initialized() or value.id not in made:
            return None
        i, j = made[value.id]
        return _own_name(value) or f"%{i}.{j}"

    out = {made[g]: f"{p}@GRAD" for g, p in param_grads.items() if g in made}
    by_type: dict = {}
    for op in ops:
        if op.id() in forward:
            ins, outs = _io_names(op)
            by_type.setdefault(op.name(), []).append(
                {**dict(zip(ins, op.operands_source())), **dict(zip(outs, op.results()))})
    for i in range(backward):
        op = ops[i]
        if op.id() in forward or not op.name().endswith("_grad"):
            continue
        ins, outs = _io_names(op)
        reads = dict(zip(ins, op.operands_source()))
        best, score = None, 0
        for fwd in by_type.get(op.name()[:-5], []):
            n = sum(1 for k, v in reads.items() if k in fwd and v.initialized()
                    and fwd[k].initialized() and v.is_same(fwd[k]))
            if n > score:
                best, score = fwd, n
        if best is None:
            continue
        pairs = [(k, v) for k, v in reads.items()] + list(zip(outs, op.results()))
        for k, v in pairs:
            if not k.endswith("_grad") or k[:-5] not in best or not v.initialized():
                continue
            of = best[k[:-5]]
            if v.id in made and of.initialized() and not of.is_combine() and name(of):
                out.setdefault(made[v.id], f"{name(of)}@GRAD")
    return out


def float32_twin(clone, value_dtype) -> tuple:
    """(``clone`` with every round trip through a low dtype (``cast(cast(x, low), float32)``,
    emulation's and the backward's) bypassed: its readers read ``x``; {position of each of
    the trip's casts: ``x``}). The casts stay (unread), so positions and names line up with
    the clone's; the doctor reads each trip's values as ``x``, as on the legacy IR, whose
    twin makes the casts identities. ``value_dtype``: the IR's dtype of a value
    (``values.value_dtype``)."""
    twin = clone.clone()
    ops = list(twin.global_block().ops)
    pos = {op.id(): i for i, op in enumerate(ops)}
    same: dict = {}
    for i, op in enumerate(ops):
        if op.name() != "pd_op.cast" or value_dtype(op.result(0)) != "float32":
            continue
        mid = op.operand_source(0)
        inner = mid.get_defining_op()
        if (inner is not None and inner.name() == "pd_op.cast" and
                value_dtype(mid) in ("float16", "bfloat16") and
                value_dtype(inner.operand_source(0)) == "float32"):
            src = inner.operand_source(0)
            op.result(0).replace_all_uses_with(src)
            same[i] = same[pos[inner.id()]] = src
    return twin, same


# Why ``paddle_amp.doctor`` refuses a PIR program whose forward and backward were not marked.
NO_DOCTOR = ("paddle_amp.doctor: this PIR program's forward and backward were not marked by a "
             "paddle_amp-decorated optimizer: build it with that optimizer's minimize() (or "
             "backward() and apply_gradients()), then examine it")


class Doctor:
    """``PirProgram``'s numerics doctor (``protocol.DoctorIR``): values named by position
    (``Naming``)."""


    def end_backward(self, params_grads: list) -> None:
        """PIR ops carry no role: the backward is what the parameters' gradients are made by
        (and the ops between), after the forward."""
        self._grads = {g.id: p.name for p, g in params_grads if g is not None}

    def replaying(self):
        """Static mode in this IR, restored after: the doctor's replay builds a copy."""
        return static_mode()

    def copy_with(self, loss) -> tuple:
        """(a copy of this program, ``loss`` in it): what the doctor replays fixes on."""
        mapping = paddle.pir.IrMapping()
        copy = self.program.clone(mapping)
        return copy, mapping.look_up(loss)

    def doctor_ops(self) -> tuple:
        """The ops after the last parameter gradient's maker (the loss scaling and the
        optimizer) are erased from the clone; the ops are ``doctor.OpView``s of the clone's."""
        if self._forward is None or not self._grads:
            raise RuntimeError(NO_DOCTOR)
        self._namings = {}  # one doctor's clone and twin at a time
        ops = list(self.block.ops)
        pos = {op.id(): i for i, op in enumerate(ops)}
        last = max(pos[op.id()] for op in ops
                   if any(r.id in self._grads for r in op.results()))
        forward = [i for i, op in enumerate(ops) if op.id() in self._forward
                   and not opnames.is_plumbing(op.name())]
        backward = [i for i, op in enumerate(ops[:last + 1]) if op.id() not in self._forward
                    and not opnames.is_plumbing(op.name())]
        names = grad_names(self.program, self._forward, last + 1, self._grads)
        self._grad_names = names
        self._inserted_at = {pos[i] for i in self._inserted if i in pos}
        clone = self.program.clone()
        cops = list(clone.global_block().ops)
        for op in reversed(cops[last + 1:]):  # the loss scaling and the optimizer: dropped
            op.erase()
        naming = self._naming(clone)
        cops = naming.ops
        return (clone, [OpView(cops[i], naming, i) for i in forward],
                [OpView(cops[i], naming, i) for i in backward])

    def _naming(self, prog):
        found = self._namings.get(id(prog))
        if found is None or found[0] is not prog:
            found = self._namings[id(prog)] = (prog, Naming(prog, self._grad_names))
        return found[1]

    def float32_twin(self, clone):
        twin, same = float32_twin(clone, value_dtype)
        naming = self._naming(twin)
        for i, src in same.items():  # a bypassed cast's result reads as its trip's source
            naming.values[naming.by_id[naming.ops[i].result(0).id]] = src
        return twin

    def inserted_cast(self, op) -> bool:
        """By the casts the rewrite recorded inserting (``cast``, ``round``, ``round_output``)."""
        return op.type == "cast" and op.pos in self._inserted_at

    def fetchable(self, clone, name: str) -> bool:
        value = self._naming(clone).values.get(name)
        return (value is not None and value_dtype(value) is not None
                and not name.endswith("XShape"))

    def fetch_list(self, clone, names: list) -> list:
        values = self._naming(clone).values
        return [values[n] for n in names]
