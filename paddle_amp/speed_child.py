"""paddle_amp's measuring child process (``amp_adapters.services.measure_process``): run as
``python -m paddle_amp.speed_child`` for the static programs' and the dygraph runtime's
speed sources (their ``child``), it serves the core's job timer (``speed_source.time_job``)
with both timer modules loaded, and both runtimes' kernel questions
(``kernels.kernel_answers``, ``dygraph.kernels.eager_answers``, kept on disk by
``amp_adapters.services.device_book``), away from the process that plans, so what a timing
or a probe allocates never stays in that process. (A module of the backend's, not the core's: the core imports no
backend, not even by a computed name.)"""
from amp_adapters.services.measure_process import serve
from amp_adapters.services.speed_source import time_job

from . import speed  # noqa: F401  (the timers the jobs name, loaded for time_job)
from .dygraph import speed as dygraph_speed  # noqa: F401
from .dygraph.kernels import eager_answers
from .kernels import kernel_answers

if __name__ == "__main__":
    serve(time_job, kernel_answers, eager_answers)
