"""The op tables (amp_adapters/rules/oplists/*.toml) against the installed frameworks.

For each framework that is installed (each part skips with a reason if not):

- every op name a table uses (canonical mapping, conditional ops, native
  framework-only lists) is in the live operator registry, unless the table
  exempts it as ``unregistered``;
- every exemption is honest: the name is listed by the installed native AMP
  lists, or really is missing from the installed registry;
- the tables cover every op of the installed native AMP lists, and keep the
  native category of the names that have no canonical op;
- the never-cast input slots name real inputs of the op.

paddle.toml is the union over Paddle 2.6.2 and 3.3.1; run this file under both.
"""
import ctypes
import os
from dataclasses import dataclass

# Paddle 3.x defaults to PIR; choose the legacy IR before paddle is first imported
# (the registry and lists do not depend on it, but other tests in the process do).
os.environ.setdefault("FLAGS_enable_pir_api", "0")

import pytest  # noqa: E402

from amp_adapters import Policy, categorize  # noqa: E402
from amp_adapters.rules.oplists import load_table  # noqa: E402

# the generator's priority when a name is in two native lists: the safest wins
PRIORITY = ("fp32", "lower", "promote", "follow")
PRESET = {"float16": "O1", "bfloat16": "O1-bf16"}


@dataclass(frozen=True)
class Native:
    framework: str
    version: str
    registry: frozenset
    lists: dict            # dtype -> category -> frozenset of op names
    conditional_fp32: dict  # dtype -> [(op, attr, values)]

    @property
    def listed(self) -> frozenset:
        return frozenset(n for cats in self.lists.values() for ns in cats.values() for n in ns)

    def native_category(self, dtype, op):
        return next((c for c in PRIORITY if op in self.lists[dtype].get(c, ())), None)


def mxnet_registry():
    from mxnet.base import _LIB, check_call, py_str

    plist, size = ctypes.POINTER(ctypes.c_char_p)(), ctypes.c_uint()
    check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(plist)))
    return frozenset(py_str(plist[i]) for i in range(size.value))


def mxnet_op_inputs(op):
    """The tensor input names of a registered MXNet op (its NDArray-or-Symbol arguments)."""
    from mxnet.base import _LIB, OpHandle, c_str, check_call, mx_uint, py_str

    handle = OpHandle()
    check_call(_LIB.NNGetOpHandle(c_str(op), ctypes.byref(handle)))
    real_name, desc, key_var, ret = (ctypes.c_char_p() for _ in range(4))
    num = mx_uint()
    names, types, descs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    check_call(_LIB.MXSymbolGetAtomicSymbolInfo(
        handle, ctypes.byref(real_name), ctypes.byref(desc), ctypes.byref(num),
        ctypes.byref(names), ctypes.byref(types), ctypes.byref(descs),
        ctypes.byref(key_var), ctypes.byref(ret)))
    return {py_str(names[i]) for i in range(num.value)
            if py_str(types[i]).startswith(("NDArray", "Symbol"))}


@pytest.fixture(scope="module")
def mxnet_native():
    mx = pytest.importorskip("mxnet")
    from mxnet.contrib.amp.lists import symbol_bf16 as b
    from mxnet.contrib.amp.lists import symbol_fp16 as f

    def cats(low, low_fp32, m):
        return {"lower": frozenset(low),
                "fp32": frozenset(m.FP32_FUNCS) | {c[0] for c in m.CONDITIONAL_FP32_FUNCS},
                "promote": frozenset(m.WIDEST_TYPE_CASTS), "follow": frozenset(low_fp32)}
    return Native(
        "mxnet", mx.__version__, mxnet_registry(),
        {"float16": cats(f.FP16_FUNCS, f.FP16_FP32_FUNCS, f),
         "bfloat16": cats(b.BF16_FUNCS, b.BF16_FP32_FUNCS, b)},
        {"float16": list(f.CONDITIONAL_FP32_FUNCS), "bfloat16": list(b.CONDITIONAL_FP32_FUNCS)})


@pytest.fixture(scope="module")
def paddle_native():
    paddle = pytest.importorskip("paddle")
    from paddle.amp import amp_lists as al
    from paddle.base import core
    from paddle.static.amp import fp16_lists as pl

    black = frozenset(al.FP16_BLACK_LIST | al.EXTRA_BLACK_LIST)
    gray = frozenset(pl.gray_list)
    # what paddle.static.amp.AutoMixedPrecisionLists(dtype=...) starts from
    lists = {dtype: {"lower": frozenset(pl._get_white_list(dtype)), "fp32": black,
                     "promote": gray, "follow": frozenset()}
             for dtype in ("float16", "bfloat16")}
    # the dygraph-AMP lists must be covered too (lower for bf16 if nothing safer claims them)
    lists["float16"]["lower"] |= frozenset(al.FP16_WHITE_LIST)
    lists["bfloat16"]["lower"] |= frozenset(al.BF16_WHITE_LIST)
    return Native("paddle", paddle.__version__, frozenset(core.get_all_op_names()), lists,
                  {"float16": [], "bfloat16": []})


FRAMEWORKS = ["mxnet", "paddle"]


@pytest.fixture(params=FRAMEWORKS)
def native(request):
    return request.getfixturevalue(f"{request.param}_native")


def test_native_lists_are_the_ones_described(native):
    """Guards the fixtures: the lists were read, and are about the sizes the notes give."""
    assert len(native.registry) > 1000
    sizes = {d: {c: len(ns) for c, ns in cats.items()} for d, cats in native.lists.items()}
    if native.framework == "mxnet":
        assert sizes["float16"]["lower"] == 4 and sizes["float16"]["follow"] > 300, sizes
        assert sizes["bfloat16"]["fp32"] > 400, sizes
    else:
        assert sizes["float16"]["fp32"] >= 45 and sizes["float16"]["promote"] >= 40, sizes
        assert sizes["float16"]["lower"] >= 10, sizes


def test_table_names_are_registered(native):
    table = load_table(native.framework)
    assert len(table.names) > 100
    for kind, names in (("canonical mapping", set(table.canonical_of)),
                        ("conditional", set(table.conditional)),
                        *((f"native.{d}", set(cats)) for d, cats in table.native.items())):
        missing = sorted(n for n in names - table.unregistered if n not in native.registry)
        assert not missing, (
            f"{native.framework} {native.version}: {kind} names missing from the operator "
            f"registry and not exempted as unregistered: {missing}")


def test_unregistered_exemptions_are_honest(native):
    table = load_table(native.framework)
    unused = sorted(table.unregistered - table.names)
    assert not unused, f"exemptions for names the table never uses: {unused}"
    dishonest = sorted(n for n in table.unregistered
                       if n in native.registry and n not in native.listed)
    assert not dishonest, (
        f"{native.framework} {native.version}: exempted as unregistered, yet registered and in "
        f"no native AMP list: {dishonest}")


def test_mxnet_exemptions_are_not_stale(mxnet_native):
    """mxnet.toml comes from this one MXNet build: each exemption must really be missing from
    its registry, and be a name its native lists use (an exempted typo would be neither)."""
    unregistered = load_table("mxnet").unregistered
    assert unregistered
    stale = sorted(n for n in unregistered if n in mxnet_native.registry)
    assert not stale, f"registered in mxnet {mxnet_native.version}, yet exempted: {stale}"
    unlisted = sorted(unregistered - mxnet_native.listed)
    assert not unlisted, f"exempted, yet in no mxnet {mxnet_native.version} AMP list: {unlisted}"


def test_tables_cover_native_lists(native):
    table = load_table(native.framework)
    for dtype, cats in native.lists.items():
        for cat, names in cats.items():
            uncovered = sorted(names - table.names)
            assert not uncovered, (
                f"{native.framework} {native.version} native {dtype} {cat} ops missing from "
                f"the table: {uncovered}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_framework_only_names_keep_native_category(native, dtype):
    """Names without a canonical op keep the (safest) native category, in the table and the planner."""
    table = load_table(native.framework)
    policy = Policy.preset(PRESET[dtype])
    checked, wrong = 0, []
    for op in sorted(native.listed):
        if op in table.canonical_of or op in table.conditional:
            continue
        expected = native.native_category(dtype, op)
        if expected is None:
            continue
        checked += 1
        in_table = table.native[dtype].get(op)
        planned = categorize(policy, native.framework, op).category
        if (in_table, planned) != (expected, expected):
            wrong.append((op, expected, in_table, planned))
    assert checked > 20
    assert not wrong, f"(op, native, table, planner) for {native.framework} {dtype}: {wrong}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mxnet_conditional_fp32_rules_hold(mxnet_native, dtype):
    """CONDITIONAL_FP32_FUNCS (Activation softrelu; LeakyReLU elu/selu) run fp32 by default."""
    table = load_table("mxnet")
    policy = Policy.preset(PRESET[dtype])
    rules = mxnet_native.conditional_fp32[dtype]
    assert rules
    for op, attr, values in rules:
        assert table.conditional[op].attr == attr
        for value in values:
            assert categorize(policy, "mxnet", op, {attr: value}).category == "fp32", (op, value)
        # the same op with another attribute value is not forced to fp32
        assert categorize(policy, "mxnet", op, {attr: "relu" if op == "Activation" else "leaky"}
                          ).category != "fp32"


def test_keep_fp32_inputs_name_real_slots(native):
    table = load_table(native.framework)
    assert table.keep_fp32_inputs
    checked = 0
    for op, slots in table.keep_fp32_inputs.items():
        assert op in table.names, op
        if op in table.unregistered and op not in native.registry:
            continue  # no kernel on this build to ask
        if native.framework == "mxnet":
            inputs = mxnet_op_inputs(op)
        else:
            from paddle.base import framework
            inputs = {i.name for i in framework.OpProtoHolder.instance().get_op_proto(op).inputs}
        assert set(slots) <= inputs, (op, slots, sorted(inputs))
        checked += 1
    assert checked >= 2


def test_keep_fp32_outputs_name_real_slots(native):
    table = load_table(native.framework)
    checked = 0
    for op, slots in table.keep_fp32_outputs.items():
        assert op in table.names, op
        if op in table.unregistered and op not in native.registry:
            continue  # no kernel on this build to ask
        from paddle.base import framework  # only Paddle's table names outputs
        proto = framework.OpProtoHolder.instance().get_op_proto(op)
        outputs = {o.name for o in proto.outputs}
        assert set(slots) <= outputs and "Y" not in slots, (op, slots, sorted(outputs))
        checked += 1
    assert checked >= (2 if native.framework == "paddle" else 0)
