"""Sweeps end to end: input refused before any work, run_sweep on a tiny cluster and what it leaves in the
store. `tiny`, `write_toml` and `cli` make the configs tests/test_sweep_*.py use; each module's own tests
are in tests/test_sweep_<module>.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr

from dynamics import store
from dynamics.config import ConfigError, from_dict, with_values
from dynamics.provenance import same_code_or_refuse as _REAL_CHECK  # the task's check, before any monkeypatch
from dynamics.sweep import (
    expand_grid,
    lock_path,
    run_point,
    run_sweep,
)
from dynamics.train import train_run

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "induction", "min_period": 2, "max_period": 6},
    "train": {"steps": 12, "batch_size": 4, "warmup_steps": 2, "eval_batches": 1},
    "record": {"dense_until": 4, "every": 6, "n_probe": 2, "eval_batch_size": 4},
}


def tiny(sweep: dict | None = None, **sections) -> dict:
    raw = json.loads(json.dumps(TINY))
    for name, table in sections.items():
        raw[name].update(table)
    if sweep is not None:
        raw["sweep"] = sweep
    return raw


def write_toml(path: Path, raw: dict) -> Path:
    lines = []
    for section, table in raw.items():
        lines.append(f"[{section}]")
        for key, value in table.items():
            lines.append(f'"{key}" = {json.dumps(value)}')
    path.write_text("\n".join(lines) + "\n")
    return path


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynamics", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


# --------------------------------------------------------------------------- input refused


def test_a_point_that_cannot_fit_in_memory_is_refused_before_the_store_is_made(tmp_path):
    # checked for every point: the typo was trained by a worker, which failed with a MemoryError
    cfg = from_dict(tiny({"train.batch_size": [16, 10**8]}))
    out = tmp_path / "s.zarr"
    with pytest.raises(ConfigError, match=r"^sweep point train.batch_size=100000000: config needs at least .* for a "
                                          r"training step\), more than the"):
        run_sweep(cfg, str(out), workers=1, progress=False)
    assert not out.exists()


def test_cli_invalid_point_exits_2_with_one_line_and_writes_nothing(tmp_path):
    config = write_toml(tmp_path / "bad.toml", tiny({"model.n_heads": [2, 5], "train.seed": [0, 1]}))
    out = tmp_path / "store.zarr"
    r = cli("sweep", str(config), "--out", str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "sweep point model.n_heads=5, train.seed=0: model.n_heads: 5 does not divide" in lines[0]
    assert r.stdout == ""
    assert not out.exists()


def test_cli_unknown_axis_exits_2(tmp_path):
    config = write_toml(tmp_path / "bad.toml", tiny({"model.nope": [1, 2]}))
    r = cli("sweep", str(config), "--out", str(tmp_path / "s.zarr"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["dynamics: error: sweep: unknown axis 'model.nope'"]
    assert not (tmp_path / "s.zarr").exists()


# --------------------------------------------------------------------------- runs


def test_run_sweep_then_rerun_skips_everything(tmp_path, threaded_cluster, monkeypatch):
    cfg = from_dict(tiny({"train.seed": [0, 1]}))
    path = str(tmp_path / "s.zarr")
    summary = run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert summary.ok and summary.counts == {"completed": 2} and summary.failed == [], summary.lines()
    points = expand_grid(cfg)
    assert sorted(store.list_runs(path)) == sorted(p.run_id for p in points)
    index = store.read_sweep_index(path)
    assert index["axes"] == ["train.seed"]
    assert index["runs"] == {p.run_id: p.values for p in points}
    for p in points:
        attrs = store.run_attrs(path, p.run_id)
        assert attrs["status"] == "completed" and attrs["sweep_values"] == p.values
    assert not Path(lock_path(path)).exists()

    # A worker killed between a run's last attrs and their root-index entry: plain xarray, which
    # reads the index, saw it running, and a rerun skipping it as finished left it so.
    from dynamics.store import root as store_root

    root = Path(path) / "zarr.json"
    meta = json.loads(root.read_text())
    for p in points:
        meta["consolidated_metadata"]["metadata"][f"runs/{p.run_id}"]["attributes"]["status"] = "running"
    root.write_text(json.dumps(meta))
    before = {p.run_id: store.run_attrs(path, p.run_id) for p in points}
    from dynamics.store import index as store_index

    writes = []
    real_write = store_index._write_root
    for module in (store_root, store_index):  # the sweep index is written from root, the index entries from index
        monkeypatch.setattr(module, "_write_root", lambda loc, meta: (writes.append(1), real_write(loc, meta)))
    again = run_sweep(cfg, path, progress=False)  # nothing to do: no cluster is even started
    assert len(writes) == 2  # the sweep index, then every stale entry at once (one each was quadratic)
    assert again.skipped == [p.run_id for p in points] and again.counts == {"completed": 2}
    assert {p.run_id: store.run_attrs(path, p.run_id) for p in points} == before
    for p in points:
        assert xr.open_zarr(path, group=f"runs/{p.run_id}").attrs == before[p.run_id]


def test_a_task_cancelled_on_the_cluster_ends_the_sweep_with_a_summary(tmp_path, threaded_cluster, monkeypatch):
    # A task cancelled on the cluster (another client; the scheduler lost, whose futures Dask cancels
    # as "scheduler-connection-lost") made Dask's wait() raise FuturesCancelledError: a 30-line
    # traceback from `dynamics sweep`, no summary, the other runs' results unreported.
    import threading

    from distributed import Client, Future

    from dynamics import train as train_module

    cfg = from_dict(tiny({"train.steps": [24, 12]}))
    slow, cut = expand_grid(cfg)
    path = str(tmp_path / "s.zarr")
    other = Client(threaded_cluster, timeout=30)  # connected before the sweep starts: the race is only the poll's
    cancelled = threading.Event()
    real_train_run = train_module.train_run

    def held_train_run(cfg, *args, **kwargs):  # the one-thread worker holds the first point until then
        cancelled.wait(60)
        return real_train_run(cfg, *args, **kwargs)

    monkeypatch.setattr(train_module, "train_run", held_train_run)  # task.py imports it at each call

    def cancel_second() -> None:  # the second point is queued behind the first
        try:
            for _ in range(3000):
                keys = other.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))
                mine = [k for k in keys if str(k).startswith(f"dynamics-train-{cut.run_id}-")]
                if mine:
                    Future(mine[0], other).cancel(force=True)
                    return
                time.sleep(0.005)
        finally:
            cancelled.set()

    canceller = threading.Thread(target=cancel_second)
    canceller.start()
    try:
        summary = run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    finally:
        canceller.join()
        other.close()
    assert summary.counts == {"completed": 1, "cancelled": 1} and not summary.ok, summary.lines()
    assert summary.cancelled == [cut.run_id] and summary.failed == []
    assert f"  cancelled {cut.run_id} [train.steps=12]: its task was cancelled on the cluster (" in summary.lines()[1]
    assert store.run_attrs(path, slow.run_id)["status"] == "completed"
    assert cut.run_id not in store.list_runs(path)  # queued when cancelled: nothing written


def test_a_later_sweep_into_the_store_keeps_every_runs_swept_values(tmp_path, threaded_cluster):
    # Sweep init_scale, then seeds into the same store: the seed-0 point is the run already there
    # (init_scale 1.0 is the default). The index must keep its init_scale and give the new run its
    # own (from its config), so status and the report do not show them blank.
    path = str(tmp_path / "s.zarr")
    first = run_sweep(from_dict(tiny({"model.init_scale": [1.0]})), path, scheduler=threaded_cluster, progress=False)
    second = run_sweep(from_dict(tiny({"train.seed": [0, 1]})), path, scheduler=threaded_cluster, progress=False)
    assert first.ok and second.ok and len(second.skipped) == 1, second.lines()
    index = store.read_sweep_index(path)
    assert index["axes"] == ["model.init_scale", "train.seed"]
    [old] = first.labels
    [new] = [rid for rid in second.labels if rid != old]
    assert index["runs"] == {old: {"model.init_scale": 1.0, "train.seed": 0},
                             new: {"model.init_scale": 1.0, "train.seed": 1}}


def test_a_diverged_point_is_finished_so_a_rerun_skips_it_and_starts_no_cluster(tmp_path, threaded_cluster, monkeypatch):
    # run_sweep: finished runs, completed or diverged, are skipped; with nothing left to train no
    # cluster is started. Skipping only "completed" retrained every diverged point on each rerun.
    from dynamics.sweep import launcher

    cfg = from_dict(tiny({"train.seed": [0]}, train={"lr": 1e6, "grad_clip": 0.0, "optimizer": "sgd", "warmup_steps": 0}))
    path = str(tmp_path / "s.zarr")
    assert run_sweep(cfg, path, scheduler=threaded_cluster, progress=False).counts == {"diverged": 1}
    [run_id] = store.list_runs(path)
    before = store.run_attrs(path, run_id)
    monkeypatch.setattr(launcher, "_launch", lambda *a, **k: pytest.fail("a cluster was started for a finished run"))
    again = run_sweep(cfg, path, progress=False)
    assert again.counts == {"diverged": 1} and again.skipped == [run_id]
    assert store.run_attrs(path, run_id) == before


def test_a_finished_run_of_a_points_id_but_another_config_is_not_skipped_as_that_point(tmp_path, threaded_cluster):
    # A run recorded under a point's id with another config (dynamics run --run-id) was counted
    # finished, and status and open_sweep gave it the point's values; then its task refused it,
    # after every other point had trained. Now refused before any point trains.
    path = str(tmp_path / "s.zarr")
    cfg = from_dict(tiny({"model.init_scale": [1.0, 2.0]}))
    point, other = expand_grid(cfg)
    train_run(with_values(point.cfg, {"train.lr": 0.01}), path, point.run_id)
    with pytest.raises(store.StoreError, match=rf"sweep point model.init_scale=1.0: run {point.run_id} in .* was "
                                               r"recorded with a different config \(train.lr: recorded 0.01, here "
                                               r"0.001; dynamics run --run-id\?\); refusing to mix them$"):
        run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.list_runs(path) == [point.run_id] and store.read_sweep_index(path) is None  # nothing trained
    assert store.run_attrs(path, point.run_id)["config"]["train"]["lr"] == 0.01  # left as it was


def _two_points_the_first_interrupted(tmp_path):
    """A store path, a two-point grid and its points, the first trained 8 steps and interrupted."""
    from tests.conftest import interrupt_at

    path = str(tmp_path / "s.zarr")
    cfg = from_dict(tiny({"model.init_scale": [1.0, 2.0]}))
    point, other = expand_grid(cfg)
    with pytest.raises(KeyboardInterrupt):
        train_run(point.cfg, path, point.run_id, progress=interrupt_at(8))
    return path, cfg, point, other


def test_a_point_resumed_by_the_sweep_says_so_in_its_line_and_the_summary(tmp_path, threaded_cluster, capsys):
    # `dynamics run` says "(resumed at step N)"; the sweep's line said just "completed", and its
    # summary counted the run with the others, as if trained whole by this launch.
    path, cfg, point, other = _two_points_the_first_interrupted(tmp_path)
    at = store.checkpoint_step(path, point.run_id)
    assert at
    summary = run_sweep(cfg, path, scheduler=threaded_cluster, progress=None)
    assert summary.resumed == {point.run_id: at}
    assert re.match(r"sweep: 2 runs: 2 completed \(1 resumed from a checkpoint\) in ", summary.lines()[0])
    err = capsys.readouterr().err
    assert f"[sweep] {point.run_id} completed (resumed at step {at}) (" in err
    assert re.search(rf"\[sweep\] {other.run_id} completed \(\d/2 finished\)", err)  # trained whole: no note


def test_a_point_whose_checkpoint_is_lost_is_refused_before_any_point_trains(tmp_path, threaded_cluster):
    path, cfg, point, _ = _two_points_the_first_interrupted(tmp_path)
    store.checkpoint_path(path, point.run_id).unlink()
    with pytest.raises(store.StoreError, match=rf"run {point.run_id} in .* recorded training up to step \d+, but "
                                               r"its checkpoint .* is missing"):
        run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.list_runs(path) == [point.run_id]  # the other point was not trained


def test_a_point_recorded_on_other_data_is_refused_before_any_point_trains(tmp_path, threaded_cluster):
    # Its task refused it (train_run), but only after every other point had trained: exit 1 then.
    from dynamics.tasks import data_hash

    path, cfg, point, other = _two_points_the_first_interrupted(tmp_path)
    store.update_run_attrs(path, point.run_id, data_hash="0000aaaa0000")  # as if made from another stdlib
    with pytest.raises(store.StoreError, match=rf"sweep point model.init_scale=1.0: run {point.run_id} in .* was "
                                               r"recorded on data with hash 0000aaaa0000, but this machine makes "):
        run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.list_runs(path) == [point.run_id]  # the other point was not trained

    # Finished there, it is skipped (its recordings are its own), but the other point, on the same
    # data here, would have trained on this machine's: one grid, two datasets.
    store.update_run_attrs(path, point.run_id, status="completed")
    with pytest.raises(store.StoreError, match=rf"sweep point model.init_scale=2.0: this machine makes data with hash "
                                               rf"{data_hash(other.cfg)} for task 'induction', but point "
                                               rf"model.init_scale=1.0 \(run {point.run_id}\) finished in .* on data "
                                               r"with hash 0000aaaa0000 "):
        run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.list_runs(path) == [point.run_id]
    store.update_run_attrs(path, point.run_id, data_hash=data_hash(point.cfg))
    assert run_sweep(cfg, path, scheduler=threaded_cluster, progress=False).ok


def _run_point_finished_elsewhere(cfg, path, run_id, values, token="", cwd=None, data=None):
    return {"run_id": run_id, "status": "completed", "steps_done": 0, "skipped": True, "error": None,
            "traceback": None, "waited": None}  # as run_point says of a run another process has just finished


def test_a_point_finished_elsewhere_before_its_task_reached_it_is_counted_as_not_retrained(tmp_path, monkeypatch,
                                                                                           threaded_cluster):
    # Its line said "(already finished)", but the summary said "1 completed" as if it had trained.
    import dynamics.sweep.task

    monkeypatch.setattr(dynamics.sweep.task, "run_point", _run_point_finished_elsewhere)
    cfg = from_dict(tiny())
    summary = run_sweep(cfg, str(tmp_path / "s.zarr"), scheduler=threaded_cluster, progress=False)
    assert summary.ok and summary.skipped == [cfg.run_id()] and not summary.waited
    assert summary.lines()[0].startswith("sweep: 1 run: 1 completed (1 already finished, not retrained) in ")


def _orphan_finishes_then_refused(expected, run_id, function, args):
    from dynamics import provenance

    _REAL_CHECK(expected, run_id, function, args)  # the orphaned task, training the run to the end
    return {"run_id": run_id, "status": "failed", "steps_done": 0, "skipped": False, "traceback": None,
            "waited": None, "error": provenance.other_code("1" * 64, expected), "refused": "code"}


def test_a_point_refused_for_other_code_after_another_process_finished_it_is_not_failed(tmp_path, monkeypatch,
                                                                                        threaded_cluster):
    # A relaunch's task queued behind a killed launcher's orphaned one, on a worker whose code had
    # changed since: refused once the orphan had completed the run, and summarised "failed" for a
    # run the store held completed. (The task payload names its function by module and name.)
    from dynamics import provenance

    monkeypatch.setattr(provenance, "same_code_or_refuse", _orphan_finishes_then_refused)
    cfg = from_dict(tiny())
    path = str(tmp_path / "s.zarr")
    summary = run_sweep(cfg, path, scheduler=threaded_cluster, progress=False)
    assert store.run_attrs(path, cfg.run_id())["status"] == "completed"
    assert summary.ok and summary.skipped == [cfg.run_id()] and not summary.failed, summary.lines()


SUBMITTED_CWDS: list = []


def _run_point_recording_cwd(cfg, path, run_id, values, token="", cwd=None, data=None):
    SUBMITTED_CWDS.append(cwd)  # module-level, so the in-process worker finds this very list
    return {"run_id": run_id, "status": "completed", "steps_done": 0, "skipped": False, "error": None,
            "traceback": None}  # what run_point does with it is the test's second half


def test_a_relative_teacher_path_is_to_the_launchers_directory(tmp_path, monkeypatch, threaded_cluster):
    # On an external cluster a worker runs in its own working directory: the student's relative
    # teacher path failed there "not found", or named another store that happened to be there.
    launcher, worker = tmp_path / "launcher", tmp_path / "worker"
    launcher.mkdir()
    worker.mkdir()
    monkeypatch.chdir(launcher)
    teacher = train_run(from_dict(tiny()), "runs/teacher.zarr")
    raw = tiny()
    raw["intervene"] = {"distill": {"teacher": "runs/teacher.zarr"}}
    student = from_dict(raw)  # no axes: the sweep's one point is this config
    path = str(launcher / "s.zarr")

    # the launcher sends its directory with each task (the threaded worker shares this process's cwd);
    # it names the task's function by module and name, looked up on the worker
    import dynamics.sweep.task

    SUBMITTED_CWDS.clear()
    monkeypatch.setattr(dynamics.sweep.task, "run_point", _run_point_recording_cwd)
    summary = run_sweep(student, path, scheduler=threaded_cluster, progress=False)
    assert summary.ok and SUBMITTED_CWDS == [str(launcher)], (summary.lines(), SUBMITTED_CWDS)

    # and the task resolves against it, wherever the worker runs
    monkeypatch.chdir(worker)
    out = run_point(student, path, student.run_id(), {}, "", str(launcher))
    assert out["status"] == "completed", out["error"]
    attrs = store.run_attrs(path, student.run_id())
    assert attrs["config"]["intervene"]["distill"]["teacher"] == "runs/teacher.zarr"  # as written: the same run id
    distilled = attrs["interventions"]["distill"]
    assert distilled["teacher_store"] == str(launcher / "runs" / "teacher.zarr")
    assert distilled["teacher_run"] == teacher.run_id


def test_a_sweep_with_a_point_finished_counts_both_in_its_log_lines(tmp_path, threaded_cluster, capsys):
    # one of two points finished before: "1 run(s) to train, 1 of 2 already finished", and the
    # run that ends is the second of 2 (not "2/1", nor "2 run(s) to train")
    path = str(tmp_path / "s.zarr")
    run_sweep(from_dict(tiny({"train.seed": [0]})), path, scheduler=threaded_cluster, progress=False)
    capsys.readouterr()
    run_sweep(from_dict(tiny({"train.seed": [0, 1]})), path, scheduler=threaded_cluster, progress=None)  # a log
    err = capsys.readouterr().err
    assert f"[sweep] 1 run(s) to train on the cluster at {threaded_cluster}, 1 of 2 already finished; " in err, err
    [ended] = [line for line in err.splitlines() if line.endswith("finished)") and " completed " in line]
    assert ended.endswith("completed (2/2 finished)"), err


def test_a_sweep_names_an_index_entry_that_is_no_run_id_and_keeps_it(tmp_path, capsys):
    # A hand-edited '../evil' was kept in the index as an earlier sweep's point, never trained,
    # and the sweep said nothing of it. Every point finished here: no cluster is started.
    cfg = from_dict(tiny())
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path)
    index = store.read_sweep_index(path) or {"axes": [], "runs": {}}
    store.write_sweep_index(path, {**index, "runs": {**index.get("runs", {}), "../evil": {}}})
    capsys.readouterr()
    assert run_sweep(cfg, path, progress=False).ok
    assert capsys.readouterr().err.splitlines() == [
        f"dynamics: note: {path}: the sweep index lists '../evil', which is no run id (use ASCII letters, digits, '.', "
        "'_' or '-', not starting with a symbol): not a sweep point, and no sweep trains it; delete it from the "
        "\"sweep\" attribute's runs in the store's root zarr.json"]
    assert "../evil" in store.read_sweep_index(path)["runs"]  # nothing in a store is dropped
