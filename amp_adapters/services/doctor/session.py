"""``Session``: what every backend's doctor answers once it has seen steps, written once."""
from __future__ import annotations

from typing import AbstractSet, ClassVar, Optional

from ...rules.policy import Policy
from .bf16 import Bf16Speed
from .recommend import Recommendation, recommend
from .report import DoctorReport, Recorder


class Session:
    """A backend's doctor keeps ``policy``, a ``Recorder`` and the count of ``steps`` seen;
    the report and the recommendation come from those alone. ``no_step`` says what to run
    inside the ``with`` block when the doctor saw nothing."""

    no_step: ClassVar[str]
    can_replay: ClassVar[bool] = False  # the backend keeps its steps and overrides replay
    policy: Policy
    steps: int
    _recorder: Recorder

    def report(self) -> DoctorReport:
        """What the doctor saw so far (``print`` it for the table)."""
        if not self.steps:
            raise RuntimeError(f"the doctor saw no step: {self.no_step}")
        return self._recorder.report()

    def replay(self, policy: Policy) -> DoctorReport:
        """The trial of ``policy`` (``verify``): its report of training under it from the
        state the first recorded step started from, over the recorded batches in order,
        with optimizer updates (each step marked ``updated``) (a backend that keeps its
        steps overrides this and sets ``can_replay``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot replay its steps")

    def bf16_kernels(self) -> Optional[AbstractSet[str]]:
        """The op names with a bfloat16 kernel (forward and backward) on the device the
        model runs on, for the bfloat16 candidate (None: the backend does not say)."""
        return None

    def bf16_speed(self) -> Bf16Speed:
        """What is known of bfloat16's speed where the model runs, for the bfloat16
        candidate (``bf16.refusal``): by default this CPU's class from the device's truth
        (``isa.bf16_class``), nothing measured. A backend on another device overrides it."""
        from ...rules.isa import machine
        return Bf16Speed.of_machine(machine())

    def recommendation(self) -> Recommendation:
        """The narrowest fix whose trial passes on steps held out of its derivation
        (``verify``), as data and as TOML (``.write(path)``); computed once per number of
        steps seen (each candidate costs a trial)."""
        cached = getattr(self, "_recommended", None)
        if cached is not None and cached[0] == self.steps:
            return cached[1]
        report = self.report()
        rec = recommend(report, self.policy, replay=self.replay if self.can_replay else None,
                        bf16_kernels=self.bf16_kernels(), bf16_speed=self.bf16_speed())
        self._recommended = (self.steps, rec)
        return rec
