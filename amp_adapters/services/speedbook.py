"""Measured speed, kept: each op's cost at each shape class measured once per machine.

A ``SpeedBook`` answers ``DeviceProfile.costs``: (op, shape class) -> ``Cost``. It looks
in a saved profile the policy names (``Policy.profile``: a file ``amp-adapters profile``
wrote, which makes the plan identical on every rerun and every machine), then in the
on-disk cache of this machine, and only then measures (the backend's ``measure``) and
writes the answer to the cache. A key is measured once: the cost on disk decides, so a
decision once made is kept until an explicit refresh (``amp-adapters profile
--refresh``, or ``AMP_ADAPTERS_REFRESH=1``: what was measured before this process
started is measured again, once; what another process measured since is read).

The key of a measurement is everything that changes it: the machine (``isa.machine()``: CPU
model and flags, the CPUs this process may use, the thread settings and oneDNN ISA
limits in the environment, the GPU's name and compute capability), the framework and
its version, the dtype, training or inference, the op and the shape class *as measured*:
an unknown dimension (a static graph's batch) is measured at the batch the backend
passes, else at ``device.UNKNOWN_DIM``, and the key names that size (``64x2048;...``).

Processes that share a cache (data-parallel ranks on one host) plan alike: a measurement
runs under an advisory lock on the cache (``fcntl.flock`` on ``<cache>.lock``), so one
process measures a key and the others, waiting, read its answer; a write merges with
what is on disk under the same lock, so no process's older copy overwrites a newer entry.

A failure is not a measurement. An op that fails in the framework while being timed (the
backend's ``measure`` raises: a kernel that cannot be created) is an answer, kept as
"no kernel" (``Cost.error``). A failure of the measuring itself (``MeasuringFailed``: the
measuring process timed out, died, or could not start) is not: it is kept on disk only
as a ``Failure`` with its ``retry_after`` time (``RETRY_AFTER_S`` later), so the
processes started meanwhile (the other ranks) plan the op alike, in float32 (not
measured), and a process started after that time measures it again; a warning says so.

Files (JSON, the same format for the cache and a saved profile)::

    {"amp_adapters_profile": 1, "machine": {...}, "entries": [
        {"framework": "mxnet", "version": "1.9.1", "dtype": "bfloat16", "op": "FullyConnected",
         "shape": "64x2048;2048x2048", "forward": 0.61, "forward_spread": 0.02,
         "train": 0.7, "train_spread": 0.03, "measured_at": 1764300000.0}, ...]}

(a failure of the measuring: ``"error"`` and ``"retry_after"``, no ratio). The cache
lives in ``$AMP_ADAPTERS_CACHE`` (else ``$XDG_CACHE_HOME/amp-adapters``, else
``~/.cache/amp-adapters``), one file per machine. A cache directory that cannot be
written warns once and the measurements stay in memory. Reading a file is strict: a
malformed profile is an ``AmpConfigError`` naming the file, the entry and the key.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Union

from ..rules.device import UNKNOWN_DIM, Cost, ShapeClass
from ..rules.errors import AmpConfigError
from ..rules.isa import ISA_ENV, THREAD_ENV, describe, machine

try:  # an advisory lock between processes; where there is none, processes do not wait
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

FORMAT = 1
FORMAT_KEY = "amp_adapters_profile"
TIMING_ENV = ISA_ENV + THREAD_ENV  # the environment a measurement's machine key reads
RETRY_AFTER_S = 600.0  # a failure of the measuring is measured again by a process after this
_ENTRY_KEYS = ("framework", "version", "dtype", "op", "shape")
_COST_KEYS = ("forward", "forward_spread", "train", "train_spread", "error")
_WHEN_KEYS = ("measured_at", "retry_after")

log = logging.getLogger("amp_adapters")

Measure = Callable[[str, ShapeClass, bool], Optional[Cost]]  # op, shape, training


class MeasuringFailed(RuntimeError):
    """The measuring failed, not the op: the measuring process timed out, died (a signal,
    out of memory) or could not start. Raised by a backend's ``measure``; the book keeps
    it as a ``Failure``, never as "no kernel"."""


@dataclass(frozen=True)
class Failure:
    """A measurement that did not happen (``MeasuringFailed``): why, and the time (seconds
    since the epoch) after which a process measures it again. Not a measurement: a
    lookup answers None (not measured: float32 under measured speed) until then."""

    error: str
    retry_after: float


def gpu_key(name: str, capability: "tuple[int, int] | str") -> str:
    """The machine's ``gpu``: the GPU's name and compute capability (``"NVIDIA A100-SXM4-40GB
    (compute capability 8.0)"``), from a backend's answer or ``nvidia_gpu``."""
    cap = capability if isinstance(capability, str) else ".".join(map(str, capability))
    return f"{name.strip()} (compute capability {cap})"


def nvidia_gpu(index: int, run: Callable[..., Any] = None) -> Optional[tuple[str, str]]:
    """(name, compute capability) of CUDA device ``index`` as ``nvidia-smi`` reports it, or
    None where it cannot say (for a backend whose framework does not: MXNet)."""
    import subprocess
    run = run or subprocess.run
    try:
        got = run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader",
                   "-i", str(index)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = [p.strip() for p in (got.stdout or "").strip().split(",")]
    if got.returncode != 0 or len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


def machine_id(m: Mapping[str, Any]) -> str:
    """A short stable name of ``machine()``'s answer (the cache file's name)."""
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("AMP_ADAPTERS_CACHE"):
        return Path(env["AMP_ADAPTERS_CACHE"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "amp-adapters"


def entry_key(framework: str, version: str, dtype: str, op: str, shape: str) -> tuple:
    return (framework, version, dtype, op, shape)


def measured_shape(shape: ShapeClass, batch: Optional[int] = None) -> ShapeClass:
    """``shape`` as it is measured: each unknown dimension (a static graph's batch) taken as
    ``batch`` (default ``UNKNOWN_DIM``), rounded as a shape class is; what a key names."""
    fill = UNKNOWN_DIM if batch is None else batch
    return ShapeClass.of([None if s is None else [fill if d is None else d for d in s]
                          for s in shape.operands], shape.result_rank)


def shape_of(key: str) -> ShapeClass:
    """The shape class whose ``ShapeClass.key`` is ``key`` (a cache entry's ``shape``); an
    empty key is no operands (one lone scalar operand has that key too: no timed op takes
    one)."""
    operands, _, rank = key.partition(">")
    parts = operands.split(";") if operands else []
    return ShapeClass(tuple(None if p == "?" else tuple(
        None if d == "?" else int(d) for d in p.split("x")) if p else () for p in parts),
        int(rank) if rank else None)


Known = Union[Cost, Failure]


@dataclass
class ProfileFile:
    """The contents of one profile (or cache) file: the machine it was measured on,
    {entry_key: Cost or Failure}, and {entry_key: when it was measured} (seconds since the
    epoch; absent in a file written before that was kept)."""

    machine: dict
    entries: dict = field(default_factory=dict)
    measured_at: dict = field(default_factory=dict)

    def costs(self) -> dict:
        """{entry_key: Cost}: the measurements (not the failures of measuring)."""
        return {k: v for k, v in self.entries.items() if isinstance(v, Cost)}

    def to_json(self) -> str:
        rows = []
        for k, v in sorted(self.entries.items()):
            # an op that failed has no ratio (NaN, which JSON has not): none is written
            fields = {f: x for f, x in v.to_dict().items() if x == x} if isinstance(
                v, Cost) else {"error": v.error, "retry_after": v.retry_after}
            when = {"measured_at": self.measured_at[k]} if k in self.measured_at else {}
            rows.append({**dict(zip(_ENTRY_KEYS, k)), **fields, **when})
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


def _number(where: str, at: str, v: Any, positive: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v < 0 or (positive and v == 0):
        raise _bad(where, at, v, "must be a finite number " + (
            "> 0 (a time ratio)" if positive else ">= 0"))
    return float(v)


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
    out = ProfileFile(dict(m))
    for i, row in enumerate(rows):
        at = f"entries[{i}]"
        if not isinstance(row, dict):
            raise _bad(where, at, row, "must be an object")
        extra = sorted(set(row) - set(_ENTRY_KEYS) - set(_COST_KEYS) - set(_WHEN_KEYS))
        if extra:
            raise _bad(where, f"{at}.{extra[0]}", row[extra[0]], "is not an entry key "
                       f"(expected {', '.join(_ENTRY_KEYS + _COST_KEYS + _WHEN_KEYS)})")
        for k in _ENTRY_KEYS:
            if not isinstance(row.get(k), str):
                raise _bad(where, f"{at}.{k}", row.get(k), "must be a string")
        if "error" in row and not isinstance(row["error"], str):
            raise _bad(where, f"{at}.error", row["error"], "must be a string")
        key = tuple(row[k] for k in _ENTRY_KEYS)
        if "measured_at" in row:
            out.measured_at[key] = _number(where, f"{at}.measured_at", row["measured_at"],
                                           False)
        if "retry_after" in row:  # a failure of the measuring: no ratio
            ratios = sorted(set(row) & set(_COST_KEYS[:4]))
            if ratios or "error" not in row:
                k = ratios[0] if ratios else "error"
                raise _bad(where, f"{at}.{k}", row.get(k), "a failure of the measuring "
                           "(retry_after) has an error and no ratio")
            out.entries[key] = Failure(row["error"], _number(
                where, f"{at}.retry_after", row["retry_after"], False))
            continue
        for k in _COST_KEYS[:4]:
            v = row.get(k)
            if k in ("forward", "forward_spread") and v is None and "error" in row:
                continue
            if v is None and k.startswith("train"):
                continue
            _number(where, f"{at}.{k}", v, k in ("forward", "train"))
        out.entries[key] = Cost(**{k: (float(row[k]) if k != "error" else row[k])
                                   for k in _COST_KEYS if k in row})
    return out


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


_held = threading.local()  # the locks this thread holds (``locked`` is reentrant)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[bool]:
    """Hold the advisory lock of ``path`` (``fcntl.flock`` on ``path`` + ``.lock``, made if
    absent) while the block runs: other processes (and threads) taking it wait; this
    thread may take it again inside. Yields False (and does not wait) where no lock can be
    taken: a directory that cannot be written, no fcntl."""
    held = _held.__dict__.setdefault("paths", set())
    if fcntl is None or str(path) in held:
        yield fcntl is not None
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # a filesystem without flock (some NFS, FUSE): no lock, no wait
        os.close(fd)
        yield False
        return
    try:
        held.add(str(path))
        yield True
    finally:
        held.discard(str(path))
        os.close(fd)  # closing the descriptor releases the lock


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


PROCESS_STARTED = time.time()  # this process's start, as the speed book counts it
_MISS = object()  # a key the cache cannot answer (absent, stale under refresh, retry due)


class SpeedBook:
    """``DeviceProfile.costs`` for one framework and dtype: a saved profile first, then this
    machine's cache, then ``measure`` (written to the cache, under its lock). ``refresh``:
    measure again, once in this process, every key measured before it started (default:
    ``AMP_ADAPTERS_REFRESH=1``). ``batch``: the size an unknown dimension is measured at
    (a backend that knows the real batch passes it; default ``UNKNOWN_DIM``). ``clock``:
    seconds since the epoch (the failures' retry time)."""

    def __init__(self, framework: str, version: str, dtype: str, measure: Measure, *,
                 profile: "Optional[str | Path]" = None, cache: "Optional[str | Path]" = None,
                 refresh: Optional[bool] = None, here: Optional[dict] = None,
                 batch: Optional[int] = None, clock: Callable[[], float] = time.time):
        self.framework, self.version, self.dtype = framework, version, dtype
        self.measure = measure
        self.here = here or machine()
        self.refresh = os.environ.get("AMP_ADAPTERS_REFRESH") == "1" if refresh is None \
            else refresh
        self.batch, self.clock = batch, clock
        # when this process started (its import of the book): what refresh and a retry time
        # compare with, the same for every book a process makes however late
        self.started = PROCESS_STARTED if clock is time.time else clock()
        self.saved: Optional[ProfileFile] = None
        if profile is not None:
            self.saved = read_profile(profile)
            self._check_saved(str(profile))
        self.cache_path = Path(cache) if cache is not None else \
            cache_dir() / f"profile-{machine_id(self.here)}.json"
        self.cache = self._read_cache()  # what the disk held when this book was made
        self.known: dict[tuple, Optional[Cost]] = {}  # what this process decided per key
        self.mine = ProfileFile(self.here)  # what this process measured (kept if unwritable)

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
        """This machine's cache as it is on disk now (empty: absent, broken, another
        machine's)."""
        if not self.cache_path.exists():
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
        """The entry key of ``op`` at ``shape`` as measured (``measured_shape``: an unknown
        dimension at this book's batch)."""
        return entry_key(self.framework, self.version,
                         f"{self.dtype}{'+train' if training else ''}", op,
                         measured_shape(shape, self.batch).key)

    def lookup(self, op: str, shape: ShapeClass, training: bool = False) -> Optional[Cost]:
        """The cost of ``op`` at ``shape``: saved, cached, or measured now (and cached);
        None: not measured (no recipe, or the measuring failed: ``Failure``)."""
        measured = measured_shape(shape, self.batch)
        k = self.key(op, shape, training)
        if self.saved is not None and k in self.saved.entries:
            got = self.saved.entries[k]
            return got if isinstance(got, Cost) else None
        if k in self.known:
            return self.known[k]
        got = self._answer(self.cache, k)
        if got is _MISS:
            with locked(self.cache_path):  # one process measures; the others read its answer
                got = self._answer(self._read_cache(), k)
                if got is _MISS:
                    got = self._measure(k, op, measured, training)
        self.known[k] = got
        return got

    def _answer(self, disk: ProfileFile, k: tuple) -> Any:
        """What ``disk`` answers for ``k``: a cost, None (a failure of the measuring, kept for
        the processes started before its ``retry_after``: said once), or ``_MISS``. Under
        refresh only what was written since
        this book was made answers (another process's refresh: a sibling rank's)."""
        if k in self.mine.entries:  # measured here, but the cache could not keep it
            disk = self.mine
        got = disk.entries.get(k)
        if got is None:
            return _MISS
        fresh = disk.measured_at.get(k, 0.0) >= self.started
        if isinstance(got, Failure):
            if self.started >= got.retry_after or (self.refresh and not fresh):
                return _MISS
            self._say_failure(k, got)
            return None
        return got if fresh or not self.refresh else _MISS

    def _measure(self, k: tuple, op: str, shape: ShapeClass, training: bool) -> Optional[Cost]:
        if self.saved is not None:
            warn_once(f"missing:{k}", f"amp_adapters: the profile file has no entry for "
                       f"{op} at {shape.key} ({k[2]}): measured here")
        try:
            got: Optional[Known] = self.measure(op, shape, training)
        except MeasuringFailed as e:
            got = Failure(f"{e}"[:200], self.clock() + RETRY_AFTER_S)
        except Exception as e:  # noqa: BLE001 - the op failed in the framework: "no kernel"
            got = Cost(error=f"{type(e).__name__}: {e}"[:200])
        if got is None:
            return None  # not measurable: nothing to keep
        self._write(k, got)
        if isinstance(got, Failure):
            self._say_failure(k, got)
            return None
        return got

    def _say_failure(self, k: tuple, failure: Failure) -> None:
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(failure.retry_after))
        warn_once(f"failed:{k}", f"amp_adapters: {k[3]} at {k[4]} ({k[2]}) could not be "
                  f"timed: {failure.error}. A failure of the measuring, not of the op: it is "
                  f"not kept as a measurement; {k[3]} stays float32 there (not measured) in "
                  f"the processes started before {when}, and a process started after that "
                  f"measures it again (or now: AMP_ADAPTERS_REFRESH=1)")

    def _write(self, k: tuple, value: Known) -> None:
        """Keep ``value`` for ``k``: merged into the cache as it is on disk now (the caller
        holds its lock), so every other entry stays as the last writer left it."""
        now = self.clock()
        self.mine.entries[k], self.mine.measured_at[k] = value, now
        self._set_aside_unreadable()
        disk = self._read_cache()
        disk.entries[k], disk.measured_at[k] = value, now
        try:
            write_profile(self.cache_path, disk)
        except OSError as e:
            warn_once(f"write:{self.cache_path.parent}", f"amp_adapters: cannot write the "
                       f"speed cache in {self.cache_path.parent} ({e.strerror or e}): "
                       f"measurements stay in memory for this process; set "
                       f"AMP_ADAPTERS_CACHE to a writable directory to keep them")

    def _set_aside_unreadable(self) -> None:
        """A cache file this version cannot read (broken, or another version's format) is
        renamed ``<name>.unreadable-<time>``, not overwritten with one entry: what other
        processes measured stays on disk."""
        try:
            read_profile(self.cache_path)
        except AmpConfigError as e:
            if not self.cache_path.exists():
                return
            aside = self.cache_path.with_name(
                f"{self.cache_path.name}.unreadable-{int(self.clock())}")
            with contextlib.suppress(OSError):
                os.replace(self.cache_path, aside)
                warn_once(f"aside:{self.cache_path}", f"amp_adapters: the speed cache "
                          f"{self.cache_path} cannot be read ({e}): kept as {aside.name}, "
                          f"and a new one is written")

    def for_training(self, training: bool) -> Callable[[str, ShapeClass], Optional[Cost]]:
        """The ``DeviceProfile.costs`` lookup for a training or an inference program."""
        return lambda op, shape: self.lookup(op, shape, training)

    def remeasure(self) -> int:
        """Under refresh, measure again every key of this book's framework, version and dtype
        (training and inference) that the cache holds from before this book was made (the
        models' shapes too), keeping every other entry; the number measured again."""
        if not self.refresh:
            return 0
        ours = (self.framework, self.version)
        keys = [k for k in self._read_cache().entries if k[:2] == ours and
                k[2] in (self.dtype, f"{self.dtype}+train") and k not in self.known]
        for k in keys:
            self.lookup(k[3], shape_of(k[4]), k[2].endswith("+train"))
        return len(keys)

    def entries(self) -> dict:
        """Every cost this book knows (saved, cached as it is on disk now, measured here):
        measurements only, never a failure of the measuring."""
        out = {**self._read_cache().costs(), **self.mine.costs()}
        if self.saved is not None:
            out.update(self.saved.costs())
        return out

    def save(self, path: "str | Path") -> None:
        """Write what this book knows as a profile file a policy can name."""
        write_profile(path, ProfileFile(self.here, self.entries()))
