"""The rows `analyse_store` gives for runs it could not analyse, and the errors that stop it instead."""

import errno
import os

import numpy as np
import pytest
import xarray as xr

from dynamics import analyse, store
from dynamics.analyse import analyse_or_report, disk_full, interrupt_in, lost_row, recorded_before_divergence


def raised_while_handling(first: BaseException, then: BaseException) -> BaseException:
    """``then`` raised in an except block of ``first``: linked by __context__ only, as a library's
    cleanup code raises on the way out."""
    try:
        try:
            raise first
        except BaseException:
            raise then  # noqa: B904 - the implicit link is what is tested
    except BaseException as e:
        return e


def test_a_full_disk_or_quota_is_found_however_it_was_wrapped():
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert disk_full(quota) is quota  # a quota stops every run alike, as a full disk does
    full = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full(raised_while_handling(full, RuntimeError("cleanup failed"))) is full
    assert disk_full(OSError(errno.EIO, "Input/output error")) is None
    assert disk_full(None) is None


def test_an_interrupt_is_found_under_an_error_raised_while_handling_it():
    stop = KeyboardInterrupt()
    assert interrupt_in(raised_while_handling(stop, ImportError("initialization failed"))) is stop
    assert interrupt_in(ValueError("x")) is None


def test_a_full_disk_met_by_one_run_stops_the_analysis(monkeypatch, tmp_path):
    # every other run would fail alike, each named as its own failure
    full = OSError(errno.ENOSPC, "No space left on device", "s.zarr/analysis/r1")

    def fails(path, run_id, again=False):
        raise raised_while_handling(full, RuntimeError("zarr could not close the group"))

    monkeypatch.setattr(analyse, "analyse_one", fails)
    with pytest.raises(OSError) as raised:
        analyse_or_report(str(tmp_path / "s.zarr"), "r1")
    assert raised.value is full


def test_a_run_whose_analysis_fails_gets_the_first_line_of_its_error(monkeypatch, tmp_path):
    path = str(tmp_path / "s.zarr")
    store.init_store(path)

    def fails(path, run_id, again=False):
        raise ValueError("no snapshot has a finite loss\n  (a second line of detail)")

    monkeypatch.setattr(analyse, "analyse_one", fails)
    row = analyse_or_report(path, "r1")
    assert (row["skipped"], row["error"]) == (True, "ValueError: no snapshot has a finite loss")
    assert row["reason"] == "analysis failed: ValueError: no snapshot has a finite loss"


def test_a_run_whose_metadata_cannot_be_read_is_listed_damaged(tmp_path):
    path = str(tmp_path / "s.zarr")
    store.init_store(path)
    os.makedirs(f"{path}/runs/r1")
    with open(f"{path}/runs/r1/zarr.json", "w") as f:
        f.write("{not json")
    row = analyse_or_report(path, "r1")
    assert row["status"] == "damaged" and row["skipped"]
    assert row["error"].startswith(f"StoreError: {path}: run group runs/r1 exists but its metadata runs/r1/zarr.json "
                                   "cannot be read (damaged)")
    assert row["reason"] == f"analysis failed: {row['error']}"
    assert lost_row(path, "r1")["status"] == "?"  # its worker died too: nothing more is known of it


def _recorded(steps, finite):
    """A run's arrays as read back: attention NaN where a snapshot was never written."""
    attention = np.ones((len(steps), 2, 2))
    attention[~np.asarray(finite)] = np.nan
    return xr.Dataset({"attention": (("snapshot", "head", "key"), attention)},
                      coords={"step": ("snapshot", np.asarray(steps))})


def test_the_snapshot_at_the_diverging_step_is_kept_only_when_finite():
    # a non-finite gradient under a finite loss: the weights, and the attention, are still finite there
    kept = recorded_before_divergence(_recorded([0, 5, 10, 15], [True, True, True, False]), 10)
    assert kept.step.values.tolist() == [0, 5, 10]
    kept = recorded_before_divergence(_recorded([0, 5, 10, 15], [True, True, False, False]), 10)
    assert kept.step.values.tolist() == [0, 5]
    kept = recorded_before_divergence(_recorded([0, 5, 10, 15], [True, True, True, True]), 12)  # between snapshots
    assert kept.step.values.tolist() == [0, 5, 10]
