"""Runs that fail while training, through the real CLI: a full disk, a store deleted mid-run.

A run that fails is exit 1 with one line saying whether its traceback reached the run's
attributes (exit 2 is bad input found before any work); a run failed by a full disk resumes,
once there is room, to the arrays of an uninterrupted run.
"""

import os
import shutil
import subprocess
import sys

from dynamics import store
from dynamics.config import load_config
from tests.conftest import assert_same_run_arrays, cli_in_process, wait_for_checkpoint

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def dyn(*args, **kw):
    return subprocess.run([sys.executable, "-m", "dynamics", *map(str, args)], capture_output=True, text=True,
                          env=ENV, **kw)


def failure_line(r):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr.strip().splitlines()[-1]


def test_a_full_disk_fails_the_run_resumably_and_says_where_its_traceback_is(tiny_config, tmp_path, tmpfs):
    cfg = tiny_config(steps=100, every=2)
    fs = tmpfs("1500k")  # fills up part-way through the 100 steps of this config
    out = fs / "s.zarr"
    # The uninterrupted reference trains alongside (one thread each, two cores): the suite's time
    ref = tmp_path / "ref.zarr"
    reference = subprocess.Popen([sys.executable, "-m", "dynamics", "run", str(cfg), "--out", str(ref)],
                                 env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = failure_line(dyn("run", cfg, "--out", out))
        _, err = reference.communicate(timeout=300)
        assert reference.returncode == 0, err
    finally:
        reference.kill()
    run_id = load_config(cfg).run_id()
    assert line.startswith(f"dynamics: run {run_id} failed: OSError: [Errno 28] No space left on device")
    assert line.endswith("(traceback in the run's attributes); free some space and run the same command again")
    attrs = store.run_attrs(out, run_id)
    assert attrs["status"] == "failed" and "No space left on device" in attrs["traceback"]

    tmpfs.remount(fs, "200M")
    r = cli_in_process("run", cfg, "--out", out)  # the same command, in this process: no second start-up
    assert r.returncode == 0, r.stderr
    assert_same_run_arrays(out, ref)


def test_a_disk_too_full_to_make_the_store_does_not_point_at_a_traceback_nowhere(tiny_config, tmpfs):
    # It said "(traceback in the run's attributes)" of a run that was never created.
    cfg = tiny_config(steps=20, every=10)
    fs = tmpfs("64k")
    (fs / "fill").write_bytes(b"\0" * 60 * 1024)
    out = fs / "s.zarr"
    # cli.main in this process: what it says does not depend on a process of its own (the exit 1
    # and line of a failed run through the real entry point: the test above and the one below)
    line = failure_line(cli_in_process("run", cfg, "--out", out))
    assert "No space left on device" in line
    assert line.endswith("(its traceback could not be recorded in the store); free some space and run the same "
                         "command again")
    assert not store.is_store(out) or load_config(cfg).run_id() not in store.list_runs(out)


def test_a_store_deleted_mid_run_is_a_run_failure_not_bad_input(tiny_config, tmp_path):
    # A StoreError raised while training ("not a dynamics store") was exit 2, the code for bad
    # input found before any work.
    cfg = tiny_config(steps=3000, every=5)
    out = tmp_path / "s.zarr"
    run_id = load_config(cfg).run_id()
    p = subprocess.Popen([sys.executable, "-m", "dynamics", "run", cfg, "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for_checkpoint(out, run_id, 16, p)
        while p.poll() is None and out.exists():  # the writer may recreate a directory while it goes
            shutil.rmtree(out, ignore_errors=True)
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    line = failure_line(r)
    assert line.startswith(f"dynamics: run {run_id} failed: ")
    assert line.endswith("(its traceback could not be recorded in the store)")


def test_a_failure_after_the_run_is_marked_completed_does_not_call_it_failed(tiny_config, tmp_path, capsys):
    # A disk that filled just as the root index was refreshed, after the final attributes had
    # landed, printed "run ... failed" of a run `dynamics status` showed completed and a rerun
    # skipped. The line now says what the store holds.
    import errno

    from dynamics.cli import _run_failed
    from dynamics.train import train_run

    cfg = load_config(tiny_config(steps=10, every=5))
    out = tmp_path / "s.zarr"
    train_run(cfg, str(out))
    run_id = cfg.run_id()
    error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    code = _run_failed(str(out), run_id, error, trained=True)
    line = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in line and "failed:" not in line.split("index")[0]
    assert line.startswith(f"dynamics: run {run_id} completed, but refreshing the store's root index afterwards "
                           f"failed: OSError: [Errno 28] No space left on device")
    assert line.endswith("the same command again refreshes the index)")
    assert store.run_attrs(out, run_id)["status"] == "completed"
    # Completed in an earlier session, and this one failed before training (on the way to skipping
    # it): nothing says the index was this session's to refresh.
    assert _run_failed(str(out), run_id, error, trained=False) == 1
    assert capsys.readouterr().err.strip() == (f"dynamics: run {run_id} was already completed, but this command "
                                               f"stopped before skipping it: OSError: [Errno 28] No space left on "
                                               f"device (its arrays and attributes are whole)")
