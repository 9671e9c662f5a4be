"""open_sweep's coordinates and attributes, the sweep index it reads, and analysis and derived
groups written whole: what each holds, and what a write refuses."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.store import StoreError
from tests.test_store import write_run

pytestmark = pytest.mark.filterwarnings("error")


def test_open_sweep_gives_each_axis_its_own_coordinate_of_the_values_swept(tmp_path):
    path = tmp_path / "s.zarr"
    for run_id in "abc":
        write_run(path, run_id, seed=ord(run_id))
    index = {"axes": ["model.init_scale", "task.components", "train.seed", "data.seed", "model.attn_only"],
             "runs": {"a": {"model.init_scale": 0.5, "task.components": ["induction", "markov"], "train.seed": 1,
                            "data.seed": 2, "model.attn_only": True},
                      "b": {"model.init_scale": 2.0, "task.components": ["markov"], "train.seed": 2,
                            "data.seed": 2, "model.attn_only": False},
                      "c": {"model.init_scale": 1.0, "task.components": ["induction"], "train.seed": 3,
                            "data.seed": 4}}}  # no attn_only in the index or in its config
    store.write_sweep_index(path, index)
    sw = store.open_sweep(path)
    assert sw.init_scale.dtype == np.float64 and list(sw.init_scale.values) == [0.5, 2.0, 1.0]
    assert list(sw.components.values) == ["induction,markov", "markov", "induction"]  # one label, for groupby
    # two axes end in "seed": neither takes the short name, which would hide the other
    assert "seed" not in sw.coords and list(sw.train_seed.values) == [1, 2, 3]
    assert list(sw.data_seed.values) == [2, 2, 4]
    assert sw.attn_only.values.tolist() == [True, False, None]  # a missing flag is not NaN, nor True 1.0
    assert sw.attrs["sweep"] == index and set(sw.attrs["runs"]) == {"a", "b", "c"}


@pytest.mark.parametrize("index, message", [
    ([("axes", [])], "sweep index: expected a dict"),
    ({"axes": ["lr"], "runs": {}}, "sweep index: 'axes' must be a list of dotted keys like 'train.lr'"),
    ({"axes": ["train.lr"], "runs": {"r1": 0.1}}, r"sweep index: 'runs' must map run ids to \{axis: value\} dicts"),
])
def test_a_sweep_index_not_of_the_launchers_shape_is_refused_and_not_written(tmp_path, index, message):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    with pytest.raises(StoreError, match=f"^{message}$"):
        store.write_sweep_index(path, index)
    assert store.read_sweep_index(path) is None


def test_an_analysis_keeps_the_values_and_attributes_it_is_given(tmp_path):
    # Built from a run's variable, a new variable kept the run's encoding (float32 on disk): its
    # float64 values came back rounded. Numpy values inside an attribute failed in xarray.
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    gate = store.open_run(path, "r1").gate
    thirds = gate.copy(data=gate.values.astype(np.float64) / 3)
    store.write_analysis(path, "r1", xr.Dataset({"third": thirds}, attrs={"fit": {"k": np.int64(3)}}))
    got = store.open_analysis(path, "r1").load()
    assert got.third.dtype == np.float64 and np.array_equal(got.third.values, thirds.values)
    assert got.attrs == {"fit": {"k": 3}}


def test_a_write_of_what_is_no_group_of_the_store_is_refused(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    before = sorted(os.listdir(path / "runs" / "r1"))
    with pytest.raises(StoreError, match=r"^invalid derived name '\.\./runs'"):
        store.write_derived(path, "../runs", xr.Dataset({"x": ("i", [1.0])}))
    with pytest.raises(StoreError, match="^analysis/r1: expected an xarray.Dataset, got DataArray$"):
        store.write_analysis(path, "r1", store.open_run(path, "r1").gate)
    assert sorted(os.listdir(path / "runs" / "r1")) == before and store.open_analysis(path, "r1") is None


def test_a_url_stores_group_is_replaced_whole_and_a_failed_write_leaves_none(tmp_path, monkeypatch):
    # No rename there: the old group is deleted, then the new one written, its zarr.json last.
    from zarr.storage import FsspecStore

    url = f"memory://dynamics-test-{uuid.uuid4().hex}/s.zarr"
    write_run(url, "r1")
    store.write_analysis(url, "r1", xr.Dataset({"old": ("head", [1.0])}))
    store.write_analysis(url, "r1", xr.Dataset({"new": ("head", [2.0])}))
    assert list(store.open_analysis(url, "r1").data_vars) == ["new"]

    real_set = FsspecStore.set

    async def full(self, key, value):
        if key.endswith("/c/0"):
            raise OSError(28, "No space left on device")
        await real_set(self, key, value)

    monkeypatch.setattr(FsspecStore, "set", full)
    with pytest.raises(OSError, match="No space"):
        store.write_analysis(url, "r1", xr.Dataset({"third": ("head", [3.0])}))
    monkeypatch.undo()
    assert store.open_analysis(url, "r1") is None  # not a group whose arrays read as NaN


def test_a_group_moved_aside_by_a_killed_swap_whose_new_group_landed_is_cleared(tmp_path):
    # SIGKILL after both renames, before the old group was removed: the new group is in place, and
    # the old one is stale (put back, it would replace the newer result, or fail every write)
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    store.write_analysis(path, "r1", xr.Dataset({"score": ("head", [1.0])}))
    staging = path / ".staging"
    staging.mkdir()
    old = staging / "analysis.r1.0123456789ab.old"
    (old / "score").mkdir(parents=True)
    (old / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    store.write_derived(path, "curves", xr.Dataset({"auc": ("fold", [0.7])}))
    assert not staging.exists()
    assert list(store.open_analysis(path, "r1").score.values) == [1.0]
