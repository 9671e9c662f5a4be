"""End-to-end training runs through the real CLI: resume after SIGKILL, divergence, bad input."""

import os
import signal
import subprocess
import sys
import uuid
import warnings

import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.config import load_config
from tests.conftest import assert_same_run_arrays, cli_in_process, interrupt_at, wait_for_checkpoint

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error"}


def dyn(*args, **kw):
    return subprocess.run([sys.executable, "-m", "dynamics", *args], capture_output=True, text=True, env=ENV, **kw)


def dyn_here(*args):
    """The same command through cli.main in this process, warnings raised as PYTHONWARNINGS=error
    does: for what does not depend on a process of its own (a fresh one costs seconds of imports)."""
    return cli_in_process(*args, warnings_as_errors=True)


def test_run_cli_writes_a_store_plain_xarray_can_open(tiny_config, tmp_path):
    cfg = tiny_config(steps=20, every=10)
    out = tmp_path / "s.zarr"
    r = dyn("run", cfg, "--out", str(out))
    assert r.returncode == 0, r.stderr
    run_id = load_config(cfg).run_id()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(out, group=f"runs/{run_id}")
    assert ds.attention.dims == ("snapshot", "layer", "head", "probe", "query", "key")
    assert ds.step.values.tolist() == [0, 1, 2, 4, 8, 10, 20]
    assert ds.attrs["status"] == "completed" and ds.attrs["data_hash"]
    rows = ds.attention.isel(snapshot=-1).astype("float32").sum("key").values
    np.testing.assert_allclose(rows, 1.0, atol=1e-2)
    assert np.isfinite(ds.loss.values).all() and np.isfinite(ds.grad_norm.values).all()
    # running it again retrains nothing
    r2 = dyn_here("run", cfg, "--out", str(out))
    assert r2.returncode == 0 and "nothing retrained" in r2.stdout
    assert store.run_attrs(out, run_id)["starts"] == 1


def test_python_dash_m_matches_console_script(tiny_config):
    r = subprocess.run(["dynamics", "--help"], capture_output=True, text=True)
    r2 = dyn("--help")
    assert r.returncode == r2.returncode == 0 and r.stdout.replace("dynamics", "") == r2.stdout.replace("dynamics", "")


def test_resume_after_sigkill_equals_uninterrupted(tiny_config, tmp_path):
    # 360 steps past the checkpoint the kill waits for: a test stalled for a few of them still
    # lands its kill mid-run on a loaded machine
    cfg = tiny_config(steps=400, every=20)
    run_id = load_config(cfg).run_id()
    whole, killed = tmp_path / "whole.zarr", tmp_path / "killed.zarr"
    # The uninterrupted reference trains alongside (one thread each, two cores): the suite's time
    reference = subprocess.Popen([sys.executable, "-m", "dynamics", "run", cfg, "--out", str(whole)],
                                 env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen([sys.executable, "-m", "dynamics", "run", cfg, "--out", str(killed)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_checkpoint(killed, run_id, 40, proc)  # a mid-run checkpoint, then kill without warning
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        _, err = reference.communicate(timeout=300)
        assert reference.returncode == 0, err
    finally:
        proc.kill()
        reference.kill()
    attrs = store.run_attrs(killed, run_id)
    assert attrs["status"] == "running", "the kill should land mid-run"
    assert 40 <= attrs["checkpoint_step"] < 400
    assert attrs["steps_trained"] == attrs["checkpoint_step"]  # counted as checkpoints land, not only at the end
    # Nobody holds the run any more: status says so instead of showing it live.
    r = dyn_here("status", str(killed))
    assert r.returncode == 0 and f"{run_id}  stopped" in r.stdout, r.stdout

    r = dyn_here("run", cfg, "--out", str(killed))  # the same command; the kill is what needs a process
    assert r.returncode == 0, r.stderr
    attrs = store.run_attrs(killed, run_id)
    assert attrs["status"] == "completed" and attrs["starts"] == 2
    assert attrs["steps_trained"] == 400  # up to the checkpoint, then from it: the lost tail was redone
    assert_same_run_arrays(killed, whole)


def test_sigterm_records_the_run_interrupted(tiny_config, tmp_path):
    cfg = tiny_config(steps=3000, every=20)  # far more steps than the signal needs: it lands mid-run
    run_id = load_config(cfg).run_id()
    out = tmp_path / "t.zarr"
    proc = subprocess.Popen([sys.executable, "-m", "dynamics", "run", cfg, "--out", str(out)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoint(out, run_id, 20, proc)
        proc.send_signal(signal.SIGTERM)  # what `kill` and batch schedulers send
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted; what was recorded is kept; the same command resumes each run" in err
    attrs = store.run_attrs(out, run_id)
    assert attrs["status"] == "interrupted" and attrs["steps_done"] < 3000


def test_waiting_for_a_checkpoint_fails_saying_why_when_it_never_comes(tmp_path):
    # The wait returned silently at its deadline, and a test went on to kill a run that had
    # never started; a trainer that died at start-up was waited for the whole deadline.
    from tests.conftest import wait_for_checkpoint

    with pytest.raises(pytest.fail.Exception, match="did not checkpoint step 1 within 0.1 s \\(no run yet\\)"):
        wait_for_checkpoint(tmp_path / "none.zarr", "r1", 1, timeout=0.1)
    died = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no torch here')"], stderr=subprocess.PIPE,
                            text=True)
    died.wait()
    with pytest.raises(pytest.fail.Exception, match="exited \\(1\\) before run r1 checkpointed step 1 .*no torch here"):
        wait_for_checkpoint(tmp_path / "none.zarr", "r1", 1, died)
    died.stderr.close()  # left to the collector, it warned in whichever test ran then


def test_absurd_learning_rate_ends_diverged_not_traceback(tiny_config, tmp_path):
    cfg = tiny_config(steps=60, every=10)
    out = tmp_path / "d.zarr"
    r = dyn_here("run", cfg, "--out", str(out), "--set", "train.lr=1e6", "--set", "train.grad_clip=0",
            "--set", "train.optimizer='sgd'", "--set", "train.warmup_steps=0")
    assert "Traceback" not in r.stderr
    assert r.returncode == 1
    ds = store.open_run(out)
    assert ds.attrs["status"] == "diverged"
    step = ds.attrs["diverged_step"]
    assert 0 < step < 60
    assert np.isfinite(ds.loss.values[:step]).all()
    # Too few finite snapshots for the divergence curve's noise band: said, not analysed as NaN.
    r = dyn_here("analyse", str(out))
    assert r.returncode == 0, r.stderr
    assert f"not analysed (diverged at step {step} after" in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--set", "model.n_heads=3"], "model.n_heads: 3 does not divide model.d_model 32"),
        (["--set", "train.lr=0"], "train.lr: must be > 0"),
        (["--set", "model.foo=1"], "unknown key 'model.foo'"),
        (["--set", "model.context=4"], "model.context: 4 is too short"),
        (["--set", "model.d_model='big'"], "model.d_model: expected an integer"),
        (["--set", "task.name='corpus'", "--set", "model.vocab_size=256", "--set", "task.holdout=1e-9"],
         "task.holdout: 1e-09 leaves no held-out (eval and probe) file"),
    ],
)
def test_bad_config_one_line_exit_2_nothing_written(tiny_config, tmp_path, args, needle):
    out = tmp_path / "x.zarr"
    r = dyn_here("run", tiny_config(), "--out", str(out), *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not out.exists()


def test_out_path_that_is_not_a_store_is_refused(tiny_config, tmp_path):
    victim = tmp_path / "notes"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    r = dyn_here("run", tiny_config(), "--out", str(victim))
    assert r.returncode == 2 and "not a dynamics store" in r.stderr
    assert (victim / "precious.txt").read_text() == "keep me" and len(list(victim.iterdir())) == 1


def test_an_empty_directory_becomes_the_store(tiny_config, tmp_path):
    # Nothing in it to overwrite; a file:// URL to the same directory was already accepted.
    made = tmp_path / "results"
    made.mkdir()
    r = dyn_here("run", tiny_config(), "--out", str(made))
    assert r.returncode == 0, r.stderr
    assert store.is_store(made) and len(store.list_runs(made)) == 1


def test_a_run_that_cannot_start_is_recorded_failed_with_its_traceback(tiny_config, tmp_path):
    # The CLI refuses a device it cannot use (tests/test_cli.py); the library records the failure.
    from dynamics.config import with_values
    from dynamics.train import train_run

    out = tmp_path / "f.zarr"
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises for a missing device
        train_run(with_values(load_config(tiny_config()), {"train.device": "cuda:7"}), str(out))
    attrs = store.run_attrs(out, store.list_runs(out)[0])
    assert attrs["status"] == "failed" and "Traceback" in attrs["traceback"]


def test_fsspec_url_store_interrupted_and_resumed_equals_local_run(tiny_config, tmp_path):
    # memory:// has object-store semantics (no directories, no rename): the checkpoint goes
    # through fsspec like it would on s3://, and the resume reads it back from there.
    from dynamics.train import train_run

    cfg = load_config(tiny_config(steps=60, every=10))
    url = f"memory://dynamics-test-{uuid.uuid4().hex}/s.zarr"

    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, url, progress=interrupt_at(25))
    first = store.run_attrs(url, cfg.run_id())
    assert first["status"] == "interrupted" and 0 < first["checkpoint_step"] < 60
    assert store.has_checkpoint(url, cfg.run_id())

    assert train_run(cfg, url).status == "completed"
    assert train_run(cfg, str(tmp_path / "local.zarr")).status == "completed"
    attrs = store.run_attrs(url, cfg.run_id())
    assert attrs["starts"] == 2  # resumed from the checkpoint, not retrained from step 0:
    assert attrs["steps_trained"] == first["steps_trained"] + 60 - first["checkpoint_step"]
    assert_same_run_arrays(url, tmp_path / "local.zarr")
