"""Store round trips: plain xarray reads what RunWriter writes, sweeps align, nothing is clobbered."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import dask.array as da
import fsspec.core
import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.store import StoreError

pytestmark = pytest.mark.filterwarnings("error")

N_SNAP, L, P, T = 3, 2, 2, 6


def spec(n_heads: int = 4, n_snap: int = N_SNAP, steps: int = 10):
    variables = {
        "attention": (("snapshot", "layer", "head", "probe", "query", "key"), (n_snap, L, n_heads, P, T, T), "float16"),
        "grad_norm": (("snapshot", "layer", "head", "weight"), (n_snap, L, n_heads, 4), "float32"),
        "gate": (("snapshot", "layer", "head"), (n_snap, L, n_heads), "float32"),
        "eval_loss": (("snapshot", "component"), (n_snap, 2), "float32"),
        "probe_tokens": (("probe", "position"), (P, T + 1), "int64"),
        "loss": (("train_step",), (steps,), "float32"),
    }
    coords = {
        "step": ("snapshot", np.arange(n_snap) * 5),
        "layer": ("layer", np.arange(L)),
        "head": ("head", np.arange(n_heads)),
        "weight": ("weight", np.array(["q", "k", "v", "o"])),
        "component": ("component", np.array(["induction", "markov"])),
        "train_step": ("train_step", np.arange(steps)),
    }
    return variables, coords


def snapshot(rng, n_heads: int = 4, fill: float | None = None) -> dict:
    gate = np.full((L, n_heads), fill, np.float32) if fill is not None else rng.random((L, n_heads), np.float32)
    return {
        "attention": rng.random((L, n_heads, P, T, T)).astype(np.float16),
        "grad_norm": rng.random((L, n_heads, 4), np.float32),
        "gate": gate,
        "eval_loss": rng.random(2, np.float32),
    }


def write_run(path, run_id, *, n_heads=4, n_snap=N_SNAP, fill=None, attrs=None, seed=0):
    rng = np.random.default_rng(seed)
    variables, coords = spec(n_heads, n_snap)
    w = store.RunWriter(path, run_id, variables=variables, coords=coords, attrs=attrs or {"status": "completed"})
    snaps = [snapshot(rng, n_heads, fill) for _ in range(n_snap)]
    for i, s in enumerate(snaps):
        w.write_snapshot(i, s)
    w.finalize()
    return snaps


def test_plain_open_zarr_round_trip(tmp_path):
    path = tmp_path / "s.zarr"
    store.init_store(path)
    rng = np.random.default_rng(0)
    variables, coords = spec()
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running", "config": {"a": 1}})
    snaps = [snapshot(rng) for _ in range(2)]  # snapshot 2 never written
    for i, s in enumerate(snaps):
        w.write_snapshot(i, s)
    w.write_region("probe_tokens", 0, np.arange(P * (T + 1)).reshape(P, T + 1))
    w.set_attrs(status="completed", last_loss=np.float32(0.5), shape=(1, 2))
    w.finalize()

    ds = xr.open_zarr(path, group="runs/r1")  # no package, no warnings (module filter: error)
    assert ds.attention.dims == ("snapshot", "layer", "head", "probe", "query", "key")
    assert ds.attention.dtype == np.float16
    assert "step" in ds.coords and ds.step.dims == ("snapshot",)
    assert list(ds.step.values) == [0, 5, 10]
    assert [str(v) for v in ds.weight.values] == ["q", "k", "v", "o"]
    assert [str(v) for v in ds.component.values] == ["induction", "markov"]
    assert float(ds.grad_norm.sel(weight="k").isel(snapshot=0, layer=1, head=2)) == snaps[0]["grad_norm"][1, 2, 1]
    np.testing.assert_array_equal(ds.attention.values[:2], np.stack([s["attention"] for s in snaps]))
    assert np.isnan(ds.attention.values[2]).all() and np.isnan(ds.loss.values).all()
    assert ds.probe_tokens.dtype == np.int64 and ds.probe_tokens.values[1, 0] == T + 1
    assert ds.attrs == {"status": "completed", "config": {"a": 1}, "last_loss": 0.5, "shape": [1, 2],
                        "empty_chunks_written": True}
    assert ds.attention.encoding["chunks"] == (1, L, 4, P, T, T)
    assert xr.open_zarr(path).attrs["dynamics_store"] == store.STORE_VERSION


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


def test_run_writer_refuses_existing_run_unless_resume(tmp_path):
    path = tmp_path / "s.zarr"
    variables, coords = spec()
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running", "starts": 1})
    first = snapshot(np.random.default_rng(1))
    w.write_snapshot(0, first)
    w.write_region("loss", 0, np.arange(4, dtype=np.float32))
    with pytest.raises(StoreError, match="already exists"):
        store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={})

    w2 = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"starts": 2}, resume=True)
    w2.write_snapshot(1, snapshot(np.random.default_rng(2)))
    w2.write_region("loss", 4, np.arange(4, 8, dtype=np.float32))
    ds = store.open_run(path)
    np.testing.assert_array_equal(ds.attention.isel(snapshot=0).values, first["attention"])
    assert not np.isnan(ds.gate.isel(snapshot=1).values).any()
    np.testing.assert_array_equal(ds.loss.values[:8], np.arange(8))
    assert store.run_attrs(path, "r1") == {"status": "running", "starts": 2, "empty_chunks_written": True}

    other_variables, other_coords = spec(n_heads=8)
    with pytest.raises(StoreError, match="attention"):
        store.RunWriter(path, "r1", variables=other_variables, coords=other_coords, attrs={}, resume=True)


def test_a_refused_resume_leaves_the_run_attrs_as_they_were(tmp_path):
    path = tmp_path / "s.zarr"
    variables, coords = spec()
    store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "interrupted", "starts": 1})
    other_variables, other_coords = spec(n_heads=8)
    with pytest.raises(StoreError, match="stored 'attention'"):
        store.RunWriter(path, "r1", variables=other_variables, coords=other_coords,
                        attrs={"status": "running", "starts": 2}, resume=True)
    assert store.run_attrs(path, "r1") == {"status": "interrupted", "starts": 1, "empty_chunks_written": True}


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
    assert list(store.open_analysis(path, "r2").score.values) == [1.0]
    assert list(store.open_sweep(path, ["r2"]).run.values) == ["r2"]
    with pytest.raises(StoreError, match=r"no run 'r3' in .*; runs: r1, r2"):
        store.open_run(path, "r3")
    with pytest.raises(StoreError, match="damaged: expected one of raise, skip, include"):
        store.list_runs(path, damaged="ignore")


@pytest.mark.parametrize("attrs, problem", [
    ([], "attributes = [], not a table"),
    ({"status": "completed", "steps_done": "x"}, "steps_done = 'x', not an integer"),
    ({"status": "stopped", "checkpoint_step": None}, "checkpoint_step = None, not an integer"),
    ({"status": "completed", "last_loss": "x"}, "last_loss = 'x', not a number"),
    ({"status": ["x"]}, "status = ['x'], not a string"),
    ({"status": "completed", "steps_done": True}, "steps_done = True, not an integer"),
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


def test_a_run_created_while_the_runs_are_listed_is_not_called_damaged(tmp_path, monkeypatch):
    # zarr makes runs/<id>/ before it renames zarr.json into it. A listing that read zarr.json as
    # absent, and then found it there on a second read, named a run being created as damaged
    # (seen in CI: a test polling a store while `dynamics run` started).
    from dynamics.store import _loc

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    (path / "runs" / "r2").mkdir()
    real_get, created = _loc._Loc.get, []

    def get_then_create(self, key):
        got = real_get(self, key)
        if key == "runs/r2/zarr.json" and not created:
            created.append(key)  # the writer's own lookups read as usual
            write_run(path, "r2", seed=1)
        return got

    monkeypatch.setattr(_loc._Loc, "get", get_then_create)
    assert store.list_runs(path) == ["r1", "r2"]
    assert created == ["runs/r2/zarr.json"]


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


class Died(Exception):
    """Stands for the process being killed: nothing after it runs."""


def test_a_run_whose_creation_was_cut_short_resumes(tmp_path, monkeypatch):
    # The group and its arrays exist, but the coordinates' values never landed (SIGKILL between
    # the two): a resume writes them instead of refusing the run for ever.
    import zarr.core.array

    path = tmp_path / "s.zarr"
    variables, coords = spec()

    async def killed(self, *args, **kwargs):
        raise Died

    with monkeypatch.context() as m:
        m.setattr(zarr.core.array.AsyncArray, "setitem", killed)
        with pytest.raises(Died):
            store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running"})
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"starts": 2}, resume=True)
    w.write_snapshot(0, snapshot(np.random.default_rng(0)))
    ds = xr.open_zarr(path, group="runs/r1")
    assert list(ds.step.values) == [0, 5, 10] and [str(v) for v in ds.weight.values] == ["q", "k", "v", "o"]
    assert list(ds.component.values) == ["induction", "markov"]
    assert ds.attrs == {"status": "running", "starts": 2, "empty_chunks_written": True}


def test_write_region_and_write_snapshot_check_their_input(tmp_path):
    path = tmp_path / "s.zarr"
    variables, coords = spec(steps=5000)  # spans two 4096-step chunks
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={})
    w.write_region("loss", 4090, np.arange(10, dtype=np.float32))
    loss = store.open_run(path).loss
    assert loss.encoding["chunks"] == (4096,)
    np.testing.assert_array_equal(loss.values[4090:4100], np.arange(10))
    assert np.isnan(loss.values[:4090]).all() and np.isnan(loss.values[4100:]).all()
    with pytest.raises(StoreError, match="outside"):
        w.write_region("loss", 4999, np.zeros(2, np.float32))
    with pytest.raises(StoreError, match="out of range"):
        w.write_snapshot(N_SNAP, {"gate": np.zeros((L, 4))})
    with pytest.raises(StoreError, match="expected"):
        w.write_snapshot(0, {"gate": np.zeros((L, 3))})
    with pytest.raises(StoreError, match="no variable 'nope'"):
        w.write_snapshot(0, {"nope": np.zeros(1)})
    with pytest.raises(StoreError, match="JSON"):
        w.set_attrs(bad=object())


def grid_store(path):
    index = {"axes": ["model.init_scale", "train.lr"], "runs": {}}
    for i, (scale, lr) in enumerate([(0.5, 1e-3), (0.5, 1e-2), (2.0, 1e-3), (2.0, 1e-2)]):
        run_id = f"g{i}"
        write_run(path, run_id, fill=scale * 10 + lr, seed=i, attrs={"status": "completed" if i else "diverged"})
        index["runs"][run_id] = {"model.init_scale": scale, "train.lr": lr}
    index["runs"]["not_started"] = {"model.init_scale": 1.0, "train.lr": 1e-3}
    store.write_sweep_index(path, index)
    return index


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


def test_open_sweep_has_swept_coordinates(tmp_path):
    path = tmp_path / "s.zarr"
    index = grid_store(path)
    assert store.read_sweep_index(path) == index
    sw = store.open_sweep(path)
    assert list(sw.run.values) == ["g0", "g1", "g2", "g3"]  # runs not yet in the store are skipped
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


def test_open_sweep_says_stopped_for_a_killed_run_as_status_does(tmp_path):
    # A run killed mid-training (SIGKILL) is still marked "running" in its attributes.
    path = tmp_path / "s.zarr"
    grid_store(path)
    store.update_run_attrs(path, "g1", status="running")  # killed: nobody holds its run lock
    store.update_run_attrs(path, "g2", status="running")
    with store.run_lock(path, "g2"):  # still being trained
        sw = store.open_sweep(path)
    assert list(sw.status.values) == ["diverged", "stopped", "running", "completed"]
    assert sw.attrs["runs"]["g1"]["status"] == "running"  # the recorded attribute is untouched

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
    assert store.open_analysis(path) is None and store.open_derived(path, "curves") is None

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
    assert store.open_analysis(path, "r1").attrs == {"method": "test", "kappa": 0.3}

    store.write_analysis(path, "r1", store.open_analysis(path).assign(twice=lambda d: d.score * 2))
    second = store.open_analysis(path, "r1")
    np.testing.assert_array_equal(second.twice.values, first.score.values * 2)
    store.write_analysis(path, "r1", xr.Dataset({"other": ("x", [1, 2])}))
    assert set(store.open_analysis(path).data_vars) == {"other"}  # replaced whole
    np.testing.assert_array_equal(store.open_run(path).attention.values, raw_before)
    with pytest.raises(StoreError, match="no run 'ghost'"):
        store.write_analysis(path, "ghost", first)

    curves = xr.Dataset({"auc": ("fold", [0.7, 0.8])}, coords={"fold": [0, 1]})
    store.write_derived(path, "curves", curves)
    xr.testing.assert_identical(store.open_derived(path, "curves").load(), curves)
    assert store.list_runs(path) == ["r1"]

    # A write that breaks half way (a full disk; a kill) leaves the previous result whole: the
    # old group was deleted first, and `derived/curves` read as never written.
    from zarr.storage import LocalStore

    real_set = LocalStore.set

    async def disk_full(self, key, value):
        if key.endswith("/c/0"):
            raise OSError(28, "No space left on device")
        await real_set(self, key, value)

    with monkeypatch.context() as m:
        m.setattr(LocalStore, "set", disk_full)
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
    assert list(store.open_analysis(path, "r1").score.values) == [1.0, 2.0]
    store.write_derived(path, "other", curves)  # the writer above died too: its directory goes now
    assert not staging.exists()


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


def test_a_store_path_of_another_type_is_named():
    with pytest.raises(TypeError, match="a store path must be a str or path-like .* got int 123"):
        store.open_run(123)


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


def write_whole_run(path, run_id, **kw):
    """`write_run`, and its loss and probe tokens, as a run of `dynamics run` writes them."""
    write_run(path, run_id, **kw)
    variables, coords = spec(kw.get("n_heads", 4))
    w = store.RunWriter(path, run_id, variables=variables, coords=coords, attrs={}, resume=True)
    w.write_region("loss", 0, np.arange(10, dtype=np.float32))
    w.write_region("probe_tokens", 0, np.arange(1, P * (T + 1) + 1).reshape(P, T + 1))


def test_a_chunk_a_finished_run_wrote_that_is_gone_is_named_not_read_as_nan(tmp_path):
    # zarr reads a missing chunk file as the fill value: a deleted snapshot of attention read as NaN
    # (`dynamics analyse` then said "bifurcation never, roles none:4", exit 0), a lost step chunk as step 0.
    path = tmp_path / "s.zarr"
    write_whole_run(path, "r1")
    store.check_recorded(path, "r1")
    run = path / "runs" / "r1"
    (run / "attention" / "c" / "2" / "0" / "0" / "0" / "0" / "0").unlink()
    with pytest.raises(StoreError, match=r"run r1: array attention at snapshot 2 \(step 10\): its chunk "
                                         r"runs/r1/attention/c/2/0/0/0/0/0 is missing, though the run wrote it: "
                                         r"zarr would read it as nan; restore runs/r1"):
        store.check_recorded(path, "r1")
    (run / "step" / "c" / "0").unlink()
    with pytest.raises(StoreError, match=r"array attention at snapshot 2: .* \(and 1 more chunk"):
        store.check_recorded(path, "r1")

    # what a run may leave unwritten is not damage: a run still training, and a diverged run's
    # snapshots from its diverging step on
    store.update_run_attrs(path, "r1", status="running")
    store.check_recorded(path, "r1")
    write_whole_run(path, "div", n_heads=1, attrs={"status": "diverged", "diverged_step": 5})  # steps 0, 5, 10
    # a one-head coordinate [0] is all fill value: written all the same, so its loss is named
    head = path / "runs" / "div" / "head" / "c" / "0"
    assert head.exists()
    head.unlink()
    with pytest.raises(StoreError, match=r"run div: array head: its chunk runs/div/head/c/0 is missing"):
        store.check_recorded(path, "div")
    store.update_run_attrs(path, "div", empty_chunks_written=False)  # as written before: no chunk for [0]
    store.check_recorded(path, "div")
    (path / "runs" / "div" / "gate" / "c" / "1" / "0" / "0").unlink()
    (path / "runs" / "div" / "gate" / "c" / "2" / "0" / "0").unlink()
    store.check_recorded(path, "div")
    (path / "runs" / "div" / "gate" / "c" / "0" / "0" / "0").unlink()
    with pytest.raises(StoreError, match=r"run div: array gate at snapshot 0 \(step 0\)"):
        store.check_recorded(path, "div")


def test_a_lost_probe_is_named_and_a_probe_of_token_0_alone_is_not_a_lost_chunk(tmp_path):
    # A markov chain whose token 0 leads only to itself (vocab_size 4, markov_branching 1, seed 0,
    # n_probe 1) draws a probe of 0s, which zarr stored as no chunk: a lost probe chunk (every role
    # score then computed against token 0) could not be told from it. The writer now stores it.
    path = tmp_path / "s.zarr"
    write_whole_run(path, "r1")
    variables, coords = spec()
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={}, resume=True)
    w.write_region("probe_tokens", 0, np.zeros((P, T + 1), np.int64))
    chunk = path / "runs" / "r1" / "probe_tokens" / "c" / "0" / "0"
    assert chunk.exists()
    store.check_recorded(path, "r1")
    chunk.unlink()
    with pytest.raises(StoreError, match=r"run r1: array probe_tokens: its chunk runs/r1/probe_tokens/c/0/0 is "
                                         r"missing, though the run wrote it: zarr would read it as 0"):
        store.check_recorded(path, "r1")
    # a run from before the writer stored such chunks: its probe of 0s had none, and is not damage
    store.update_run_attrs(path, "r1", empty_chunks_written=False)
    store.check_recorded(path, "r1")


def test_a_chunk_cut_short_is_named_with_its_run_and_array(tmp_path):
    # zarr's own error, "Zstd decompression error: invalid input data", named neither
    path = tmp_path / "s.zarr"
    write_whole_run(path, "r1")
    assert store.unreadable_chunk(path, "r1") is None
    chunk = path / "runs" / "r1" / "grad_norm" / "c" / "1" / "0" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:5])
    e = store.unreadable_chunk(path, "r1")
    assert isinstance(e, StoreError)
    assert f"{path}: run r1: array grad_norm at snapshot 1 (step 5): its chunk runs/r1/grad_norm/c/1/0/0/0 cannot be " \
           f"decoded (damaged: " in str(e) and "\n" not in str(e)


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
    # callers that check is_current themselves, and a current analysis, open silently
    store.open_analysis(path, "r1", stale="allow")
    store.write_analysis(path, "r1", old.assign_attrs(analysis_version=ANALYSIS_VERSION))
    store.open_analysis(path, "r1")
    with pytest.raises(ValueError, match="stale: expected 'warn' or 'allow', got 'no'"):
        store.open_analysis(path, "r1", stale="no")


def test_what_the_store_writes_is_readable_as_the_umask_says(tmp_path):
    # mkdtemp (0700) and mkstemp (0600) made every analysis, derived group and checkpoint readable by
    # its writer alone: a colleague with read access to the store got PermissionError from predict,
    # gates and report. Known answer: umask 022 gives 0755 folders and 0644 files, as zarr's own.
    import os
    import stat

    old = os.umask(0o022)
    try:
        path = tmp_path / "s.zarr"
        write_run(path, "r1")
        store.write_analysis(path, "r1", xr.Dataset({"score": ("head", [1.0, 2.0])}))
        store.write_derived(path, "curves", xr.Dataset({"auc": ("fold", [0.7])}))
        store.write_checkpoint(path, "r1", b"weights")
    finally:
        os.umask(old)
    for p in (path / "analysis" / "r1", path / "derived" / "curves", path / "runs" / "r1"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o755, p
    for p in (path / "analysis" / "r1" / "zarr.json", path / "checkpoints" / "r1" / "ckpt.pt"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
