"""A low-precision array copied into a float32 one (``astype("float32")``, ``copyto``) is one
cast written into the destination, not a float32 cast of the array followed by a copy (issue
40, point 3: the second float32 copy cost a CNN's O1-bf16 step one float32 activation under
MXNet's threaded engine). Counted from the ops MXNet runs (its profiler's operator table) and
the shapes they write, never from measured memory."""
import os
import re

import numpy as np
import pytest
import mxnet as mx
from mxnet import autograd, gluon, nd

import mxnet_amp as amp
from amp_adapters.rules.isa import bf16_class, machine
from mxnet_amp._mx import mx_dtype

SHAPE = (4, 8, 6, 6)
_ROW = re.compile(r"^(\S+)\s+(\d+)\s+[-\d.]+", re.M)


def ops_run(fn, tmp_path):
    """{operator: times run} while ``fn()`` runs (MXNet's profiler, imperative ops)."""
    nd.waitall()
    mx.profiler.set_config(profile_imperative=True, aggregate_stats=True,
                           filename=os.path.join(tmp_path, "trace.json"))
    mx.profiler.dumps(reset=True)
    mx.profiler.set_state("run")
    try:
        out = fn()
        nd.waitall()
    finally:
        mx.profiler.set_state("stop")
    stats = mx.profiler.dumps(reset=True)
    table = stats.split("\noperator\n", 1)[1] if "\noperator\n" in stats else ""
    return out, {m.group(1): int(m.group(2)) for m in _ROW.finditer(table)
                 if m.group(1) not in ("Name", "----")}


@pytest.mark.parametrize("low,init", [("bfloat16", {"policy": "O1-bf16"}),
                                      ("float16", {"policy": "O1"}),
                                      ("bfloat16", {"target_dtype": "bfloat16"})])  # native's
def test_a_low_array_copied_to_float32_is_one_cast_into_the_result(tmp_path, low, init):
    x = nd.random.uniform(shape=SHAPE)
    lowered = nd.amp_cast(x, dtype=mx_dtype(low))
    want = nd.amp_cast(lowered, dtype="float32").asnumpy()
    amp.init(**init)
    y, ops = ops_run(lambda: lowered.astype("float32"), tmp_path)
    assert ops == {"amp_cast": 1}, ops  # before: amp_cast (a float32 temporary), CopyCPU2CPU
    assert y.dtype == np.float32 and y.shape == SHAPE
    np.testing.assert_array_equal(y.asnumpy(), want)  # widening is exact


def test_the_cast_into_the_result_is_differentiable():
    amp.init(policy="O1-bf16")
    w = nd.random.uniform(shape=SHAPE)
    w.attach_grad()
    with autograd.record():
        y = nd.amp_cast(w, dtype=mx_dtype("bfloat16")).astype("float32")
        (y * 3).sum().backward()
    np.testing.assert_array_equal(w.grad.asnumpy(), np.full(SHAPE, 3, np.float32))


def test_other_copies_are_mxnets_and_reset_restores_copyto(tmp_path):
    original = nd._internal._copyto
    amp.init(policy="O1-bf16")
    x = nd.random.uniform(shape=SHAPE)
    _, ops = ops_run(lambda: x.astype("float32"), tmp_path)  # same dtype: MXNet's copy
    assert ops == {"CopyCPU2CPU": 1}, ops
    h = nd.amp_cast(x, dtype=mx_dtype("bfloat16"))
    np.testing.assert_array_equal(h.astype("float16").asnumpy(),  # low to low: through float32
                                  nd.amp_cast(h, dtype="float32").asnumpy().astype(np.float16))
    amp.reset()
    assert nd._internal._copyto is original


@pytest.mark.skipif(bf16_class(machine()) != "native",
                    reason="a bf16 convolution's output in oneDNN's layout needs bf16 kernels")
def test_a_bf16_convolutions_output_copies_to_float32(tmp_path):
    """MXNet's own _copyto cannot read a bf16 array in oneDNN's layout across dtypes."""
    amp.init(policy="O1-bf16")
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, padding=1, activation="relu"))
    net.initialize()
    net.hybridize()
    x = nd.random.uniform(shape=SHAPE)
    with autograd.record():
        out = net(x)
        assert out.dtype == mx_dtype("bfloat16")
        y = out.astype("float32")
        y.mean().backward()
    np.testing.assert_array_equal(y.asnumpy(), nd.amp_cast(out, dtype="float32").asnumpy())
    assert np.isfinite(net[0].weight.grad().asnumpy()).all()
