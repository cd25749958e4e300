"""What oneDNN can use for bfloat16 on this CPU: its flags, capped by the ISA limit in the
environment (``DNNL_MAX_CPU_ISA`` for MXNet's oneDNN 2.x, ``ONEDNN_MAX_CPU_ISA`` for
Paddle's 3.x; either caps both here, as a user setting one means to).

Three classes, each with its known cost (measured: docs/bf16.md):

- ``"native"``: ``avx512_bf16`` (or AMX) in use: bf16 kernels are real and can be faster;
- ``"emulated"``: AVX-512 without bf16 instructions (a Skylake/Cascade Lake/Ice Lake server,
  or a cap at ``AVX512_CORE``/``AVX512_CORE_VNNI``): bf16 kernels run, 2-3x slower than
  float32;
- ``"none"``: no AVX-512 in use (or a cap below it): no oneDNN bf16 kernel at all.

The project can run *as* a lower class than the CPU has: ``AMP_ADAPTERS_CPU=avx2`` or
``=avx512_core`` (``simulated``). ``machine()`` then reports the CPU without the flags that
class lacks, and the oneDNN limit that matches it (``onednn_env``), which every measuring
child and the test suite's own process get before a framework loads. Every expectation
about the CPU, in the library and in its tests, reads this class, never a CPU's name nor a
framework's cpuid answer (Paddle's ``supports_bfloat16`` cannot be made to simulate).

The device truth itself lives here: ``machine()`` reads the CPU (``/proc/cpuinfo``: model,
the flags that decide its low-precision kernels), the CPUs this process may use and the
thread and ISA settings, as the simulated class sees them; every runtime's kernel table and
the speed book's cache key (``services.speedbook``) start from it. A pure reading of the
machine and the environment; no framework, no host sync.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping, Optional

from .errors import AmpConfigError

# oneDNN's ISA names, lowest first (a cap names one of them)
ORDER = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
         "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
         "ALL")
_NATIVE, _AVX512 = ORDER.index("AVX512_CORE_BF16"), ORDER.index("AVX512_CORE")
AVX512_CORE_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")  # oneDNN's avx512_core
ISA_ENV = ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA")  # MXNet's oneDNN 2.x, Paddle's 3.x
SIMULATE_ENV = "AMP_ADAPTERS_CPU"
# a CPU class the project can run as -> the oneDNN limit that keeps it there
SIMULATED = {"avx2": "AVX2", "avx512_core": "AVX512_CORE"}
# the thread settings a timing depends on, readable without importing a framework: OpenMP's
# and MKL's, MXNet's engine (its CPU worker threads, its OpenMP cap, the engine type) and
# Paddle's (its places, its math library's threads)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS",
              "MXNET_OMP_MAX_THREADS", "MXNET_ENGINE_TYPE", "CPU_NUM",
              "FLAGS_paddle_num_threads")
_FLAGS = re.compile(r"\b(avx512[a-z_0-9]*|amx[a-z_0-9]*|avx2|fma|f16c|avx_vnni)\b")


def simulated(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The CPU class ``AMP_ADAPTERS_CPU`` asks the project to run as (``"avx2"``: no
    AVX-512; ``"avx512_core"``: AVX-512 without bf16 instructions), or None: as it is."""
    env = os.environ if environ is None else environ
    value = env.get(SIMULATE_ENV, "").strip().lower()
    if not value:
        return None
    if value not in SIMULATED:
        raise AmpConfigError(
            f"{SIMULATE_ENV}={env[SIMULATE_ENV]!r} is not a CPU class amp-adapters can run "
            f"as: use {' or '.join(sorted(SIMULATED))} (avx2: no AVX-512, no oneDNN bf16 "
            f"kernel; avx512_core: AVX-512 without bf16 instructions, bf16 emulated), or "
            f"unset it to run as this CPU is")
    return value


def onednn_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The oneDNN ISA limits (``DNNL_MAX_CPU_ISA``, ``ONEDNN_MAX_CPU_ISA``) that keep oneDNN
    in the simulated class, for a process about to load a framework; a lower limit the
    environment already sets is kept. Empty when nothing is simulated."""
    env = os.environ if environ is None else environ
    kind = simulated(env)
    if kind is None:
        return {}
    want = SIMULATED[kind]
    out = {}
    for k in ISA_ENV:
        have = env.get(k, "").upper()
        keep = have in ORDER and ORDER.index(have) <= ORDER.index(want)
        out[k] = env[k] if keep else want
    return out


def simulate(m: Mapping, environ: Optional[Mapping[str, str]] = None) -> dict:
    """``machine()``'s answer ``m`` as the simulated class sees it: without the flags that
    class lacks, with its oneDNN limits, and the class named (``"simulated"``); ``m`` as it
    is when nothing is simulated."""
    kind = simulated(environ)
    if kind is None:
        return dict(m)
    lacks = ("avx512", "amx") if kind == "avx2" else ("avx512_bf16", "avx512_fp16", "amx")
    flags = [f for f in m.get("flags", ()) if not f.startswith(lacks)]
    return {**m, "flags": flags, "isa": {**m.get("isa", {}), **onednn_env(environ)},
            "simulated": kind}


def cap(m: Mapping) -> Optional[tuple[str, str]]:
    """(variable, value as set) of the lowest ISA limit set in the environment, or None."""
    known = [(k, v) for k, v in sorted(m.get("isa", {}).items()) if v.upper() in ORDER]
    return min(known, key=lambda kv: ORDER.index(kv[1].upper())) if known else None


def bf16_class(m: Mapping) -> str:
    """``"native"``, ``"emulated"`` or ``"none"`` for the machine ``m`` (``machine()``)."""
    flags = set(m.get("flags", ()))
    level = ORDER.index("ALL")
    limit = cap(m)
    if limit is not None:
        level = ORDER.index(limit[1].upper())
    if not flags.issuperset(AVX512_CORE_FLAGS) or level < _AVX512:
        return "none"
    if ("avx512_bf16" in flags or any(f.startswith("amx") for f in flags)) and level >= _NATIVE:
        return "native"
    return "emulated"


def why_emulated(m: Mapping) -> Optional[str]:
    """Why oneDNN runs bfloat16 here without bf16 instructions (``"emulated"``), or None."""
    if bf16_class(m) != "emulated":
        return None
    limit = cap(m)
    if limit is not None and ORDER.index(limit[1].upper()) < _NATIVE and "avx512_bf16" in \
            m.get("flags", ()):
        return f"{limit[0]}={limit[1]} keeps oneDNN off the CPU's bf16 instructions"
    return f"{m.get('cpu')} has AVX-512 without avx512_bf16"


def describe_bf16(m: Mapping) -> str:
    """One line for ``amp-adapters info``: what oneDNN uses for bf16 here, and why."""
    flags = " ".join(f for f in m.get("flags", ()) if f.startswith(("avx512", "amx"))) \
        or "no AVX-512"
    limit = cap(m)
    by = f"; oneDNN limited to {limit[1]} by {limit[0]}" if limit else ""
    if m.get("simulated"):
        by += f"; run as the CPU class {m['simulated']} ({SIMULATE_ENV})"
    kind = bf16_class(m)
    what = {"native": "oneDNN runs bfloat16 natively (avx512_bf16)",
            "emulated": "oneDNN runs bfloat16 without bf16 instructions: emulated, often "
                        "slower than float32 (`amp-adapters info --measure` times it here)",
            "none": "oneDNN runs no bfloat16 kernel here"}[kind]
    return f"CPU: {m.get('cpu')} ({flags}){by}: {what}"


def cpus() -> int:
    """The CPUs this process may run on (its affinity; a container's or ``taskset``'s
    limit), which bounds the threads a kernel gets."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine(cpuinfo: str = "/proc/cpuinfo", gpu: Optional[str] = None,
            environ: Optional[Mapping[str, str]] = None, ncpus: Optional[int] = None) -> dict:
    """What makes one machine's timings differ from another's: the CPU model and the flags
    that decide its low-precision kernels, the CPUs this process may use (``cpus``), the
    thread settings (``THREAD_ENV``) and oneDNN ISA limits set in the environment, and the
    GPU (a backend's ``speedbook.gpu_key``; None on a CPU); as the simulated CPU class sees it
    (``simulate``: ``AMP_ADAPTERS_CPU``)."""
    env = os.environ if environ is None else environ
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return simulate({"cpu": model.group(1).strip() if model else "unknown",
                     "flags": sorted(set(_FLAGS.findall(text))), "gpu": gpu,
                     "isa": {k: env[k] for k in ISA_ENV if env.get(k)},
                     "cpus": cpus() if ncpus is None else ncpus,
                     "threads": {k: env[k] for k in THREAD_ENV if env.get(k)}}, env)


def describe(m: Mapping[str, Any]) -> str:
    """One line: ``AMD EPYC (avx512_bf16 ...), 2 CPUs, OMP_NUM_THREADS=1,
    ONEDNN_MAX_CPU_ISA=AVX512_CORE``."""
    env = {**m.get("threads", {}), **m.get("isa", {})}
    isa = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
    flags = " ".join(f for f in m.get("flags", ()) if f.startswith(("avx512_bf16", "amx")))
    return f"{m.get('cpu')}" + (f" ({flags})" if flags else "") + \
        (f", {m['cpus']} CPUs" if m.get("cpus") else "") + \
        (f", GPU {m['gpu']}" if m.get("gpu") else "") + (f", {isa}" if isa else "")
