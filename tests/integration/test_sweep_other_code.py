"""A sweep whose worker runs other dynamics code: a real scheduler and real workers, as
subprocesses on 127.0.0.1, each worker importing a copy of the package that differs from the
launcher's, the launcher via the CLI. First a checkout that differs in one line and in
run_point's arguments, then an install older than the code check itself, then none at all.

Each point is refused, named failed in one line, and nothing of it is written. (A worker that
could not unpickle a task's function failed on Dask's message itself, and the sweep waited,
silent, until killed.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from dynamics import store
from dynamics.provenance import missing_code, other_code, process_code_hash
from tests.integration.test_sweep_distributed import ENV, ROOT, _parses, stop_all, sweep_cmd, wait_until, write_config

pytestmark = pytest.mark.distributed
SITE_PACKAGES = sysconfig.get_paths()["purelib"]


def copy_package(folder: Path) -> Path:
    shutil.copytree(ROOT / "dynamics", folder / "dynamics", ignore=shutil.ignore_patterns("__pycache__"))
    return folder / "dynamics"


def code_hash_of(folder: Path) -> str:
    r = subprocess.run([sys.executable, "-S", "-c", "from dynamics.provenance import code_hash; print(code_hash())"],
                       env={**ENV, "PYTHONPATH": os.pathsep.join([str(folder), SITE_PACKAGES])}, cwd=folder,
                       capture_output=True, text=True, check=True)
    return r.stdout.strip()


def test_a_worker_with_other_code_refuses_every_point_and_writes_nothing(tmp_path):
    other = copy_package(tmp_path / "other")
    task = other / "sweep" / "task.py"
    text = task.read_text()
    assert text.count(", data: str | None = None)") == 1  # run_point without the argument sent last
    task.write_text(text.replace(", data: str | None = None)", ")").replace("if data is not None:", "if False:"))
    older = copy_package(tmp_path / "older")
    (older / "provenance.py").unlink()  # a dynamics from before the check

    procs: list[subprocess.Popen] = []
    logs = []

    def spawn(*args: str, env: dict) -> subprocess.Popen:
        logs.append(open(tmp_path / f"proc{len(procs)}.log", "w"))  # noqa: SIM115 - closed by stop_all
        procs.append(subprocess.Popen([sys.executable, *args], cwd=tmp_path, env=env,
                                      stdout=logs[-1], stderr=subprocess.STDOUT))
        return procs[-1]

    def sweep_with_worker_of(folder: Path, out: Path) -> subprocess.CompletedProcess:
        # Without site's .pth files (-S), site-packages named on the path instead: this project's
        # editable install maps every dynamics module to the checkout, and would have supplied
        # the older copy's missing module from it.
        worker = spawn("-S", "-m", "dask", "worker", "--nthreads", "1", "--no-nanny", "--no-dashboard",
                       "--memory-limit", "0", "--scheduler-file", str(scheduler_file),
                       env={**ENV, "PYTHONPATH": os.pathsep.join([str(folder.parent), SITE_PACKAGES])})
        try:
            return subprocess.run(sweep_cmd(config, out, str(scheduler_file)), cwd=ROOT, env=ENV, capture_output=True,
                                  text=True, timeout=180)
        finally:
            worker.kill()

    scheduler_file = tmp_path / "scheduler.json"
    config = write_config(tmp_path / "sweep.toml", {"train.seed": [0, 1]}, steps=20)
    try:
        spawn("-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
              "--scheduler-file", str(scheduler_file), env=ENV)
        wait_until(lambda: _parses(scheduler_file), "the scheduler file")
        runs = {"other": sweep_with_worker_of(other, tmp_path / "other.zarr"),
                "older": sweep_with_worker_of(older, tmp_path / "older.zarr"),
                "none": sweep_with_worker_of(tmp_path / "none" / "dynamics", tmp_path / "none.zarr")}
    finally:
        stop_all(procs, logs)
    ours = process_code_hash()
    lines = {"other": other_code(code_hash_of(other.parent), ours), "older": other_code(None, ours),
             "none": missing_code(ModuleNotFoundError(name="dynamics"), ours)}
    assert "other dynamics code than the launcher" in lines["other"] and "an older dynamics" in lines["older"]
    assert lines["none"].startswith("this worker has no dynamics installed")
    for name, r in runs.items():
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stdout.startswith("sweep: 2 runs: 2 failed"), r.stdout + r.stderr
        # the summary's line and the progress line of each point; not a TypeError of run_point's arguments
        assert r.stdout.count(lines[name]) == r.stderr.count(lines[name]) == 2, r.stdout + r.stderr
        assert store.list_runs(str(tmp_path / f"{name}.zarr")) == []  # no point's run was begun
