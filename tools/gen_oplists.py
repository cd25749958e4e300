"""Regenerate amp_adapters/rules/oplists/{mxnet,paddle}.toml from the installed frameworks.

Run once per framework upgrade (not part of the package: it imports the frameworks):

    .venv/bin/python tools/gen_oplists.py mxnet  > amp_adapters/rules/oplists/mxnet.toml
    .venv-paddle3/bin/python tools/gen_oplists.py paddle --dump /tmp/paddle3.json
    .venv/bin/python tools/gen_oplists.py paddle --merge /tmp/paddle3.json \
        > amp_adapters/rules/oplists/paddle.toml

(Paddle's table is the union over both supported versions; a name either
registry lacks is listed as ``unregistered``.)

The native presets (``mxnet-native``, ``paddle-native``) are the installed
natives' default lists, exactly, one section per framework version:

    .venv/bin/python tools/gen_oplists.py native --dump /tmp/n1.json
    .venv-paddle3/bin/python tools/gen_oplists.py native --dump /tmp/n2.json
    .venv/bin/python tools/gen_oplists.py native --merge /tmp/n1.json /tmp/n2.json \
        > amp_adapters/rules/oplists/native.toml

The canonical mapping is written by hand in ``tools/op_mapping.toml`` (data, as the
categories in ``canonical.toml`` are); every other name in the native AMP lists is kept
under its native category, so the defaults of each framework are preserved for ops that
have no shared name.
"""
import argparse
import json
import sys
import tomllib
from pathlib import Path

# The hand-written part, as data: tools/op_mapping.toml (canonical op -> framework op
# names, attribute-conditional names, inputs and outputs that stay fp32).
MAPPING = tomllib.loads((Path(__file__).with_name("op_mapping.toml")).read_text("utf-8"))
CANONICAL = {fw: t["canonical"] for fw, t in MAPPING.items()}
CONDITIONAL = {fw: {op: (c["attr"], c["values"]) for op, c in t["conditional"].items()}
               for fw, t in MAPPING.items()}
KEEP_FP32_INPUTS = {fw: t["keep_fp32_inputs"] for fw, t in MAPPING.items()}
KEEP_FP32_OUTPUTS = {fw: t["keep_fp32_outputs"] for fw, t in MAPPING.items()}


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
