"""How the launcher reports runs whose task did not simply return (cancelled on the cluster, its
workers dead), what a failing task may and may not write into a run, and which points it holds
to the memory check or to a kept checkpoint, each on a real store."""

import os
import shutil
import threading
from pathlib import Path

import pytest

from dynamics import store
from dynamics.budget import MEMORY_ENV, DoesNotFit
from dynamics.config import from_dict
from dynamics.sweep import cancel
from dynamics.sweep.cancel import given_up, killed_reason
from dynamics.sweep.launcher import check_points, default_workers
from dynamics.sweep.task import _record_failure, run_point
from dynamics.train import train_run
from tests.test_sweep import tiny


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("outcomes") / "s.zarr"
    return path, train_run(from_dict(tiny()), str(path)).run_id


@pytest.fixture
def copy(trained, tmp_path):
    path, run_id = trained
    shutil.copytree(path, tmp_path / "s.zarr")
    return str(tmp_path / "s.zarr"), run_id


def test_dasks_reasons_for_a_cancelled_task_are_said_once_and_plainly():
    assert cancel.reason(cancel.SCHEDULER_LOST, "Please check your connection and re-run your work.") == \
        "the launcher lost its scheduler"
    assert cancel.reason("cancelled-by-user", "by client abc") == "cancelled-by-user: by client abc"
    assert cancel.reason("cancelled-by-user") == "cancelled-by-user"


@pytest.mark.parametrize("status, trained_on, still, want, says", [
    ("completed", False, False, "completed", "it had finished before its task was cancelled on the cluster (why)"),
    ("diverged", True, False, "diverged", "it was trained on after its task was cancelled on the cluster (why), and "
                                          "finished"),
    ("failed", False, False, "failed", "its task was cancelled on the cluster (why), and then recorded failed"),
    ("running", False, True, "cancelled", "a process still trains it (its worker, or one its task waited for)"),
    ("interrupted", True, False, "cancelled", "it was trained on and stopped before the end; the same command "
                                              "resumes it"),
    ("interrupted", False, False, "cancelled", "its task was cancelled on the cluster (why); the same command "
                                               "resumes it"),
])
def test_a_cancelled_run_is_reported_by_what_its_store_says(copy, status, trained_on, still, want, says):
    path, run_id = copy
    store.update_run_attrs(path, run_id, status=status)
    r = cancel.outcome(path, run_id, "why", trained_on=trained_on, still=still)
    assert r["status"] == want and r["run_id"] == run_id
    assert says in (r.get("after_cancel") if want in ("completed", "diverged") else r["error"])
    assert (r["error"] is None) == (want in ("completed", "diverged"))


def test_a_cancelled_run_never_started_is_cancelled(tmp_path):
    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    r = cancel.outcome(path, "rnever", "why", trained_on=False)
    assert r["status"] == "cancelled" and r["error"].endswith("the same command resumes it")


def test_a_task_refused_a_run_of_another_config_leaves_that_run_as_it_was(copy):
    # `dynamics run --run-id` put another config under the point's id: the task is refused as
    # `dynamics run` would be, and that run, interrupted and resumable, is not the task's to fail
    path, run_id = copy
    store.update_run_attrs(path, run_id, status="interrupted")
    other = from_dict(tiny(train={"seed": 5}))
    out = run_point(other, path, run_id, {"train.seed": 5})
    assert out["status"] == "failed" and "was recorded with a different config" in out["error"]
    assert store.run_attrs(path, run_id)["status"] == "interrupted"


def test_a_late_failure_keeps_the_traceback_the_run_recorded(copy):
    path, run_id = copy
    store.update_run_attrs(path, run_id, status="failed", traceback="Traceback: where it failed")
    _record_failure(path, run_id, "KilledWorker: the worker training it died once")
    assert store.run_attrs(path, run_id)["traceback"] == "Traceback: where it failed"


def test_a_failure_of_a_run_not_in_the_store_writes_nothing(tmp_path):
    path = tmp_path / "s.zarr"
    store.init_store(str(path))
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    _record_failure(str(path), "rnever", "KilledWorker: the worker training it died once")
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before


def test_a_run_given_up_on_is_failed_only_if_it_began_this_launch(copy):
    # Dask counts a worker's death against every task it held, the one queued behind the running
    # run too: the summary said that run failed ("the worker training it died 12 times") and the
    # store marked it failed, an interrupted run this launch never trained.
    path, run_id = copy
    store.update_run_attrs(path, run_id, status="interrupted")
    before = {p: p.read_bytes() for p in sorted((Path(path) / "runs").rglob("*")) if p.is_file()}
    starts = store.run_attrs(path, run_id)["starts"]
    r = given_up(path, run_id, starts, 12, "tcp://w:1")
    assert r["status"] == "cancelled" and r["error"] == (
        "not trained: the workers its task waited on died 12 times before it began (last tcp://w:1; a run beside it "
        "on the same worker may have crashed them); the same command resumes it")
    assert {p: p.read_bytes() for p in sorted((Path(path) / "runs").rglob("*")) if p.is_file()} == before
    r = given_up(path, "rnever", None, 1, "tcp://w:1")  # no group made
    assert r["status"] == "cancelled" and r["error"].endswith("died once before it began (last tcp://w:1; a run beside "
                                                              "it on the same worker may have crashed them); the same "
                                                              "command trains it")
    assert not (Path(path) / "runs" / "rnever").exists()
    # begun this launch (its starts count grew): failed, and recorded so
    r = given_up(path, run_id, starts - 1, 3, "tcp://w:1")
    assert r["status"] == "failed" and r["error"] == killed_reason(3, "tcp://w:1", 1)
    assert store.run_attrs(path, run_id)["status"] == "failed"
    # "the worker training it died 3 times" of a run one session of which began: the other two
    # deaths came with its task queued behind another run, which may be the one that crashes them
    assert r["error"] == ("KilledWorker: the worker training it died once, and 2 times more with it queued behind "
                          "another run (last tcp://w:1); the same command resumes it")
    assert given_up(path, run_id, starts - 2, 2, "w")["error"].startswith("KilledWorker: the worker training it died "
                                                                          "2 times (last w)")
    assert given_up(path, run_id, None, 1, "w")["error"].startswith("KilledWorker: the worker training it died once "
                                                                    "(last w)")  # made this launch


def test_a_killed_workers_reason_counts_every_death():
    assert killed_reason(1, "tcp://w:1", 1) == ("KilledWorker: the worker training it died once (last tcp://w:1); the "
                                                 "same command resumes it")
    assert killed_reason(8, "tcp://w:1", 8).startswith("KilledWorker: the worker training it died 8 times (last ")
    assert killed_reason(8, "w", 3).startswith("KilledWorker: the worker training it died 3 times, and 5 times more "
                                               "with it queued behind another run (last w)")
    # how many came while it trained not known: not all called "training it"
    assert killed_reason(2, "w") == ("KilledWorker: the workers holding its task died 2 times (with it training or "
                                     "queued; last w); the same command resumes it")


def test_a_point_finished_in_the_store_needs_no_memory_but_the_others_do(copy, monkeypatch):
    # a store copied from a larger machine, its sweep widened by a seed: only the new point is refused
    path, run_id = copy
    monkeypatch.setenv(MEMORY_ENV, "0.000001")  # 1,000 bytes
    [done] = check_points(from_dict(tiny()), path)
    assert done.run_id == run_id
    with pytest.raises(DoesNotFit, match=r"^sweep point train.seed=1: config needs at least"):
        check_points(from_dict(tiny({"train.seed": [0, 1]})), path)


def test_one_worker_per_usable_core():
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert default_workers() == usable


def test_a_cluster_without_workers_is_said_once_and_again_when_one_is_back():
    # Said at every look (each WORKER_CHECK_EVERY seconds), the notice buried the sweep's own lines
    # for as long as the cluster had no worker.
    import io
    import logging

    from distributed import Client, LocalCluster

    from dynamics.sweep.progress import _Display

    log = io.StringIO()
    display = _Display(1, 0, stream=log)
    display.step("ra", 3, 12, 1.0)  # reported before its worker died
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        watch = cancel.WorkerWatch(client, every=5.0)
        watch.check(10.0, display)
        watch.check(20.0, display)  # still none: nothing new to say
        cluster.scale(1)
        client.wait_for_workers(1, timeout=60)
        watch.check(22.0, display)  # sooner than `every` after the last look: not looked
        assert len(log.getvalue().splitlines()) == 1
        watch.check(23.0, display, force=True)  # the launcher's look when a task ends: at once
        watch.check(30.0, display)
        watch.check(40.0, display)
    assert log.getvalue().splitlines() == [
        "[sweep] no worker is connected to the scheduler: the runs wait for one (Ctrl-C stops the sweep; its runs "
        "stay resumable)",
        "[sweep] 1 worker(s) connected again",
    ]
    assert display.steps == {}  # nothing trains without a worker, whatever the last reports said


def test_ctrl_c_on_a_cluster_without_workers_does_not_wait_out_the_grace(monkeypatch, capsys):
    # No worker: no run trains to be stopped, and no queued task can start to see the stop, so the
    # launcher waited the whole STOP_GRACE (30 s) for tasks that could never settle.
    import logging

    from distributed import Client, LocalCluster


    looks = []
    real = cancel.settled
    monkeypatch.setattr(cancel, "settled", lambda *a, **k: looks.append(1) or real(*a, **k))
    monkeypatch.setattr(cancel, "STOP_GRACE", 10.0)  # 20 looks of 0.5 s before the change
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        queued = client.submit(sum, [1, 2], key="dynamics-train-rq-0-1", pure=False)
        assert cancel.stop_running(client, None, {queued: "rq"}, lambda f, run_id: None, {}) is False
        assert len(looks) == 1
        assert queued.status == "cancelled"
    assert "dynamics: stopping the sweep" in capsys.readouterr().err


_HELD = threading.Event()


def _deaf_run(seconds: float) -> bool:
    """A task that does not see the sweep's stop event (on an in-process worker: _HELD is this one)."""
    return _HELD.wait(seconds)


def test_a_second_ctrl_c_while_stopping_is_an_abort(capsys):
    # A real SIGINT while the launcher waits for a run that does not stop: stop_running says so,
    # and the launcher then kills the workers rather than waiting out the cluster's close.
    import logging
    import signal

    from distributed import Client, LocalCluster

    _HELD.clear()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                      scheduler_kwargs={"dashboard_address": ":0"}, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        training = client.submit(_deaf_run, 60, key="dynamics-train-rt-0-1", pure=False)
        second = threading.Timer(0.5, signal.raise_signal, (signal.SIGINT,))
        second.start()
        try:
            assert cancel.stop_running(client, None, {training: "rt"}, lambda f, run_id: None, {}) is True
        finally:
            second.cancel()
            _HELD.set()
    assert "Ctrl-C again to abort at once" in capsys.readouterr().err


def test_kill_workers_ends_the_embedded_clusters_worker_processes_mid_task():
    # Closing a cluster whose worker trains waits out the nanny's timeout while it trains on:
    # after a second Ctrl-C the workers are killed instead, and the close that follows is clean.
    import time

    from distributed import Client

    from dynamics.sweep.launcher import local_cluster

    def state(pid: int) -> str:  # "R", "S", ...; "Z" (killed, not yet reaped) or "gone"
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return "gone"

    cluster = local_cluster(1)
    try:
        with Client(cluster) as client:
            busy = client.submit(time.sleep, 60, pure=False)
            while busy.status == "pending" and not client.processing()[next(iter(client.processing()))]:
                time.sleep(0.05)  # until the task is on the worker
            [pid] = [nanny.pid for nanny in cluster.workers.values()]
            assert state(pid) not in ("Z", "gone")
            cancel.kill_workers(cluster)
            deadline = time.monotonic() + 60  # a liveness bound, not a speed check
            while state(pid) not in ("Z", "gone") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert state(pid) in ("Z", "gone")
    finally:
        cluster.close()
    cancel.kill_workers(cluster)  # its workers already gone: nothing to do, nothing raised


def test_a_finished_point_whose_checkpoint_was_deleted_is_skipped(copy):
    # deleting a finished run's checkpoint saves space and loses nothing: it is never trained again
    from dynamics.sweep import run_sweep

    path, run_id = copy
    shutil.rmtree(os.path.join(path, "checkpoints", run_id))
    summary = run_sweep(from_dict(tiny()), path, progress=False)  # nothing to train: no cluster
    assert summary.skipped == [run_id] and summary.counts == {"completed": 1} and summary.ok


def test_a_late_failure_record_never_overwrites_a_finished_run(tmp_path):
    # A task failing after another process finished its run (or while it trains it, holding the
    # lock) must leave that run as it is: its failure goes to the sweep summary only. Likewise the
    # launcher's marking of runs left "running" after Ctrl-C: a locked one is another's, live.
    from dynamics.sweep.cancel import mark_interrupted
    from dynamics.sweep.task import _record_failure

    cfg = from_dict(tiny())
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path)
    _record_failure(path, cfg.run_id(), "Traceback: late")
    attrs = store.run_attrs(path, cfg.run_id())
    assert attrs["status"] == "completed" and not attrs.get("traceback")
    store.update_run_attrs(path, cfg.run_id(), status="running")
    with store.run_lock(path, cfg.run_id()):
        _record_failure(path, cfg.run_id(), "Traceback: late")
        mark_interrupted(path, [cfg.run_id()])
    assert store.run_attrs(path, cfg.run_id())["status"] == "running"
    mark_interrupted(path, [cfg.run_id()])  # nobody holds it now: it was cut short
    assert store.run_attrs(path, cfg.run_id())["status"] == "interrupted"


def test_a_point_whose_training_the_store_holds_under_another_id_is_refused_before_any_trains(copy):
    from dynamics.sweep import run_sweep

    path, run_id = copy
    # seed 0's point is the stored run's training with d_head written as d_model / n_heads
    grid = from_dict(tiny({"model.d_head": [8], "train.seed": [5, 0]}))
    with pytest.raises(store.StoreError, match=rf"^sweep point model.d_head=8, train.seed=0: {path} holds this "
                                               rf"training already: run {run_id} there trains the same data and "
                                               r"model: its config differs only in model.d_head = 0 against 8, "):
        run_sweep(grid, path, progress=False)
    assert store.list_runs(path) == [run_id]  # seed 5's point, listed first, did not train either


def test_a_point_whose_twin_another_process_recorded_since_the_launch_is_refused_as_its_group_is_made(copy):
    # The launcher checks the store once, before any point trains; a `dynamics run` of a point's
    # training written another way, recorded after that, was trained again by the point (3 of 3
    # tries). The task checks again under the store's lock: the point fails, nothing written.
    path, run_id = copy
    point = from_dict(tiny(model={"d_head": 8}))  # the stored run's training, d_head as d_model / n_heads
    out = run_point(point, path, point.run_id(), {"model.d_head": 8}, "launch-1")
    assert out["status"] == "failed" and out["traceback"] is not None
    assert out["error"].startswith(f"TwinRefused: sweep point model.d_head=8: {path} holds this training already: run "
                                   f"{run_id} there trains the same data and model: its config differs only in "
                                   "model.d_head = 0 against 8, ")
    assert store.list_runs(path) == [run_id]  # not marked failed in the store: it was never made there


def test_a_point_refused_as_its_group_is_made_leaves_the_sweep_index_not_pending_for_ever(tmp_path, monkeypatch):
    # The launcher lists the points in the sweep index before any trains: one refused later, under
    # the store's lock, for a twin another process recorded meanwhile, showed "pending" for ever.
    import dynamics.sweep.launcher as launcher
    from dynamics.status import status_table
    from dynamics.sweep import run_sweep

    path = str(tmp_path / "s.zarr")
    grid = from_dict(tiny({"model.d_head": [8], "train.seed": [5, 0]}))  # seed 0: the default d_head's twin
    twin = from_dict(tiny())

    def another_process_meanwhile(points, store_path):  # as if it recorded right after the launcher's check
        train_run(twin, store_path)

    monkeypatch.setattr(launcher, "refuse_sweep_twins", another_process_meanwhile)
    summary = run_sweep(grid, path, workers=1, progress=False)
    (refused,) = summary.failed
    assert summary.errors[refused].startswith(f"TwinRefused: sweep point model.d_head=8, train.seed=0: {path} holds "
                                              f"this training already: run {twin.run_id()} there trains the same data")
    assert refused not in store.list_runs(path)  # nothing made
    assert refused not in store.read_sweep_index(path)["runs"]  # nor listed
    _, rows, _ = status_table(path)
    assert [row[0] for row in rows if refused in row[0] or "pending" in row] == []


def test_a_point_the_store_holds_under_a_run_id_given_by_name_is_refused_in_words_that_fit(tmp_path):
    # the same config under `--run-id baseline`: the line read "its config differs only in , which
    # induction does not read; sweep the setting as that run has it", naming no setting
    from dynamics.sweep import run_sweep

    path = str(tmp_path / "s.zarr")
    train_run(from_dict(tiny()), path, "baseline")
    with pytest.raises(store.StoreError) as e:
        run_sweep(from_dict(tiny({"train.seed": [5, 0]})), path, progress=False)
    assert str(e.value) == (f"sweep point train.seed=0: {path} holds this training already: run baseline there "
                            "trains this very config, under a run id of its own (given with --run-id); give another "
                            "--out")
    assert store.list_runs(path) == ["baseline"]


def test_a_failure_record_leaves_a_run_another_process_finished_alone(tmp_path):
    from tests.test_store import write_run

    path = str(tmp_path / "s.zarr")
    for rid, status in (("done", "completed"), ("div", "diverged"), ("live", "running")):
        write_run(path, rid, attrs={"status": status})
        _record_failure(path, rid, "Traceback: boom")
    got = {rid: store.run_attrs(path, rid)["status"] for rid in ("done", "div", "live")}
    assert got == {"done": "completed", "div": "diverged", "live": "failed"}


def test_an_interrupted_sweep_marks_only_the_runs_still_marked_running(tmp_path):
    from dynamics.sweep.cancel import mark_interrupted
    from tests.test_store import write_run

    path = str(tmp_path / "s.zarr")
    for rid, status in (("a", "running"), ("b", "failed"), ("c", "diverged"), ("d", "interrupted")):
        write_run(path, rid, attrs={"status": status})
    mark_interrupted(path, ["a", "b", "c", "d", "not-there"])
    got = {rid: store.run_attrs(path, rid)["status"] for rid in "abcd"}
    assert got == {"a": "interrupted", "b": "failed", "c": "diverged", "d": "interrupted"}
    assert "not-there" not in store.list_runs(path)


@pytest.mark.parametrize("status, finished", [("completed", True), ("diverged", True), ("failed", False),
                                              ("interrupted", False), ("running", False)])
def test_a_run_is_finished_elsewhere_only_if_the_store_holds_it_finished(tmp_path, status, finished):
    from tests.test_store import write_run

    path = str(tmp_path / "s.zarr")
    write_run(path, "r1", attrs={"status": status})
    r = cancel.finished_elsewhere(path, "r1")
    assert (r is not None and r["skipped"] is True and r["status"] == status) if finished else r is None
    assert cancel.finished_elsewhere(path, "absent") is None


def test_a_given_up_runs_reason_counts_its_workers_deaths():
    assert "died once (last tcp://w:1)" in killed_reason(1, "tcp://w:1", 1)
    assert "died 2 times (last tcp://w:1)" in killed_reason(2, "tcp://w:1", 2)
    assert "died 3 times" in killed_reason(3, "w")
