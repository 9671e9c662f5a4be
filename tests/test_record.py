"""The snapshot schedule."""

import numpy as np

from dynamics.record import snapshot_steps


def test_schedule_dense_then_every_then_last():
    assert snapshot_steps(1000, 64, 250).tolist() == [0, 1, 2, 4, 8, 16, 32, 64, 250, 500, 750, 1000]


def test_schedule_includes_last_step_off_cadence():
    s = snapshot_steps(130, 8, 50)
    assert s.tolist() == [0, 1, 2, 4, 8, 50, 100, 130]


def test_schedule_short_run_and_no_dense_phase():
    assert snapshot_steps(3, 64, 100).tolist() == [0, 1, 2, 3]
    assert snapshot_steps(10, 0, 5).tolist() == [0, 5, 10]


def test_schedule_sorted_unique():
    s = snapshot_steps(4096, 1024, 512)
    assert np.all(np.diff(s) > 0) and s[0] == 0 and s[-1] == 4096
