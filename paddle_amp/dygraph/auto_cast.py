"""``auto_cast`` / ``amp_guard``: ``paddle.amp``'s region, running mixed precision on a CPU.

The native's signature and defaults (``enable=True``, ``custom_white_list``,
``custom_black_list``, ``level="O1"``, ``dtype="float16"``, ``use_promote=True``), plus
``policy=`` and ``emulate=`` as everywhere in the project. Every argument is checked
before anything is switched on (``config.policy_of``). The region yields its ``Frame``:
``frame.ran`` holds, per op, the decision it ran under (``OpDecision``: run dtype,
``execution`` "kernel" / "emulated" / "fell back", the reason).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import dispatch
from .config import policy_of


def _not_to_static(fn):
    """Keep ``paddle.jit.to_static`` from rewriting ``fn`` (and what it calls) into program
    code, as Paddle marks its own ``paddle.amp.auto_cast``: a region is host-side state."""
    import paddle
    return paddle.jit.not_to_static(fn)


@_not_to_static
@contextlib.contextmanager
def auto_cast(enable: Any = True, custom_white_list: Any = None, custom_black_list: Any = None,
              level: Any = None, dtype: Any = None, use_promote: Any = True, *,
              policy: Any = None, emulate: Any = False) -> Iterator[dispatch.Frame]:
    """Run the ops inside under mixed precision (``paddle.amp.auto_cast``'s arguments; see
    the module docstring). ``level``/``dtype`` default to the native's ``"O1"``/``"float16"``,
    or to ``policy``'s own when one is given."""
    resolved = policy_of(enable, custom_white_list, custom_black_list, level, dtype,
                         use_promote, policy, emulate)
    frame = dispatch.push(resolved)
    try:
        yield frame
    finally:
        dispatch.pop(frame)


amp_guard = auto_cast


@_not_to_static
def autocast(device_type: Any = None, dtype: Any = "float16", enabled: Any = True,
             cache_enabled: Any = True):
    """Paddle 3's ``paddle.amp.autocast`` (torch's argument names): ``auto_cast(enable=enabled,
    dtype=dtype)``; ``device_type`` and ``cache_enabled`` are ignored, as the native does."""
    return auto_cast(enable=enabled, dtype=dtype)
