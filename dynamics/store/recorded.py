"""What a run's recording holds: which snapshots it wrote, and what its variables mean.

Pure xarray on datasets the readers (`dynamics.store.readers`) opened; no zarr here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dynamics.schema import FINISHED_STATUSES, RUN, RUN_VARIABLE_ATTRS, SNAPSHOT, STEP_ATTRS

if TYPE_CHECKING:
    import xarray as xr


def described(ds: xr.Dataset) -> xr.Dataset:
    """`ds` with each recorded variable's `RUN_VARIABLE_ATTRS` (what it stores has none), its step
    coordinates' `STEP_ATTRS`, and its dask-backed float16 variables (attention) read as float32,
    lazily, their attrs saying
    ``stored_dtype: "float16"``.

    Dask reduces a float16 array in float16, whose largest value is 65,504: a mean's count of
    values overflows past it (as does any sum), and the mean of a demo run's attention over its
    17 snapshots, 4 probes and 32 x 32 query-key pairs (69,632 values) read 0.0, where numpy's
    mean (float32 intermediates for float16) gives 0.03125. A float16 array read by plain zarr
    (``open_run(..., dask=False)``) is left as stored, for the analysers, which hold it at half
    the memory and cast what they reduce: numpy's sum and nanmean, and so xarray's default
    (skipna) mean, add float16 in float16 too (an induction run's mean read inf). The widened
    variable's encoding keeps float16, so ``to_zarr`` of an opened run stores what it read.
    """
    for name, attrs in RUN_VARIABLE_ATTRS.items():
        if name in ds.data_vars:
            ds[name].attrs = {**attrs, **ds[name].attrs}
    for name in ("step", "train_step"):
        if name in ds.coords:
            ds[name].attrs = {**STEP_ATTRS, **ds[name].attrs}
    for name in [n for n, v in ds.data_vars.items() if v.dtype == np.float16 and v.chunks is not None]:
        encoding = {**ds[name].encoding, "dtype": np.dtype(np.float16)}  # astype drops it: float32 on to_zarr
        ds[name] = ds[name].astype(np.float32).assign_attrs(stored_dtype="float16")
        ds[name].encoding = encoding
    return ds


def recorded_mask(ds: xr.Dataset, attrs: dict | None = None) -> np.ndarray:
    """Which snapshots of one run hold recordings, (snapshot,) bool; see `recorded_snapshots`.

    ``attrs``: the run's attributes (``open_run``'s). A run not finished may have been stopped
    (or be read) part way through writing a snapshot, whose arrays are written side by side and
    before the checkpoint: past its last checkpoint a snapshot whose ``importance`` is written
    counts only if its attention is too (before it, `check_recorded` found them whole). Such a
    half snapshot, counted, made `analyse_run` refuse the whole run (its attention NaN there).
    """
    if "importance" not in ds:
        if "attention" not in ds:
            raise ValueError("recorded_mask: the run's importance or attention tells which snapshots it wrote; "
                             "select variables after recorded_snapshots, not before")
        return _attention_written(ds, np.arange(ds.sizes[SNAPSHOT]))
    # tiny (snapshot, layer, head): cheaper than touching attention
    mask = ds["importance"].notnull().any([d for d in ds["importance"].dims if d != SNAPSHOT]).values
    if attrs is None or attrs.get("status") in FINISHED_STATUSES or "attention" not in ds:
        return mask
    through = attrs.get("checkpoint_step")
    through = through if isinstance(through, int) and not isinstance(through, bool) else -1
    steps = np.asarray(ds["step"].values, dtype=np.float64) if "step" in ds.coords else np.full(mask.shape, np.inf)
    late = np.flatnonzero(mask & ~(steps <= through))  # NaN steps (unwritten) included
    if late.size:
        mask[late] = _attention_written(ds, late)
    return mask


def _attention_written(ds: xr.Dataset, snapshots: np.ndarray) -> np.ndarray:
    """Whether each of these snapshots' attention is written: one element of its chunk read."""
    probe = ds["attention"].isel(snapshot=snapshots, layer=0, head=0, probe=0, query=-1, key=0)  # key 0 is always visible
    return probe.notnull().values


def recorded_snapshots(ds: xr.Dataset) -> xr.Dataset:
    """One run (from `open_run`) cut to the snapshots it recorded.

    A run's arrays are created at the full size of its schedule, and ``step`` lists every
    snapshot the schedule takes. An unfinished run (stopped, killed, still training) or a
    diverged one never wrote its later snapshots: they read as NaN, so ``isel(snapshot=-1)``
    of it is an empty snapshot, not its last. This keeps those it wrote whole: a diverged run's
    snapshot at its diverging step, written with non-finite gradients (NaN importance), is left
    out (``dynamics.analyse.recorded_before_divergence`` keeps it where its attention is finite,
    as `dynamics analyse` does). A completed run comes back whole.

    Parameters
    ----------
    ds : xarray.Dataset
        One run with its attributes, as `open_run` gives it.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    ValueError
        For a dataset of several runs (`open_sweep`'s): their recorded snapshots differ.

    Example
    -------
    >>> ds = recorded_snapshots(open_run("runs.zarr"))  # doctest: +SKIP
    >>> ds.attention.isel(snapshot=-1)  # the last snapshot the run wrote  # doctest: +SKIP
    """
    if RUN in ds.dims:
        raise ValueError("recorded_snapshots: one run at a time (open_run's, or sweep.sel(run=ID)); "
                         f"this dataset has a run dim ({ds.sizes[RUN]} run(s)), whose recorded snapshots differ")
    if SNAPSHOT not in ds.dims:
        return ds
    return ds.isel({SNAPSHOT: np.flatnonzero(recorded_mask(ds, ds.attrs))})
