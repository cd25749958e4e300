"""Checkpoints that survive a kill: atomic folders with a verified manifest (no framework).

A checkpoint path is a folder that holds complete checkpoints and one pointer::

    PATH/CURRENT            {"folder": "step-00000012-3f9a..."}   (replaced atomically)
    PATH/step-00000012-.../ the backend's files + manifest.json

``save`` lets the backend write its files into a fresh ``PATH/.tmp-...``
folder, writes ``manifest.json`` (format, framework, step, policy, loss-scale
state, each file's size and SHA-256, and the manifest's own SHA-256), fsyncs
every file and the folder, renames it to ``step-...``, fsyncs ``PATH``, and
only then replaces ``CURRENT`` (write a temp file, fsync, ``os.replace``,
fsync). A kill at any point leaves ``CURRENT`` naming the previous complete
checkpoint (or no ``CURRENT`` at all before the first one completes); leftover
temp and superseded folders are removed by the next ``save``.

``load`` reads ``CURRENT``, recomputes every checksum and raises
``CheckpointError`` naming what is torn, truncated, missing or mismatched
(framework, policy, backend metadata) before the backend reads anything:
never a silent resume.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

from ..rules.errors import AmpConfigError, CheckpointError, check_flag
from ..rules.oplists import CATEGORIES
from ..rules.loss_scale.state_dict import upgrade as upgrade_state_dict
from ..rules.scaler import LossScale, loss_scale_from_state_dict

FORMAT = 1  # of the manifest; 1: amp-adapters 0.1.0
# format -> the function that turns a manifest body of that format into one of the next
UPGRADES: dict[int, Callable[[dict], dict]] = {}
MANIFEST = "manifest.json"
CURRENT = "CURRENT"
LOCK = ".lock"
LOSS_SCALE_FILE = "loss_scale.json"
_PREFIX, _TMP = "step-", ".tmp-"


def describe_policy(policy: Any) -> Optional[dict[str, Any]]:
    """A JSON description of a ``Policy`` (None for none) that compares equal iff the
    policies make the same decisions with the same initial loss scale."""
    if policy is None:
        return None

    def lists(o: Any) -> dict[str, Any]:
        d: dict[str, Any] = {c: sorted(getattr(o, c)) for c in CATEGORIES}
        d["conditional_fp32"] = [[op, attr, list(v)] for op, attr, v in o.conditional_fp32]
        d["replace"] = o.replace if isinstance(o.replace, bool) else sorted(o.replace)
        return d

    return {"dtype": policy.dtype, "level": policy.level, "emulate": policy.emulate,
            "ops": lists(policy.ops), "mxnet_ops": lists(policy.mxnet_ops),
            "paddle_ops": lists(policy.paddle_ops),
            "loss_scale": _jsonable(policy.loss_scale.state_dict())}


def _jsonable(d: Any) -> Any:
    """inf as the string "inf" (at any depth) so the JSON is strict (json.dumps would write
    Infinity)."""
    if isinstance(d, Mapping):
        return {k: _jsonable(v) for k, v in d.items()}
    return "inf" if isinstance(d, float) and d == float("inf") else d


def _unjson(d: Any) -> Any:
    if isinstance(d, Mapping):
        return {k: _unjson(v) for k, v in d.items()}
    return float("inf") if d == "inf" else d


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _body_digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: its folder, step, policy description, loss scale, metadata."""

    folder: Path
    framework: str
    step: int
    policy: Optional[dict[str, Any]]
    loss_scale: Optional[LossScale]
    meta: Mapping[str, Any]

    def file(self, name: str) -> Path:
        return self.folder / name


@contextlib.contextmanager
def save(path: "str | os.PathLike[str]", *, framework: str, step: int, policy: Any = None,
         loss_scale: Optional[LossScale] = None,
         meta: Optional[Mapping[str, Any]] = None) -> Iterator[Path]:
    """Yield an empty staging folder; on a clean exit publish it atomically as the newest
    checkpoint of ``path``. On an exception the staging folder is removed and ``path``
    is unchanged. ``meta``: JSON values the backend checks again on load. Saves into one
    folder take turns (a lock file); ``load`` takes no lock."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"step must be an int >= 0, got {step!r}")
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"checkpoint path {str(root)!r} is a file; checkpoints are "
                              f"folders (pass a folder path, it is created if missing)")
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        yield from _publish(root, framework, step, policy, loss_scale, meta)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive lock on ``root/.lock`` for one save, so that concurrent savers (two
    processes given the same folder) take turns and ``_prune`` never removes another
    saver's folder; the OS releases it when a saver is killed. (POSIX; elsewhere none.)"""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(root / LOCK, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _publish(root: Path, framework: str, step: int, policy: Any,
             loss_scale: Optional[LossScale], meta: Optional[Mapping[str, Any]]) -> Iterator[Path]:
    staging = root / f"{_TMP}{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        yield staging
        if loss_scale is not None:
            (staging / LOSS_SCALE_FILE).write_text(
                json.dumps(_jsonable(loss_scale.state_dict()), sort_keys=True, allow_nan=False))
        files = {}
        for f in sorted(staging.rglob("*")):
            if f.is_file():
                _fsync_file(f)
                files[f.relative_to(staging).as_posix()] = {"bytes": f.stat().st_size,
                                                            "sha256": _sha256(f)}
        body = {"format": FORMAT, "framework": framework, "step": step,
                "policy": describe_policy(policy), "meta": dict(meta or {}), "files": files}
        manifest = staging / MANIFEST
        with open(manifest, "w") as f:
            json.dump({"body": body, "sha256": _body_digest(body)}, f, sort_keys=True,
                      allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        for d in sorted({p.parent for p in staging.rglob("*")} | {staging}, reverse=True):
            _fsync_dir(d)
        final = root / f"{_PREFIX}{step:08d}-{staging.name[len(_TMP):]}"
        os.rename(staging, final)
        _fsync_dir(root)
        pointer = root / f"{_TMP}{CURRENT}-{uuid.uuid4().hex}"
        with open(pointer, "w") as f:
            json.dump({"folder": final.name}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer, root / CURRENT)  # the commit point
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _prune(root, keep=final.name)


def _prune(root: Path, keep: str) -> None:
    """Remove superseded checkpoints and the leftovers of killed saves."""
    for p in root.iterdir():
        if p.name != keep and p.name.startswith((_PREFIX, _TMP)):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def load(path: "str | os.PathLike[str]", *, framework: str, policy: Any = None,
         check_policy: bool = True) -> Checkpoint:
    """The newest complete checkpoint of ``path``, verified; else ``CheckpointError``.

    Checks the pointer, the manifest's own checksum, the format, the
    framework, every file's size and SHA-256, and (``check_policy``) that it
    was made under the same policy as ``policy``. Reads no framework state."""
    check_flag("check_policy", check_policy)
    root = Path(path)
    where = f"checkpoint {str(root)!r}"
    if not root.is_dir():
        raise CheckpointError(f"{where} does not exist (no checkpoint has been saved there)")
    pointer = root / CURRENT
    if not pointer.is_file():
        raise CheckpointError(f"{where} has no complete checkpoint yet (no {CURRENT} file; a "
                              f"save that was interrupted leaves none): start from scratch")
    try:
        name = json.loads(pointer.read_text())["folder"]
        if not isinstance(name, str) or "/" in name or not name.startswith(_PREFIX):
            raise ValueError(name)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"{where}: {CURRENT} is corrupt") from None
    folder = root / name
    try:
        raw = json.loads((folder / MANIFEST).read_text())
        body, digest = raw["body"], raw["sha256"]
    except FileNotFoundError:
        raise CheckpointError(f"{where}: {CURRENT} names {name}, which has no {MANIFEST} "
                              f"(the folder was removed or torn)") from None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(f"{where}: {name}/{MANIFEST} is corrupt (not the JSON a save "
                              f"writes)") from None
    if not isinstance(body, dict) or _body_digest(body) != digest:
        raise CheckpointError(f"{where}: {name}/{MANIFEST} does not match its checksum "
                              f"(torn or edited)")
    body = _upgraded(body, where)
    if body.get("framework") != framework:
        raise CheckpointError(f"{where} was written by the {body.get('framework')} backend; "
                              f"load it with that backend, not {framework}")
    for rel, info in sorted(body["files"].items()):
        f = folder / rel
        if not f.is_file():
            raise CheckpointError(f"{where}: file {rel} is missing")
        size = f.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{where}: file {rel} is truncated or torn ({size} bytes, "
                                  f"the manifest says {info['bytes']})")
        if _sha256(f) != info["sha256"]:
            raise CheckpointError(f"{where}: file {rel} does not match its SHA-256 (corrupt)")
    wanted = describe_policy(policy)
    if check_policy and _saved_policy(body["policy"], where) != wanted:
        diff = sorted(k for k in set(body["policy"] or {}) | set(wanted or {})
                      if (body["policy"] or {}).get(k) != (wanted or {}).get(k))
        raise CheckpointError(
            f"{where} was made under another policy (differs in: {', '.join(diff)}; saved "
            f"{_short(body['policy'])}, now {_short(wanted)}); resume under the same policy, "
            f"or pass check_policy=False to change it on purpose")
    scale = None
    if LOSS_SCALE_FILE in body["files"]:
        try:
            scale = loss_scale_from_state_dict(
                _unjson(json.loads((folder / LOSS_SCALE_FILE).read_text())))
        except (AmpConfigError, ValueError) as e:
            raise CheckpointError(f"{where}: {LOSS_SCALE_FILE} is not a valid loss-scale "
                                  f"state: {e}") from None
    return Checkpoint(folder, framework, body["step"], body["policy"], scale,
                      body.get("meta", {}))


def _upgraded(body: dict, where: str) -> dict:
    """The manifest body at this version's ``FORMAT`` (``UPGRADES``), or ``CheckpointError``."""
    version = body.get("format")
    if type(version) is not int or version < 1:
        raise CheckpointError(f"{where}: format {version!r} is no checkpoint format (this "
                              f"version reads 1 to {FORMAT})")
    if version > FORMAT:
        raise CheckpointError(f"{where}: format {version} was written by a newer "
                              f"amp-adapters (this version reads 1 to {FORMAT}); load it with "
                              f"that version or upgrade amp-adapters")
    while version < FORMAT:
        if version not in UPGRADES:
            raise CheckpointError(f"{where}: no upgrade from format {version} is known")
        body = {**UPGRADES[version](dict(body)), "format": version + 1}
        version += 1
    return body


def _saved_policy(saved: Optional[Mapping[str, Any]], where: str) -> Optional[dict[str, Any]]:
    """The saved policy description with its loss-scale state dict at this version's format,
    so that it compares equal to ``describe_policy`` of the same policy."""
    if not isinstance(saved, Mapping) or not isinstance(saved.get("loss_scale"), Mapping):
        return saved  # type: ignore[return-value]
    try:
        loss_scale = _jsonable(upgrade_state_dict(_unjson(saved["loss_scale"])))
    except (AmpConfigError, KeyError) as e:
        raise CheckpointError(f"{where}: the policy's loss scale in {MANIFEST} is not a valid "
                              f"state dict: {e}") from None
    return {**saved, "loss_scale": loss_scale}


def _short(policy: Optional[Mapping[str, Any]]) -> str:
    if policy is None:
        return "no AMP policy"
    return f"dtype={policy['dtype']} level={policy['level']} emulate={policy['emulate']}"


def check_meta(ckpt: Checkpoint, key: str, expected: Any, what: str) -> None:
    """Raise ``CheckpointError`` if the checkpoint's ``meta[key]`` is not ``expected``."""
    saved = ckpt.meta.get(key)
    if saved != expected:
        raise CheckpointError(f"checkpoint {str(ckpt.folder.parent)!r} does not fit: {what} "
                              f"was {saved!r} when it was saved, is {expected!r} now")


__all__ = ["Checkpoint", "CheckpointError", "describe_policy", "save", "load", "check_meta"]
