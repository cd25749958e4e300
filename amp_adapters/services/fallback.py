"""What a backend tells the user about ops that do not run in the low dtype on this device.

An op planned in float16/bfloat16 whose kernel this device lacks runs in
float32 (``OpDecision.fell_back``): the user asked for mixed precision and did
not get it there, so that is a WARNING, once per op (MXNet and native Paddle
warn too). An ``emulated`` op is what ``emulate=True`` asked for: INFO. So is an
op whose kernel the backend refused as slower than float32 here
(``OpDecision.kernel_refused``): nothing is lost that the kernel would have given.
After a model or program is built, one summary line says how many ops run in the low
dtype, how many stay float32 and why, and that ``emulate=True`` emulates the
missing kernels. Every runtime (MXNet, Paddle's programs, Paddle's dygraph) calls
``FallbackNotices``; the wording lives here (a runtime may add a detail of its own, such
as why its route failed).
Pure bookkeeping and formatting: no framework, no host sync.

``amp-adapters info`` asks the same question for a whole machine: per installed
framework, device and low dtype, which of the ops the native default lists lower
have a real kernel here (forward and backward), and what the planner makes of
the others (``OpDecision.execution``), under a CPU line that says what oneDNN uses for
bf16 here (``isa.describe_bf16``: the flags, capped by an ISA limit in the environment).
Each backend answers one question,
``lowp_kernels(device, dtype) -> frozenset`` of op names
(``mxnet_amp.kernels.lowp_kernels``, ``paddle_amp.kernels.lowp_kernels``), found
through the entry-point group ``KERNELS_GROUP``: the core imports no backend,
and a machine with one framework works.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable, Mapping, Optional, Sequence

from ..rules.device import DeviceProfile
from ..rules.dtypes import LOW_DTYPES
from ..rules.isa import describe_bf16, machine
from ..rules.planner import OpCall, OpDecision, effective_lists, plan_op
from ..rules.policy import Policy


def op_message(op: str, device: str, d: OpDecision, detail: str = "") -> str:
    """The per-op line: ``FullyConnected on cpu(0): <the decision's reason>``, with the
    runtime's ``detail`` in parentheses when it gives one."""
    more = f" ({detail})" if detail else ""
    hint = f"; pass emulate=True to emulate {d.low_dtype}" if d.lacks_kernel else ""
    return f"{op} on {device}: {d.reason}{more}{hint}"


def _names(decisions: Sequence[OpDecision]) -> str:
    counts = Counter(d.op for d in decisions)
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items()))


def summary(what: str, decisions: Sequence[OpDecision], device: str) -> Optional[str]:
    """One line about ``what`` (a model, a program) when some op planned low precision did
    not get a kernel on ``device`` (none, or one refused as slow); None when every op
    planned low precision got it (nothing to say)."""
    fell = [d for d in decisions if d.lacks_kernel]
    refused = [d for d in decisions if d.fell_back and d.kernel_refused]
    emulated = [d for d in decisions if d.emulated]
    if not fell and not refused and not emulated:
        return None
    low = (fell or refused or emulated)[0].low_dtype
    in_low = sum(d.run_dtype == low for d in decisions)
    listed = sum(d.run_dtype == "float32" and d.category == "fp32" for d in decisions)
    parts = [f"{in_low} ops run in {low}"] + ([f"{listed} in float32 by the op lists"]
                                              if listed else [])
    if fell:
        parts.append(f"{len(fell)} in float32 for lack of a {low} kernel on {device} "
                     f"({_names(fell)}): pass emulate=True to emulate {low} on them")
    if refused:
        parts.append(f"{len(refused)} in float32 where their {low} kernel on {device} is "
                     f"slower ({_names(refused)})")
    if emulated:
        parts.append(f"{len(emulated)} EMULATED {low} (no usable kernel on {device}: float32 "
                     f"arithmetic on values rounded through {low}; {_names(emulated)})")
    return f"{what}: " + ", ".join(parts)


def _level(decisions: Sequence[OpDecision]) -> int:
    """WARNING if a kernel is missing (the user asked for low precision and does not get it
    there), else INFO (emulation was asked for; a refused kernel would be slower)."""
    return logging.WARNING if any(d.lacks_kernel for d in decisions) else logging.INFO


class FallbackNotices:
    """Per-op fallback warnings, each op once, and the per-model summary, on one logger."""

    def __init__(self, logger: str):
        self.logger = logging.getLogger(logger)
        self._seen: set[tuple[str, str, Optional[str]]] = set()

    def note(self, op: str, device: str, d: OpDecision, detail: str = "") -> None:
        """Log ``op``'s fallback (WARNING) or emulation or refused kernel (INFO), once per
        (op, device type, low dtype); ``detail``: the runtime's own words on why
        (``op_message``)."""
        if not (d.fell_back or d.emulated):
            return
        key = (op, device.split("(")[0], d.low_dtype)
        if key not in self._seen:
            self._seen.add(key)
            self.logger.log(_level([d]), "%s", op_message(op, device, d, detail))

    def noted(self, op: str, device: str, dtype: str) -> bool:
        """Whether ``op`` on ``device``'s type in ``dtype`` was logged already."""
        return (op, device.split("(")[0], dtype) in self._seen

    def __len__(self) -> int:
        """How many (op, device type, dtype) were logged (it only grows: a count tells of a
        new one)."""
        return len(self._seen)

    def summarize(self, what: str, decisions: Sequence[OpDecision], device: str) -> None:
        """Log ``summary``: WARNING when an op fell back to float32 for lack of a kernel, INFO
        when the others were emulated or their kernels refused (slower than float32)."""
        line = summary(what, decisions, device)
        if line:
            self.logger.log(_level(decisions), "%s", line)

    def forget(self) -> None:
        """Let every op warn again (after ``reset``)."""
        self._seen.clear()


# amp-adapters info

KERNELS_GROUP = "amp_adapters.kernels"
Provider = Callable[[str, str], frozenset]


@dataclass(frozen=True)
class OpRow:
    """One op the lists lower: whether this device has its kernel, and what AMP does."""

    op: str
    has_kernel: bool
    execution: str  # "kernel", "fell back" (float32), or "emulated"


@dataclass(frozen=True)
class Table:
    """The answer of one framework for one device and dtype (``error``: it could not answer)."""

    framework: str
    device: str
    dtype: str
    rows: tuple[OpRow, ...] = ()
    error: Optional[str] = None

    @property
    def real(self) -> tuple[str, ...]:
        return tuple(r.op for r in self.rows if r.has_kernel)


def table(framework: str, device: str, dtype: str, kernels: frozenset,
          emulate: bool = False) -> Table:
    """Rows for the ops the native default lists of ``framework`` lower in ``dtype``."""
    policy = Policy.preset(f"{framework}-native", dtype=dtype, emulate=emulate)
    rows = []
    for op in effective_lists(policy, framework)["lower"]:
        d = plan_op(policy, framework, OpCall(op, ("float32",)),
                    device=DeviceProfile(kernels, training=True))
        rows.append(OpRow(op, op in kernels, d.execution or "float32"))
    return Table(framework, device, dtype, tuple(rows))


def gather(providers: Mapping[str, Provider], device: str = "CPU",
           dtypes: Sequence[str] = LOW_DTYPES) -> list[Table]:
    """One table per (framework, dtype); a provider that fails gives a table with ``error``."""
    out = []
    for framework, provider in sorted(providers.items()):
        for dtype in dtypes:
            try:
                out.append(table(framework, device, dtype, frozenset(provider(device, dtype))))
            except Exception as e:  # a backend's own failure is its row's answer, not ours
                out.append(Table(framework, device, dtype, error=f"{type(e).__name__}: {e}"))
    return out


def installed_providers() -> dict[str, Provider]:
    """{framework: lowp_kernels} of the installed backends (the ones whose framework imports;
    a backend that fails to load is left out, with its reason, by ``render_info``)."""
    out: dict[str, Provider] = {}
    for ep in entry_points(group=KERNELS_GROUP):
        try:
            out[ep.name] = ep.load()
        except ImportError as e:
            out[ep.name] = _unavailable(f"not installed ({e})")
    return out


def _unavailable(why: str) -> Provider:
    def provider(device: str, dtype: str) -> frozenset:
        raise ImportError(why)
    return provider


def render_info(tables: Sequence[Table], here: Mapping) -> str:
    """The report: what oneDNN uses for bf16 on the machine ``here`` (``isa.machine``),
    then per framework and dtype the real kernels and what AMP does with the ops that have
    none."""
    lines = [describe_bf16(here)]
    if not tables:
        lines.append("no framework backend registered: install amp-adapters (pip install "
                     "-e . in a checkout) so the backends' entry points are found")
    for t in tables:
        head = f"{t.framework} {t.device} {t.dtype}:"
        if t.error:
            lines.append(f"{head} cannot tell ({t.error})")
            continue
        missing = [r.op for r in t.rows if not r.has_kernel]
        lines.append(f"{head} {len(t.real)} of {len(t.rows)} ops the lists lower have a real "
                     f"kernel" + (f": {', '.join(t.real)}" if t.real else ""))
        if missing:
            lines.append(f"  no kernel, AMP runs them in float32 (emulate=True: float32 on "
                         f"values rounded through {t.dtype}): {', '.join(missing)}")
    return "\n".join(lines)


def info_text(providers: Optional[Mapping[str, Provider]] = None, device: str = "CPU",
         dtypes: Sequence[str] = LOW_DTYPES) -> str:
    """The text of ``amp-adapters info`` (``providers``: default, the installed backends)."""
    chosen = installed_providers() if providers is None else providers
    return render_info(gather(chosen, device, dtypes), machine())
