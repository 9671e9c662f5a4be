"""The root index: the root group's consolidated metadata, one shallow entry per group of the
store (its attributes; zarr lists the group's members from the store), which plain
``xr.open_zarr(store, group=...)`` reads.

Kept up to date under the store lock as groups are written (:func:`_index_update`), rebuilt
from the groups on disk (:func:`_rebuild_index`), and left alone by the processes of a URL
store's sweep, whose launcher rebuilds it (:func:`deferred_index`). It is rewritten whole at
every update, so an update costs what the store's size does: only the changed entries are
validated, and the JSON is written by json's C encoder (:func:`_write_root`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import threading
from collections.abc import Iterator

from dynamics.store._loc import _NAME, SECTIONS, StoreError, _group_exists, _Loc, _locked
from dynamics.store._zarr_private import GroupMetadata


def _node_entry(loc: _Loc, gpath: str) -> dict | None:
    meta = loc.get_json(f"{gpath}/zarr.json")
    if meta is None or meta.get("node_type") != "group":
        return None
    meta.pop("consolidated_metadata", None)  # shallow: zarr lists the group's members from the store
    return meta


def _checked_entry(loc: _Loc, gpath: str) -> dict | None:
    """`_node_entry`, validated as zarr group metadata before it goes into the root index.

    Each entry is checked as it is put in, so that `_write_root` need not check the whole
    index again at every write: a group's zarr.json that zarr cannot read would otherwise
    make the root, and with it every group of the store, unreadable to zarr and xarray.
    """
    entry = _node_entry(loc, gpath)
    if entry is not None:
        _parse_group(entry)
    return entry


def _parse_group(meta: dict) -> None:
    """Parse `meta` as zarr group metadata, raising where zarr could not read it.

    ``node_type`` is checked here: zarr's ``from_dict`` drops it inside an ``assert``, which
    ``python -O`` strips, and then failed on every group ("unexpected keyword argument
    'node_type'"), so no run could be written under -O."""
    meta = copy.deepcopy(meta)
    if meta.pop("node_type", None) not in ("group", None):
        raise ValueError("group metadata whose node_type is not 'group'")
    GroupMetadata.from_dict(meta)


def _empty_cm() -> dict:
    return {"kind": "inline", "must_understand": False, "metadata": {}}


def _write_root(loc: _Loc, root: dict) -> None:
    """Validate the root group metadata through zarr, then write it atomically.

    The root holds the index of every group of the store, and it is rewritten whenever a run's
    attributes change (at each of its checkpoints) and whenever an analysis is written, under
    the store lock. Validated and serialised whole through zarr (a deep copy, every entry
    parsed, then json's pure-Python encoder for zarr's indented JSON), one write took 19 ms
    with 12 runs in the store and 0.67 s with 500, and a sweep of 200 tiny runs took twice as
    long as it does now (README, Performance). Now the entries are validated as they are put in
    (`_checked_entry`), the rest of the root here, and the JSON is the one zarr writes
    (``json.dumps`` with NaN allowed) without the indentation, which json's C encoder makes.
    """
    cm = root.get("consolidated_metadata")
    skeleton = {**root, "consolidated_metadata": {**cm, "metadata": {}}} if isinstance(cm, dict) else root
    _parse_group(skeleton)
    loc.set("zarr.json", json.dumps(root, allow_nan=True).encode())


def _index_of(root: dict) -> dict | None:
    """The root's index (group path -> entry), or None where it is missing or not one: a
    hand-edited ``metadata`` list, string or null failed every later write of the store with a
    TypeError, and the index holds nothing the groups do not (it is rebuilt from them)."""
    cm = root.get("consolidated_metadata")
    flat = cm.get("metadata") if isinstance(cm, dict) else None
    if not isinstance(flat, dict) or not all(isinstance(e, dict) for e in flat.values()):
        return None
    return flat


def _read_root(loc: _Loc) -> dict:
    root = loc.get_json("zarr.json")
    if root is None:
        raise StoreError(f"not a dynamics store: {loc}")
    return root


_DEFERRED: dict[str, int] = {}  # url -> open deferred_index blocks in this process
_DEFERRED_LOCK = threading.Lock()


@contextlib.contextmanager
def deferred_index(path: str | os.PathLike) -> Iterator[None]:
    """While this block runs, this process leaves the root index of a URL store alone.

    The index lives in the root ``zarr.json``, updated read-modify-write. On a local store
    ``flock`` serialises the processes that do it; a URL store has no cross-process lock,
    so several sweep workers updating it would lose each other's entries (and on a
    filesystem without atomic writes, a reader could see a half-written root). Sweep tasks
    on URL stores therefore write only their own run group, and the launcher, the store's
    one owner, rebuilds the index (:func:`reindex`) when the runs are done. Local stores
    are unaffected: their index stays live. Process-wide, not per thread: a run's writes
    happen on its background writer thread too.
    """
    loc = _Loc(path)
    if loc.local is not None:
        yield
        return
    with _DEFERRED_LOCK:
        _DEFERRED[loc.url] = _DEFERRED.get(loc.url, 0) + 1
    try:
        yield
    finally:
        with _DEFERRED_LOCK:
            _DEFERRED[loc.url] -= 1
            if not _DEFERRED[loc.url]:
                del _DEFERRED[loc.url]


def _index_update(loc: _Loc, gpath: str) -> None:
    """Refresh the root-index entry of one ``<section>/<name>`` group (removed if it is gone)."""
    if loc.local is None and loc.url in _DEFERRED:
        return
    _index_entries(loc, [gpath])


def _index_entries(loc: _Loc, gpaths: list[str]) -> None:
    """Refresh the root-index entries of these groups in one read-modify-write of the root."""
    with _locked(loc):
        root = _read_root(loc)
        flat = _index_of(root)
        if flat is None:
            _rebuild_index(loc)
            return
        for gpath in gpaths:
            section = gpath.split("/")[0]
            if section not in flat:
                flat[section] = {
                    "zarr_format": 3,
                    "node_type": "group",
                    "attributes": {},
                    "consolidated_metadata": _empty_cm(),
                }
            entry = _checked_entry(loc, gpath)
            if entry is None:
                flat.pop(gpath, None)
            else:
                flat[gpath] = entry
        _write_root(loc, root)


def _rebuild_index(loc: _Loc) -> None:
    with _locked(loc):
        root = _read_root(loc)
        flat: dict[str, dict] = {}
        for section in SECTIONS:
            if not _group_exists(loc, section):
                continue
            flat[section] = {
                "zarr_format": 3,
                "node_type": "group",
                "attributes": {},
                "consolidated_metadata": _empty_cm(),
            }
            for name in loc.list_dir(section):
                entry = _checked_entry(loc, f"{section}/{name}") if _NAME.match(name) else None
                if entry is not None:
                    flat[f"{section}/{name}"] = entry
        root["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": flat}
        _write_root(loc, root)
