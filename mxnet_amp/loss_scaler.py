"""``mxnet.contrib.amp.loss_scaler``: ``LossScaler``, on the core's state machine.

The native class's interface (``loss_scale``, ``has_overflow(params)``) with
its constants (start 2**16, x2 after 2000 clean steps, /2 on overflow, at most
2**24: ``DynamicLossScale.from_mxnet()``), minus its defects: the new scale is
used by the very next step (natively two steps later) and every gradient on
every device is checked (natively the first device only). ``init_trainer``
attaches a richer object to a Trainer; this one is for code that builds its
own scaler. Like the trainer's, every ``has_overflow`` then asks the core's
guard (``loss_scale.check_guard``): a collapsed scale or
``max_consecutive_skips`` overflows in a row raise ``OverflowGuardError``
instead of skipping forever. One host sync per ``has_overflow``.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from amp_adapters import DynamicLossScale, LossScale
from amp_adapters.rules.loss_scale import SkipWindow, check_guard

from .native_fields import NativeScalerFields
from .overflow import FiniteCheck


class LossScaler(NativeScalerFields):
    """Dynamic loss scaler for AMP (the native class, exact and without lag).

    Its fields (``_loss_scale``, ``_next_loss_scale``, ``_unskipped``, ``_scale_seq_len``,
    ``_max_loss_scale``) are views of ``state`` with the native's meaning, writable through
    the core's checks (see ``native_fields``); ``loss_scale`` is read-only as natively."""

    OWN = frozenset({"state", "_check", "_window"})

    def __init__(self, loss_scale: Optional[LossScale] = None):
        self.state: LossScale = loss_scale or DynamicLossScale.from_mxnet()
        self._check = FiniteCheck()
        self._window: Optional[SkipWindow] = SkipWindow.at(self.state.state)

    def has_overflow(self, params: Sequence[Any]) -> bool:
        """True if any gradient of ``params`` (Gluon Parameters) is not finite on any device;
        moves the scale (``adjust(found_inf)``), then the core's guard may raise
        ``OverflowGuardError`` naming those parameters. One host sync."""
        nonfinite = self._check.nonfinite(list(params))
        found_inf = bool(nonfinite)
        before = self.state.scale
        self.state = self.state.adjust(found_inf)
        if self.state.scale != before:
            logging.info("AMP: %s loss scale to %f",
                         "decreasing" if self.state.scale < before else "increasing",
                         self.state.scale)
        self._window = check_guard(self.state.config, self.state.state, nonfinite, self._window)
        return found_inf
