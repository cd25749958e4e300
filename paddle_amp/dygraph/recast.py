"""A low copy of an activation the backward keeps anyway in float32 is made again there,
not kept from the forward (issue 40, point 4: no copy that does not have to live).

A lowered Linear after a ReLU reads the bf16 cast of the ReLU's float32 output. Its
gradient node (oneDNN's ``mul``) saves that bf16 copy for the weight's gradient, and the
ReLU's node saves the float32 output for its own: the backward kept both, a batch-sized
bf16 tensor per layer that a float32 step does not keep (32 MiB on the bench's MLP).

Where the float32 tensor is kept by its producer's gradient node anyway (``KEEPS_OUTPUT``:
that node runs after every reader's, so the tensor lives until then), the GEMM saves it
through Paddle's saved-tensor hooks (``paddle.autograd.saved_tensors_hooks``, the mechanism
of Paddle's own recompute) as a recipe: the float32 tensor, already held, and the cast is
made again by the same rounding cast when the gradient node reads it. The kernels, their
inputs and the graph are the route's own: results and gradients are bit-identical, and
``paddle.grad`` asking for some operands only runs the same ``mul`` gradient kernel. The
forward still casts an activation once a step, however many GEMMs read it (``stepcasts``:
the cast is held until the forward returns, then only by the GEMMs' inputs, not into the
backward).

What a GEMM saves is held by its unpack hook, which Paddle keeps with the node's saved
tensors until the graph is freed (Paddle 2.6.2 never frees a packed value itself: those are
only indices here). Each is dropped once read by a backward that frees its graph (Paddle
drops its own saved tensors then); a retained graph (``retain_graph=True``) reads them
again.

A GEMM of two activations, or by a transposed or batched matrix, runs as our own PyLayers
(``kernels._operand_gemm``): there no hook is needed, the PyLayer holds such an operand as
a ``Recipe`` (the float32 tensor) and casts it again in its backward; Paddle drops a
PyLayer's context after a backward that frees its graph (attention's softmax output before
``@ v``: its bf16 copy is no longer kept).

Not done where the tensor is not known kept (a leaf, a LayerNorm or an add output, a GELU
output: its node keeps its input), nor for emulation (another route), nor in a program.

Paddle's saved-tensor hooks are one process-wide pair, which Paddle refuses to set while
another is on: inside a user's own ``saved_tensors_hooks`` block (Paddle's recompute with
``use_reentrant=False``) the GEMM keeps its copy as before, and the user's pair stays on.
While a region is open in another thread the wrappers do not ask for this at all
(``wrappers._kept``): the two threads would set and reset the one pair under each other. A
thread recording gradients with no region of its own while a ``mul`` here runs may have its
saved tensors packed by this pair too (kept as they are: the same values); Paddle releases
the interpreter lock while it runs an op, so such a program should open a region (or
none) in each thread.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional

# Paddle's gradient nodes (eager mode, 2.6.2 and 3.3.1) that save their op's output for
# their own gradient: their gradient kernels read ``out``, not ``x``
# (``phi/kernels/activation_grad_kernel.h``: DEPOUT; ``softmax_grad_kernel.h``,
# ``log_softmax_grad_kernel.h``), checked on the installed Paddle by
# tests/paddle/test_dygraph_recast.py. GELU, SiLU, LeakyReLU, LayerNorm keep their input.
KEEPS_OUTPUT = frozenset({
    "ReluGradNode", "Relu6GradNode", "SigmoidGradNode", "TanhGradNode", "ExpGradNode",
    "SqrtGradNode", "RsqrtGradNode", "SoftmaxGradNode", "LogSoftmaxGradNode",
})


def kept_source(source: Any, low: Any) -> Optional[Any]:
    """``source`` if ``low`` is a cast of it (another tensor) that a gradient node may save
    while the backward keeps ``source``, a float32 tensor, anyway (its producer's node saves it:
    ``KEEPS_OUTPUT``), else None."""
    if low is source or source.stop_gradient or source.element_size() != 4:
        return None  # (4 bytes: float32, as AMP casts no integers; ``_to_bf16`` reads it)
    return source if producer(source) in KEEPS_OUTPUT else None


def producer(x: Any) -> Optional[str]:
    """The name of ``x``'s gradient node (None: a leaf, or no gradient), read without
    keeping the graph alive: Paddle's ``Tensor.grad_fn`` (2.6.2 and 3.3.1) hands back its
    node with one reference too many, so each read kept the node, and every tensor its
    graph saved, for good (``_grad_fn_leaks``: a probe, not a version)."""
    node = x.grad_fn
    if node is None:
        return None
    try:
        return node.name()
    finally:
        if _grad_fn_leaks():
            _decref(node)


def _decref(obj: Any) -> None:
    import ctypes
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(obj))


@functools.lru_cache(maxsize=None)
def _grad_fn_leaks() -> bool:
    """Whether reading ``Tensor.grad_fn`` leaves one reference to the node it hands back:
    on a node nothing else refers to from Python, its count is ours and the call's, plus
    the one left."""
    import paddle
    with paddle.set_grad_enabled(True):  # (asked first wherever: gradients on, eager mode)
        t = paddle.ones([1], "float32")
        t.stop_gradient = False
        node = (t * 1.0).grad_fn
    if node is None:
        raise RuntimeError("Paddle recorded no gradient node for an eager op: cannot tell "
                           "whether Tensor.grad_fn keeps its node")
    extra = sys.getrefcount(node) - 2
    if extra == 1:
        _decref(node)
    return extra == 1


class Recipe:
    """A bf16 operand held by a GEMM's own ``PyLayer`` (``kernels._operand_gemm``) as the
    float32 tensor it was cast from, where the backward keeps that anyway: cast again by the
    same rounding cast when the backward reads it. Paddle drops a PyLayer's context after a
    backward that frees its graph, and keeps it for one that does not."""
    __slots__ = ("source", "version", "cast")

    def __init__(self, source: Any, cast: Callable[[Any], Any]) -> None:
        self.source = source.detach()  # (its buffer and in-place version, out of the graph)
        self.version, self.cast = self.source._inplace_version(), cast

    def make(self) -> Any:
        """The bf16 copy again; raises if the tensor was written in place since the GEMM."""
        if self.source._inplace_version() != self.version:
            raise RuntimeError(
                "a float32 tensor read by a bf16 GEMM under paddle_amp.dygraph was written in "
                f"place after that GEMM (version {self.source._inplace_version()}, expected "
                f"{self.version}); its gradient needs the value the GEMM read. Write a copy "
                "instead (e.g. x = x + y, not x.add_(y)).")
        return self.cast(self.source)


class _Recast(Recipe):
    """A low copy a ``mul`` saved through the hooks, as a ``Recipe``; its float32 tensor let
    go once read by a backward that frees its graph (Paddle keeps the hook's values until
    the graph itself goes)."""
    __slots__ = ()

    def make(self) -> Any:
        """The low copy again (called by Paddle's unpack hook, gradients off). An error
        raised here would leave gradients off for the process (Paddle restores the mode
        only when the hook returns): the mode of a backward pass, on, is set back first."""
        try:
            if self.source is None:  # (Paddle ran this node again after freeing its graph)
                raise RuntimeError("the float32 tensor a bf16 GEMM's gradient casts again "
                                   "was released after a backward that freed its graph")
            low = super().make()
            if not _graph_retained():  # the node will not run again: the tensor may go
                self.source = None     # with the graph's own reference to it
            return low
        except BaseException:
            from paddle.base.framework import _dygraph_tracer
            _dygraph_tracer()._has_grad = True
            raise


def _graph_retained() -> bool:
    """Whether the backward running now keeps its graph, read from the frame of Paddle's
    entry that runs it (``Tensor.backward``, ``paddle.autograd.backward``: ``retain_graph``);
    True where no such frame is found, and under ``paddle.grad``, which runs on copies of the
    graph's nodes whatever its ``retain_graph`` (the graph's own nodes keep what they saved,
    and a ``backward`` after it reads them). Without it the recipe, kept by Paddle with the
    node until the graph is freed, would hold the float32 tensor past the backward (in a
    loop, through the next forward)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "grad" and \
                str(frame.f_globals.get("__name__", "")).startswith("paddle."):
            return True
        if frame.f_code.co_name == "backward" and \
                "retain_graph" in frame.f_locals and \
                str(frame.f_globals.get("__name__", "")).startswith("paddle."):
            retain = frame.f_locals["retain_graph"]
            return True if retain is None else bool(retain)
        frame = frame.f_back
    return True


class _Kept:
    """A saved tensor kept as it is, until the node has read it in a backward that frees
    the graph (as Paddle's own saved tensors are)."""
    __slots__ = ("t",)

    def __init__(self, t: Any) -> None:
        self.t = t

    def make(self) -> Any:
        """A new tensor sharing the buffer: Paddle moves the buffer out of what an unpack
        hook returns, which must not be a tensor still in use."""
        from paddle.base import core
        out = core.eager.Tensor()
        self.t._share_buffer_to(out)
        if not _graph_retained():
            self.t = None
        return out


def saving_recast(run: Callable[[], Any], pairs: tuple, cast: Callable[[Any], Any]) -> Any:
    """``run()`` (one GEMM creating its gradient node), each low operand ``low`` of
    ``pairs`` ((low, source or None), ...) saved as a recipe that casts ``source`` again by
    ``cast``; every other tensor it saves kept as it is (shared, not copied)."""
    recipes = tuple((low, source) for low, source in pairs if source is not None)
    if not recipes:
        return run()
    from paddle.base import core
    # What the gradient node keeps is held by the unpack hook, one per GEMM (Paddle keeps it
    # with the node's saved tensors, and drops it with them); a saved tensor's packed value
    # is only its index there: Paddle 2.6.2 never releases a packed value.
    saved: list = []

    def pack(t):  # (never None: Paddle would not set gradients back on)
        for low, source in recipes:
            if t._is_shared_buffer_with(low):
                saved.append(_Recast(source, cast))
                break
        else:
            saved.append(_Kept(t))
        return len(saved) - 1

    def unpack(i):
        return saved[i].make()

    try:
        core.eager.register_saved_tensors_hooks(pack, unpack)
    except ValueError:  # another pair is on (a user's, Paddle's recompute): it stays, and
        return run()    # the copy is kept, as without this module
    try:
        return run()
    finally:
        core.eager.reset_saved_tensors_hooks()
