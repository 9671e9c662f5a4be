"""open_run, open_sweep's coordinates and attributes, the sweep index it reads, and analysis and
derived groups written whole: what each holds, and what a read or a write refuses."""

from __future__ import annotations

import os
import sys
import uuid
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.store import StoreError
from tests.test_store import L, write_run

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
    got = store.open_analysis(path, "r1", stale="allow").load()
    assert got.third.dtype == np.float64 and np.array_equal(got.third.values, thirds.values)
    assert got.attrs == {"fit": {"k": 3}}
    # without dask (the cross-seed check reads one snapshot): not dask-backed, the same dataset
    plain = store.open_analysis(path, "r1", dask=False, stale="allow")
    assert not isinstance(plain.third.variable._data, da.Array)
    xr.testing.assert_identical(plain.load(), got)
    # its step coordinate labelled as a run's, whether or not the writer carried the attrs
    stripped = xr.Dataset({"third": thirds}).assign_coords(step=("snapshot", thirds.step.values))
    assert not stripped.step.attrs
    store.write_analysis(path, "r1", stripped)
    assert store.open_analysis(path, "r1", stale="allow").step.attrs == {"long_name": "training step", "units": "steps"}


def test_a_write_of_what_is_no_group_of_the_store_is_refused(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    before = sorted(os.listdir(path / "runs" / "r1"))
    with pytest.raises(StoreError, match=r"^invalid derived name '\.\./runs'"):
        store.write_derived(path, "../runs", xr.Dataset({"x": ("i", [1.0])}))
    with pytest.raises(StoreError, match="^analysis/r1: expected an xarray.Dataset, got DataArray$"):
        store.write_analysis(path, "r1", store.open_run(path, "r1").gate)
    assert sorted(os.listdir(path / "runs" / "r1")) == before and store.open_analysis(path, "r1", stale="allow") is None


def test_a_url_stores_group_is_replaced_whole_and_a_failed_write_leaves_none(tmp_path, monkeypatch):
    # No rename there: the old group is deleted, then the new one written, its zarr.json last.
    from zarr.storage import FsspecStore

    url = f"memory://dynamics-test-{uuid.uuid4().hex}/s.zarr"
    write_run(url, "r1")
    store.write_analysis(url, "r1", xr.Dataset({"old": ("head", [1.0])}))
    store.write_analysis(url, "r1", xr.Dataset({"new": ("head", [2.0])}))
    assert list(store.open_analysis(url, "r1", stale="allow").data_vars) == ["new"]

    real_set = FsspecStore.set

    async def full(self, key, value):
        if key.endswith("/c/0"):
            raise OSError(28, "No space left on device")
        await real_set(self, key, value)

    monkeypatch.setattr(FsspecStore, "set", full)
    with pytest.raises(OSError, match="No space"):
        store.write_analysis(url, "r1", xr.Dataset({"third": ("head", [3.0])}))
    monkeypatch.undo()
    assert store.open_analysis(url, "r1", stale="allow") is None  # not a group whose arrays read as NaN


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
    assert list(store.open_analysis(path, "r1", stale="allow").score.values) == [1.0]


def test_open_run_is_lazy_and_picks_the_only_run(tmp_path):
    path = tmp_path / "s.zarr"
    snaps = write_run(path, "only")
    ds = store.open_run(path)
    assert isinstance(ds.attention.data, da.Array)
    assert ds.attrs["run_id"] == "only" and ds.attrs["status"] == "completed"
    np.testing.assert_array_equal(ds.gate.isel(snapshot=1).values, snaps[1]["gate"])

    write_run(path, "other")
    with pytest.raises(StoreError, match="only, other"):
        store.open_run(path)
    assert store.open_run(str(path), "other").attrs["run_id"] == "other"
    with pytest.raises(StoreError, match="no run 'missing'"):
        store.open_run(path, "missing")
    assert store.list_runs(path) == ["only", "other"]


def test_readers_name_a_wrong_argument_for_what_it_is(tmp_path):
    # A list for a run id read "no run ['only'] in S; runs: only"; run_ids=5 was Python's
    # "'int' object is not iterable"; a mistyped path said "not a dynamics store" where the
    # command line said the path does not exist; a run's own folder read as no store at all.
    path = tmp_path / "s.zarr"
    write_run(path, "only")
    with pytest.raises(TypeError, match=r"^run_id: expected a run id \(a str\), got list \['only'\]$"):
        store.open_run(path, ["only"])
    for bad in (5, ["only", 5]):
        with pytest.raises(TypeError, match="^run_ids: expected a list of run ids"):
            store.open_sweep(path, run_ids=bad)
    assert store.open_sweep(path, run_ids=("only",)).sizes["run"] == 1
    with pytest.raises(StoreError, match=f"^no store at {tmp_path}/s.zar: the path does not exist$"):
        store.open_run(tmp_path / "s.zar")
    with pytest.raises(StoreError) as e:
        store.open_run(path / "runs" / "only" / "attention")
    assert str(e.value) == (f"not a dynamics store: {path}/runs/only/attention is inside the store {path}, in its run "
                            f"only; open_run({str(path)!r}, 'only') opens that run")
    (tmp_path / "notes").mkdir()
    with pytest.raises(StoreError, match=f"^not a dynamics store: {tmp_path}/notes$"):
        store.open_run(tmp_path / "notes")


def grid_store(path):
    index = {"axes": ["model.init_scale", "train.lr"], "runs": {}}
    for i, (scale, lr) in enumerate([(0.5, 1e-3), (0.5, 1e-2), (2.0, 1e-3), (2.0, 1e-2)]):
        run_id = f"g{i}"
        write_run(path, run_id, fill=scale * 10 + lr, seed=i, attrs={"status": "completed" if i else "diverged"})
        index["runs"][run_id] = {"model.init_scale": scale, "train.lr": lr}
    index["runs"]["not_started"] = {"model.init_scale": 1.0, "train.lr": 1e-3}
    store.write_sweep_index(path, index)
    return index


def test_open_sweep_has_swept_coordinates(tmp_path):
    path = tmp_path / "s.zarr"
    index = grid_store(path)
    assert store.read_sweep_index(path) == index
    write_run(path, "a0")  # a run outside the sweep (`dynamics run` into its store): not one of its points
    sw = store.open_sweep(path)
    assert list(sw.run.values) == ["g0", "g1", "g2", "g3"]  # runs not yet in the store are skipped
    assert sw.attrs["runs_not_started"] == ["not_started"]  # and named: the run dim is not the whole grid
    assert list(sw.init_scale.values) == [0.5, 0.5, 2.0, 2.0]
    np.testing.assert_array_equal(sw.model_init_scale.values, sw.init_scale.values)
    assert list(sw.lr.values) == list(sw.train_lr.values) == [1e-3, 1e-2, 1e-3, 1e-2]
    assert list(sw.status.values) == ["diverged", "completed", "completed", "completed"]
    assert isinstance(sw.attention.data, da.Array)

    big = sw.gate.where(sw.init_scale == 2.0).mean(["snapshot", "layer", "head"])
    assert np.isnan(big.values[:2]).all()
    np.testing.assert_allclose(big.values[2:], [20.001, 20.01], rtol=1e-6)
    by_lr = sw.gate.groupby("train_lr").mean(...)
    np.testing.assert_allclose(by_lr.values, [(5.001 + 20.001) / 2, (5.01 + 20.01) / 2], rtol=1e-6)
    assert "step" in sw.coords and sw.step.dims == ("snapshot",)
    assert bool(sw.head_mask.all())


def test_open_sweep_lists_runs_in_the_order_status_and_the_tables_do(tmp_path):
    # It took the index's own order: in a zipped sweep, and where two sweeps share a grid, its rows
    # and `status`'s (the analyse table's, the report's) paired other runs from the third on.
    from dynamics.status import status_table

    path = tmp_path / "s.zarr"
    for run_id in ("z1", "z2", "z3", "z4", "y1", "y2"):
        write_run(path, run_id)
    # recorded in this order: lr 0.01, 0.003, then 0.01 again (zip pairs each lr with a seed)
    runs = {"z1": (0.01, 0), "z2": (0.003, 1), "z3": (0.01, 2), "z4": (0.003, 3)}
    store.write_sweep_index(path, {"axes": ["train.lr", "train.seed"],
                                   "runs": {r: {"train.lr": lr, "train.seed": s} for r, (lr, s) in runs.items()}})
    ids = list(store.open_sweep(path).run.values)
    assert ids == ["z1", "z3", "z2", "z4"] == [row[0] for row in status_table(str(path))[1] if row[0] in runs]
    assert list(store.open_sweep(path).lr.values) == [0.01, 0.01, 0.003, 0.003]
    # a second sweep of the grid from another base config: its runs beside the first's at each point
    twins = {"z1": 0, "z2": 1, "y1": 0, "y2": 1}
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {r: {"train.seed": v} for r, v in twins.items()}})
    assert list(store.open_sweep(path).run.values) == ["z1", "y1", "z2", "y2"]
    assert [row[0] for row in status_table(str(path))[1] if row[0] in twins] == ["z1", "y1", "z2", "y2"]
    # asked for by name, in the order asked
    assert list(store.open_sweep(path, run_ids=["y2", "z1"]).run.values) == ["y2", "z1"]


def test_open_sweep_says_stopped_for_a_killed_run_as_status_does(tmp_path):
    # A run killed mid-training (SIGKILL) is still marked "running" in its attributes.
    path = tmp_path / "s.zarr"
    grid_store(path)
    store.update_run_attrs(path, "g1", status="running")  # killed: nobody holds its run lock
    store.update_run_attrs(path, "g2", status="running")
    with store.run_lock(path, "g2"):  # still being trained
        sw = store.open_sweep(path)
    assert list(sw.status.values) == ["diverged", "stopped", "running", "completed"]
    # each run's attributes say so too, as open_run's do (they kept the raw "running", which
    # analyse_run then quoted for a killed run); the record itself is left alone
    assert [sw.attrs["runs"][r]["status"] for r in sw.run.values] == list(sw.status.values)
    assert store.run_attrs(path, "g1")["status"] == "running"

    sub = store.open_sweep(path, ["g3", "g1"])
    assert list(sub.run.values) == ["g3", "g1"] and list(sub.lr.values) == [1e-2, 1e-2]
    with pytest.raises(StoreError, match="not_started"):
        store.open_sweep(path, ["not_started"])


def test_open_sweep_refuses_a_run_given_twice_or_a_bare_string(tmp_path):
    # Twice on the run dim, a run would count twice in every mean over runs; a bare string was
    # iterated into its characters and refused as runs 'g', '1'.
    path = tmp_path / "s.zarr"
    grid_store(path)
    with pytest.raises(StoreError, match="'g1' given more than once"):
        store.open_sweep(path, ["g1", "g3", "g1"])
    with pytest.raises(StoreError, match="expected a list of run ids, got the string 'g1'"):
        store.open_sweep(path, "g1")


def test_open_sweep_reads_a_nested_axis_missing_from_the_index_from_the_run_config(tmp_path):
    # Two sweeps into one store merge their axes; a run of the second has no value for the
    # first's axis in the index, so it comes from the run's own config, however deep the key.
    path = tmp_path / "s.zarr"
    for run_id, lr, weight in (("a", 1e-3, 0.0), ("b", 1e-2, 1.0)):
        config = {"train": {"lr": lr}, "intervene": {"templates": {"weight": weight}}}
        write_run(path, run_id, attrs={"status": "completed", "config": config})
    store.write_sweep_index(path, {"axes": ["intervene.templates.weight", "train.lr"],
                                   "runs": {"a": {"intervene.templates.weight": 0.0}, "b": {"train.lr": 1e-2}}})
    sw = store.open_sweep(path)
    assert list(sw.intervene_templates_weight.values) == [0.0, 1.0]  # not `weight`: that is a dim
    assert list(sw.train_lr.values) == [1e-3, 1e-2]


def test_open_sweep_pads_heads_and_snapshots(tmp_path):
    path = tmp_path / "s.zarr"
    small = write_run(path, "h4", n_heads=4, n_snap=3, seed=1)
    write_run(path, "h8", n_heads=8, n_snap=5, seed=2)
    sw = store.open_sweep(path)  # no sweep index: every run, no swept coords
    assert "init_scale" not in sw.coords and sw.sizes["head"] == 8 and sw.sizes["snapshot"] == 5
    assert sw.head_mask.dims == ("run", "layer", "head")
    mask = sw.head_mask.sel(run="h4").values
    assert mask[:, :4].all() and not mask[:, 4:].any() and bool(sw.head_mask.sel(run="h8").all())
    gate = sw.gate.sel(run="h4").values
    np.testing.assert_array_equal(gate[:3, :, :4], np.stack([s["gate"] for s in small]))
    assert np.isnan(gate[:, :, 4:]).all() and np.isnan(gate[3:]).all()
    assert sw.step.dims == ("run", "snapshot")
    assert list(sw.step.sel(run="h8").values) == [0, 5, 10, 15, 20]
    assert np.isnan(sw.step.sel(run="h4").values[3:]).all()
    assert int(sw.gate.where(sw.head_mask).count()) == 3 * L * 4 + 5 * L * 8


def test_analysis_and_derived_round_trip(tmp_path, monkeypatch):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    raw_before = store.open_run(path).attention.values
    assert store.open_analysis(path, stale="allow") is None and store.open_derived(path, "curves") is None

    first = xr.Dataset(
        {"score": (("layer", "head"), np.arange(8.0).reshape(2, 4))},
        coords={"role": ("head", np.array(["sink", "prev", "none", "induction"]))},
        attrs={"method": "test", "kappa": np.float64(0.3)},
    )
    store.write_analysis(path, "r1", first)
    got = xr.open_zarr(path, group="analysis/r1")  # plain xarray, warnings are errors
    assert [str(v) for v in got.role.values] == ["sink", "prev", "none", "induction"]
    # every chunk stored, and the group says so (store.open_analysis checks that none is lost, and drops the mark)
    assert got.attrs == {"method": "test", "kappa": 0.3, "empty_chunks_written": True}
    assert store.open_analysis(path, "r1", stale="allow").attrs == {"method": "test", "kappa": 0.3}

    store.write_analysis(path, "r1", store.open_analysis(path, stale="allow").assign(twice=lambda d: d.score * 2))
    second = store.open_analysis(path, "r1", stale="allow")
    np.testing.assert_array_equal(second.twice.values, first.score.values * 2)
    store.write_analysis(path, "r1", xr.Dataset({"other": ("x", [1, 2])}))
    assert set(store.open_analysis(path, stale="allow").data_vars) == {"other"}  # replaced whole
    np.testing.assert_array_equal(store.open_run(path).attention.values, raw_before)
    with pytest.raises(StoreError, match="no run 'ghost'"):
        store.write_analysis(path, "ghost", first)

    curves = xr.Dataset({"auc": ("fold", [0.7, 0.8])}, coords={"fold": [0, 1]})
    store.write_derived(path, "curves", curves)
    xr.testing.assert_identical(store.open_derived(path, "curves").load(), curves)
    assert store.list_runs(path) == ["r1"]

    # A write that breaks half way (a full disk; a kill) leaves the previous result whole: the
    # old group was deleted first, and `derived/curves` read as never written.
    # The staged group's files are written with Path.write_bytes (store.readers._write_files).
    real_write = Path.write_bytes

    def disk_full(self, data):
        if self.as_posix().endswith("/c/0"):
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    with monkeypatch.context() as m:
        m.setattr(Path, "write_bytes", disk_full)
        with pytest.raises(OSError, match="No space"):
            store.write_derived(path, "curves", curves * 2)
    xr.testing.assert_identical(store.open_derived(path, "curves").load(), curves)
    assert sorted(p.name for p in path.iterdir()) == ["analysis", "derived", "runs", "zarr.json"]  # nothing staged left


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_a_staged_write_clears_what_killed_writers_left_and_nothing_a_live_writer_holds(tmp_path):
    import fcntl
    import os

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    curves = xr.Dataset({"auc": ("fold", [0.7, 0.8])})
    store.write_derived(path, "curves", curves)
    staging = path / ".staging"
    staging.mkdir()
    # SIGKILLed while writing its group: a staging directory nobody holds
    killed = staging / "analysis.r1.k1ll3d00"
    (killed / "score").mkdir(parents=True)
    (killed / "score" / "zarr.json").write_text("{}")
    # SIGKILLed between the swap's two renames: the previous group moved aside, none in its place
    os.rename(path / "derived" / "curves", staging / "derived.curves.m0v3d000.old")
    # another process writing its group now (it holds its claim until it swaps)
    live = staging / "analysis.r1.l1v3w000"
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        store.write_analysis(path, "r1", xr.Dataset({"score": ("head", [1.0, 2.0])}))
        assert [p.name for p in staging.iterdir()] == [live.name]
    finally:
        os.close(fd)
    xr.testing.assert_identical(store.open_derived(path, "curves").load(), curves)
    assert list(store.open_analysis(path, "r1", stale="allow").score.values) == [1.0, 2.0]
    store.write_derived(path, "other", curves)  # the writer above died too: its directory goes now
    assert not staging.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_open_run_calls_a_killed_run_stopped_and_a_training_one_running(tmp_path):
    # A run killed outright never rewrites its "running"; open_run gave that, while `dynamics
    # status` and open_sweep said "stopped".
    path = tmp_path / "s.zarr"
    write_run(path, "r1", attrs={"status": "running"})
    assert store.open_run(path, "r1").attrs["status"] == "stopped"
    assert store.run_attrs(path, "r1")["status"] == "running"  # the record itself is left alone
    with store.run_lock(path, "r1"):
        assert store.open_run(path, "r1").attrs["status"] == "running"
    store.update_run_attrs(path, "r1", status="completed")
    assert store.open_run(path, "r1").attrs["status"] == "completed"


def test_open_analysis_warns_on_another_analysers_version(tmp_path):
    from dynamics.schema import ANALYSIS_VERSION

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    old = xr.Dataset({"score": ("head", [1.0, 2.0])}, attrs={"analysis_version": ANALYSIS_VERSION - 1})
    store.write_analysis(path, "r1", old)
    with pytest.warns(store.StaleAnalysisWarning) as caught:
        got = store.open_analysis(path, "r1")
    message = str(caught[0].message)
    assert f"version {ANALYSIS_VERSION - 1}, these are version {ANALYSIS_VERSION}" in message
    assert f"dynamics analyse {path}" in message
    np.testing.assert_array_equal(got.score.values, [1.0, 2.0])  # still returned: a warning, not a refusal
    # one with no version: written before analyses were stamped (their token shares read 0 where
    # undefined), opened without a word
    store.write_analysis(path, "r1", xr.Dataset({"score": ("head", [1.0, 2.0])}))
    with pytest.warns(store.StaleAnalysisWarning, match=rf"^analysis/r1 in .* was written before the analysers were "
                      rf"versioned, these are version {ANALYSIS_VERSION}: its figures may differ"):
        store.open_analysis(path, "r1")
    # callers that check is_current themselves, and a current analysis, open silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.open_analysis(path, "r1", stale="allow")
        store.write_analysis(path, "r1", old.assign_attrs(analysis_version=ANALYSIS_VERSION))
        store.open_analysis(path, "r1")
    with pytest.raises(ValueError, match="stale: expected 'warn' or 'allow', got 'no'"):
        store.open_analysis(path, "r1", stale="no")


def test_open_sweep_of_a_store_with_a_damaged_run_names_the_way_to_open_the_others(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    write_run(path, "r2")
    (path / "runs" / "r1" / "zarr.json").write_bytes(b"[1, 2]")
    with pytest.raises(StoreError, match=r"runs/r1 exists but its metadata .*open_sweep\(path, run_ids=\[\.\.\.\]\), of 'r2'$"):
        store.open_sweep(path)
    assert list(store.open_sweep(path, ["r2"]).run.values) == ["r2"]  # the way it names


def test_stored_analysis_version_reads_the_groups_zarr_json_alone(tmp_path):
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    assert store.stored_analysis_version(path, "r1") == (False, None)
    gate = store.open_run(path, "r1").gate
    store.write_analysis(path, "r1", xr.Dataset({"g": gate}, attrs={"analysis_version": 7}))
    assert store.stored_analysis_version(path, "r1") == (True, 7)
    # an array of it lost: the version still reads
    import shutil

    shutil.rmtree(path / "analysis" / "r1" / "g")
    assert store.stored_analysis_version(path, "r1") == (True, 7)
    store.write_analysis(path, "r1", xr.Dataset({"g": gate}))
    assert store.stored_analysis_version(path, "r1") == (True, None)  # unstamped
