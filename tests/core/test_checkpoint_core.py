"""The framework-free checkpoint machinery: atomic publish, verified load, clear errors."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_adapters import CheckpointError, DynamicLossScale, Policy
from amp_adapters.services import checkpoint as ckpt

POLICY = Policy.preset("O1")


def _save(path, step, payload=b"weights", scale=None):
    with ckpt.save(path, framework="numpy", step=step, policy=POLICY,
                   loss_scale=scale or DynamicLossScale(scale=8.0), meta={"k": 1}) as folder:
        (folder / "w.bin").write_bytes(payload)
        (folder / "sub").mkdir()
        (folder / "sub" / "x.bin").write_bytes(b"x" * 10)


def _load(path, **kw):
    return ckpt.load(path, framework="numpy", policy=kw.pop("policy", POLICY), **kw)


def _current(path):
    return path / json.loads((path / ckpt.CURRENT).read_text())["folder"]


def test_round_trip_and_only_the_newest_is_kept(tmp_path):
    scale = DynamicLossScale(scale=64.0, good_steps=3, max_scale=float("inf"))
    _save(tmp_path, 3, scale=scale)
    _save(tmp_path, 4, b"newer", scale=scale)
    c = _load(tmp_path)
    assert (c.step, c.meta, c.loss_scale) == (4, {"k": 1}, scale)
    assert c.file("w.bin").read_bytes() == b"newer"
    assert [p.name for p in tmp_path.iterdir()
            if p.name not in (ckpt.CURRENT, ckpt.LOCK)] == [c.folder.name]


def test_an_exception_inside_save_leaves_the_previous_checkpoint(tmp_path):
    _save(tmp_path, 1)
    with pytest.raises(RuntimeError, match="disk full"):
        with ckpt.save(tmp_path, framework="numpy", step=2, policy=POLICY) as folder:
            (folder / "w.bin").write_bytes(b"half")
            raise RuntimeError("disk full")
    assert _load(tmp_path).step == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_killed_save_leaves_the_previous_checkpoint_and_is_cleaned_up(tmp_path):
    _save(tmp_path, 1)
    torn = tmp_path / ".tmp-deadbeef"  # what a save killed before its rename leaves
    torn.mkdir()
    (torn / "w.bin").write_bytes(b"ha")
    assert _load(tmp_path).step == 1
    _save(tmp_path, 2)
    assert not torn.exists()


@pytest.mark.parametrize("damage, needle", [
    (lambda p: (_current(p) / "w.bin").write_bytes(b"weigh"), "w.bin is truncated or torn"),
    (lambda p: (_current(p) / "w.bin").write_bytes(b"WEIGHTS"), "w.bin does not match its SHA"),
    (lambda p: (_current(p) / "sub" / "x.bin").unlink(), "sub/x.bin is missing"),
    (lambda p: (_current(p) / ckpt.MANIFEST).write_text('{"body": {"step": 9'), "corrupt"),
    (lambda p: (_current(p) / ckpt.MANIFEST).unlink(), "has no manifest.json"),
    (lambda p: (_current(p) / ckpt.MANIFEST).write_text(
        (_current(p) / ckpt.MANIFEST).read_text().replace('"step": 1', '"step": 2')),
     "does not match its checksum"),
    (lambda p: (p / ckpt.CURRENT).write_text("garbage"), "CURRENT is corrupt"),
    (lambda p: (p / ckpt.CURRENT).unlink(), "no complete checkpoint yet"),
])
def test_damaged_checkpoint_is_a_clear_error(tmp_path, damage, needle):
    _save(tmp_path, 1)
    damage(tmp_path)
    with pytest.raises(CheckpointError, match=needle):
        _load(tmp_path)


def test_mismatches_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        _load(tmp_path / "nothing")
    _save(tmp_path, 1)
    with pytest.raises(CheckpointError, match="written by the numpy backend"):
        ckpt.load(tmp_path, framework="mxnet", policy=POLICY)
    with pytest.raises(CheckpointError, match="another policy.*dtype.*check_policy=False"):
        _load(tmp_path, policy=Policy.preset("O1-bf16"))
    assert _load(tmp_path, policy=None, check_policy=False).step == 1
    with pytest.raises(CheckpointError, match="optimizer was 'Adam' when it was saved"):
        ckpt.check_meta(ckpt.Checkpoint(tmp_path, "numpy", 1, None, None,
                                        {"optimizer": "Adam"}), "optimizer", "SGD",
                        "the optimizer")


def test_bad_arguments(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        _save(tmp_path / "file", 1)
    for step in (-1, 1.0, True, None):
        with pytest.raises(TypeError, match="step"):
            _save(tmp_path / "c", step)
    assert not (tmp_path / "c").exists()


@settings(derandomize=True, max_examples=150, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_any_flipped_byte_is_refused_or_changes_nothing(tmp_path_factory, data):
    """Flip one byte anywhere (payload, manifest, loss scale, pointer): load refuses it, or
    (a harmless change such as whitespace in the pointer) loads the very same bytes."""
    root = tmp_path_factory.mktemp("c")
    _save(root, 1, payload=bytes(range(256)) * 4)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != ckpt.LOCK)
    saved = {p.relative_to(root): p.read_bytes() for p in files}
    victim = data.draw(st.sampled_from(files))
    raw = bytearray(victim.read_bytes())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    victim.write_bytes(bytes(raw))
    try:
        c = _load(root)
    except CheckpointError:
        return
    for rel, content in saved.items():
        if rel.name != ckpt.CURRENT:
            assert (root / rel).read_bytes() == content
    assert c.step == 1


def test_concurrent_savers_into_one_folder_take_turns(tmp_path):
    """Two savers given the same folder (e.g. every data-parallel rank): every save
    completes, the folder always ends with one loadable checkpoint."""
    import threading
    errors = []

    def saver(offset):
        try:
            for k in range(15):
                _save(tmp_path, offset + k, payload=bytes([k]) * 1000)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=saver, args=(o,)) for o in (0, 100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _load(tmp_path).step in (14, 114)
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("step-")]) == 1


def _rewrite_manifest(path, change):
    folder = _current(path)
    raw = json.loads((folder / ckpt.MANIFEST).read_text())
    body = change(raw["body"])
    (folder / ckpt.MANIFEST).write_text(json.dumps({"body": body,
                                                    "sha256": ckpt._body_digest(body)}))


@pytest.mark.parametrize("version, needle", [
    (2, "format 2 was written by a newer amp-adapters"),
    ("1", "format '1' is no checkpoint format"),
    (0, "format 0 is no checkpoint format"),
])
def test_manifest_formats_newer_or_unknown_are_refused(tmp_path, version, needle):
    _save(tmp_path, 1)
    _rewrite_manifest(tmp_path, lambda b: {**b, "format": version})
    with pytest.raises(CheckpointError, match=needle):
        _load(tmp_path)


def test_manifest_upgrade_steps_run_in_order(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    _rewrite_manifest(tmp_path, lambda b: {**{k: v for k, v in b.items() if k != "meta"},
                                           "format": 0 + 1, "old_meta": b["meta"]})
    monkeypatch.setattr(ckpt, "FORMAT", 2)
    monkeypatch.setitem(ckpt.UPGRADES, 1, lambda b: {**b, "meta": b.pop("old_meta")})
    assert _load(tmp_path).meta == {"k": 1}


def test_a_checkpoint_of_an_older_loss_scale_format_loads(tmp_path, monkeypatch):
    """After a loss-scale format change, the saved loss scale and the saved policy's are
    upgraded (so the policy still compares equal) instead of refused."""
    import importlib
    sd = importlib.import_module("amp_adapters.rules.loss_scale.state_dict")
    _save(tmp_path, 1)
    monkeypatch.setattr(sd, "FORMAT_VERSION", 2)
    with pytest.raises(CheckpointError, match="no upgrade from format 1"):
        _load(tmp_path)
    monkeypatch.setitem(sd.UPGRADES, 1, lambda d: d)
    assert _load(tmp_path).loss_scale == DynamicLossScale(scale=8.0)
