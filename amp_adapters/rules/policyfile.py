"""Reading and checking a policy file's structure, before any policy object is built.

``read_toml`` turns a file into a dict or an ``AmpConfigError`` naming the file
(missing, a directory, not UTF-8, a byte-order mark, bad TOML, a key given
twice). ``check_policy_dict`` walks the dict once and raises an
``AmpConfigError`` naming the source, the key path (``ops.mxnet.fp32[1]``) and
the offending value for every wrong type, unknown key (with close matches),
unknown choice and out-of-range number; what it returns has only the documented
keys with values of the documented types, so building the ``Policy`` from it
cannot fail half-way. Pure data: no framework, no policy object.
"""
from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping, Optional

from .device import SPEEDS
from .configcheck import check_keys, check_name_list, check_table, did_you_mean, fail
from .dtypes import dtype_name
from .errors import AmpConfigError
from .layers import LAYER_CATEGORIES, check_layer_lists
from .loss_scale.config import KINDS
from .loss_scale.state import FIELDS
from .oplists import CATEGORIES, FRAMEWORKS, canonical_ops, load_table
from .toml_duplicates import find_duplicate

TOP_KEYS = ("preset", "dtype", "level", "emulate", "speed", "profile", "unlisted",
            "use_promote", "native_version", "ops", "layers", "loss_scale")
OPS_KEYS = (*CATEGORIES, "conditional_fp32", "replace")
RULE_KEYS = ("op", "attr", "values")
LOSS_SCALE_KINDS = KINDS
# Loss-scale fields that are state (counters, the current scale), not configuration:
# a policy file sets ``init_scale`` and the configuration, never these.
STATE_FIELDS = FIELDS
_FLOAT_MAX = 1.7976931348623157e308


def _string(value: Any, where: str, path: str, choices: Optional[tuple] = None) -> str:
    if not isinstance(value, str):
        allowed = f" (one of {', '.join(map(repr, choices))})" if choices else ""
        raise fail(where, path, value, f"must be a string{allowed}")
    if choices is not None and value not in choices:
        raise fail(where, path, value, f"must be one of {', '.join(map(repr, choices))}"
                    f"{did_you_mean(value, choices)}")
    return value


def _bool(value: Any, where: str, path: str) -> bool:
    if not isinstance(value, bool):
        raise fail(where, path, value, "must be true or false")
    return value


def check_names(value: Any, where: str, path: str) -> list[str]:
    """A list of op names (any collection but a string), each a non-empty string."""
    return check_name_list(value, where, path, "op names", "'softmax'",
                           "an op name (a non-empty string)")


def framework_name_hint(name: str) -> str:
    """For a framework op name used where a canonical one is expected: where it belongs."""
    for fw in FRAMEWORKS:
        table = load_table(fw)
        if name in table.names:
            canon = table.canonical_of.get(name)
            alias = (f"; its canonical name is {canon!r} (use that under [ops] for both "
                     f"frameworks)" if canon else "")
            return f" {name!r} is a {fw} op name: it belongs under [ops.{fw}]{alias}."
    return ""


def check_rule(value: Any, where: str, path: str) -> tuple[str, str, tuple[str, ...]]:
    """A conditional-fp32 rule ({op, attr, values} or (op, attr, [values])) as a tuple."""
    example = "{ op = 'LeakyReLU', attr = 'act_type', values = ['gelu'] }"
    if isinstance(value, Mapping):
        check_keys(value, RULE_KEYS, where, path)
        missing = [k for k in RULE_KEYS if k not in value]
        if missing:
            raise fail(where, path, dict(value), f"needs the keys {', '.join(missing)}, "
                        f"e.g. {example}")
        op, attr, values = value["op"], value["attr"], value["values"]
    elif isinstance(value, (list, tuple)) and len(value) == 3:
        op, attr, values = value
    else:
        raise fail(where, path, value, f"must be a rule {example}")
    op = _string(op, where, f"{path}.op")
    attr = _string(attr, where, f"{path}.attr")
    if isinstance(values, str):
        raise fail(where, f"{path}.values", values,
                    f"must be a list of attribute values; write [{values!r}]")
    if not isinstance(values, (list, tuple)) or not values:
        raise fail(where, f"{path}.values", values,
                    "must be a non-empty list of attribute values, e.g. ['gelu']")
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise fail(where, f"{path}.values[{i}]", v, "must be a string")
    return op, attr, tuple(values)


def check_op_lists(value: Any, where: str, path: str, canonical: bool) -> dict[str, Any]:
    """One ``[ops]`` / ``[ops.<framework>]`` table as ``OpLists`` keyword arguments."""
    d = check_table(value, where, path, f"[{path}] with lower = [...], fp32 = [...]")
    check_keys(d, OPS_KEYS, where, path)
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}
    known = canonical_ops()
    for cat in CATEGORIES:
        if cat not in d:
            continue
        names = check_names(d[cat], where, f"{path}.{cat}")
        for i, name in enumerate(names):
            if canonical and name not in known:
                raise fail(where, f"{path}.{cat}[{i}]", name,
                            f"unknown canonical op{did_you_mean(name, known)}."
                            f"{framework_name_hint(name)}")
            if seen.get(name, cat) != cat:
                raise fail(where, f"{path}.{cat}[{i}]", name,
                            f"already listed in {path}.{seen[name]}; keep an op in one list")
            seen[name] = cat
        out[cat] = frozenset(names)
    if "conditional_fp32" in d:
        rules = d["conditional_fp32"]
        if not isinstance(rules, (list, tuple)):
            raise fail(where, f"{path}.conditional_fp32", rules, "must be a list of rules")
        out["conditional_fp32"] = tuple(
            check_rule(r, where, f"{path}.conditional_fp32[{i}]") for i, r in enumerate(rules))
        if canonical:
            for i, (op, _, _) in enumerate(out["conditional_fp32"]):
                if op not in known:
                    raise fail(where, f"{path}.conditional_fp32[{i}].op", op,
                                f"unknown canonical op{did_you_mean(op, known)}."
                                f"{framework_name_hint(op)}")
    if "replace" in d:
        out["replace"] = _replace(d["replace"], where, f"{path}.replace")
    return out


def _replace(value: Any, where: str, path: str) -> "bool | frozenset[str]":
    """``replace``: true or false, or the list of default lists it replaces (``["lower"]``:
    what MXNet's ``target_precision_ops=[...]`` means, that list and only that one)."""
    if isinstance(value, bool):
        return value
    lists = (*CATEGORIES, "conditional_fp32")
    if not isinstance(value, list):
        raise fail(where, path, value, f"must be true or false, or a list of the default lists "
                                       f"it replaces (of {', '.join(map(repr, lists))})")
    for i, name in enumerate(value):
        _string(name, where, f"{path}[{i}]", lists)
    return frozenset(value)


def loss_scale_keys(kind: str, fields: tuple[str, ...]) -> tuple[str, ...]:
    """The documented ``[loss_scale]`` keys of ``kind``: ``init_scale`` and the configuration
    fields, never the state counters."""
    keys = [f for f in fields if f not in STATE_FIELDS and f != "init_scale"]
    return (("init_scale",) if "scale" in fields else ()) + tuple(keys)


def check_loss_scale(value: Any, where: str, fields_of: Mapping[str, tuple[str, ...]],
                     path: str = "loss_scale") -> dict[str, Any]:
    """The ``[loss_scale]`` table with its kind checked, only documented keys, real numbers.

    ``fields_of``: {kind: the loss-scale dataclass's field names}. Returns the
    table with ``kind`` set and ``init_scale`` still named so (the scaler maps it)."""
    d = check_table(value, where, path, "[loss_scale] with kind = 'dynamic', init_scale = 65536")
    kind = _string(d.pop("kind", "dynamic"), where, f"{path}.kind", LOSS_SCALE_KINDS)
    allowed = loss_scale_keys(kind, fields_of[kind])
    check_keys(d, allowed, where, f"{path} (kind {kind!r})")
    for key, v in d.items():
        if key == "max_scale" and v == "inf":
            continue
        if key == "max_consecutive_skips" and v is False:  # TOML has no null: no limit
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise fail(where, f"{path}.{key}", v, "must be a number"
                        + (" (or 'inf')" if key == "max_scale" else
                           " (or false: no limit)" if key == "max_consecutive_skips" else ""))
        if isinstance(v, int) and abs(v) > _FLOAT_MAX:
            raise fail(where, f"{path}.{key}", v, "is out of range (larger than any float)")
        if isinstance(v, float) and math.isnan(v):
            raise fail(where, f"{path}.{key}", v, "must be a number, not nan")
    return {"kind": kind, **d}


def check_policy_dict(d: Any, where: str, presets: Mapping[str, Any], dtypes: tuple,
                      levels: tuple, fields_of: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """The structure of a policy file, checked: {top-level key: checked value}.

    ``ops`` comes back as {"ops": kwargs, "mxnet": kwargs, "paddle": kwargs} of
    ``OpLists`` keyword arguments; everything else keeps its key."""
    d = check_table(d, where, "policy", "a mapping of policy keys")
    check_keys(d, TOP_KEYS, where, "")
    out: dict[str, Any] = {}
    if "preset" in d:
        out["preset"] = _string(d["preset"], where, "preset", tuple(presets))
    if "dtype" in d:
        out["dtype"] = _string(d["dtype"], where, "dtype")
        try:
            name = dtype_name(out["dtype"])  # any spelling: 'fp16', 'bf16', 'half' ...
        except AmpConfigError:
            name = None
        if name not in dtypes:
            raise fail(where, "dtype", d["dtype"], f"must be one of "
                        f"{', '.join(map(repr, dtypes))}{did_you_mean(d['dtype'], dtypes)}")
    if "level" in d:
        out["level"] = _string(d["level"], where, "level", tuple(levels))
    if "emulate" in d:
        out["emulate"] = _bool(d["emulate"], where, "emulate")
    if "speed" in d:
        out["speed"] = _string(d["speed"], where, "speed", SPEEDS)
    if "profile" in d:
        out["profile"] = _string(d["profile"], where, "profile")
    if "unlisted" in d:
        out["unlisted"] = _string(d["unlisted"], where, "unlisted", CATEGORIES)
    if "use_promote" in d:
        out["use_promote"] = _bool(d["use_promote"], where, "use_promote")
    if "native_version" in d:
        out["native_version"] = _string(d["native_version"], where, "native_version")
    if "ops" in d:
        ops = check_table(d["ops"], where, "ops", "[ops] with lower = [...], fp32 = [...]")
        out["ops"] = {fw: check_op_lists(ops.pop(fw), where, f"ops.{fw}", canonical=False)
                      for fw in FRAMEWORKS if fw in ops}
        out["ops"]["ops"] = check_op_lists(ops, where, "ops", canonical=True)
    if "layers" in d:
        out["layers"] = check_layers(d["layers"], where)
    if "loss_scale" in d:
        out["loss_scale"] = check_loss_scale(d["loss_scale"], where, fields_of)
    return out


def check_layers(value: Any, where: str) -> dict[str, dict[str, frozenset[str]]]:
    """The ``[layers]`` table: {"layers": kwargs, "mxnet": kwargs, "paddle": kwargs} of
    ``LayerLists`` keyword arguments. A sub-table names a framework (``[layers.mxnet]``);
    one under another name, or nested deeper, is an error naming its key."""
    d = check_table(value, where, "layers", "[layers] with fp32 = [...], lower = [...]")
    out: dict[str, dict[str, frozenset[str]]] = {}
    for key in list(d):
        if isinstance(d[key], Mapping):
            if key not in FRAMEWORKS:
                raise AmpConfigError(
                    f"{where}: [layers.{key}]: {key!r} is no framework"
                    f"{did_you_mean(key, FRAMEWORKS)} "
                    f"(a layers table is [layers] for names both frameworks share, or "
                    f"[layers.{'] / [layers.'.join(FRAMEWORKS)}] for one framework's names)")
            out[key] = check_layer_lists(d.pop(key), where, f"layers.{key}")
        elif key in FRAMEWORKS:
            raise fail(where, f"layers.{key}", d[key],
                        f"must be a table ([layers.{key}] with fp32 = [...], lower = [...])")
    check_keys(d, (*LAYER_CATEGORIES, *FRAMEWORKS), where, "layers")
    out["layers"] = check_layer_lists(d, where, "layers")
    return out


_AT = re.compile(r"\(at line (\d+), column (\d+)\)")


def read_toml(path: "str | Path") -> tuple[dict, str]:
    """(the parsed file, ``"policy file '<path>'"`` for messages), or an ``AmpConfigError``."""
    path = Path(path)
    where = f"policy file {str(path)!r}"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise AmpConfigError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise AmpConfigError(f"{where} is a directory; pass the path of a .toml file") from None
    except OSError as e:
        raise AmpConfigError(f"{where} cannot be read: {e.strerror or e}") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raise AmpConfigError(f"{where} starts with a UTF-8 byte-order mark (BOM), which TOML "
                             f"does not allow; save it as UTF-8 without BOM")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise AmpConfigError(f"{where} is not UTF-8 text (byte 0x{raw[e.start]:02x} on line "
                             f"{line}); save it as UTF-8") from None
    try:
        return tomllib.loads(text), where
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        twice = find_duplicate(text, msg)
        if twice:
            given = (f"first on line {twice.first_line} ({twice.first_source!r}), again on "
                     f"line {twice.line} ({twice.source!r})" if twice.first_line else
                     f"in the inline table of {twice.inline_in!r} ({twice.source!r})")
            raise AmpConfigError(
                f"{where}, line {twice.line}: the key {twice.key!r} is given twice ({given}); "
                f"TOML allows a key once: keep one (tomllib: {msg})") from None
        at = _AT.search(msg)
        detail = ""
        if at:
            lines = text.splitlines()
            n = int(at.group(1))
            src = lines[n - 1].strip() if 0 < n <= len(lines) else ""
            if src:
                detail = f" (line {n}: {src!r})"
        raise AmpConfigError(f"{where} is not valid TOML: {msg}{detail}") from None


def dataclass_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))
