"""O2's parameter storage in eager mode: which parameters of a model are stored low, and the
cast that stores them.

The decision is the core's ``plan_params`` (as for a program and a Gluon block): this file
only lists each parameter's readers (``ParamUse``) by every layer that holds it, and applies
the answer. A dygraph model has no program to read its readers from, so they come from the
layer's type (``READERS``: a ``Linear``'s weight is read by ``matmul_v2``, a norm's scale by
its norm op in the ``Scale`` slot, ...). A reader that this runtime does not route
(``wrappers.PLANNED_OPS``: only the wrapped ops meet a low parameter with a cast or a
oneDNN kernel; any other op would get a bf16 tensor it has no CPU kernel for) is marked
``force_fp32``, so the parameter it reads stays float32 (a bias added after the GEMM, a
norm's scale and bias, an embedding). So is every parameter of ``excluded_layers`` and of
a layer type the table does not know. On a CPU class without a bf16 kernel for an op (and
without ``emulate=True``) its weight stays float32 too: O2 stores low only what then runs
low.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from amp_adapters import ParamPlan, ParamUse, plan_params

from . import kernels, wrappers

NOT_ROUTED = ("this runtime does not route it in eager mode (it runs as "
              "Paddle runs it: float32 on a CPU, where a bf16 tensor has no kernel)")
EXCLUDED = "in excluded_layers"
UNKNOWN = ("a parameter of {layer}, whose readers this runtime does not know: kept float32 "
           "(O2 stores low only what the planner sees read by a low op)")


def _readers() -> dict[type, dict[str, tuple[str, Optional[str]]]]:
    """{layer type: {parameter attribute: (the program op that reads it, its slot)}}."""
    import paddle.nn as nn
    norm = {"weight": ("{op}", "Scale"), "bias": ("{op}", "Bias")}
    table: dict[type, dict[str, tuple[str, Optional[str]]]] = {
        nn.Linear: {"weight": ("matmul_v2", "Y"), "bias": ("elementwise_add", "Y")},
        nn.Conv2D: {"weight": ("conv2d", "Filter"), "bias": ("elementwise_add", "Y")},
        nn.Embedding: {"weight": ("lookup_table_v2", "W")},
    }
    for names, op in ((("BatchNorm", "BatchNorm1D", "BatchNorm2D", "BatchNorm3D",
                        "SyncBatchNorm"), "batch_norm"),
                      (("LayerNorm",), "layer_norm"), (("GroupNorm",), "group_norm"),
                      (("InstanceNorm1D", "InstanceNorm2D", "InstanceNorm3D"), "instance_norm")):
        for name in names:
            if hasattr(nn, name):
                table[getattr(nn, name)] = {k: (v[0].format(op=op), v[1])
                                            for k, v in norm.items()}
    return table


def _excluded(models: list, excluded_layers: Any) -> set[int]:
    """ids of the layers ``excluded_layers`` names (instances with their sublayers; types)."""
    if excluded_layers is None:
        return set()
    items = excluded_layers if isinstance(excluded_layers, (list, tuple)) else [excluded_layers]
    types = tuple(x for x in items if isinstance(x, type))
    out = set()
    for x in items:
        if not isinstance(x, type):
            out |= {id(s) for s in x.sublayers(include_self=True)}
    for model in models:
        out |= {id(s) for s in model.sublayers(include_self=True) if types and
                isinstance(s, types)}
    return out


def holders(models: list) -> Iterable[tuple[Any, str, Any]]:
    """(layer, attribute, parameter) for every layer of ``models`` (each once) and every
    parameter it holds: a parameter tied between layers (a head sharing an embedding's
    weight) comes once per holder, so its plan sees every reader."""
    seen: set[int] = set()
    for model in models:
        for layer in model.sublayers(include_self=True):
            if id(layer) not in seen:
                seen.add(id(layer))
                for attr, p in layer.named_parameters(include_sublayers=False):
                    yield layer, attr, p


def plan(models: list, policy: Any, excluded_layers: Any = None) -> tuple[ParamPlan, dict]:
    """The core's plan for every parameter of ``models`` under ``policy`` on this CPU, and
    {parameter name: the parameter}."""
    table, excluded = _readers(), _excluded(models, excluded_layers)
    found: dict[str, list[ParamUse]] = {}
    unknown: dict[str, str] = {}
    params = {}
    for layer, attr, p in holders(models):  # every holder: a tied weight has all its readers
        params[p.name] = p
        found.setdefault(p.name, [])
        reader = next((v.get(attr) for t, v in table.items() if type(layer) is t), None)
        if reader is None:
            unknown.setdefault(p.name, type(layer).__name__)
            continue
        op, slot = reader
        force = EXCLUDED if id(layer) in excluded else (
            None if op in wrappers.PLANNED_OPS else NOT_ROUTED)
        found[p.name].append(ParamUse(op, slot=slot, force_fp32=force,
                                      instance=(type(layer).__name__,)))
    # a parameter any holder of which reads it in a way not known here: no readers (float32)
    uses = {name: () if name in unknown else tuple(u) for name, u in found.items()}
    device = kernels.device_profile(policy.dtype) if policy.enabled else None
    planned = plan_params(policy, "paddle", uses, device=device)
    reasons = dict(planned.reasons)
    for name, layer in unknown.items():
        reasons[name] = UNKNOWN.format(layer=layer)
    return ParamPlan(dict(planned.dtypes), reasons), params


def store_low(p: Any, dtype: str) -> None:
    """``p`` stored in ``dtype`` in place (the same Parameter object: the optimizer and the
    model keep it), rounding to nearest even (``kernels.rounding_cast``)."""
    low = kernels.rounding_cast()(p, dtype)
    p.value().get_tensor()._share_data_with(low.value().get_tensor())
