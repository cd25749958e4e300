"""``Probe.time``'s measurement, once for both IRs: four small programs (low and float32,
forward and forward + backward), each startup run once in one scope, then the low one
against the float32 one by the core's ``speed_source.cost_of`` (interleaved pairs within
its ``BUDGET_S``; every run fetches the loss: a host sync). Each IR's probe only builds a program
(``Build``), inside
its own IR guard."""
from __future__ import annotations

from typing import Any, Callable

import paddle

from amp_adapters.rules.device import Cost
from amp_adapters.services import speed_source

Build = Callable[[Any, Any, bool, bool], Any]  # (main, startup, low, backward) -> the loss


def cost_of(build: Build, training: bool, place: Any = None) -> Cost:
    """The low program's time over the float32 one's, forward and, with ``training``, forward
    and backward (``Cost``), run on ``place`` (default the CPU: the place the program the
    measurement is for runs on). Raises what a build or a run raises."""
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace() if place is None else place)
    progs = {}
    for low in (True, False):
        for backward in (False, True) if training else (False,):
            main, startup = paddle.static.Program(), paddle.static.Program()
            loss = build(main, startup, low, backward)
            with paddle.static.scope_guard(scope):
                exe.run(startup)
            progs[low, backward] = (main, loss)

    def run(key):
        main, loss = progs[key]
        return lambda: exe.run(main, fetch_list=[loss], scope=scope)

    return speed_source.cost_of(lambda backward: run((True, backward)),
                                lambda backward: run((False, backward)), training)
