"""Measured speed, kept: each op's cost at each shape class measured once per machine.

A ``SpeedBook`` answers ``DeviceProfile.costs``: (op, shape class) -> ``Cost``. It looks
in a saved profile the policy names (``Policy.profile``: a file ``amp-adapters profile``
wrote, which makes the plan identical on every rerun and every machine), then in the
on-disk cache of this machine, and only then measures (the backend's ``measure``) and
writes the answer to the cache. A key is measured once: the cost on disk decides, so a
decision once made is kept until an explicit refresh (``amp-adapters profile
--refresh``, or ``AMP_ADAPTERS_REFRESH=1``).

The key of a measurement is everything that changes it: the machine (``machine()``: CPU
model and flags, GPU name, the oneDNN ISA limits in the environment), the framework and
its version, the dtype, training or inference, the op and the shape class.

Files (JSON, the same format for the cache and a saved profile)::

    {"amp_adapters_profile": 1, "machine": {...}, "entries": [
        {"framework": "mxnet", "version": "1.9.1", "dtype": "bfloat16", "op": "FullyConnected",
         "shape": "64x2048;2048x2048", "forward": 0.61, "forward_spread": 0.02,
         "train": 0.7, "train_spread": 0.03}, ...]}

The cache lives in ``$AMP_ADAPTERS_CACHE`` (else ``$XDG_CACHE_HOME/amp-adapters``, else
``~/.cache/amp-adapters``), one file per machine. A cache directory that cannot be written
warns once and the measurements stay in memory. Reading a file is strict: a malformed
profile is an ``AmpConfigError`` naming the file, the entry and the key.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from .device import Cost, ShapeClass
from .errors import AmpConfigError
from .isa import ISA_ENV, simulate

FORMAT = 1
FORMAT_KEY = "amp_adapters_profile"
_FLAGS = re.compile(r"\b(avx512[a-z_0-9]*|amx[a-z_0-9]*|avx2|fma|f16c|avx_vnni)\b")
_ENTRY_KEYS = ("framework", "version", "dtype", "op", "shape")
_COST_KEYS = ("forward", "forward_spread", "train", "train_spread", "error")

log = logging.getLogger("amp_adapters")

Measure = Callable[[str, ShapeClass, bool], Optional[Cost]]  # op, shape, training


def machine(cpuinfo: str = "/proc/cpuinfo", gpu: Optional[str] = None,
            environ: Optional[Mapping[str, str]] = None) -> dict:
    """What makes one machine's timings differ from another's: the CPU model and the flags
    that decide its low-precision kernels, the GPU's name (a backend's, None on a CPU), and
    the oneDNN ISA limits set in the environment; as the simulated CPU class sees it
    (``isa.simulate``: ``AMP_ADAPTERS_CPU``)."""
    env = os.environ if environ is None else environ
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return simulate({"cpu": model.group(1).strip() if model else "unknown",
                     "flags": sorted(set(_FLAGS.findall(text))), "gpu": gpu,
                     "isa": {k: env[k] for k in ISA_ENV if env.get(k)}}, env)


def machine_id(m: Mapping[str, Any]) -> str:
    """A short stable name of ``machine()``'s answer (the cache file's name)."""
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()[:16]


def describe(m: Mapping[str, Any]) -> str:
    """One line: ``AMD EPYC (avx512_bf16 ...), ONEDNN_MAX_CPU_ISA=AVX512_CORE``."""
    isa = ", ".join(f"{k}={v}" for k, v in sorted(m.get("isa", {}).items()))
    flags = " ".join(f for f in m.get("flags", ()) if f.startswith(("avx512_bf16", "amx")))
    return f"{m.get('cpu')}" + (f" ({flags})" if flags else "") + \
        (f", GPU {m['gpu']}" if m.get("gpu") else "") + (f", {isa}" if isa else "")


def cache_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("AMP_ADAPTERS_CACHE"):
        return Path(env["AMP_ADAPTERS_CACHE"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "amp-adapters"


def entry_key(framework: str, version: str, dtype: str, op: str, shape: str) -> tuple:
    return (framework, version, dtype, op, shape)


@dataclass
class ProfileFile:
    """The contents of one profile (or cache) file: the machine it was measured on and
    {entry_key: Cost}."""

    machine: dict
    entries: dict = field(default_factory=dict)

    def to_json(self) -> str:
        rows = [{**dict(zip(_ENTRY_KEYS, k)), **c.to_dict()}
                for k, c in sorted(self.entries.items())]
        return json.dumps({FORMAT_KEY: FORMAT, "machine": self.machine, "entries": rows},
                          indent=1, sort_keys=True)


def _bad(where: str, key: str, value: Any, what: str) -> AmpConfigError:
    return AmpConfigError(f"{where}: {key} = {value!r}: {what}; write it with `amp-adapters "
                          f"profile --save PATH`, or remove the file to measure again")


def read_profile(path: "str | Path") -> ProfileFile:
    """A profile file, checked: every problem is an ``AmpConfigError`` naming the file and
    the key."""
    where = f"profile file {str(path)!r}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AmpConfigError(f"{where} does not exist; write one with `amp-adapters profile "
                             f"--save {path}`") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AmpConfigError(f"{where} cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise AmpConfigError(f"{where} is not JSON: {e.msg} (line {e.lineno}, column "
                             f"{e.colno})") from None
    return parse_profile(data, where)


def parse_profile(data: Any, where: str) -> ProfileFile:
    """``read_profile``'s check of the parsed structure."""
    if not isinstance(data, dict):
        raise _bad(where, "the file", type(data).__name__, "must be a JSON object")
    if data.get(FORMAT_KEY) != FORMAT:
        raise _bad(where, FORMAT_KEY, data.get(FORMAT_KEY), f"must be {FORMAT} (the format "
                   f"this amp-adapters reads)")
    unknown = sorted(set(data) - {FORMAT_KEY, "machine", "entries"})
    if unknown:
        raise _bad(where, unknown[0], data[unknown[0]], "is not a profile key (expected "
                   f"{FORMAT_KEY}, machine, entries)")
    m = data.get("machine")
    if not isinstance(m, dict) or not isinstance(m.get("cpu"), str):
        raise _bad(where, "machine", m, "must be an object with the CPU model as 'cpu'")
    rows = data.get("entries")
    if not isinstance(rows, list):
        raise _bad(where, "entries", rows, "must be a list of measurements")
    entries = {}
    for i, row in enumerate(rows):
        at = f"entries[{i}]"
        if not isinstance(row, dict):
            raise _bad(where, at, row, "must be an object")
        extra = sorted(set(row) - set(_ENTRY_KEYS) - set(_COST_KEYS))
        if extra:
            raise _bad(where, f"{at}.{extra[0]}", row[extra[0]], "is not an entry key "
                       f"(expected {', '.join(_ENTRY_KEYS + _COST_KEYS)})")
        for k in _ENTRY_KEYS:
            if not isinstance(row.get(k), str):
                raise _bad(where, f"{at}.{k}", row.get(k), "must be a string")
        for k in _COST_KEYS[:4]:
            v = row.get(k)
            if k in ("forward", "forward_spread") and v is None and "error" in row:
                continue
            if v is None and k.startswith("train"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0 or (k in ("forward", "train") and v == 0):
                raise _bad(where, f"{at}.{k}", v, "must be a finite number "
                           + ("> 0 (a time ratio)" if k in ("forward", "train") else ">= 0"))
        if "error" in row and not isinstance(row["error"], str):
            raise _bad(where, f"{at}.error", row["error"], "must be a string")
        cost = Cost(**{k: (float(row[k]) if k != "error" else row[k])
                       for k in _COST_KEYS if k in row})
        entries[tuple(row[k] for k in _ENTRY_KEYS)] = cost
    return ProfileFile(dict(m), entries)


def write_profile(path: "str | Path", profile: ProfileFile) -> None:
    """Write ``profile`` atomically (a crash leaves the old file or the new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(profile.to_json())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str, logger: logging.Logger = log) -> bool:
    """Log ``message`` as a WARNING on ``logger`` unless this process already did for ``key``;
    True if logged (the one once-per-process rule of measured speed's messages)."""
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    logger.warning("%s", message)
    return True


class SpeedBook:
    """``DeviceProfile.costs`` for one framework and dtype: a saved profile first, then this
    machine's cache, then ``measure`` (written to the cache). ``refresh``: measure every key
    again once in this process (default: ``AMP_ADAPTERS_REFRESH=1``)."""

    def __init__(self, framework: str, version: str, dtype: str, measure: Measure, *,
                 profile: "Optional[str | Path]" = None, cache: "Optional[str | Path]" = None,
                 refresh: Optional[bool] = None, here: Optional[dict] = None):
        self.framework, self.version, self.dtype = framework, version, dtype
        self.measure = measure
        self.here = here or machine()
        self.refresh = os.environ.get("AMP_ADAPTERS_REFRESH") == "1" if refresh is None \
            else refresh
        self.saved: Optional[ProfileFile] = None
        if profile is not None:
            self.saved = read_profile(profile)
            self._check_saved(str(profile))
        self.cache_path = Path(cache) if cache is not None else \
            cache_dir() / f"profile-{machine_id(self.here)}.json"
        self.cache = self._read_cache()

    def _check_saved(self, path: str) -> None:
        saved = self.saved
        assert saved is not None
        mine = [k for k in saved.entries if k[0] == self.framework]
        other = sorted({k[1] for k in mine if k[1] != self.version})
        if other:
            raise AmpConfigError(
                f"profile file {path!r}: entries for {self.framework} {other[0]}, but "
                f"{self.framework} {self.version} is installed: its timings do not hold "
                f"for this version; measure again (`amp-adapters profile --save {path}`)")
        if machine_id(saved.machine) != machine_id(self.here):
            warn_once(f"machine:{path}", f"amp_adapters: profile file {path!r} was measured "
                       f"on {describe(saved.machine)}; this machine is {describe(self.here)}: "
                       f"its decisions are replayed as saved, not re-measured")

    def _read_cache(self) -> ProfileFile:
        if self.refresh or not self.cache_path.exists():
            return ProfileFile(self.here)
        try:
            got = read_profile(self.cache_path)
        except AmpConfigError as e:  # a broken cache is measured again, not an error
            warn_once(f"cache:{self.cache_path}", f"amp_adapters: ignoring the speed cache "
                       f"({e})")
            return ProfileFile(self.here)
        return got if machine_id(got.machine) == machine_id(self.here) else \
            ProfileFile(self.here)

    def key(self, op: str, shape: ShapeClass, training: bool) -> tuple:
        return entry_key(self.framework, self.version,
                         f"{self.dtype}{'+train' if training else ''}", op, shape.key)

    def lookup(self, op: str, shape: ShapeClass, training: bool = False) -> Optional[Cost]:
        """The cost of ``op`` at ``shape``: saved, cached, or measured now (and cached)."""
        k = self.key(op, shape, training)
        if self.saved is not None and k in self.saved.entries:
            return self.saved.entries[k]
        if k in self.cache.entries:
            return self.cache.entries[k]
        if self.saved is not None:
            warn_once(f"missing:{k}", f"amp_adapters: the profile file has no entry for "
                       f"{op} at {shape.key} ({k[2]}): measured here")
        try:
            cost = self.measure(op, shape, training)
        except Exception as e:  # noqa: BLE001 - a crash while timing is "no kernel"
            cost = Cost(error=f"{type(e).__name__}: {e}"[:200])
        if cost is None:
            return None
        self.cache.entries[k] = cost
        self._save_cache()
        return cost

    def _save_cache(self) -> None:
        """Write the cache, merged with what another process wrote since it was read (each
        key is measured once; what this process measured wins)."""
        on_disk = None if self.refresh else self._read_cache()
        if on_disk is not None:
            self.cache.entries = {**on_disk.entries, **self.cache.entries}
        try:
            write_profile(self.cache_path, self.cache)
        except OSError as e:
            warn_once(f"write:{self.cache_path.parent}", f"amp_adapters: cannot write the "
                       f"speed cache in {self.cache_path.parent} ({e.strerror or e}): "
                       f"measurements stay in memory for this process; set "
                       f"AMP_ADAPTERS_CACHE to a writable directory to keep them")

    def for_training(self, training: bool) -> Callable[[str, ShapeClass], Optional[Cost]]:
        """The ``DeviceProfile.costs`` lookup for a training or an inference program."""
        return lambda op, shape: self.lookup(op, shape, training)

    def entries(self) -> dict:
        """Every cost this book knows (saved, cached, measured now)."""
        out = dict(self.cache.entries)
        if self.saved is not None:
            out.update(self.saved.entries)
        return out

    def save(self, path: "str | Path") -> None:
        """Write what this book knows as a profile file a policy can name."""
        write_profile(path, ProfileFile(self.here, self.entries()))
