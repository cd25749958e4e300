"""paddle.jit.to_static of a forward that opens paddle_amp.dygraph.auto_cast, or called inside
one: it converts and runs in both translators (AST, and SOT where Paddle has it); in a PIR
program (Paddle 3's default IR) and in a legacy one (Paddle 2.6.2, or 3.x with
FLAGS_enable_pir_api=0) the region's decisions are built into the program (bf16 GEMMs: eager
mode's result and gradients), paddle.jit.save keeps them, and a program runs only under the
region state it was traced in."""
import os

import numpy as np
import paddle
import pytest

from amp_adapters.rules.isa import bf16_class, machine
from paddle_amp import dygraph as amp

BF16 = bf16_class(machine()) != "none"


def _pir() -> bool:
    return bool(paddle.framework.use_pir_api()) if hasattr(paddle.framework, "use_pir_api") \
        else False


class Net(paddle.nn.Layer):
    def __init__(self, bias=True):
        super().__init__()
        self.fc1 = paddle.nn.Linear(16, 32, bias_attr=None if bias else False)
        self.fc2 = paddle.nn.Linear(32, 4, bias_attr=None if bias else False)

    def forward(self, x):
        with amp.auto_cast(dtype="bfloat16"):
            return self.fc2(paddle.nn.functional.relu(self.fc1(x)))


def _x():
    return paddle.to_tensor(np.random.default_rng(0).standard_normal((8, 16)).astype("f4"))


def _bf16_exact(a):
    return bool((np.ascontiguousarray(a, np.float32).view(np.uint32) & 0xFFFF == 0).all())


@pytest.mark.parametrize("full_graph", [True, False])
def test_to_static_converts_a_forward_that_opens_a_region(full_graph):
    if not full_graph and paddle.__version__.startswith("3.") and not _pir():
        pytest.skip("Paddle 3's SOT translator runs only in PIR (FLAGS_enable_pir_api=1)")
    paddle.seed(0)
    net = Net()
    x = _x()
    eager = net(x).numpy()
    static = paddle.jit.to_static(net, full_graph=full_graph)
    out = static(x)
    out.mean().backward()
    np.testing.assert_allclose(out.numpy(), eager, rtol=5e-2, atol=5e-2)
    assert net.fc1.weight.grad is not None and np.isfinite(net.fc1.weight.grad.numpy()).all()


BF16_ONLY = pytest.mark.skipif(not BF16, reason="the device truth (isa.bf16_class) says this "
                               "CPU class has no oneDNN bf16 kernel (no AVX-512 in use)")


class Plain(paddle.nn.Layer):
    """A forward that opens no region (the caller's decides)."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(16, 4, bias_attr=False)

    def forward(self, x):
        return self.fc(x)


def _grads(net, out):
    out.mean().backward()
    grads = [p.grad.numpy().copy() for p in net.parameters()]
    net.clear_gradients()
    return grads


@BF16_ONLY
@pytest.mark.parametrize("bias", [False, True])
def test_a_program_gives_eager_modes_bf16_result_and_gradients(bias):
    """The program (PIR or legacy) runs each GEMM as eager mode does: bf16 on oneDNN, handed
    back float32: the same forward and the same gradients."""
    paddle.seed(0)
    net = Net(bias=bias)
    x = _x()
    eager = net(x)
    eager_grads = _grads(net, eager)
    static = paddle.jit.to_static(net, full_graph=True)
    out = static(x)
    assert not bias or _bf16_exact(eager.numpy())
    assert _bf16_exact(out.numpy()) == _bf16_exact(eager.numpy())
    np.testing.assert_allclose(out.numpy(), eager.numpy(), rtol=1e-6, atol=1e-6)
    for got, want in zip(_grads(net, out), eager_grads):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@BF16_ONLY
def test_a_program_keeps_the_regions_bf16_decisions_and_jit_save_too(tmp_path):
    paddle.seed(0)
    net = Net(bias=False)
    x = _x()
    eager = net(x).numpy()
    assert _bf16_exact(eager)
    static = paddle.jit.to_static(
        net, input_spec=[paddle.static.InputSpec([None, 16], "float32")], full_graph=True)
    out = static(x).numpy()
    assert _bf16_exact(out)
    np.testing.assert_allclose(out, eager, rtol=1e-6, atol=1e-6)
    # kept as traced: runs as it is wherever it is loaded
    paddle.jit.save(static, os.path.join(tmp_path, "kept"), clip_extra=False)
    np.testing.assert_array_equal(paddle.jit.load(os.path.join(tmp_path, "kept"))(x).numpy(),
                                  out)
    # Paddle's default save clips the ops' extra attributes; a legacy program's bf16 GEMM
    # then needs oneDNN switched on where it is loaded (as Paddle Inference runs bf16)
    paddle.jit.save(static, os.path.join(tmp_path, "net"))
    loaded = paddle.jit.load(os.path.join(tmp_path, "net"))
    if not _pir():
        paddle.set_flags({"FLAGS_use_mkldnn": True})
    try:
        np.testing.assert_array_equal(loaded(x).numpy(), out)
    finally:
        paddle.set_flags({"FLAGS_use_mkldnn": False})


def _region(dtype):
    return amp.auto_cast(dtype=dtype, emulate=dtype == "float16")


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=BF16_ONLY)])
def test_a_program_runs_only_under_the_region_state_it_was_traced_in(dtype):
    """A function traced inside a region (the caller's) has the region's decisions, as eager
    mode there; called outside it, it runs float32 as eager mode does (Paddle's program cache
    keys no AMP state: ours is part of the key), and inside again the region's program."""
    paddle.seed(0)
    net = Plain()
    x = _x()
    plain = net(x).numpy()
    with _region(dtype):
        eager = net(x).numpy()
    assert not np.array_equal(eager, plain)
    static = paddle.jit.to_static(net, full_graph=True)
    with _region(dtype):
        inside = static(x).numpy()
    outside = static(x).numpy()
    with _region(dtype):
        again = static(x).numpy()
    np.testing.assert_allclose(inside, eager, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(outside, plain, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(again, inside)


class Aliased(paddle.nn.Layer):
    """A forward written for ``paddle.amp``, run with ``paddle.amp`` pointed at ours."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(16, 4, bias_attr=False)

    def forward(self, x):
        with paddle.amp.auto_cast(dtype="bfloat16"):
            return self.fc(x)


@BF16_ONLY
def test_a_script_that_points_paddle_amp_at_ours_gets_our_region_in_a_program():
    """Paddle's AST translator swaps ``paddle.amp.auto_cast`` for its own recorder by
    identity: with ``paddle.amp = dygraph`` (docs/dygraph.md) the program still gets ours."""
    native = paddle.amp
    paddle.amp = amp
    try:
        paddle.seed(0)
        net = Aliased()
        x = _x()
        eager = net(x).numpy()
        static = paddle.jit.to_static(net, full_graph=True)(x).numpy()
    finally:
        paddle.amp = native
    assert _bf16_exact(eager)
    np.testing.assert_allclose(static, eager, rtol=1e-6, atol=1e-6)


class Nested(paddle.nn.Layer):
    """A forward that opens a bf16 region around its second layer only."""

    def __init__(self):
        super().__init__()
        self.a = paddle.nn.Linear(16, 16, bias_attr=False)
        self.b = paddle.nn.Linear(16, 4, bias_attr=False)

    def forward(self, x):
        h = self.a(x)
        with amp.auto_cast(dtype="bfloat16"):
            return self.b(h)


@BF16_ONLY
def test_each_op_of_a_program_is_decided_by_its_innermost_region_as_in_eager_mode():
    """Called in the caller's region (fp16 emulated), the first layer is that region's and
    the second the forward's own bf16 region's, as in eager mode: the inner region's ops
    are not written again by the outer one."""
    paddle.seed(0)
    net = Nested()
    x = _x()
    with _region("float16"):
        eager = net(x).numpy()
    with amp.auto_cast(enable=False):
        plain = net(x).numpy()
    static = paddle.jit.to_static(net, full_graph=True)
    with _region("float16"):
        out = static(x).numpy()
    assert _bf16_exact(out) and not np.array_equal(eager, plain)
    np.testing.assert_allclose(out, eager, rtol=1e-6, atol=1e-6)


LEAK = r"""
import paddle
from paddle_amp import dygraph as amp
class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(16, 4)
    def forward(self, x):
        with amp.auto_cast(dtype="bfloat16"):
            return self.fc(x)
paddle.jit.to_static(Net(), full_graph=True)(paddle.ones([8, 16]))
paddle.enable_static()
print(paddle.in_dynamic_mode())
"""


def test_a_region_first_opened_in_a_trace_leaves_paddles_mode_switch_working(tmp_path):
    """The device probes of a region first opened while ``to_static`` traces (a fresh
    process: probes run once per process) switch to static mode for their block only: a
    process-wide switch from inside the trace's guards left dynamic mode on for good."""
    import subprocess
    import sys
    script = tmp_path / "trace_first.py"  # (a file: to_static reads the forward's source)
    script.write_text(LEAK)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "GLOG_minloglevel": "3"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False"


SOT_LATE = r"""
import sys
import numpy as np
import paddle
from paddle_amp import dygraph as amp
from paddle_amp.dygraph import wrappers
paddle.seed(0)
net = paddle.nn.Linear(16, 4)
x = paddle.to_tensor(np.random.default_rng(0).standard_normal((8, 16)).astype("f4"))
with amp.auto_cast(dtype="bfloat16"):
    net(x).mean().backward()
print("sot after eager steps:", "paddle.jit.sot" in sys.modules)
def forward(x):
    return net(x)
with amp.auto_cast(dtype="bfloat16"):  # SOT loads inside this region, then simulates
    late = paddle.jit.to_static(forward, full_graph=False)(x).numpy()
if "paddle.jit.sot.psdb" not in sys.modules:  # this Paddle translated it without SOT
    print("sot used: False")
    sys.exit()
def forward_again(x):
    return net(x)
with amp.auto_cast(dtype="bfloat16"):  # SOT loaded before this region: asked directly
    asked = wrappers._in_sot[0] is sys.modules["paddle.jit.sot.psdb"].in_sot
    early = paddle.jit.to_static(forward_again, full_graph=False)(x).numpy()
print("sot asked:", asked, "same result:", np.array_equal(late, early))
"""


def test_training_under_a_region_loads_no_sot_and_sot_loaded_later_is_asked(tmp_path):
    """The wrappers ask SOT whether it is simulating them only once SOT is loaded: importing
    it for the answer loaded 58 modules and ``unittest`` (about 5 MiB) into every process
    training under a region. A fresh process (SOT must not be loaded yet): eager steps leave
    it unloaded; where SOT runs (Paddle 3.x in PIR, and 2.6.2 before Python 3.12) a
    translation that loads it inside an open region runs and gives what one in a region
    opened after it loaded gives, and a region opened after asks SOT directly."""
    import subprocess
    import sys
    script = tmp_path / "sot_late.py"  # (a file: to_static reads the forward's source)
    script.write_text(SOT_LATE)
    if paddle.__version__.startswith("3.") and not _pir():
        pytest.skip("Paddle 3's SOT translator runs only in PIR (FLAGS_enable_pir_api=1)")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "GLOG_minloglevel": "3"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    eager = [line for line in lines if line.startswith("sot after eager steps:")]
    assert eager == ["sot after eager steps: False"]
    # Paddle 2.6.2 translates with the AST translator on Python 3.12 and later
    assert lines[-1] in ("sot asked: True same result: True", "sot used: False")
