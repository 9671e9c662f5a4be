"""The root group index that plain ``xr.open_zarr(store, group=...)`` reads: kept up to date (by concurrent
writers too), mended, and left alone on a URL store while its one owner is to rebuild it."""

from __future__ import annotations

import json
import shutil
import threading
import uuid

import fsspec.core
import numpy as np
import pytest
import xarray as xr

from dynamics import store
from tests.test_store import spec, write_run

pytestmark = pytest.mark.filterwarnings("error")


def index(path) -> dict:
    fs, root = fsspec.core.url_to_fs(str(path))
    return json.loads(fs.cat_file(f"{root}/zarr.json"))["consolidated_metadata"]["metadata"]


def edit_root(path, change) -> None:
    meta = path / "zarr.json"
    root = json.loads(meta.read_text())
    change(root)
    meta.write_text(json.dumps(root))


def test_a_url_stores_index_is_left_alone_while_deferred_and_kept_after(tmp_path):
    # Sweep workers on a URL store have no lock to share: inside deferred_index they leave the root
    # to the launcher. The same store named with a trailing "/" is the same store.
    url = f"memory://dynamics-test-{uuid.uuid4().hex}/s.zarr"
    store.init_store(url)
    with store.deferred_index(url + "/"):
        write_run(url, "r1")
        store.update_run_attrs(url, "r1", status="failed")
        store.refresh_index(url, ["r1"])
        assert "runs/r1" not in index(url)
    store.update_run_attrs(url, "r1", status="completed")
    assert index(url)["runs/r1"]["attributes"]["status"] == "completed"


def test_refresh_index_mends_a_stale_entry_and_drops_that_of_a_run_moved_out(tmp_path):
    # A kill between a run's last attributes and its entry left "running" for plain xarray; a run
    # moved out of the store (as a damaged run's message says to) left an entry with no group.
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    write_run(path, "r2", seed=1)
    edit_root(path, lambda root: root["consolidated_metadata"]["metadata"]["runs/r1"]["attributes"].update(
        status="running"))
    shutil.move(path / "runs" / "r2", tmp_path / "r2")
    store.refresh_index(path, ["r1", "r2"])
    assert index(path)["runs/r1"]["attributes"]["status"] == "completed" and "runs/r2" not in index(path)
    assert xr.open_zarr(path, group="runs/r1").attrs["status"] == "completed"


def test_init_store_gives_back_an_index_the_root_lost(tmp_path):
    # without one, every plain open_zarr of a run warned and fell back to listing the store
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    edit_root(path, lambda root: root.pop("consolidated_metadata"))
    store.init_store(path)
    assert index(path)["runs/r1"]["attributes"] == {"status": "completed", "empty_chunks_written": True}
    assert xr.open_zarr(path, group="runs/r1").attrs["status"] == "completed"


def test_a_new_run_is_indexed_when_created_and_finalize_mends_its_entry(tmp_path):
    # plain xarray opens a run being recorded, before any attribute of it changes
    path = tmp_path / "s.zarr"
    variables, coords = spec()

    def lose_entry(root):
        root["consolidated_metadata"]["metadata"].pop("runs/r1")

    with store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running"}) as w:
        assert xr.open_zarr(path, group="runs/r1").attrs["status"] == "running"
        w.write_region("loss", 0, np.ones(10, np.float32))
        edit_root(path, lose_entry)  # as a crash between a group's change and its entry leaves it
    assert index(path)["runs/r1"]["attributes"]["status"] == "running"
    edit_root(path, lose_entry)
    w.finalize()
    assert xr.open_zarr(path, group="runs/r1").loss.values.sum() == 10


def test_root_index_survives_sweep_index_and_concurrent_writers(tmp_path):
    path = tmp_path / "s.zarr"
    store.init_store(path)
    variables, coords = spec()

    def worker(i: int) -> None:
        w = store.RunWriter(path, f"t{i}", variables=variables, coords=coords, attrs={"status": "running"})
        for k in range(5):
            w.set_attrs(progress=k)
        w.set_attrs(status="completed")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {f"t{i}": {"train.seed": i} for i in range(4)}})
    for t in threads:
        t.join()
    assert store.read_sweep_index(path)["runs"]["t3"] == {"train.seed": 3}
    for i in range(4):
        ds = xr.open_zarr(path, group=f"runs/t{i}")  # through the root index
        assert ds.attrs == {"status": "completed", "progress": 4, "empty_chunks_written": True}

    root = json.loads((path / "zarr.json").read_text())
    del root["consolidated_metadata"]["metadata"]["runs/t0"]
    (path / "zarr.json").write_text(json.dumps(root))
    with pytest.raises(KeyError):
        xr.open_zarr(path, group="runs/t0")
    store.reindex(path)
    assert xr.open_zarr(path, group="runs/t0").attrs["status"] == "completed"
    assert store.read_sweep_index(path)["axes"] == ["train.seed"]


@pytest.mark.parametrize("damage", [
    lambda cm: cm.update(metadata=[]), lambda cm: cm.update(metadata="x"), lambda cm: cm.update(metadata=None),
    lambda cm: cm["metadata"].update({"runs/r1": 7}), lambda cm: cm.clear()])
def test_an_index_that_is_not_one_is_rebuilt_by_the_next_write(tmp_path, damage):
    # a hand-edited index (a list, a string, null, an entry no dict) failed every later write of the
    # store with a TypeError, after `run` had made its run group; it is rebuilt from the groups instead
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    edit_root(path, lambda root: damage(root["consolidated_metadata"]))
    write_run(path, "r2", seed=1)
    assert set(index(path)) == {"runs", "analysis", "derived", "runs/r1", "runs/r2"}
    edit_root(path, lambda root: damage(root["consolidated_metadata"]))
    store.init_store(path)
    store.refresh_index(path, ["r1"])
    assert index(path)["runs/r1"]["attributes"] == {"status": "completed", "empty_chunks_written": True}
    assert xr.open_zarr(path, group="runs/r2").attrs["status"] == "completed"
