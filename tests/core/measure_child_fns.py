"""A measuring child for tests/core/test_measure_process.py: standard functions served by
``amp_adapters.services.measure_process.serve`` (run as ``python -m measure_child_fns``)."""
import copy
import math
import os
import time

from amp_adapters.rules.device import Cost
from amp_adapters.services.measure_process import serve

if __name__ == "__main__":
    serve(os.getpid, os.getenv, math.sqrt, print, os.abort, os._exit, copy.copy, time.sleep,
          Cost)
