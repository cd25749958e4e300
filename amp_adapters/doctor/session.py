"""``Session``: what every backend's doctor answers once it has seen steps, written once."""
from __future__ import annotations

from typing import ClassVar

from ..policy import Policy
from .recommend import Recommendation, recommend
from .report import DoctorReport, Recorder


class Session:
    """A backend's doctor keeps ``policy``, a ``Recorder`` and the count of ``steps`` seen;
    the report and the recommendation come from those alone. ``no_step`` says what to run
    inside the ``with`` block when the doctor saw nothing."""

    no_step: ClassVar[str]
    policy: Policy
    steps: int
    _recorder: Recorder

    def report(self) -> DoctorReport:
        """What the doctor saw so far (``print`` it for the table)."""
        if not self.steps:
            raise RuntimeError(f"the doctor saw no step: {self.no_step}")
        return self._recorder.report()

    def recommendation(self) -> Recommendation:
        """The policy with the findings applied, as data and as TOML (``.write(path)``)."""
        return recommend(self.report(), self.policy)
