"""A backend's answers about this machine's kernels, asked in the measuring child and kept.

Which ops run in a low dtype here is found by reading the framework's kernel registry and
running probes (a bf16 op on tiny inputs, forward and backward). Both allocate in the
process that asks and free again, but what they touched stays resident: the process's
high-water mark before its first step. Measured on Paddle's MLP (legacy IR, 2.6.2, the
memory bench's fresh process, median of three): a float32 step after the static probes
peaked 14 MB (1.03x) above the same step without them, a good share of the 1.05x that
``auto`` may cost over float32 where it lowers nothing (bench/memory.py). So a backend asks
here: ``answer`` runs the question in the backend's measuring child (``measure_process``,
the process that times ops), once per machine, framework build and project version, and
keeps its JSON answer on disk, so the process that trains never loads what the probes load.

Keyed as the speed book is: one file per machine (``devices-<machine_id>.json`` in the
speed cache's directory, ``speedbook.cache_dir``: the CPU, its flags, the oneDNN ISA
limits, thread settings and simulated CPU class of ``isa.machine``), an entry per
framework build (its version, and what else the backend names: Paddle's commit and whether
it is compiled with CUDA), this project's version (the probes' recipes are its code) and
question. The answer is the question's own, exact: where the child cannot answer (it could
not start, it died, or the question raised there) it is asked in this process, with a
warning once per process (what the question loads then stays resident here); a directory
that cannot be written keeps the answer for this process only.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from .._version import __version__
from ..rules.isa import machine
from . import measure_process
from .speedbook import cache_dir, locked, machine_id, warn_once

# The file's layout: {"format", "machine", "answers": {key: answer}}. 2: the key holds the
# project's version and the framework's build (1 held the framework's version only).
FORMAT = 2


def book_path(m: Optional[dict] = None) -> Path:
    """This machine's file of answers (``machine()`` as it is now, simulated class included)."""
    return cache_dir() / f"devices-{machine_id(machine() if m is None else m)}.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # absent or broken: asked again
    if not isinstance(data, dict) or data.get("format") != FORMAT or \
            not isinstance(data.get("answers"), dict):
        return {}
    return data["answers"]


def _write(path: Path, m: dict, answers: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "machine": m, "answers": answers}, f, sort_keys=True,
                      indent=1)
        os.replace(tmp, path)
    except OSError as e:
        warn_once(f"devices:{path.parent}", f"amp_adapters: cannot keep the device answers in "
                  f"{path.parent} ({e.strerror or e}): they are asked again in each process; "
                  f"set AMP_ADAPTERS_CACHE to a writable directory to keep them")


def key_of(framework: str, build: str, question: str) -> str:
    """The entry of ``question`` about ``framework``'s ``build`` in this machine's file: this
    project's version is in it too (the recipes that answer are its code)."""
    return f"{framework} {build} amp-adapters {__version__} {question}"


def answer(framework: str, build: str, question: str, server: str, fn: Callable[..., Any],
           *args: Any) -> Any:
    """``fn(*args)`` (a JSON value: the answer to ``question`` about this machine's kernels in
    ``framework``'s ``build``: its version and whatever else of its build the answer depends
    on), read from this machine's file, else asked in the measuring
    child ``server`` (a module that serves ``fn``) and kept; asked in this process where the
    child gives no answer, and in a measuring child itself (``measure_process.serving``: its
    parent holds the file's lock while it waits for that child's answer)."""
    if measure_process.serving:
        return fn(*args)
    m = machine()
    path = book_path(m)
    key = key_of(framework, build, question)
    answers = _read(path)
    if key in answers:
        return answers[key]
    with locked(path):  # one process asks; the others read its answer
        answers = _read(path)
        if key in answers:
            return answers[key]
        try:
            got = measure_process.call(server, fn, *args)
        except measure_process.MeasureError as e:
            warn_once("devices:child", f"amp_adapters: the measuring process gave no answer "
                      f"about this machine's kernels ({e}): asked in this process instead, so "
                      f"what the question loads (its probes' memory) stays resident here")
            got = fn(*args)  # its own answer, or its own error, here
        _write(path, m, {**_read(path), key: got})
    return got
