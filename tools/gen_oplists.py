"""Regenerate amp_adapters/oplists/{mxnet,paddle}.toml from the installed frameworks.

Run once per framework upgrade (not part of the package: it imports the frameworks):

    .venv/bin/python tools/gen_oplists.py mxnet  > amp_adapters/oplists/mxnet.toml
    .venv-paddle3/bin/python tools/gen_oplists.py paddle --dump /tmp/paddle3.json
    .venv/bin/python tools/gen_oplists.py paddle --merge /tmp/paddle3.json \
        > amp_adapters/oplists/paddle.toml

(Paddle's table is the union over both supported versions; a name either
registry lacks is listed as ``unregistered``.)

The native presets (``mxnet-native``, ``paddle-native``) are the installed
natives' default lists, exactly, one section per framework version:

    .venv/bin/python tools/gen_oplists.py native --dump /tmp/n1.json
    .venv-paddle3/bin/python tools/gen_oplists.py native --dump /tmp/n2.json
    .venv/bin/python tools/gen_oplists.py native --merge /tmp/n1.json /tmp/n2.json \
        > amp_adapters/oplists/native.toml

The canonical mapping below is written by hand; every other name in the native
AMP lists is kept under its native category, so the defaults of each framework
are preserved for ops that have no shared name.
"""
import argparse
import json
import sys

# canonical op -> framework op names (hand-written; each name maps to one canonical op)
CANONICAL = {
    "mxnet": {
        "matmul": ["dot", "batch_dot", "_np_dot", "_npi_matmul", "_npx_batch_dot"],
        "linear": ["FullyConnected", "_npx_fully_connected"],
        "conv": ["Convolution", "_npx_convolution"],
        "conv_transpose": ["Deconvolution", "_npx_deconvolution"],
        "rnn": ["RNN", "_npx_rnn"],
        "einsum": ["_npi_einsum"],
        "softmax": ["softmax", "_npx_softmax", "SoftmaxActivation"],
        "log_softmax": ["log_softmax", "_npx_log_softmax"],
        "softmax_cross_entropy": ["softmax_cross_entropy", "SoftmaxOutput"],
        "layer_norm": ["LayerNorm", "_npx_layer_norm"],
        "group_norm": ["GroupNorm"],
        "instance_norm": ["InstanceNorm"],
        "batch_norm": ["BatchNorm", "_npx_batch_norm"],
        "exp": ["exp", "_npi_exp"],
        "log": ["log", "_npi_log"],
        "pow": ["_power", "broadcast_power", "_npi_power"],
        "square": ["square", "_npi_square"],
        "rsqrt": ["rsqrt"],
        "reciprocal": ["reciprocal", "_npi_reciprocal"],
        "sum": ["sum", "_np_sum"],
        "mean": ["mean", "_npi_mean"],
        "prod": ["prod", "_np_prod"],
        "norm": ["norm", "_npi_norm"],
        "cumsum": ["cumsum", "_np_cumsum"],
        "erfinv": ["erfinv", "_npx_erfinv"],
        "add": ["elemwise_add", "broadcast_add", "_npi_add"],
        "sub": ["elemwise_sub", "broadcast_sub", "_npi_subtract"],
        "mul": ["elemwise_mul", "broadcast_mul", "_npi_multiply"],
        "div": ["elemwise_div", "broadcast_div", "_npi_true_divide"],
        "maximum": ["broadcast_maximum", "_maximum", "_npi_maximum"],
        "minimum": ["broadcast_minimum", "_minimum", "_npi_minimum"],
        "add_n": ["add_n"],
        "concat": ["Concat", "_npi_concatenate"],
        "stack": ["stack", "_npi_stack"],
        "where": ["where", "_npi_where"],
        "relu": ["relu", "_npx_relu"],
        "sigmoid": ["sigmoid", "_npx_sigmoid"],
        "tanh": ["tanh", "_npi_tanh"],
        "activation": ["Activation", "_npx_activation"],
        "leaky_relu": ["LeakyReLU", "_npx_leaky_relu"],
        "dropout": ["Dropout", "_npx_dropout"],
        "pool": ["Pooling", "_npx_pooling"],
        "reshape": ["Reshape", "_np_reshape", "_npx_reshape"],
        "transpose": ["transpose", "_np_transpose"],
        "embedding": ["Embedding", "_npx_embedding"],
        "slice": ["slice", "_npi_slice"],
        "split": ["SliceChannel", "_npi_split"],
        "cast": ["Cast", "_npx_cast", "amp_cast", "amp_multicast"],
    },
    "paddle": {
        "matmul": ["matmul", "matmul_v2", "mul"],
        "linear": ["fc", "fused_gemm_epilogue", "linear_v2"],
        "conv": ["conv2d", "conv3d", "depthwise_conv2d"],
        "conv_transpose": ["conv2d_transpose", "conv3d_transpose"],
        "rnn": ["rnn"],
        "einsum": ["einsum"],
        "softmax": ["softmax"],
        "log_softmax": ["log_softmax"],
        "softmax_cross_entropy": ["softmax_with_cross_entropy", "cross_entropy", "cross_entropy2"],
        "sigmoid_cross_entropy": ["sigmoid_cross_entropy_with_logits"],
        "layer_norm": ["layer_norm"],
        "group_norm": ["group_norm"],
        "instance_norm": ["instance_norm"],
        "batch_norm": ["batch_norm"],
        "exp": ["exp"],
        "log": ["log"],
        "pow": ["pow", "elementwise_pow"],
        "square": ["square"],
        "rsqrt": ["rsqrt"],
        "reciprocal": ["reciprocal"],
        "sum": ["reduce_sum"],
        "mean": ["reduce_mean", "mean"],
        "prod": ["reduce_prod"],
        "norm": ["p_norm", "frobenius_norm"],
        "cumsum": ["cumsum"],
        "erfinv": ["erfinv"],
        "softplus": ["softplus", "soft_relu"],
        "elu": ["elu"],
        "selu": ["selu"],
        "add": ["elementwise_add"],
        "sub": ["elementwise_sub"],
        "mul": ["elementwise_mul"],
        "div": ["elementwise_div"],
        "maximum": ["elementwise_max"],
        "minimum": ["elementwise_min"],
        "add_n": ["sum"],
        "concat": ["concat"],
        "stack": ["stack"],
        "where": ["where"],
        "relu": ["relu"],
        "sigmoid": ["sigmoid"],
        "tanh": ["tanh"],
        "leaky_relu": ["leaky_relu"],
        "gelu": ["gelu"],
        "dropout": ["dropout"],
        "pool": ["pool2d", "pool3d"],
        "reshape": ["reshape2"],
        "transpose": ["transpose2"],
        "embedding": ["lookup_table_v2", "lookup_table"],
        "slice": ["slice"],
        "split": ["split"],
        "cast": ["cast"],
    },
}

# op -> (attribute, {value: canonical op}): the op is that canonical op for those values
CONDITIONAL = {
    "mxnet": {
        "Activation": ("act_type", {"softrelu": "softplus", "relu": "relu",
                                    "sigmoid": "sigmoid", "tanh": "tanh"}),
        "_npx_activation": ("act_type", {"softrelu": "softplus", "relu": "relu",
                                         "sigmoid": "sigmoid", "tanh": "tanh"}),
        "LeakyReLU": ("act_type", {"elu": "elu", "selu": "selu", "gelu": "gelu",
                                   "leaky": "leaky_relu"}),
        "_npx_leaky_relu": ("act_type", {"elu": "elu", "selu": "selu", "gelu": "gelu",
                                         "leaky": "leaky_relu"}),
    },
    "paddle": {},
}

# inputs that stay fp32 whatever the op runs in (statistics, affine parameters)
KEEP_FP32_INPUTS = {
    "mxnet": {"BatchNorm": ["gamma", "beta", "moving_mean", "moving_var"],
              "_npx_batch_norm": ["gamma", "beta", "moving_mean", "moving_var"]},
    "paddle": {"batch_norm": ["Scale", "Bias", "Mean", "Variance"],
               "layer_norm": ["Scale", "Bias"],
               "fused_bn_add_activation": ["Scale", "Bias"]},
}

# outputs that stay fp32 whatever the op runs in (running and saved statistics)
KEEP_FP32_OUTPUTS = {
    "mxnet": {},
    "paddle": {"batch_norm": ["MeanOut", "VarianceOut", "SavedMean", "SavedVariance",
                              "ReserveSpace"],
               "layer_norm": ["Mean", "Variance"],
               "fused_bn_add_activation": ["MeanOut", "VarianceOut", "SavedMean",
                                           "SavedVariance", "ReserveSpace"]},
}


def native_mxnet():
    import ctypes
    from mxnet.base import _LIB, check_call, py_str
    from mxnet.contrib.amp.lists import symbol_bf16 as b, symbol_fp16 as f
    plist, size = ctypes.POINTER(ctypes.c_char_p)(), ctypes.c_uint()
    check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(plist)))
    registry = {py_str(plist[i]) for i in range(size.value)}
    cond = lambda lst: [c[0] for c in lst]  # noqa: E731
    lists = {
        "float16": {"lower": f.FP16_FUNCS, "fp32": f.FP32_FUNCS + cond(f.CONDITIONAL_FP32_FUNCS),
                    "promote": f.WIDEST_TYPE_CASTS, "follow": f.FP16_FP32_FUNCS},
        "bfloat16": {"lower": b.BF16_FUNCS, "fp32": b.FP32_FUNCS + cond(b.CONDITIONAL_FP32_FUNCS),
                     "promote": b.WIDEST_TYPE_CASTS, "follow": b.BF16_FP32_FUNCS},
    }
    return registry, lists


def native_paddle():
    from paddle.amp import amp_lists as al
    from paddle.base import core
    from paddle.static.amp import fp16_lists as pl
    registry = set(core.get_all_op_names())
    black = sorted(al.FP16_BLACK_LIST | al.EXTRA_BLACK_LIST)
    lists = {
        "float16": {"lower": sorted(pl._get_white_list("float16")), "fp32": black,
                    "promote": sorted(pl.gray_list), "follow": []},
        "bfloat16": {"lower": sorted(pl._get_white_list("bfloat16")), "fp32": black,
                     "promote": sorted(pl.gray_list), "follow": []},
    }
    return registry, lists


def native_defaults():
    """{framework: {version: {dtype: lists}}}: every default list of each installed native."""
    out = {}
    try:
        import mxnet
        from mxnet.contrib.amp.lists import symbol_bf16 as b, symbol_fp16 as f
    except ImportError:
        pass
    else:
        def mx(low, follow, fp32, cond, widest, loss, fp32_params):
            return {"lower": sorted(low), "fp32": sorted(fp32), "promote": sorted(widest),
                    "follow": sorted(follow), "unlisted": "follow",
                    "conditional_fp32": [[o, a, list(v)] for o, a, v in cond],
                    "loss_output": sorted(loss), "fp32_params": fp32_params}
        out["mxnet"] = {mxnet.__version__: {
            "float16": mx(f.FP16_FUNCS, f.FP16_FP32_FUNCS, f.FP32_FUNCS,
                          f.CONDITIONAL_FP32_FUNCS, f.WIDEST_TYPE_CASTS,
                          f.LOSS_OUTPUT_FUNCTIONS, {}),
            "bfloat16": mx(b.BF16_FUNCS, b.BF16_FP32_FUNCS, b.FP32_FUNCS,
                           b.CONDITIONAL_FP32_FUNCS, b.WIDEST_TYPE_CASTS,
                           b.LOSS_OUTPUT_FUNCTIONS, b.BF16_USE_FP32_PARAMS)}}
    try:
        import paddle
        from paddle.static.amp import fp16_lists as pl
        from paddle.static.amp.bf16 import amp_lists as bl
    except ImportError:
        pass
    else:
        def pd(dtype):  # AutoMixedPrecisionLists(dtype=...): white, black, gray; else fp32
            return {"lower": sorted(pl._get_white_list(dtype)),
                    "fp32": sorted(pl._get_black_list()),
                    "promote": sorted(pl.gray_list), "follow": [], "unlisted": "fp32",
                    "o2_fp32": sorted(pl._get_black_list() - pl.black_list),
                    "conditional_fp32": [], "loss_output": [], "fp32_params": {}}
        bf16_lists = {"lower": sorted(bl.bf16_list), "fp32": sorted(bl.fp32_list),
                      "promote": sorted(bl.gray_list), "follow": [], "unlisted": "fp32",
                      "conditional_fp32": [], "loss_output": [], "fp32_params": {},
                      "initializers": sorted(bl.bf16_initializer_list)}
        out["paddle"] = {paddle.__version__: {"float16": pd("float16"), "bfloat16": pd("bfloat16"),
                                              "bfloat16-lists": bf16_lists}}
    return out


def native_main(dump=None, merge=()):
    """Write the native presets' data (native.toml), or dump this venv's as JSON."""
    if dump:
        json.dump(native_defaults(), open(dump, "w"))
        return
    data = {}
    for path in merge:
        for fw, versions in json.load(open(path)).items():
            data.setdefault(fw, {}).update(versions)
    out = ["# The natives' default op lists, exactly, per framework version: the data of the",
           "# presets mxnet-native and paddle-native. Generated by tools/gen_oplists.py native;",
           "# tests/core/test_native_presets.py checks it against the installed frameworks.",
           "# lower/fp32/promote/follow: MXNet FP16/FP32/WIDEST_TYPE_CASTS/FP16_FP32 lists,",
           "# Paddle white/black/gray; unlisted: the category of an op in no list (Paddle O1",
           "# runs such ops in fp32); o2_fp32: the black ops Paddle's O2 keeps in fp32 (O2 drops",
           "# the default black list). bfloat16-lists: paddle.static.amp.bf16's own lists."]
    for fw in sorted(data):
        for version in sorted(data[fw]):
            for dtype, lists in data[fw][version].items():
                out += ["", f'[{fw}."{version}".{chr(34) + dtype + chr(34)}]']
                for key in ("lower", "fp32", "promote", "follow", "o2_fp32", "initializers",
                            "loss_output"):
                    if key in lists:
                        out.append(f"{key} = {toml_list(lists[key])}")
                out.append(f'unlisted = "{lists["unlisted"]}"')
                rules = ", ".join(f'{{ op = "{o}", attr = "{a}", values = {json.dumps(v)} }}'
                                  for o, a, v in lists["conditional_fp32"])
                out.append(f"conditional_fp32 = [{rules}]")
                params = ", ".join(f'{k} = {json.dumps(v)}'
                                   for k, v in sorted(lists["fp32_params"].items()))
                out.append(f"fp32_params = {{ {params} }}" if params else "fp32_params = {}")
    print("\n".join(out) + "\n")


def toml_list(names, indent="  "):
    names = sorted(set(names))
    if not names:
        return "[]"
    return "[\n" + "".join(f'{indent}"{n}",\n' for n in names) + "]"


def main(framework, dump=None, merge=None):
    registry, native = {"mxnet": native_mxnet, "paddle": native_paddle}[framework]()
    if dump:
        json.dump({"registry": sorted(registry), "native": native}, open(dump, "w"))
        return
    if merge:
        other = json.load(open(merge))
        registry &= set(other["registry"])  # a name must exist in every supported version
        for dtype, cats in other["native"].items():
            for cat, names in cats.items():
                native[dtype][cat] = sorted(set(native[dtype][cat]) | set(names))
    canonical = CANONICAL[framework]
    mapped = {n for names in canonical.values() for n in names}
    out = [f"# {framework} op table for amp_adapters. Generated by tools/gen_oplists.py; the",
           "# canonical mapping is hand-written there, the rest is the native AMP lists.", ""]
    out.append("# canonical op -> this framework's op names")
    out.append("[canonical]")
    for c, names in canonical.items():
        out.append(f'{c} = [{", ".join(repr(n).replace(chr(39), chr(34)) for n in names)}]')
    out += ["", "# op -> the attribute whose value picks the canonical op", "[conditional]"]
    for op, (attr, values) in CONDITIONAL[framework].items():
        vals = ", ".join(f'{v} = "{c}"' for v, c in values.items())
        out.append(f'{op} = {{ attr = "{attr}", values = {{ {vals} }} }}')
    out += ["", "# inputs that are never cast (statistics, affine parameters)", "[keep_fp32_inputs]"]
    for op, slots in KEEP_FP32_INPUTS[framework].items():
        out.append(f'{op} = [{", ".join(chr(34) + s + chr(34) for s in slots)}]')
    out += ["", "# outputs that stay fp32 (running and saved statistics)", "[keep_fp32_outputs]"]
    for op, slots in KEEP_FP32_OUTPUTS[framework].items():
        out.append(f'{op} = [{", ".join(chr(34) + s + chr(34) for s in slots)}]')
    listed = set()
    for dtype, cats in native.items():
        out += ["", f"# ops with no canonical name: the native {dtype} lists", f"[native.{dtype}]"]
        taken = set(mapped)  # an op in two native lists keeps the safest: fp32 > lower > promote
        for cat in ("fp32", "lower", "promote", "follow"):
            names = [n for n in cats[cat] if n not in taken]
            taken |= set(names)
            listed |= set(names)
            out.append(f"{cat} = {toml_list(names)}")
    every = mapped | listed | set(CONDITIONAL[framework])
    missing = sorted(n for n in every if n not in registry)
    out += ["", "# names in the native lists that this CPU build's registry lacks",
            "# (GPU-only kernels, or names that are not registered ops)",
            "[unregistered]", f"names = {toml_list(missing)}", ""]
    in_lists = {n for cats in native.values() for names in cats.values() for n in names}
    unknown_mapped = sorted(n for n in mapped if n not in registry and n not in in_lists)
    if unknown_mapped:
        sys.exit(f"canonical mapping names not in the {framework} registry: {unknown_mapped}")
    print("\n".join(out))


if __name__ == "__main__":
    if sys.argv[1:2] == ["native"]:
        native = argparse.ArgumentParser()
        native.add_argument("--dump")
        native.add_argument("--merge", nargs="*", default=())
        a = native.parse_args(sys.argv[2:])
        sys.exit(native_main(a.dump, a.merge))
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=sorted(CANONICAL))
    parser.add_argument("--dump", help="write this version's registry and lists as JSON")
    parser.add_argument("--merge", help="JSON from --dump of another version to merge in")
    args = parser.parse_args()
    main(args.framework, args.dump, args.merge)
