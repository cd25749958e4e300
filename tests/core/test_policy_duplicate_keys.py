"""A key given twice in a policy file: the error names the file, the key's full path and the
line of each giving, wherever tomllib noticed it (end of a multi-line value, end of document)."""
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_adapters import AmpConfigError, Policy


def _error(tmp_path, text: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(AmpConfigError) as info:
        Policy.from_file(path)
    msg = str(info.value)
    assert msg.startswith(f"policy file {str(path)!r}, line "), msg
    return msg


# (file, the key named, line of the first giving, line of the second)
CASES = [
    # no final newline: tomllib says "at end of document", no line at all (before: no key)
    ("dtype = 'float16'\ndtype = 'bfloat16'", "dtype", 1, 2),
    # a value over several lines: tomllib reports the line of its end (before: line 7)
    ("[ops.mxnet]\nconditional_fp32 = [\n  {op = 'LeakyReLU', attr = 'act_type', "
     "values = ['gelu']},\n]\nfp32 = []\nconditional_fp32 = [\n  {op = 'x', attr = 'y', "
     "values = ['z']},\n]\n", "ops.mxnet.conditional_fp32", 2, 6),
    # a key inside a table: its full path, not 'lower' (which of [ops], [ops.mxnet]?)
    ("[ops]\nlower = ['softmax']\n[ops.mxnet]\nlower = []\n[ops]\n", "ops", 1, 5),
    ("[ops]\nlower = ['softmax']\nfp32 = []\nlower = ['gelu']\n", "ops.lower", 2, 4),
    ("ops.lower = []\n[ops]\nfp32 = []\n", "ops", 1, 2),
    ("ops = {lower = []}\nops.fp32 = []", "ops.fp32", 1, 2),
    ("[ops.mxnet]\nlower = []\n[ops]\nmxnet = {}\n", "ops.mxnet", 1, 4),
    # a multi-line string holding what looks like a key: not a statement
    ("dtype = '''\ndtype = 1\n'''\nlevel = 'O1'\ndtype = 'x'\n", "dtype", 1, 5),
    ("\"level\" = 'O1'\nlevel = 'O2'\n", "level", 1, 2),
    # [ops.mxnet] before [ops] is allowed: the second [ops] is the duplicate of the first
    ("[ops.mxnet]\nlower = []\n[ops]\nfp32 = []\n[ops]\n", "ops", 3, 5),
]


@pytest.mark.parametrize("text, key, first, second", CASES)
def test_duplicate_key_names_file_key_and_both_lines(tmp_path, text, key, first, second):
    msg = _error(tmp_path, text)
    assert f", line {second}: the key {key!r} is given twice" in msg, msg
    assert f"first on line {first} " in msg and f"again on line {second} " in msg, msg


def test_duplicate_inside_an_inline_table_names_the_table(tmp_path):
    msg = _error(tmp_path, "level = 'O1'\nops = {lower = [], lower = ['softmax']}\n")
    assert re.search(r"line 2: the key 'lower' is given twice \(in the inline table of 'ops'",
                     msg), msg


# -- property: any key given again anywhere later in its table is reported with its line ----

KEYS = st.sampled_from(["dtype", "level", "lower", "fp32", "init_scale", "a-b", "k_1"])
TABLES = st.sampled_from(["ops", "ops.mxnet", "loss_scale", "x.y.z"])
WORD = st.text(st.sampled_from("ab =[]#.{}'\\\"1"), max_size=8)


@st.composite
def values(draw):
    """The source lines of a TOML value: scalars, strings holding '=' or '[t]', arrays and
    multi-line strings spread over several lines."""
    kind = draw(st.sampled_from(["int", "str", "array", "mlstr", "inline"]))
    if kind == "int":
        return [str(draw(st.integers(-10, 10**6)))]
    if kind == "str":
        return [json.dumps(draw(WORD))]
    if kind == "inline":
        return ["{ op = " + json.dumps(draw(WORD)) + ", n = 1 }"]
    if kind == "mlstr":
        body = draw(st.lists(st.sampled_from(["k = 1", "[ops]", "dtype = 'x'", "", "#"]),
                             max_size=3))
        return ["'''"] + body + ["'''"]
    items = draw(st.lists(WORD.map(json.dumps), max_size=3))
    return ["["] + [f"  {it}," for it in items] + ["]"]


@st.composite
def files_with_a_duplicate(draw):
    """(file text, the duplicated key's full path, line of the first giving, of the second)."""
    sections = draw(st.lists(st.tuples(TABLES, st.lists(KEYS, min_size=1, max_size=4,
                                                        unique=True)),
                             min_size=1, max_size=4, unique_by=lambda s: s[0]))
    root = draw(st.lists(KEYS, max_size=3, unique=True))
    # the key to give twice: a root key or a key of one table; its second giving goes at a
    # random later place in the same table
    owners = ([(None, k) for k in root] + [(t, k) for t, ks in sections for k in ks])
    table, key = draw(st.sampled_from(owners))
    header_twice = table is not None and draw(st.booleans())  # or its table's header
    lines: list[str] = []
    first = second = current = header = None

    def put(k):
        nonlocal first, second
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "# a comment", "  # dtype = 1"])))
        v = draw(values())
        if k == key and first is not None and second is None:
            second = len(lines) + 1
        elif k == key and first is None and current == table:
            first = len(lines) + 1
        lines.append(f"{k} = {v[0]}" + (draw(st.sampled_from(["", "  # note"]))
                                         if len(v) == 1 else ""))
        lines.extend(v[1:])

    for t, ks in [(None, root)] + sections:
        current = t
        if t is not None:
            lines.append(f"[{t}]")
            header = len(lines) if t == table else header
        ks = list(ks)
        if t == table and not header_twice:
            ks.insert(draw(st.integers(ks.index(key) + 1, len(ks))), key)
        for k in ks:
            put(k)
    if header_twice:  # the table's header again, at the end
        key, first, second = "", header, len(lines) + 1
        lines.append(f"[{table}]")
    text = "\n".join(lines) + draw(st.sampled_from(["\n", ""]))  # no final newline: tomllib
    full = ".".join(p for p in (table, key) if p)                 # says "at end of document"
    return text, full, first, second


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(files_with_a_duplicate())
def test_any_duplicated_key_is_reported_with_its_line(tmp_path, case):
    text, key, first, second = case
    msg = _error(tmp_path, text)
    assert f", line {second}: the key {key!r} is given twice" in msg, (text, msg)
    assert f"first on line {first} " in msg, (text, msg)
