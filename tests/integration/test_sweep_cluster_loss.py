"""A sweep whose cluster loses its scheduler, or all its workers, mid-run: a real scheduler and
worker as subprocesses, the launcher through the CLI, each test with a cluster of its own to
break.

Dask cancels every future of a client that lost its scheduler, but the worker's thread trains on:
the summary called such runs cancelled while the store had them completed seconds later. And a
cluster left without workers showed the dead worker's run as running, step frozen, for ever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from dynamics import store
from dynamics.config import load_config
from dynamics.sweep import expand_grid
from tests.integration.test_sweep_distributed import ENV, ROOT, _parses, stop_all, wait_until, write_config

pytestmark = pytest.mark.distributed


@pytest.fixture
def cluster(tmp_path):
    """A scheduler and one single-threaded worker, no nanny; ``spawn_worker()`` adds another."""
    d = tmp_path / "dask"
    d.mkdir()
    procs: list[subprocess.Popen] = []
    logs = []
    scheduler_file = d / "scheduler.json"

    def spawn(*args: str) -> subprocess.Popen:
        logs.append(open(d / f"proc{len(procs)}.log", "w"))  # noqa: SIM115 - closed at the end
        p = subprocess.Popen([sys.executable, "-m", "dask", *args], cwd=d, env=ENV, stdout=logs[-1],
                             stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    def spawn_worker() -> subprocess.Popen:
        return spawn("worker", "--nthreads", "1", "--no-nanny", "--no-dashboard", "--memory-limit", "0",
                     "--scheduler-file", str(scheduler_file))

    try:
        scheduler = spawn("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                          "--scheduler-file", str(scheduler_file))
        wait_until(lambda: _parses(scheduler_file), "the scheduler file")
        worker = spawn_worker()
        yield SimpleNamespace(scheduler=scheduler, worker=worker, file=str(scheduler_file), spawn_worker=spawn_worker,
                              procs=procs, logs=logs)
    finally:
        stop_all(procs, logs)


def sweep_through(config, out, scheduler_file: str, log_path, run_id: str, then) -> tuple[int, str]:
    """Launch `dynamics sweep` on the cluster, call ``then()`` once run ``run_id`` is mid-way, and
    return the launcher's exit status and log (plain lines, not a terminal: a batch job's log)."""
    cmd = [sys.executable, "-m", "dynamics", "sweep", str(config), "--out", str(out), "--scheduler", scheduler_file]
    with open(log_path, "w") as log:
        launcher = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: training(out, run_id), f"run {run_id} mid-way", limit=120)
            then()
            rc = launcher.wait(timeout=180)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    return rc, log_path.read_text()


def training(out, run_id: str) -> bool:
    """Whether run ``run_id`` is being trained now and has written a checkpoint (so, mid-run)."""
    return bool(store.run_lock_held(str(out), run_id)) and store.has_checkpoint(str(out), run_id)


def test_a_lost_scheduler_reports_each_run_by_what_its_store_says(cluster, tmp_path):
    config = write_config(tmp_path / "sweep.toml", {"train.seed": [0, 1]}, steps=1200)
    first, queued = expand_grid(load_config(config))
    out = tmp_path / "s.zarr"
    rc, text = sweep_through(config, out, cluster.file, tmp_path / "sweep.log", first.run_id,
                             lambda: cluster.scheduler.send_signal(signal.SIGKILL))
    assert rc == 1, text  # the queued point never ran
    lost = "its task was cancelled on the cluster (the launcher lost its scheduler)"
    assert f"[sweep] {queued.run_id} cancelled: {lost}; the same command resumes it" in text, text
    assert f"[sweep] {first.run_id} waiting: {lost}, but the run is still being trained (by its worker" in text, text
    # The worker finished the run it was training: reported so, and counted finished, not cancelled
    assert store.run_attrs(str(out), first.run_id)["status"] == "completed"
    then = f"it was trained on after {lost}, and finished"
    assert f"[sweep] {first.run_id} completed: {then} (1/2 finished)" in text, text
    assert "sweep: 2 runs: 1 completed, 1 cancelled" in text, text
    assert f"  finished {first.run_id} [train.seed=0]: {then}\n" in text, text
    assert "Please check your connection" not in text  # Dask's advice, once per run, is not repeated
    assert not store.has_run(str(out), queued.run_id)


def test_a_cluster_without_workers_says_so_and_the_run_resumes_on_a_new_one(cluster, tmp_path):
    config = write_config(tmp_path / "sweep.toml", {"train.seed": [0]}, steps=1200)
    (point,) = expand_grid(load_config(config))
    out = tmp_path / "s.zarr"
    log_path = tmp_path / "sweep.log"

    def kill_the_worker_then_start_another() -> None:
        os.kill(cluster.worker.pid, signal.SIGKILL)
        wait_until(lambda: "no worker is connected" in log_path.read_text(), "the launcher's notice", limit=60)
        cluster.spawn_worker()

    rc, text = sweep_through(config, out, cluster.file, log_path, point.run_id, kill_the_worker_then_start_another)
    assert rc == 0, text
    assert ("[sweep] no worker is connected to the scheduler: the runs wait for one (Ctrl-C stops the sweep; "
            "its runs stay resumable)") in text
    assert "[sweep] 1 worker(s) connected again" in text
    assert text.index("no worker is connected") < text.index("connected again") < text.index(f"{point.run_id} completed")
    attrs = store.run_attrs(str(out), point.run_id)
    assert attrs["status"] == "completed" and attrs["starts"] == 2, attrs  # resumed from its checkpoint


def test_ctrl_c_after_the_scheduler_is_gone_stops_without_a_traceback(capsys):
    # Ctrl-C while the launcher waited for a run its worker trained on after the scheduler was
    # lost (the wait's own line offers it): stopping set the stop event and cancelled through a
    # closed client, and AttributeError or ClosedClientError came out as a traceback, not exit 130.
    from distributed import Client, Event, LocalCluster

    from dynamics.sweep.cancel import stop_running

    cluster = LocalCluster(n_workers=0, processes=False, dashboard_address=None)
    client = Client(cluster, timeout=30)
    stop = Event("dynamics-sweep-stop-test", client=client)
    client.close()
    cluster.close()
    assert client.status != "running"
    assert stop_running(client, stop, {}, lambda f, run_id: None, {}) is False  # returns, raising nothing
    assert "stopping the sweep" in capsys.readouterr().err
