"""State-dict corruptions shared by the core, MXNet and Paddle tests (each asserts that the
load fails naming the key and value, and that nothing changed)."""
import copy
import math

from amp_adapters import DynamicLossScale

GOOD = DynamicLossScale(scale=4.0, good_steps=1, bad_steps=1, total_steps=9, skipped_steps=3,
                        hysteresis=2, max_scale=math.inf, init_scale=8.0).state_dict()


def corrupt(path, value, d=GOOD):
    d = copy.deepcopy(d)
    *outer, last = path
    target = d
    for k in outer:
        target = target[k]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return d


CORRUPTIONS = [
    (("state", "scale"), KeyError, "'scale'"),
    (("state", "good_steps"), KeyError, "'good_steps'"),
    (("config", "hysteresis"), KeyError, "'hysteresis'"),
    (("format_version",), KeyError, "'format_version'"),
    (("state", "bogus"), 1, "'bogus'"),
    (("extra",), 1, "'extra'"),
    (("state", "scale"), "4.0", "'4.0'"),
    (("state", "good_steps"), True, "True"),
    (("state", "total_steps"), 9.0, "9.0"),
    (("state", "skipped_steps"), -1, "-1"),
    (("state", "total_steps"), 2**70, str(2**70)),
    (("state", "scale"), math.nan, "nan"),
    (("state", "scale"), math.inf, "inf"),
    (("state", "scale"), -4.0, "-4.0"),
    (("state", "scale"), 0.0, "0.0"),
    (("format_version",), 2, "2"),
    (("format_version",), True, "True"),
    (("format_version",), 1.0, "1.0"),
    (("config", "growth_factor"), 3.0, "3.0"),
    (("config", "init_scale"), 16.0, "16.0"),
    (("kind",), "static", "'static'"),
]
