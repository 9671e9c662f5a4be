"""A sweep on a real Dask cluster: scheduler and workers as subprocesses, launcher via the CLI.

One worker is SIGKILLed mid-run; the sweep must still complete with whole arrays and the
killed run resumed from its checkpoint. Then: a rerun retrains nothing, a failing run does
not stop the others, a second launcher on a locked store is refused, and a run whose last
try's worker dies too is recorded failed and resumed by the next launch.

The scheduler gives a task up after one worker death (``allowed-failures`` 0): the launcher's
own resubmission (``MAX_RESUBMITS``) is what resumes a killed run here, and one kill is enough
to exhaust it where a test sets ``MAX_RESUBMITS`` to 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dynamics import store
from dynamics.config import load_config
from dynamics.sweep import SweepLockError, lock_path, run_sweep
from tests.conftest import cli_in_process

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    "OMP_NUM_THREADS": "1",
    "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "error",
    # fsspec's own configuration mechanism (FSSPEC_<PROTOCOL>, read at import): the local://
    # filesystem makes parent directories as object stores implicitly do.
    "FSSPEC_LOCAL": '{"auto_mkdir": true}',
}
STEPS = 150
WORKERS = 3
"""Two tests each SIGKILL one; the last one does the other tests' runs."""

CONFIG = {
    "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "induction", "min_period": 2, "max_period": 6},
    "train": {"steps": STEPS, "batch_size": 8, "warmup_steps": 10, "eval_batches": 1},
    "record": {"dense_until": 4, "every": 20, "n_probe": 2, "eval_batch_size": 4},
}


def write_config(path: Path, sweep: dict, steps: int = STEPS) -> Path:
    lines = []
    for section, table in {**CONFIG, "train": {**CONFIG["train"], "steps": steps}, "sweep": sweep}.items():
        lines.append(f"[{section}]")
        lines += [f'"{k}" = {json.dumps(v)}' for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_until(cond, what: str, limit: float = 90.0, every: float = 0.1):
    """Poll `cond` until it returns something truthy; fail (not a timing assertion) if it never does."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"gave up waiting for {what}")


def _parses(path: Path) -> bool:
    """Whether `path` holds whole JSON: the scheduler writes its file in place, not by a rename,
    and a client reading it half-written failed on a JSON error."""
    try:
        json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return False
    return True


def stop_all(procs: list[subprocess.Popen], logs: list) -> None:
    """Kill whatever is still running, reap everything, close the log files."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    for f in logs:
        f.close()


def sweep_cmd(config: Path, out: Path, address: str) -> list[str]:
    return [sys.executable, "-m", "dynamics", "sweep", str(config), "--out", str(out), "--scheduler", address]


# Load torch and dynamics.train on the workers during set-up. Source text: a function of this
# test module would not unpickle there.
WARM = "import torch, dynamics.train"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from distributed import Client

    d = tmp_path_factory.mktemp("dask")
    scheduler_file = d / "scheduler.json"
    procs: list[subprocess.Popen] = []
    logs = []
    client = None

    def spawn(*args: str, env: dict = ENV) -> subprocess.Popen:
        logs.append(open(d / f"proc{len(procs)}.log", "w"))  # noqa: SIM115 - closed at the end
        p = subprocess.Popen([sys.executable, "-m", "dask", *args], cwd=d, env=env, stdout=logs[-1],
                             stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        spawn("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
              "--scheduler-file", str(scheduler_file), env={**ENV, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"})
        wait_until(lambda: _parses(scheduler_file), "the scheduler file")
        for i in range(WORKERS):
            spawn("worker", "--nthreads", "1", "--no-nanny", "--no-dashboard", "--memory-limit", "0",
                  "--name", f"w{i}", "--scheduler-file", str(scheduler_file))
        client = Client(scheduler_file=str(scheduler_file), timeout=60)
        client.wait_for_workers(WORKERS, timeout=120)
        client.run(exec, WARM)
        yield SimpleNamespace(address=client.scheduler.address, client=client, pids=client.run(os.getpid), dir=d)
    finally:
        if client is not None:
            client.close()
        stop_all(procs, logs)


@pytest.fixture
def launched(request):
    """Start launcher subprocesses; every one still running at the end is killed."""
    procs: list[subprocess.Popen] = []
    logs = []

    def start(cmd: list[str], log: Path) -> subprocess.Popen:
        logs.append(open(log, "w"))  # noqa: SIM115 - closed by the finalizer
        p = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=logs[-1], stderr=subprocess.STDOUT)
        p.log = log
        procs.append(p)
        return p

    request.addfinalizer(lambda: stop_all(procs, logs))
    return start


def run_cli(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


def attrs_or_none(path: Path, run_id: str) -> dict | None:
    try:
        return store.run_attrs(str(path), run_id)
    except store.StoreError:  # not created yet, or its metadata is being rewritten
        return None


def test_worker_killed_mid_sweep_then_rerun_retrains_nothing(cluster, launched, tmp_path):
    config = write_config(tmp_path / "sweep.toml", {"train.seed": [0, 1, 2, 3]})
    out = tmp_path / "store.zarr"
    first = launched(sweep_cmd(config, out, cluster.address), tmp_path / "first.log")

    # A second launcher on the same store, while the first holds the lock, is refused (the CLI's
    # one-line exit 2 for this error is checked in tests/test_sweep_lock.py).
    wait_until(lambda: Path(lock_path(str(out))).exists() or first.poll() is not None, "the sweep lock")
    with pytest.raises(SweepLockError, match=f"being written by another sweep \\(pid {first.pid} "):
        run_sweep(load_config(config), str(out), scheduler=cluster.address, progress=False)

    # Find a run that is mid-way (checkpointed past step 0) on some worker, and SIGKILL that worker.
    # Not past half-way: one at its last checkpoint could complete before the kill lands, and it
    # would then never be resumed (starts 1 below).
    def victim():
        for addr, keys in cluster.client.processing().items():
            for key in keys:
                run_id = str(key).split("-")[2]
                a = attrs_or_none(out, run_id)
                if a and a.get("status") == "running" and 1 <= a.get("checkpoint_step", 0) <= STEPS // 2:
                    return addr, run_id
        return None

    found = wait_until(lambda: victim() or first.poll() is not None, "a run in progress", every=0.05)
    if found is True:  # the sweep ended first: no worker was killed, and the rest would test nothing
        pytest.fail(f"the sweep ended before a run could be caught mid-way: {first.log.read_text()}")
    addr, killed_run = found
    os.kill(cluster.pids[addr], signal.SIGKILL)

    assert first.wait(timeout=180) == 0, first.log.read_text()
    log = first.log.read_text()
    assert "sweep: 4 runs: 4 completed" in log

    runs = store.list_runs(str(out))
    assert len(runs) == 4 and killed_run in runs
    index = store.read_sweep_index(str(out))
    assert index["axes"] == ["train.seed"] and sorted(index["runs"]) == sorted(runs)
    for run_id in runs:
        a = store.run_attrs(str(out), run_id)
        assert a["status"] == "completed" and a["steps_done"] == STEPS, (run_id, a)
        assert a["sweep_values"] == index["runs"][run_id]
        ds = store.open_run(str(out), run_id)
        assert ds.sizes["train_step"] == STEPS
        assert np.isfinite(ds.loss.values).all(), run_id
        assert np.isfinite(ds.attention.values.astype(np.float32)).all(), run_id  # every snapshot present
        assert np.isfinite(ds.eval_loss.values).all(), run_id
    killed = store.run_attrs(str(out), killed_run)
    assert killed["starts"] >= 2, killed  # resumed after the kill
    assert killed["steps_trained"] < 2 * STEPS  # from its checkpoint, not from scratch twice over
    assert not Path(lock_path(str(out))).exists()

    # Same sweep again: every run is already finished; nothing is retrained or rewritten.
    before = {r: store.run_attrs(str(out), r) for r in runs}
    again = run_sweep(load_config(config), str(out), scheduler=cluster.address, progress=False)
    assert sorted(again.skipped) == sorted(runs) and again.counts == {"completed": 4}
    assert {r: store.run_attrs(str(out), r) for r in runs} == before


def test_a_failing_run_does_not_stop_the_others(cluster, tmp_path):
    # train.device is not part of the run id; cuda:7 cannot exist on this CPU-only torch. The
    # CLI refuses such a device up front (tests/test_cli.py), so the library is called here:
    # a device that vanishes between launch and run fails the same way.
    config = write_config(tmp_path / "fail.toml", {"train.seed": [10, 11], "train.device": ["cpu", "cuda:7"],
                                                   "zip": [["train.seed", "train.device"]]})
    out = tmp_path / "store.zarr"
    summary = run_sweep(load_config(config), str(out), scheduler=cluster.address, progress=False)
    text = "\n".join(summary.lines())
    assert not summary.ok and summary.counts == {"completed": 1, "failed": 1}, text
    index = store.read_sweep_index(str(out))
    [bad] = [rid for rid, v in index["runs"].items() if v["train.device"] == "cuda:7"]
    [good] = [rid for rid, v in index["runs"].items() if v["train.device"] == "cpu"]
    assert f"failed {bad} [train.seed=11, train.device=\"cuda:7\"]" in text
    assert store.run_attrs(str(out), good)["status"] == "completed"
    # A run that fails as it starts (its model moved to the missing device) is recorded all the
    # same (train._record_setup_failure): listed, failed, with the worker's traceback
    assert sorted(store.list_runs(str(out))) == sorted([bad, good])
    a = store.run_attrs(str(out), bad)
    assert a["status"] == "failed" and "Traceback" in a["traceback"], a


def test_sweep_into_an_fsspec_url_store(cluster, tmp_path, monkeypatch):
    # local:// sends every read and write, checkpoints included, through fsspec (not the
    # plain-path code), from worker processes that share nothing with the launcher but the
    # URL: what s3:// or gcs:// on a cluster do. Resuming from a URL checkpoint is
    # tests/integration/test_train_run.py::test_fsspec_url_store_interrupted_and_resumed_equals_local_run.
    import fsspec.config
    import xarray as xr

    monkeypatch.setitem(fsspec.config.conf, "local", {"auto_mkdir": True})
    config = write_config(tmp_path / "url.toml", {"train.seed": [20, 21]})
    url = f"local://{tmp_path}/store.zarr"
    r = run_cli(sweep_cmd(config, url, cluster.address))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sweep: 2 runs: 2 completed" in r.stdout
    runs = store.list_runs(url)
    assert sorted(runs) == sorted(store.read_sweep_index(url)["runs"])
    for run_id in runs:
        assert store.has_checkpoint(url, run_id)
        ds = xr.open_zarr(url, group=f"runs/{run_id}")  # plain xarray reads it by URL too
        assert ds.attrs["status"] == "completed" and ds.sizes["train_step"] == STEPS
        assert np.isfinite(ds.attention.values.astype(np.float32)).all(), run_id
    sweep = store.open_sweep(url)
    assert sweep.sizes["run"] == 2 and sorted(sweep.train_seed.values.tolist()) == [20, 21]
    assert not Path(lock_path(str(tmp_path / "store.zarr"))).exists()

    before = {r: store.run_attrs(url, r) for r in runs}
    # The same command again, through cli.main in this process (the launch above was the process)
    again = cli_in_process(*sweep_cmd(config, url, cluster.address)[3:])
    assert again.returncode == 0 and {r: store.run_attrs(url, r) for r in runs} == before, again.stderr


def test_a_run_whose_workers_keep_dying_is_recorded_failed_and_resumes(cluster, tmp_path, monkeypatch, capsys):
    # When the scheduler gave up on a run's task for good (KilledWorker after its last resubmission),
    # the summary said failed while the store still said "running" (`dynamics status`: stopped, or
    # running on a URL store): nothing recorded how the run ended. The scheduler gives up after one
    # death and the launcher resubmits nothing here, so one SIGKILL is the last one.
    from dynamics import cli

    monkeypatch.setattr("dynamics.sweep.launcher.MAX_RESUBMITS", 0)
    # Its one run is the only chance to catch a run mid-way, polled through the scheduler: four
    # times the other tests' steps keep that chance wide on a loaded machine (about 2 s, not 0.5).
    steps = 4 * STEPS
    config = write_config(tmp_path / "dies.toml", {"train.seed": [30]}, steps=steps)
    out = tmp_path / "store.zarr"

    def victim():
        for addr, keys in cluster.client.processing().items():
            for key in keys:
                a = attrs_or_none(out, str(key).split("-")[2])
                if a and a.get("status") == "running" and a.get("checkpoint_step", 0) >= 1:
                    return addr
        return None

    # Polled until the sweep returns, not to a deadline, and whatever the poll raised is raised
    # here: a pytest.fail in this thread only printed a warning, and the test failed later on a
    # summary of "completed" that did not say no kill had been made.
    sweep_done, killed = threading.Event(), []

    def kill_when_running() -> None:
        try:
            while not sweep_done.is_set():
                addr = victim()
                if addr:
                    os.kill(cluster.pids[addr], signal.SIGKILL)
                    killed.append(addr)
                    return
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - raised in the test's thread below
            killed.append(e)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    try:
        summary = run_sweep(load_config(config), str(out), scheduler=cluster.address, progress=False)
    finally:
        sweep_done.set()
        killer.join()
    if not killed:
        pytest.fail(f"the run ended before the worker training it could be killed: {summary.lines()}")
    if isinstance(killed[0], BaseException):
        raise killed[0]
    [run_id] = store.list_runs(str(out))
    reason = "KilledWorker: the worker training it died once (last tcp://127.0.0.1:"
    assert summary.counts == {"failed": 1} and summary.failed == [run_id], summary.lines()
    assert summary.errors[run_id].startswith(reason) and summary.errors[run_id].endswith("the same command resumes it")
    a = store.run_attrs(str(out), run_id)
    assert a["status"] == "failed" and a["traceback"] == summary.errors[run_id], a
    checkpoint = a["checkpoint_step"]
    # status reads the checkpoint file's own step: the attrs' may be one snapshot behind it (below)
    on_disk = store.checkpoint_step(str(out), run_id)
    assert cli.main(["status", str(out)]) == 0
    [row] = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(run_id)]
    assert row[2:5] == ["failed", f"{on_disk}/{steps}", str(on_disk)], row

    # The same sweep again (on a worker left) resumes it from its checkpoint.
    again = run_sweep(load_config(config), str(out), scheduler=cluster.address, progress=False)
    assert again.counts == {"completed": 1} and again.skipped == [], again.lines()
    a = store.run_attrs(str(out), run_id)
    assert a["status"] == "completed" and a["steps_done"] == steps and a["starts"] == 2 and not a.get("traceback")
    # The checkpoint's file is written before its step goes into the attrs: a SIGKILL between the
    # two leaves the attrs one snapshot behind the file the resume starts from (seen in a full run).
    from dynamics.record import snapshot_steps

    rec = CONFIG["record"]
    after = [int(s) for s in snapshot_steps(steps, rec["dense_until"], rec["every"]) if s > checkpoint]
    assert a["resumes"][-1]["step"] in (checkpoint, after[0]), (a["resumes"], checkpoint)
    assert a["resumes"][-1]["step"] == on_disk  # where status said it would resume
    assert a["resumes"][-1]["after"] == {"status": "failed", "traceback": summary.errors[run_id]}
