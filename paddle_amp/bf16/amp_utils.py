"""``paddle.static.amp.bf16.amp_utils``: bf16 program casts, through the core planner.

``rewrite_program_bf16`` is the O1 rewrite and ``cast_model_to_bf16`` the pure
(O2) one, both by ``rewrite.Rewriter`` under the bf16 list object's sets;
``cast_parameters_to_bf16`` converts values (round to nearest even);
``convert_float_to_uint16`` is the native's bit truncation, kept as is.
"""
import numpy as np

from amp_adapters.rules.errors import unsupported

from ..casting import (cast_model, cast_parameters, find_true_post_op,  # noqa: F401
                       find_true_prev_op)
from .. import ir
from ..env import VARTYPE_OF
from ..lists import AutoMixedPrecisionListsBF16
from ..guard import bf16_guard  # noqa: F401


def convert_float_to_uint16(in_list):
    """fp32 values as bf16 bit patterns (uint16), by truncation, as the native does."""
    a = np.ascontiguousarray(np.asarray(in_list, dtype=np.float32))
    return (a.view(np.uint32) >> 16).astype(np.uint16).reshape(a.shape)


def _is_in_fp32_varnames(op, amp_lists):
    """Whether a legacy ``op`` reads or writes one of ``amp_lists.fp32_varnames`` (the
    native's helper: such an op runs in fp32)."""
    names = amp_lists.fp32_varnames or ()
    return any(n in names for n in (*op.input_arg_names, *op.output_arg_names))


def _lists(amp_lists):
    return AutoMixedPrecisionListsBF16() if amp_lists is None else amp_lists


def rewrite_program_bf16(main_prog, amp_lists=None):
    """O1: ``bf16_list`` ops run in bfloat16 (where the device has the kernel), ``fp32_list``
    ops in fp32, gray ops in their widest input dtype; casts go in front of inputs."""
    cast_model(main_prog, _lists(amp_lists), False, "bfloat16", "O1")


def cast_model_to_bf16(program, startup_prog=None, amp_lists=None, use_bf16_guard=True):
    """Pure bf16 (O2): every op not in ``fp32_list`` runs in bfloat16 where it can; returns
    the parameters declared bf16 that still hold float32 values (convert them with
    ``cast_parameters_to_bf16``). With a legacy ``startup_prog``, as natively, those whose
    initializer is a ``fill_constant`` or ``uniform_random`` there make bf16 values
    themselves instead (and are not returned)."""
    low = cast_model(program, _lists(amp_lists), bool(use_bf16_guard), "bfloat16", "O2")
    if startup_prog is not None:
        low -= _initialize_in_bf16(startup_prog, low)
    return low


_BF16_INITIALIZERS = ("fill_constant", "uniform_random")  # the native's bf16_initializer_list


def _initialize_in_bf16(startup_prog, names) -> set:
    """Of the variables ``names``, those a native bf16 initializer of the legacy program
    ``startup_prog`` writes alone: that op now makes bfloat16 (its ``dtype`` attribute and
    its output's). A PIR startup program is left as it is (none returned)."""
    if ir.kind(startup_prog) == "pir":  # convert the values after the startup program
        return set()
    block, done = startup_prog.global_block(), set()
    for op in block.ops:
        outs = op.output_arg_names
        if op.type not in _BF16_INITIALIZERS or not outs or not set(outs) <= set(names) \
                or (op.has_attr("dtype") and op.attr("dtype") != VARTYPE_OF["float32"]):
            continue
        for name in outs:
            block.var(name).desc.set_dtype(VARTYPE_OF["bfloat16"])
        if op.has_attr("dtype"):
            op._set_attr("dtype", VARTYPE_OF["bfloat16"])
        done.update(outs)
    return done


def cast_parameters_to_bf16(place, program, scope=None, to_bf16_var_names=None):
    """Convert the values of ``to_bf16_var_names`` in ``scope`` to bfloat16."""
    cast_parameters(place, program, scope, to_bf16_var_names, "bfloat16")


_WHY = "it is a step of the native bf16 rewrite, which decides precision itself"
are_post_ops_bf16 = unsupported("paddle.static.amp.bf16.amp_utils.are_post_ops_bf16", _WHY,
                                "cast_model_to_bf16 / paddle_amp.cast_report(program)")
cast_initializers_to_bf16 = unsupported(
    "paddle.static.amp.bf16.amp_utils.cast_initializers_to_bf16", _WHY,
    "cast_model_to_bf16 then cast_parameters_to_bf16 after the startup program")
