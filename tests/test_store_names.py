"""What the store takes for a path, a run id, a run group and its attributes, and what it refuses."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest
import zarr

from dynamics import store
from dynamics.store import StoreError
from tests.test_store import write_run

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
