"""Figure 4: casts per training step for the consistency suite's reference models, O1 fp16.

Each backend's rewrite against the native one, both planning as on a GPU
(every op has an fp16 kernel; on this CPU build both natives would otherwise
insert nothing):

  MXNet:  ``mxnet_amp``'s graph rewrite vs ``mxnet.contrib.amp.convert_symbol``
          on the same traced fp32 graph (``amp_cast``/``amp_multicast`` nodes).
  Paddle: ``paddle_amp.decorate`` vs ``paddle.static.amp.decorate`` on the same
          program (forward ``cast`` ops; each cast's gradient is its mirror),
          the native made to believe kernels exist by patching its
          unsupported-op query, ours by patching its kernel query alike.

Also the most casts any single weight gets per step (the target is 1).
Target: never more casts than the native.
"""
from __future__ import annotations

import json
import os
import sys
from unittest import mock

os.environ.setdefault("FLAGS_enable_pir_api", "0")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "consistency"))

from amp_adapters import OpLists, Policy  # noqa: E402

O1 = Policy.preset("O1")
CASTS = ("amp_cast", "amp_multicast")


def _mx_counts(sym, params) -> tuple[int, int]:
    """(cast nodes, most casts reading one parameter) in a symbol's graph."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    casts = [n for n in nodes if n["op"] in CASTS]
    per_param: dict[str, int] = {}
    for n in casts:
        for i, *_ in n["inputs"]:
            name = nodes[i]["name"]
            if name in params:
                per_param[name] = per_param.get(name, 0) + 1
    return len(casts), max(per_param.values(), default=0)


def mxnet_rows() -> list[str]:
    import mxnet as mx
    from mxnet.contrib import amp as native

    from consistency_models import MODELS, mxnet_block
    from mxnet_amp._mx import registry
    from mxnet_amp.graph import rewrite
    from amp_adapters.rules.device import DeviceProfile

    rows = []
    for name in MODELS:
        net, _ = mxnet_block(name)
        inputs, sym = net._cached_graph
        params = {p.name: "float32" for p in net.collect_params().values()}
        known = {**params, **{i.name: "float32" for i in inputs}}
        ours = rewrite(sym, known, O1, mx.cpu(), device=DeviceProfile(registry()))
        theirs = native.convert_symbol(sym, target_dtype="float16",
                                       data_names=[i.name for i in inputs])
        (n_ours, w_ours), (n_theirs, w_theirs) = _mx_counts(ours, params), \
            _mx_counts(theirs, params)
        rows.append(f"| MXNet | {name} | {n_ours} | {n_theirs} | {w_ours} | {w_theirs} |")
    return rows


def _pd_counts(main) -> tuple[int, int]:
    from paddle_amp.ir.legacy import is_forward

    params = {p.name for p in main.all_parameters()}
    casts = [op for op in main.global_block().ops if op.type == "cast" and is_forward(op)]
    per_param: dict[str, int] = {}
    for op in casts:
        src = op.input("X")[0]
        if src in params:
            per_param[src] = per_param.get(src, 0) + 1
    return len(casts), max(per_param.values(), default=0)


def paddle_rows() -> list[str]:
    import paddle
    from paddle.base import core
    from paddle.static.amp import fp16_lists

    import paddle_amp
    from amp_adapters.rules.device import DeviceProfile
    from consistency_models import MODELS, paddle_forward

    every_op = frozenset(core.get_all_op_names())
    native_believes = mock.patch.object(
        fp16_lists, "_get_sys_unsupported_list",
        lambda dtype: ("GPU", set(), every_op))
    ours_believes = mock.patch("paddle_amp.speed.device_profile",
                               lambda device, dtype, probe=None, training=True:
                               DeviceProfile(every_op))

    def build(name, decorate):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard():
            loss = paddle.mean(paddle_forward(name))
            decorate(paddle.optimizer.SGD(0.1)).minimize(loss)
        return _pd_counts(main)

    paddle.enable_static()
    rows = []
    for name in MODELS:
        with ours_believes:
            n_ours, w_ours = build(name, lambda opt: paddle_amp.decorate(opt, policy=O1))
        with native_believes:
            n_theirs, w_theirs = build(name, paddle.static.amp.decorate)
        rows.append(f"| Paddle | {name} | {n_ours} | {n_theirs} | {w_ours} | {w_theirs} |")
    # Paddle's lists do not name `rnn`, so the native keeps it fp32 where ours lowers it (and
    # casts its weights and states): the same decision, for a like-for-like count.
    same = O1.replace(paddle_ops=OpLists(fp32={"rnn"}))
    with ours_believes:
        n_ours, w_ours = build("lstm", lambda opt: paddle_amp.decorate(opt, policy=same))
    rows.append(f"| Paddle | lstm, `rnn` kept fp32 as the native does | {n_ours} | {n_theirs} | "
                f"{w_ours} | {w_theirs} |")
    paddle.disable_static()
    return rows


def run() -> str:
    return "\n".join([
        "## Figure 4: casts per training step (O1 fp16, planned as on a GPU)", "",
        "Forward casts the rewrite inserts for the consistency suite's reference models "
        "(each has a mirror in the backward pass). Target: never more than the native; each "
        "weight cast at most once per step.", "",
        "| framework | model | casts: ours | casts: native | most casts of one weight: ours "
        "| native |", "| --- | --- | --- | --- | --- | --- |",
        *mxnet_rows(), *paddle_rows()])


if __name__ == "__main__":
    print(run())
