"""train_run's bookkeeping: what a failed write, a second process or an interrupt may and may
not do to a run that is already recorded (what a resume refuses and notes: test_resume.py)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dynamics import store, train
from dynamics.config import ConfigError, load_config, with_values
from dynamics.model import Transformer
from dynamics.store.writer import RunWriter
from dynamics.train import train_run
from tests.conftest import TINY, assert_same_run_arrays, interrupt_at


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY.format(steps=30, every=10))
    return load_config(p)


def test_a_failed_write_drops_the_checkpoint_behind_it_and_is_recorded(cfg, tmp_path, monkeypatch):
    clean = str(tmp_path / "clean.zarr")
    train_run(cfg, clean)
    path = str(tmp_path / "s.zarr")
    real = RunWriter.write_region

    def fails_once(self, name, start, values):
        if name == "loss" and start > 0 and not fails_once.done:  # the loss flush at the step-2 snapshot
            fails_once.done = True
            raise OSError("disk went away (injected)")
        return real(self, name, start, values)

    fails_once.done = False
    monkeypatch.setattr(RunWriter, "write_region", fails_once)
    with pytest.raises(OSError, match="injected"):
        train_run(cfg, path)
    attrs = store.run_attrs(path, cfg.run_id())
    assert attrs["status"] == "failed" and "injected" in attrs["traceback"]
    # The checkpoint queued after the failed loss write was not saved: a resume must redo those steps.
    assert attrs["checkpoint_step"] < 10

    monkeypatch.setattr(RunWriter, "write_region", real)
    assert train_run(cfg, path).status == "completed"
    attrs = store.run_attrs(path, cfg.run_id())
    # the completed run shows no traceback; the failure it recovered from is in its resume entry
    assert attrs["traceback"] is None
    assert attrs["resumes"][-1]["after"]["status"] == "failed" and "injected" in attrs["resumes"][-1]["after"]["traceback"]
    got, want = store.open_run(path).load(), store.open_run(clean).load()
    assert not np.isnan(got.loss.values).any()
    for name in want.data_vars:
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)


def test_a_run_that_cannot_fit_in_memory_is_refused_before_the_store_is_made(cfg, tmp_path, monkeypatch):
    # the API (and a sweep's worker on a cluster, where the launcher cannot know its memory) checks it
    # too: a store and a "failed" run were made, and the run died of a MemoryError in its first step
    monkeypatch.delenv("DYNAMICS_MEMORY_GB", raising=False)
    path = tmp_path / "s.zarr"
    with pytest.raises(ConfigError, match=r"^config needs at least .* for a training step\), more than the"):
        train_run(with_values(cfg, {"train.batch_size": 10**8}), str(path))
    assert not path.exists()


def test_a_resume_keeps_the_first_start_provenance_and_logs_its_own(cfg, tmp_path):
    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))
    first = store.run_attrs(path, cfg.run_id())
    assert "resumes" not in first
    store.update_run_attrs(path, cfg.run_id(), torch_version="0.0-first")
    train_run(cfg, path)
    attrs = store.run_attrs(path, cfg.run_id())
    assert attrs["status"] == "completed" and attrs["starts"] == 2
    assert attrs["torch_version"] == "0.0-first" and attrs["data_hash"] == first["data_hash"]
    [resume] = attrs["resumes"]
    assert resume["step"] == first["checkpoint_step"] and resume["device"] == "cpu"
    assert resume["torch_version"] != "0.0-first"


def test_two_threads_give_the_same_run_twice_and_resumed(cfg, tmp_path):
    # At train.threads = 2 the embedding's gradient was summed with atomic adds (W_E[tokens]'s
    # backward, past 32768 elements: batch x context x d_model here), so the same config and seed
    # gave other arrays from one run to the next, and no resume matched its uninterrupted twin.
    two = with_values(cfg, {"train.threads": 2, "train.steps": 12, "train.batch_size": 64, "model.vocab_size": 8,
                            "task.min_period": 2, "task.max_period": 4})
    train_run(two, str(tmp_path / "a.zarr"))
    train_run(two, str(tmp_path / "b.zarr"))
    with pytest.raises(KeyboardInterrupt):
        train_run(two, str(tmp_path / "c.zarr"), progress=interrupt_at(10))
    train_run(two, str(tmp_path / "c.zarr"))
    assert_same_run_arrays(tmp_path / "b.zarr", tmp_path / "a.zarr")
    assert_same_run_arrays(tmp_path / "c.zarr", tmp_path / "a.zarr")


def test_a_resumed_run_counts_its_progress_from_its_checkpoint(cfg, tmp_path):
    # `dynamics status` reads steps_done: left at the last session's 21 it would stand still
    # while the resume redid steps 8..21. It reads last_loss too: left at the loss of step 20, it
    # stood beside the resume's progress from step 8 (and stayed if the resume was killed).
    cfg = with_values(cfg, {"record.every": 25})  # snapshots (and checkpoints) 0..8, 25, 30
    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12))  # progress comes every 10 steps: stops at 20
    before = store.run_attrs(path, cfg.run_id())
    assert before["steps_done"] == 21 and before["checkpoint_step"] == 8 and before["last_loss"] is not None
    seen = []
    train_run(cfg, path, progress=lambda step, steps, loss: seen.append(store.run_attrs(path, cfg.run_id())))
    assert seen[0]["steps_done"] == 8 and store.run_attrs(path, cfg.run_id())["steps_done"] == 30
    assert seen[0]["last_loss"] is None and store.run_attrs(path, cfg.run_id())["last_loss"] is not None


def test_started_is_said_once_before_the_first_snapshot_and_never_with_a_refusal(cfg, tmp_path, monkeypatch):
    # `dynamics run` said its notes at the first progress call, after step 0's snapshot: the
    # CHG note came after the fit it warned would pause the lines.
    from dynamics.record import Recorder

    events = []
    snapshot = Recorder.snapshot
    monkeypatch.setattr(Recorder, "snapshot", lambda self, model, *rest: events.append("snapshot") or snapshot(self, model, *rest))
    cfg = with_values(cfg, {"record.every": 25})
    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(12), started=lambda step: events.append(("started", step)))
    assert events[0] == ("started", 0) and events.count(("started", 0)) == 1 and events[1] == "snapshot"
    events.clear()
    train_run(cfg, path, started=lambda step: events.append(("started", step)))  # resumed at its checkpoint, 8
    assert events[0] == ("started", 8) and len([e for e in events if e != "snapshot"]) == 1
    events.clear()
    with pytest.raises(store.StoreError, match="different config"):
        train_run(with_values(cfg, {"train.lr": 0.5}), path, cfg.run_id(), started=events.append)
    assert train_run(cfg, path, started=events.append).skipped and events == []  # refused, skipped: nothing begins


def test_an_interrupt_in_the_progress_callback_counts_the_update_it_follows(cfg, tmp_path, monkeypatch):
    # progress(step) comes once update `step` is applied, but steps_done (and steps_trained) read
    # `step`: stopped in progress(20), the run recorded 20 steps done after 21 updates.
    path = str(tmp_path / "s.zarr")
    made = []
    make = train.make_optimizer

    def counted(*args):
        opt = make(*args)
        step = opt.step
        opt.step = lambda: (made.append(None), step())[1]
        return opt

    monkeypatch.setattr(train, "make_optimizer", counted)
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(20))
    attrs = store.run_attrs(path, cfg.run_id())
    assert (attrs["steps_done"], attrs["steps_trained"], attrs["checkpoint_step"]) == (len(made), len(made), 20)
    assert len(made) == 21


def test_a_session_killed_outright_keeps_its_training_time_up_to_its_checkpoint(cfg, tmp_path):
    # wall_time was written only when a session ended: a run SIGKILLed and resumed reported the
    # resume's time alone (1.7 s for a 400-step run, half of which the killed session trained),
    # while steps_trained, saved with each checkpoint, counted both sessions.
    from tests.conftest import wait_for_checkpoint

    path = str(tmp_path / "s.zarr")
    seen = {}

    def look_mid_run(step, steps, loss):
        if step == 20:  # checkpoints at 0..8 and 10 are on their way; a kill here ends everything
            wait_for_checkpoint(path, cfg.run_id(), 10)
            seen.update(store.run_attrs(path, cfg.run_id()))

    train_run(cfg, path, progress=look_mid_run)
    assert seen["status"] == "running" and seen["checkpoint_step"] >= 10
    # not a speed check: the killed-session time is in the attrs mid-run, and the end only adds to it
    at_checkpoint, at_end = seen["wall_time"], store.run_attrs(path, cfg.run_id())["wall_time"]
    assert at_checkpoint > 0 and at_end >= at_checkpoint


def test_a_kill_between_the_checkpoint_and_its_attrs_loses_no_count(cfg, tmp_path):
    # The checkpoint file is written, then the attrs that count its steps: a SIGKILL between the
    # two left the attrs at the checkpoint before, and the resume, counting from them, recorded
    # 180 steps trained for a 200-step run (CI). Here the kill is staged: a session stopped at its
    # step-20 checkpoint, its attrs then put back to what the step-10 checkpoint had written.
    from dynamics.checkpoint import load_checkpoint

    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path, progress=interrupt_at(20))
    assert store.run_attrs(path, cfg.run_id())["checkpoint_step"] == 20
    saved = load_checkpoint(path, cfg.run_id())
    assert (saved["step"], saved["steps_trained"]) == (20, 20) and saved["wall_time"] > 0
    store.update_run_attrs(path, cfg.run_id(), status="running", checkpoint_step=10, steps_trained=10,
                           steps_done=10, wall_time=0.0)
    seen = []
    train_run(cfg, path, progress=lambda step, steps, loss: seen.append(store.run_attrs(path, cfg.run_id())))
    assert seen[0]["checkpoint_step"] == 20  # what this session resumed from, not the stale 10
    attrs = store.run_attrs(path, cfg.run_id())
    assert (attrs["status"], attrs["steps_trained"]) == ("completed", 30)  # 20 before the kill, 10 after
    assert attrs["wall_time"] >= saved["wall_time"]


def test_a_kill_between_the_last_attrs_and_their_index_entry_is_mended_by_the_next_run(cfg, tmp_path, monkeypatch):
    # The group's attrs said completed, the root index (what plain xr.open_zarr reads) still said
    # running: the same command skipped the run as finished and nothing ever rewrote its entry.
    import xarray as xr

    from dynamics.store import index, root, writer

    path = str(tmp_path / "s.zarr")
    real = root._index_update

    def killed_before_completed_is_indexed(loc, gpath):
        if store.run_attrs(path, cfg.run_id()).get("status") != "completed":
            real(loc, gpath)

    for module in (root, writer):
        monkeypatch.setattr(module, "_index_update", killed_before_completed_is_indexed)
    train_run(cfg, path)
    monkeypatch.undo()
    assert xr.open_zarr(path, group=f"runs/{cfg.run_id()}").attrs["status"] == "running"  # the kill staged

    # a store it may not write (or an fsspec backend that cannot): skipped all the same, left as it is
    for error in (OSError(30, "Read-only file system"), NotImplementedError("no writes over http")):
        def unwritable(loc, root_meta, error=error):
            raise error

        with monkeypatch.context() as m:
            for module in (root, index):
                m.setattr(module, "_write_root", unwritable)
            assert train_run(cfg, path).status == "completed"
    assert xr.open_zarr(path, group=f"runs/{cfg.run_id()}").attrs["status"] == "running"
    assert train_run(cfg, path).status == "completed"  # skipped: nothing retrained
    seen = xr.open_zarr(path, group=f"runs/{cfg.run_id()}").attrs
    assert seen == store.run_attrs(path, cfg.run_id()) and seen["starts"] == 1


def test_ctrl_c_while_the_run_group_is_created_leaves_it_interrupted(cfg, tmp_path, monkeypatch):
    import signal

    path = str(tmp_path / "s.zarr")
    made = RunWriter.__init__

    def init_then_ctrl_c(self, *args, **kwargs):
        made(self, *args, **kwargs)  # the group now exists, marked "running"
        signal.raise_signal(signal.SIGINT)  # before training starts; to this (the main) thread

    monkeypatch.setattr(RunWriter, "__init__", init_then_ctrl_c)
    # Python's own Ctrl-C handler, as a terminal gives it: a suite started in the background of
    # a non-interactive shell (`pytest &`) inherits SIGINT ignored (POSIX: asynchronous commands
    # ignore SIGINT without job control, and Python then keeps SIG_IGN), so the interrupt this
    # test sends would never arrive. The test is about what train_run does with one.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            train_run(cfg, path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert store.run_attrs(path, cfg.run_id())["status"] == "interrupted"
    monkeypatch.setattr(RunWriter, "__init__", made)
    assert train_run(cfg, path).status == "completed"


HOLD = """
import sys
from dynamics import store, train
with store.run_lock(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_one_process_trains_a_run_at_a_time(cfg, tmp_path):
    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, path, cfg.run_id()], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(store.StoreError, match=f"being trained by another process \\(pid {holder.pid} "):
            train_run(cfg, path)
        assert cfg.run_id() not in store.list_runs(path)  # refused before anything was written
        toml = tmp_path / "tiny.toml"
        r = subprocess.run([sys.executable, "-m", "dynamics", "run", str(toml), "--out", path],
                           capture_output=True, text=True)
        assert r.returncode == 2
        assert len(r.stderr.strip().splitlines()) == 1 and "being trained by another process" in r.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
        holder.stdout.close()
    assert train_run(cfg, path).status == "completed"  # the lock went with its holder


def test_never_written_snapshots_of_gate_fits_read_unfitted(cfg, tmp_path):
    chg = with_values(cfg, {"record.chg_every": 4, "record.chg_steps": 5})
    path = str(tmp_path / "s.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(chg, path, progress=interrupt_at(12))
    ds = store.open_run(path).load()
    written = ds.step.values <= store.run_attrs(path, chg.run_id())["checkpoint_step"]
    assert (ds.chg_role.values[~written] == -1).all()  # -1 = UNFITTED; 0 would read "facilitating"
    assert (ds.chg_role.values[0] >= 0).all()  # snapshot 0 was fitted


def test_a_stop_is_seen_during_a_gate_fit_and_the_resume_records_what_an_unbroken_run_does(cfg, tmp_path):
    # A sweep's stop is read in the progress callback, which a gate fit (seconds) never called: a
    # Ctrl-C at a sweep recording fits waited 7-10 s for the fit to end. Now the fit calls it,
    # with the snapshot's step, and a stop there is an interrupt like any other.
    chg = with_values(cfg, {"record.chg_every": 1, "record.chg_steps": 5})
    calls = []

    def stop_in_a_fit(step, steps, loss):
        calls.append(step)
        if step >= 8 and calls.count(step) > 1:  # a second call at one step: inside its snapshot's fit
            raise KeyboardInterrupt

    path, ref = str(tmp_path / "s.zarr"), str(tmp_path / "ref.zarr")
    with pytest.raises(KeyboardInterrupt):
        train_run(chg, path, progress=stop_in_a_fit)
    stopped = calls[-1]
    assert 8 <= stopped < chg.train.steps and stopped in store.open_run(path).step.values
    attrs = store.run_attrs(path, chg.run_id())
    assert attrs["status"] == "interrupted" and attrs["steps_done"] == stopped  # its update not made
    finals = []
    train_run(chg, path, progress=lambda step, steps, loss: finals.append(step) if step == steps else None)
    assert finals == [chg.train.steps]  # the last snapshot's fit says nothing: at the total, a bar closes
    train_run(chg, ref)
    assert_same_run_arrays(path, ref)


def test_an_interrupt_while_the_last_writes_drain_is_recorded_interrupted(cfg, tmp_path, monkeypatch):
    import dynamics.train as train

    path = str(tmp_path / "s.zarr")
    real = train._save_checkpoint

    def slow_last(p, rid, state, writer, step, *counts):
        if step == cfg.train.steps:
            raise KeyboardInterrupt("signal 15")  # as SIGTERM would, while the final checkpoint saves
        return real(p, rid, state, writer, step, *counts)

    monkeypatch.setattr(train, "_save_checkpoint", slow_last)
    with pytest.raises(KeyboardInterrupt):
        train_run(cfg, path)
    assert store.run_attrs(path, cfg.run_id())["status"] == "interrupted"  # not "failed": it is resumable
    monkeypatch.setattr(train, "_save_checkpoint", real)
    assert train_run(cfg, path).status == "completed"


def test_a_signal_during_the_final_status_write_waits_for_it(cfg, tmp_path, monkeypatch):
    import os
    import signal

    from dynamics.signals import sigterm_as_interrupt

    path = str(tmp_path / "s.zarr")
    real = RunWriter.set_attrs

    def signalled(self, **attrs):
        if attrs.get("status") == "completed":
            os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the write
        return real(self, **attrs)

    monkeypatch.setattr(RunWriter, "set_attrs", signalled)
    with sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt) as stopped:
        train_run(cfg, path)
    assert store.run_attrs(path, cfg.run_id())["status"] == "completed"  # written, then the interrupt
    # the caller learns the run finished: `dynamics run` called it resumable, exit 130 and no "completed" line
    from dynamics.train import InterruptedAfterFinish

    assert isinstance(stopped.value, InterruptedAfterFinish)
    assert (stopped.value.result.status, stopped.value.result.steps_done) == ("completed", cfg.train.steps)


def test_probing_the_lock_never_makes_a_trainer_refuse(tmp_path):
    import fcntl
    import os
    import threading

    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    with store.run_lock(path, "r1"):  # creates checkpoints/r1/train.lock
        pass
    # A probe's shared flock held for certain when the trainer asks, released 0.2 s later (the
    # loop below meets one only by chance): the trainer waits it out instead of refusing.
    fd = os.open(tmp_path / "s.zarr" / "checkpoints" / "r1" / "train.lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    release = threading.Timer(0.2, os.close, (fd,))
    release.start()
    try:
        with store.run_lock(path, "r1"):
            pass
    finally:
        release.join()
    stop = threading.Event()
    errors: list[BaseException] = []  # a thread's exception only warns: collected, then asserted

    def probe():
        try:
            while not stop.is_set():
                store.run_lock_held(path, "r1")  # what `dynamics status` and the report do
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=probe)
    t.start()
    try:
        for _ in range(200):
            with store.run_lock(path, "r1"):
                pass
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_a_finished_run_is_skipped_without_taking_its_lock(cfg, tmp_path, monkeypatch):
    # so that a read-only store of finished runs can be "re-run" (skipped) as before
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path)

    def no_lock(*args):
        raise AssertionError("a finished run needs no lock")

    monkeypatch.setattr(store, "run_lock", no_lock)
    assert train_run(cfg, path).skipped


def test_initial_weights_are_the_seeds_whoever_else_draws_from_torchs_global_generator(cfg):
    # build seeded torch's global generator and drew the weights from it; a second run built at once
    # in the same process (a Dask worker with --nthreads 2) drew from the same stream, so both got
    # other weights under their run ids (168 of 200 concurrent builds of seeds 0 and 1, measured).
    import threading

    import torch

    from dynamics.train import build

    cpu = torch.device("cpu")
    torch.manual_seed(cfg.train.seed)
    want = Transformer(cfg.model).state_dict()  # what torch.manual_seed(seed) gave: recorded runs keep their weights
    stop = threading.Event()

    def other_run() -> None:
        while not stop.is_set():
            torch.manual_seed(1)
            torch.empty(4096).normal_()

    drawer = threading.Thread(target=other_run)
    drawer.start()
    try:
        for _ in range(20):
            got = build(cfg, cpu).state_dict()
            assert all(torch.equal(got[k], v) for k, v in want.items())
    finally:
        stop.set()
        drawer.join()
    state = torch.get_rng_state()
    build(cfg, cpu)
    assert torch.equal(torch.get_rng_state(), state)  # nor does it reseed the caller's stream


def test_a_run_follows_neither_the_callers_grad_mode_nor_its_default_dtype(cfg, tmp_path):
    # Under a caller's inference_mode (or no_grad) the run was recorded failed at its first backward;
    # under its float64 default it trained in float64 and recorded other arrays under the same run id.
    import torch

    cfg = with_values(cfg, {"train.steps": 6})
    plain, path, f64 = (str(tmp_path / f"{name}.zarr") for name in ("plain", "s", "f64"))
    train_run(cfg, plain)
    with torch.inference_mode():
        assert train_run(cfg, path).status == "completed"
    assert_same_run_arrays(path, plain)
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(RuntimeError, match=r"^torch's default dtype is torch.float64 in this process, but runs"):
            train_run(cfg, f64)
    finally:
        torch.set_default_dtype(torch.float32)
    assert not Path(f64).exists()


def test_a_run_leaves_the_callers_thread_count_as_it_found_it(cfg, tmp_path):
    # train.threads (1) stayed set for the whole process: a notebook's later torch work ran on it.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train_run(with_values(cfg, {"train.steps": 4, "train.threads": 1}), str(tmp_path / "s.zarr"))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_config_made_in_code_and_clashing_attrs_are_refused_before_anything_is_written(cfg, tmp_path):
    # ModelConfig(n_heads=3) failed inside torch after a failed run was recorded; extra_attrs
    # replaced the run's own config and seed, and the run could no longer be loaded or resumed.
    from dataclasses import replace

    path = tmp_path / "s.zarr"
    bad = replace(cfg, model=replace(cfg.model, n_heads=3))
    with pytest.raises(ConfigError, match="model.n_heads: 3 does not divide model.d_model"):
        train_run(bad, str(path))
    with pytest.raises(ConfigError, match="train.steps: expected an integer, got 5.5"):
        train_run(replace(cfg, train=replace(cfg.train, steps=5.5)), str(path))
    with pytest.raises(ConfigError, match="extra_attrs: config, seed are attributes training writes itself"):
        train_run(cfg, str(path), extra_attrs={"seed": 99, "config": {}, "sweep_values": {}})
    assert not path.exists()


@pytest.mark.parametrize("steps", [19, 25, 100])
def test_learned_gates_are_held_exactly_while_the_l1_ramp_has_not_begun(cfg, tmp_path, steps):
    # Gates held for the first 10% of steps, then the L1 ramp from 0: both at the same step, also
    # when steps is not a multiple of 10 (19 steps: steps 0 and 1 are under 10%, step 2 is not).
    import dynamics
    from dynamics.train import gate_reg_weight, gates_held

    cfg = with_values(cfg, {"model.gates": "learned", "model.gate_l1": 0.5, "train.steps": steps,
                            "train.lr": 3e-2, "record.every": 1, "record.dense_until": 0})
    boundary = next(s for s in range(steps) if s / steps >= 0.1)
    assert [gates_held(cfg, s) for s in range(steps)] == [s < boundary for s in range(steps)]
    reg = [gate_reg_weight(cfg, s) for s in range(steps)]
    assert all(w == 0 for w in reg[:boundary]) and all(w > 0 for w in reg[boundary + 1:])
    assert [w == 0.5 for w in reg] == [s / steps >= 0.7 for s in range(steps)]
    if steps != 19:
        return
    path = str(tmp_path / "g.zarr")
    train_run(cfg, path)
    gate = dynamics.open_run(path).gate.sel(step=[0, boundary, boundary + 1]).values
    np.testing.assert_array_equal(gate[1], gate[0])  # model after `boundary` held updates
    assert (gate[2] != gate[0]).all()


@pytest.mark.parametrize("broken", ["nan", "norm_overflow", "nan_loss"])
def test_a_non_finite_loss_or_gradient_diverges_at_its_own_step(tmp_path, monkeypatch, broken):
    # sqrt at 0 in the objective: the loss is unchanged and finite, its gradient NaN (inf * 0).
    # The run applied that update and stopped one step later, at the first NaN loss, so
    # diverged_step named a step whose weights were already NaN, and the step that broke
    # training read as a healthy one. A finite gradient of ~1e25 per logit has a global norm that
    # overflows float32: diverged too, as README says (unclipped, grad_clip = 0 here, AdamW's
    # second moment would go inf and freeze the weights; clipped, the update would be zero).
    # A NaN loss at step 4 names step 4 too, its loss left unrecorded.
    import torch
    import torch.nn.functional as F

    p = tmp_path / "tiny.toml"
    p.write_text(TINY.format(steps=6, every=2))
    cfg = load_config(p)
    if broken == "norm_overflow":
        cfg = with_values(cfg, {"train.grad_clip": 0.0})
    real, calls = F.cross_entropy, []

    def nan_gradient_at_step_4(logits, target, *args, **kwargs):
        loss = real(logits, target, *args, **kwargs)
        if torch.is_grad_enabled() and logits.requires_grad:  # the training objective, once a step
            calls.append(len(calls))
            if calls[-1] == 4 and broken == "nan_loss":
                return loss * float("nan")
            if calls[-1] == 4 and broken == "nan":
                return loss + torch.sqrt(logits.sum() * 0.0)
            if calls[-1] == 4:
                return loss + 1e25 * (logits.sum() - logits.sum().detach())  # + 0, gradient 1e25
        return loss

    monkeypatch.setattr(F, "cross_entropy", nan_gradient_at_step_4)
    path = str(tmp_path / "g.zarr")
    assert train_run(cfg, path).status == "diverged"
    attrs = store.run_attrs(path, cfg.run_id())
    assert attrs["diverged_step"] == 4 and attrs["steps_done"] == 4
    ds = store.open_run(path).load()
    kept = 4 if broken == "nan_loss" else 5  # a finite loss at step 4 is recorded
    assert np.isfinite(ds.loss.values[:kept]).all() and np.isnan(ds.loss.values[kept:]).all()
    at = ds.sel(snapshot=int(np.flatnonzero(ds.step.values == 4)[0]))
    assert np.isfinite(at.head_weights.values).all()  # the weights that gave it: no update applied
    if broken != "norm_overflow":
        assert np.isnan(at.grad_norm.values).all()
    else:  # each head's own norm, taken in float64, fits float32 where the global one overflowed
        assert np.isfinite(at.grad_norm.values).all() and at.grad_norm.values.max() > 1e25


def test_the_learning_rate_schedule_has_its_documented_known_values():
    # TrainConfig's docstrings and lr_at's: update s < W at lr (s + 1) / W, lr at steps W - 1 and W,
    # the cosine's floor min_lr_frac * lr at step `steps` (one past the last update), and a run
    # no longer than its warm-up never reaching lr nor decaying.
    import math

    from dynamics.config import from_dict
    from dynamics.train import lr_at

    def lrs(steps, warmup, upto=None):
        cfg = from_dict({"train": {"steps": steps, "lr": 2.0, "warmup_steps": warmup, "min_lr_frac": 0.1}})
        return [lr_at(cfg, s) / 2.0 for s in range(steps + 1 if upto is None else upto)]

    ten = lrs(10, 5)
    assert ten[:6] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert ten[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 5)))  # 0.1859, the last update
    assert round(ten[9], 4) == 0.1859 and ten[10] == pytest.approx(0.1)
    assert round(lrs(100, 50)[99], 4) == 0.1009
    assert lrs(6, 5)[5] == 1.0  # a one-step decay: its only update runs at lr
    assert lrs(4, 5, upto=4) == pytest.approx([0.2, 0.4, 0.6, 0.8])  # last update lr * steps / warmup
    assert lrs(4, 0)[0] == 1.0 and lrs(4, 0)[4] == pytest.approx(0.1)  # no warm-up: the decay starts at lr


def test_a_snapshot_holds_its_checkpoint_weights_and_their_gradient_on_that_steps_batch(tmp_path):
    # Known answers from autograd, independently of Recorder: the last snapshot (step 6) against
    # the last checkpoint's weights and training batch 6. Learned gates, so g != 1 and importance
    # goes through the gate probe; here it is checked against each sequence's dL(x)/dlogit /
    # (g (1 - g)), one backward per sequence, its absolute value averaged over the batch.
    import torch
    import torch.nn.functional as F

    from dynamics.checkpoint import load_checkpoint
    from dynamics.model import Transformer
    from dynamics.tasks import make_batch

    p = tmp_path / "tiny.toml"
    p.write_text(TINY.format(steps=6, every=2))
    cfg = with_values(load_config(p), {"model.gates": "learned", "model.gate_l1": 0.5})
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path)
    ckpt = load_checkpoint(path, cfg.run_id())
    assert ckpt["step"] == 6
    model = Transformer(cfg.model)
    model.load_state_dict(ckpt["model"])
    ds = store.open_run(path).load().isel(snapshot=-1)
    assert int(ds.step) == 6

    tokens = torch.from_numpy(make_batch(cfg, "train", 6, cfg.train.batch_size).tokens)  # (B, T+1)
    loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    attn = [b.attn for b in model.blocks]
    weights = [w for a in attn for w in (a.W_Q, a.W_K, a.W_V, a.W_O)]
    grads = torch.autograd.grad(loss, weights + [a.gate_logit for a in attn])
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads[:len(weights)]])  # (L*4, H)
    norms = norms.view(len(attn), 4, -1).transpose(1, 2)  # (L, H, 4), weight order q, k, v, o
    np.testing.assert_allclose(ds.grad_norm.values, norms.numpy(), rtol=1e-5)
    g = torch.stack([torch.sigmoid(a.gate_logit.detach()) for a in attn])  # (L, H)
    np.testing.assert_array_equal(ds.gate.values, g.numpy())
    logits = [a.gate_logit for a in attn]
    per_sequence = torch.stack([  # (B, L, H): each sequence's dL(x)/dg, its own loss alone
        torch.stack(torch.autograd.grad(F.cross_entropy(model(x[None, :-1])[0], x[1:]), logits)) / (g * (1 - g))
        for x in tokens])
    np.testing.assert_allclose(ds.importance.values, per_sequence.abs().mean(0).numpy(), rtol=1e-4)
    # not the batch's mean loss's |dL/dg|, in which the sequences' gradients cancel
    batch = (torch.stack(grads[len(weights):]) / (g * (1 - g))).abs()  # (L, H)
    np.testing.assert_allclose(batch.numpy(), per_sequence.mean(0).abs().numpy(), rtol=1e-4)
    assert (ds.importance.values > 1.5 * batch.numpy()).all()
    assert store.run_attrs(path, cfg.run_id())["importance_form"] == "per_sequence"
    # Michel et al.'s: a gate xi held at 1 on each head's output, dL(x)/dxi = g dL(x)/dg (not dL(x)/dg)
    from dynamics.analysis.bifurcation import head_importance

    dl_dxi = []  # (B, L, H)
    for x in tokens:
        xi = torch.ones(len(attn), g.shape[1], requires_grad=True)
        dl_dxi += torch.autograd.grad(F.cross_entropy(model(x[None, :-1], head_gates=xi)[0], x[1:]), xi)
    michel = head_importance(ds.importance, ds.gate).values
    np.testing.assert_allclose(michel, torch.stack(dl_dxi).abs().mean(0).numpy(), rtol=1e-4)
    assert not np.allclose(ds.importance.values, michel, rtol=1e-2)  # g is far enough from 1
    assert store.run_attrs(path, cfg.run_id())["last_loss"] == loss.item()

    probe = torch.from_numpy(ds.probe_tokens.values)
    with torch.no_grad():
        _, cache = model.run_with_cache(probe, names=lambda n: n.endswith("hook_pattern"))
    pattern = torch.stack([cache[f"blocks.{i}.attn.hook_pattern"] for i in range(len(attn))]).transpose(1, 2)
    np.testing.assert_allclose(ds.attention.values.astype(np.float32), pattern.numpy(), atol=5e-4)  # float16
    np.testing.assert_array_equal(ds.head_weights.values, model.head_weights().numpy())


def test_the_writer_queue_is_bounded_so_a_dense_cadence_cannot_fill_memory():
    # At record.every = 1 the writer fell behind training and its queue, with the snapshots it
    # held, grew without bound (180 jobs and 65 kB a step on the quickstart model)
    import threading

    from dynamics.train import _Writer

    gate = threading.Event()
    writer = _Writer(None)
    sizes, done = [], []
    for i in range(_Writer.MAX_PENDING + 5):
        if i == _Writer.MAX_PENDING:
            threading.Timer(0.05, gate.set).start()  # the writer catches up only later: submit waits for it
        writer.submit(lambda i=i: (gate.wait(), done.append(i)))
        sizes.append(len(writer.pending))
    writer.close()
    assert max(sizes) == _Writer.MAX_PENDING
    assert done == list(range(_Writer.MAX_PENDING + 5))  # in order, none dropped


def test_a_training_process_imports_neither_torch_dynamo_nor_xarray():
    # What a run or sweep worker pays before its first update, on the 2-core Zen host:
    # torch.optim's step and state_dict import torch._dynamo (2 s), and the store's readers
    # imported xarray with pandas (0.9 s) though a new run only writes. Runs that checkpoint and
    # are stopped, with either optimiser, in a process of its own; then their resumes, which
    # open what was recorded with xarray to check it, but still import no torch._dynamo.
    code = """
import sys, tempfile
from dynamics import store
from dynamics.config import from_dict
from dynamics.train import train_run
def interrupt_at(n):  # tests.conftest's, whose own imports (xarray among them) would spoil the check
    def progress(step, steps, loss):
        if step >= n:
            raise KeyboardInterrupt
    return progress
cfgs = {opt: from_dict({"model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab_size": 8, "context": 32},
                        "train": {"steps": 14, "batch_size": 2, "optimizer": opt}, "record": {"every": 4}})
        for opt in ("adamw", "sgd")}
with tempfile.TemporaryDirectory() as d:
    for opt, cfg in cfgs.items():
        try:
            train_run(cfg, f"{d}/{opt}.zarr", progress=interrupt_at(10))
        except KeyboardInterrupt:
            pass
    print(*(m in sys.modules for m in ("torch._dynamo", "xarray", "pandas")))
    for opt, cfg in cfgs.items():
        path = f"{d}/{opt}.zarr"
        assert train_run(cfg, path).status == "completed"
        assert [r["step"] for r in store.run_attrs(path, cfg.run_id())["resumes"]] == [8]  # its checkpoint's
    print(*(m in sys.modules for m in ("torch._dynamo", "xarray")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False", "False", "True"]
