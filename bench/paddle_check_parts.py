"""Figure: where Paddle's overflow check + unscale spends its time, against a numpy read.

The gradients of the 1.05M-parameter MLP (six arrays), in the scope. Each
variant is one executor run of a program holding only the ops named, all
interleaved with numpy's ``isfinite(g).all()`` (the floor of any exact check):

  empty       one op on a [1] tensor: the executor's fixed cost per run
  check       ``check_finite_and_unscale`` over the six gradients (what paddle_amp runs)
  coalesced   the same op over one coalesced [1.05M] buffer holding all gradients
  isfinite    ``isfinite_v2`` + ``reduce_all`` over the coalesced buffer, no unscale
  scale       the unscale alone: one in-place ``scale`` pass over the coalesced buffer
"""
from __future__ import annotations

import os

import numpy as np

from bench.check_cost import _grads, _numpy_floor
from bench.timing import interleaved, ratio


def _program(build):
    import paddle

    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.base.unique_name.guard():
        build(main.global_block())
    return main, startup


def run(steps: int = 300) -> str:
    os.environ.setdefault("FLAGS_enable_pir_api", "0")
    import paddle

    grads = _grads()
    flat = np.concatenate([g.ravel() for g in grads])
    paddle.enable_static()
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())

    def gvar(name, shape):
        return paddle.static.create_global_var(list(shape), 0.0, "float32", persistable=True,
                                               name=name)

    def empty(block):
        one = gvar("one", [1])
        block.append_op(type="scale", inputs={"X": [one]}, outputs={"Out": [one]},
                        attrs={"scale": 1.0})

    def check(block, names=None):
        xs = [gvar(n, a.shape) for n, a in (names or [(f"g{i}", g) for i, g in
                                                      enumerate(grads)])]
        s = gvar("scale_v", [1])
        f = block.create_var(name="found_inf", dtype="bool", shape=[1])
        block.append_op(type="check_finite_and_unscale", inputs={"X": xs, "Scale": [s]},
                        outputs={"Out": xs, "FoundInfinite": [f]})

    def coalesced(block):
        check(block, [("flat", flat)])

    def isfinite(block):
        x = gvar("flat", flat.shape)
        each = block.create_var(name="each_finite", dtype="bool", shape=list(flat.shape))
        out = block.create_var(name="all_finite", dtype="bool", shape=[1])
        block.append_op(type="isfinite_v2", inputs={"X": [x]}, outputs={"Out": [each]})
        block.append_op(type="reduce_all", inputs={"X": [each]}, outputs={"Out": [out]},
                        attrs={"reduce_all": True, "dim": [0], "keep_dim": False})

    def scale(block):
        x = gvar("flat", flat.shape)
        block.append_op(type="scale", inputs={"X": [x]}, outputs={"Out": [x]},
                        attrs={"scale": 1.0})

    variants = {"numpy": _numpy_floor(grads)}
    with paddle.static.scope_guard(scope):
        for name, build in (("empty", empty), ("check", check), ("coalesced", coalesced),
                            ("isfinite", isfinite), ("scale", scale)):
            main, startup = _program(build)
            exe.run(startup)
            for var in main.global_block().all_parameters() or main.list_vars():
                value = {"flat": flat, "one": np.ones(1, np.float32),
                         "scale_v": np.ones(1, np.float32),
                         **{f"g{i}": g for i, g in enumerate(grads)}}.get(var.name)
                if value is not None:
                    scope.find_var(var.name).get_tensor().set(value, paddle.CPUPlace())
            variants[name] = (lambda m=main: exe.run(m))
        stats = interleaved(variants, steps=steps)
    paddle.disable_static()
    fixed = stats["empty"].median
    rows = [f"| {name} | {ratio(stats, name, 'numpy')} | "
            f"{(stats[name].median - fixed) / stats['numpy'].median:.2f}x |"
            for name in ("empty", "check", "coalesced", "isfinite", "scale")]
    return "\n".join([
        "## Figure: Paddle's check, part by part (vs a numpy read of the gradients)", "",
        f"Paddle {paddle.__version__}, CPU, the gradients of the 1.05M-parameter MLP. "
        "Each variant is one executor run of a program holding only those ops; last column: "
        "the same minus the executor's fixed cost per run (the 'empty' program).", "",
        "| variant | vs numpy read | minus the fixed cost, vs numpy |", "| --- | --- | --- |",
        *rows])


if __name__ == "__main__":
    print(run())
