"""Whether the native's decisions run an op slower than float32 on this machine, in one line.

A drop-in keeps the native's decisions (its presets are the same on every machine), yet
on most CPUs a bfloat16 GEMM is slower than float32 there (issue 31), and nothing says
so. ``native_slowdown`` answers without timing anything:

- by rule: oneDNN runs bfloat16 on AVX-512 (``avx512f``/``bw``/``vl``/``dq``) through an
  emulation of the bf16 instructions when the CPU lacks ``avx512_bf16`` or the
  environment caps oneDNN below ``AVX512_CORE_BF16`` (``DNNL_MAX_CPU_ISA``,
  ``ONEDNN_MAX_CPU_ISA``); below ``AVX512_CORE`` it has no bf16 kernel at all (a fallback,
  warned about elsewhere, not a slowdown);
- or from a profile already on disk: this machine's speed cache
  (``speedbook.SpeedBook``), where an op the native lowers was measured slower.

The wording lives here so every backend says the same line, with the one argument that
opts in (``policy="auto"``). A ratio the line prints is one this machine's book measured;
the rule alone prints none (what oneDNN's emulation costs differs by framework, op and
shape: MXNet's GEMMs ran 2-3x slower, Paddle's whole steps 0.8-1.0x of float32, so a
figure said without measuring would be wrong for one of them). ``say_once`` logs it
once per process. Pure reads of ``/proc/cpuinfo``, the environment and one file; no
framework, no host sync.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import AbstractSet, Mapping, Optional

from ..rules.errors import AmpConfigError
from ..rules.isa import describe, machine, why_emulated
from .speedbook import cache_dir, machine_id, read_profile, warn_once

OPT_IN = 'policy="auto"'


def measured_slower(framework: str, version: str, dtype: str, ops: AbstractSet[str],
                    training: bool, m: Mapping, cache: Optional[Path] = None
                    ) -> list[tuple[str, str, float]]:
    """(op, shape class, ratio) of the ``ops`` this machine's speed cache measured slower
    than float32 (``speed_refusal``, ratio >= 1), worst first; an absent or
    unreadable cache, or one from another machine, says nothing."""
    path = cache or cache_dir() / f"profile-{machine_id(m)}.json"
    if not path.exists():
        return []
    try:
        got = read_profile(path)
    except AmpConfigError:
        return []
    if machine_id(got.machine) != machine_id(m):
        return []
    want = f"{dtype}{'+train' if training else ''}"
    out = []
    for (fw, ver, dt, op, shape), cost in got.costs().items():  # not a failed timing
        if (fw, ver, dt) != (framework, version, want) or op not in ops or cost.error:
            continue
        ratio = cost.ratio(training)[0]
        if ratio >= 1.0:  # slower, whatever the spread (``speed_refusal`` says so too)
            out.append((op, shape, ratio))
    return sorted(out, key=lambda r: -r[2])


def native_slowdown(who: str, framework: str, version: str, dtype: str, ops: AbstractSet[str],
                    training: bool, m: Optional[Mapping] = None,
                    cache: Optional[Path] = None) -> Optional[str]:
    """One line when the native's ``dtype`` decisions (which lower ``ops``) run an op slower
    than float32 on this machine (measured: the ratios, from this machine's speed cache),
    or may (by rule, where oneDNN emulates bf16: no ratio), else None. ``who``: the
    drop-in's name, the line's prefix."""
    m = machine() if m is None else m
    slow = measured_slower(framework, version, dtype, ops, training, m, cache)
    step = "training step" if training else "forward"
    tail = (f"; pass {OPT_IN} to keep float32 where {dtype} is slower here (measured "
            f"once per machine)")
    if slow:
        names = ", ".join(dict.fromkeys(f"{op} {ratio:.2f}x" for op, _, ratio in slow[:3]))
        return (f"{who}: the native {dtype} decisions run ops slower than float32 on "
                f"{describe(m)} ({names} float32's {step} time, as measured here before)"
                + tail)
    if dtype != "bfloat16" or not ops:
        return None
    why = why_emulated(m)
    if why is None:
        return None
    return (f"{who}: {why}, so oneDNN emulates bfloat16, and the native bfloat16 decisions "
            f"may run {', '.join(sorted(ops))} slower than float32 here (not measured yet: "
            f"`amp-adapters info --measure` times them)" + tail)


def say_once(logger: logging.Logger, line: Optional[str]) -> bool:
    """Log ``line`` (a WARNING) unless this process already said one for its drop-in (the
    line's prefix; ``speedbook.warn_once``); True if logged."""
    return bool(line) and warn_once(line.split(":", 1)[0] + "|native-slowdown", line, logger)


def note(who: str, policy, framework: str, version: str, training: bool) -> bool:
    """Say ``native_slowdown``'s line once per process (``say_once`` on ``who``'s logger)
    when ``policy`` holds the native's decisions (``defaults == "native"``: what a drop-in
    runs without ``policy=``); ``framework`` names the profile entries (``"paddle-pir"``),
    whose op lists are the framework's own. True if a line was logged. No probe, no host
    sync."""
    from ..rules.planner import effective_lists
    if not policy.enabled or policy.defaults != "native":
        return False
    ops = frozenset(effective_lists(policy, framework.split("-")[0])["lower"])
    return say_once(logging.getLogger(who), native_slowdown(
        who, framework, version, policy.dtype, ops, training))
