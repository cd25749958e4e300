"""Where the shared O1 and a native default disagree: every op, both categories, and why.

Generated from the data (``canonical.toml``, the framework tables, ``native.toml`` and,
for Paddle's dynamic graph, ``paddle_dygraph.toml``'s copy of ``paddle.amp``'s lists), so
the table in docs/migrating.md stays true: ``amp-adapters diff``. ``paddle-dygraph`` is
Paddle's ops under ``paddle.amp``'s own lists (what ``paddle_amp.dygraph`` decides without
``policy=``): a white and a black list, every other op promoting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..rules.oplists import NativeLists, dygraph_native_lists, load_table, native_lists
from ..rules.planner import categorize
from ..rules.policy import OpLists, Policy

DYGRAPH = "paddle-dygraph"  # Paddle's ops under paddle.amp's (dynamic-graph) lists
DIFF_FRAMEWORKS = ("mxnet", "paddle", DYGRAPH)

# why the shared O1 puts a canonical op where it does (modelled on torch.autocast's lists)
_SHARED_WHY = {
    "lower": "a GEMM/conv-like op: fast and numerically safe in low precision",
    "fp32": "needs fp32's range or precision (exp/log, reductions, norms, softmax, losses)",
    "promote": "a multi-input op: runs in its widest input, whatever the order",
    "follow": "no numerical effect of its own: runs in its inputs' dtype",
}
_NATIVE_LIST = {"mxnet": {"lower": "FP16_FUNCS", "fp32": "FP32_FUNCS",
                          "promote": "WIDEST_TYPE_CASTS", "follow": "FP16_FP32_FUNCS"},
                "paddle": {"lower": "white list", "fp32": "black list", "promote": "gray list"},
                DYGRAPH: {"lower": "paddle.amp white list", "fp32": "paddle.amp black list"}}
_UNLISTED = {"mxnet": "in no MXNet list: not wrapped, runs in its inputs' dtype",
             "paddle": "in no Paddle list: Paddle's O1 runs it in fp32",
             DYGRAPH: "in no paddle.amp list: promotes (float32 if any floating input is "
                      "float32, else the low dtype)"}
_GRAY = " (natively the last input examined decides)"


def _native_why(framework: str, op: str, lists) -> str:
    cat = lists.category(op)
    if cat is None:
        return _UNLISTED[framework]
    name = _NATIVE_LIST[framework].get(cat, cat)
    if framework == DYGRAPH:
        return f"Paddle {lists.version} {name}"
    return f"{framework} {lists.version} {name}" + (_GRAY if framework == "paddle" and
                                                    cat == "promote" else "")


@dataclass(frozen=True)
class Difference:
    op: str
    canonical: Optional[str]
    native: str
    shared: str
    why: str


def _native(framework: str, dtype: str, version: Optional[str]) -> tuple[Policy, NativeLists]:
    """(the native's policy, its lists) for ``framework`` (one of ``DIFF_FRAMEWORKS``)."""
    if framework == DYGRAPH:  # as paddle_amp.dygraph without policy= (config._native)
        lists = dygraph_native_lists(dtype, version)
        return Policy(dtype=dtype, level="O1", unlisted="promote", defaults="native",
                      paddle_ops=OpLists(lower=lists.lower, fp32=lists.fp32,
                                         replace=True)), lists
    return (Policy.preset(f"{framework}-native", dtype=dtype, native_version=version),
            native_lists(framework, dtype, version))


def differences(framework: str, dtype: str = "float16", version: Optional[str] = None,
                shared: Optional[Policy] = None) -> list[Difference]:
    """Every op of ``framework`` (``paddle-dygraph``: Paddle's, under ``paddle.amp``'s lists)
    whose category under ``shared`` (default: the O1 preset for ``dtype``) differs from the
    native's default lists (``version``: default installed)."""
    shared = shared or Policy.preset("O1", dtype=dtype)
    native, lists = _native(framework, shared.dtype, version)
    ops = "paddle" if framework == DYGRAPH else framework  # whose op names
    table = load_table(ops)
    out = []
    for op in sorted(lists.names | table.names):
        a, b = categorize(native, ops, op), categorize(shared, ops, op)
        if a.category == b.category:
            continue
        if b.canonical is not None:
            why = f"O1: {_SHARED_WHY[b.category]}"
        else:
            why = "O1: no canonical name; its table takes the category another supported " \
                  "version's native list gives it"
        out.append(Difference(op, b.canonical, a.category, b.category,
                              f"{why}. Native: {_native_why(framework, op, lists)}"))
    return out


def markdown(framework: str, dtype: str = "float16", version: Optional[str] = None) -> str:
    """The differences as a markdown table, with the native version in the heading."""
    version = _native(framework, dtype, version)[1].version
    rows = differences(framework, dtype, version)
    native = "paddle.amp" if framework == DYGRAPH else f"{framework}-native"
    every_other = {"mxnet": "", "paddle": " Every other Paddle op (in no list) runs in fp32 "
                   "natively and follows its inputs under O1.",
                   DYGRAPH: " Every other op (in no paddle.amp list) promotes natively and "
                   "follows its inputs under O1; ops are named as in a program (`matmul_v2`: "
                   "eager mode's `matmul`)."}[framework]
    lines = [f"**{framework} {version}, {dtype}**: {len(rows)} ops differ between "
             f"`{native}` and `O1`.{every_other}", "",
             f"| op | canonical | {native} | O1 | why |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{d.op}` | {d.canonical or '-'} | {d.native} | {d.shared} | {d.why} |"
              for d in rows]
    return "\n".join(lines)
