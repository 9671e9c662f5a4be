"""What the store takes for a path, a run id, a run group and its attributes, and what it refuses:
damaged metadata or sections named and left alone, zarr's temporaries a killed writer left cleared."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from dynamics import store
from dynamics.store import StoreError
from tests.test_store import spec, write_run

pytestmark = pytest.mark.filterwarnings("error")


def test_a_file_url_names_the_folder_it_encodes(tmp_path):
    # a space is %20 in a file:// URL: undecoded, the store went to a folder literally named "a%20b"
    folder = tmp_path / "a b"
    write_run(folder.as_uri() + "/s.zarr", "r1")
    assert store.list_runs(folder / "s.zarr") == ["r1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b"]


def test_run_ids_up_to_the_longest_a_folder_name_allows(tmp_path):
    # derived/gates.<run id> must fit in 255 bytes: a new run id is 128 at most; an old run's up to 255 reads
    assert store.check_run_id("a" * 128) == "a" * 128
    with pytest.raises(StoreError, match=r"^invalid run id a{20}\.\.\.: 129 bytes long, at most 128 for a new run"):
        store.check_run_id("a" * 129)
    assert store.check_run_id("a" * 255, new=False) == "a" * 255
    with pytest.raises(StoreError, match=r"^invalid run id a{20}\.\.\.: 256 bytes long, at most 255$"):
        store.check_run_id("a" * 256, new=False)
    with pytest.raises(StoreError, match=r"^invalid run id 'zarr.json': reserved by zarr$"):
        store.check_run_id("zarr.json")


def test_zarrs_temporaries_are_told_by_their_whole_name():
    # zarr's is <name>.<32 hex digits>.partial: any other file ending .partial is someone else's
    assert store.is_partial(f"zarr.json.{'0a' * 16}.partial")
    assert not store.is_partial("notes.ab.partial")
    assert not store.is_partial(f"zarr.json.{'0' * 31}.partial")


def test_a_foreign_zarr_store_is_not_a_dynamics_store_and_is_left_alone(tmp_path):
    path = tmp_path / "other.zarr"
    zarr.create_group(str(path), zarr_format=3, attributes={"owner": "someone"})
    before = (path / "zarr.json").read_bytes()
    assert not store.is_store(path)
    with pytest.raises(StoreError, match="exists, is not empty and is not a dynamics store"):
        store.init_store(path)
    assert (path / "zarr.json").read_bytes() == before and [p.name for p in path.iterdir()] == ["zarr.json"]


def test_a_folder_of_other_files_keeps_a_file_named_like_zarrs_temporaries(tmp_path):
    # only a folder holding nothing but zarr's temporaries is a store creation killed half way
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.csv").write_text("1,2")
    (folder / f"zarr.json.{uuid.uuid4().hex}.partial").write_text("{}")
    with pytest.raises(StoreError, match="exists, is not empty and is not a dynamics store"):
        store.init_store(folder)
    assert len(list(folder.iterdir())) == 2


def test_a_section_that_is_a_link_to_nowhere_is_named_as_damaged(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    shutil.rmtree(path / "analysis")
    (path / "analysis").symlink_to(tmp_path / "gone")
    with pytest.raises(StoreError, match=r"s.zarr: analysis is not a folder \(the store is damaged\)"):
        store.check_folders(path, ("analysis",))


@pytest.mark.parametrize("meta", [b"[1, 2]", b'"group"', None])
def test_run_metadata_that_is_no_json_object_is_named_as_damaged(tmp_path, meta):
    # JSON, but no object (or a folder where the file was): a traceback from every reader
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    target = path / "runs" / "r1" / "zarr.json"
    target.unlink()
    if meta is None:
        target.mkdir()
    else:
        target.write_bytes(meta)
    for call in (lambda: store.list_runs(path), lambda: store.run_attrs(path, "r1"), lambda: store.open_run(path)):
        with pytest.raises(StoreError, match=r"runs/r1 exists but its metadata runs/r1/zarr.json (cannot be read|is "
                                             r"missing)"):
            call()


def test_root_metadata_that_is_no_json_object_is_named_as_damaged(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    (path / "zarr.json").write_text("[]")
    with pytest.raises(StoreError, match="the store's root metadata zarr.json cannot be read"):
        store.check_store(path)


def test_a_folder_in_runs_that_no_run_id_can_name_is_not_listed(tmp_path):
    # a file manager's copy of a run ("r1 copy"): listed, every reader of it refused its id
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    shutil.copytree(path / "runs" / "r1", path / "runs" / "r1 copy")
    assert store.list_runs(path) == ["r1"] and store.open_sweep(path).sizes["run"] == 1


def test_attribute_keys_that_are_not_strings_are_refused_not_turned_into_strings(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    with pytest.raises(StoreError, match=r"^attribute 'by_layer': dict keys must be strings$"):
        store.update_run_attrs(path, "r1", by_layer={0: 1.5})
    assert "by_layer" not in store.run_attrs(path, "r1")
    assert json.loads((path / "runs" / "r1" / "zarr.json").read_text())["attributes"] == store.run_attrs(path, "r1")


def test_is_finished_says_whether_a_run_command_would_skip_the_run(tmp_path):
    path = tmp_path / "s.zarr"
    for run_id, status in (("c", "completed"), ("d", "diverged"), ("r", "running")):
        write_run(path, run_id, attrs={"status": status, "last_loss": None})  # None: no loss logged yet
    assert [store.is_finished(path, r) for r in ("c", "d", "r", "x")] == [True, True, False, False]
    assert not store.is_finished(tmp_path / "nowhere", "c")
    assert store.run_attrs(path, "d")["last_loss"] is None


def test_fsspec_urls(tmp_path):
    url = f"memory://dynamics-test-{uuid.uuid4().hex}/s.zarr"
    snaps = write_run(url, "m1")
    assert store.is_store(url) and store.list_runs(url) == ["m1"]
    np.testing.assert_array_equal(xr.open_zarr(url, group="runs/m1").gate.values[0], snaps[0]["gate"])
    with pytest.raises(StoreError, match="not on a local filesystem"):
        store.checkpoint_path(url, "m1")

    file_url = (tmp_path / "f.zarr").as_uri()
    write_run(file_url, "f1")
    assert store.list_runs(tmp_path / "f.zarr") == ["f1"]
    assert store.checkpoint_path(file_url, "f1") == tmp_path / "f.zarr" / "checkpoints" / "f1" / "ckpt.pt"


def test_a_store_path_of_another_type_is_named():
    with pytest.raises(TypeError, match="a store path must be a str or path-like .* got int 123"):
        store.open_run(123)


def test_a_run_with_unreadable_metadata_is_named_by_readers_and_left_alone_by_writers(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    snaps = write_run(path, "r2", seed=1)
    meta = tmp_path / "s.zarr" / "runs" / "r1" / "zarr.json"
    damaged = meta.read_bytes()[:40]  # cut short: not JSON any more
    meta.write_bytes(damaged)
    variables, coords = spec()
    for call in (
        lambda: store.list_runs(path),
        lambda: store.run_attrs(path, "r1"),
        lambda: store.open_run(path),  # "the only run" may be the damaged one
        lambda: store.open_run(path, "r1"),
        lambda: store.open_sweep(path),
        lambda: store.open_sweep(path, ["r1", "r2"]),
        lambda: store.update_run_attrs(path, "r1", status="failed"),
        lambda: store.write_analysis(path, "r1", xr.Dataset()),
        lambda: store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running"}),
        lambda: store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={}, resume=True),
    ):
        with pytest.raises(StoreError, match=r"runs/r1 exists but its metadata .* cannot be read"):
            call()
    assert meta.read_bytes() == damaged
    assert not (tmp_path / "s.zarr" / "analysis" / "r1").exists()
    # One damaged run no longer hides the others from whoever works run by run: listed ("include")
    # it is named by its own reads; the other run reads, is analysed and is opened in a sweep.
    assert store.list_runs(path, damaged="skip") == ["r2"]
    assert store.list_runs(path, damaged="include") == ["r1", "r2"]
    np.testing.assert_array_equal(store.open_run(path, "r2").gate.isel(snapshot=2).values, snaps[2]["gate"])
    assert store.run_attrs(path, "r2") == {"status": "completed", "empty_chunks_written": True}
    store.write_analysis(path, "r2", xr.Dataset({"score": ("head", [1.0])}))
    assert list(store.open_analysis(path, "r2", stale="allow").score.values) == [1.0]
    assert list(store.open_sweep(path, ["r2"]).run.values) == ["r2"]
    with pytest.raises(StoreError, match=r"no run 'r3' in .*; runs: r1, r2"):
        store.open_run(path, "r3")
    with pytest.raises(StoreError, match="damaged: expected one of raise, skip, include"):
        store.list_runs(path, damaged="ignore")


def test_a_run_whose_metadata_is_gone_from_beside_its_arrays_is_not_created_again(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    (path / "runs" / "r1" / "zarr.json").unlink()
    (path / "runs" / "r2").mkdir()  # no arrays: nothing recorded, so no run (a group being made)
    variables, coords = spec()
    for call in (
        lambda: store.list_runs(path),
        lambda: store.run_attrs(path, "r1"),
        lambda: store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running"}),
    ):
        # moved out without its checkpoint, a new run of that id would start afresh over the checkpoint
        with pytest.raises(StoreError, match=r"runs/r1 exists but its metadata runs/r1/zarr.json is missing; .*"
                                             r"move runs/r1 and checkpoints/r1 out of the store"):
            call()
    assert not (path / "runs" / "r1" / "zarr.json").exists()
    with pytest.raises(StoreError, match="no run 'r2'"):
        store.run_attrs(path, "r2")


def test_an_array_with_unreadable_metadata_is_named_and_a_resume_changes_nothing(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1", attrs={"status": "interrupted"})
    meta = path / "runs" / "r1" / "attention" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    run_meta = (path / "runs" / "r1" / "zarr.json").read_bytes()
    variables, coords = spec()
    for call in (
        lambda: store.open_run(path),
        lambda: store.open_run(path, dask=False),
        lambda: store.open_sweep(path),
        lambda: store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running"},
                                resume=True),
    ):
        with pytest.raises(StoreError, match="runs/r1/attention/zarr.json of runs/r1 cannot be read"):
            call()
    assert (path / "runs" / "r1" / "zarr.json").read_bytes() == run_meta


def test_an_array_whose_metadata_is_gone_is_named_not_left_out(tmp_path):
    # Zarr lists an array without its zarr.json as no array: open_run left it out, check_recorded
    # passed, and `dynamics analyse` exited 0 without the analyses that need it.
    path = tmp_path / "s.zarr"
    write_run(path, "r1", attrs={"status": "completed"})
    meta = path / "runs" / "r1" / "attention" / "zarr.json"
    assert (meta.parent / "c").is_dir()
    meta.unlink()
    for call in (lambda: store.open_run(path), lambda: store.open_run(path, dask=False),
                 lambda: store.open_sweep(path), lambda: store.check_recorded(path, "r1")):
        with pytest.raises(StoreError, match=r"runs/r1/attention/zarr\.json of runs/r1 is missing, though the array's "
                                             r"chunks are there \(damaged\): zarr would not see the array attention"):
            call()


@pytest.mark.parametrize("section, fix", [("runs", "restore it from a backup"),
                                          ("analysis", "move it aside: what it holds is computed from the runs")])
def test_a_section_that_is_a_file_is_named_as_damaged_and_left_alone(tmp_path, section, fix):
    # Listed as a missing folder is, a `runs` file made the store look empty (status listed no run),
    # and `run` failed creating its group with a bare FileExistsError; an `analysis` file failed
    # every run's analysis the same way.
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    shutil.rmtree(path / section)
    (path / section).write_bytes(b"x")
    readers = (lambda: store.check_store(path), lambda: store.list_runs(path))
    writers = (lambda: store.init_store(path), lambda: write_run(path, "r2", seed=1),
               lambda: store.check_folders(path, (section,)),
               # the Python API's writers too (analyse_store, predict.write_curve call these)
               lambda: store.write_analysis(path, "r1", xr.Dataset({"x": ("a", [1.0])})) if section == "analysis"
               else store.write_derived(path, "x", xr.Dataset({"x": ("a", [1.0])})))
    # a reader of the runs reads on where only what is computed from them is damaged
    for call in (*readers, *writers) if section == "runs" else writers:
        with pytest.raises(StoreError, match=f"s.zarr: {section} is not a folder \\(the store is damaged\\); {fix}"):
            call()
    if section != "runs":
        assert store.list_runs(path) == ["r1"]
    assert (path / section).read_bytes() == b"x"


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_zarrs_temporaries_a_killed_writer_left_are_cleared_under_the_locks(tmp_path):
    # zarr writes <name>.<uuid hex>.partial and renames it: a SIGKILL between left it for ever,
    # warned about on every read, and in a new store's folder it made the store "not a store".
    import uuid
    import warnings

    from dynamics.usage import check_out

    def partial(folder):
        f = folder / f"zarr.{uuid.uuid4().hex}.partial"
        f.write_text('{"zarr_format": 3, "node_type": "gr')
        return f

    new = tmp_path / "new.zarr"
    new.mkdir()
    partial(new)
    check_out(str(new))  # no refusal: nothing was made there
    store.init_store(new)
    assert store.is_store(new) and not any(store.is_partial(p.name) for p in new.iterdir())

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    left = [partial(path), partial(path / "runs"), partial(path / "runs" / "r1"), partial(path / "runs" / "r1" / "attention")]
    # and a chunk's, deep under c/: a kill mid-snapshot left up to a chunk of attention each
    deepest = max((Path(d) for d, _, files in os.walk(path / "runs" / "r1" / "attention" / "c") if files),
                  key=lambda d: len(d.parts))
    chunk = deepest / f"0.{uuid.uuid4().hex}.partial"
    chunk.write_bytes(b"half a chunk")
    left.append(chunk)
    # zarr rewrites the root's and the sections' metadata, outside our locks, whenever a run's
    # arrays are created: there only a temporary no write can still own is cleared
    old = time.time() - store.STALE_PARTIAL_S - 60
    for f in left[:2]:
        os.utime(f, (old, old))
    live = partial(path)
    mine = path / "runs" / "r1" / "notes.partial"  # not zarr's name: not ours to delete
    mine.write_text("mine")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        store.open_run(path, "r1")
    assert any("partial" in str(w.message) for w in seen), "the test needs zarr to notice them"
    store.init_store(path)
    with store.run_lock(path, "r1"):
        pass
    assert not any(f.exists() for f in left) and mine.exists() and live.exists()
    mine.unlink()
    live.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.open_run(path, "r1")


def test_store_error_is_named_where_users_import_it_and_pickles_there():
    # a traceback said "dynamics.store._loc.StoreError", a private module; a sweep's task sends
    # it back from its worker by pickle
    import pickle
    import traceback

    import dynamics
    from dynamics import store

    assert dynamics.StoreError is store.StoreError
    e = store.StoreError("a line")
    assert traceback.format_exception_only(type(e), e) == ["dynamics.store.StoreError: a line\n"]
    assert type(pickle.loads(pickle.dumps(e))) is store.StoreError


def test_a_killed_creations_partial_and_another_commands_probe_leave_a_folder_empty(tmp_path):
    from dynamics.schema import MKDIR_PROBE

    d = tmp_path / "new.zarr"
    d.mkdir()
    (d / f"zarr.json.{'0' * 32}.partial").write_text("{")
    (d / f"{MKDIR_PROBE}abc").mkdir()
    store.init_store(str(d))
    assert store.is_store(str(d))
