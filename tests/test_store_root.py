"""The root group: init_store, run attributes (updated under the store lock), and the root's metadata,
store version and sweep index: what is foreign or damaged is named and left alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.store import StoreError
from tests.test_store import write_run

pytestmark = pytest.mark.filterwarnings("error")


def test_init_store_refuses_foreign_paths_and_leaves_them_alone(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.csv").write_text("1,2")
    for target in (file, folder):
        with pytest.raises(StoreError, match=str(target)):
            store.init_store(target)
        assert not store.is_store(target)
    assert file.read_text() == "keep me"
    assert sorted(p.name for p in folder.iterdir()) == ["a.csv"]

    empty = tmp_path / "empty"
    empty.mkdir()
    store.init_store(empty)
    store.init_store(empty)  # idempotent
    assert store.is_store(empty) and store.list_runs(empty) == []
    assert not store.is_store(tmp_path / "missing")


@pytest.mark.parametrize("attrs, problem", [
    ([], "attributes = [], not a table"),
    ({"status": "completed", "steps_done": "x"}, "steps_done = 'x', not an integer"),
    ({"status": "interrupted", "checkpoint_step": None}, "checkpoint_step = None, not an integer"),
    ({"status": "stopped"}, "status = 'stopped', not one a run writes (running, completed, diverged, failed, "
                            "interrupted)"),  # shown by `dynamics status`, never written: read as unfinished
    ({"status": "completed", "last_loss": "x"}, "last_loss = 'x', not a number"),
    ({"status": ["x"]}, "status = ['x'], not a string"),
    ({"status": "completed", "steps_done": True}, "steps_done = True, not an integer"),
    ({"status": "completed", "steps_total": -5}, "steps_total = -5, not a step count a run writes (>= 1)"),
    ({"status": "completed", "steps_total": 0}, "steps_total = 0, not a step count a run writes (>= 1)"),
    ({"status": "interrupted", "checkpoint_step": -1}, "checkpoint_step = -1, not a step count a run writes (>= 0)"),
    ({"status": "completed", "steps_done": -20}, "steps_done = -20, not a step count a run writes (>= 0)"),
])
def test_a_run_whose_attributes_are_of_the_wrong_types_is_named_damaged(tmp_path, attrs, problem):
    # zarr.json readable, but its bookkeeping hand-edited or corrupted: `dynamics status` (and
    # `run`, `gates`, ...) failed with a traceback (int('x'), format(None), list.get)
    from dynamics.status import status_table

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    write_run(path, "r2", seed=1)
    meta = path / "runs" / "r1" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"] = attrs
    meta.write_text(json.dumps(doc))
    before = meta.read_bytes()
    with pytest.raises(StoreError) as e:
        store.run_attrs(path, "r1")
    assert str(e.value) == (f"{path}: run group runs/r1 has damaged attributes in runs/r1/zarr.json ({problem}); "
                            f"restore that file from a backup, or move runs/r1 and checkpoints/r1 out of the store "
                            f"to go on without that run")
    _, rows, damaged = status_table(str(path))
    assert list(damaged) == ["r1"] and [row[0] for row in rows if "damaged" in row] == ["r1"]
    assert meta.read_bytes() == before


def test_the_root_index_is_zarrs_own_json_and_keeps_out_a_group_zarr_cannot_read(tmp_path):
    # The root was validated and serialised whole through zarr at every index update (0.67 s a
    # write with 500 runs in the store, at every checkpoint of every run); now each entry is
    # validated as it goes in and the root written by json's C encoder. Known answer: zarr's own
    # round trip of it, and zarr reading the runs through it.
    import zarr
    from zarr.buffer import default_buffer_prototype

    from dynamics.store._zarr_private import GroupMetadata

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    write_run(path, "r2", seed=1)
    store.update_run_attrs(path, "r1", last_loss=float("nan"), note="x")
    text = (path / "zarr.json").read_text()
    root = json.loads(text)
    assert {"runs/r1", "runs/r2"} <= set(root["consolidated_metadata"]["metadata"])
    zarrs = GroupMetadata.from_dict(json.loads(text)).to_buffer_dict(default_buffer_prototype())["zarr.json"]
    # compared as text: NaN is not equal to itself
    assert json.dumps(json.loads(zarrs.to_bytes()), sort_keys=True) == json.dumps(root, sort_keys=True)
    group = zarr.open_group(str(path), mode="r", use_consolidated=True)
    assert group["runs/r1"].attrs["note"] == "x" and np.isnan(group["runs/r1"].attrs["last_loss"])

    # a run group whose zarr.json zarr cannot read: refused before the root is written, as before
    meta = path / "runs" / "r2" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["zarr_format"] = "3"
    meta.write_text(json.dumps(doc))
    before = (path / "zarr.json").read_bytes()
    with pytest.raises(ValueError, match="Invalid zarr_format"):
        store.reindex(path)
    assert (path / "zarr.json").read_bytes() == before


def test_a_store_whose_root_metadata_is_unreadable_is_named_as_damaged_and_left_alone(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    root = path / "zarr.json"
    damaged = root.read_bytes()[:40]
    root.write_bytes(damaged)
    for call in (lambda: store.check_store(path), lambda: store.list_runs(path), lambda: store.open_run(path),
                 lambda: store.init_store(path)):
        with pytest.raises(StoreError, match="root metadata zarr.json cannot be read"):
            call()
    assert root.read_bytes() == damaged
    with pytest.raises(StoreError, match="^no store at .*elsewhere: the path does not exist$"):
        store.check_store(tmp_path / "elsewhere")


def test_a_section_whose_metadata_was_cut_short_is_written_again_and_its_runs_left_alone(tmp_path):
    # runs/zarr.json cut short: zarr's require_group in init_store raised a bare JSONDecodeError, so
    # no run could be created (`dynamics run` said the run failed, exit 1).
    path = tmp_path / "s.zarr"
    snaps = write_run(path, "r1")
    for section in ("runs", "analysis"):
        meta = path / section / "zarr.json"
        meta.write_bytes(meta.read_bytes()[:30])
    write_run(path, "r2", seed=1)
    assert store.list_runs(path) == ["r1", "r2"]
    np.testing.assert_array_equal(store.open_run(path, "r1").gate.isel(snapshot=1).values, snaps[1]["gate"])
    for section in ("runs", "analysis"):
        assert json.loads((path / section / "zarr.json").read_text())["node_type"] == "group"
    xr.open_zarr(path, group="runs/r1")


def test_a_store_of_a_newer_version_is_neither_read_nor_written(tmp_path):
    # Its layout may differ: the API refuses it as the CLI does, before reading or writing anything.
    import json

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    root = json.loads((path / "zarr.json").read_text())
    root["attributes"]["dynamics_store"] = store.STORE_VERSION + 1
    (path / "zarr.json").write_text(json.dumps(root))
    for call in (lambda: store.open_run(path, "r1"), lambda: store.list_runs(path),
                 lambda: store.write_derived(path, "x", xr.Dataset({"a": ("i", [1.0])}))):
        with pytest.raises(StoreError, match="is newer than this package supports"):
            call()
    assert not (path / "derived" / "x").exists()
    # not an integer at all: a damaged root, not a newer one ("store version 'abc' is newer")
    for bad in ("abc", 1.0, None, True, 0):
        root["attributes"]["dynamics_store"] = bad
        (path / "zarr.json").write_text(json.dumps(root))
        with pytest.raises(StoreError, match=rf"store version {re.escape(repr(bad))} in its zarr.json is no version "
                                             r"this package writes .*: the root is damaged"):
            store.list_runs(path)


def test_a_root_accepted_once_is_checked_again_when_its_bytes_or_its_runs_folder_change(tmp_path):
    # Every store call checks the root; bytes equal to those last accepted are accepted without
    # being parsed again (7 ms a call with 200 runs indexed). Any other bytes are parsed, and the
    # runs folder, no part of those bytes, is looked at every time.
    import shutil

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    good = (path / "zarr.json").read_bytes()
    assert store.list_runs(path) == ["r1"]
    newer = json.loads(good)
    newer["attributes"]["dynamics_store"] = store.STORE_VERSION + 1
    (path / "zarr.json").write_text(json.dumps(newer))
    with pytest.raises(StoreError, match="is newer than this package supports"):
        store.list_runs(path)
    (path / "zarr.json").write_bytes(good)
    assert store.list_runs(path) == ["r1"]
    shutil.move(path / "runs", tmp_path / "runs-aside")
    (path / "runs").write_text("not a folder")
    with pytest.raises(StoreError, match="runs is not a folder"):
        store.run_attrs(path, "r1")
    assert (path / "zarr.json").read_bytes() == good


def test_run_listed_answers_as_the_listing_with_damaged_runs_included(tmp_path):
    # train_run asked `run_id in list_runs(path, damaged="include")`, which reads every run's
    # group: twice per run a sweep trains. run_listed reads the one run's group, to the same answer.
    path = tmp_path / "s.zarr"
    for r in ("r1", "r2", "r3"):
        write_run(path, r)
    cut = path / "runs" / "r2" / "zarr.json"
    cut.write_bytes(cut.read_bytes()[:30])  # cut short: damaged
    (path / "runs" / "r3" / "zarr.json").unlink()  # gone from beside its arrays: damaged
    (path / "runs" / "r4").mkdir()  # an empty folder: no run
    listed = store.list_runs(path, damaged="include")
    assert listed == ["r1", "r2", "r3"]
    for run_id in ("r1", "r2", "r3", "r4", "r5", "no such/name", ""):
        assert store.run_listed(path, run_id) == (run_id in listed), run_id
    with pytest.raises(StoreError, match="the path does not exist"):  # as list_runs
        store.run_listed(tmp_path / "elsewhere", "r1")


@pytest.mark.parametrize("index, problem", [
    (5, "5, not a table"),
    ({"axes": "x", "runs": {}}, "axes = 'x', not a list of keys"),
    ({"axes": ["train.seed"], "runs": 5}, "runs = 5, not a table of run ids"),
    ({"axes": ["train.seed"], "runs": {"r1": [1, 2]}}, "runs.r1 = [1, 2], not a table of values"),
    # passed as undamaged, it failed `status` with 'NoneType' object has no attribute 'get'
    ({"axes": ["train.seed"], "runs": {"r1": None}}, "runs.r1 = None, not a table of values"),
    ({"axes": ["train.seed"], "runs": {}, "steps": {"r1": "x"}}, "steps.r1 = 'x', not an integer"),
    ({"axes": ["train.seed"], "runs": {}, "steps": {"r1": True}}, "steps.r1 = True, not an integer"),
])
def test_a_damaged_sweep_index_is_named_not_a_traceback(tmp_path, index, problem):
    # The root zarr.json reads, but its sweep index (hand-edited, or cut by another tool) is not
    # what the launcher writes: `dynamics status` and `analyse` failed with a traceback
    # ('int' object has no attribute 'get')
    from dynamics.status import status_table

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    root = path / "zarr.json"
    doc = json.loads(root.read_text())
    doc["attributes"]["sweep"] = index
    root.write_text(json.dumps(doc))
    message = (f"{path}: the sweep index in the store's root zarr.json is damaged ({problem}); restore that file "
               f"from a backup, or delete the \"sweep\" key from its attributes: the runs stay, and `dynamics sweep` "
               f"of each config swept into the store indexes its points again")
    for call in (lambda: store.read_sweep_index(path), lambda: store.check_store(path), lambda: status_table(str(path))):
        with pytest.raises(StoreError) as e:
            call()
        assert str(e.value) == message
    del doc["attributes"]["sweep"]  # the way out the message names
    root.write_text(json.dumps(doc))
    store.check_store(path)
    assert store.read_sweep_index(path) is None and store.list_runs(path) == ["r1"]


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()  # hold the lock until the parent closes our stdin
"""


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_attribute_updates_wait_for_another_process_holding_the_store_lock(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"locked\n"
        updater = threading.Thread(target=store.update_run_attrs, args=(path, "r1"), kwargs={"status": "failed"})
        updater.start()
        updater.join(0.5)
        # blocked while the other process holds the lock (this check cannot fail spuriously)
        assert updater.is_alive() and store.run_attrs(path, "r1")["status"] == "completed"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
        holder.stdout.close()
    updater.join(timeout=60)
    assert not updater.is_alive()
    assert xr.open_zarr(path, group="runs/r1").attrs["status"] == "failed"
