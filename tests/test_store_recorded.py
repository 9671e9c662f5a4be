"""Which snapshots a run's recording holds, and what its variables mean (dynamics/store/recorded.py)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynamics import store
from tests.test_store import write_run


def test_recorded_snapshots_keeps_what_an_unfinished_run_wrote(tmp_path):
    # Arrays span the whole schedule: a killed run's last snapshot in open_run read NaN, and
    # `isel(snapshot=-1)` (open_run's own example) gave that empty snapshot, not its last.
    from tests.test_store import snapshot, spec

    path = tmp_path / "s.zarr"
    rng = np.random.default_rng(0)
    variables, coords = spec()
    w = store.RunWriter(path, "r1", variables=variables, coords=coords,
                        attrs={"status": "running", "checkpoint_step": 5})
    snaps = [snapshot(rng) for _ in range(2)]  # of the schedule's 3 (steps 0, 5, 10)
    for i, s in enumerate(snaps):
        w.write_snapshot(i, s)
    w.finalize()
    ds = store.open_run(path, "r1")
    assert ds.attrs["status"] == "stopped" and list(ds.step.values) == [0, 5, 10]
    assert np.isnan(ds.attention.isel(snapshot=-1).values).all()
    cut = store.recorded_snapshots(ds)
    assert list(cut.step.values) == [0, 5] and cut.attrs == ds.attrs
    np.testing.assert_array_equal(cut.attention.isel(snapshot=-1).values, snaps[1]["attention"])
    np.testing.assert_array_equal(store.recorded_mask(ds, ds.attrs), [True, True, False])

    write_run(path, "r2")  # finished: whole
    whole = store.open_run(path, "r2")
    xr.testing.assert_identical(store.recorded_snapshots(whole), whole)
    with pytest.raises(ValueError, match="one run at a time"):
        store.recorded_snapshots(store.open_sweep(path))
    with pytest.raises(ValueError, match="importance or attention tells which snapshots"):
        store.recorded_snapshots(ds[["grad_norm", "eval_loss"]])
    import dynamics

    assert dynamics.recorded_snapshots is store.recorded_snapshots


def test_recorded_variables_say_what_they_hold_and_chg_roles_decode(tmp_path):
    # Recorded variables had no attrs: a plot of them had bare axes, and chg_role's codes (-1:
    # unfitted) no flag_meanings, where the analysis's role has them.
    from dynamics.analysis.chg import CHG_ROLES, UNFITTED
    from dynamics.schema import CHG_ROLE_FLAGS, RUN_VARIABLE_ATTRS, RUN_VARIABLES

    assert set(RUN_VARIABLE_ATTRS) == set(RUN_VARIABLES)
    codes = dict(zip(CHG_ROLE_FLAGS["flag_values"], CHG_ROLE_FLAGS["flag_meanings"].split(), strict=True))
    assert [codes[i] for i in range(len(CHG_ROLES) - 1)] + [codes[UNFITTED]] == list(CHG_ROLES)
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    for ds in (store.open_run(path, "r1"), store.open_run(path, "r1", dask=False), store.open_sweep(path)):
        assert ds.attention.attrs == {"long_name": "post-softmax attention on the probe batch", "units": "1"}
        assert ds.loss.attrs["units"] == "nat" and ds.gate.attrs["long_name"] == "head gate value"
    assert xr.open_zarr(path, group="runs/r1").attention.attrs == {}  # read, not written: older runs get them too
