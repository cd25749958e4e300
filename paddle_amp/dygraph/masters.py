"""O2's float32 master weights in eager mode, kept by the optimizer in the native's format.

Paddle's optimizers have no CPU kernel for a bf16 or fp16 parameter (Adam, Momentum: float
and double), and no CPU kernel unscales a low-precision gradient. So, as the static drop-in
does (``paddle_amp.masters``, EMULATED), each low parameter ``p`` has a float32 master, and
the optimizer's own float32 kernel updates the master; the master is then written into
``p`` with one rounding. The update has the numerics of the native's fused multi-precision
kernel: float32 arithmetic on the master and its moments, one rounding into the low dtype.

The native's format is kept: the masters are ``optimizer._master_weights``
({parameter name: float32 tensor named ``<param>_fp32_master_<n>``}), so
``optimizer.state_dict()["master_weights"]`` holds them by parameter name (PaddleNLP reads
that at resume), and the moments are keyed by the master's name, as the native's
(``linear_0.w_0_fp32_master_0_moment1_0``). ``set_state_dict`` copies the loaded masters
into the live ones (a master missing from the dict is made again from its parameter, as the
native makes one).

How: the optimizer's ``step``/``minimize`` are wrapped on the instance; for the call, each
low parameter in its parameter list (and groups) is replaced by its master carrying the
parameter's gradient widened to float32 (``core.eager.set_master_grads``, the native's own
master-grad cast: exact), then the master is rounded back into ``p``. Parameter names seen
by ``apply_decay_param_fun`` (AdamW) stay the parameters'. ``master_weight=False``: no
master is kept across steps (each step starts from the low parameter, as the native's
update of a low parameter does), and ``state_dict()`` has no ``master_weights``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from amp_adapters import AmpConfigError

from . import kernels

KEY = "_amp_adapters_o2"  # the optimizer's attribute holding its Masters


def is_low(t: Any) -> bool:
    import paddle
    return t.dtype in (paddle.float16, paddle.bfloat16)


def widen_grads(params: list) -> None:
    """The low-precision gradients of ``params`` replaced by their float32 values (exact), as
    the native's ``master_grad`` does, so float32 kernels (unscale, the update) read them."""
    from paddle.base import core
    low = [p for p in params if p._grad_ivar() is not None and is_low(p._grad_ivar())]
    if low:
        core.eager.set_master_grads(low)


class Masters:
    """The float32 masters of one optimizer's low parameters."""

    def __init__(self, optimizer: Any, params: dict, dtype: str, keep: bool):
        import paddle
        from paddle.utils import unique_name
        self.optimizer, self.dtype, self.keep = optimizer, dtype, keep
        self.params = {name: p for name, p in params.items()}  # low parameters, by name
        self.masters: dict[str, Any] = {}
        for name, p in self.params.items():
            # a constant start (its values are set below): no draw from the user's RNG
            master = paddle.create_parameter(
                list(p.shape), "float32", name=unique_name.generate(name + "_fp32_master"),
                default_initializer=paddle.nn.initializer.Constant(0.0))
            for attr in ("optimize_attr", "regularizer", "need_clip", "do_model_average"):
                if hasattr(p, attr):
                    setattr(master, attr, getattr(p, attr))
            self.masters[name] = master
        self.of_master = {m.name: n for n, m in self.masters.items()}
        if keep:
            optimizer._master_weights = dict(self.masters)

    def set_from(self, values: dict) -> None:
        """Masters from ``values`` ({name: float32 values}) or, where missing, their parameter."""
        import paddle
        with paddle.no_grad():
            for name, master in self.masters.items():
                value = values.get(name)
                if value is None:
                    value = self.params[name].astype("float32")
                master.set_value(value if isinstance(value, paddle.Tensor) else
                                 paddle.to_tensor(value))

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The optimizer's parameter lists with each low parameter replaced by its master
        (holding the parameter's float32 gradient) for one update; the masters rounded back
        into the parameters after it."""
        import paddle
        opt = self.optimizer
        if not self.keep:
            self.set_from({})
        widen_grads(list(self.params.values()))
        for name, master in self.masters.items():
            g = self.params[name]._grad_ivar()
            if g is None:
                master.clear_gradient(False)
            else:
                master._set_grad_ivar(g)
        by_id = {id(p): self.masters[n] for n, p in self.params.items()}
        lists = [opt._parameter_list] if not _grouped(opt) else []
        lists += [g["params"] for g in (opt._param_groups or []) if isinstance(g, dict)]
        saved = [list(lst) for lst in lists]
        decay = getattr(opt, "_apply_decay_param_fun", None)
        for lst in lists:
            lst[:] = [by_id.get(id(p), p) for p in lst]
        if decay is not None:  # AdamW: the user's function judges the parameter's name
            opt._apply_decay_param_fun = lambda n: decay(self.of_master.get(n, n))
        try:
            yield
        finally:
            for lst, old in zip(lists, saved):
                lst[:] = old
            if decay is not None:
                opt._apply_decay_param_fun = decay
            cast = kernels.rounding_cast()
            with paddle.no_grad():
                for name, master in self.masters.items():
                    p = self.params[name]
                    paddle.assign(cast(master, self.dtype), output=p)
                    master.clear_gradient(False)


def _refuse_in_program(method: str) -> None:
    """An O2 optimizer's ``method`` called while a program is being built (a whole training
    step under ``paddle.jit.to_static``, legacy IR): its float32 masters are eager state,
    swapped and rounded back by eager ops, which a program trace cannot run (it crashed the
    process in Paddle's eager cast). Refused, naming the way that works."""
    import paddle
    if not paddle.in_dynamic_mode():
        raise AmpConfigError(
            f"paddle_amp.dygraph: optimizer.{method}() of an O2-decorated optimizer inside "
            "paddle.jit.to_static: its float32 master weights are eager state, which a "
            "program cannot update; convert the model's forward with to_static and call "
            f"loss.backward() and optimizer.{method}() outside it (docs/dygraph.md)")


def optimizer_params(opt: Any) -> list:
    """The parameters ``opt`` updates (of every group)."""
    groups = getattr(opt, "_param_groups", None)
    if groups and isinstance(groups[0], dict):
        return [p for g in groups for p in g["params"]]
    return list(opt._parameter_list or [])


def _grouped(opt: Any) -> bool:
    lst = opt._parameter_list
    return bool(lst) and isinstance(lst[0], dict)


def attach(optimizer: Any, params: dict, dtype: str, keep: bool, fp32_values: dict) -> Masters:
    """Give ``optimizer`` float32 masters of ``params`` (low, by name; ``fp32_values``: their
    float32 values before the cast, the masters' start) and wrap its ``step``, ``minimize``
    and ``set_state_dict`` on the instance."""
    masters = Masters(optimizer, params, dtype, keep)
    masters.set_from(fp32_values)
    step, minimize, load = optimizer.step, optimizer.minimize, optimizer.set_state_dict

    def o2_step(*args: Any, **kwargs: Any):
        _refuse_in_program("step")
        with masters.swapped():
            return step(*args, **kwargs)

    def o2_minimize(loss: Any, startup_program: Any = None, parameters: Any = None,
                    no_grad_set: Any = None):
        _refuse_in_program("minimize")
        with masters.swapped():
            if parameters is not None:
                parameters = [masters.masters.get(getattr(p, "name", None), p)
                              if any(p is q for q in masters.params.values()) else p
                              for p in parameters]
            return minimize(loss, startup_program, parameters, no_grad_set)

    def o2_set_state_dict(state_dict: Any):
        saved = state_dict.get("master_weights") if isinstance(state_dict, dict) else None
        load(state_dict)
        masters.set_from(dict(saved) if isinstance(saved, dict) else {})
        if masters.keep:
            optimizer._master_weights = dict(masters.masters)

    optimizer.step, optimizer.minimize = o2_step, o2_minimize
    optimizer.set_state_dict = optimizer.set_dict = o2_set_state_dict
    setattr(optimizer, KEY, masters)
    return masters
