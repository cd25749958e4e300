"""oneDNN's own account of what ran: its verbose log, read for one block of code.

The Paddle kernel probes (``kernels``) ask oneDNN which implementation ran a primitive (a
``ref`` one is its slow reference code) and whether a cast ran as a oneDNN ``reorder``.
oneDNN writes that log only in verbose mode, to the process's stdout; ``onednn_log``
switches the mode on through oneDNN's C API (``dnnl_set_verbose``, in the ``libdnnl.so.3``
Paddle ships) for one block and reads what it wrote. Where the library or the symbol is not
there, the log is empty (and says so at DEBUG): a probe then finds nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import tempfile
from typing import Callable, Iterator

import paddle

_LOG = logging.getLogger("paddle_amp")
_active = False  # one block at a time: oneDNN's verbose mode and fd 1 are process-wide


@contextlib.contextmanager
def onednn_log() -> Iterator[list[str]]:
    """The lines oneDNN logs about the primitives created and executed inside (a list,
    filled on exit). File descriptor 1 is redirected to a file for the block, after Python's
    and C's stdout buffers are flushed, and restored (with the user's own verbose level)
    however the block ends; other threads' stdout meanwhile goes to that file too. Does not
    nest (a RuntimeError)."""
    global _active
    if _active:
        raise RuntimeError("onednn_log() does not nest")
    lines: list[str] = []
    try:
        dnnl = ctypes.CDLL(os.path.join(os.path.dirname(paddle.__file__), "libs",
                                        "libdnnl.so.3"))
        set_verbose, libc = dnnl.dnnl_set_verbose, ctypes.CDLL(None)
        sys.stdout.flush()
        libc.fflush(None)
        saved = os.dup(1)
    except (OSError, AttributeError) as e:  # no such library or symbol, no stdout
        _LOG.debug("oneDNN's log cannot be read here (%s): the probes see nothing", e)
        yield lines
        return
    _active = True
    try:
        with tempfile.TemporaryFile() as f:
            try:
                os.dup2(f.fileno(), 1)
                set_verbose(1)
                yield lines
            finally:
                set_verbose(_verbosity())
                libc.fflush(None)
                os.dup2(saved, 1)
                f.seek(0)
                lines.extend(f.read().decode(errors="replace").splitlines())
    finally:
        os.close(saved)
        _active = False


def _verbosity() -> int:
    """The verbose level the user asked oneDNN for (``ONEDNN_VERBOSE``/``DNNL_VERBOSE``: a
    number, or a named mode, which counts as 1), else 0."""
    for var in ("ONEDNN_VERBOSE", "DNNL_VERBOSE"):
        value = os.environ.get(var, "")
        if value:
            return int(value) if value.isdigit() else 1
    return 0


def executed(log: list[str]) -> list[tuple[str, str]]:
    """(primitive kind, implementation) of each ``exec`` line of oneDNN's verbose ``log``:
    ``onednn_verbose,exec,cpu,reduction,ref:any,...`` (oneDNN 3.2, Paddle 2.6.2) or
    ``onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,...`` (3.6)."""
    out = []
    for fields in (line.split(",") for line in log if line.startswith("onednn_verbose,")):
        if "exec" in fields and len(fields) > fields.index("exec") + 3:
            i = fields.index("exec")
            out.append((fields[i + 2], fields[i + 3]))
    return out


def slow_or_failing(run: Callable[[], bool]) -> bool:
    """Whether ``run()`` (a probe: True where it ran) fails, or runs a oneDNN primitive on
    its slow reference implementation (``ref``), read from oneDNN's log of the call: the one
    test of a slow bf16 gradient, for the static programs' and eager mode's probes."""
    with onednn_log() as log:
        ran = run()
    return not ran or any(impl.startswith("ref") for _, impl in executed(log))
