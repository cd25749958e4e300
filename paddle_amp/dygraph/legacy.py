"""A region in a legacy-IR program being built (``paddle.jit.to_static`` on Paddle 2.6, or 3.x
with ``FLAGS_enable_pir_api=0``): the ops it appended, run as eager mode runs them.

In a legacy program Paddle's layers append ops through ``LayerHelper``, never through the
``paddle._C_ops`` entry points ``wrappers`` wraps. So a region remembers where its block
stood when it opened (Paddle's own ``convert_auto_cast`` records a region the same way: a
block and an op range) and, when it closes, goes over the ops appended since: each op
``wrappers`` wraps in eager mode (``OPS``) is planned by the region (``Frame.plan``, the same
decisions, recorded in ``region.ran``) and written with the static drop-in's legacy writing
(``paddle_amp.ir.legacy``) as eager mode runs it:

- lowered with a kernel here: its floating inputs cast into the low dtype (rounding: oneDNN's
  cast where Paddle's plain one truncates, as in eager mode), the op on oneDNN's bf16
  kernel by the attributes the native bf16 rewrite sets (``use_mkldnn``,
  ``mkldnn_data_type``; its gradient op inherits them), and its result cast back to float32
  under the name the ops after it read: the ops after it compute in float32, as in eager
  mode, so the program gives eager mode's loss; every operand wants a gradient when one
  does (oneDNN's bf16 ``matmul_v2_grad`` crashes otherwise, as in eager mode): a cast made
  here directly, an operand as it is (an O2 weight's reader's input stored low) through a
  copy;
- emulated: inputs and result rounded through the low dtype (an input stored low, an O2
  weight, only widened);
- otherwise (falls back, nothing to do): as it is.

The ops of a control-flow sub-block (a converted ``if``'s branches, a loop's body) the
region covers are written alike, as eager mode runs the branch or the iterations it takes;
a region opened inside a sub-block writes its own ops and leaves them to the region around
it. An op is planned as eager mode plans the call: per Layer path where the policy has layer
rules (the Layer owning the parameter it reads: ``_param_paths``; a GEMM of two activations
has none), per shape class under measured speed (its vars' shapes: ``Frame.plan_shaped``).
``paddle.jit.save`` saves these ops, so a loaded program keeps the decisions.
"""
from __future__ import annotations

from typing import Any, Optional

# program op -> its floating input slots, in the order eager mode plans them (wrappers)
OPS = {"matmul_v2": ("X", "Y"), "conv2d": ("Input", "Filter")}


def building_block() -> Any:
    """The block a legacy program being built appends to, or None (eager mode, PIR)."""
    if not _FRAMEWORK:
        from paddle.base import framework
        _FRAMEWORK.append(framework)
    framework = _FRAMEWORK[0]
    if framework.in_dygraph_mode() or getattr(framework, "in_pir_mode", _no)():
        return None
    return framework.default_main_program().current_block()


_FRAMEWORK: list = []  # paddle.base.framework, imported once (a region is entered per step)


def _no() -> bool:
    return False


def rewrite(frame, block, start: int, done: set) -> None:
    """Write the ops ``block`` gained from ``start`` on as ``frame`` plans them (eager mode's
    route); ``done``: ids of ops an inner region wrote already (its plan stands). A report's
    region (``frame.log``) logs each decision, in program order."""
    from . import kernels
    from ..ir.legacy.program import LegacyProgram
    ir = LegacyProgram(block.program)
    if not kernels.plain_cast_rounds():
        ir.use_onednn_casts()
    paths = _param_paths(block.program) if frame.layered else None
    _rewrite_block(frame, ir, block, start, done, paths)


def _param_paths(program) -> Any:
    """names -> the Layer path of the first of ``names`` that is a parameter of the model
    (None: none is), for a region with layer rules. A program has no Layer calls to follow
    (eager mode's ``layer_paths``): an op is named by the Layer owning the parameters it
    reads, as the static runtime names it (``paddle_amp.layer_paths``), from the model as
    eager mode counts paths: the outermost Layer call the region's wrapper saw, still
    running when the region closes (a region opened around the ``to_static`` model's
    call), else the outermost Layer called in the program, whose paths the static runtime
    noted when it returned (a region opened inside the traced ``forward``: eager mode, which
    warns then, counts from the same Layer)."""
    from .. import layer_paths as static_paths
    from . import layer_paths
    root = layer_paths._calls.root
    if root is not None:
        static_paths.note_model(root[0], program)

    def path(names) -> Optional[str]:
        found = static_paths.paths_of(program, names)
        return found[0] if found else None
    return path


def _rewrite_block(frame, ir, block, start: int, done: set, paths) -> None:
    """``rewrite`` of ``block`` from ``start`` on, and of every sub-block (a converted ``if``'s
    branches, a loop's body) an op there holds, whole: the region was open while it was
    built (a region opened inside it wrote its own ops: ``done``)."""
    from ..env import DTYPE_OF
    from ..ir.legacy.values import Cursor, role
    i = start
    while i < len(block.ops):
        op = block.ops[i]
        if id(op) in done:
            i += 1
            continue
        if op.has_attr("sub_block"):
            _rewrite_block(frame, ir, op._block_attr("sub_block"), 0, done, paths)
        if op.type not in OPS:
            i += 1
            continue
        ir.block = block
        names = [op.input(slot)[0] for slot in OPS[op.type]]
        vars_ = [block._var_recursive(n) for n in names]
        key = (op.type,) + tuple(DTYPE_OF.get(v.dtype) for v in vars_)
        instance = paths(op.input_arg_names) if paths is not None else None
        d, decision = frame.plan_shaped(key, [tuple(v.shape) for v in vars_], instance)
        if frame.log is not None:  # a report's region (cast_report, the doctor): in op order
            frame.log.append(decision)
        if d is not None:
            ir.cursor = Cursor(op, i, role(op))
            _write(ir, op, names, d)
            i = ir.cursor.at
        ir.cursor = None
        i += 1


def _write(ir, op, names: list, d) -> None:
    """``op`` (reading ``names``) written as the decision ``d`` runs it in eager mode."""
    out = op.output(_OUT[op.type])[0]
    if d.emulated:  # an input stored low (an O2 weight) is only widened: exact
        for name, r, c in zip(names, d.round_inputs, d.casts):
            if r:
                op._rename_input(name, ir.round(op, name, d.low_dtype))
            elif c:
                op._rename_input(name, ir.cast(op, name, c))
        if d.round_outputs:
            ir.round_output(op, out, d.low_dtype)
        return
    low = d.run_dtype is not None and d.run_dtype == d.low_dtype
    cast = []
    for name, c in zip(names, d.casts):
        if c:
            new = ir.cast(op, name, c)
            op._rename_input(name, new)
            cast.append(new)
    if not low:
        return
    _every_operand_wants_grad(ir, op, cast)
    ir.use_onednn(op)
    _hand_back(ir, op, out, d.low_dtype)


_OUT = {"matmul_v2": "Out", "conv2d": "Output"}


def _every_operand_wants_grad(ir, op, cast: list) -> None:
    """oneDNN's bf16 ``matmul_v2_grad`` crashes (SIGSEGV) on one missing gradient: where one
    operand of ``op`` wants a gradient (an O2 weight stored bf16, or a cast of a float32
    one), every operand then wants one, as in eager mode (``wrappers._run``): a cast made
    here directly, an operand of the caller's (an input stored low) through a copy."""
    block = ir.block
    now = [op.input(slot)[0] for slot in OPS[op.type]]
    if all(block._var_recursive(n).stop_gradient for n in now):
        return
    for n in now:
        if not block._var_recursive(n).stop_gradient:
            continue
        if n in cast:
            ir.require_grad(n)
        else:
            op._rename_input(n, _copy(ir, op, n))


def _hand_back(ir, op, out: str, low: str) -> None:
    """``op`` writes ``out`` in ``low`` under a new name, cast back into ``out`` (float32)
    right after it: what eager mode hands the ops after it."""
    from paddle.base import unique_name
    from ..env import VARTYPE_OF
    from ..ir.legacy.writing import _insert_cast_op
    block = ir.block
    var = block._var_recursive(out)
    raw = block.create_var(name=unique_name.generate(f"{out}.{low}"), dtype=VARTYPE_OF[low],
                           shape=var.shape, lod_level=var.lod_level, persistable=False,
                           stop_gradient=var.stop_gradient)
    op._rename_output(out, raw.name)
    at = ir.cursor
    # a plain cast, as eager mode's (widening is exact; oneDNN's reorder of the gradient
    # back into bf16 fails on a GEMM's result: "could not create a primitive descriptor")
    _insert_cast_op(block, at.at + 1, raw.name, out, VARTYPE_OF[low], var.dtype, at.role, {})
    at.at += 1


def _copy(ir, op, name: str) -> str:
    """A copy of ``name`` (an ``assign`` before ``op``) that wants a gradient."""
    from paddle.base import framework, unique_name
    from ..ir.legacy.writing import _NAMESCOPE
    from ..ir.legacy.values import _ROLE
    block, at = ir.block, ir.cursor
    var = block._var_recursive(name)
    out = block.create_var(name=unique_name.generate(f"{name}.grad_copy"), dtype=var.dtype,
                           shape=var.shape, lod_level=var.lod_level, persistable=False,
                           stop_gradient=False)
    desc = block.desc._insert_op(at.at)
    desc.set_type("assign")
    desc.set_input("X", [name])
    desc.set_output("Out", [out.name])
    desc._set_int32_attr(_ROLE, int(at.role))
    desc._set_attr(_NAMESCOPE, framework._full_name_scope())
    desc.check_attrs()
    block.ops.insert(at.at, framework.Operator(block, desc))
    at.at += 1
    return out.name


def hook_backward(before) -> None:
    """Call ``before()`` ahead of each ``append_backward`` (what a legacy program's
    ``loss.backward()`` calls: ``Variable.backward`` imports it from ``paddle.base.backward``
    at each call, so the module's attribute is what it runs), while a region is open in a
    legacy program: a backward appended inside a region is built from the ops the region
    has written so far, not from its unwritten float32 forward."""
    from paddle.base import backward
    original = backward.append_backward

    def append_backward(*args, **kwargs):
        before()
        return original(*args, **kwargs)
    _HOOKED.append(original)
    backward.append_backward = append_backward


def unhook_backward() -> None:
    """Undo ``hook_backward``: Paddle's own ``append_backward`` again."""
    from paddle.base import backward
    backward.append_backward = _HOOKED.pop()


_HOOKED: list = []  # Paddle's own append_backward while hooked


def claimed(block, start: int) -> set:
    """The ids of the ops ``block`` holds from ``start`` on (a closed region's: an enclosing
    region leaves them as written)."""
    return {id(op) for op in block.ops[start:]}

