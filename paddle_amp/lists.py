"""``AutoMixedPrecisionLists`` (and the bf16 one): the native list objects, as core overrides.

Like the native objects they hold live, mutable sets that start from the
installed native's default lists (``amp_adapters.rules.oplists.native_lists``, the
data of the ``paddle-native`` preset) and take the custom lists as the native
does (a custom white op leaves the black/gray set, a custom black op leaves
the white/gray set and joins ``unsupported_list``). In-place edits such as
``amp_lists.black_list.add("matmul_v2")`` take effect: ``decorate`` reads the
sets when it builds the policy (``overrides``). Differences, both fixes: custom
names are checked against Paddle's op registry (an ``UnknownOpError`` with
close matches), and ``unsupported_list`` names the ops without a low-precision
kernel on the device actually used (the native always asks about GPU kernels).
"""
from __future__ import annotations

from typing import Iterable, Optional

import paddle
from paddle.base import core

from amp_adapters import AmpConfigError, ConflictingOpError, OpLists, Policy
from amp_adapters.rules.dtypes import low_dtype
from amp_adapters.rules.oplists import load_table, native_lists
from amp_adapters.rules.policy import custom_over

from .env import current_device
from .kernels import lowp_kernels

_CATEGORY = (("black_list", "fp32"), ("white_list", "lower"), ("gray_list", "promote"))


def check_amp_dtype(dtype) -> str:
    """'float16' or 'bfloat16' (any spelling the core reads: 'FP16', np.float16...), else the
    native ValueError."""
    try:
        return low_dtype(dtype.lower() if isinstance(dtype, str) else dtype)
    except AmpConfigError:
        raise ValueError("If enable AMP, dtype should be 'float16' or 'bfloat16'.") from None


def _names(value: Optional[Iterable[str]], arg: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{arg}=... takes a list of op names (or a set), got {value!r}")
    return frozenset(value)


def known_ops() -> frozenset[str]:
    """The op names a list or a policy may name: the ops this Paddle registers (custom ops
    loaded by then included), the ops of its operator API (GPU-only ones too:
    ``sync_batch_norm`` is in ``paddle._C_ops`` of a CPU build, not in its registry), and
    the names the op tables and native lists use. Anything else is a typo."""
    api = {name.rstrip("_") for name in dir(paddle._C_ops) if not name.startswith("_")}
    return frozenset(core.get_all_op_names()) | api | load_table("paddle").names | \
        native_lists("paddle", "float16").names | native_lists("paddle", "bfloat16").names


def _check_registered(dtype: str, **lists: frozenset[str]) -> None:
    """Custom names must be ops ``known_ops`` knows."""
    ops = OpLists(**lists)  # ConflictingOpError for a name in two lists
    Policy(dtype=dtype, paddle_ops=ops).validate_for("paddle", known_ops())


def _unsupported(dtype: str) -> set[str]:
    """Ops without a ``dtype`` kernel on the device in use (forward and backward)."""
    device = current_device()
    return set(core.get_all_op_names()) - set(lowp_kernels(device, dtype))


class _Lists:
    """What both list classes share: live sets -> core overrides."""

    amp_dtype: str
    _sets: tuple[tuple[str, str], ...] = _CATEGORY

    def _defaults(self):
        raise NotImplementedError

    def _live_category(self, op: str, sets: dict) -> Optional[str]:
        for attr, cat in self._sets:  # the native precedence: black > white > gray
            if op in sets[attr]:
                return cat
        return None

    def _default_sets(self):
        """The live sets (``_sets``) at the native defaults, and ``unsupported_list``."""
        d = self._defaults()
        by_cat = {"fp32": d.fp32, "lower": d.lower, "promote": d.promote}
        for attr, cat in self._sets:
            setattr(self, attr, set(by_cat[cat]))
        self.unsupported_list = _unsupported(self.amp_dtype)
        return d

    def _update_list(self) -> None:
        """The native hook (a no-op here: the sets are live and read at decorate time)."""

    def _apply_custom(self, low: set, fp32: set, custom_low, custom_fp32) -> None:
        """The custom lists, as the native ``_update_list`` (the core's ``OpLists.with_custom``:
        a custom low op leaves the fp32 and gray sets, a custom fp32 op the low and gray
        sets), written back into the live sets; a custom fp32 op is also unsupported."""
        live = {"lower": low, "fp32": fp32, "promote": self.gray_list}
        got = custom_over(live, OpLists(lower=frozenset(custom_low), fp32=frozenset(custom_fp32)))
        for cat, s in live.items():
            s.intersection_update(got[cat])
            s.update(got[cat])
        self.unsupported_list.update(custom_fp32)

    def _custom(self) -> dict[str, frozenset[str]]:
        """The user's custom entries by category ("lower", "fp32"), as given."""
        raise NotImplementedError

    def _built(self) -> None:
        """Remember the live sets as the constructor left them (``custom``)."""
        self._as_built = {attr: frozenset(getattr(self, attr)) for attr, _ in self._sets}

    def custom(self) -> OpLists:
        """The user's custom lists as given, which ``decorate(policy=...)`` puts on top of the
        policy (``amp_adapters.rules.policy.with_custom_lists``). A live set edited in place since
        has no meaning beside a policy: refused, rather than ignored."""
        edited = [attr for attr, _ in self._sets
                  if frozenset(getattr(self, attr)) != self._as_built[attr]]
        if edited:
            raise AmpConfigError(
                f"decorate() got policy= and amp_lists whose {', '.join(edited)} was edited in "
                f"place: beside a policy, pass the ops as the lists' custom arguments "
                f"(custom_white_list=..., custom_black_list=...) or put them in the policy "
                f"(Policy(paddle_ops=OpLists(...)))")
        return OpLists(**self._custom())

    def overrides(self, unlisted: str = "fp32", level: str = "O1") -> OpLists:
        """The ops whose category the live sets change from the native defaults, and the
        user's custom entries still in their live set (a custom fp32 op already in a default
        fp32 list stays fp32 at O2 too, which lowers default-fp32 ops: natively it joins
        ``unsupported_list``, which every level keeps fp32).

        An op taken out of every list gets ``unlisted`` (Paddle O1 runs it in
        fp32; with ``use_promote`` it is promoted)."""
        d = native_lists("paddle", self.amp_dtype)  # what the policy's defaults are
        by_cat = {"fp32": d.fp32, "lower": d.lower, "promote": d.promote}
        default = {attr: by_cat[cat] for attr, cat in self._sets}
        live = {attr: getattr(self, attr) for attr, _ in self._sets}
        moved: dict[str, set[str]] = {"lower": set(), "fp32": set(), "promote": set(),
                                      "follow": set()}
        for op in set().union(*default.values(), *live.values()):
            now = self._live_category(op, live)
            if now != self._live_category(op, default):
                moved[now or unlisted].add(op)
        for cat, ops in self._custom().items():
            for op in ops:
                if self._live_category(op, live) == cat:
                    for each in moved.values():
                        each.discard(op)
                    moved[cat].add(op)
        return OpLists(**moved)


class AutoMixedPrecisionLists(_Lists):
    """The native ``paddle.static.amp.AutoMixedPrecisionLists``, with live sets.

    ``white_list`` ops run in ``dtype`` (where the device has a kernel),
    ``black_list`` ops in float32, ``gray_list`` ops in their widest input
    dtype (whatever the input order; natively the last input examined decides).
    ``black_varnames``: ops reading or writing these vars run in float32.
    """

    def __init__(self, custom_white_list=None, custom_black_list=None,
                 custom_black_varnames=None, dtype="float16", custom_gray_list=None):
        self.amp_dtype = check_amp_dtype(dtype)
        white = _names(custom_white_list, "custom_white_list")
        black = _names(custom_black_list, "custom_black_list")
        gray = _names(custom_gray_list, "custom_gray_list")  # an extra: ops to promote
        _check_registered(self.amp_dtype, lower=white, fp32=black, promote=gray)
        self._custom_white_list = custom_white_list
        self._custom_black_list = custom_black_list
        self._default_sets()
        self.all_list = set(core.get_all_op_names())
        self.black_varnames = None if custom_black_varnames is None else set(
            _names(custom_black_varnames, "custom_black_varnames"))
        self._apply_custom(self.white_list, self.black_list, white, black)
        for op in gray:
            self.white_list.discard(op)
            self.black_list.discard(op)
            self.gray_list.add(op)
        self._custom_gray_list = custom_gray_list
        self._built()

    def _defaults(self):
        return native_lists("paddle", self.amp_dtype)

    def _custom(self) -> dict[str, frozenset[str]]:
        gray = _names(getattr(self, "_custom_gray_list", None), "custom_gray_list")
        return {"lower": _names(self._custom_white_list, "custom_white_list") - gray,
                "fp32": _names(self._custom_black_list, "custom_black_list") - gray,
                "promote": gray}


CustomOpLists = AutoMixedPrecisionLists  # the native alias


class AutoMixedPrecisionListsBF16(_Lists):
    """The native ``paddle.static.amp.bf16.AutoMixedPrecisionListsBF16``: bf16_list (runs in
    bfloat16), fp32_list, gray_list (widest input), live and editable in place."""

    _sets = (("fp32_list", "fp32"), ("bf16_list", "lower"), ("gray_list", "promote"))

    def __init__(self, custom_bf16_list=None, custom_fp32_list=None,
                 custom_fp32_varnames=None):
        self.amp_dtype = "bfloat16"
        bf16 = _names(custom_bf16_list, "custom_bf16_list")
        fp32 = _names(custom_fp32_list, "custom_fp32_list")
        if bf16 & fp32:
            raise ConflictingOpError(sorted(bf16 & fp32)[0], ["custom_bf16_list",
                                                             "custom_fp32_list"])
        _check_registered("bfloat16", lower=bf16, fp32=fp32)
        self._custom_bf16_list = custom_bf16_list
        self._custom_fp32_list = custom_fp32_list
        self.bf16_initializer_list = set(self._default_sets().initializers)
        self.fp32_varnames = None if custom_fp32_varnames is None else set(
            _names(custom_fp32_varnames, "custom_fp32_varnames"))
        self._apply_custom(self.bf16_list, self.fp32_list, bf16, fp32)
        self._built()

    def _defaults(self):
        return native_lists("paddle", "bfloat16-lists")

    def _custom(self) -> dict[str, frozenset[str]]:
        return {"lower": _names(self._custom_bf16_list, "custom_bf16_list"),
                "fp32": _names(self._custom_fp32_list, "custom_fp32_list")}

    def overrides(self, unlisted: str = "fp32", level: str = "O1") -> OpLists:
        """As for the other lists; at O2 (pure bf16) as the native ``cast_model_to_bf16``,
        which keeps in fp32 only the ops of ``unsupported_list``: the user's fp32 ops (the
        custom ones, and those added to ``fp32_list`` in place) and the ops without a bf16
        kernel here (the kernels' answer). No default list keeps an op fp32 there, neither
        bf16's ``fp32_list`` nor the fp16 decorator's O2 list (``lookup_table_v2``...): the
        overrides' fp32 list replaces the native fp32 lists."""
        moved = super().overrides(unlisted, level)
        if level != "O2":
            return moved
        default_fp32 = self._defaults().fp32
        user = {op for op in self.fp32_list
                if op not in default_fp32 or op in self._custom()["fp32"]}
        return OpLists(lower=moved.lower, promote=moved.promote, follow=moved.follow,
                       fp32=frozenset(user), replace=frozenset({"fp32"}))

    @property
    def black_varnames(self):
        return self.fp32_varnames


def check_lists(amp_lists: object, dtype: str) -> _Lists:
    """``amp_lists`` itself (a native object is converted), or the defaults for None."""
    if amp_lists is None:
        return AutoMixedPrecisionLists(dtype=dtype)
    native = paddle.static.amp
    if isinstance(amp_lists, native.AutoMixedPrecisionLists):  # the native class: its live sets
        ours = AutoMixedPrecisionLists(amp_lists._custom_white_list,
                                       amp_lists._custom_black_list,
                                       amp_lists.black_varnames, amp_lists.amp_dtype)
        ours.white_list, ours.black_list, ours.gray_list = (
            set(amp_lists.white_list), set(amp_lists.black_list), set(amp_lists.gray_list))
        amp_lists = ours
    elif isinstance(amp_lists, native.bf16.AutoMixedPrecisionListsBF16):
        ours = AutoMixedPrecisionListsBF16(amp_lists._custom_bf16_list,
                                           amp_lists._custom_fp32_list, amp_lists.fp32_varnames)
        ours.bf16_list, ours.fp32_list, ours.gray_list = (
            set(amp_lists.bf16_list), set(amp_lists.fp32_list), set(amp_lists.gray_list))
        amp_lists = ours
    if not isinstance(amp_lists, _Lists):
        raise TypeError(f"amp_lists must be a paddle_amp.AutoMixedPrecisionLists, got "
                        f"{type(amp_lists).__name__}")
    if amp_lists.amp_dtype != dtype:
        raise AmpConfigError(f"amp_lists were made for {amp_lists.amp_dtype}, but decorate was "
                             f"called with dtype={dtype!r}")
    return amp_lists
