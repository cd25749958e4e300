"""paddle_amp's measuring child process (``amp_adapters.measure_process``): run as
``python -m paddle_amp.speed_child`` by ``speed.timer``, it times ops (``speed.time_on``)
away from the process that plans, so what a timing allocates never changes that process."""
from amp_adapters.measure_process import serve

from .speed import time_on

if __name__ == "__main__":
    serve(time_on)
