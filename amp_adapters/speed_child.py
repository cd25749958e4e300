"""The measuring child of every runtime (``amp_adapters.measure_process``): run as ``python -m
amp_adapters.speed_child TIMER`` by ``speed_source.measure``, it imports the source's timer
module ``TIMER`` (its framework loads once, here) and times jobs (``speed_source.time_job``)
away from the process that plans, so what a timing allocates never changes that process."""
import importlib
import sys

from amp_adapters.measure_process import serve
from amp_adapters.speed_source import time_job

if __name__ == "__main__":
    for timer in sys.argv[1:]:
        importlib.import_module(timer)
    serve(time_job)
