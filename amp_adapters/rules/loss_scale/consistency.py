"""The one rule for a state under its config: counters that contradict it are refused.

A state enters from a constructor (``DynamicLossScale(bad_steps=...)``), a state dict, a
checkpoint or a backend's ``load_state_dict``; every one of them calls ``check_state``,
so a state the machine could never reach under its config (one that would freeze or skew
the scale) is an ``AmpConfigError`` naming the field, wherever it comes from:

- ``scale``: within ``[min_scale, max_scale]`` for a dynamic scale; a static scale is its
  ``init_scale``, ``kind='none'`` is 1;
- ``bad_steps < hysteresis`` (the scale backs off when it gets there, and resets it) and
  ``good_steps < growth_interval`` (likewise): a counter past its threshold never fires;
- ``consecutive_skips <= skipped_steps <= total_steps``;
- a static scale or none keeps no ``good_steps``/``bad_steps``, and none skips nothing
  (a dynamic state dict whose ``kind`` was edited is refused here).

Every state ``update`` reaches from ``LossScaleState.initial(config)`` passes.
"""
from __future__ import annotations

from typing import Callable

from ..errors import AmpConfigError
from .config import LossScaleConfig
from .state import LossScaleState


def check_state(config: LossScaleConfig, state: LossScaleState,
                name: Callable[[str], str] = "LossScaleState.{}".format) -> None:
    """Raise ``AmpConfigError`` if ``state`` contradicts ``config``; ``name(field)`` is how the
    message names the field (``DynamicLossScale.bad_steps``, ``state_dict['state'][...]``)."""
    def refuse(field: str, why: str) -> AmpConfigError:
        return AmpConfigError(f"{name(field)} = {getattr(state, field)!r}: {why}")

    kind = config.kind
    if kind == "dynamic" and not config.min_scale <= state.scale <= config.max_scale:
        raise refuse("scale", f"must be within [min_scale, max_scale] = [{config.min_scale:g}, "
                              f"{config.max_scale:g}] of its config")
    fixed = {"static": config.init_scale, "none": 1.0}.get(kind)
    if fixed is not None and state.scale != fixed:
        raise refuse("scale", f"a {kind!r} scale never moves from {fixed:g}")
    if state.skipped_steps > state.total_steps:
        raise refuse("skipped_steps", f"more skipped steps than steps (total_steps = "
                                      f"{state.total_steps})")
    if state.consecutive_skips > state.skipped_steps:
        raise refuse("consecutive_skips", f"more skips in a row than skips in all "
                                          f"(skipped_steps = {state.skipped_steps})")
    if kind == "dynamic":
        if state.bad_steps >= config.hysteresis:
            raise refuse("bad_steps", f"must be < hysteresis = {config.hysteresis}: the scale "
                                      f"backs off when bad_steps reaches it, so a state past "
                                      f"it would never back off")
        if state.good_steps >= config.growth_interval:
            raise refuse("good_steps", f"must be < growth_interval = "
                                       f"{config.growth_interval}: the scale grows when "
                                       f"good_steps reaches it, so a state past it would "
                                       f"never grow")
        return
    moved = ("good_steps", "bad_steps") + (
        ("skipped_steps", "consecutive_skips") if not config.checks_overflow else ())
    for field in moved:
        if getattr(state, field) != 0:
            raise refuse(field, f"a loss scale of kind {kind!r} keeps none (only a dynamic "
                                f"one counts them): was the kind edited?")
