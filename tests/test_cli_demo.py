"""`dynamics demo` end to end, in process, on a shrunken quickstart grid (4 runs of 40 steps):
the four stages in order, their tables, the closing timing line and the report page; then the
same command again, which retrains nothing and says why it gives no share of training. That
closing line's wording is also checked case by case, calling demo_timing directly."""

import html
import re

from dynamics import cli, store

SHRINK = ["--workers", "1", "--set", "sweep.model.init_scale=[1.0,2.0]", "--set", "sweep.train.seed=[0,1]",
          "--set", "train.steps=40", "--set", "model.d_model=16", "--set", "record.every=10",
          "--set", "record.dense_until=4", "--set", "train.warmup_steps=5"]


def test_the_demo_sweeps_analyses_predicts_and_reports_then_retrains_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "d.zarr"
    assert cli.main(["demo", "--out", str(out), *SHRINK]) == 0
    printed, err = capsys.readouterr()
    assert "not all trained by the same dynamics code" not in err  # one checkout trained them all
    assert "not all trained with the same torch build" not in err  # on one machine
    banners = [line for line in printed.splitlines() if line.startswith("== ")]
    assert banners == [f"== 1/4 sweep: quickstart.toml -> {out}",
                       f"== 2/4 analyse (cross-seed consistency left out: `dynamics analyse {out}` gives it)",
                       "== 3/4 predict: how early is each head's final role readable from its early training (gradients, attention, weights)?",
                       "== 4/4 report"]
    assert re.search(r"^sweep: 4 runs: 4 completed in [\d.]+ s$", printed, re.M), printed
    ids = store.list_runs(str(out))
    assert len(ids) == 4 and all(store.run_attrs(str(out), r)["status"] == "completed" for r in ids)
    # the analysis table: one row per run, each analysed (written next to its recordings)
    assert all(re.search(rf"^{r} .* completed ", printed, re.M) for r in ids), printed
    assert all(store.open_analysis(str(out), r) is not None for r in ids)
    # the predictor's table for the role target, saved to the store, and its verdict line
    assert "target role: role label at the final snapshot" in printed and "\nhow early: " in printed
    curve = store.open_derived(str(out), "predict.role")
    assert curve is not None and list(curve["horizon"].values) == [0.0, 0.05, 0.1, 0.2, 0.5]
    assert f"\nsaved derived/predict.role in {out}\n" in printed  # said, and nothing saved before to replace
    assert re.search(r"^training [\d.]+s, analysis [\d.]+s \([\d.]+% of training\), total \d+s$", printed, re.M)
    page = tmp_path / "d-report" / "index.html"
    assert page.is_file() and f"report: {page}\nopen {page.as_uri()}\n" in printed
    assert 'class="note"' not in page.read_text()

    # the same command again: every run already finished, so no training to take a share of.
    # One run now reads as trained by other code (a run kept from an older checkout), another as
    # trained with other CPU kernels (one from another machine): each said once, after the
    # analysis, naming it, as analyse, predict and report say it
    older, elsewhere = ids[2], ids[3]
    store.update_run_attrs(str(out), older, code_hash="0123456789ab" + "0" * 52)
    here = store.run_attrs(str(out), ids[0])
    there = "AVX2" if here["cpu_capability"] != "AVX2" else "AVX512"
    store.update_run_attrs(str(out), elsewhere, cpu_capability=there)
    assert cli.main(["demo", "--out", str(out), *SHRINK]) == 0
    again, err = capsys.readouterr()
    code = store.run_attrs(str(out), ids[0])["code_hash"][:12]
    note = (f"dynamics: note: these 4 runs were not all trained by the same dynamics code (code hash {code}: "
            f"{', '.join(r for r in ids if r != older)}; 0123456789ab: {older}): a difference between them may be "
            f"the code's, not the experiment's (each run's code_hash and resumes attributes say which)\n")
    machine = (f"dynamics: note: these 4 runs were not all trained with the same torch build, device and CPU kernels "
               f"(torch {here['torch_version']}, cpu, {here['cpu_capability']}: "
               f"{', '.join(sorted(r for r in ids if r != elsewhere))}; torch {here['torch_version']}, cpu, {there}: "
               f"{elsewhere}): they may round differently, so a difference between them may be the machine's, not the "
               f"experiment's (each run's torch_version, device, cpu_capability and resumes attributes say which)\n")
    assert err.count(note) == 1 and err.count(machine) == 1, err
    assert re.search(r"^sweep: 4 runs: 4 completed \(4 already finished, not retrained\) in [\d.]+ s$", again, re.M), again
    assert re.search(r"^training [\d.]+s, analysis [\d.]+s \(no share of training: 4 of 4 runs were already "
                     r"finished, not retrained\), total \d+s$", again, re.M), again
    assert [store.run_attrs(str(out), r)["starts"] for r in ids] == [1, 1, 1, 1]
    # its curve replaces the first demo's, and says so (a curve of the user's own would go the same way)
    assert (f"saved derived/predict.role in {out} (replacing the curve saved before, of horizons 0,0.05,0.1,0.2,0.5 "
            "(fraction); --no-save prints a curve without replacing it)") in again
    for command in (["analyse", str(out)], ["predict", str(out), "--target", "role", "--no-save"],
                    ["report", str(out), "--out", str(tmp_path / "r2")]):
        assert cli.main(command) == 0
        err = capsys.readouterr().err
        assert err.count(note) == 1 and err.count(machine) == 1, (command, err)
    # and the page says both under its heading, as the demo's own report now does
    for folder in ("r2", "d-report"):
        for said in (note, machine):
            sentence = "T" + said.removeprefix("dynamics: note: t").rstrip("\n")
            assert f'<p class="note">Note: {html.escape(sentence)}.</p>' in (tmp_path / folder / "index.html").read_text()


    # --out at a store holding other runs (here the 4 above, for a grid of another seed): they are
    # analysed, predicted and reported with the demo's, said so, and the closing line's share,
    # 6 runs' analysis against 2 runs' training, is not given
    # (and the earlier report's figures, which cannot be removed this time, are a note on stderr:
    # write_report, given no handler, gave it as a Python warning)
    import errno

    from dynamics.report import page as page_module

    def refused(folder):
        raise PermissionError(errno.EACCES, "Permission denied", str(folder))

    monkeypatch.setattr(page_module, "_delete_generation", refused)
    other_seed = [a if a != "sweep.train.seed=[0,1]" else "sweep.train.seed=[2]" for a in SHRINK]
    assert cli.main(["demo", "--out", str(out), *other_seed]) == 0
    third, err = capsys.readouterr()
    assert "dynamics: note: the report is written, but the earlier report's figures could not all be removed " \
           "(Permission denied on " in err, err
    assert f"dynamics: note: {out} holds 4 run(s) besides this demo's 2; the analysis, predictor and report below " \
           f"include them\n" in err, err
    assert re.search(r"^training [\d.]+s, analysis [\d.]+s \(no share of training: the store's 4 other run\(s\) were "
                     r"analysed or kept too, not trained\), total \d+s$", third, re.M), third


def test_demo_timing_gives_a_share_of_training_only_when_it_trained_every_run():
    # a second `dynamics demo` of one store trained nothing and printed
    # "training 0.0s, analysis 4.9s (26694.6% of training)"
    from dynamics.tables import demo_timing

    assert demo_timing(80.0, 8.0, 95.4, 0, 12) == "training 80.0s, analysis 8.0s (10.0% of training), total 95s"
    assert demo_timing(0.02, 4.9, 9.0, 12, 12) == ("training 0.0s, analysis 4.9s (no share of training: 12 of 12 "
                                                   "runs were already finished, not retrained), total 9s")
    assert "% of training" not in demo_timing(40.0, 8.0, 50.0, 6, 12)
    # --out at a store of another config's runs: 24 runs' analysis against 12 runs' training, "18.6%"
    assert demo_timing(31.9, 5.9, 50.0, 0, 12, 12) == ("training 31.9s, analysis 5.9s (no share of training: the "
                                                       "store's 12 other run(s) were analysed or kept too, not trained), total 50s")
    # runs resumed from a checkpoint trained 100 of their 600 steps here: "22.4% of training", against
    # 10.1% for the same grid trained whole; and every run failed, none analysed: "13.3%"
    assert demo_timing(9.3, 2.1, 12.0, 0, 2, resumed=2) == (
        "training 9.3s, analysis 2.1s (no share of training: 2 of 2 runs were resumed from a checkpoint, not trained "
        "whole here), total 12s")
    assert "no share of training: no run was analysed" in demo_timing(10.1, 1.3, 12.0, 0, 8, analysed=0)
    assert "10.0% of training" in demo_timing(80.0, 8.0, 95.4, 0, 12, resumed=0, analysed=12)



def test_a_demo_stopped_past_its_sweep_says_what_each_stage_kept(tmp_path, capsys, monkeypatch):
    # Stopped in the analysis or the report, the demo said "runs are resumable with the same
    # command", as in its sweep, though every run had ended and nothing was left to resume.
    # A real SIGTERM, which the command takes as Ctrl-C, sent as each stage starts.
    import os
    import signal

    from dynamics.exits import AFTER_INTERRUPT

    out = tmp_path / "d.zarr"
    two = [a if a != "sweep.model.init_scale=[1.0,2.0]" else "sweep.model.init_scale=[1.0]" for a in SHRINK]
    assert cli.main(["demo", "--out", str(out), *two]) == 0
    capsys.readouterr()
    pages = sorted(p.name for p in (tmp_path / "d-report").iterdir())

    def signalled(real):
        def stage(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return real(*args, **kwargs)
        return stage

    for name, kept in (("analyse_store", "demo analyse"), ("write_report", "demo report")):
        with monkeypatch.context() as m:
            if name == "analyse_store":
                m.setattr(cli, name, signalled(cli.analyse_store))
            else:
                import dynamics.report

                m.setattr(dynamics.report, name, signalled(dynamics.report.write_report))
            assert cli.main(["demo", "--out", str(out), *two]) == 130
        err = capsys.readouterr().err
        assert err.splitlines()[-1] == f"dynamics: interrupted; {AFTER_INTERRUPT[kept]}", err
        assert "resumable" not in err
    assert AFTER_INTERRUPT["demo report"].startswith("training, the analysis and the predictor curve have ended")
    # and what the lines say was kept is: no run retrained, the earlier report whole
    assert [store.run_attrs(str(out), r)["starts"] for r in store.list_runs(str(out))] == [1, 1]
    assert sorted(p.name for p in (tmp_path / "d-report").iterdir()) == pages


def test_the_demo_says_the_notes_sweep_says_as_it_starts(tmp_path, capsys, monkeypatch):
    # At 2 steps a run each records 3 snapshots, too few for analyse: `sweep` said so as it started,
    # and the demo trained all its runs without a word. Stopped by a real SIGTERM as training starts.
    import os
    import signal

    import dynamics.sweep

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(dynamics.sweep, "run_sweep", stopped)
    two = [a if a != "train.steps=40" else "train.steps=2" for a in SHRINK]
    assert cli.main(["demo", "--out", str(tmp_path / "d.zarr"), *two]) == 130
    err = capsys.readouterr().err
    assert err.startswith("dynamics: note: 4 of the 4 sweep points record fewer than 4 snapshots (the first: 3) "
                          "(train.steps 2, record.dense_until 4, record.every 10)"), err
