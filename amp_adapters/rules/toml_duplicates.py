"""Which key a TOML text gives twice, and on which lines: for a policy file's error message.

``tomllib`` says only "Cannot overwrite a value", "Cannot declare ('ops',)
twice", "Cannot mutate immutable namespace" or "Duplicate inline table key",
at the position where it noticed, which is the end of the value (a value can
span lines), or "at end of document" when the file has no final newline. The
key and the line of its first definition it never says. ``find_duplicate``
works them out from the text alone: the line where the duplicate ends (the
shortest prefix that fails so), the statements before it (a line starts a statement
when the lines above it parse), and each statement's full key path (its table
header's path and its own dotted key). Pure functions; a policy file is small,
so parsing its prefixes again is cheap.
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from typing import Optional

# tomllib's messages for a key or table given twice (Python 3.11 .. 3.13)
DUPLICATE_MESSAGES = ("Cannot overwrite a value", "twice", "Cannot mutate immutable namespace",
                      "Duplicate inline table key")

_ONE = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED = rf"{_ONE}(?:[ \t]*\.[ \t]*{_ONE})*"
_KEY_LINE = re.compile(rf"[ \t]*({_DOTTED})[ \t]*=")
_HEADER = re.compile(rf"[ \t]*\[(\[?)[ \t]*({_DOTTED})[ \t]*\]")
_NAMED = re.compile(r"\(((?:'[^']*'|\"[^\"]*\")(?:, *(?:'[^']*'|\"[^\"]*\"))*),?\)|key '([^']*)'")


@dataclasses.dataclass(frozen=True)
class Duplicate:
    """A key given twice: its full dotted path, the line (1-based) and source of each giving.
    Given twice inside one inline table: ``first_line`` is None, ``key`` is the key as the
    inline table spells it and ``inline_in`` the path of the key that holds the table."""
    key: str
    line: int
    source: str
    first_line: Optional[int]
    first_source: str
    inline_in: str = ""


@dataclasses.dataclass(frozen=True)
class _Statement:
    line: int
    is_table: bool
    path: tuple[str, ...]
    table_len: int = 0   # how much of ``path`` is the table header a key/value line is under


def is_duplicate_message(message: str) -> bool:
    return any(m in message for m in DUPLICATE_MESSAGES)


def _error(text: str) -> Optional[str]:
    try:
        tomllib.loads(text)
        return None
    except tomllib.TOMLDecodeError as e:
        return str(e)


def _parses(text: str) -> bool:
    return _error(text) is None


def _path(dotted: str) -> tuple[str, ...]:
    """('a', 'b c') for ``a."b c"``: TOML itself unquotes and splits the key."""
    d, out = tomllib.loads(f"{dotted} = 0"), []
    while isinstance(d, dict):
        (key, d), = d.items()
        out.append(key)
    return tuple(out)


def _statements(lines: list[str], upto: int) -> list[_Statement]:
    """The key/value lines and table headers that start on lines 1..``upto``."""
    out: list[_Statement] = []
    table: tuple[str, ...] = ()
    for i in range(upto):
        if i and not _parses("\n".join(lines[:i])):
            continue  # inside a value that spans lines (an array, a multi-line string)
        header = _HEADER.match(lines[i])
        if header:
            table = _path(header.group(2))
            out.append(_Statement(i + 1, True, table))
            continue
        key = _KEY_LINE.match(lines[i])
        if key:
            out.append(_Statement(i + 1, False, table + _path(key.group(1)), len(table)))
    return out


def _clashes(first: _Statement, second: _Statement) -> bool:
    """Whether ``first`` already defined what ``second`` defines (a table header encloses
    the keys below it without defining them)."""
    a, b = first.path, second.path
    if a == b:
        return True
    if first.is_table:  # [a.b] then, in [a], b = ... (but [a.b] then [a] is allowed)
        return not second.is_table and len(b) < len(a) and a[:len(b)] == b
    # a key/value line defines its dotted key's tables (``ops.lower = []`` defines ``ops``),
    # not the header's it is under
    return (a[:len(b)] == b and len(b) > first.table_len) or b[:len(a)] == a


def _named_in(message: str) -> tuple[str, ...]:
    m = _NAMED.search(message)
    if not m:
        return ()
    if m.group(2) is not None:
        return (m.group(2),)
    return tuple(p.strip()[1:-1] for p in re.findall(r"'[^']*'|\"[^\"]*\"", m.group(1)))


def find_duplicate(text: str, message: str) -> Optional[Duplicate]:
    """The key ``text`` gives twice, given tomllib's ``message`` about it; None when ``text``
    parses or the message is about something else."""
    if not is_duplicate_message(message):
        return None
    lines = text.splitlines()
    # the first line on which the text so far gives a key twice (a prefix that stops inside a
    # value fails too, with another message)
    end = next((k for k in range(1, len(lines) + 1)
                if is_duplicate_message(_error("\n".join(lines[:k])) or "")), None)
    if end is None:
        return None
    statements = _statements(lines, end)
    if not statements:
        return None
    second = statements[-1]
    for first in statements[:-1]:
        if _clashes(first, second):
            return Duplicate(".".join(second.path), second.line, lines[second.line - 1].strip(),
                             first.line, lines[first.line - 1].strip())
    # given twice inside one statement (an inline table): the message names the inner key
    inner = _named_in(message)
    if inner[:len(second.path)] == second.path:
        inner = inner[len(second.path):]  # some versions name the full path
    return Duplicate(".".join(inner) or "?", second.line, lines[second.line - 1].strip(), None,
                     "", ".".join(second.path))
