"""A copy of a low-precision array into a float32 one (``NDArray.astype("float32")``,
``copyto``) is one cast, written into the destination.

``astype`` allocates its result and fills it with ``_copyto``, which converts to the
destination's dtype by itself: a cast by nature (the op table maps it to the canonical
``cast``, which follows its input). Two things of MXNet's stand in the way:

- MXNet's own AMP lists ``_copyto`` float32, so a bf16 input was cast up first: a second
  float32 copy of the array (the cast's output) lived beside the destination until the
  copy ran. Under the threaded engine, which runs a backward's first ops (a ``mean``'s
  gradient) as soon as they are ready, that copy and the destination were alive with
  the backward's first gradients: a CNN's O1-bf16 step held one float32 activation more
  than under ``NaiveEngine`` (bench/memory.py, issue 40);
- ``_copyto`` cannot read a bf16 array kept in oneDNN's layout (a bf16 convolution's
  output) across dtypes: "The size of NDArray doesn't match the requested MKLDNN memory
  desc".

So a low-precision (bf16, float16) input copied into a float32 array runs ``amp_cast`` with
``out=`` the destination: one op, which reads oneDNN's layout, differentiable as ``_copyto``
is, and exact (widening). Under the native's lists (``_copyto`` float32) that is the same
float32 copy, without the temporary. A low input copied into another dtype is cast to
float32 first and then copied, as the float32 list did; anything else is the ``_copyto``
bound before (MXNet's, or the policy's wrapper of it). Installed by ``init``, outermost;
removed by ``reset``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import mxnet as mx

from ._mx import _ND_AMP_CAST, _local, cast, dtype_name, unpatched

_LOW = ("bfloat16", "float16")


def _route(copyto: Callable) -> Callable:
    @functools.wraps(copyto)
    def copied(src: Any = None, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        if (_local.bypass or args or kwargs or not isinstance(src, mx.nd.NDArray)
                or not isinstance(out, mx.nd.NDArray) or isinstance(src, mx.np.ndarray)
                or isinstance(out, mx.np.ndarray)  # legacy amp_cast refuses mx.np arrays
                or dtype_name(src.dtype) not in _LOW or out.dtype == src.dtype
                or out.context != src.context):
            return copyto(src, *args, out=out, **kwargs)
        with unpatched():
            if dtype_name(out.dtype) == "float32":
                return _ND_AMP_CAST(src, dtype="float32", out=out)
            return copyto(cast(src, "float32"), out=out)
    copied.__amp_original__ = copyto  # type: ignore[attr-defined]
    return copied


def install(places: list[tuple[Any, str]]) -> list[tuple[Any, str, Any]]:
    """Route ``_copyto`` where MXNet binds it (``places``: (module, attribute), all bound to
    one function); returns the patches as (module, attribute, original) for ``reset``."""
    if not places:
        return []
    original = getattr(*places[0])
    routed = _route(original)
    patches = []
    for module, attr in places:
        patches.append((module, attr, getattr(module, attr)))
        setattr(module, attr, routed)
    return patches
