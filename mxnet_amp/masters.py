"""O2 for Gluon: parameters stored in the low dtype, float32 master weights in the optimizer.

What native MXNet users get from ``net.cast('float16')`` and an optimizer with
``multi_precision=True``, driven by the policy of ``init(policy="O2")``:

- ``cast_params(net)`` traces the block, lists the ops reading each parameter
  and lets the core's ``plan_params`` decide which are stored low (a
  parameter read only by low-precision ops; LayerNorm's gamma/beta and
  batch-norm statistics stay float32, unlike ``net.cast``). It casts those,
  as ``Parameter.cast`` does, and clears the cached graphs.
- ``init_trainer(trainer)`` under an O2 policy installs ``MasterWeightUpdater``
  on the trainer: for each low parameter the optimizer state holds a float32
  master and the optimizer's own state for it; each applied step casts the
  gradient to float32, runs the optimizer's float32 ``update`` on the master,
  and writes the master back into the parameter (one rounding). That is the
  native ``Optimizer.update_multi_precision`` path, generalised to bfloat16
  (the native one only knows float16) and used for every optimizer alike.
  MXNet's fused ``mp_*_update`` kernels do it in one op for float16 and the
  SGD family only: MXNet 1.9.1 has none for bfloat16 ("Unknown type enum 12"),
  so bf16 O2 takes this path wherever it runs; ``master_update`` says which
  (from a probe, ``kernels.has_mp_update``).

Overflow steps are skipped before the updater runs (``trainer``), so
parameters, masters and optimizer state stay bit-identical. The masters live
in the updater's states, so ``trainer.save_states``/``load_states`` checkpoint
them with the rest of the optimizer state. On a CPU, ops with no low kernel
compute in float32 on the low parameters cast up (EMULATED, see ``patching``).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import mxnet as mx
from mxnet import autograd
from mxnet.gluon import HybridBlock, Trainer
from mxnet.optimizer import Updater

from amp_adapters import LOW_DTYPES, AmpConfigError, ParamPlan, ParamUse, Policy, plan_params

from ._mx import _BF16, _ND_AMP_CAST, cast, dtype_name, input_names, unpatched
from amp_adapters.rules.policy import PolicyLike
from .config import user_policy
from .graph import nodes
from .active import active_policy
from .kernels import has_mp_update
from .speed import profile
from .report import block_context

def master_update(dtype: str, ctx: mx.Context) -> str:
    """How a low weight is updated here (the trainer's ``_amp_master_update``), truthfully."""
    fused = ("MXNet's fused mp_*_update kernels take {dtype} on {dev} for the SGD family; "
             "this path serves every optimizer alike" if has_mp_update(ctx, dtype) else
             "MXNet has no fused mp_*_update kernel for {dtype} on {dev}")
    return ("float32 master update: the optimizer's float32 update on the master, then one "
            "cast into the {dtype} parameter (" + fused + ")").format(dtype=dtype,
                                                                       dev=ctx.device_type)


def _mx_dtype(dtype: str) -> Any:
    return _BF16 if dtype == "bfloat16" else dtype


def param_uses(block: HybridBlock, num_inputs: int = 1) -> dict[str, list[ParamUse]]:
    """{parameter name: the ops reading it} from a symbolic trace of ``block`` (no data)."""
    if not isinstance(block, HybridBlock):
        raise TypeError(f"O2 needs a gluon HybridBlock (its graph tells which ops read each "
                        f"parameter), got {type(block).__name__}")
    with unpatched(), autograd.pause():
        out = block(*[mx.sym.var(f"data{i}") for i in range(num_inputs)])
    if isinstance(out, (list, tuple)):
        out = mx.sym.Group(list(out))
    params = block.collect_params()
    uses: dict[str, list[ParamUse]] = {name: [] for name in params}
    for n in nodes(out):
        if n.op == "null":
            continue
        slots = input_names(n.op)
        for i, entry in enumerate(n.inputs):
            if entry in uses:
                uses[entry].append(ParamUse(n.op, dict(n.attrs),
                                            slots[i] if i < len(slots) else None,
                                            instance=(n.name,)))
    return uses


def cast_params(block: HybridBlock, num_inputs: int = 1, *,
                policy: Optional[PolicyLike] = None,
                ctx: Optional[mx.Context] = None) -> ParamPlan:
    """Store the parameters the core plans low (O2) in the low dtype; return the plan.

    Uses the policy of ``init`` unless ``policy`` is given; ``num_inputs``: how many
    data inputs ``block`` takes. Call after ``initialize`` and before the first
    training step (a Trainer made before is fine). A parameter already low stays.
    """
    chosen = (user_policy(policy, ctx or block_context(block)) if policy is not None
              else active_policy())
    if chosen is None:
        raise RuntimeError("no AMP policy: call mxnet_amp.init(policy='O2') first or pass "
                           "policy=")
    if chosen.level != "O2":
        raise AmpConfigError(f"cast_params stores parameters low for level O2; the policy is "
                             f"level {chosen.level} (use policy='O2' or 'O2-bf16')")
    uses = param_uses(block, num_inputs)
    ctx = ctx or block_context(block)
    device = profile(chosen, ctx, True)
    plan = plan_params(chosen, "mxnet", uses, device=device)
    params = block.collect_params()
    for name in sorted(plan.low):
        p = params[name]
        if dtype_name(p.dtype) != chosen.dtype:
            p.cast(_mx_dtype(chosen.dtype))
            p._var = None  # the traced variable declares the dtype: make it anew
    block.apply(lambda b: b._clear_cached_op() if isinstance(b, HybridBlock) else None)
    return plan


class MasterState(NamedTuple):
    """The optimizer state of one low-precision weight: its float32 master and the
    optimizer's own state for the master (pickled by ``trainer.save_states``)."""

    master: Any
    inner: Any


class MasterWeightUpdater(Updater):
    """A Gluon updater keeping float32 masters for low-precision weights (see module doc).

    State of a low weight: ``(master, inner)``, ``inner`` being the optimizer's
    own state for the master. Float32 weights go through the native updater.
    """

    def __call__(self, index: Any, grad: Any, weight: Any) -> None:
        if not isinstance(index, (list, tuple)):
            index, grad, weight = [index], [grad], [weight]
        rest = [(i, g, w) for i, g, w in zip(index, grad, weight)
                if dtype_name(w.dtype) not in LOW_DTYPES]
        if rest:
            i, g, w = (list(t) for t in zip(*rest))
            super().__call__(i, g, w)
        for i, g, w in zip(index, grad, weight):
            if dtype_name(w.dtype) not in LOW_DTYPES:
                continue
            if i not in self.states:
                master = w.astype("float32")
                self.states[i] = MasterState(master, self.optimizer.create_state(i, master))
                self.states_synced[i] = True
            elif not isinstance(self.states[i], MasterState):
                raise AmpConfigError(
                    f"parameter {i} is {dtype_name(w.dtype)} but its optimizer state has no "
                    f"float32 master: it was cast after the trainer's first step (call "
                    f"cast_params before training) or the states come from another run")
            elif not self.states_synced[i]:
                self.states[i] = MasterState(*self.sync_state_context(tuple(self.states[i]),
                                                                      w.context))
                self.states_synced[i] = True
            master, inner = self.states[i]
            self.optimizer._set_current_context(w.context.device_id)  # per-device step counts
            with unpatched():
                self.optimizer.update(i, master, cast(g, "float32"), inner)
                _ND_AMP_CAST(master, dtype=w.dtype, out=w)  # one op: round into the weight


def attach(trainer: Trainer, policy: Policy) -> None:
    """Give ``trainer`` float32 masters for its low-precision parameters (O2)."""
    if trainer._kvstore_params.get("update_on_kvstore") is True or (
            trainer._kv_initialized and trainer._update_on_kvstore):
        raise AmpConfigError("O2 master weights live in the trainer's updater: create the "
                             "Trainer with update_on_kvstore=False")
    trainer._kvstore_params["update_on_kvstore"] = False
    trainer._optimizer.multi_precision = False  # the masters are ours, for fp16 and bf16
    trainer._updaters = [u if isinstance(u, MasterWeightUpdater) else _upgrade(u)
                         for u in trainer._updaters]
    ctx = trainer._contexts[0] if trainer._contexts else mx.cpu()
    trainer._amp_master_update = master_update(policy.dtype, ctx)


def _upgrade(updater: Updater) -> MasterWeightUpdater:
    new = MasterWeightUpdater(updater.optimizer)
    new.states, new.states_synced = updater.states, updater.states_synced
    return new


def masters(trainer: Trainer) -> dict[str, Any]:
    """{parameter name: its float32 master} (after the first applied step)."""
    out = {}
    for updater in trainer._updaters[:1]:
        for i, state in updater.states.items():
            if isinstance(state, MasterState):
                out[trainer._params[i].name] = state.master
    return out
