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

The wording lives here so every backend says the same line, with the ratio and the one
argument that opts in (``policy="auto"``). ``say_once`` logs it once per process. Pure
reads of ``/proc/cpuinfo``, the environment and one file; no framework, no host sync.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import AbstractSet, Mapping, Optional

from .device import speed_refusal
from .errors import AmpConfigError
from .speedbook import ISA_ENV, cache_dir, describe, machine, machine_id, read_profile

# oneDNN's ISA names, lowest first (``dnnl_cpu_isa_t``); a cap is the lowest of those set
ISA_ORDER = ("SSE41", "AVX", "AVX2", "AVX512_MIC", "AVX512_MIC_4OPS", "AVX512_CORE",
             "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL")
_AVX512_CORE = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
OPT_IN = 'policy="auto"'


def isa_cap(isa: Mapping[str, str]) -> Optional[str]:
    """The lowest oneDNN ISA cap set in ``isa`` (``machine()["isa"]``), or None."""
    known = [v.upper() for k, v in isa.items() if k in ISA_ENV and v.upper() in ISA_ORDER]
    return min(known, key=ISA_ORDER.index) if known else None


def bf16_without_instructions(m: Mapping) -> Optional[str]:
    """Why oneDNN runs bfloat16 here without bf16 instructions (slower than float32), or
    None: it has them, or it has no bf16 kernel at all (below AVX-512)."""
    flags = set(m.get("flags", ()))
    cap = isa_cap(m.get("isa", {}))
    if not all(f in flags for f in _AVX512_CORE):
        return None
    if cap is not None and ISA_ORDER.index(cap) < ISA_ORDER.index("AVX512_CORE"):
        return None
    if "avx512_bf16" not in flags:
        return f"{m.get('cpu')} has AVX-512 without avx512_bf16"
    if cap is not None and ISA_ORDER.index(cap) < ISA_ORDER.index("AVX512_CORE_BF16"):
        env = ", ".join(f"{k}={v}" for k, v in sorted(m.get("isa", {}).items()))
        return f"{env} keeps oneDNN off the CPU's bf16 instructions"
    return None


def measured_slower(framework: str, version: str, dtype: str, ops: AbstractSet[str],
                    training: bool, m: Mapping, cache: Optional[Path] = None
                    ) -> list[tuple[str, str, float]]:
    """(op, shape class, ratio) of the ``ops`` this machine's speed cache measured slower
    than float32 beyond noise (``speed_refusal``, ratio >= 1), worst first; an absent or
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
    for (fw, ver, dt, op, shape), cost in got.entries.items():
        if (fw, ver, dt) != (framework, version, want) or op not in ops or cost.error:
            continue
        ratio = cost.ratio(training)[0]
        if ratio >= 1.0 and speed_refusal(cost, training, dtype) is not None:
            out.append((op, shape, ratio))
    return sorted(out, key=lambda r: -r[2])


def native_slowdown(who: str, framework: str, version: str, dtype: str, ops: AbstractSet[str],
                    training: bool, typical: str, m: Optional[Mapping] = None,
                    cache: Optional[Path] = None) -> Optional[str]:
    """One line when the native's ``dtype`` decisions (which lower ``ops``) run an op slower
    than float32 on this machine, else None. ``typical``: the ratio the backend measured
    on such CPUs (said when the rule, not a measurement, knows it); ``who``: the
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
    why = bf16_without_instructions(m)
    if why is None:
        return None
    return (f"{who}: {why}, so oneDNN emulates bfloat16 and the native bfloat16 decisions "
            f"run {', '.join(sorted(ops))} slower than float32 (about {typical} its time)"
            + tail)


_said: set[str] = set()
_lock = threading.Lock()


def say_once(logger: logging.Logger, line: Optional[str]) -> bool:
    """Log ``line`` (a WARNING) unless this process already said it; True if logged."""
    if not line:
        return False
    key = line.split(":", 1)[0] + "|native-slowdown"
    with _lock:
        if key in _said:
            return False
        _said.add(key)
    logger.warning("%s", line)
    return True
