"""The IR layer: both program IRs implement the whole ``ProgramIR`` protocol, and a program's
IR is picked once. The protocol is split by concern, and the loss-scaling sequence uses only
its part."""
import ast
import inspect
from pathlib import Path

import paddle
import pytest

from amp_adapters.rules.loss_scale import ArrayOps
from paddle_amp import ir
from paddle_amp.ir import LegacyProgram, PirProgram, ProgramIR
from paddle_helpers import is_pir

PARTS = (ir.ValuesIR, ir.WritingIR, ir.MastersIR, ir.ScalingIR, ir.DoctorIR)


def _declared(part) -> set[str]:
    return {name for name, member in vars(part).items()
            if not name.startswith("_") and inspect.isfunction(member)}


DECLARED = sorted(set().union(*(_declared(p) for p in PARTS)))


def test_program_ir_is_its_parts_and_each_method_is_in_one_part():
    assert set(PARTS) <= set(ProgramIR.__mro__)
    assert sum(len(_declared(p)) for p in PARTS) == len(DECLARED)


def test_the_loss_scaling_sequence_uses_only_its_part():
    """``scaling.LossScaling`` is typed against ``ScalingIR`` and calls nothing else of it."""
    import paddle_amp.scaling as scaling
    assert inspect.signature(scaling.LossScaling.__init__).parameters["ir"].annotation \
        in ("ScalingIR", ir.ScalingIR)
    tree = ast.parse(Path(scaling.__file__).read_text("utf-8"))
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, (ast.Name, ast.Attribute))
            and "ir" in (getattr(node.value, "id", None), getattr(node.value, "attr", None))}
    assert used and used <= _declared(ir.ScalingIR), used - _declared(ir.ScalingIR)


def test_the_protocol_declares_the_walk_and_the_scaling():
    assert {"slots", "cast", "round", "retype", "param_uses", "unscale", "all_reduce_max",
            "state_var", "state_ops", "skip"} <= set(DECLARED)


def test_the_protocol_declares_the_doctors_operations():
    """The doctor's IR-specific part lives here, so a PIR doctor is written in one place."""
    assert {"doctor_ops", "float32_twin", "inserted_cast", "fetchable"} <= set(DECLARED)


@pytest.mark.parametrize("impl", [LegacyProgram, PirProgram])
@pytest.mark.parametrize("name", DECLARED)
def test_each_ir_implements_every_method_with_its_signature(impl, name):
    declared = next(getattr(p, name) for p in PARTS if name in _declared(p))
    ours = getattr(impl, name, None)
    assert ours is not None and ours is not declared, f"{impl.__name__} lacks {name}"
    assert list(inspect.signature(ours).parameters) == \
        list(inspect.signature(declared).parameters), f"{impl.__name__}.{name}"


@pytest.mark.parametrize("impl", [LegacyProgram, PirProgram])
def test_each_ir_names_itself(impl):
    assert impl.name in ("legacy", "pir") and LegacyProgram.name != PirProgram.name


def test_a_program_gets_its_irs_implementation_once(static):
    paddle.static.nn.fc(paddle.static.data("x", [2, 4], "float32"), 3)
    first = ir.of(static.main)
    assert isinstance(first, ProgramIR) and ir.of(static.main) is first
    pir = is_pir(static.main)
    assert first.name == ("pir" if pir else "legacy")
    assert type(first) is (PirProgram if pir else LegacyProgram)
    ops = first.state_ops()
    assert isinstance(ops, ArrayOps) and callable(ops.store)


@pytest.mark.legacy_ir
def test_a_legacy_cast_goes_in_front_of_the_op_it_is_given(static):
    """The insertion point is the ``before`` argument (the walk's cursor when it stands
    there), not a position kept from an earlier walk."""
    x = paddle.static.data("x", [None, 4], "float32")
    y = paddle.scale(paddle.nn.functional.relu(x), 2.0)
    program = ir.of(paddle.static.default_main_program())
    block = program.block
    scale = next(op for op in block.ops if op.type == "scale")
    out = program.cast(scale, scale.input("X")[0], "float16")
    types = [op.type for op in block.ops]
    assert types[types.index("scale") - 1] == "cast" and y is not None
    assert block.ops[types.index("scale") - 1].output("Out") == [out]
