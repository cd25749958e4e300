"""``Probe.time``'s measurement, once for both IRs: four small programs (low and float32,
forward and forward + backward), each startup run once in one scope, then the low one
against the float32 one by ``amp_adapters.services.timing.ratio_of`` (interleaved pairs; every run
fetches the loss: a host sync). Each IR's probe only builds a program (``Build``), inside
its own IR guard."""
from __future__ import annotations

from typing import Any, Callable

import paddle

from amp_adapters.rules.device import Cost
from amp_adapters.services.timing import ratio_of

# the budget per ratio: one warm-up pair (an executor's first run builds its plan), then 5
# interleaved pairs, more while 0.1 s lasts
TIMING_BUDGET = {"warmup": 1, "min_pairs": 5, "budget_s": 0.1}

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

    fwd = ratio_of(run((True, False)), run((False, False)), **TIMING_BUDGET)
    if not training:
        return Cost(*fwd)
    return Cost(*fwd, *ratio_of(run((True, True)), run((False, True)), **TIMING_BUDGET))
