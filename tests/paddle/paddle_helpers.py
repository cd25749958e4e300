"""Small models and run helpers shared by the Paddle tests."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path

import numpy as np
import paddle
import pytest


# Our own state vars: they move on every step by design; everything else persistable is
# parameters and optimizer state, which a skipped step must leave bit-identical.
AMP_STATE_PREFIXES = ("loss_scaling", "amp_")


@dataclasses.dataclass
class Static:
    main: paddle.static.Program
    startup: paddle.static.Program
    scope: paddle.static.Scope
    exe: paddle.static.Executor

    @classmethod
    def new(cls, seed: int = 7) -> "Static":
        main, startup = paddle.static.Program(), paddle.static.Program()
        main.random_seed = startup.random_seed = seed
        return cls(main, startup, paddle.static.Scope(),
                   paddle.static.Executor(paddle.CPUPlace()))

    def run(self, feed, fetch_list=()):
        return self.exe.run(self.main, feed=feed, fetch_list=list(fetch_list))

    def state(self) -> dict[str, np.ndarray]:
        """Every persistable tensor of the main program except the AMP state: params + optimizer."""
        if is_pir(self.main):
            return {name: np.array(t).copy() for name, t in
                    self.main.state_dict("all", self.scope).items()
                    if not name.startswith(AMP_STATE_PREFIXES)}
        out = {}
        for var in self.main.list_vars():
            if (var.persistable and var.type == paddle.base.core.VarDesc.VarType.LOD_TENSOR
                    and not var.name.startswith(AMP_STATE_PREFIXES)):
                found = self.scope.find_var(var.name)
                if found is not None and found.get_tensor()._is_initialized():
                    out[var.name] = np.array(found.get_tensor()).copy()
        return out


def mlp(in_dim: int = 8, hidden: int = 16, out_dim: int = 1, loss_factor: float = 1.0,
        names: str = ""):
    """x -> fc(relu) -> fc -> mean squared error (times ``loss_factor``). Returns (x, y, loss).

    ``names``: a prefix that names the parameters explicitly (a checkpoint loaded in another
    process needs the same names; under PIR generated parameter names depend on what the
    process built before)."""
    def attrs(i):
        if not names:
            return {}
        return dict(weight_attr=paddle.ParamAttr(name=f"{names}{i}.w"),
                    bias_attr=paddle.ParamAttr(name=f"{names}{i}.b"))
    x = paddle.static.data("x", [None, in_dim], "float32")
    y = paddle.static.data("y", [None, out_dim], "float32")
    h = paddle.static.nn.fc(x, hidden, activation="relu", **attrs(0))
    out = paddle.static.nn.fc(h, out_dim, **attrs(1))
    diff = out - y
    loss = paddle.mean(diff * diff)
    if loss_factor != 1.0:
        loss = paddle.scale(loss, loss_factor)
    return x, y, loss


def batch(step: int, in_dim: int = 8, out_dim: int = 1, n: int = 4, overflow: bool = False):
    """Deterministic data for ``step``; ``overflow`` puts an inf in the input."""
    rng = np.random.RandomState(step)
    x = rng.rand(n, in_dim).astype("float32")
    if overflow:
        x[0, 0] = np.inf
    return {"x": x, "y": rng.rand(n, out_dim).astype("float32")}


def is_pir(program) -> bool:
    """True for a PIR program (Paddle 3's default IR)."""
    from paddle_amp.ir import kind as program_ir
    return program_ir(program) == "pir"


def pir_mode() -> bool:
    """True when the suite builds PIR programs (AMP_TEST_IR=pir, read by conftest.py)."""
    return os.environ.get("AMP_TEST_IR", "legacy") == "pir"


def op_names(program) -> set[str]:
    """The (legacy) names of the ops in ``program``'s global block, on either IR."""
    if is_pir(program):
        from paddle_amp.ir.pir.opnames import legacy_name
        return {legacy_name(op.name()) for op in program.global_block().ops}
    return {op.type for op in program.global_block().ops}


def pir_ops(program, legacy_type: str) -> list:
    """The ops of ``program``'s global block whose legacy name is ``legacy_type`` (PIR)."""
    from paddle_amp.ir.pir.opnames import legacy_name
    return [op for op in program.global_block().ops if legacy_name(op.name()) == legacy_type]


def forward_ops(program, op_type: str):
    """The forward ops of ``op_type`` in ``program``'s global block."""
    from paddle_amp.ir.legacy import is_forward
    return [op for op in program.global_block().ops if op.type == op_type and is_forward(op)]


RESUME_STEPS = 10
RESUME_OVERFLOWS = (2, 5, 6)


def resume_build(paddle_amp):
    """The checkpoint model: MLP + Adam, a scale that grows every 2 clean steps."""
    _, _, loss = mlp(names="resume_fc")
    opt = paddle_amp.decorate(paddle.optimizer.Adam(0.01), init_loss_scaling=8.0,
                              incr_every_n_steps=2, decr_every_n_nan_or_inf=1)
    opt.minimize(loss)
    return opt


def resume_run(env: Static, opt, steps) -> list[dict]:
    """Run ``steps``; the loss-scale state after each."""
    out = []
    for step in steps:
        env.run(batch(step, overflow=step in RESUME_OVERFLOWS))
        out.append(opt.state_dict())
    return out


def white_list_model():
    """fc -> scale -> concat -> fc: scale and concat have CPU fp16 kernels, matmul (mul) has none."""
    x = paddle.static.data("x", [None, 8], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    h = paddle.static.nn.fc(x, 16, activation="relu")
    s = paddle.scale(h, 0.5)
    c = paddle.concat([s, paddle.scale(h, 2.0)], axis=1)
    out = paddle.static.nn.fc(c, 1)
    diff = out - y
    return paddle.mean(diff * diff)


@pytest.fixture
def static_in_own_scope():
    """Static mode and a scope of the test's own (its programs build their own guards)."""
    paddle.enable_static()
    with paddle.static.scope_guard(paddle.static.Scope()):
        yield
    paddle.disable_static()


def native_surface():
    """tests/native_surface.py (``missing``, ``signature_gaps``, ``method_gaps``), loaded by
    path: putting tests/ on sys.path would make tests/mxnet importable as "mxnet" where
    MXNet is not installed."""
    spec = importlib.util.spec_from_file_location(
        "native_surface", Path(__file__).resolve().parents[1] / "native_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
