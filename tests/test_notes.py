"""The notes run and sweep give as they start."""

from dynamics.config import from_dict
from dynamics.notes import few_snapshots_note, start_notes


def cfg(steps, dense_until=64, every=100):
    return from_dict({"train": {"steps": steps}, "record": {"dense_until": dense_until, "every": every}})


def test_a_schedule_of_too_few_snapshots_to_analyse_is_noted_not_refused():
    # 300 steps, no dense phase, every 500: snapshots at steps 0 and 300 only, where analyse
    # needs baseline_snapshots + 1 = 4; the first word of it came from analyse, after training.
    note = few_snapshots_note([cfg(300, 0, 500)])
    assert note == ("the snapshot schedule records 2 snapshot(s) (train.steps 300, record.dense_until 0, record.every "
                    "500); `dynamics analyse` needs at least 4, so such a run trains but cannot be analysed: lower "
                    "record.every or raise record.dense_until")
    assert few_snapshots_note([cfg(2)]).startswith("the snapshot schedule records 3 snapshot(s)")  # 0, 1, 2
    assert few_snapshots_note([cfg(3)]) is None  # 0, 1, 2 and the last, 3: exactly enough
    assert few_snapshots_note([cfg(1), cfg(4), cfg(2)]).startswith(
        "2 of the 3 sweep points record fewer than 4 snapshots (the first: 2) (train.steps 1, ")
    assert start_notes([cfg(4)]) == [] and start_notes([cfg(1)]) == [few_snapshots_note([cfg(1)])]
    # under 3 steps no schedule gives 4 snapshots: the advice is more steps, not another cadence
    assert few_snapshots_note([cfg(2, 64, 1)]).endswith(
        "cannot be analysed: raise train.steps to at least 3 (a run of N steps has at most N + 1 snapshots)")
    assert few_snapshots_note([cfg(10, 0, 500)]).endswith("lower record.every or raise record.dense_until")
    # 3 steps at that cadence: 0 and 3, two snapshots; the steps are already 3, so the cadence is the fix
    assert few_snapshots_note([cfg(3, 0, 500)]).endswith("cannot be analysed: lower record.every or raise "
                                                         "record.dense_until")
    # 2 steps: more steps, and at 3 this cadence still records 2, so the cadence too (it said steps
    # alone, then, at 3 steps, a second note said the cadence)
    assert few_snapshots_note([cfg(2, 0, 500)]).endswith(
        "raise train.steps to at least 3 (a run of N steps has at most N + 1 snapshots), and lower record.every or "
        "raise record.dense_until")
    # 2 steps, dense_until 1, every 3: at 3 steps this cadence records 0, 1, 3: still 3, so the cadence too
    assert few_snapshots_note([cfg(2, 1, 3)]).endswith(", and lower record.every or raise record.dense_until")
    # one point of a sweep of three: a sweep's note, in the singular, not the one-run note
    assert few_snapshots_note([cfg(1), cfg(4), cfg(4)]).startswith(
        "1 of the 3 sweep points records fewer than 4 snapshots (the first: 2)")


def test_the_schedule_is_counted_not_built_so_a_long_run_is_noted_at_once():
    # The note built each point's schedule to count it: about 4 s and 765 MB a point at 10**7
    # steps (7.4 s for a 12-point sweep at 3 * 10**6), and 10**8 steps are allowed. Counted, it
    # holds nothing; built, these 12 points at 10**6 steps would peak near 80 MB.
    import tracemalloc

    tracemalloc.start()
    assert few_snapshots_note([cfg(10**6, 64, 1)] * 12) is None
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20, peak  # bytes


def test_the_notes_import_no_analyser():
    # The note read the analysers' default early band from AnalysisOptions, which imported xarray
    # and scipy into every `dynamics run` and `dynamics sweep`: 1 to 3 s before training.
    import subprocess
    import sys

    code = ("import sys; from dynamics.config import from_dict; from dynamics.notes import start_notes; "
            "start_notes([from_dict({'train': {'steps': 2}})]); "
            "print(sorted(m for m in sys.modules if m.startswith(('dynamics.analysis', 'xarray', 'scipy'))))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
