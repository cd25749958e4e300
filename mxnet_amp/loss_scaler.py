"""``mxnet.contrib.amp.loss_scaler``: ``LossScaler``, on the core's state machine.

The native class's interface (``loss_scale``, ``has_overflow(params)``) with
its constants (start 2**16, x2 after 2000 clean steps, /2 on overflow, at most
2**24: ``DynamicLossScale.from_mxnet()``), minus its defects: the new scale is
used by the very next step (natively two steps later) and every gradient on
every device is checked (natively the first device only). ``init_trainer``
attaches a richer object to a Trainer; this one is for code that builds its
own scaler. One host sync per ``has_overflow``.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from amp_adapters import DynamicLossScale, LossScale

from .overflow import FiniteCheck


class LossScaler:
    """Dynamic loss scaler for AMP (the native class, exact and without lag)."""

    def __init__(self, loss_scale: Optional[LossScale] = None):
        self.state: LossScale = loss_scale or DynamicLossScale.from_mxnet()
        self._check = FiniteCheck()

    @property
    def loss_scale(self) -> float:
        """The current loss scale."""
        return self.state.scale

    def has_overflow(self, params: Sequence[Any]) -> bool:
        """True if any gradient of ``params`` (Gluon Parameters) is not finite on any device;
        moves the scale (``adjust(found_inf)``). One host sync."""
        found_inf = bool(self._check.nonfinite(list(params)))
        before = self.state.scale
        self.state = self.state.adjust(found_inf)
        if self.state.scale != before:
            logging.info("AMP: %s loss scale to %f",
                         "decreasing" if self.state.scale < before else "increasing",
                         self.state.scale)
        return found_inf
