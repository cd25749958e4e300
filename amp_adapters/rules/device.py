"""The device's truth: what this device runs in the low dtype, on which route, and how fast.

One frozen value per (device, low dtype, training or not), read by the planner
(``plan_op(device=...)``); a backend only supplies it, from its probes (which kernels
run, forward and backward; which of them are oneDNN's; whose gradient of a broadcast
operand runs a reference implementation) and, under ``Policy.speed == "measured"``,
from a ``costs`` lookup (``speedbook.SpeedBook``) that times an op in the low dtype,
its casts included, against float32 at the shapes the model uses.

Four rules live here and nowhere else:

- ``auto_dtype``: the low dtype a device type runs fast, which the preset ``"auto"``
  takes: float16 on a GPU, bfloat16 on anything else (a CPU);

- ``DeviceProfile.refusal``: an op whose low gradient sums a broadcast operand (one of
  fewer dimensions than the result) on a reference implementation here is kept off its
  low kernel in training;
- ``speed_refusal``: under measured speed, an op runs low only where its measured ratio
  to float32, plus its spread, is below ``1 - margin`` (a win within the spread of its
  own timing never decides; the spread is one process's, and another process can time
  the same op further off, so the margin makes a tip by noise rare, not impossible:
  decisions agree because each key is measured once and kept; a training step's margin
  is wider, ``TRAIN_MARGIN``). Only an op with a timing recipe in its backend has a
  measured ratio; under measured speed any other op the lists lower stays float32;
- ``ShapeClass.of``: shapes are rounded up to powers of two, so nearby sizes share one
  measurement; a dimension of at most ``EXACT_UP_TO`` is kept (a 3x3 convolution is
  not timed as a 4x4 one: a window's size changes the algorithm, not only the work).

Pure values, no framework, no host sync.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet, Callable, Optional, Sequence

GPU = "gpu"  # the device type whose fast low dtype is float16 (auto_dtype)
SPEEDS = ("fixed", "measured")  # Policy.speed: the lists decide alone, or only if faster here
MARGIN = 0.05  # a low kernel must beat float32 by 5%, beyond its measured spread
# ... by 15% for a training step: the whole step pays what one op's timing does not see
# (MXNet 1.9.1, MLP 4x2048 on an AMD EPYC with avx512_bf16: its FullyConnected timed at
# 0.89-0.93x, the native's whole bf16 step 0.92-1.26x of float32 in five processes)
TRAIN_MARGIN = 0.15
UNKNOWN_DIM = 64  # an unknown dimension (a static graph's batch) is measured at this size
EXACT_UP_TO = 8  # dimensions this small (a 3x3 window, a few channels) are kept as they are

Shape = Optional[tuple[Optional[int], ...]]  # None: unknown rank; a None dim: unknown size


def auto_dtype(device_type: str) -> str:
    """The low dtype ``device_type`` runs fast: ``"float16"`` on a GPU (every CUDA GPU with
    tensor cores runs fp16 GEMMs; bf16 only from Ampere on), ``"bfloat16"`` on anything
    else (a CPU: oneDNN has bf16 kernels, its fp16 ones are few or missing). What the preset
    ``"auto"`` runs in where no dtype is given (``policy.preset_fields``).

    ``device_type`` is the framework's own answer, in any case, with or without an index:
    ``"cpu"``, ``"gpu"``, MXNet's ``Context.device_type``, Paddle's ``"gpu:0"`` or
    ``"GPU"``. The GPU branch is the rule only: no GPU ran it here."""
    if not isinstance(device_type, str) or not device_type.strip():
        raise TypeError(f"device_type must be a device type such as 'cpu' or 'gpu' (or "
                        f"'gpu:0'), got {device_type!r}")
    kind = device_type.strip().lower().split(":", 1)[0]
    return "float16" if kind == GPU else "bfloat16"


def _round_up(n: Optional[int]) -> Optional[int]:
    if n is None or n < 1:
        return None
    if n <= EXACT_UP_TO:
        return int(n)
    return 1 << (int(n) - 1).bit_length()


@dataclass(frozen=True)
class ShapeClass:
    """The shapes of an op's floating operands, each dimension above ``EXACT_UP_TO`` rounded
    up to a power of two (None: unknown), and the rank of its result: what a measurement
    and the broadcast rule key on."""

    operands: tuple[Shape, ...] = ()
    result_rank: Optional[int] = None

    @classmethod
    def of(cls, operands: Sequence[Optional[Sequence[Optional[int]]]],
           result_rank: Optional[int] = None) -> "ShapeClass":
        """A shape class from raw shapes (a -1 or None dimension is unknown; a None shape has
        unknown rank)."""
        return cls(tuple(None if s is None else tuple(_round_up(d) for d in s)
                         for s in operands), result_rank)

    @property
    def key(self) -> str:
        """``"64x2048;2048x2048>2"``: operands by ``;``, ``?`` unknown, ``>`` the result rank."""
        parts = ["?" if s is None else "x".join("?" if d is None else str(d) for d in s)
                 for s in self.operands]
        return ";".join(parts) + (f">{self.result_rank}" if self.result_rank is not None else "")

    @property
    def broadcast(self) -> bool:
        """True if a floating operand has fewer dimensions than the result (a bias added to
        a batch, a Linear's weight on a batch of sequences): its gradient sums over the
        rest. Ranks only; unknown ranks count as not broadcast."""
        if self.result_rank is None:
            return False
        return any(s is not None and 0 < len(s) < self.result_rank for s in self.operands)

    def concrete(self, fill: int = UNKNOWN_DIM) -> tuple[tuple[int, ...], ...]:
        """The operand shapes to measure at: each unknown dimension (a batch size a static
        graph leaves open) taken as ``fill``; an operand of unknown rank cannot be."""
        if any(s is None for s in self.operands):
            raise ValueError(f"shape class {self.key}: an operand of unknown rank cannot be "
                             f"measured")
        return tuple(tuple(fill if d is None else d for d in s) for s in self.operands
                     if s is not None)

    @property
    def known(self) -> bool:
        """Every dimension known: a shape that can be measured as it is."""
        return bool(self.operands) and all(
            s is not None and all(d is not None for d in s) for s in self.operands)


@dataclass(frozen=True)
class Cost:
    """One op's measured time in the low dtype, with the casts the plan adds around it, over
    its float32 time: the median ratio of interleaved pairs and its spread (half the
    interquartile range of the ratios). ``train``: forward and backward (None: not
    measured). ``error``: the op failed while being timed (it counts as no kernel)."""

    forward: float = math.nan
    forward_spread: float = 0.0
    train: Optional[float] = None
    train_spread: Optional[float] = None
    error: Optional[str] = None

    def ratio(self, training: bool) -> tuple[float, float]:
        """(ratio, spread) for a training step (forward and backward) or inference."""
        if training and self.train is not None:
            return self.train, self.train_spread or 0.0
        return self.forward, self.forward_spread

    def to_dict(self) -> dict:
        return {k: v for k, v in (("forward", self.forward),
                                  ("forward_spread", self.forward_spread),
                                  ("train", self.train), ("train_spread", self.train_spread),
                                  ("error", self.error)) if v is not None}


def speed_refusal(cost: Optional[Cost], training: bool, dtype: str,
                  margin: Optional[float] = None) -> Optional[str]:
    """Why an op whose ``cost`` was measured stays float32 under measured speed, or None to
    run it low: only a ratio below ``1 - margin`` by more than its spread goes low, so a
    tie, or a win its timing's spread could undo, keeps float32 (which is never slower than
    itself).
    ``margin``: by default ``TRAIN_MARGIN`` for a training step's ratio, else ``MARGIN``."""
    if cost is None:
        return None
    if cost.error:
        return None  # a failure is "no kernel" (``DeviceProfile.has_kernel``), not speed
    ratio, spread = cost.ratio(training)
    if not math.isfinite(ratio):
        return None
    step = training and cost.train is not None
    if margin is None:
        margin = TRAIN_MARGIN if step else MARGIN
    if ratio + spread < 1.0 - margin:
        return None
    what = "training step" if step else "forward"
    if ratio >= 1.0:
        return f"float32: slower here ({ratio:.2f}x float32 for its {dtype} {what}, casts " \
               f"included)"
    return f"float32: not faster here beyond its spread ({ratio:.2f}x +- {spread:.2f} for its " \
           f"{dtype} {what}, casts included; a low kernel must gain {margin:.0%})"


CostLookup = Callable[[str, ShapeClass], Optional[Cost]]


@dataclass(frozen=True)
class DeviceProfile:
    """What one device runs in the low dtype, for training (gradients too) or inference.

    ``kernels``: the op names with a low-precision kernel here, forward (and, for
    ``training``, backward) (None: every op has one: a GPU, or a device-free graph
    transform; a lazy set is fine, as long as membership is a pure answer).
    ``onednn``: those whose kernel is oneDNN's (the route a backend must ask for).
    ``slow_broadcast_grads``: those whose low gradient of a broadcast operand runs a
    reference implementation here (``refusal``). ``plain_casts_before``: where ``cast`` is
    on the oneDNN route, the ops in front of which a cast must stay plain (their oneDNN
    gradient leaves a layout oneDNN's cast cannot read). ``costs``: under measured speed, the
    measured cost of an op at a shape class (None: not measured, or cannot be).
    ``name``: the device as messages name it."""

    kernels: Optional[AbstractSet[str]] = None
    onednn: AbstractSet[str] = frozenset()
    slow_broadcast_grads: AbstractSet[str] = frozenset()
    plain_casts_before: AbstractSet[str] = frozenset()
    training: bool = False
    costs: Optional[CostLookup] = None
    name: str = "this device"

    def has_kernel(self, op: str) -> bool:
        return self.kernels is None or op in self.kernels

    def route(self, op: str) -> str:
        """``"onednn"``, ``"plain"`` (the framework's own kernel) or ``"none"``."""
        if not self.has_kernel(op):
            return "none"
        return "onednn" if op in self.onednn else "plain"

    def refusal(self, op: str, shape: Optional[ShapeClass], dtype: str) -> Optional[str]:
        """Why ``op`` with operands of ``shape`` keeps off the low kernel it has here, by rule
        (not by measurement): in training, its low gradient would sum a broadcast operand on
        a reference implementation, or fail."""
        if self.training and op in self.slow_broadcast_grads and shape is not None \
                and shape.broadcast:
            return (f"its {dtype} gradient sums an operand of fewer dimensions than its "
                    f"result over the others on a reference implementation here, or fails "
                    f"(oneDNN's log of a probe): slower than float32")
        return None

    def cost(self, op: str, shape: Optional[ShapeClass]) -> Optional[Cost]:
        """The measured cost of ``op`` at ``shape`` (None: no lookup, or not measurable)."""
        if self.costs is None:
            return None
        return self.costs(op, shape or ShapeClass())

    def for_inference(self) -> "DeviceProfile":
        """This profile for a program without gradients (an eval program)."""
        from dataclasses import replace
        return replace(self, training=False, slow_broadcast_grads=frozenset())
