"""Known answers for what `dynamics` commands say and return, each closing a gap that mutation
testing of dynamics/cli.py found: a changed message, exit code or condition that no other test saw.

Commands are the real ``dynamics.cli.main`` on real stores (one tiny run, trained once for the
module), checked for their exact exit code and lines; the progress printers and the line of a run
that failed while training are called directly, as no command reaches every case of theirs on
demand. One test stands in for ``train_run`` (it says why).
"""

import os
import re
import shutil

import pytest
import torch

from dynamics import cli, messages, store
from dynamics.config import ConfigError, load_config
from dynamics.train import train_run
from tests.conftest import TINY


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("known")
    cfg = d / "tiny.toml"
    cfg.write_text(TINY.format(steps=10, every=5))
    path = d / "s.zarr"
    train_run(load_config(cfg), str(path))
    [run_id] = store.list_runs(path)
    return cfg, path, run_id


def copy_of(path, tmp_path):
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    return s


def lines(text):
    return text.strip().splitlines()


# --- training progress -------------------------------------------------------------------------


def test_progress_log_says_the_first_and_last_step_and_nothing_between_within_5_s(capsys):
    # Without a terminal (capsys is none): a line at most every 5 s, and always the last step's.
    log = messages.progress_printer("r")
    log(0, 10, 2.5)
    log(3, 10, 2.0)  # under 5 s after the first line: not said
    log(10, 10, 1.25)  # the last step: said however soon
    assert capsys.readouterr().err.splitlines() == ["[r] step 0/10 loss 2.5000", "[r] step 10/10 loss 1.2500"]



@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_progress_bar_on_a_terminal_shows_the_step_and_loss_and_ends_its_line(monkeypatch):
    # On a terminal (a real pseudo-terminal, 100 columns): a tqdm bar from the step training
    # starts at, updated with each step and loss, closed (its line ended) at the last step.
    import fcntl
    import struct
    import sys
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with open(slave, "w", buffering=1) as tty:
        monkeypatch.setattr(sys, "stderr", tty)
        update = messages.progress_printer("r1")
        update(2, 10, 2.5)  # a resume from step 2
        update(10, 10, 1.25)
        monkeypatch.undo()
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal's other end is closed: all read
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    text = shown.decode()
    frames = [f for f in text.split("\r") if f.strip()]
    assert any(f.startswith("r1:  20%|") and "2/10" in f and "loss=2.500" in f for f in frames), text
    assert frames[-1].startswith("r1: 100%|") and "10/10" in frames[-1] and "loss=1.250" in frames[-1], text
    assert text.endswith("\n"), text


# --- run: the note on threads -------------------------------------------------------------------


def test_run_with_as_many_threads_as_usable_cores_notes_nothing(tiny, tmp_path, capsys):
    # The note is for threads beyond the cores; as many as there are is what it advises.
    cfg, _, _ = tiny
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cli.main(["run", str(cfg), "--out", str(tmp_path / "t.zarr"),
                     "--set", f"train.threads={cores}", "--set", "train.steps=3"]) == 0  # 4 snapshots: analysable
    assert "note" not in capsys.readouterr().err


@pytest.mark.parametrize("text, sets, says", [
    ("", [], "{cfg} changes no default"),
    ("[train]\nsteps = 1000\n", [], "{cfg} changes no default"),  # the default, written out
    ("", ["train.lr=0.001"], "{cfg} with its --set changes no default"),  # as is train.lr
])
def test_run_of_a_config_that_changes_no_default_says_so_as_training_begins(tmp_path, monkeypatch, capsys, text,
                                                                            sets, says):
    # An empty file (a failed redirect, the wrong path) trained the defaults without a word. The
    # default run takes a minute here, so train_run is stood in for once its notes are out.
    import dynamics.train

    cfg = tmp_path / "c.toml"
    cfg.write_text(text)

    def train(cfg, out, run_id, progress, started, before_create=None):
        started(0)
        raise store.StoreError("stopped by the test")

    monkeypatch.setattr(dynamics.train, "train_run", train)
    assert cli.main(["run", str(cfg), "--out", str(tmp_path / "t.zarr"), *[a for s in sets for a in ("--set", s)]]) == 1
    assert lines(capsys.readouterr().err)[0] == (f"dynamics: note: {says.format(cfg=cfg)}: this is RunConfig()'s "
                                                 f"default run (is it the config you meant?)")


def test_sweep_of_a_config_that_changes_no_default_says_so_before_it_starts(tmp_path, monkeypatch, capsys):
    # as `run` does: `dynamics sweep empty.toml` trained the default run without a word
    import dynamics.sweep

    cfg = tmp_path / "c.toml"
    cfg.write_text("")

    def sweep(*args, **kwargs):
        raise store.StoreError("stopped by the test")

    monkeypatch.setattr(dynamics.sweep, "run_sweep", sweep)
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "t.zarr")]) == 2
    assert lines(capsys.readouterr().err) == [
        f"dynamics: note: {cfg} changes no default: this is RunConfig()'s default run (is it the config you meant?)",
        "dynamics: error: stopped by the test"]
    cfg.write_text("[train]\nsteps = 999\n")
    assert cli.main(["sweep", str(cfg), "--out", str(tmp_path / "t.zarr")]) == 2
    assert "note" not in capsys.readouterr().err


# --- run: a failure while training --------------------------------------------------------------


def test_a_failure_with_no_store_left_says_its_traceback_could_not_be_recorded(tmp_path, capsys):
    e = OSError("No space left on device")
    assert cli._run_failed(str(tmp_path / "gone.zarr"), "r1", e, trained=True) == 1
    assert lines(capsys.readouterr().err) == [
        "dynamics: run r1 failed: OSError: No space left on device (its traceback could not be recorded in the store)"]


def test_a_failure_the_run_recorded_says_where_its_traceback_is(tiny, tmp_path, capsys):
    _, path, run_id = tiny
    s = copy_of(path, tmp_path)
    store.update_run_attrs(s, run_id, status="failed",
                           traceback="Traceback (most recent call last):\n  ...\nRuntimeError: first line\nsecond line\n")
    # only its first line is said; the recorded traceback ends with the whole message
    assert cli._run_failed(str(s), run_id, RuntimeError("first line\nsecond line"), trained=True) == 1
    assert lines(capsys.readouterr().err) == [
        f"dynamics: run {run_id} failed: RuntimeError: first line (traceback in the run's attributes)"]


def test_a_failure_with_a_note_is_found_in_the_recorded_traceback(tiny, tmp_path, capsys):
    # A traceback ends with the exception's notes (PEP 678), so the note is what is looked for.
    import traceback

    _, path, run_id = tiny
    s = copy_of(path, tmp_path)
    e = OSError("disk gone")
    e.add_note("while writing snapshot 3")
    store.update_run_attrs(s, run_id, status="failed", traceback="".join(traceback.format_exception(e)))
    assert cli._run_failed(str(s), run_id, e, trained=True) == 1
    assert lines(capsys.readouterr().err) == [
        f"dynamics: run {run_id} failed: OSError: disk gone (traceback in the run's attributes)"]

def test_a_run_failed_on_a_full_disk_says_how_to_go_on(tiny, tmp_path, capsys):
    # as analyse says it: it read like the run's own fault, with nothing on freeing space and resuming
    import errno
    import traceback

    _, path, run_id = tiny
    s = copy_of(path, tmp_path)
    for code, fix in (("ENOSPC", "free some space"), ("EFBIG", "raise the file-size limit (ulimit -f)")):
        e = OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
        store.update_run_attrs(s, run_id, status="failed", traceback="".join(traceback.format_exception(e)))
        assert cli._run_failed(str(s), run_id, e, trained=True) == 1
        assert lines(capsys.readouterr().err) == [
            f"dynamics: run {run_id} failed: OSError: [Errno {e.errno}] {e.strerror} (traceback in the run's "
            f"attributes); {fix} and run the same command again"]


def test_a_failure_with_an_empty_message_is_still_one_line(tmp_path, capsys):
    assert cli._run_failed(str(tmp_path / "gone.zarr"), "r1", RuntimeError(), trained=False) == 1
    assert lines(capsys.readouterr().err) == [
        "dynamics: run r1 failed: RuntimeError:  (its traceback could not be recorded in the store)"]


@pytest.mark.parametrize("trained, says", [
    (True, "completed, but refreshing the store's root index afterwards failed: OSError: disk full (its arrays and "
           "attributes are whole; the same command again refreshes the index)"),
    (False, "was already completed, but this command stopped before skipping it: OSError: disk full (its arrays and "
            "attributes are whole)"),
])
def test_a_failure_after_the_run_finished_does_not_call_it_failed(tiny, trained, says, capsys):
    _, path, run_id = tiny  # completed; read only
    assert cli._run_failed(str(path), run_id, OSError("disk full"), trained=trained) == 1
    assert lines(capsys.readouterr().err) == [f"dynamics: run {run_id} {says}"]


@pytest.mark.parametrize("begins, error, code, says", [
    # once training has begun a StoreError is the run failing, not input refused
    (True, store.StoreError("the store went away"), 1,
     "dynamics: run r1 failed: StoreError: the store went away (its traceback could not be recorded in the store)"),
    (False, ConfigError("intervene.distill.teacher: teacher store t.zarr not found"), 2,
     "dynamics: error: intervene.distill.teacher: teacher store t.zarr not found"),
])
def test_what_training_raises_is_a_failed_run_or_bad_input(tiny, tmp_path, monkeypatch, capsys, begins, error, code,
                                                          says):
    # Nothing real raises these from train_run on demand (a teacher store removed between the
    # checks and training, a store lost mid-run): train_run is stood in for.
    import dynamics.train

    cfg, _, _ = tiny

    def train(cfg, out, run_id, progress, started, before_create=None):
        if begins:
            started(0)
        raise error

    monkeypatch.setattr(dynamics.train, "train_run", train)
    assert cli.main(["run", str(cfg), "--out", str(tmp_path / "t.zarr"), "--run-id", "r1"]) == code
    assert lines(capsys.readouterr().err) == [says]


# --- analyse, report and gates: a --run that is not in the store, a store of no runs ------------


@pytest.mark.parametrize("run", ["nope", "../x"])  # "../x": no run, rather than "invalid run id"
@pytest.mark.parametrize("command", ["analyse", "report", "gates"])
def test_a_run_not_in_the_store_is_named_exit_2(tiny, tmp_path, command, run, capsys):
    _, path, _ = tiny
    s = copy_of(path, tmp_path)
    extra = ["--out", str(tmp_path / "rep")] if command == "report" else []
    assert cli.main([command, str(s), "--run", run, *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and lines(err) == [f"dynamics: error: no run {run!r} in {s}"]
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("command, says", [("analyse", "holds no runs to analyse"),
                                           ("report", "holds no runs to report on"),
                                           ("gates", "holds no runs")])
def test_a_store_of_no_runs_is_named_exit_2(tmp_path, command, says, capsys):
    s = tmp_path / "empty.zarr"
    store.init_store(s)
    extra = ["--out", str(tmp_path / "rep")] if command == "report" else []
    assert cli.main([command, str(s), *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and lines(err) == [f"dynamics: error: {s} {says}"]
    # a sweep listed runs that never started: "holds no runs" beside `dynamics status` listing them pending
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {"ra": {"train.seed": 0}, "rb": {"train.seed": 1}}})
    assert cli.main([command, str(s), *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and lines(err) == [f"dynamics: error: {s} {says} yet: its sweep index lists 2 not started "
                                        "(pending in `dynamics status`; the sweep that lists them trains them)"]


# --- gates --------------------------------------------------------------------------------------


@pytest.mark.parametrize("save", [True, False])
def test_gates_says_what_it_fitted_first_and_where_it_saved_it_last(tiny, tmp_path, capsys, save):
    _, path, run_id = tiny
    s = copy_of(path, tmp_path)
    no_save = [] if save else ["--no-save"]
    assert cli.main(["gates", str(s), "--steps", "2", "--init-steps", "0", "--restarts", "1", *no_save]) == 0
    out = lines(capsys.readouterr().out)
    # "1 restarts": written as the report's CHG caption writes a fit's options
    assert out[0] == f"{run_id} at step 10: causal head gating, 1 restart(s) x 2 updates"
    saved = store.open_derived(s, f"gates.{run_id}")
    if save:
        assert out[-1] == f"saved to derived/gates.{run_id}" and saved is not None
        # a second fit says which it replaces: a quick refit took the place of a longer one unsaid
        assert cli.main(["gates", str(s), "--steps", "3", "--init-steps", "0", "--restarts", "1", "--lam", "0.3"]) == 0
        assert lines(capsys.readouterr().out)[-1] == (
            f"saved to derived/gates.{run_id} (replacing the fit saved before: step 10, 1 restart(s) x 2 updates, "
            "0 lambda=0 updates, lambda 0.1, no contrast; --no-save prints a fit without replacing it)")
        assert store.open_derived(s, f"gates.{run_id}").attrs["options"]["steps"] == 3
        # lambda=0 updates not given: as many as the G+/G- stage's, as the fit ran them
        for _ in range(2):
            assert cli.main(["gates", str(s), "--steps", "2", "--restarts", "1"]) == 0
        assert "1 restart(s) x 2 updates, 2 lambda=0 updates, lambda 0.1" in lines(capsys.readouterr().out)[-1]
    else:
        assert not any("saved" in line for line in out) and saved is None


def test_gates_progress_says_each_stage_s_start_and_end_and_nothing_between_within_5_s(capsys):
    show = messages.gates_progress("r1")
    for done in (0, 1, 4):
        show("G+/G-", done, 4)
    show("ablation", 0, 8)  # a new stage's start: said however soon
    assert capsys.readouterr().err.splitlines() == [
        "[gates r1] G+/G-: 0/4 updates", "[gates r1] G+/G-: 4/4 updates", "[gates r1] ablation: 0/8 passes"]


def test_gates_without_run_on_a_store_of_a_few_runs_lists_them_all(tiny, tmp_path, capsys):
    _, path, run_id = tiny
    s = copy_of(path, tmp_path)
    shutil.copytree(s / "runs" / run_id, s / "runs" / "copy0")  # group names are all list_runs reads
    runs = store.list_runs(s)
    assert cli.main(["gates", str(s)]) == 2
    assert lines(capsys.readouterr().err) == [
        f"dynamics: error: {s} holds 2 runs; choose one with --run ({runs[0]}, {runs[1]})"]


# --- sweep --------------------------------------------------------------------------------------


def test_a_sweep_with_every_run_finished_trains_nothing_and_exits_0(tiny, tmp_path, capsys):
    # Nothing left to train: no cluster is started, so this runs in the test's process.
    cfg, path, run_id = tiny
    s = copy_of(path, tmp_path)
    before = store.run_attrs(s, run_id)
    assert cli.main(["sweep", str(cfg), "--out", str(s), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"sweep: 1 run: 1 completed \(1 already finished, not retrained\) in \d+\.\d s", out.strip()), out
    assert store.run_attrs(s, run_id) == before


# --- demo ---------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_demo_on_a_device_this_torch_lacks_is_refused_before_any_store(tmp_path, capsys):
    out = tmp_path / "d.zarr"
    assert cli.main(["demo", "--out", str(out), "--set", "train.device=cuda"]) == 2
    assert lines(capsys.readouterr().err) == [
        f"dynamics: error: train.device 'cuda': this torch {torch.__version__} has no usable CUDA device"]
    assert not out.exists() and not (tmp_path / "d-report").exists()


# --- predict ------------------------------------------------------------------------------------


def test_predict_with_no_options_fits_the_documented_defaults(tmp_path, capsys):
    # --target slash, --horizon 0.1, --unit fraction, --group seed, --folds 5, --null 0, saved
    from dynamics import predict
    from tests.test_predict import make_runs, write_store

    s = tmp_path / "p.zarr"
    write_store(s, make_runs(n_seeds=5))
    assert cli.main(["predict", str(s)]) == 0
    out, err = capsys.readouterr()
    assert lines(out)[0] == "target slash: slash-dominant at the final snapshot"
    assert lines(out)[-1] == f"saved derived/predict.slash in {s}"
    assert "null check" not in out + err  # --null 0: no permuted curves fitted
    curve = store.open_derived(s, predict.derived_name("slash"))
    assert curve.horizon.values.tolist() == [0.1]
    assert {k: curve.attrs[k] for k in ("target", "horizon_unit", "group_by", "n_splits")} == {
        "target": "slash", "horizon_unit": "fraction", "group_by": "seed", "n_splits": 5}
    assert curve.attrs["target_sources"] == {"computed from the final snapshot": 5}
