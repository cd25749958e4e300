"""Forward programs, the rewrites applied to them, and a program's op-for-op signature.

Used by the one-pass rewrite test: ``signatures()`` of the current rewrite must equal
the golden file written from the insert-one-cast-at-a-time rewrite it replaced
(``python tests/paddle/rewrite_models.py`` rewrites the golden file).
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("FLAGS_enable_pir_api", "0")

import paddle  # noqa: E402

from amp_adapters import Policy  # noqa: E402
import paddle_amp  # noqa: E402
from amp_adapters.rules.device import DeviceProfile
from paddle_amp.rewrite import Rewriter  # noqa: E402

# one golden file per Paddle major version (3.x's legacy IR builds some ops differently)
GOLDEN = os.path.join(os.path.dirname(__file__), "data",
                      f"rewrite_golden_paddle{paddle.__version__.split('.')[0]}.json")


def _mlp():
    x = paddle.static.data("x", [None, 8], "float32")
    h = paddle.static.nn.fc(x, 16, activation="relu")
    out = paddle.static.nn.fc(h, 4)
    paddle.mean(paddle.nn.functional.softmax(out) + out)


def _dense_ln(layers=3):
    h = x = paddle.static.data("x", [None, 16], "float32")
    for _ in range(layers):
        h = paddle.static.nn.fc(h, 16)
        h = paddle.nn.functional.layer_norm(h, 16)
    paddle.mean(h - x)


def _conv_bn():
    x = paddle.static.data("img", [None, 3, 8, 8], "float32")
    h = paddle.static.nn.conv2d(x, 4, 3)
    h = paddle.static.nn.batch_norm(h, act="relu")
    h = paddle.static.nn.conv2d(h, 4, 3)
    paddle.mean(h)


def _cond():
    x = paddle.static.data("x", [None, 8], "float32")
    h = paddle.static.nn.fc(x, 8)
    flag = paddle.mean(h) > 0
    out = paddle.static.nn.cond(flag, lambda: paddle.scale(h, 2.0), lambda: h * h)
    paddle.mean(paddle.static.nn.fc(out, 4))


def _guarded():
    x = paddle.static.data("x", [None, 8], "float32")
    with paddle_amp.fp16_guard():
        h = paddle.static.nn.fc(x, 8)
    paddle.mean(paddle.static.nn.fc(h, 4))


MODELS = {"mlp": _mlp, "dense_ln": _dense_ln, "conv_bn": _conv_bn, "cond": _cond,
          "guarded": _guarded}
O1, O2 = Policy.preset("O1"), Policy.preset("O2")
EMU = Policy.preset("O1", emulate=True)
NONE: frozenset = frozenset()
# name -> (model, policy, kernels, use_guard)
CASES = {
    "mlp-gpu": ("mlp", O1, None, False),
    "mlp-emulated": ("mlp", EMU, NONE, False),
    "mlp-O2": ("mlp", O2, None, False),
    "dense_ln-gpu": ("dense_ln", O1, None, False),
    "dense_ln-emulated": ("dense_ln", EMU, NONE, False),
    "dense_ln-O2-emulated": ("dense_ln", O2.replace(emulate=True), NONE, False),
    "conv_bn-gpu": ("conv_bn", O1, None, False),
    "conv_bn-emulated": ("conv_bn", EMU, NONE, False),
    "cond-gpu": ("cond", O1, None, False),
    "cond-emulated": ("cond", EMU, NONE, False),
    "guarded-O2": ("guarded", O2, None, True),
}
if not paddle.__version__.startswith("2."):  # 3.x: static.nn.cond rejects legacy-IR Variables
    CASES = {k: v for k, v in CASES.items() if not k.startswith("cond")}


def signature(program) -> list:
    """Every op of every block: type, inputs, outputs, cast dtypes; and every var's dtype."""
    out = []
    for block in program.blocks:
        ops = []
        for op in block.ops:
            attrs = {a: str(op.attr(a)) for a in ("in_dtype", "out_dtype") if op.has_attr(a)}
            ops.append([op.type, {s: op.input(s) for s in op.input_names},
                        {s: op.output(s) for s in op.output_names}, attrs])
        dtypes = {name: str(v.dtype) for name, v in sorted(block.vars.items())
                  if v.type == paddle.base.core.VarDesc.VarType.LOD_TENSOR}
        out.append({"ops": ops, "dtypes": dtypes})
    return out


def rewritten(case: str):
    model, policy, kernels, guard = CASES[case]
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.base.unique_name.guard():
        MODELS[model]()
        rewriter = Rewriter(policy, DeviceProfile(kernels), use_guard=guard)
        report = rewriter.rewrite(main)
    return main, report


def signatures() -> dict:
    return {case: signature(rewritten(case)[0]) for case in CASES}


if __name__ == "__main__":
    paddle.enable_static()
    with open(GOLDEN, "w") as f:
        json.dump(signatures(), f, indent=0, sort_keys=True)
    print(f"wrote {GOLDEN}", file=sys.stderr)
