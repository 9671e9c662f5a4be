"""Checkpoint files, written atomically on a local or URL store, and the run lock beside them, without
torch: a checkpoint here is bytes, or the zip torch writes made by hand, so that what `checkpoint_step`
reads and refuses is known byte for byte."""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import uuid
import zipfile

import fsspec.core
import pytest
import xarray as xr

from dynamics import store
from dynamics.store import StoreError

pytestmark = pytest.mark.filterwarnings("error")


def checkpoint(pkl: bytes) -> bytes:
    """A torch-style checkpoint zip whose pickle is `pkl`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def calling(module: str, name: str) -> bytes:
    """The pickle of {"step": 7, "x": module.name()}, as a pickled object's __reduce__ makes it."""
    return (b"\x80\x02}(X\x04\x00\x00\x00stepK\x07X\x01\x00\x00\x00x"
            + b"c" + module.encode() + b"\n" + name.encode() + b"\n)Ru.")


def test_checkpoint_step_is_the_integer_step_of_plain_weights(tmp_path):
    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_checkpoint(path, "r1", checkpoint(pickle.dumps({"step": 7}, protocol=2)))
    assert store.checkpoint_step(path, "r1") == 7
    # torch's own rebuilders are stubs: plain weights still read
    store.write_checkpoint(path, "r1", checkpoint(calling("torch._utils", "_rebuild_tensor_v2")))
    assert store.checkpoint_step(path, "r1") == 7
    store.write_checkpoint(path, "r1", checkpoint(pickle.dumps({"step": True}, protocol=2)))
    assert store.checkpoint_step(path, "r1") is None


@pytest.mark.parametrize("module, name", [("os", "getpid"), ("torchvision.ops", "nms")])
def test_checkpoint_step_refuses_a_pickle_that_calls_anything_but_torch(tmp_path, module, name):
    # "more than plain weights": no step is read from it, and nothing it names is called
    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.write_checkpoint(path, "r1", checkpoint(calling(module, name)))
    assert store.checkpoint_step(path, "r1") is None


def test_a_checkpoint_that_is_a_folder_is_no_checkpoint_and_is_named_as_damaged(tmp_path):
    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.checkpoint_path(path, "r1").mkdir()
    assert not store.has_checkpoint(path, "r1")
    with pytest.raises(StoreError, match=r"^run r1's checkpoint in .* is damaged \(a folder, not a file\)"):
        store.read_checkpoint(path, "r1")


def test_a_run_past_step_0_without_its_checkpoint_is_refused(tmp_path):
    path = tmp_path / "s.zarr"
    store.init_store(path)
    for attrs in ({}, {"checkpoint_step": None}, {"checkpoint_step": 0}):
        store.check_checkpoint_kept(path, "r1", attrs)  # nothing trained yet: nothing to lose
    with pytest.raises(StoreError, match=r"^run r1 in .* recorded training up to step 10, but its checkpoint"):
        store.check_checkpoint_kept(path, "r1", {"checkpoint_step": 10})
    # a caller that has just read the checkpoint says so, and that answer is the one taken
    store.check_checkpoint_kept(path, "r1", {"checkpoint_step": 10}, present=True)
    store.write_checkpoint(path, "r1", b"weights")
    store.check_checkpoint_kept(path, "r1", {"checkpoint_step": 10})
    with pytest.raises(StoreError, match="recorded training up to step 10"):
        store.check_checkpoint_kept(path, "r1", {"checkpoint_step": 10}, present=False)


def test_a_checkpoint_without_its_run_group_is_refused_and_listed(tmp_path):
    # The group deleted (or left out of a copy), the checkpoint left: `run` trained the run again
    # from step 0 and wrote over that checkpoint, and `status` showed nothing.
    path = tmp_path / "s.zarr"
    store.init_store(path)
    store.check_checkpoint_kept(path, "r1", {})  # no group, no checkpoint: a new run
    assert store.checkpoints_without_runs(path, set()) == []
    store.write_checkpoint(path, "r1", b"weights")
    (path / "checkpoints" / "r2").mkdir()  # a lock's folder, no checkpoint: nothing recorded there
    (path / "checkpoints" / "r2" / "train.lock").write_text("")
    (path / "checkpoints" / ".tmp").mkdir()  # no run id
    with pytest.raises(StoreError, match=r"^run r1 in .* has a checkpoint \(checkpoints/r1/ckpt.pt\) but no run group "
                                         r"\(runs/r1 is gone, and what it recorded with it\); refusing to train it again"):
        store.check_checkpoint_kept(path, "r1", {})
    store.check_checkpoint_kept(path, "r2", {})
    assert store.checkpoints_without_runs(path, set()) == ["r1"]
    assert store.checkpoints_without_runs(path, {"r1"}) == []
    assert store.checkpoints_without_runs(f"file://{path}", set()) == ["r1"]
    remote = f"memory://{tmp_path.name}/s.zarr"  # an fsspec store: listed through its filesystem
    store.init_store(remote)
    assert store.checkpoints_without_runs(remote, set()) == []
    store.write_checkpoint(remote, "r1", b"weights")
    assert store.checkpoints_without_runs(remote, set()) == ["r1"]
    with pytest.raises(StoreError, match=r"^run r1 in memory://.* has a checkpoint"):
        store.check_checkpoint_kept(remote, "r1", {})


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "ckpt.pt"
    store.atomic_write_bytes(target, b"first")
    with pytest.raises(TypeError):
        store.atomic_write_bytes(target, "not bytes")
    assert target.read_bytes() == b"first" and os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_the_run_lock_names_its_holder_over_a_longer_earlier_one_and_keeps_others_files(tmp_path):
    path = tmp_path / "s.zarr"
    folder = path / "checkpoints" / "r1"
    folder.mkdir(parents=True)
    (folder / "train.lock").write_text(json.dumps({"pid": 1, "host": "h" * 300, "started": "earlier"}))
    (folder / ".ckpt.pt.keep").write_text("a user's copy, not a temporary")
    with store.run_lock(path, "r1"):
        held = json.loads((folder / "train.lock").read_text())
        assert held["pid"] == os.getpid() and set(held) == {"pid", "host", "started"}
    assert (folder / ".ckpt.pt.keep").exists()


@pytest.mark.parametrize("where", ["local", "memory"])
def test_checkpoint_read_write_on_any_store(tmp_path, where):
    path = str(tmp_path / "s.zarr") if where == "local" else f"memory://dynamics-test-{uuid.uuid4().hex}/s.zarr"
    store.init_store(path)
    assert store.read_checkpoint(path, "r1") is None and not store.has_checkpoint(path, "r1")
    store.write_checkpoint(path, "r1", b"first")
    store.write_checkpoint(path, "r1", b"second")
    assert store.read_checkpoint(path, "r1") == b"second" and store.has_checkpoint(path, "r1")
    assert store.read_checkpoint(path, "r2") is None
    fs, root = fsspec.core.url_to_fs(path)
    assert fs.ls(f"{root}/checkpoints/r1", detail=False) == [f"{root}/checkpoints/r1/ckpt.pt"]  # no temp left
    with pytest.raises(StoreError, match="invalid run id"):
        store.write_checkpoint(path, "../escape", b"x")
    with pytest.raises(StoreError, match="invalid run id"):  # "$" matched before a final newline
        store.check_run_id("r1\n")


def test_checkpoint_path_and_atomic_write(tmp_path):
    path = tmp_path / "s.zarr"
    store.init_store(path)
    target = store.checkpoint_path(path, "r1")
    assert target == path / "checkpoints" / "r1" / "ckpt.pt" and target.parent.is_dir()
    store.atomic_write_bytes(target, b"first")
    store.atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == ["ckpt.pt"]  # no temp files left
    xr.open_zarr(path)  # a checkpoints folder does not upset plain xarray
    assert store.list_runs(path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_the_run_lock_clears_a_temporary_checkpoint_a_killed_trainer_left(tmp_path):
    path = tmp_path / "s.zarr"
    store.write_checkpoint(path, "r1", b"step 10")
    folder = path / "checkpoints" / "r1"
    (folder / ".ckpt.pt.k1ll3d.tmp").write_bytes(b"half of step 20")  # SIGKILL inside atomic_write_bytes
    (folder / "notes.txt").write_text("mine")
    with store.run_lock(path, "r1"):
        assert sorted(p.name for p in folder.iterdir()) == ["ckpt.pt", "notes.txt", "train.lock"]
    assert store.read_checkpoint(path, "r1") == b"step 10"


def test_a_gone_checkpoint_of_step_1_is_refused(tmp_path):
    # every snapshot is checkpointed, step 1's too: without it the run would retrain from step 0 unsaid
    with pytest.raises(StoreError, match="recorded training up to step 1"):
        store.check_checkpoint_kept(str(tmp_path), "r1", {"checkpoint_step": 1}, present=False)


def test_a_stray_file_where_the_runs_checkpoint_folder_goes_is_no_checkpoint(tmp_path):
    # checkpoints.read_checkpoint: a file named checkpoints/<run_id> (no folder) means the run has
    # no checkpoint (None), as has_checkpoint says; catching FileNotFoundError alone let
    # NotADirectoryError out as a traceback (mutant C12)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "r1").write_bytes(b"stray")
    assert store.has_checkpoint(tmp_path, "r1") is False
    assert store.read_checkpoint(tmp_path, "r1") is None


def test_a_held_run_lock_reads_as_held(tmp_path):
    # checkpoints.run_lock_held: the probe's shared flock is refused while a trainer holds the
    # exclusive one (flock conflicts between open files even within one process). Read as free
    # (mutant C23), every live run read "stopped" in `dynamics status` and the report.
    path = tmp_path / "s.zarr"
    path.mkdir()
    assert store.run_lock_held(path, "r1") is False  # no lock file yet
    with store.run_lock(path, "r1"):
        assert store.run_lock_held(path, "r1") is True
    assert store.run_lock_held(path, "r1") is False


def test_a_stray_checkpoint_folder_that_names_no_run_is_not_a_run_without_its_group(tmp_path):
    # checkpoints_without_runs: only folder names that are valid run ids are runs whose group went;
    # a stray ".trash" (starts with a symbol) was listed as one (mutant C20)
    for name in (".trash", "r1"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "ckpt.pt").write_bytes(b"x")
    assert store.checkpoints_without_runs(tmp_path, set()) == ["r1"]
