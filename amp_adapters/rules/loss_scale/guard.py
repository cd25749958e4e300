"""The one overflow guard both backends call: stop instead of skipping forever.

``check_guard`` raises ``OverflowGuardError`` (naming the settings involved
and the parameters whose gradients were non-finite) when

- ``max_consecutive_skips`` overflow steps came in a row;
- a dynamic scale has reached 0 or a float32 denormal (a no-floor config such
  as ``from_torch``/``from_mxnet`` under interleaved overflows: the clean steps
  in between reset the consecutive counter, so only this catches it);
- more than ``max_skip_fraction`` of the last ``skip_window`` steps were skipped
  (when configured; ``SkipWindow`` is the host-side bookkeeping for that).

It reads host values: a backend calls it where it already has the state on the
host (MXNet: every step; Paddle: ``check_guard()``, a scope read).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Union

from ..errors import OverflowGuardError
from .config import LossScaleConfig
from .checks import F32_TINY
from .state import LossScaleState


@dataclass(frozen=True)
class SkipWindow:
    """Where the current skip-fraction window started: ``(total_steps, skipped_steps)``."""

    total_steps: int = 0
    skipped_steps: int = 0

    @classmethod
    def at(cls, state: LossScaleState) -> "SkipWindow":
        return cls(state.total_steps, state.skipped_steps)


def check_guard(config: LossScaleConfig, state: LossScaleState,
                nonfinite_params: Union[Iterable[str], Callable[[], Iterable[str]]] = (),
                window: Optional[SkipWindow] = None) -> Optional[SkipWindow]:
    """Raise ``OverflowGuardError`` if ``state`` may not go on under ``config``.

    ``nonfinite_params``: the names to put in the error, or a function that returns them
    (called only when raising, e.g. a device read). Returns the skip window to pass next
    time (a new one each ``skip_window`` steps); None when ``max_skip_fraction`` is off."""
    if not config.checks_overflow:
        return None

    class _Names:  # the error's param_names, computed only if it is raised
        def __iter__(self):
            src = nonfinite_params() if callable(nonfinite_params) else nonfinite_params
            return iter(list(src))
    names = _Names()
    if config.kind == "dynamic" and state.scale < F32_TINY:
        raise OverflowGuardError(
            state.consecutive_skips, state.scale, names,
            reason=(f"the loss scale collapsed to {state.scale:g} (0 or a float32 denormal, "
                    f"below {F32_TINY:g}) after {state.skipped_steps} skipped of "
                    f"{state.total_steps} steps: min_scale={config.min_scale:g} is no floor "
                    f"with backoff_factor={config.backoff_factor:g}, "
                    f"growth_interval={config.growth_interval}; set min_scale (e.g. 1.0) or "
                    f"fix the source of the overflows"))
    limit = config.max_consecutive_skips
    if limit is not None and state.consecutive_skips >= limit:
        raise OverflowGuardError(state.consecutive_skips, state.scale, names)
    if config.max_skip_fraction is None:
        return None
    window = window or SkipWindow()
    steps = state.total_steps - window.total_steps
    if steps < config.skip_window:
        return window
    skipped = state.skipped_steps - window.skipped_steps
    if skipped > config.max_skip_fraction * steps:
        raise OverflowGuardError(
            state.consecutive_skips, state.scale, names,
            reason=(f"{skipped} of the last {steps} steps were skipped for overflow, more "
                    f"than max_skip_fraction={config.max_skip_fraction:g} of "
                    f"skip_window={config.skip_window} (loss scale now {state.scale:g})"))
    return SkipWindow.at(state)
