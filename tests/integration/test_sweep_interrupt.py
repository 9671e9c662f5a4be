"""Ctrl-C at a sweep on the embedded cluster, as a terminal sends it: to the whole process group,
worker processes included, here while the cluster is still starting."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_sweep import tiny, write_toml

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for signal masks"),
]

ROOT = Path(__file__).resolve().parents[2]


SIGINT_BIT = 1 << (signal.SIGINT - 1)

MASKS = """
from pathlib import Path
from dynamics.sweep.launcher import _client

def blocked():
    status = Path("/proc/thread-self/status").read_text()
    return next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1]

if __name__ == "__main__":
    before = blocked()
    client, cluster = _client(None, 2)
    print(before, blocked(), *client.run(blocked).values())
    client.close()
    cluster.close()
"""


def test_the_embedded_clusters_workers_never_see_a_terminal_ctrl_c(tmp_path):
    # A fresh process: CPython's multiprocessing resource tracker, on its first start, unblocks
    # SIGINT in the thread that started it. That was the cluster's IO-loop thread, which then
    # spawned workers that got Ctrl-C while importing, each printing a traceback.
    script = tmp_path / "masks.py"
    script.write_text(MASKS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    before, after, *workers = (int(m, 16) for m in done.stdout.split())
    assert len(workers) == 2
    assert all(m & SIGINT_BIT for m in workers), done.stdout  # the workers never see it
    assert not before & SIGINT_BIT and not after & SIGINT_BIT  # the launcher does, to stop the sweep


@pytest.mark.parametrize("delay", [0.2, 1.0])
def test_ctrl_c_while_the_cluster_starts_ends_in_one_line_and_exit_130(tmp_path, delay):
    config = write_toml(tmp_path / "s.toml", tiny({"train.seed": [0, 1]}))
    out = tmp_path / "s.zarr"

    def default_sigint():  # a shell's background job (`pytest &`) inherits SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        [sys.executable, "-m", "dynamics", "sweep", str(config), "--out", str(out), "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        start_new_session=True, preexec_fn=default_sigint,
    )
    lines = []
    # The reads below end when every holder of the pipe has: a worker that outlived the launcher
    # would hang them, so the whole group is killed (and the test fails) after a deadline instead.
    def kill_group():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(180, kill_group)
    watchdog.start()
    try:
        for line in proc.stdout:  # plain log lines: not a terminal
            lines.append(line)
            if "to train on" in line:  # printed just before the cluster starts
                time.sleep(delay)
                os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: to every process of the group
                break
        lines.append(proc.stdout.read())
        proc.wait(timeout=120)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            kill_group()
            proc.wait(timeout=30)  # reaped here, not left a zombie for later tests to trip over
        proc.stdout.close()  # left to the collector, it warned in whichever test ran then
    text = "".join(lines)
    assert any("to train on" in line for line in lines), text
    # 130 from main(); CPython 3.11 instead exits by SIGINT (-2) when the KeyboardInterrupt first
    # escaped code run by exec (a dataclass being defined mid-import) before main() caught it.
    # A shell sees 130 either way.
    assert proc.returncode in (130, -signal.SIGINT), text
    assert "Traceback" not in text and "Warning" not in text, text
    assert text.rstrip().splitlines()[-1] == "dynamics: interrupted; what was recorded is kept; the same command resumes each run, or starts one not begun"


def test_without_signal_masks_the_cluster_starts_unmasked(monkeypatch):
    # Windows has no pthread_sigmask (nor the resource tracker's _posixsubprocess): the sweep
    # must still start its cluster there.
    from multiprocessing import resource_tracker

    from dynamics.sweep.launcher import _sigint_blocked_here

    monkeypatch.delattr(signal, "pthread_sigmask")
    monkeypatch.setattr(resource_tracker, "ensure_running", lambda: pytest.fail("no tracker to start here"))
    with _sigint_blocked_here():
        pass


def test_ctrl_c_while_runs_train_keeps_them_resumable_and_the_same_command_finishes_them(tmp_path):
    # Ctrl-C while the cluster starts is tested above, and stop_running on its own: not a stop in
    # the middle of training, the one a researcher meets most, through to the command that resumes it.
    from dynamics import store
    from dynamics.config import load_config
    from dynamics.sweep import expand_grid
    from tests.conftest import wait_for_checkpoint

    config = write_toml(tmp_path / "s.toml", tiny({"train.seed": [0, 1]}, train={"steps": 4000},
                                                  record={"every": 50}))
    out, log = tmp_path / "s.zarr", tmp_path / "sweep.log"
    ids = [p.run_id for p in expand_grid(load_config(config))]

    def default_sigint():
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dynamics", "sweep", str(config), "--out", str(out), "--workers", "1"],
            stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
            preexec_fn=default_sigint)
        try:
            wait_for_checkpoint(out, ids[0], 100, proc)
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: to every process of the group
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    text = log.read_text()
    assert proc.returncode in (130, -signal.SIGINT), text
    assert "Traceback" not in text, text
    assert text.rstrip().splitlines()[-1] == ("dynamics: interrupted; what was recorded is kept; the same command "
                                              "resumes each run, or starts one not begun")
    stopped = store.run_attrs(out, ids[0])
    assert stopped["status"] == "interrupted" and 100 <= stopped["checkpoint_step"] < 4000, stopped["status"]

    again = subprocess.run([sys.executable, "-m", "dynamics", "sweep", str(config), "--out", str(out), "--workers", "1"],
                           capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"(resumed at step {stopped['checkpoint_step']})" in again.stdout + again.stderr
    for rid in ids:
        attrs = store.run_attrs(out, rid)
        assert (attrs["status"], attrs["steps_done"]) == ("completed", 4000)
