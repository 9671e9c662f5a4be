"""Reading runs and sweeps as lazy xarray datasets; writing and reading analysis and derived groups."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported where used: a training process writes, and xarray with pandas took 0.9 s
    from collections.abc import Sequence

    import xarray as xr

try:  # POSIX only; without it, staging leftovers of killed writers are not cleared
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

from dynamics.grid import grid_key
from dynamics.schema import (
    ANALYSIS_VERSION,
    HEAD,
    LAYER,
    RUN,
    STEP_ATTRS,
    config_value,
)
from dynamics.signals import deferred_signals
from dynamics.store._loc import (
    _NAME,
    SECTIONS,
    StoreError,
    _check_name,
    _children,
    _default_run,
    _group_exists,
    _group_meta,
    _jsonable,
    _Loc,
    _locked,
    _open_group_ds,
    check_sections,
    new_dir,
)
from dynamics.store._zarr_private import sync as _sync
from dynamics.store.checkpoints import run_now
from dynamics.store.index import _index_update
from dynamics.store.integrity import _whole
from dynamics.store.recorded import described
from dynamics.store.root import _require_store, read_sweep_index, run_attrs
from dynamics.store.staged import staged_keys
from dynamics.store.writer import CODECS, DEFAULT_CODEC, EMPTY_CHUNKS_WRITTEN

# --------------------------------------------------------------------------- reading


def open_run(path: str | os.PathLike, run_id: str | None = None, *, dask: bool = True) -> xr.Dataset:
    """Open one run lazily (dask-backed), with the run's attributes.

    Parameters
    ----------
    path : str or PathLike
    run_id : str, optional
        Defaults to the only run in the store.
    dask : bool
        False: variables are still read only when used, but by plain zarr reads, without a
        dask graph; for a run that fits in memory, ``open_run(..., dask=False).load()`` is
        several times faster than loading the dask-backed dataset.

    Returns
    -------
    xarray.Dataset
        Dims and coordinates as recorded; ``attrs`` are the run group's, plus ``run_id``,
        except ``status``: "stopped" for a run marked running that no process trains (it was
        killed; the same command resumes it), as ``dynamics status`` and ``open_sweep`` say.
        Arrays span the run's whole schedule: an unfinished or diverged run's snapshots past
        what it wrote read NaN (`recorded_snapshots` leaves them out).

    Raises
    ------
    StoreError
        If the run is missing, or run_id is None and the store holds zero or several runs
        (the message lists them).

    Example
    -------
    >>> ds = open_run("runs.zarr")  # doctest: +SKIP
    >>> recorded_snapshots(ds).attention.sel(layer=0).isel(snapshot=-1).mean("probe")  # doctest: +SKIP
    """
    loc = _Loc(path)
    _require_store(loc)
    run_id = _default_run(loc, run_id)
    ds = _open_group_ds(loc, f"runs/{run_id}", dask=dask)
    # A killed run never rewrote its "running": read as such, it looked alive forever. One that
    # ended since its group was opened: its attributes as it ended, not its status alone.
    if "status" in ds.attrs:
        status, attrs = run_now(path, run_id, ds.attrs)
        ds.attrs = {**attrs, "status": status}
    ds.attrs.setdefault("run_id", run_id)
    return described(ds)


def _axis_value(value: Any) -> Any:
    # list-valued axes (e.g. task.components) become one hashable label for groupby
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return value


def _coord_array(values: list) -> np.ndarray:
    """Values of one swept parameter across runs; a missing number becomes NaN."""
    present = [v for v in values if v is not None]
    if len(present) == len(values):
        return np.array(values)
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return np.array([np.nan if v is None else v for v in values], dtype=float)
    return np.array(values, dtype=object)


def open_sweep(path: str | os.PathLike, run_ids: list[str] | None = None) -> xr.Dataset:
    """Open many runs as one lazy dataset with a leading ``run`` dim.

    Parameters
    ----------
    path : str or PathLike
    run_ids : list of str, optional
        Runs to include, in this order; default: the runs of the sweep index that exist in the
        store, in the grid's order that ``dynamics status`` lists them in (`dynamics.grid.grid_key`),
        or every run, by id, when there is no sweep index.

    Returns
    -------
    xarray.Dataset
        Coordinates on ``run``: the run ids; ``status`` (``stopped`` for a run marked running
        that no process trains: killed, resumable); for each sweep axis
        ``section.leaf`` a coordinate ``section_leaf`` and, when no other axis or variable
        shares the name, ``leaf`` too (values from the sweep index, else from the run's
        ``config`` attribute; list values joined with ","). Dims whose sizes differ between
        runs are padded at the end with NaN (indexed dims such as ``head`` by an outer join on
        their labels); ``head_mask`` (run, layer, head) is True where the head exists. ``step``
        becomes (run, snapshot) only when runs disagree on it. ``attrs``: ``sweep`` (the
        index, if any), ``runs`` (each run's attributes, their ``status`` as the ``status``
        coordinate reads it: "stopped" for a killed run) and, with an index, ``runs_not_started``
        (its points with no run group yet, which the run dim leaves out).

    Raises
    ------
    StoreError
        A run of the default selection is damaged (its group's ``zarr.json`` unreadable): the
        message names it and the other runs, which ``run_ids=[...]`` opens; a run named in
        ``run_ids`` that is missing or damaged.

    Example
    -------
    >>> sw = open_sweep("runs.zarr")  # doctest: +SKIP
    >>> sw.gate.where(sw.init_scale == 2.0).groupby("train_lr").mean()  # doctest: +SKIP
    """
    loc = _Loc(path)
    _require_store(loc)
    index = read_sweep_index(loc.url)
    if run_ids is None:
        try:
            present = _children(loc, "runs")  # a damaged run is named: the sweep would lack it unsaid
        except StoreError as e:  # the way on from Python, where the commands skip it and go on
            others = _children(loc, "runs", damaged="skip")
            named = ", ".join(map(repr, others[:8])) + (f", ... ({len(others)} in all)" if len(others) > 8 else "")
            raise StoreError(f"{e}; or open the other runs by name: open_sweep(path, run_ids=[...])"
                             + (f", of {named}" if others else "")) from e
        # in `status`'s order, so that its rows and the tables' and the report's line up run for run
        # (the index's own order differed in a zipped sweep and where two sweeps share a grid)
        run_ids = sorted((r for r in index["runs"] if r in present), key=grid_key(index)) if index else present
    else:
        # runs asked for by name: another run's damage does not matter, theirs is named below
        present = _children(loc, "runs", damaged="include")
        if isinstance(run_ids, str):  # iterated, a run id is its characters: "no run(s) 'r', '5', ..."
            raise StoreError(f"run_ids: expected a list of run ids, got the string {run_ids!r}")
        if not isinstance(run_ids, (list, tuple, np.ndarray)) or not all(isinstance(r, str) for r in run_ids):
            raise TypeError(f"run_ids: expected a list of run ids (str), got {type(run_ids).__name__} {run_ids!r}")
        # a run twice on the run dim would count twice in every mean or groupby over runs
        twice = sorted({r for r in run_ids if list(run_ids).count(r) > 1})
        if twice:
            raise StoreError(f"run_ids: {', '.join(map(repr, twice))} given more than once")
        missing = [r for r in run_ids if r not in present]
        if missing:
            raise StoreError(f"no run(s) {', '.join(map(repr, missing))} in {loc}")
    run_ids = list(run_ids)
    if not run_ids:
        raise StoreError(f"no runs to open in {loc}")

    for rid in run_ids:
        _group_meta(loc, f"runs/{rid}")  # StoreError naming a damaged run given by name
    opened = [_open_group_ds(loc, f"runs/{rid}") for rid in run_ids]
    sizes: dict[str, set[int]] = {}
    for ds in opened:
        for dim, n in ds.sizes.items():
            sizes.setdefault(str(dim), set()).add(n)
    ragged = {dim for dim, ns in sizes.items() if len(ns) > 1}
    datasets, padded_dims, masks = [], set(), []
    for ds in opened:
        # ragged dims without labels get 0..n-1 so that the outer join below pads them at the end
        labels = {d: np.arange(ds.sizes[d]) for d in ragged if d in ds.dims and d not in ds.indexes}
        if labels:
            ds = ds.assign_coords(labels)
            padded_dims.update(labels)
        masks.append((ds.indexes.get(LAYER), ds.indexes.get(HEAD)))
        datasets.append(ds)

    import pandas as pd
    import xarray as xr

    attrs = [run_attrs(loc.url, rid) for rid in run_ids]
    sweep = xr.concat(
        datasets,
        dim=pd.Index(run_ids, name=RUN),
        data_vars="all",
        coords="different",
        compat="equals",
        join="outer",
        combine_attrs="drop",
    )
    sweep = sweep.drop_vars([d for d in padded_dims if d in sweep.coords])

    if HEAD in sweep.dims:
        layers = sweep.indexes.get(LAYER)
        heads = sweep.indexes[HEAD]
        rows = []
        for run_layers, run_heads in masks:
            has_head = heads.isin(run_heads if run_heads is not None else heads)
            if layers is None:
                rows.append(has_head)
            else:
                has_layer = layers.isin(run_layers if run_layers is not None else layers)
                rows.append(np.outer(has_layer, has_head))
        dims = (RUN, LAYER, HEAD) if layers is not None else (RUN, HEAD)
        sweep = sweep.assign_coords(head_mask=(dims, np.array(rows, dtype=bool)))

    # as `dynamics status`, the report and open_run: a run marked running that no process trains
    # was killed; `attrs["runs"]` says so too, where it kept the raw "running" beside the
    # coordinate's "stopped" (and `analyse_run` quoted it)
    now = [run_now(loc.url, rid, a) for rid, a in zip(run_ids, attrs, strict=True)]
    attrs = [{**a, "status": status} for status, a in now]
    new_coords: dict[str, tuple[str, np.ndarray]] = {"status": (RUN, np.array([status for status, _ in now]))}
    axes = list(index["axes"]) if index else []
    leaves = [a.split(".")[-1] for a in axes]
    for axis, leaf in zip(axes, leaves, strict=True):
        values = []
        for rid, a in zip(run_ids, attrs, strict=True):
            point = index["runs"].get(rid, {})
            v = point[axis] if axis in point else config_value(a.get("config", {}), axis)
            values.append(_axis_value(v))
        arr = _coord_array(values)
        new_coords[axis.replace(".", "_")] = (RUN, arr)
        taken = set(sweep.variables) | set(sweep.dims) | set(new_coords)
        if leaves.count(leaf) == 1 and leaf not in taken:
            new_coords[leaf] = (RUN, arr)
    sweep = described(sweep.assign_coords(new_coords))
    sweep.attrs = {"runs": dict(zip(run_ids, attrs, strict=True))}
    if index:
        sweep.attrs["sweep"] = index
        # a sweep still training lists only its started points: the rest are named, so that a
        # mean over runs is not read as one over the whole grid
        sweep.attrs["runs_not_started"] = [r for r in index["runs"] if r not in present]
    return sweep


# --------------------------------------------------------------------------- derived data


def _write_whole(loc: _Loc, gpath: str, ds: xr.Dataset) -> None:
    """Replace group `gpath` with `ds` (loaded first: it may be read from that very group)."""
    import xarray as xr

    if not isinstance(ds, xr.Dataset):
        raise StoreError(f"{gpath}: expected an xarray.Dataset, got {type(ds).__name__}")
    check_sections(loc, (gpath.split("/")[0],))  # a file there: named, not a bare FileExistsError
    ds = ds.load().copy()
    for name, var in ds.variables.items():
        if var.dtype.kind in "US":  # fixed-width strings have no stable zarr v3 dtype: store vlen
            ds[name] = var.astype(str).astype(object)
    ds.attrs = {k: _jsonable(v, k) for k, v in ds.attrs.items()}
    # Every chunk stored, all-NaN ones included, and the group says so: then a chunk file that is
    # not there was lost, and _whole refuses the group instead of zarr reading the fill value
    # (a lost `role` chunk read as role 0, previous_token, for every head).
    ds.attrs[EMPTY_CHUNKS_WRITTEN] = True
    # Encoded into memory, then every key is written at once: to_zarr straight into the store
    # made one blocking round trip per array creation, attribute update and chunk (~20 ms per
    # variable here, 0.5 s per analysis of 30 variables; bench/analysis.py), and into memory
    # still most of the write (store.staged). Stale chunk and codec encodings from a source
    # store do not apply here; the runs' codec does.
    items = staged_keys(ds, CODECS[DEFAULT_CODEC])

    async def copy(target: Any, prefix: str) -> None:
        await target.delete_dir(prefix)
        # every write ends before a failure is raised
        done = await asyncio.gather(*(target.set(f"{prefix}/{k}", v) for k, v in items[:-1]),
                                    return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
        await target.set(f"{prefix}/zarr.json", items[-1][1])  # the group appears last

    if loc.local is None:  # no rename on object stores: the old group goes, then the new one is written
        _sync(copy(loc.store, gpath))
    else:
        _replace_local(loc, gpath, lambda tmp: _write_files(tmp, items))
    _index_update(loc, gpath)


def _write_files(folder: Path, items: list[tuple[str, Any]]) -> None:
    """Write each ``(key, zarr buffer)`` as a file under `folder`, a staging directory nobody reads.

    Plain writes: through zarr's LocalStore each was an event-loop round trip, a thread hop
    and a temporary file renamed into place, 27-32 ms for a demo run's 69 files against 9 ms
    here; the whole directory is swapped in at once anyway.
    """
    made: set[Path] = set()
    for key, data in items:
        file = folder / key
        if file.parent not in made:
            file.parent.mkdir(parents=True, exist_ok=True)
            made.add(file.parent)
        file.write_bytes(data.as_buffer_like())


_STAGING = ".staging"
"""Directory at the store root where a derived group is written before it is renamed into place.
Its name is no group name (they start with a letter or digit), so no reader lists it."""


def _replace_local(loc: _Loc, gpath: str, write: Any) -> None:
    """Replace the local group directory `gpath` with one that ``write(directory)`` fills.

    Written in a staging directory first, then swapped in under the store lock, with SIGINT
    and SIGTERM held back, by one atomic exchange (:func:`_exchange`; two renames where there is
    none, between which a reader finds no group): deleting the old group and writing the new one
    in place left, for the whole write, a group that readers (``dynamics report``,
    ``predict`` during an ``analyse``) read as missing or half-written without any error, and
    a kill or a full disk in the middle lost the previous result with no new one. Now a
    failure leaves the previous group as it was, and two writers of one group leave one
    of them whole.
    """
    target = loc.local / gpath
    work = loc.local / _STAGING
    with _locked(loc):  # another writer removes `work` under the lock once it is empty
        work.mkdir(exist_ok=True)
        _clear_stale_staging(loc, work)
        tmp = new_dir(work, gpath.replace("/", ".") + ".")
        claim = _claim(tmp)  # taken under the lock: no cleaner ever sees `tmp` unclaimed
    old = tmp.with_name(tmp.name + ".old")
    try:
        write(tmp)
        with _locked(loc), deferred_signals():
            target.parent.mkdir(parents=True, exist_ok=True)
            # One atomic exchange where the kernel has it: readers take no lock, and between two
            # renames they found no group at all (the report said "not analysed", the predictor
            # left the run out). The old group lands in `tmp`, removed below.
            if not (target.exists() and _exchange(tmp, target)):
                if target.exists():
                    os.rename(target, old)
                os.rename(tmp, target)
    finally:
        for leftover in (tmp, old):
            shutil.rmtree(leftover, ignore_errors=True)
        if claim is not None:
            os.close(claim)  # releases the flock
        with _locked(loc), contextlib.suppress(OSError):
            work.rmdir()  # only once empty: another writer may be staging its group there


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directories `a` and `b` in one atomic step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``); False where the platform or filesystem cannot, and nothing moved."""
    rename2 = getattr(_libc(), "renameat2", None)
    if rename2 is None:
        return False
    at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE from <fcntl.h> and <linux/fs.h>
    if rename2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # no exchange here: two renames instead
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


@functools.cache
def _libc() -> Any:
    # renameat2 is a Linux system call: elsewhere there is nothing to find, and Windows' CDLL(None)
    # raises TypeError, not OSError, which failed every analysis write there.
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no C library to load
        return None


def _claim(directory: Path) -> int | None:
    """An open descriptor holding an exclusive flock on `directory` (None: no flock here).

    A writer holds it on its staging directory until the write ends; the operating system
    drops it when the writer dies however it dies (SIGKILL, power), so an unclaimed staging
    directory has no live owner.
    """
    if fcntl is None:
        return None
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # no flock on this filesystem (ENOLCK): unclaimed, never cleared either
        os.close(fd)
        return None
    return fd


def _clear_stale_staging(loc: _Loc, work: Path) -> None:
    """Remove what killed writers left in the staging directory; called under the store lock.

    A write killed before its swap leaves its staging directory behind for ever (nothing else
    ever looks in ``.staging``), with a copy of a whole analysis in it. An entry is stale when
    no process holds its flock (:func:`_claim`). A ``.old`` entry is the previous group moved
    aside by a swap; the swap is two renames under this lock, so a ``.old`` whose group is
    missing was left by a writer killed between them: it is put back, not deleted.
    """
    if fcntl is None:
        return
    for entry in work.iterdir():
        try:
            fd = os.open(entry, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held by a live writer (or no flock here: cannot tell)
                continue
            if entry.name.endswith(".old"):
                # "<section>.<name>.<random>.old"; new_dir's random part has no "."
                section, _, name = entry.name.removesuffix(".old").rpartition(".")[0].partition(".")
                target = loc.local / section / name
                if section in SECTIONS[1:] and _NAME.match(name) and not target.exists():
                    os.rename(entry, target)
                    continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        finally:
            os.close(fd)


def write_analysis(path: str | os.PathLike, run_id: str, ds: xr.Dataset) -> None:
    """Replace ``analysis/<run_id>`` with `ds` (raw recordings in ``runs/`` are never touched).

    Parameters
    ----------
    path : str or PathLike
    run_id : str
        An existing run.
    ds : xarray.Dataset
        Loaded into memory before the old group is removed; attrs must be JSON-able.
    """
    loc = _Loc(path)
    _require_store(loc)
    if not _group_exists(loc, f"runs/{_check_name('run id', run_id)}"):
        raise StoreError(f"no run {run_id!r} in {loc}")
    _write_whole(loc, f"analysis/{run_id}", ds)


class StaleAnalysisWarning(UserWarning):
    """An opened analysis was written by another version of the analysers than these."""


def open_analysis(path: str | os.PathLike, run_id: str | None = None, *,
                  stale: str = "warn", dask: bool = True,
                  load: bool | Sequence[str] = False) -> xr.Dataset | None:
    """Open ``analysis/<run_id>`` lazily, or None if it was never written.

    Parameters
    ----------
    path : str or PathLike
    run_id : str, optional
        Defaults to the only run (as :func:`open_run`).
    stale : {"warn", "allow"}
        An analysis whose ``analysis_version`` is not this package's
        (`dynamics.schema.ANALYSIS_VERSION`) was computed by other analysers (one without
        the attr by the analysers before they were versioned, whose figures differ: the token
        shares read 0 where they are undefined), and its figures may not mean what these docs
        say: "warn" (the default) returns it with a :class:`StaleAnalysisWarning` naming both
        versions and the command that recomputes it; "allow" returns it silently, for callers
        that check `dynamics.analysis.pipeline.is_current` themselves.
    dask : bool
        As :func:`open_run`'s: False opens the arrays lazily indexed, without dask, for a caller
        that reads a small part of them (about a quarter less time to open an analysis).
    load : bool or sequence of str
        Every variable (True), or those named that the group has (only those returned), read
        inside the open's check of one version: loaded after it, across an `analyse`'s swap, the
        old version's attributes came with the new one's values. Other analysers' (another
        ``analysis_version``) is left unread, as its callers leave it: a bad chunk there is no failure.

    Raises
    ------
    StoreError
        If a chunk file of the group is missing (lost after it was written; see :func:`_whole`),
        or its metadata cannot be read. A chunk that fails its checksum raises when read.
    """
    if stale not in ("warn", "allow"):
        raise ValueError(f"stale: expected 'warn' or 'allow', got {stale!r}")
    loc = _Loc(path)
    _require_store(loc)
    run_id = _default_run(loc, run_id)
    check_sections(loc, ("analysis",))  # a file there: named, not None, "never analysed", for every run
    if not _group_exists(loc, f"analysis/{run_id}"):
        return None
    gpath = f"analysis/{run_id}"

    def whole(d: xr.Dataset) -> xr.Dataset:
        d = _whole(loc, gpath, d)
        if load is False or d.attrs.get("analysis_version") != ANALYSIS_VERSION:
            return d
        return d.load() if load is True else d[[v for v in load if v in d.data_vars]].load()

    ds = _open_group_ds(loc, gpath, dask, verify=whole)
    version = ds.attrs.get("analysis_version")
    if stale == "warn" and version != ANALYSIS_VERSION:
        # no version: written before analyses were stamped (as the report and predict take it),
        # where it opened without a word and its old figures passed for these analysers'
        which = "before the analysers were versioned" if version is None else f"by analysers version {version}"
        warnings.warn(
            f"analysis/{run_id} in {loc} was written {which}, these are version "
            f"{ANALYSIS_VERSION}: its figures may differ from theirs; `dynamics analyse {path}` recomputes it",
            StaleAnalysisWarning, stacklevel=2)
    if "step" in ds.coords:  # labelled as a run's is (an analysis written before it was, too)
        ds["step"].attrs = {**STEP_ATTRS, **ds["step"].attrs}
    return ds


def stored_analysis_version(path: str | os.PathLike, run_id: str) -> tuple[bool, Any]:
    """Whether ``run_id`` has a stored analysis, and the ``analysis_version`` its attributes name
    (None: unstamped), read from the group's ``zarr.json`` alone: a small read, which a damaged
    analysis (a chunk lost) still answers. An unreadable ``zarr.json`` reads as no analysis."""
    try:
        meta = _group_meta(_Loc(path), f"analysis/{run_id}")
    except OSError:
        return False, None
    return meta is not None, (meta or {}).get("attributes", {}).get("analysis_version")


def write_derived(path: str | os.PathLike, name: str, ds: xr.Dataset) -> None:
    """Replace the sweep-level dataset ``derived/<name>`` with `ds`."""
    loc = _Loc(path)
    _require_store(loc)
    _write_whole(loc, f"derived/{_check_name('derived name', name)}", ds)


def open_derived(path: str | os.PathLike, name: str, *, load: bool | Sequence[str] = False) -> xr.Dataset | None:
    """Open ``derived/<name>`` lazily, or None if it was never written; StoreError for a chunk
    file missing from it, as :func:`open_analysis`. ``load``: its values (True), or those of the
    variables named that it has (only those returned), read inside the open's check of one
    version, as `open_analysis`'s (after it, a `predict` saving another curve in between gave the
    old curve's horizons and attributes with the new one's scores)."""
    loc = _Loc(path)
    _require_store(loc)
    gpath = f"derived/{_check_name('derived name', name)}"
    if not _group_exists(loc, gpath):
        return None

    def whole(d: xr.Dataset) -> xr.Dataset:
        d = _whole(loc, gpath, d)
        # True: the whole group, coordinates on dims no variable has too (a list selection drops them)
        return d if load is False else d.load() if load is True else d[[v for v in load if v in d.data_vars]].load()

    return _open_group_ds(loc, gpath, verify=whole)
