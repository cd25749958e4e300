"""O2 and a lone op between float32 neighbours (issue 38, point 8): an op O2 lowers for
being O2 alone (it follows or promotes its inputs: the attention's ``scale``) whose inputs
are float32 and none of whose readers computes low follows its neighbours, unless its low
kernel was measured faster here: the rule the shape-only ops follow (``plan_op``'s
``readers``), with neighbours given as data."""
from hypothesis import given
from hypothesis import strategies as st

from amp_adapters import ParamUse, Policy, OpCall, plan_op
from amp_adapters.rules.device import Cost, DeviceProfile, ShapeClass

F32, F16 = "float32", "float16"
O2, O2_EMU = Policy.preset("O2"), Policy.preset("O2", emulate=True)
ATT = ShapeClass.of([(2, 4, 4)], result_rank=3)

# per framework: ops O2 lowers for being O2 alone (follow or promote), readers that stay
# float32 here whatever the kernels (the lists keep them fp32), the GEMM that may read it
FRAMEWORK = {
    "paddle": dict(lone=("scale", "elementwise_add", "elementwise_mul", "relu", "gelu",
                         "tanh"),
                   fp32=(ParamUse("softmax", slot="X"), ParamUse("layer_norm", slot="X")),
                   gemm="matmul_v2", move="transpose2"),
    "mxnet": dict(lone=("_mul_scalar", "elemwise_add", "broadcast_mul", "Activation",
                        "LeakyReLU"),
                  fp32=(ParamUse("softmax", slot="data"), ParamUse("LayerNorm", slot="data")),
                  gemm="batch_dot", move="transpose"),
}


def _profile(op, kernels, cost=None, training=True):
    """A CPU with fp16 kernels for ``kernels`` only; ``cost``: the measured cost of ``op``."""
    return DeviceProfile(frozenset(kernels), training=training,
                         costs=None if cost is None else
                         (lambda o, shape: cost if o == op else None))


def _inputs(op):
    return (F32, F32) if op.startswith(("elementwise", "elemwise", "broadcast")) else (F32,)


def test_the_attentions_scale_between_float32_ops_follows_them():
    """``batch_dot -> * (1/sqrt(d)) -> softmax`` under O2 fp16 emulated on a CPU: the GEMM
    is emulated (its result is float32), softmax is fp32, and the scale has a CPU fp16
    kernel: it runs float32, no cast down and back (the native's 0 casts)."""
    for fw, op, reader in (("paddle", "scale", ParamUse("softmax", slot="X")),
                           ("mxnet", "_mul_scalar", ParamUse("softmax", slot="data"))):
        device = _profile(op, {op, "cast"})
        d = plan_op(O2_EMU, fw, OpCall(op, (F32,), readers=(reader,)), device=device)
        assert (d.run_dtype, d.precision, d.casts, d.emulated) == (F32, F32, (None,), False)
        assert not d.needs_action and "follows its data" in d.reason, d.reason
        # readers not listed: O2 lowers it, as before
        assert plan_op(O2_EMU, fw, OpCall(op, (F32,)), device=device).run_dtype == F16


def test_a_measured_faster_kernel_may_run_low_and_a_slow_one_does_not():
    fast, slow = Cost(0.5, 0.01, 0.5, 0.01), Cost(1.4, 0.02, 1.6, 0.02)
    reader = (ParamUse("softmax", slot="X"),)
    d = plan_op(O2, "paddle", OpCall("scale", (F32,), shape=ATT, readers=reader),
                device=_profile("scale", {"scale"}, fast))
    assert (d.run_dtype, d.casts) == (F16, (F16,))
    d = plan_op(O2, "paddle", OpCall("scale", (F32,), shape=ATT, readers=reader),
                device=_profile("scale", {"scale"}, slow))
    assert (d.run_dtype, d.casts) == (F32, (None,)) and "follows its data" in d.reason
    # a timing that failed is no measurement: it follows too
    d = plan_op(O2, "paddle", OpCall("scale", (F32,), shape=ATT, readers=reader),
                device=_profile(
        "scale", {"scale"}, Cost(error="boom")))
    assert d.run_dtype == F32


def test_low_inputs_or_a_low_reader_keep_o2_lowering_it():
    gemm = (ParamUse("matmul_v2", slot="X"),)
    kernels = {"scale", "matmul_v2"}
    assert plan_op(O2, "paddle", OpCall("scale", (F32,), readers=gemm),  # the GEMM reading it
                   device=_profile("scale", kernels)).run_dtype == F16  # runs fp16
    assert plan_op(O2_EMU, "paddle", OpCall("scale", (F32,), readers=gemm),
                   device=_profile("scale", {"scale"})).run_dtype == F16  # ... or emulates it
    assert plan_op(O2, "paddle", OpCall("scale", (F16,), readers=(ParamUse("softmax", slot="X"),)),
                   device=_profile("scale", {"scale"})).run_dtype == F16  # low data
    # every op has a kernel (a GPU, a device-free plan): the GEMM computes low
    assert plan_op(O2, "paddle", OpCall("scale", (F32,), readers=gemm)).run_dtype == F16
    # O1 decides by the lists, as before
    assert plan_op(Policy.preset("O1"), "paddle", OpCall("scale", (F32,), readers=gemm),
                   device=_profile("scale", {"scale"})).run_dtype == F32


@st.composite
def chains(draw):
    """``producer -> op -> readers`` with float32 inputs: ``op`` O2 lowers for being O2
    alone, its readers each stay float32 here (an fp32-list op, a GEMM without a kernel
    and without emulation, an op forced fp32, through a move), or one of them computes low
    (a GEMM with a kernel, or emulated); the op's own kernel and measured cost as data."""
    fw = draw(st.sampled_from(sorted(FRAMEWORK)))
    spec = FRAMEWORK[fw]
    op = draw(st.sampled_from(spec["lone"]))
    emulate = draw(st.booleans())
    gemm_kernel = draw(st.booleans())
    float32_readers = st.one_of(
        st.sampled_from(spec["fp32"]),
        st.just(ParamUse(spec["gemm"], force_fp32="outside fp16_guard")),
        st.just(ParamUse(spec["gemm"])).filter(lambda _: not (gemm_kernel or emulate)),
    )
    readers = draw(st.lists(st.one_of(
        float32_readers,
        float32_readers.map(lambda u: ParamUse(spec["move"], then=(u,)))), min_size=1,
        max_size=3))
    low_reader = draw(st.booleans()) and (gemm_kernel or emulate)
    if low_reader:
        readers.insert(draw(st.integers(0, len(readers))), ParamUse(spec["gemm"]))
    has_kernel = draw(st.booleans())
    ratio = draw(st.one_of(st.none(), st.sampled_from([0.3, 0.45, 0.6, 0.9, 1.0, 1.3, 2.5])))
    spread = draw(st.sampled_from([0.0, 0.02, 0.3]))
    cost = None if ratio is None else Cost(ratio, spread, ratio, spread)
    kernels = ({op} if has_kernel else set()) | ({spec["gemm"]} if gemm_kernel else set()) | \
        {spec["move"]}
    # not faster: unmeasured, or no gain at all; clearly faster: half float32's time or
    # less, spread included (faster under any margin); in between, the margin decides
    speed = ("slow" if not has_kernel or ratio is None or ratio >= 1.0 else
             "fast" if ratio + spread <= 0.5 else "margin")
    return (fw, op, Policy.preset("O2", emulate=emulate), _profile(op, kernels, cost),
            tuple(readers), low_reader, speed)


@given(chains())
def test_an_op_between_float32_neighbours_never_runs_low_unless_measured_faster(chain):
    fw, op, policy, device, readers, low_reader, speed = chain
    inputs = _inputs(op)
    d = plan_op(policy, fw, OpCall(op, inputs, shape=ATT, readers=readers), device=device)
    if not low_reader and speed == "slow":
        # its neighbours stay float32, its kernel is not measured faster: it follows them
        assert (d.run_dtype, d.precision) == (F32, F32), d.reason
        assert not d.needs_action and not d.fell_back, d.reason
    elif not low_reader:
        if speed == "fast":
            assert d.run_dtype == F16, d.reason  # a measured win may run low
        assert d.run_dtype == F16 or "follows its data" in d.reason
    else:
        # a reader computes low: O2 lowers it (emulated, or float32 for want of a kernel),
        # as without readers
        assert d == plan_op(policy, fw, OpCall(op, inputs, shape=ATT), device=device)
        assert "follows its data" not in d.reason
