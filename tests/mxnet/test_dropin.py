"""Drop-in: a script using mxnet.contrib.amp's names runs with only the import changed."""
import json
import pathlib

import mxnet as mx

import mxnet_amp as amp

SCRIPT = pathlib.Path(__file__).with_name("native_style_train.py")
NATIVE_IMPORT = "from mxnet.contrib import amp\n"


def test_native_script_runs_with_only_the_import_changed():
    source = SCRIPT.read_text()
    assert source.count(NATIVE_IMPORT) == 1
    namespace = {"__name__": "native_style_train"}
    exec(compile(source.replace(NATIVE_IMPORT, "import mxnet_amp as amp\n"), str(SCRIPT), "exec"),
         namespace)
    assert len(namespace["RESULT"]) == 10
    assert amp.active_policy() is not None  # the script's init() went through mxnet_amp


def test_convert_hybrid_block_defaults_to_the_blocks_context():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, activation="softrelu"), mx.gluon.nn.Dense(2))
    net.initialize(ctx=mx.cpu(1))
    net.hybridize()
    x = mx.nd.ones((2, 3), ctx=mx.cpu(1))
    reference = net(x)
    converted = amp.convert_hybrid_block(net, emulate=True)  # no ctx: the block's own
    assert all(p.list_ctx() == [mx.cpu(1)] for p in converted.collect_params().values())
    out = converted(x)
    assert out.context == mx.cpu(1)
    mx.test_utils.assert_almost_equal(out, reference, rtol=1e-2, atol=1e-3)
    graph = json.loads(converted._cached_graph[1].tojson(remove_amp_cast=False))
    assert "amp_cast" in [n["op"] for n in graph["nodes"]]
