"""O2 parameters in a program of either IR: low-precision storage and float32 master weights.

Which parameters are stored low is the core's ``plan_params`` (via
``Rewriter.param_plan``); this module carries it out. Two ways to keep the
float32 masters:

- native (a GPU whose optimizer has a low-precision kernel): the optimizer's
  own ``multi_precision`` master weights, updated by the fused kernel;
- EMULATED (a CPU, or any device without such a kernel): each low parameter
  ``p`` gets a persistable float32 parameter ``p_fp32_master``; the low
  gradient is cast to float32 (unscaled and checked there), the optimizer's
  float32 kernel updates the master and its state, and a cast writes the
  master back into ``p`` after every step. The update then has exactly the
  numerics of the fused kernel (float32 arithmetic on the master, one rounding
  into the low dtype), on kernels every build has. An overflow step skips the
  optimizer (``scaling``), so master, state and ``p`` stay bit-identical.

Masters are ordinary persistable parameters of the program, so
``paddle.static.save``/``load`` checkpoint them with the rest. No host sync
in the step; ``init_scope`` (from ``amp_init``) reads and writes the scope once.
"""
from __future__ import annotations

from typing import AbstractSet

import numpy as np
from paddle.base import unique_name

from amp_adapters import dtype_name

from .env import from_low, to_low
from .ir import MastersIR

EMULATED_LABEL = ("EMULATED multi_precision update: the float32 optimizer kernel updates "
                  "float32 master weights and a cast writes them into the {dtype} parameters "
                  "(a GPU with a {dtype} optimizer kernel uses the fused native one)")
NATIVE_LABEL = "native multi_precision update (the optimizer's fused {dtype} kernel)"


class MasterWeights:
    """The emulated float32 masters of the low parameters ``names`` of one program."""

    def __init__(self, dtype: str, names: AbstractSet[str]):
        self.dtype = dtype
        self.names = frozenset(names)
        self.master_of: dict[str, str] = {}  # low parameter -> its master
        self._params: dict[str, tuple] = {}  # master name -> (low parameter, master)

    def swap_in(self, ir: MastersIR, params_grads: list) -> list:
        """(master, float32 grad) in place of (low param, low grad), after the backward, in
        the program ``ir`` (either IR: ``ProgramIR.new_master``/``master_grad``)."""
        out = []
        for p, g in params_grads:
            if p.name not in self.names or g is None:
                out.append((p, g))
                continue
            master = ir.new_master(p, unique_name.generate(f"{p.name}_fp32_master"))
            self.master_of[p.name] = master.name
            self._params[master.name] = (p, master)
            out.append((master, ir.master_grad(g)))
        return out

    def copy_back(self, ir: MastersIR) -> None:
        """``p = cast(master)`` for every master, at the end of the program (optimizer ops)."""
        for p, master in self._params.values():
            ir.write_cast(master, p)

    def init_scope(self, scope, place, rounded_masters: bool = False) -> None:
        """Masters from the parameters' values, then the parameters converted to the low dtype
        (with ``rounded_masters``, the native ``rewrite_master_weight``: each master is its
        parameter's low value, not the float32 one).

        A parameter already low (a second ``amp_init``, or a loaded O2 checkpoint) is not
        converted again; its master is kept when present, else made from it."""
        for name in sorted(self.names):
            tensor = scope.find_var(name).get_tensor()
            low = dtype_name(tensor._dtype()) == self.dtype
            master = self.master_of.get(name)
            if master is not None:
                var = scope.find_var(master)
                if not low or var is None or not var.get_tensor()._is_initialized():
                    values = from_low(tensor, self.dtype) if low else np.array(tensor)
                    if rounded_masters and not low:
                        values = from_low(to_low(values, self.dtype), self.dtype)
                    scope.var(master).get_tensor().set(values.astype(np.float32), place)
            if not low:
                tensor.set(to_low(tensor, self.dtype), place)
