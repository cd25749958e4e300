"""The doctor's legacy-IR operations (``ProgramIR.doctor_ops`` and the rest): a runnable
clone with only the forward and backward ops, its float32 twin, and the rewrite's casts
told from the user's by the rewrite's var-name suffixes."""
from __future__ import annotations

from paddle.base import core

from .probe import static_mode
from .values import is_forward


_ROLE = core.op_proto_and_checker_maker.kOpRoleAttrName()
_BACKWARD = int(core.op_proto_and_checker_maker.OpRole.Backward)
_OPTIMIZE = int(core.op_proto_and_checker_maker.OpRole.Optimize) | int(
    core.op_proto_and_checker_maker.OpRole.LRSched)
_IO = frozenset({"feed", "fetch", "fetch_v2", "read", "create_py_reader"})
# What a cast made again in the backward reads its source through (``recompute``): no
# gradient, so not the doctor's to examine
_ORDERING = frozenset({"depend", "share_data"})
_FLOAT = (core.VarDesc.VarType.FP32, core.VarDesc.VarType.FP16, core.VarDesc.VarType.BF16,
          core.VarDesc.VarType.FP64)
_LOW = (core.VarDesc.VarType.FP16, core.VarDesc.VarType.BF16)
# The rewrite's cast outputs and inputs carry one of these (``.cast_fp16``, ``.emul``, ``.raw``).
_SUFFIXES = (".cast_", ".emul", ".raw")


def doctor_ops(program, is_forward):
    """(a clone of ``program`` with only its forward and backward ops, [its forward ops in
    execution order], [its backward ops in execution order]). The optimizer and the
    loss-scale update are dropped, so running the clone changes no persistable.
    ``is_forward``: the IR's forward test (``program.is_forward``; passed in, so this helper
    module does not import the module that imports it)."""
    prog = program.clone()
    block = prog.global_block()
    for i in reversed(range(len(block.ops))):
        op = block.ops[i]
        role = int(op.attr(_ROLE)) if op.has_attr(_ROLE) else 0
        if role & _OPTIMIZE or op.type in _IO:
            block._remove_op(i)
    block._sync_with_cpp()
    forward = [op for op in block.ops if is_forward(op)]
    backward = [op for op in block.ops if not is_forward(op) and
                int(op.attr(_ROLE)) & _BACKWARD and op.type not in _ORDERING]
    return prog, forward, backward


def float32_twin(clone):
    """``clone`` with every low-precision var made float32 and its casts made identities: the
    same ops, in float32 (names unchanged, so values line up with the AMP run's)."""
    twin = clone.clone()
    block = twin.global_block()
    for var in block.vars.values():
        if var.type == core.VarDesc.VarType.LOD_TENSOR and var.dtype in _LOW:
            var.desc.set_dtype(core.VarDesc.VarType.FP32)
    for op in block.ops:
        if op.type == "cast":
            for attr, slot in (("in_dtype", "X"), ("out_dtype", "Out")):
                var = block._find_var_recursive(op.input(slot)[0] if slot == "X"
                                                else op.output(slot)[0])
                if var is not None and var.dtype in _FLOAT:
                    op._set_attr(attr, var.dtype)
    return twin


def inserted_cast(op) -> bool:
    """A cast the rewrite inserted: its input or output carries one of the rewrite's name
    suffixes."""
    return op.type == "cast" and any(
        s in op.input("X")[0] + "|" + op.output("Out")[0] for s in _SUFFIXES)


def fetchable(clone, name: str) -> bool:
    """True if the var ``name`` of ``clone`` is a floating dense tensor a run can fetch."""
    var = clone.global_block()._find_var_recursive(name)
    return (var is not None and var.type == core.VarDesc.VarType.LOD_TENSOR and
            var.dtype in _FLOAT and not name.endswith("XShape"))


class Doctor:
    """``LegacyProgram``'s numerics doctor (``protocol.DoctorIR``), by op role."""


    def doctor_ops(self) -> tuple:
        """By op role: the optimizer's, the LR schedule's and the feed/fetch ops dropped."""
        return doctor_ops(self.program, is_forward)

    def end_backward(self, params_grads: list) -> None:
        """Nothing: every op carries its role."""

    def replaying(self):
        """Static mode in this IR, restored after: the doctor's replay builds a copy."""
        return static_mode()

    def copy_with(self, loss) -> tuple:
        """(a copy of this program, ``loss`` in it): what the doctor replays fixes on."""
        copy = self.program.clone()
        return copy, copy.global_block().var(loss.name)

    def float32_twin(self, clone):
        return float32_twin(clone)

    def inserted_cast(self, op) -> bool:
        """By the rewrite's var-name suffixes (``.cast_fp16``, ``.emul``, ``.raw``)."""
        return inserted_cast(op)

    def fetchable(self, clone, name: str) -> bool:
        return fetchable(clone, name)

    def fetch_list(self, clone, names: list) -> list:
        return list(names)
