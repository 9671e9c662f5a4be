"""A sweep whose worker runs other dynamics code: a real scheduler and a real worker, as
subprocesses on 127.0.0.1, the worker importing a copy of the package that differs from the
launcher's in one line and in run_point's arguments (an older checkout), the launcher via the CLI.

Each point is refused by the worker, named failed with one line, and nothing of it is written."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dynamics import store
from tests.integration.test_sweep_distributed import ENV, ROOT, _parses, stop_all, sweep_cmd, wait_until, write_config

pytestmark = pytest.mark.distributed


def test_a_worker_with_other_code_refuses_every_point_and_writes_nothing(tmp_path):
    from dynamics.provenance import code_hash

    older = tmp_path / "older"
    shutil.copytree(ROOT / "dynamics", older / "dynamics", ignore=shutil.ignore_patterns("__pycache__"))
    task = older / "dynamics" / "sweep" / "task.py"
    text = task.read_text()
    # an older run_point, without the argument this launcher sends last
    assert text.count(", data: str | None = None)") == 1
    task.write_text(text.replace(", data: str | None = None)", ")").replace("if data is not None:", "if False:"))
    procs: list[subprocess.Popen] = []
    logs = []

    def spawn(*args: str, env: dict) -> None:
        logs.append(open(tmp_path / f"proc{len(procs)}.log", "w"))  # noqa: SIM115 - closed by stop_all
        procs.append(subprocess.Popen([sys.executable, "-m", "dask", *args], cwd=tmp_path, env=env,
                                      stdout=logs[-1], stderr=subprocess.STDOUT))

    scheduler_file = tmp_path / "scheduler.json"
    try:
        spawn("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
              "--scheduler-file", str(scheduler_file), env=ENV)
        wait_until(lambda: _parses(scheduler_file), "the scheduler file")
        spawn("worker", "--nthreads", "1", "--no-nanny", "--no-dashboard", "--memory-limit", "0",
              "--scheduler-file", str(scheduler_file), env={**ENV, "PYTHONPATH": str(older)})
        config = write_config(tmp_path / "sweep.toml", {"train.seed": [0, 1]}, steps=20)
        out = tmp_path / "s.zarr"
        r = subprocess.run(sweep_cmd(config, out, str(scheduler_file)), cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=180)
    finally:
        stop_all(procs, logs)
    assert r.returncode == 1, r.stdout + r.stderr
    theirs = code_hash_of(older)
    line = (f"this worker runs other dynamics code than the launcher (code hash {theirs[:16]}... against "
            f"{code_hash()[:16]}...: another checkout or an older install?)")
    assert r.stdout.startswith("sweep: 2 runs: 2 failed"), r.stdout + r.stderr
    assert r.stdout.count(line) == r.stderr.count(line) == 2, r.stdout + r.stderr  # the summary, the progress
    assert "TypeError" not in r.stdout + r.stderr
    assert store.list_runs(str(out)) == []  # no point's run was begun


def code_hash_of(folder: Path) -> str:
    r = subprocess.run([sys.executable, "-c", "from dynamics.provenance import code_hash; print(code_hash())"],
                       env={**ENV, "PYTHONPATH": str(folder)}, cwd=folder, capture_output=True, text=True, check=True)
    return r.stdout.strip()
