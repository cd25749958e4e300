"""The toy source's measuring child (tests/core/test_speed_source.py): the core's job timer
with the toy timer loaded, as each backend's speed_child does."""
from amp_adapters.services.measure_process import serve
from amp_adapters.services.speed_source import time_job

import speed_toy_timer  # noqa: F401  (the timer the jobs name)

if __name__ == "__main__":
    serve(time_job)
