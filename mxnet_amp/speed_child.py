"""mxnet_amp's measuring child process (``amp_adapters.services.measure_process``): run as
``python -m mxnet_amp.speed_child`` for ``speed.MXNetSource`` (its ``child``) and for the
kernel questions, it serves the core's job timer (``speed_source.time_job``) with this
backend's timer module loaded, and the kernel probes (``kernels.kernel_answers``, kept on
disk by ``amp_adapters.services.device_book``), away from the process that plans, so what a
timing or a probe allocates never changes nor stays in that process. (A module of the
backend's, not the core's: the core imports no backend, not even by a computed name.)"""
from amp_adapters.services.measure_process import serve
from amp_adapters.services.speed_source import time_job

from . import speed  # noqa: F401  (the timer the jobs name, loaded for time_job)
from .kernels import kernel_answers

if __name__ == "__main__":
    serve(time_job, kernel_answers)
