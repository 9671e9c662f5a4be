"""The root group: creating a store, checking it, the runs and their attributes, and the sweep
index kept in the root attributes (the root's index of every group: `dynamics.store.index`)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

import zarr
from zarr.buffer import default_buffer_prototype

from dynamics.schema import FINISHED_STATUSES, MKDIR_PROBE, RUN_STATUSES, STORE_VERSION
from dynamics.store._loc import (
    _NAME,
    SECTIONS,
    StoreError,
    _check_name,
    _children,
    _group_exists,
    _group_meta,
    _json_dict,
    _jsonable,
    _Loc,
    _locked,
    check_sections,
    clear_partials,
    is_partial,
)
from dynamics.store._zarr_private import GroupMetadata
from dynamics.store.index import (
    _DEFERRED,
    _index_entries,
    _index_of,
    _index_update,
    _node_entry,
    _read_root,
    _rebuild_index,
    _write_root,
)

# --------------------------------------------------------------------------- root index (dynamics.store.index)


def reindex(path: str | os.PathLike) -> None:
    """Rebuild the root group index from the groups on disk.

    Only needed after a crash between creating a group and indexing it, which leaves that
    group invisible to plain ``xr.open_zarr(store, group=...)``. Safe to run at any time.

    Parameters
    ----------
    path : str or PathLike
        Store location.
    """
    loc = _Loc(path)
    _require_store(loc)
    _rebuild_index(loc)


def refresh_index(path: str | os.PathLike, run_ids: list[str]) -> None:
    """Bring the root-index entries of these runs up to date with their groups where they differ.

    For the runs a command skips as finished: a process killed between a run's last attributes
    (``completed``) and their index entry left the index, which plain ``xr.open_zarr`` reads,
    saying ``running`` for good, as nothing writes a finished run again. Best effort: a store
    this process may not write (a finished run is skipped on a read-only store) is left as is.
    """
    loc = _Loc(path)
    if loc.local is None and loc.url in _DEFERRED:
        return
    try:
        flat = _index_of(_read_root(loc)) or {}
        # compared as JSON text: an attribute that is NaN is never equal to itself
        stale = [g for g in (f"runs/{r}" for r in run_ids)
                 if json.dumps(flat.get(g), sort_keys=True) != json.dumps(_node_entry(loc, g), sort_keys=True)]
        if stale:  # one rewrite of the root for them all: one each was quadratic in a sweep's runs
            _index_entries(loc, stale)
    except Exception:  # noqa: BLE001 - OSError on a read-only store, other errors from fsspec backends
        pass  # the command skips the runs all the same; a plain-xarray reader's view stays as it was


# --------------------------------------------------------------------------- store


def is_store(path: str | os.PathLike) -> bool:
    """Whether `path` holds a dynamics store (a Zarr v3 root group marked ``dynamics_store``).

    Parameters
    ----------
    path : str or PathLike
        Local path or fsspec URL.

    Returns
    -------
    bool
        Never raises for a missing or foreign path.
    """
    try:
        return _store_root(_Loc(path)) is not None
    except Exception:  # unreachable remote, bad URL: not a store we can use
        return False


def _store_root(loc: _Loc, raw: bytes | None = None) -> dict | None:
    """The root group metadata if `loc` holds a dynamics store, else None (`raw`: its root
    zarr.json's bytes, already read)."""
    root = loc.get_json("zarr.json") if raw is None else _json_dict(raw)
    if root and root.get("node_type") == "group" and "dynamics_store" in root.get("attributes", {}):
        return root
    return None


def _check_version(loc: _Loc, root: dict) -> None:
    version = root["attributes"]["dynamics_store"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StoreError(f"{loc}: store version {version!r} in its zarr.json is no version this package writes "
                         f"(an integer, {STORE_VERSION} here): the root is damaged")
    if version > STORE_VERSION:
        raise StoreError(f"{loc}: store version {version!r} is newer than this package supports ({STORE_VERSION})")


def check_store(path: str | os.PathLike) -> None:
    """StoreError unless `path` is a dynamics store this version of the package can read and write.

    Every command checks this before any work: a store of a newer version may be laid out
    differently, and analyse, predict and gates would write into it. A damaged sweep index is
    named here too, not once a command has analysed the runs (or begun a report) and reads it.
    """
    loc = _Loc(path)
    _check_index(loc, _required_root(loc))


_CHECKED_ROOTS: dict[str, bytes] = {}
"""URL -> the root zarr.json bytes that `_require_store` last accepted there, in this process."""
_CHECKED_LOCK = threading.Lock()


def _require_store(loc: _Loc) -> None:
    """StoreError unless `loc` holds a dynamics store this package can read and write.

    Every reader and writer of the package calls this, so it must not cost what the store's
    size does: the root zarr.json indexes every group, and parsing it took 7 ms with 200 runs in
    the store, at each call (a run's every store read and write; 400 calls for the cross-seed
    check of 200 runs). The verdict is a function of those bytes alone, so bytes equal to those
    last accepted (one read and one comparison) are accepted again without parsing them.
    """
    raw = None
    if loc.local is not None:
        raw = loc.get("zarr.json")
        with _CHECKED_LOCK:
            seen = _CHECKED_ROOTS.get(loc.url)
        if raw is not None and raw == seen:
            check_sections(loc, ("runs",))  # a folder, not the root's bytes: checked every time
            return
    _required_root(loc, raw)
    if raw is not None:
        with _CHECKED_LOCK:
            _CHECKED_ROOTS[loc.url] = raw


def _required_root(loc: _Loc, raw: bytes | None = None) -> dict:
    """`_require_store`, parsing the root (`raw`, those bytes already read): its metadata, for
    the callers that use it."""
    # A newer layout is neither read nor written. One read of the root metadata answers both questions.
    try:
        root = _store_root(loc, raw)
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own: the first line of any names it
        if loc.local is None:  # a refused connection is no missing store: a teacher URL said "not a dynamics store"
            reason = (str(e).splitlines() or [""])[0] or type(e).__name__
            raise StoreError(f"{loc}: cannot be reached: {reason}") from None
        root = None
    if root is None:
        raise StoreError(_unreadable_root(loc) or _not_a_store(loc))
    _check_version(loc, root)
    # runs/ only: every command reads it; analysis/ and derived/ are checked by what writes them
    # (init_store, check_folders), so a damaged derived/ does not stop `status` reading the runs
    check_sections(loc, ("runs",))
    return root


def check_folders(path: str | os.PathLike, sections: tuple[str, ...]) -> None:
    """StoreError if one of the store's `sections` a command is to write under is not a folder."""
    check_sections(_Loc(path), sections)


def damaged_root(path: str | os.PathLike) -> str | None:
    """The one-line problem when `path` holds a store whose root zarr.json cannot be read, else None.

    For commands that check a path before writing to it: such a path is recorded data to
    restore, which "not a dynamics store" would hide.
    """
    return _unreadable_root(_Loc(path))


def _not_a_store(loc: _Loc) -> str:
    """Why ``loc`` is no store, as the command line says it: a mistyped path is not there at all,
    and a run's folder inside a store is named with the store and run to open instead."""
    if loc.local is None:
        return f"not a dynamics store: {loc}"
    if not loc.local.exists():
        return f"no store at {loc}: the path does not exist"
    for inner, parent in zip((loc.local, *loc.local.parents), loc.local.parents, strict=False):  # (folder, its parent)
        if parent.name == "runs" and is_store(parent.parent):
            return (f"not a dynamics store: {loc} is inside the store {parent.parent}, in its run {inner.name}; "
                    f"open_run({str(parent.parent)!r}, {inner.name!r}) opens that run")
    return f"not a dynamics store: {loc}"


def _unreadable_root(loc: _Loc) -> str | None:
    # A store whose root zarr.json was cut short is not "not a store": said so, its runs would
    # look like a wrong path, not like recorded data to restore.
    # The same for one gone from beside the run groups it held.
    try:
        raw = loc.get("zarr.json")  # once: a store removed meanwhile is gone, not damaged
        if raw is None:
            runs = [n for n in loc.list_dir("runs") if loc.get(f"runs/{n}/zarr.json") is not None]
            if not runs:
                return None
            return (f"{loc}: the store's root metadata zarr.json is missing, though runs/ holds {len(runs)} run "
                    f"group(s) ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}) (damaged); restore it "
                    f"from a backup")
        damaged = _json_dict(raw) is None
    except PermissionError as e:  # an unreadable store is recorded data with the wrong owner, not "not a store"
        return (f"{loc}: the store's root metadata zarr.json cannot be read: {e.strerror or 'permission denied'} "
                f"on {e.filename or loc}; check its permissions")
    except Exception:  # unreachable remote: not a store we can use, as above
        return None
    if not damaged:
        return None
    return f"{loc}: the store's root metadata zarr.json cannot be read (damaged); restore it from a backup"


STALE_PARTIAL_S = 3600.0
"""Age past which a zarr temporary at a store's root or in its sections is a killed writer's."""


def init_store(path: str | os.PathLike) -> None:
    """Create an empty store at `path`, or check an existing one.

    Parameters
    ----------
    path : str or PathLike
        Local path or fsspec URL. A missing path or an empty directory becomes a store.

    Raises
    ------
    StoreError
        If the path exists and is not a dynamics store (a file, a non-empty directory, a
        foreign zarr store): it is never overwritten. Also if the store was written by a
        newer version of this package.

    Example
    -------
    >>> init_store(tmp_path / "store.zarr")  # doctest: +SKIP
    """
    loc = _Loc(path)
    if not is_store(loc.url):
        if loc.local is not None:
            if loc.local.exists() and not loc.local.is_dir():
                raise StoreError(f"{loc} exists and is a file, not a dynamics store")
            loc.local.mkdir(parents=True, exist_ok=True)
        with _locked(loc):  # check again inside: another process may be creating it right now
            if not is_store(loc.url):
                # another command's mkdir probe (`usage.cannot_make_in`), there for microseconds, is nothing made
                entries = [e for e in loc.list_dir("") if not e.startswith(MKDIR_PROBE)]
                if loc.local is not None and entries and all(map(is_partial, entries)):
                    clear_partials(loc.local)  # a creation killed before its zarr.json landed: nothing made
                    entries = [e for e in loc.list_dir("") if not e.startswith(MKDIR_PROBE)]
                if entries:
                    raise StoreError(_unreadable_root(loc) or f"{loc} exists, is not empty and is not a dynamics store")
                root = zarr.create_group(loc.store, zarr_format=3, attributes={"dynamics_store": STORE_VERSION})
                for section in SECTIONS:
                    root.require_group(section)
                _rebuild_index(loc)
                return
    root = _read_root(loc)
    _check_version(loc, root)
    check_sections(loc)
    if loc.local is not None:  # an hour old: no live write (a creation of a run's arrays rewrites these unlocked)
        clear_partials(loc.local, *(loc.local / s for s in SECTIONS), min_age=STALE_PARTIAL_S)
    if not all(_group_exists(loc, s) for s in SECTIONS) or _index_of(root) is None:
        with _locked(loc):
            for section in SECTIONS:
                if not _group_exists(loc, section):
                    # Missing, or cut short: zarr's require_group failed on the latter with a bare
                    # JSONDecodeError, and no run could be created. A section's zarr.json holds no
                    # attributes (nothing recorded), and writing it leaves the groups below alone.
                    meta = GroupMetadata(zarr_format=3).to_buffer_dict(default_buffer_prototype())
                    loc.set(f"{section}/zarr.json", meta["zarr.json"].to_bytes())
            _rebuild_index(loc)


def list_runs(path: str | os.PathLike, *, damaged: str = "raise") -> list[str]:
    """Sorted ids of the run groups in a store.

    Parameters
    ----------
    path : str or PathLike
    damaged : {"raise", "skip", "include"}
        A run group whose ``zarr.json`` cannot be read, or is gone from beside its arrays:
        "raise" its StoreError (a caller that works on the store as a whole); "skip" it;
        "include" it, for a caller that works run by run and names the runs it could not
        read (:func:`run_attrs` and :func:`open_run` of that run raise the StoreError naming
        it; those of the other runs work).

    Returns
    -------
    list of str

    Raises
    ------
    StoreError
        If `path` is not a dynamics store, or (``damaged="raise"``) names a damaged run.
    """
    loc = _Loc(path)
    _require_store(loc)
    return _children(loc, "runs", damaged)


def run_attrs(path: str | os.PathLike, run_id: str) -> dict:
    """Attributes of one run group (config, status, ...), read fresh from the store.

    Parameters
    ----------
    path : str or PathLike
    run_id : str

    Returns
    -------
    dict

    Raises
    ------
    StoreError
        If the store or the run does not exist.
    """
    loc = _Loc(path)
    _require_store(loc)
    meta = _group_meta(loc, f"runs/{_check_name('run id', run_id)}")
    if meta is None:
        raise StoreError(f"no run {run_id!r} in {loc}")
    attrs = meta.get("attributes", {})
    if (problem := _attrs_problem(attrs)) is not None:
        # readable JSON, but not what a run writes there: every reader failed with a traceback
        gpath = f"runs/{run_id}"
        raise StoreError(f"{loc}: run group {gpath} has damaged attributes in {gpath}/zarr.json ({problem}); "
                         f"restore that file from a backup, or move {gpath} and checkpoints/{run_id} out of the "
                         f"store to go on without that run")
    return attrs


def _attrs_problem(attrs: Any) -> str | None:
    """What is wrong with a run's attributes, if the bookkeeping the commands read (its status,
    step counts, last loss and config) is not of the types a run writes, its status none a run
    writes, or a step count below any a run writes; None if nothing is."""
    if not isinstance(attrs, dict):
        return f"attributes = {attrs!r}, not a table"
    kinds = {"status": (str, "a string"), "steps_done": (int, "an integer"), "steps_total": (int, "an integer"),
             "checkpoint_step": (int, "an integer"), "last_loss": ((int, float, type(None)), "a number")}
    for key, (kind, name) in kinds.items():
        if key in attrs and (not isinstance(attrs[key], kind) or isinstance(attrs[key], bool)):
            return f"{key} = {attrs[key]!r}, not {name}"
    # of the right type but no count a run writes (its config's steps are >= 1): status showed 20/-5
    for key, least in (("steps_done", 0), ("checkpoint_step", 0), ("steps_total", 1)):
        if key in attrs and attrs[key] < least:
            return f"{key} = {attrs[key]!r}, not a step count a run writes (>= {least})"
    if "status" in attrs and attrs["status"] not in RUN_STATUSES:
        # a string of no status a run writes ("stopped" and "pending" are only shown) read as
        # unfinished: `run` resumed a completed run at its last step and rewrote its checkpoint
        return f"status = {attrs['status']!r}, not one a run writes ({', '.join(RUN_STATUSES)})"
    # every run is created with its config (a run written through the store API may have none)
    if "config" in attrs and not isinstance(attrs["config"], dict):
        return f"config = {attrs['config']!r}, not a table"
    return None


def run_listed(path: str | os.PathLike, run_id: str) -> bool:
    """Whether ``list_runs(path, damaged="include")`` lists `run_id`, from that run's group alone.

    The listing reads every run's group (each is checked for damage): 16 ms with 200 runs in
    the store, against 0.2 ms, and train_run asked twice for every run a sweep trains.

    Raises
    ------
    StoreError
        If `path` is not a dynamics store, as :func:`list_runs`.
    """
    loc = _Loc(path)
    _require_store(loc)
    if not isinstance(run_id, str) or not _NAME.match(run_id):  # no such name is listed
        return False
    try:
        return _group_exists(loc, f"runs/{run_id}")
    except StoreError:  # a damaged run is listed ("include"): its reads name the damage
        return True


def has_run(path: str | os.PathLike, run_id: str) -> bool:
    """Whether the store at `path` holds a run group `run_id`; never raises (as `is_finished`)."""
    try:
        loc = _Loc(path)
        return bool(_store_root(loc)) and _group_meta(loc, f"runs/{_check_name('run id', run_id)}") is not None
    except Exception:  # noqa: BLE001 - as is_store: an answer, never the error
        return False


def is_finished(path: str | os.PathLike, run_id: str) -> bool:
    """Whether the store at `path` holds `run_id` finished (completed or diverged), so that a run
    command would skip it. Reads only, and never raises: no store, no such run, a damaged or
    unreachable one is False (the command then finds and names what is wrong)."""
    try:
        loc = _Loc(path)
        meta = _group_meta(loc, f"runs/{_check_name('run id', run_id)}") if _store_root(loc) else None
    except Exception:  # noqa: BLE001 - as is_store: an answer, never the error
        return False
    return meta is not None and meta.get("attributes", {}).get("status") in FINISHED_STATUSES


def _update_group_attrs(loc: _Loc, gpath: str, attrs: dict) -> None:
    clean = {k: _jsonable(v, k) for k, v in attrs.items()}
    with _locked(loc):  # read-modify-write of the group's zarr.json, then its index entry
        group = zarr.open_group(loc.store, path=gpath, mode="r+", use_consolidated=False)
        group.update_attributes(clean)
        _index_update(loc, gpath)


def update_run_attrs(path: str | os.PathLike, run_id: str, **attrs: Any) -> None:
    """Merge attributes into a run group (e.g. the launcher marking a run ``failed``).

    Parameters
    ----------
    path : str or PathLike
    run_id : str
    **attrs
        JSON-able values (numpy scalars and arrays are converted).

    Raises
    ------
    StoreError
        If the run does not exist or a value is not JSON-able.
    """
    loc = _Loc(path)
    _require_store(loc)
    if not _group_exists(loc, f"runs/{_check_name('run id', run_id)}"):
        raise StoreError(f"no run {run_id!r} in {loc}")
    _update_group_attrs(loc, f"runs/{run_id}", attrs)


# --------------------------------------------------------------------------- sweep index


def write_sweep_index(path: str | os.PathLike, index: dict) -> None:
    """Store the sweep index in the root attrs (the launcher is its only writer).

    Parameters
    ----------
    path : str or PathLike
    index : dict
        ``{"axes": ["model.init_scale", ...], "runs": {run_id: {"model.init_scale": 0.5, ...}}}``
        plus any other JSON-able keys.

    Raises
    ------
    StoreError
        If the index is malformed or the path is not a store.
    """
    loc = _Loc(path)
    _require_store(loc)
    if not isinstance(index, Mapping):
        raise StoreError("sweep index: expected a dict")
    axes, runs = index.get("axes"), index.get("runs")
    if not isinstance(axes, (list, tuple)) or not all(isinstance(a, str) and "." in a for a in axes):
        raise StoreError("sweep index: 'axes' must be a list of dotted keys like 'train.lr'")
    if not isinstance(runs, Mapping) or not all(isinstance(p, Mapping) for p in runs.values()):
        raise StoreError("sweep index: 'runs' must map run ids to {axis: value} dicts")
    clean = _jsonable(dict(index), "sweep")
    with _locked(loc):
        root = _read_root(loc)
        root.setdefault("attributes", {})["sweep"] = clean
        _write_root(loc, root)


def read_sweep_index(path: str | os.PathLike) -> dict | None:
    """The sweep index from the root attrs, or None if the launcher wrote none."""
    loc = _Loc(path)
    return _check_index(loc, _required_root(loc))


def _check_index(loc: _Loc, root: dict) -> dict | None:
    """The sweep index of the root metadata `root`; StoreError if it is not what the launcher writes."""
    index = root.get("attributes", {}).get("sweep")
    if index is not None and (problem := _index_problem(index)) is not None:
        # readable JSON, but not what the launcher writes: every reader of the grid failed with a traceback
        raise StoreError(f"{loc}: the sweep index in the store's root zarr.json is damaged ({problem}); restore "
                         f"that file from a backup, or delete the \"sweep\" key from its attributes: the runs stay, "
                         f"and `dynamics sweep` of each config swept into the store indexes its points again")
    return index


def _index_problem(index: Any) -> str | None:
    """What is wrong with a sweep index, if it is not of the shape :func:`write_sweep_index` writes."""
    if not isinstance(index, dict):
        return f"{index!r}, not a table"
    axes, runs, steps = index.get("axes", []), index.get("runs", {}), index.get("steps", {})
    if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
        return f"axes = {axes!r}, not a list of keys"
    if not isinstance(runs, dict):
        return f"runs = {runs!r}, not a table of run ids"
    for run_id, values in runs.items():
        if not isinstance(values, dict):  # None too: every reader of a run's values takes a table
            return f"runs.{run_id} = {values!r}, not a table of values"
    if not isinstance(steps, dict):
        return f"steps = {steps!r}, not a table of run ids"
    for run_id, n in steps.items():
        if not isinstance(n, int) or isinstance(n, bool):
            return f"steps.{run_id} = {n!r}, not an integer"
    return None
