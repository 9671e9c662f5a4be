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
        said = {k: v for k, v in ds.attention.attrs.items() if k != "stored_dtype"}  # dask's float32: next test
        assert said == {"long_name": "post-softmax attention on the probe batch", "units": "1"}
        assert ds.loss.attrs["units"] == "nat" and ds.gate.attrs["long_name"] == "head gate value"
        # a plot over step says training steps; one over importance, what the stored value is
        assert ds.step.attrs == {"long_name": "training step", "units": "steps"}
        assert RUN_VARIABLE_ATTRS["importance"]["long_name"] == "head importance |dloss/dgate|"  # not "times gate"
        assert all(len(a["long_name"]) <= 50 for a in RUN_VARIABLE_ATTRS.values())  # xarray wraps at 30
    assert xr.open_zarr(path, group="runs/r1").attention.attrs == {}  # read, not written: older runs get them too


def test_dask_backed_float16_attention_is_read_as_float32_so_its_means_do_not_overflow(tmp_path):
    # Known answer: 100,000 values of 1/32 have mean 1/32. Dask reduces float16 in float16, whose
    # count of 100,000 overflows (65,504 is float16's largest): the mean read 0.0 (a demo run's attention over its snapshots,
    # probes, queries and keys holds 69,632 values).
    import dask.array as da

    flat = xr.Dataset({"attention": ("x", da.from_array(np.full(100_000, 1 / 32, np.float16), chunks=50_000))})
    with np.errstate(over="ignore"):  # dask's own float16 mean: the overflow, still there
        assert float(flat.attention.mean().compute(scheduler="synchronous")) == 0.0
    from dynamics.store.recorded import described

    widened = described(flat)
    assert widened.attention.dtype == np.float32 and widened.attention.attrs["stored_dtype"] == "float16"
    assert widened.attention.chunks is not None  # still lazy
    assert float(widened.attention.mean()) == 1 / 32
    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    lazy, plain = store.open_run(path, "r1"), store.open_run(path, "r1", dask=False)
    assert lazy.attention.dtype == np.float32 and plain.attention.dtype == np.float16  # as stored, for numpy
    np.testing.assert_array_equal(lazy.attention.values, plain.attention.values.astype(np.float32))
    assert store.open_sweep(path).attention.dtype == np.float32
    # written back, it is stored as read (astype drops the encoding: it was stored as float32)
    lazy[["attention"]].drop_attrs().to_zarr(tmp_path / "copy.zarr", consolidated=False)
    assert xr.open_zarr(tmp_path / "copy.zarr", consolidated=False).attention.dtype == np.float16
