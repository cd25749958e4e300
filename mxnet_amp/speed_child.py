"""mxnet_amp's measuring child process (``amp_adapters.measure_process``): run as
``python -m mxnet_amp.speed_child`` by ``speed.measurer``, it times ops (``speed.measure_on``)
away from the process that plans, so what a timing allocates never changes that process."""
from amp_adapters.measure_process import serve

from .speed import measure_on

if __name__ == "__main__":
    serve(measure_on)
