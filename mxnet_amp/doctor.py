"""``doctor``: which op of a Gluon model goes wrong under AMP, and the policy that fixes it.

    amp.init(policy="O1", emulate=True)
    with amp.doctor(net, loss_fn, trainer) as dr:
        for x, y in batches[:3]:                 # a few of your own steps, unchanged
            with autograd.record():
                loss = loss_fn(net(x), y)
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            trainer.step(x.shape[0])
    print(dr.report())                           # per op: range, overflow, error vs float32
    dr.recommendation().write("fixed.toml")      # policy= accepts it unchanged

While the ``with`` block runs, a forward pre-hook on ``net`` and on ``loss_fn``
captures each batch (nothing else: the hooks exist only inside the block, so
the doctor costs nothing when it is off). Per batch, the graph ``init``'s
policy gives ``loss_fn(net(x), y)`` (traced once, for hybridized and
imperative blocks alike) runs op by op on copies of the current parameters,
forward and backward at the trainer's loss scale, and so does the same graph
without its AMP casts (float32); the core (``amp_adapters.services.doctor``) turns the
values into the report and the recommendation. Each batch is kept, with the
parameters and the trainer's optimizer state the first step started from, for the
recommendation: it trains under each candidate fix (``replay``, the trial: a copy
of the optimizer updates copies of the parameters), narrowest first, and recommends
the first whose trial is clean on steps held out of its derivation
(``amp_adapters.services.doctor.verify``). The block also wraps ``trainer.step`` of the one
trainer, to learn each step's batch size. On exit the parameters, their gradients,
the trainer's optimizer state and the loss-scale state are put back bit for bit as
they were when the block was entered.
"""
from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any, Optional

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.gluon import HybridBlock

from amp_adapters import Policy
from amp_adapters.services.doctor import DoctorReport, Recorder, StepRecord, scale_ceiling
from amp_adapters.services.doctor.bf16 import Bf16Speed
from amp_adapters.services.doctor.session import Session
from amp_adapters.services.doctor.verify import after_step
from amp_adapters.rules.dtypes import FLOAT_DTYPES
from amp_adapters.rules.layers import check_matched
from amp_adapters.rules.policy import PolicyLike

from . import layer_paths, patching, scaling
from ._mx import dtype_name, unpatched
from .active import active_policy
from .config import user_policy
from .graph import nodes, plan_graph, rewrite
from .kernels import KernelSet
from .report import block_context

_CASTS = ("amp_cast", "amp_multicast")


class Doctor(Session):
    """The doctor of one model: collects batches while its ``with`` block runs."""

    no_step = ("run net(x) and loss_fn(out, y) inside the with block (or call "
               "examine(data, labels))")

    def __init__(self, net: HybridBlock, loss_fn: HybridBlock, trainer: Any = None, *,
                 policy: Optional[PolicyLike] = None, max_steps: int = 8) -> None:
        for what, block in (("net", net), ("loss_fn", loss_fn)):
            if not isinstance(block, HybridBlock):
                raise TypeError(f"mxnet_amp.doctor: {what} must be a gluon HybridBlock (it is "
                                f"traced once for the analysis), got {type(block).__name__}")
        chosen = user_policy(policy) if policy is not None else active_policy()  # as init
        if chosen is None or not chosen.enabled:
            raise RuntimeError("mxnet_amp.doctor: call mxnet_amp.init(...) first: the doctor "
                               "examines the graph that init's policy gives your model")
        if policy is not None and chosen != active_policy():
            raise RuntimeError("mxnet_amp.doctor: policy= differs from the policy init() "
                               "installed; the doctor examines the graph that runs")
        self.net, self.loss_fn, self.trainer, self.policy = net, loss_fn, trainer, chosen
        self.max_steps = max_steps
        self._recorder = Recorder("mxnet", chosen.dtype, emulated=False,
                                  max_scale=scale_ceiling(chosen.loss_scale_config))
        self._handles: list = []
        self._pending: Optional[tuple] = None
        self._busy = False
        self._steps: list[tuple] = []  # (feed copy, graph without casts, input names)
        self._start_optimizer: Optional[bytes] = None  # the trainer's optimizer and its state
                                                       # when the first step was recorded
        self._batch_sizes: list[int] = []  # trainer.step's batch_size, per recorded step
        self._layers: dict[str, str] = {}  # {block name: its path}: layer_paths.block_layers
        self.steps = 0

    # -- the with block ----------------------------------------------------------------------

    def __enter__(self) -> "Doctor":
        self._saved = _snapshot(self.net, self.trainer)
        self._handles = [self.net.register_forward_pre_hook(self._on_net),
                         self.loss_fn.register_forward_pre_hook(self._on_loss)]
        if self.trainer is not None:  # the batch size each recorded step is updated with
            original = self.trainer.step

            def step(batch_size, *args: Any, **kwargs: Any):
                if len(self._batch_sizes) < self.steps:
                    self._batch_sizes.append(batch_size)
                return original(batch_size, *args, **kwargs)

            self.trainer.step = step
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.detach()
        self._handles = []
        if self.trainer is not None:
            self.trainer.__dict__.pop("step", None)  # the trainer's own step again
        _restore(self.net, self.trainer, self._saved)

    def _on_net(self, block: Any, args: tuple) -> None:
        if not self._busy and args and isinstance(args[0], mx.nd.NDArray):
            self._pending = args

    def _on_loss(self, block: Any, args: tuple) -> None:
        if self._busy or self._pending is None or self.steps >= self.max_steps:
            return
        data, self._pending = self._pending, None
        self._busy = True
        try:
            with autograd.pause():
                self.examine(data, args[1:])
        finally:
            self._busy = False

    # -- the analysis --------------------------------------------------------------------------

    def examine(self, data: tuple, labels: tuple, scale: Optional[float] = None) -> None:
        """Run one batch through the AMP graph and through float32, op by op, and record it.
        (The hooks call this; call it yourself to examine a batch outside a training step.)
        The batch, the parameters it ran with and the scale are kept (copies) for
        ``replay``."""
        if scale is None:
            scale = _current_scale(self.trainer, self.policy)
        amp_sym, names = self._trace(len(data), len(labels))
        params = {n: p.data() for n, p in self.net.collect_params().items()}
        params.update({n: p.data() for n, p in self.loss_fn.collect_params().items()})
        feed = {**dict(zip(names, (*data, *labels))), **params}
        if not self._steps and self.trainer is not None:
            self._start_optimizer = _optimizer_states(self.trainer)
        if not self._steps:  # a layer rule must name a layer of this model (before recording)
            layers = layer_paths.block_layers(self.net, self.loss_fn)
            check_matched(self.policy.layer_patterns("mxnet"),
                          [*layers, *layers.values(),
                           *(n.name for n in nodes(amp_sym) if n.op not in ("null", *_CASTS))],
                          "the model the doctor examines")
            self._layers = layers
        bare = mx.sym.load_json(amp_sym.tojson())  # the same graph, AMP casts taken out
        self._steps.append(({k: v.copy() for k, v in feed.items()}, bare, names))
        self._record(self._recorder, self.policy, amp_sym, bare, feed, scale, names)
        self.steps += 1

    can_replay = True

    def bf16_kernels(self) -> KernelSet:
        """The ops with a bfloat16 kernel, forward and backward, on the net's device (probed
        lazily: the doctor's bfloat16 candidate asks for the ops the report ran low)."""
        return KernelSet(block_context(self.net), "bfloat16", backward=True)

    def bf16_speed(self) -> Bf16Speed:
        """This CPU's bfloat16 class (the core's default), or, on a GPU, not emulated."""
        if block_context(self.net).device_type == "gpu":
            return Bf16Speed()
        return super().bf16_speed()

    def replay(self, policy: Policy) -> DoctorReport:
        """The trial of ``policy`` (``amp_adapters.services.doctor.verify``): training under it from
        the state the first recorded step started from, over the recorded batches in
        order. Each step runs the traced graph planned under ``policy`` (``graph.rewrite``)
        on the trial's own copy of the parameters, at the scale ``policy``'s loss scale has
        reached (from its initial scale, as a new run); unless the core skips it
        (``verify.after_step``), a copy of the trainer's optimizer, with its state as it
        was at the first recorded step, updates the copy with the step's unscaled
        gradients (``trainer.step``'s batch size; the batch's first dimension where the
        doctor did not see one). Without a trainer there is no optimizer: the parameters
        stay as recorded and the report says no update was applied. Nothing of the model
        or the trainer is touched."""
        rec = Recorder("mxnet", policy.dtype, emulated=False,
                       max_scale=scale_ceiling(policy.loss_scale_config))
        ctx = block_context(self.net)
        first, _, first_names = self._steps[0]
        params = {n: v.copy() for n, v in first.items() if n not in first_names}
        updater = self._trial_updater()
        loss_scale = policy.loss_scale
        for i, (feed, bare, names) in enumerate(self._steps):
            step_feed = {**{n: feed[n] for n in names}, **params}
            known = {n: dtype_name(v.dtype) for n, v in step_feed.items()}
            amp_sym = rewrite(bare, known, policy, ctx, params=frozenset(params),
                              instance_of=self._instance_of)
            grads, done = self._record(rec, policy, amp_sym, bare, step_feed, loss_scale.scale,
                                       names)
            loss_scale, apply = after_step(loss_scale, done.overflow)
            if apply and updater is not None:
                opt, index = updater
                opt.optimizer.rescale_grad = self._trainer_scale() / self._batch_size(i)
                moved = [n for n in grads if n in index]  # one call, as Trainer._update
                opt(tuple(index[n] for n in moved),
                    tuple(mx.nd.array(grads[n], ctx=params[n].context, dtype=params[n].dtype)
                          for n in moved), tuple(params[n] for n in moved))
                rec.updated()
        return rec.report()

    def _trial_updater(self) -> Optional[tuple]:
        """(an updater holding a copy of the trainer's optimizer and of its state at the
        first recorded step, {parameter name: the trainer's index}); None without a
        trainer."""
        if self.trainer is None or self._start_optimizer is None:
            return None
        states, optimizer = pickle.loads(self._start_optimizer)  # copies of both
        updater = mx.optimizer.get_updater(optimizer)  # (its kind: aggregated updates or not)
        updater.states, updater.states_synced = states, dict.fromkeys(states, False)
        updater.optimizer.param_dict = self.trainer._optimizer.param_dict  # lr/wd mults
        trainable = {n for n, p in self.net.collect_params().items() if p.grad_req != "null"}
        index = {n: i for n, i in self.trainer._param2idx.items() if n in trainable}
        return updater, index

    def _trainer_scale(self) -> float:
        """The trainer's own gradient scale (``Trainer._scale``), without the loss scale."""
        try:
            return float(scaling._amp(self.trainer).original_scale)
        except (TypeError, RuntimeError):
            return float(self.trainer._scale)

    def _batch_size(self, i: int) -> int:
        if i < len(self._batch_sizes):
            return self._batch_sizes[i]
        feed, _, names = self._steps[i]
        return int(feed[names[0]].shape[0]) if feed[names[0]].ndim else 1

    def _record(self, rec: Recorder, policy: Policy, amp_sym: mx.sym.Symbol,
                ref_sym: mx.sym.Symbol, feed: dict, scale: float,
                names: list[str]) -> tuple[dict, StepRecord]:
        """One step into ``rec``: ``amp_sym`` (the graph with its casts) and ``ref_sym`` (the
        same without) run op by op on ``feed`` at ``scale``. Returns the AMP run's unscaled
        gradients of the trainable parameters (numpy: what a trial updates with) and the
        step's record."""
        ctx = block_context(self.net)
        known = {n: dtype_name(v.dtype) for n, v in feed.items()}
        plan = plan_graph(amp_sym, known, policy, ctx, instance_of=self._instance_of)
        rec.emulated = rec.emulated or any(d.emulated for d in plan)
        amp_vals, amp_grads, order, amp_bwd = _run(amp_sym, feed, scale)
        ref_vals, ref_grads, _, ref_bwd = _run(ref_sym, feed, scale)
        rec.begin_step(scale)
        origin: dict[str, str] = {}
        seen_as: dict[str, str] = {}  # op output entry -> the last entry derived from it by casts
        for n, outs_in in order:
            if n.op in _CASTS:
                for k, o in enumerate(n.outputs):
                    src = n.inputs[k if n.op == "amp_multicast" else 0]
                    origin[o] = origin.get(src, src)
                    seen_as[origin[o]] = o
        decisions = iter(plan)
        lowered: dict[str, bool] = {}
        for n, _ in order:
            if n.op in _CASTS:
                continue
            d = next(decisions)
            lowered[n.name] = d.precision in ("float16", "bfloat16")
            ins = [e for e in n.inputs if _is_float(amp_vals.get(e))]
            out = n.outputs[0]
            rec.forward(n.name, n.op, d.canonical, d.category, d.precision, d.emulated,
                        output=_np(amp_vals[seen_as.get(out, out)]),
                        reference=_np(ref_vals[out]),
                        inputs=[_np(amp_vals[e]) for e in ins],
                        input_refs=[_np(ref_vals[origin.get(e, e)]) for e in ins],
                        raw=_np(amp_vals[out]), layer=layer_paths.layer_of(n.name, self._layers))
        owner = _cast_owners(order, origin)
        for name, grads in amp_bwd:
            if owner.get(name):
                rec.backward(owner[name], [g for _, g in grads])
        inputs = set(names)  # the data and labels: their gradients feed no update
        trainable = [n for n, p in self.net.collect_params().items() if p.grad_req != "null"]
        unscaled = {n: amp_grads[n] / scale for n in trainable if n in amp_grads}
        rec.gradients(unscaled,
                      {n: ref_grads[n] / scale for n in trainable if n in ref_grads},
                      [g / scale for name, gs in ref_bwd if lowered.get(name)
                       for e, g in gs if e not in inputs])
        return unscaled, rec.end_step()

    def _instance_of(self, node: str) -> tuple[str, ...]:
        """A node's instance names for the layer rules: its name, its blocks' names and paths
        (as ``init``'s traced call has them: ``layer_paths.node_instance``)."""
        return layer_paths.node_instance(node, self._layers)

    def _trace(self, n_data: int, n_labels: int) -> tuple[mx.sym.Symbol, list[str]]:
        """The symbol of ``loss_fn(net(data...), labels...)`` as ``init``'s patched ops build
        it: the casts the AMP run has. Traced under a fresh name manager (stable node names)
        with its own parameter-cast cache, as a hybridized block's trace has."""
        names = [f"data{i}" for i in range(n_data)] + [f"label{i}" for i in range(n_labels)]
        syms = [mx.sym.var(n) for n in names]
        saved = patching._trace.casts
        calling = patching._blocks.names, patching._blocks.paths
        patching._trace.casts = {}
        # traced from inside loss_fn's call (its pre-hook): net and loss_fn are roots here
        patching._blocks.names, patching._blocks.paths = (), None
        self._busy = True
        try:
            with mx.name.NameManager():
                out = self.net(*syms[:n_data])
                loss = self.loss_fn(out, *syms[n_data:])
        finally:
            patching._trace.casts = saved
            patching._blocks.names, patching._blocks.paths = calling
            self._busy = False
        return loss, names


def doctor(net: HybridBlock, loss_fn: HybridBlock, trainer: Any = None, *,
           policy: Optional[PolicyLike] = None, max_steps: int = 8) -> Doctor:
    """A context manager that examines up to ``max_steps`` of your own training steps of
    ``net`` with ``loss_fn`` (see the module docstring); ``trainer`` (optional) gives the
    current loss scale and has its state restored on exit."""
    return Doctor(net, loss_fn, trainer, policy=policy, max_steps=max_steps)


# -- running a graph op by op -------------------------------------------------------------------

def _is_float(x: Any) -> bool:
    return x is not None and dtype_name(x.dtype) in FLOAT_DTYPES


def _np(x: mx.nd.NDArray) -> np.ndarray:
    return x.astype("float32").asnumpy() if dtype_name(x.dtype) != "float32" else x.asnumpy()


def _cast_owners(order: list, origin: dict) -> dict[str, Optional[str]]:
    """{node name: the op its backward is reported under}: an op is its own; a cast of an
    op's output (emulation's output rounding) belongs to that op, a cast of a variable (a
    weight, the data) to the first op that reads it."""
    made_by = {e: n.name for n, _ in order if n.op not in _CASTS for e in n.outputs}
    owner: dict[str, Optional[str]] = {n.name: n.name for n, _ in order if n.op not in _CASTS}
    for n, _ in order:
        if n.op not in _CASTS:
            continue
        src = origin.get(n.outputs[0], n.inputs[0])
        owner[n.name] = made_by.get(src) or next(
            (m.name for m, _ in order if m.op not in _CASTS and
             any(origin.get(e, e) == src for e in m.inputs)), None)
    return owner


@unpatched()
def _run(sym: mx.sym.Symbol, feed: dict, scale: float):
    """Run ``sym`` op by op on copies of ``feed``, forward then backward from its outputs with
    head gradient ``scale``. Returns ({entry: value}, {variable: gradient}, [(node, outputs)]
    in forward order, [(node name, [(input entry, its gradient)])] in backward order).

    Runs with ``init``'s patches bypassed: the graph already has its casts, and the replay's
    own arrays (gradient buffers, head gradients, sums) keep their values' dtypes. Patched,
    ``attach_grad``'s ``zeros_like`` (fp32 in the bfloat16 lists) gives a bfloat16 value a
    float32 gradient buffer, and MXNet's type inference rejects the backward ("Backward
    shape inconsistent with the forward shape": its dtype check has the shape message)."""
    values: dict[str, mx.nd.NDArray] = {}
    recorded: list = []
    for n in nodes(sym):
        if n.op == "null":
            values[n.name] = feed[n.name].copy()
            continue
        leaves = []
        for e in n.inputs:
            leaf = values[e].detach()
            if _is_float(leaf):
                leaf.attach_grad()
            leaves.append(leaf)
        op = mx.nd.CachedOp(n.symbol._gen_atomic_symbol()(
            *[mx.sym.var(f"in{i}") for i in range(len(leaves))], name=n.name))
        with autograd.record():
            out = op(*leaves)
        outs = out if isinstance(out, (list, tuple)) else [out]
        for e, o in zip(n.outputs, outs):
            values[e] = o
        recorded.append((n, leaves, outs))
    grads: dict[str, mx.nd.NDArray] = {}
    for h in sym.list_outputs():
        grads[h] = mx.nd.ones_like(values[h]) * scale
    backward = []
    for n, leaves, outs in reversed(recorded):
        heads = [(o, grads.get(e)) for e, o in zip(n.outputs, outs)]
        heads = [(o, g) for o, g in heads if g is not None]
        if not heads or not any(_is_float(x) for x in leaves):
            continue
        autograd.backward([o for o, _ in heads], head_grads=[g for _, g in heads])
        outputs = []
        for e, leaf in zip(n.inputs, leaves):
            if leaf.grad is None:
                continue
            g = leaf.grad.copy()
            outputs.append((e, _np(g)))
            grads[e] = g if e not in grads else grads[e] + g
        backward.append((n.name, outputs))
    var_grads = {n: _np(grads[n]) for n in sym.list_arguments() if n in grads}
    return values, var_grads, [(n, outs) for n, _, outs in recorded], backward


def _current_scale(trainer: Any, policy: Policy) -> float:
    if trainer is not None:
        try:
            return float(getattr(scaling.loss_scale(trainer), "scale", 1.0))
        except Exception:  # noqa: BLE001 - a trainer without init_trainer: unscaled
            return 1.0
    return float(getattr(policy.loss_scale, "scale", 1.0))


# -- state: put back exactly what was there -----------------------------------------------------

def _optimizer_states(trainer: Any) -> bytes:
    """The trainer's optimizer and its state, pickled (``Updater.get_states``): held by the
    kvstore's updater under ``update_on_kvstore`` (the trainer's own updaters stay empty
    there), else by the trainer's first updater."""
    kv = getattr(trainer, "_kvstore", None)
    updater = getattr(kv, "_updater", None) if trainer._kv_initialized and \
        trainer._update_on_kvstore else None
    return (updater or trainer._updaters[0]).get_states(dump_optimizer=True)


def _snapshot(net: HybridBlock, trainer: Any) -> dict:
    params = {}
    for name, p in net.collect_params().items():
        try:
            data = [d.copy() for d in p.list_data()]
        except Exception:  # noqa: BLE001 - not initialized yet: nothing to restore
            continue
        grads = [g.copy() for g in p.list_grad()] if p.grad_req != "null" else []
        params[name] = (data, grads)
    state: dict = {"params": params, "trainer": None, "amp": None}
    if trainer is not None:
        try:
            state["amp"] = scaling.state_dict(trainer)
        except Exception:  # noqa: BLE001 - no loss scaling on this trainer
            state["amp"] = None
        opt = trainer._optimizer
        state["counts"] = (dict(opt._index_update_count), opt.num_update)
        if trainer._kv_initialized:
            fd, path = tempfile.mkstemp(suffix=".states")
            os.close(fd)
            try:
                trainer.save_states(path)
                with open(path, "rb") as fh:
                    state["trainer"] = fh.read()
            finally:
                os.remove(path)
    return state


def _restore(net: HybridBlock, trainer: Any, state: dict) -> None:
    for name, p in net.collect_params().items():
        if name not in state["params"]:
            continue
        data, grads = state["params"][name]
        for dst, src in zip(p.list_data(), data):
            src.copyto(dst)
        if p.grad_req != "null":
            for dst, src in zip(p.list_grad(), grads):
                src.copyto(dst)
    if trainer is not None:
        if state["trainer"] is not None:
            fd, path = tempfile.mkstemp(suffix=".states")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(state["trainer"])
                trainer.load_states(path)
            finally:
                os.remove(path)
        else:  # no step had run: no optimizer state to keep
            for u in trainer._updaters:
                u.states.clear()
                u.states_synced.clear()
        opt = trainer._optimizer
        opt._index_update_count.clear()
        opt._index_update_count.update(state["counts"][0])
        opt.num_update = state["counts"][1]
        if state["amp"] is not None:
            scaling.load_state_dict(trainer, state["amp"])
