"""What a sweep shows as it goes (log lines, tqdm bars) and the summary it ends with, line for line."""

import io
import sys

from dynamics.sweep import SweepSummary
from dynamics.sweep.progress import _Bars, _Display, _display, _Quiet


def test_the_summary_names_each_run_that_did_not_simply_finish():
    summary = SweepSummary(
        total=6, counts={"cancelled": 1, "completed": 3, "failed": 2}, skipped=["rs"], failed=["rf", "rg"],
        cancelled=["rc"], errors={"rf": "ValueError: bad", "rc": "its task was cancelled on the cluster (x)"},
        waited={"rw": "another process (pid 7) was training it; that process ended it completed"},
        after_cancel={"ra": "it had finished before its task was cancelled on the cluster (x)"},
        labels={"rf": "train.seed=0", "rc": "train.seed=2", "rw": "train.seed=3", "ra": "train.seed=4"},
        wall_time=12.34)
    assert summary.lines() == [
        # by count, most first: ties in the order counted
        "sweep: 6 runs: 3 completed, 2 failed, 1 cancelled (1 already finished, not retrained) in 12.3 s",
        "  failed rf [train.seed=0]: ValueError: bad",
        "  failed rg [?]: ?",  # no label nor error recorded: said so, not a KeyError
        "  cancelled rc [train.seed=2]: its task was cancelled on the cluster (x)",
        "  waited for rw [train.seed=3]: another process (pid 7) was training it; that process ended it completed",
        "  finished ra [train.seed=4]: it had finished before its task was cancelled on the cluster (x)",
    ]
    assert not summary.ok


def test_a_sweep_with_nothing_to_do_says_so():
    assert SweepSummary().lines() == ["sweep: 0 runs: nothing to do in 0.0 s"]
    assert SweepSummary().ok


def test_a_one_run_sweep_says_run_not_runs():
    assert SweepSummary(total=1, counts={"completed": 1}, wall_time=2.0).lines() == [
        "sweep: 1 run: 1 completed in 2.0 s"]


def test_only_completed_and_diverged_runs_are_ok():
    assert SweepSummary(counts={"completed": 2, "diverged": 1}).ok
    for status in ("failed", "interrupted", "cancelled"):
        assert not SweepSummary(counts={"completed": 2, status: 1}).ok, status


def test_the_log_lists_only_runs_still_running():
    log = io.StringIO()
    display = _Display(2, 0, stream=log, every=0)
    display.tick()  # nothing running yet: no line saying "running:" of nothing
    display.step("ra", 3, 12, 1.0)
    display.step("rb", 5, 12, 1.0)
    display.finished("ra", "completed")
    display.tick()
    display.finished("rb", "completed")
    display.tick()
    assert log.getvalue().splitlines() == [
        "[sweep] ra completed (1/2 finished)",
        "[sweep] 1/2 finished; running: rb 5/12",
        "[sweep] rb completed (2/2 finished)",
    ]


def test_the_log_says_how_long_a_running_run_has_not_reported(monkeypatch):
    # A run whose worker died, or whose reports a lost scheduler no longer passed on, stayed in the
    # running line with its last count, unchanged, as if training (three runs on two workers).
    from dynamics.sweep import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    display = _Display(3, 0, stream=log, every=0)
    display.step("ra", 660, 1500, 1.0)
    clock[0] += progress.QUIET_S - 1.5
    display.step("rb", 630, 1500, 1.0)  # rb starts later, and reports at its pace
    clock[0] += 0.5
    display.step("rb", 700, 1500, 1.0)  # ra silent for QUIET_S - 1 s: not yet said
    display.tick()
    clock[0] += 1
    display.tick()  # ra silent for QUIET_S now
    clock[0] += 20.6
    display.tick()  # rb silent since its report 21.6 s ago, ra for 50.6 s
    clock[0] += 9
    display.tick()
    assert log.getvalue().splitlines() == [
        "[sweep] 0/3 finished; running: ra 660/1500, rb 700/1500",
        "[sweep] 0/3 finished; running: ra 660/1500 (no report for 30 s), rb 700/1500",
        "[sweep] 0/3 finished; running: ra 660/1500 (no report for 51 s), rb 700/1500",
        "[sweep] 0/3 finished; running: ra 660/1500 (no report for 60 s), rb 700/1500 (no report for 31 s)",
    ]
    # a run whose steps are slow reports every 10 steps far apart: marked only past 3 times its own
    # longest gap (40 s here), not at 30 s while it trains on
    log.seek(0)
    log.truncate()
    display.step("rc", 10, 40, 1.0)
    clock[0] += 40
    display.step("rc", 20, 40, 1.0)
    display.finished("ra", "failed")
    display.finished("rb", "failed")
    log.truncate(0)
    log.seek(0)
    clock[0] += 119
    display.tick()
    clock[0] += 1
    display.tick()
    assert log.getvalue().splitlines() == ["[sweep] 0/3 finished; running: rc 20/40",
                                           "[sweep] 0/3 finished; running: rc 20/40 (no report for 120 s)"]


def test_the_bars_follow_each_run_below_the_overall_bar():
    term = io.StringIO()
    bars = _Bars(3, 0, stream=term)
    try:
        bars.step("ra", 2, 12, 1.0)
        bars.step("ra", 9, 12, 0.5)
        bars.step("rb", 1, 12, 1.0)
        assert bars.bars["ra"].n == 9 and bars.bars["rb"].n == 1
        assert (bars.slot["ra"], bars.slot["rb"]) == (1, 2)  # 0 is the overall bar's
        bars.finished("ra", "completed", " (finished by another process)")
        bars.step("rc", 1, 12, 1.0)
        assert bars.slot["rc"] == 1  # the slot ra left
        # a note on a finished run is news (it was waited for): written, not only counted
        assert "[sweep] ra completed (finished by another process)" in term.getvalue()
        assert bars.overall.n == 1
        # the lines README quotes, as the plain log writes them
        bars.waiting("rd", "another process (pid 7) is training it")
        bars.notice("no worker is connected to the scheduler: x")
        lines = term.getvalue().splitlines()
        assert any(s.endswith("[sweep] rd waiting: another process (pid 7) is training it") for s in lines)
        assert any(s.endswith("[sweep] no worker is connected to the scheduler: x") for s in lines)
    finally:
        bars.close()


def test_the_display_is_chosen_by_the_progress_option():
    quiet, bars, log = _display(False, 2, 0), _display(True, 2, 0), _display(None, 2, 0)
    try:
        assert type(quiet) is _Quiet and type(bars) is _Bars
        assert type(log) is (_Bars if sys.stderr.isatty() else _Display)  # unset: bars on a terminal only
    finally:
        bars.close()
        log.close()


def test_progress_counts_only_finished_runs():
    # After Ctrl-C the plain log read "[sweep] 4/4 rc cancelled" with two of the four runs not
    # trained: every run that ended was counted as done. Only completed and diverged runs are
    # finished; the others train again on the next launch. On a terminal, the overall bar likewise,
    # and a run's note went to stdout while the bars drew on stderr.
    import io

    from dynamics.sweep.progress import _Bars, _Display

    log = io.StringIO()
    display = _Display(5, 1, stream=log, every=0)  # one run already finished before this launch
    display.starting(4, 2)  # in a log, the first line came ten seconds in, with the first step report
    display.step("rb", 5, 12, 1.0)
    display.tick()
    for run_id, status in [("ra", "completed"), ("rb", "interrupted"), ("rc", "cancelled"), ("rd", "failed"),
                           ("re", "diverged")]:
        display.finished(run_id, status)
    assert log.getvalue().splitlines() == [
        "[sweep] 4 run(s) to train on 2 worker(s), 1 of 5 already finished; a line as each ends, and the running "
        "ones every 0 s",
        "[sweep] 1/5 finished; running: rb 5/12", "[sweep] ra completed (2/5 finished)",
        "[sweep] rb interrupted (2/5 finished)", "[sweep] rc cancelled (2/5 finished)",
        "[sweep] rd failed (2/5 finished)", "[sweep] re diverged (3/5 finished)"]
    given = io.StringIO()
    _Display(2, 0, stream=given, every=0).starting(2, "tcp://10.0.0.5:8786")  # its size is the cluster's own
    assert given.getvalue().startswith("[sweep] 2 run(s) to train on the cluster at tcp://10.0.0.5:8786, 0 of 2 ")
    term = io.StringIO()
    bars = _Bars(5, 1, stream=term)
    bars.finished("ra", "completed")
    bars.finished("rc", "cancelled")
    assert bars.overall.n == 2 and "rc cancelled" in term.getvalue()
    bars.close()


def test_the_stop_line_is_written_above_the_bars_not_at_the_end_of_one():
    # A plain print after Ctrl-C landed at the end of a bar's line ("...loss=1.671]dynamics: stopping").
    out = io.StringIO()
    bars = _Bars(2, 0, stream=out)
    bars.step("ra", 3, 12, 1.0)
    bars.say("dynamics: stopping the sweep (Ctrl-C again to abort at once); runs stay resumable")
    text = out.getvalue()
    before = text[:text.index("dynamics: stopping")]
    # from the start of the line (a carriage return or newline) only cursor moves, no bar's text
    assert before[max(before.rfind("\r"), before.rfind("\n")) + 1:].replace("\x1b[A", "") == "", repr(before[-60:])
    bars.close()
    log = io.StringIO()
    _Display(2, 0, stream=log).say("dynamics: stopping")
    assert log.getvalue() == "dynamics: stopping\n"


def test_a_resumed_runs_bar_starts_at_its_step():
    # from 0, its rate counted the steps before the resume as done in the first second
    import io

    from dynamics.sweep.progress import _Bars

    d = _Bars(total=2, done=0, stream=io.StringIO())
    d.step("r1", 1500, 2000, 0.5)
    assert d.bars["r1"].initial == 1500 and d.bars["r1"].n == 1500
    d.close()
