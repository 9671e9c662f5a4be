"""`dynamics.predict.load`: a store's runs, their seeds and config groups, and the runs left out."""

from __future__ import annotations

import numpy as np
import pytest

from dynamics import cli, predict, store
from dynamics.predict import PredictOptions
from tests.test_predict import flip_a_bit, make_runs, write_store


def test_config_groups_ignore_where_a_run_ran():
    from dynamics.predict.load import _config_of

    def attrs(seed, device, lr=1e-3):
        return {"config": {"train": {"seed": seed, "device": device, "threads": 2, "lr": lr}, "model": {"d_model": 64}}}

    assert _config_of({}, [], attrs(0, "cpu")) == _config_of({}, [], attrs(1, "cuda"))
    assert _config_of({}, [], attrs(0, "cpu")) != _config_of({}, [], attrs(0, "cpu", lr=3e-3))


def test_config_groups_tell_apart_configs_that_share_their_swept_values(tmp_path):
    # A second sweep of the same grid from another base config (--set train.lr=...) into one
    # store: grouped by swept values alone, "holding out whole configs (2 groups)" held out 4.
    path = tmp_path / "m.zarr"
    runs = make_runs(n_seeds=2, configs=("a", "b"))
    write_store(path, runs)
    points = {}
    for r in runs:
        lr = {"a": 1e-3, "b": 1e-2}[r.config]
        store.update_run_attrs(path, r.run_id, config={"train": {"seed": r.seed, "lr": lr}, "model": {"init_scale": 1.0}})
        points[r.run_id] = {"model.init_scale": 1.0, "train.seed": r.seed}
    store.write_sweep_index(path, {"axes": ["model.init_scale", "train.seed"], "runs": points})
    loaded = predict.load_runs(str(path), PredictOptions(group_by="config"))
    assert {r.run_id: r.group("config") for r in loaded} == {
        r.run_id: f"model.init_scale=1.0, train.lr={ {'a': 0.001, 'b': 0.01}[r.config]}" for r in runs}


def test_a_run_whose_recordings_fail_their_checksum_is_left_out_and_named(tmp_path, capsys):
    # A flipped bit in a chunk predict reads (a gradient statistic at a horizon, or an index
    # coordinate read on opening) ended `dynamics predict` with zarr's traceback
    path = tmp_path / "s.zarr"
    write_store(path, make_runs(n_seeds=3))
    ids = store.list_runs(path)
    flip_a_bit(path / "runs" / ids[0] / "head")
    grad = path / "runs" / ids[1] / "grad_norm"
    chunk = next(p for p in sorted((grad / "c").rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x04
    chunk.write_bytes(bytes(data))
    assert cli.main(["predict", str(path), "--target", "slash", "--horizons", "0,0.1", "--folds", "2",
                     "--no-save", "--group", "run"]) == 2  # one run left: no curve, one line
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"dynamics: error: {path}: 1 completed run(s)")
    write_store(tmp_path / "t.zarr", make_runs(n_seeds=4))
    path = tmp_path / "t.zarr"
    ids = store.list_runs(path)
    flip_a_bit(path / "runs" / ids[0] / "grad_norm")
    assert cli.main(["predict", str(path), "--target", "slash", "--horizons", "0,0.1", "--folds", "2", "--no-save",
                     "--group", "run"]) == 1
    out, err = capsys.readouterr()
    assert f"left out: 1 run(s) that could not be read (damaged): {ids[0]}" in out.splitlines()
    assert "Traceback" not in err and (f"dynamics: {path}: run {ids[0]}: array grad_norm at snapshot 0 (step 0): its chunk "
                                       f"runs/{ids[0]}/grad_norm/c/0/0/0/0 cannot be decoded (damaged: its CRC32C "
                                       f"checksum does not match") in err


def test_a_run_outside_the_sweep_index_is_one_of_the_runs(tmp_path):
    # as `dynamics run` leaves one in a sweep's store: analyse and report count it, and so must predict
    runs = make_runs(n_seeds=4)
    path = tmp_path / "mixed.zarr"
    write_store(path, runs)
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {r.run_id: {"train.seed": r.seed} for r in runs[:3]}})
    loaded = predict.load_runs(str(path))
    assert [r.run_id for r in loaded] == [r.run_id for r in runs]
    assert loaded[-1].seed == runs[-1].seed


def test_runs_left_out_are_named_with_their_status_or_as_damaged(tmp_path, capsys):
    # a curve over the runs that finished says nothing of those that diverged: a reader must be told.
    # One damaged run among many refused the whole store (exit 2), and a run whose attention chunk
    # was lost was predicted from the NaN zarr reads in its place: both left out and named, exit 1.
    runs = make_runs(n_seeds=5)
    path = tmp_path / "survivors.zarr"
    write_store(path, runs, statuses={runs[1].run_id: "diverged"})
    cut, lost = runs[2].run_id, runs[3].run_id
    meta = path / "runs" / cut / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    (path / "runs" / lost / "attention" / "c" / "2" / "0" / "0" / "0" / "0" / "0").unlink()
    loaded, left_out = predict.load_store(str(path))
    assert [r.run_id for r in loaded] == [runs[0].run_id, runs[4].run_id]
    assert left_out == [f"{runs[1].run_id} (diverged)", f"{cut} (damaged)", f"{lost} (damaged)"]
    assert cli.main(["predict", str(path), "--horizon", "0", "--folds", "2"]) == 1
    out, err = capsys.readouterr()
    assert "heads in 2 runs" in out
    assert f"left out: 1 run(s) not completed, so without a final role: {runs[1].run_id} (diverged)" in out
    assert f"left out: 2 run(s) that could not be read (damaged): {cut}, {lost}" in out
    assert f"runs/{cut} exists but its metadata" in err and f"run {lost}: array attention at snapshot 2" in err
    assert err.strip().splitlines()[-1] == f"dynamics: 2 run(s) could not be read (damaged), skipped: {cut}, {lost}"
    assert store.open_derived(str(path), predict.derived_name("slash")).attrs["runs_left_out"] == left_out


def test_sweep_points_not_started_are_named_as_left_out(tmp_path, capsys):
    # predict on a sweep still running (or stopped part-way): its points not started yet are runs
    # of the sweep, as `status` and the report list them; unnamed, 3 of 5 points read as 3 of 3
    runs = make_runs(n_seeds=3)
    path = tmp_path / "partway.zarr"
    write_store(path, runs)
    points = {r.run_id: {"train.seed": r.seed} for r in runs}
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {**points, "rnotstarted1": {"train.seed": 3},
                                                                    "rnotstarted2": {"train.seed": 4}}})
    loaded, left_out = predict.load_store(str(path))
    assert [r.run_id for r in loaded] == [r.run_id for r in runs]
    assert left_out == ["rnotstarted1 (pending)", "rnotstarted2 (pending)"]
    assert cli.main(["predict", str(path), "--horizon", "0", "--folds", "2", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "heads in 3 runs" in out
    assert ("left out: 2 run(s) not completed, so without a final role: rnotstarted1 (pending), "
            "rnotstarted2 (pending)") in out


def test_a_killed_run_is_left_out_as_stopped_not_running(tmp_path):
    # A killed run's attrs still say "running": predict named it so while status, analyse and the
    # report said "stopped"; one being trained (its lock held) is still "running".
    runs = make_runs(n_seeds=4)
    path = tmp_path / "killed.zarr"
    write_store(path, runs, statuses={runs[2].run_id: "running", runs[3].run_id: "running"})
    with store.run_lock(str(path), runs[3].run_id):
        _, left_out = predict.load_store(str(path))
    assert left_out == [f"{runs[2].run_id} (stopped)", f"{runs[3].run_id} (running)"]


def test_saving_a_curve_says_which_saved_curve_it_replaces(tmp_path):
    # A quick variant's curve took the place of the demo's five horizons without a word, and the
    # report then showed only the new one.
    import xarray as xr

    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    curve = xr.Dataset({"score": (("horizon",), [0.5, 0.6, 0.7])}, coords={"horizon": [0.0, 0.1, 0.5]},
                       attrs={"target": "role", "horizon_unit": "fraction"})
    assert predict.replaced_note(path, curve) == ""  # nothing saved yet
    assert predict.write_curve(path, curve) == "predict.role"
    quick = curve.isel(horizon=[1])
    assert predict.replaced_note(path, quick) == (" (replacing the curve saved before, of horizons 0,0.1,0.5 (fraction); "
                                                  "--no-save prints a curve without replacing it)")
    assert predict.replaced_note(path, quick.assign_attrs(target="slash")) == ""  # another target's: untouched


def test_runs_in_the_curve_that_training_made_worse_or_never_moved_are_named(tmp_path, capsys):
    # Completed, so in the curve with heads labelled like any run's: lr 100 runs held every self,
    # slash and induction head of a sweep's targets, and no line said their loss had risen.
    runs = make_runs(n_seeds=4)
    rose, still = runs[0], runs[1]
    S = rose.data.sizes["snapshot"]
    worse = np.linspace(2.5, 144.6, S, dtype=np.float32)[:, None]  # (snapshot, component)
    rose.data["eval_loss"] = (("snapshot", "component"), worse)
    frozen = still.data["attention"].values.copy()
    frozen[-1] = frozen[0]
    still.data["attention"] = (still.data["attention"].dims, frozen)
    path = tmp_path / "s.zarr"
    write_store(path, runs)
    assert cli.main(["predict", str(path), "--horizon", "0", "--folds", "2"]) == 0
    out = capsys.readouterr().out
    assert (f"loss rose in 1 completed run(s): the eval loss at the last snapshot is above that at step 0, so "
            f"training made them worse and their heads' figures are not those of a model that learned its task: "
            f"{rose.run_id} (2.5 -> 144.6 nats)") in out.splitlines()
    assert any(line.startswith("attention unchanged in 1 completed run(s)") and line.endswith(f": {still.run_id}")
               for line in out.splitlines())
    # as stored, read back (a pair from JSON is a list): the same lines
    saved = store.open_derived(str(path), predict.derived_name("slash"))
    assert saved.attrs["runs_caveats"] == {rose.run_id: {"loss_rose": [2.5, pytest.approx(144.6)]},
                                           still.run_id: {"attention_unchanged": True}}
    assert [line for line in predict.format_curve(saved).splitlines() if "completed run(s)" in line] == [
        line for line in out.splitlines() if "completed run(s)" in line]
