"""Sweep points another process is training when their task reaches them: waited for, not failed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from dynamics import store
from dynamics.config import from_dict
from dynamics.sweep import expand_grid, run_sweep
from tests.test_sweep import ROOT, TINY, tiny

HOLDER = """
import json, os, sys, time
from dynamics.config import from_dict
from dynamics.train import train_run

raw, path, release, then = sys.argv[1:]

def progress(step, total, loss):  # paused, holding the run's lock, until the test lets it go on
    while not os.path.exists(release):
        time.sleep(0.02)
    if then == "stop":
        raise KeyboardInterrupt  # as Ctrl-C: recorded interrupted, resumable

try:
    print(train_run(from_dict(json.loads(raw)), path, progress=progress).status, flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.parametrize("then", ["finish", "stop"])
def test_a_point_another_process_trains_is_waited_for_not_failed(then, tmp_path, threaded_cluster, capsys,
                                                                  monkeypatch):
    # `dynamics run` of a sweep point (or an orphaned task of a killed launcher) holds the run's
    # lock: the sweep's task was refused, the summary said "1 failed" and the sweep exited 1,
    # though that run completed. The task now waits for the holder, says so, and then takes the
    # run up: skipped if the holder finished it, resumed if not.
    from dynamics.sweep import progress

    raw = tiny({"train.seed": [0]})
    cfg = from_dict(raw)
    [point] = expand_grid(cfg)
    path = str(tmp_path / "s.zarr")
    release = tmp_path / "release"
    base = {k: v for k, v in raw.items() if k != "sweep"}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps(base), path, str(release), then],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not (store.is_store(path) and point.run_id in store.list_runs(path)
                   and store.run_lock_held(path, point.run_id)):
            assert holder.poll() is None and time.monotonic() < deadline, "the holder never took the run's lock"
            time.sleep(0.05)

        # The holder is let go once the sweep says it waits for it. Read from the display itself:
        # a thread polling capsys could drop that line (pytest's snap reads, then truncates),
        # leaving the holder and the sweep waiting for each other.
        real_waiting = progress._Display.waiting

        def waiting_then_release(self, run_id: str, text: str) -> None:
            real_waiting(self, run_id, text)
            release.touch()

        monkeypatch.setattr(progress._Display, "waiting", waiting_then_release)
        try:
            summary = run_sweep(cfg, path, scheduler=threaded_cluster, progress=None)
        finally:
            release.touch()  # never leave the holder paused, whatever the sweep did
        log = capsys.readouterr().err
        ended = "completed" if then == "finish" else "interrupted"
        assert holder.wait(timeout=120) == 0 and holder.stdout.read().strip() == ended
    finally:
        release.touch()
        if holder.poll() is None:
            holder.kill()
        holder.stdout.close()  # left to the collector, it warned in whichever test ran then
    assert f"{point.run_id} waiting: run {point.run_id} in {path} is being trained by another process " \
           f"(pid {holder.pid}" in log, log
    assert summary.ok and summary.counts == {"completed": 1} and summary.failed == [], summary.lines()
    assert list(summary.waited) == [point.run_id]
    line = f"  waited for {point.run_id} [train.seed=0]: another process (pid {holder.pid} on "
    [got] = [x for x in summary.lines() if x.startswith(line)]
    attrs = store.run_attrs(path, point.run_id)
    assert attrs["status"] == "completed" and not attrs.get("traceback")
    if then == "finish":
        assert got.endswith("was training it; that process ended it completed; nothing retrained"), got
        assert f"[sweep] {point.run_id} completed (finished by another process) (1/1 finished)" in log, log
        assert attrs["starts"] == 1  # trained once, by the other process
    else:
        assert got.endswith("was training it; it stopped before the end, and this sweep took the run up: "
                            "completed"), got
        assert attrs["starts"] == 2 and attrs["steps_done"] == TINY["train"]["steps"]  # resumed by the sweep


def test_a_sweep_stopped_while_it_waits_says_it_took_nothing_up(tmp_path, threaded_cluster):
    # Ctrl-C while a task waits for a holder: the task returns cancelled, the holder still training,
    # and the summary said "it stopped before the end, and this sweep took the run up: cancelled",
    # of a run the sweep never touched and that process was still training. The holder here is
    # this test itself (a flock of another open file conflicts within one process too).
    from distributed import Client, Event

    from dynamics.sweep.launcher import _waited_note
    from dynamics.sweep.task import _progress_topic, _stop_name, run_point

    [point] = expand_grid(from_dict(tiny({"train.seed": [0]})))
    path, token = str(tmp_path / "s.zarr"), "waiting-stopped"
    store.init_store(path)
    with Client(threaded_cluster) as client, store.run_lock(path, point.run_id):
        task = client.submit(run_point, point.cfg, path, point.run_id, point.values, token, pure=False)
        while not any("waiting" in msg for _, msg in client.get_events(_progress_topic(token))):
            assert not task.done(), task.result()  # it returned without waiting: say what it returned
            time.sleep(0.05)
        Event(_stop_name(token), client=client).set()  # what the launcher does on Ctrl-C
        r = task.result()
        assert store.run_lock_held(path, point.run_id)  # the holder is still at it
    assert r["status"] == "cancelled" and r["waited"] == f"pid {os.getpid()} on {socket.gethostname()}, " \
        f"since {r['waited'].rsplit('since ', 1)[1]}" and not r["skipped"]
    assert "stopped while another process" in r["error"]
    note = _waited_note(r)
    assert "took the run up" not in note, note
    assert note == f"another process ({r['waited']}) was training it; the sweep was stopped while it waited, and " \
                   "left the run to that process", note
    assert point.run_id not in store.list_runs(path)  # nothing written by the task
