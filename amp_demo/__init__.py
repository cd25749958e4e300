"""amp_demo: the ``amp-adapters demo`` command, above the library (core and both backends);
also ``doctor`` and ``max-batch``.

One MLP on scikit-learn's digits, trained in each framework in fp32 and with
AMP under one policy, printed side by side and plotted. This is the only
package that uses both backends; the library never imports it (the core's CLI
finds ``demo`` through the entry-point group ``amp_adapters.commands``).

Files:

    data.py            the digits split, initial weights, batch order; ``evaluate``
    result.py          ``TrainResult`` (one run) and the mode label
    trainers.py        ``train``, ``steps_of``, ``batch_workload``, policies; backends when asked
    numpy_trainer.py   reference trainer: fp32 or fp16 emulated at op boundaries, by hand
    mxnet_trainer.py   the Gluon trainer, through ``mxnet_amp``
    paddle_trainer.py  the static-program trainer, through ``paddle_amp``
    paddle_dygraph_trainer.py  the dynamic-graph trainer, through ``paddle_amp.dygraph``
    memory.py          the peak-memory column (a fresh process per row) and max-batch's steps
    batch_models.py    the models ``max-batch`` measures (digits, mlp, cnn), by name
    max_batch_command.py  the ``max-batch`` subcommand: the largest batch in a memory budget
    table.py, plot.py  the side-by-side table and the figure
    command.py         the ``demo`` subcommand (``register``) and ``python -m amp_demo``
    doctor_command.py  the ``doctor`` subcommand: the numerics doctor on a planted demo model
    speed.py           the speed table: a GEMM-bound step, fp32 vs AMP, one child per row
    doctor_models.py   the doctor's demo models (planted overflow / underflow / reduction)
"""
from .data import DigitsData, digits_data, evaluate
from .result import OnStep, TrainResult, mode_label
from .trainers import FRAMEWORKS, train

__all__ = ["DigitsData", "digits_data", "evaluate", "OnStep", "TrainResult", "mode_label",
           "FRAMEWORKS", "train"]
