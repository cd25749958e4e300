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
``paddle.grad`` asking for some operands only runs the same ``mul`` gradient kernel.

Not done where the tensor is not known kept (a leaf, a LayerNorm or an add output, a GELU
output: its node keeps its input), nor for the routes of ``kernels._operand_gemm`` (a
PyLayer holding its operands), nor for emulation (another route), nor in a program.

Paddle's saved-tensor hooks are one process-wide pair, and leaving them resets them: a
GEMM of this route inside a user's own ``saved_tensors_hooks`` block (Paddle's recompute
with ``use_reentrant=False``) ends that block's hooks for the ops after it. Its results
stay exact; those ops then save their tensors as without the hooks.
"""
from __future__ import annotations

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
    node = source.grad_fn
    return source if node is not None and node.name() in KEEPS_OUTPUT else None


class _Recast:
    """A saved low copy, kept as the float32 tensor it was cast from (and that tensor's
    in-place version then), made again when the backward reads it."""
    __slots__ = ("source", "version", "cast")

    def __init__(self, source: Any, cast: Callable[[Any], Any]) -> None:
        self.source, self.version, self.cast = source, source._inplace_version(), cast

    def make(self) -> Any:
        """The low copy again (called by Paddle's unpack hook, gradients off). An error
        raised here would leave gradients off for the process (Paddle restores the mode
        only when the hook returns): the mode of a backward pass, on, is set back first."""
        try:
            if self.source._inplace_version() != self.version:
                raise RuntimeError(
                    "a float32 tensor read by a bf16 GEMM under paddle_amp.dygraph was "
                    f"written in place after that GEMM (version "
                    f"{self.source._inplace_version()}, expected {self.version}); its "
                    "gradient needs the value the GEMM read. Write a copy instead (e.g. "
                    "x = x + y, not x.add_(y)).")
            return self.cast(self.source)
        except BaseException:
            from paddle.base.framework import _dygraph_tracer
            _dygraph_tracer()._has_grad = True
            raise


def _shared(t: Any) -> Any:
    """A new tensor sharing ``t``'s buffer: Paddle moves the buffer out of what an unpack
    hook returns, which must not be a tensor still in use."""
    from paddle.base import core
    out = core.eager.Tensor()
    t._share_buffer_to(out)
    return out


def _unpack(packed: Any) -> Any:
    if isinstance(packed, _Recast):
        return packed.make()
    return None if packed is None else _shared(packed)


def saving_recast(run: Callable[[], Any], pairs: tuple, cast: Callable[[Any], Any]) -> Any:
    """``run()`` (one GEMM creating its gradient node), each low operand ``low`` of
    ``pairs`` ((low, source or None), ...) saved as a recipe that casts ``source`` again by
    ``cast``; every other tensor it saves kept as it is (shared, not copied)."""
    recipes = tuple((low, source) for low, source in pairs if source is not None)
    if not recipes:
        return run()
    from paddle.base import core

    def pack(t):  # (never None: Paddle would not set gradients back on)
        for low, source in recipes:
            if t._is_shared_buffer_with(low):
                return _Recast(source, cast)
        return t

    core.eager.register_saved_tensors_hooks(pack, _unpack)
    try:
        return run()
    finally:
        core.eager.reset_saved_tensors_hooks()
