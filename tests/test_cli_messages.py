"""What `status`, `run`, `analyse` and `gates` print: their tables, notes and closing lines, and the
cores `run` and `analyse` count as usable; `demo --help`'s report default; the line after Ctrl-C."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dynamics import store
from dynamics.config import load_config
from dynamics.train import train_run
from tests.conftest import cli_in_process, interrupt_at
from tests.test_cli import ROOT, dyn


def test_status_names_stopped_and_pending_runs(tiny, tmp_path):
    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    train_run(load_config(cfg), str(s))
    rid = store.list_runs(s)[0]
    store.update_run_attrs(s, rid, status="running")  # as a run killed by SIGKILL leaves it
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {rid: {"train.seed": 0}, "rnever": {"train.seed": 1}}})
    r = cli_in_process("status", s)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}
    assert rows[rid][2] == "stopped"
    assert rows["rnever"][1:] == ["1", "pending", "0/?", "-", "-"]
    # `--run` of that pending point: "no run 'rnever'" beside a status table that lists it
    for argv, verb in ((["analyse"], "analyse"), (["report", "--out", tmp_path / "rep"], "report on"),
                       (["gates"], "fit gates to")):
        r = cli_in_process(*argv[:1], s, *argv[1:], "--run", "rnever")
        assert (r.returncode, r.stderr.strip().splitlines()) == (
            2, [f"dynamics: error: run 'rnever' in {s} is a sweep point not started yet (pending): nothing to {verb}"])
    r = cli_in_process("analyse", s, "--run", "rnone")
    assert (r.returncode, r.stderr.strip()) == (2, f"dynamics: error: no run 'rnone' in {s}")


def status_rows(capsys, path) -> tuple[list[str], list[list[str]]]:
    from dynamics.cli import main

    assert main(["status", str(path)]) == 0
    header, *rows = (line.split() for line in capsys.readouterr().out.splitlines())
    return header, rows


def test_run_says_a_resumed_run_was_resumed_and_from_where(tiny, tmp_path):
    # "completed after 20 steps" read as 20 steps trained by this command, which trained the last 12
    _, cfg, _ = tiny
    s = tmp_path / "s.zarr"
    with pytest.raises(KeyboardInterrupt):
        train_run(load_config(cfg, ["train.steps=20", "record.every=15"]), str(s), progress=interrupt_at(10))
    r = cli_in_process("run", cfg, "--out", s, "--set", "train.steps=20", "--set", "record.every=15")
    assert r.returncode == 0, r.stderr
    [rid] = store.list_runs(s)
    assert r.stdout.strip() == f"{rid}: completed after 20 steps (resumed at step 8) -> {s}"
    fresh = tmp_path / "fresh.zarr"
    r = cli_in_process("run", cfg, "--out", fresh, "--set", "train.steps=20", "--set", "record.every=15")
    assert r.stdout.strip() == f"{rid}: completed after 20 steps -> {fresh}"


def test_run_says_how_many_gate_fits_training_will_wait_for(tiny, tmp_path):
    # record.chg_every: the progress lines paused for seconds at each fit, with nothing saying why
    _, cfg, _ = tiny
    r = cli_in_process("run", cfg, "--out", tmp_path / "c.zarr", "--set", "train.steps=8", "--set", "record.every=4",
                       "--set", "record.chg_every=2", "--set", "record.chg_steps=2")
    assert r.returncode == 0, r.stderr
    # snapshots at 0, 1, 2, 4, 8: fits at the 1st, 3rd and 5th (the last)
    assert ("dynamics: note: CHG is fitted at 3 of the 5 snapshots (record.chg_every = 2), 6 gate updates each; "
            "training waits for each fit, so the progress lines pause") in r.stderr.splitlines()


def test_status_says_where_an_interrupted_run_resumes(tiny, tmp_path, capsys):
    # Interrupted in progress(10), once update 10 is made, it showed "11/20" alone: a resume
    # restarts from its checkpoint at 8. The 3 steps past it, and the loss the attrs hold (step
    # 10's), the store never recorded: shown as what it records, those steps marked.
    _, cfg, _ = tiny
    s = tmp_path / "s.zarr"
    with pytest.raises(KeyboardInterrupt):
        train_run(load_config(cfg, ["train.steps=20", "record.every=15"]), str(s), progress=interrupt_at(10))
    [rid] = store.list_runs(s)
    loss = store.open_run(s, rid)["loss"].values
    assert np.isnan(loss[8:]).all() and store.run_attrs(s, rid)["last_loss"] != pytest.approx(float(loss[7]))
    header, [row] = status_rows(capsys, s)
    assert header == ["run", "status", "steps", "resumes_at", "last_loss"]
    assert row[1:] == ["interrupted", "8/20", "(+3", "unrecorded)", "8", f"{loss[7]:.4f}"]
    store.update_run_attrs(s, rid, status="running")  # as a run killed by SIGKILL leaves it
    _, [row] = status_rows(capsys, s)
    # the loss its store records, not "-" (the attrs' is written as a session ends, a kill's never)
    assert row[1:] == ["stopped", "8/20", "(+3", "unrecorded)", "8", f"{loss[7]:.4f}"]
    # killed after its checkpoint was written, before the attrs named it: the checkpoint's own step
    store.update_run_attrs(s, rid, checkpoint_step=4)
    _, [row] = status_rows(capsys, s)
    assert row[1:6] == ["stopped", "8/20", "(+3", "unrecorded)", "8"]
    store.update_run_attrs(s, rid, steps_done=4)  # and the steps done before it
    _, [row] = status_rows(capsys, s)
    assert row[1:4] == ["stopped", "8/20", "8"]
    store.update_run_attrs(s, rid, steps_done=11, checkpoint_step=8)
    (s / "checkpoints" / rid / "ckpt.pt").rename(tmp_path / "aside.pt")
    _, [row] = status_rows(capsys, s)
    # "8" offered a resume that `run` refuses; the steps are still those recorded, the loss unread
    assert row[1:] == ["stopped", "8/20", "(+3", "unrecorded)", "lost", "-"]
    (tmp_path / "aside.pt").rename(s / "checkpoints" / rid / "ckpt.pt")
    (s / "runs" / rid / "loss" / "c" / "0").unlink()  # a loss chunk before the checkpoint lost
    _, [row] = status_rows(capsys, s)
    # the attrs' step-10 loss was shown, and 8 steps of a store that records fewer
    assert row[1:] == ["stopped", "?/20", "refused", "-"]
    store.update_run_attrs(s, rid, status="completed")
    _, [row] = status_rows(capsys, s)
    assert row[1:4] == ["completed", "11/20", "-"]  # a finished run is never resumed


def test_status_lists_runs_in_the_grid_order_not_by_id(tiny, tmp_path, capsys):
    # Sorted by run id (hashes), recorded runs first, a grid read as a shuffle. The index lists the
    # grid in the config's order (seed slowest, init_scale 2.0 before 0.5); a later sweep's new value
    # comes after; a run outside any sweep last.
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [rid] = store.list_runs(s)  # recorded, and placed in the middle of the grid
    runs = {"rd": (0, 2.0), "rb": (0, 0.5), rid: (1, 2.0), "ra": (1, 0.5), "re": (0, 1.0)}
    store.write_sweep_index(s, {"axes": ["train.seed", "model.init_scale"],
                                "runs": {r: {"train.seed": a, "model.init_scale": b} for r, (a, b) in runs.items()}})
    header, rows = status_rows(capsys, s)
    assert header[:3] == ["run", "train.seed", "model.init_scale"]
    assert [r[0] for r in rows] == ["rd", "rb", "re", rid, "ra"]
    # a point never started has nothing to resume from: its resumes_at said 0, a checkpoint it does not have
    assert rows[3][3] == "completed" and all(r[3:6] == ["pending", "0/?", "-"] for r in rows if r[0] != rid)
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {"rz": {"train.seed": 0}}})
    _, rows = status_rows(capsys, s)
    assert [r[0] for r in rows] == ["rz", rid]
    # outside the index, its own config's seed, as the report's runs table shows it (it was blank)
    assert rows[1][1] == "0"
    # two sweeps of one grid from other base configs: each point's runs in the order the sweeps
    # recorded them (by id, ry and rb swapped places against rx and ra from point to point)
    two = {"ry": 0, "rx": 1, "rb": 0, "ra": 1}
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {r: {"train.seed": v} for r, v in two.items()}})
    _, rows = status_rows(capsys, s)
    assert [r[0] for r in rows] == ["ry", "rb", "rx", "ra", rid]


def test_analyse_of_one_head_per_layer_prints_divergence_undefined_with_the_reason(tiny, tmp_path):
    # The divergence column printed "nan" beside the bifurcation column's "undefined".
    _, cfg, _ = tiny
    path = tmp_path / "h1.zarr"
    train_run(load_config(cfg, ["model.n_heads=1"]), str(path))
    r = cli_in_process("analyse", path, "--workers", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header, row = lines[0].split(), lines[1].split()
    assert row[header.index("bifurcation")] == "undefined" and row[header.index("divergence")] == "undefined"
    assert not re.search(r"\bnan\b", r.stdout)  # as a number ("dominant" holds the letters)
    assert lines[2].startswith("bifurcation: step")  # the columns' legend, then why they are undefined
    assert lines[3].startswith("undefined: one head per layer, so no pair of heads to compare")


def test_analyse_table_lists_the_sweep_points_not_started(tiny, tmp_path):
    # On a sweep still running, or stopped part-way, the table left out the points not started
    # while `status` and the report list them: 1 row of a 3-point sweep read as the whole sweep.
    import shutil

    _, _, path = tiny
    partway = tmp_path / "partway.zarr"
    shutil.copytree(path, partway)
    (done,) = store.list_runs(partway)
    store.write_sweep_index(partway, {"axes": ["train.seed"], "runs": {
        "rlater": {"train.seed": 1}, done: {"train.seed": 0}, "rlast": {"train.seed": 2}}})
    r = cli_in_process("analyse", partway, "--workers", "1")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:4]]
    assert rows[0][:3] == ["rlater", "1", "pending"] and rows[2][:3] == ["rlast", "2", "pending"]
    assert r.stdout.splitlines()[1].endswith("not analysed (not started)")
    assert rows[1][:3] == [done, "0", "completed"]
    assert "analysed 1 run in" in r.stdout


def test_analyse_with_nothing_to_analyse_does_not_say_it_wrote_to_the_store(tiny, tmp_path):
    # "analysed 0 runs in 1.3s -> STORE (analysis/<run_id>)" read as a result written there
    import shutil

    _, _, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    (rid,) = store.list_runs(s)
    store.update_run_attrs(s, rid, status="running")  # killed outright: nothing finished to analyse
    before = sorted(p.relative_to(s) for p in (s / "analysis").rglob("*"))
    r = cli_in_process("analyse", s, "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "analysed no run: none could be (the table says why)"
    assert sorted(p.relative_to(s) for p in (s / "analysis").rglob("*")) == before


def test_gates_on_a_killed_run_names_it_stopped_not_running(tiny, tmp_path):
    # A run killed outright still says "running" in its attrs; gates' note repeated that, while
    # `dynamics status` calls it "stopped" (nothing trains it).
    _, cfg, _ = tiny
    path = tmp_path / "killed.zarr"
    with pytest.raises(KeyboardInterrupt):
        train_run(load_config(cfg), str(path), progress=interrupt_at(5))
    (rid,) = store.list_runs(path)
    store.update_run_attrs(path, rid, status="running")  # as SIGKILL leaves it: no chance to say otherwise
    r = cli_in_process("gates", path, "--steps", "2", "--init-steps", "0", "--restarts", "1", "--no-save")
    assert r.returncode == 0, r.stderr
    assert f"dynamics: note: run {rid} is stopped; these gates are fitted to its checkpoint at step" in r.stderr


def test_run_of_a_config_with_a_sweep_table_says_it_trains_the_base_point_only(tiny, tmp_path):
    _, cfg, _ = tiny
    swept = tmp_path / "swept.toml"
    swept.write_text(Path(cfg).read_text() + '\n[sweep]\n"train.seed" = [0, 1]\n')
    r = cli_in_process("run", swept, "--out", tmp_path / "s.zarr")
    assert r.returncode == 0, r.stderr
    assert "has a [sweep] table; `dynamics run` trains only its base point" in r.stderr
    assert len(store.list_runs(tmp_path / "s.zarr")) == 1
    assert "[sweep]" not in r.stdout
    # a table given by --set is said to be: the file has none
    r = cli_in_process("run", cfg, "--out", tmp_path / "s2.zarr", "--set", "sweep.train.seed=[1, 2]")
    assert r.returncode == 0, r.stderr
    assert (f"dynamics: note: {cfg} with --set sweep.train.seed has a [sweep] table; `dynamics run` trains only its "
            f"base point (`dynamics sweep` trains the grid)") in r.stderr.splitlines()


def test_run_refuses_a_config_whose_sweep_grid_dynamics_sweep_would_refuse(tiny, tmp_path):
    # run trains the base point only, but a grid point that cannot be trained is a mistake in the
    # file: refused here as `dynamics sweep` refuses it, in one line, with nothing written
    _, cfg, _ = tiny
    swept = tmp_path / "bad_grid.toml"
    swept.write_text(Path(cfg).read_text() + '\n[sweep]\n"model.n_heads" = [2, 3]\n')
    out = tmp_path / "never.zarr"
    r = cli_in_process("run", swept, "--out", out)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"dynamics: error: sweep point model.n_heads=3: model.n_heads: 3 does not divide model.d_model 32 (or set "
        f"model.d_head) ({swept}'s [sweep] table; `dynamics run` trains only its base point, but `dynamics sweep` "
        f"of it would be refused)"]
    assert not out.exists()


def test_demo_help_gives_the_report_default_that_follows_out():
    # cmd_demo puts the report next to --out (x.zarr -> x-report); the help said runs/quickstart-report always
    r = dyn("demo", "--help")
    assert r.returncode == 0
    assert "<store>-report next to the store" in " ".join(r.stdout.split())


def test_analyse_defaults_to_the_cores_this_process_may_use(tiny, monkeypatch):
    import os

    import dynamics.analyse
    from dynamics import cli

    _, _, path = tiny
    seen = []
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(dynamics.analyse, "analyse_store", lambda *a, workers, **k: seen.append(workers) or [])
    cli.analyse_store(str(path))
    assert seen == [1]  # as the sweep's default_workers: one process per usable core, not per machine core


def test_run_notes_threads_beyond_the_cores_it_may_use(tiny, tmp_path, monkeypatch, capsys):
    # Not refused (a config may be meant for a larger machine), but said: the threads share cores.
    import os

    from dynamics.cli import main

    _, cfg, path = tiny
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    fresh = str(tmp_path / "t.zarr")
    assert main(["run", str(cfg), "--out", fresh, "--set", "train.threads=2", "--set", "train.steps=2"]) == 0
    assert ("dynamics: note: train.threads 2 is more than the 1 core this process may use; its threads would "
            "share cores and train slower") in capsys.readouterr().err
    assert main(["run", str(cfg), "--out", str(path)]) == 0
    assert "train.threads" not in capsys.readouterr().err
    assert main(["run", str(cfg), "--out", str(path), "--set", "train.threads=2"]) == 0  # completed: skipped
    assert "note" not in capsys.readouterr().err  # nothing trains: nothing to note


def test_status_tells_apart_runs_outside_a_sweep_that_differ_only_in_their_seed(tiny, tmp_path):
    # `dynamics run --set train.seed=5` and `=6` into one store: two rows told apart by their hash alone
    import shutil

    from dynamics.config import with_values
    from dynamics.status import status_table

    _, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [first] = store.list_runs(s)
    other = train_run(with_values(load_config(cfg), {"train.seed": 5}), str(s)).run_id
    header, rows, _ = status_table(str(s))
    assert header[:3] == ["run", "train.seed", "status"]
    assert {r[0]: r[1] for r in rows} == {first: str(load_config(cfg).train.seed), other: "5"}


def test_status_tells_apart_runs_at_one_swept_point_by_the_settings_that_differ(tiny, tmp_path, capsys):
    # A seed sweep from two base configs (--set train.lr=...) into one store, and a seed sweep of
    # conditioned gates beside its free runs (README, Configs): status showed only the swept columns,
    # so the three runs of seed 0 were three identical rows, while the report's runs table names them.
    import shutil
    import tomllib

    from dynamics.config import from_dict, with_values
    from dynamics.status import status_table

    d, cfg, path = tiny
    s = tmp_path / "s.zarr"
    shutil.copytree(path, s)
    [free] = store.list_runs(s)
    base = from_dict(tomllib.loads(cfg.read_text()))
    slow = train_run(with_values(base, {"train.lr": 1e-3}), str(s)).run_id
    gated = train_run(from_dict({**tomllib.loads(cfg.read_text()),
                                 "intervene": {"conditioned_gates": {"pool": "mean"}}}), str(s)).run_id
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {free: {"train.seed": 0}, slow: {"train.seed": 0},
                                                                 gated: {"train.seed": 0}, "rp": {"train.seed": 1}}})
    header, rows, damaged = status_table(str(s))
    assert not damaged
    assert header[:4] == ["run", "train.seed", "intervene.conditioned_gates", "train.lr"]
    got = {r[0]: r[1:4] for r in rows}
    assert got[free] == ["0", "none", "0.003"] and got[slow] == ["0", "none", "0.001"]
    assert got[gated][0::2] == ["0", "0.003"] and '"pool":"mean"' in got[gated][1] and " " not in got[gated][1]
    assert got["rp"] == ["1", "", ""]  # pending: no config to show
    assert len({tuple(r[1:4]) for r in rows}) == 4

    # the analyse (and demo) table had the same identical rows: it shares status's columns
    from dynamics.tables import print_analysis

    row = {"status": "completed", "bifurcation_step": 10, "final_divergence": 0.25, "redundancy": 0.0,
           "slash_dominant": 0, "roles": {"none": 4}}
    capsys.readouterr()
    print_analysis([{"run": r} | row for r in (free, slow, gated)], str(s), pending=True)
    table = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert table[0][:5] == ["run", "train.seed", "intervene.conditioned_gates", "train.lr", "status"]
    shown = {line[0]: line[1:4] for line in table[1:]}
    assert shown[free] == ["0", "none", "0.003"] and shown[slow] == ["0", "none", "0.001"]
    assert shown[gated][0::2] == ["0", "0.003"] and '"pool":"mean"' in shown[gated][1]
    assert shown["rp"][:2] == ["1", "pending"]  # no config: blank settings

    # one base config: nothing to tell apart, no extra column
    store.write_sweep_index(s, {"axes": ["train.seed"], "runs": {free: {"train.seed": 0}, slow: {"train.seed": 1}}})
    header, _, _ = status_table(str(s))
    assert "train.lr" not in header  # the two are at different points; gated, outside the index, alone there


def test_ctrl_c_while_zarr_waits_prints_no_never_awaited_warning(tmp_path):
    # Ctrl-C before zarr's event loop ran the coroutine its sync() handed over left that
    # coroutine never run, and Python printed a RuntimeWarning after the one line, at exit.
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import sys\n"
        "from dynamics import cli\n"
        "async def write(): pass\n"
        "def status(args):\n"
        "    pending = write()  # as zarr's sync() leaves it\n"
        "    raise KeyboardInterrupt\n"
        "cli.cmd_status = status\n"
        "from dynamics.__main__ import console  # the program: a program calling main keeps its warnings\n"
        "sys.argv[1:] = ['status', 'x.zarr']\n"
        "sys.exit(console())\n"
    )
    done = subprocess.run([sys.executable, "-W", "default", str(script)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 130
    assert done.stderr.strip() == "dynamics: interrupted; nothing was written"


def test_run_interrupted_as_its_run_finishes_says_it_finished(tiny, tmp_path, monkeypatch):
    # Ctrl-C held back while the completed status was written: the line said "interrupted; runs are
    # resumable with the same command", with no "completed" line, for a run that had completed
    import os
    import signal

    from dynamics.store.writer import RunWriter

    _, cfg, _ = tiny
    s = tmp_path / "s.zarr"
    real = RunWriter.set_attrs

    def signalled(self, **attrs):
        if attrs.get("status") == "completed":
            os.kill(os.getpid(), signal.SIGTERM)  # `dynamics run` takes SIGTERM as Ctrl-C
        return real(self, **attrs)

    monkeypatch.setattr(RunWriter, "set_attrs", signalled)
    r = cli_in_process("run", cfg, "--out", s)
    [rid] = store.list_runs(s)
    assert r.returncode == 130
    assert r.stdout.strip().endswith(f"{rid}: completed after {store.run_attrs(s, rid)['steps_done']} steps -> {s}")
    assert r.stderr.strip().splitlines()[-1] == (f"dynamics: interrupted as {rid} finished: it is completed, with "
                                                 "nothing left to resume")


def test_run_and_sweep_note_an_induction_period_past_the_vocabulary_and_too_few_snapshots(tiny, tmp_path, capsys):
    # Not refused (config_rules.validate: a harder task), but said as training starts: segments
    # cannot be distinct, in any row. So are 2 steps' 3 snapshots, too few for analyse (4).
    from dynamics.cli import main

    _, cfg, _ = tiny
    small = ["--set", "model.vocab_size=5", "--set", "train.steps=2"]  # TINY's max_period is 6
    assert main(["run", str(cfg), "--out", str(tmp_path / "r.zarr"), *small]) == 0
    err = capsys.readouterr().err
    assert ("dynamics: note: task.max_period 6 is above model.vocab_size 5: induction segments are drawn with "
            "tokens that may repeat, in every row") in err
    assert "dynamics: note: the snapshot schedule records 3 snapshot(s) (train.steps 2, record.dense_until" in err
    grid = ["--set", "sweep.model.vocab_size=[5,16]", "--set", "train.steps=2"]
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "s.zarr"), "--workers", "1", *grid]) == 0
    err = capsys.readouterr().err
    assert ("dynamics: note: 1 of the 2 sweep points have task.max_period above model.vocab_size (the first: 6 "
            "above 5)") in err
    assert "dynamics: note: 2 of the 2 sweep points record fewer than 4 snapshots (the first: 3) (train.steps 2" in err
    assert main(["run", str(cfg), "--out", str(tmp_path / "t.zarr"), "--set", "train.steps=2"]) == 0
    assert "vocab_size" not in capsys.readouterr().err  # TINY's 16 holds a period of 6
