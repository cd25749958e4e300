"""policy="auto" on MXNet takes the low dtype of the device MXNet names: ``init`` a GPU if
MXNet sees one, ``convert_*`` the ``ctx`` (the block's own), ``cast_report`` the block's
context. On this CPU each real call runs bf16; a ``mx.gpu(0)`` context (an object: asking
its type needs no GPU) resolves to fp16 (the rule only: no GPU runs it here)."""
import json

import mxnet as mx
import pytest
from mxnet import gluon

import mxnet_amp as amp
from amp_adapters import Policy
from amp_adapters.rules.device import Cost
from amp_adapters.services.speedbook import SpeedBook
from mxnet_amp.config import device_type, init_policy
from mxnet_amp.kernels import has_kernel
from amp_adapters.services import speed_source
from mxnet_amp.speed import source

no_gpu = pytest.mark.skipif(mx.context.num_gpus() > 0,
                            reason="MXNet sees a GPU here: auto runs float16 on it")
needs_bf16 = pytest.mark.skipif(
    not has_kernel("FullyConnected", mx.cpu(), "bfloat16"),
    reason="no bfloat16 FullyConnected kernel on this CPU (oneDNN runs bf16 with AVX-512): "
    "the probe says so")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AMP_ADAPTERS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AMP_ADAPTERS_REFRESH", raising=False)


def faster(op, shape, training):
    """Every op measured twice as fast in bf16: the plan shows the dtype auto chose."""
    return Cost(forward=0.5, train=0.5)


def _net():
    net = gluon.nn.HybridSequential(prefix="auto_")  # named: Gluon's global counter, which
    net.add(gluon.nn.Dense(8, in_units=4, prefix="auto_fc_"))  # other tests' names use, stays
    net.initialize(ctx=mx.cpu())
    net.hybridize()
    net(mx.nd.ones((2, 4)))
    return net


@no_gpu
def test_init_auto_runs_bfloat16_on_this_cpu():
    """``mx.context.num_gpus()`` is 0 here: init's device is the CPU, so auto is bf16."""
    assert device_type() == "cpu"
    chosen = amp.init(policy="auto")
    assert chosen.dtype == "bfloat16" and chosen == Policy.preset("auto", device_type="cpu")


def test_a_context_decides_autos_dtype():
    assert device_type(mx.gpu(0)) == "gpu"
    assert init_policy(policy="auto", ctx=mx.gpu(0)).dtype == "float16"
    assert init_policy(policy="auto", ctx=mx.cpu()).dtype == "bfloat16"
    # an explicit dtype wins over the device
    assert init_policy(policy=Policy.preset("auto", dtype="bfloat16"),
                       ctx=mx.gpu(0)).dtype == "bfloat16"
    assert init_policy(policy="O1-bf16", ctx=mx.gpu(0)).dtype == "bfloat16"


@needs_bf16
def test_convert_auto_runs_bfloat16_for_a_cpu_context():
    """convert_symbol with ctx=cpu and convert_hybrid_block on a CPU block: the casts the
    real rewrite inserts are bfloat16 (every op measured faster: the book is data)."""
    auto = Policy.preset("auto", device_type="cpu")
    speed_source.install(source(mx.cpu(), auto.dtype),
                         SpeedBook("mxnet", mx.__version__, "bfloat16", faster), auto.profile)
    data = mx.sym.var("data")
    sym = mx.sym.FullyConnected(data, num_hidden=8, name="fc")
    out = amp.convert_symbol(sym, policy="auto", ctx=mx.cpu(), input_shapes={"data": (2, 4)})
    casts = {n["attrs"]["dtype"] for n in json.loads(out.tojson(remove_amp_cast=False))["nodes"]
             if n["op"] == "amp_cast"}
    assert casts == {"bfloat16", "float32"}, casts  # in to bf16, the output back to fp32
    block = amp.convert_hybrid_block(_net(), policy="auto")  # the block's context: a CPU
    assert [d.run_dtype for d in amp.cast_report(block, policy="auto").decisions
            if d.op == "FullyConnected"] == ["bfloat16"]
