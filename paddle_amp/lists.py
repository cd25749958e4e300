"""``AutoMixedPrecisionLists``: the native list arguments, as core ``OpLists``.

The native white list becomes ``lower``, the black list ``fp32`` and the gray
list ``promote`` (run in the widest input dtype, whatever the input order).
Names are checked against Paddle's live op registry at construction, so a typo
fails here, with close matches, and not silently at rewrite time.
"""
from __future__ import annotations

from typing import Iterable, Optional

import paddle
from paddle.base import core

from amp_adapters import AmpConfigError, OpLists, Policy, effective_lists
from amp_adapters.dtypes import low_dtype



def _names(value: Optional[Iterable[str]], arg: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"AutoMixedPrecisionLists({arg}=...) takes a list of op names, "
                        f"got {value!r}")
    return frozenset(value)


class AutoMixedPrecisionLists:
    """The native ``paddle.static.amp.AutoMixedPrecisionLists``, backed by the core lists.

    ``custom_white_list`` ops run in ``dtype`` (where the device has a kernel),
    ``custom_black_list`` ops in float32, ``custom_gray_list`` ops in their
    widest input dtype. ``custom_black_varnames``: ops reading or writing these
    variables run in float32. An op in two lists, or one Paddle does not know,
    raises an error that names it.
    """

    def __init__(self, custom_white_list: Optional[Iterable[str]] = None,
                 custom_black_list: Optional[Iterable[str]] = None,
                 custom_black_varnames: Optional[Iterable[str]] = None,
                 dtype: str = "float16", custom_gray_list: Optional[Iterable[str]] = None):
        self.amp_dtype = dtype = low_dtype(dtype, "AutoMixedPrecisionLists dtype")
        self.paddle_ops = OpLists(lower=_names(custom_white_list, "custom_white_list"),
                                  fp32=_names(custom_black_list, "custom_black_list"),
                                  promote=_names(custom_gray_list, "custom_gray_list"))
        Policy(dtype=dtype, paddle_ops=self.paddle_ops).validate_for(
            "paddle", core.get_all_op_names())
        self.black_varnames = _names(custom_black_varnames, "custom_black_varnames")

    def _lists(self) -> dict[str, list[str]]:
        return effective_lists(Policy(dtype=self.amp_dtype, paddle_ops=self.paddle_ops), "paddle")

    @property
    def white_list(self) -> set[str]:
        """Ops that run in the low dtype (the native attribute name)."""
        return set(self._lists()["lower"])

    @property
    def black_list(self) -> set[str]:
        """Ops that always run in float32."""
        return set(self._lists()["fp32"])

    @property
    def gray_list(self) -> set[str]:
        """Ops that run in their widest input dtype."""
        return set(self._lists()["promote"])


def check_lists(amp_lists: object, dtype: str) -> AutoMixedPrecisionLists:
    """``amp_lists`` itself, or the defaults for None; a wrong type or dtype is an error."""
    if amp_lists is None:
        return AutoMixedPrecisionLists(dtype=dtype)
    if isinstance(amp_lists, paddle.static.amp.AutoMixedPrecisionLists):  # the native class
        amp_lists = AutoMixedPrecisionLists(
            amp_lists._custom_white_list, amp_lists._custom_black_list,
            amp_lists.black_varnames, amp_lists.amp_dtype)
    if not isinstance(amp_lists, AutoMixedPrecisionLists):
        raise TypeError(f"amp_lists must be a paddle_amp.AutoMixedPrecisionLists, got "
                        f"{type(amp_lists).__name__}")
    if amp_lists.amp_dtype != dtype:
        raise AmpConfigError(f"amp_lists were made for {amp_lists.amp_dtype}, but decorate was "
                             f"called with dtype={dtype!r}")
    return amp_lists
