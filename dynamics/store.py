"""Storage: write run groups into one Zarr v3 store, open runs and sweeps as xarray.

This is the only module that imports zarr (and it never imports torch). Layout, as in
:mod:`dynamics.schema`::

    STORE/zarr.json             root group: attrs {dynamics_store, sweep} + the group index
    STORE/runs/<run_id>/        one group per run, written only by that run's process
    STORE/analysis/<run_id>/    derived per-run arrays (replaced whole when recomputed)
    STORE/derived/<name>/       sweep-level datasets
    STORE/checkpoints/<run_id>/ckpt.pt   torch checkpoints (plain files, not zarr)

Every array names its dimensions (zarr v3 ``dimension_names``), so a run opens without this
package: ``xr.open_zarr(STORE, group="runs/<run_id>")``.

The group index
---------------
``xr.open_zarr(store, group=...)`` with its default ``consolidated=None`` opens the *root*
with consolidated metadata and looks the group up there; without it, xarray warns and
falls back. Zarr's own ``consolidate_metadata`` inlines every array of every run into the
root ``zarr.json`` (measured: 2 s to write and 0.4 s to open one run for 100 runs), and
rewriting it from every run process would race with the launcher's sweep index. So the
root carries a *shallow* index instead: the entries ``runs``, ``analysis``, ``derived`` and
one entry per ``<section>/<name>`` group (its attributes), but not the arrays below them.
Zarr then lists a run's arrays from the store itself, so they are never stale. The entry of
one group is updated (read-modify-write of the root ``zarr.json``) whenever that group is
created or its attributes change, under an exclusive ``flock`` on the store directory, the
same lock that guards writes of the sweep index. This package's own readers never use the
index (they open groups with ``consolidated=False``), so a stale index can only affect
plain-xarray users; :func:`reindex` rebuilds it from the groups on disk.

Locations
---------
Paths may be local paths, ``file://`` URLs, or other fsspec URLs (``memory://...``,
``s3://...``) for the zarr parts. Cross-process locking and checkpoint files need a local
filesystem: with a remote store, only one process at a time may change the index or the
sweep index, and :func:`checkpoint_path` raises :class:`StoreError`.

Chunks and codec
----------------
Snapshot variables are chunked one snapshot per chunk (full size in the other dims), so a
snapshot write replaces whole chunks and never reads back; ``train_step`` variables are
chunked at 4096. Numeric arrays are compressed with :data:`DEFAULT_CODEC`, chosen by
``python bench/store.py``: plain zstd at level 1 stores peaky float16 attention within a few
percent of the best ratio measured (blosc-zstd-5 with byte shuffle) for several times less
CPU, and zstd is a core Zarr v3 codec that any reader understands.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pandas as pd
import xarray as xr
import zarr
import zarr.api.asynchronous as azarr
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.group import GroupMetadata
from zarr.core.sync import sync as _sync
from zarr.storage import FsspecStore, LocalStore

from dynamics.schema import HEAD, LAYER, RUN, SNAPSHOT, STORE_VERSION, TRAIN_STEP

try:  # POSIX only; without it, index updates are guarded within this process only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "RunWriter",
    "StoreError",
    "atomic_write_bytes",
    "checkpoint_path",
    "init_store",
    "is_store",
    "list_runs",
    "open_analysis",
    "open_derived",
    "open_run",
    "open_sweep",
    "read_sweep_index",
    "reindex",
    "run_attrs",
    "update_run_attrs",
    "write_analysis",
    "write_derived",
    "write_sweep_index",
]

TRAIN_STEP_CHUNK = 4096
SECTIONS = ("runs", "analysis", "derived")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# name -> factory of the bytes->bytes codecs for numeric arrays. bench/store.py measures them all.
CODECS: dict[str, Callable[[], tuple]] = {
    "none": lambda: (),
    "zstd-1": lambda: (ZstdCodec(level=1),),
    "zstd-3": lambda: (ZstdCodec(level=3),),
    "zstd-9": lambda: (ZstdCodec(level=9),),
    "blosc-zstd-1-shuffle": lambda: (BloscCodec(cname="zstd", clevel=1, shuffle="shuffle"),),
    "blosc-zstd-5-shuffle": lambda: (BloscCodec(cname="zstd", clevel=5, shuffle="shuffle"),),
    "blosc-zstd-5-bitshuffle": lambda: (BloscCodec(cname="zstd", clevel=5, shuffle="bitshuffle"),),
    "blosc-lz4-5-shuffle": lambda: (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),),
    "blosc-lz4-5-bitshuffle": lambda: (BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"),),
}
DEFAULT_CODEC = "zstd-1"
"""Codec of recorded numeric arrays (see ``python bench/store.py``)."""


class StoreError(Exception):
    """A store problem; the message is one line naming the path and what is wrong."""


# --------------------------------------------------------------------------- locations


class _Loc:
    """Where a store lives: ``url`` for zarr/xarray, ``local`` directory when on local disk."""

    def __init__(self, path: str | os.PathLike) -> None:
        text = os.fspath(path)
        if text.startswith("file://"):
            text = unquote(text[len("file://") :])
        if "://" in text:
            self.url, self.local = text.rstrip("/"), None
        else:
            self.local = Path(text).expanduser().absolute()
            self.url = str(self.local)
        self._store: Any = None

    def __str__(self) -> str:
        return self.url

    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = LocalStore(self.local) if self.local is not None else FsspecStore.from_url(self.url)
        return self._store

    def get(self, key: str) -> bytes | None:
        if self.local is not None:  # plain file read: also safe when the path is a file
            try:
                return (self.local / key).read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
        buf = _sync(self.store.get(key, prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def get_json(self, key: str) -> dict | None:
        raw = self.get(key)
        if raw is None:
            return None
        try:
            out = json.loads(raw)
        except ValueError:
            return None
        return out if isinstance(out, dict) else None

    def set(self, key: str, data: bytes) -> None:
        _sync(self.store.set(key, default_buffer_prototype().buffer.from_bytes(data)))

    def list_dir(self, prefix: str) -> list[str]:
        if self.local is not None:
            d = self.local / prefix
            return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

        async def collect() -> list[str]:
            return [k async for k in self.store.list_dir(prefix)]

        try:
            return sorted(_sync(collect()))
        except FileNotFoundError:
            return []


_THREAD_LOCK = threading.RLock()
_HELD = threading.local()


@contextlib.contextmanager
def _locked(loc: _Loc) -> Iterator[None]:
    """Exclusive lock on the store's shared metadata (root zarr.json, run attrs).

    A thread lock for this process plus, for local stores, ``flock`` on the store directory
    (flock is per open file, so re-entry within a thread must not take it twice).
    """
    with _THREAD_LOCK:
        depth = getattr(_HELD, "depth", 0)
        fd = None
        if depth == 0 and loc.local is not None and fcntl is not None and loc.local.is_dir():
            fd = os.open(loc.local, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _HELD.depth = depth + 1
        try:
            yield
        finally:
            _HELD.depth = depth
            if fd is not None:
                os.close(fd)  # releases the flock


# --------------------------------------------------------------------------- small helpers


async def _gather(coros: list) -> None:
    await asyncio.gather(*coros)


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise StoreError(f"invalid {kind} {name!r}: use letters, digits, '.', '_' or '-', not starting with a symbol")
    return name


def _jsonable(value: Any, key: str) -> Any:
    """Plain-JSON copy of an attribute value (numpy scalars and arrays, tuples become lists)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.generic):
        return _jsonable(value.item(), key)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist(), key)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, key) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise StoreError(f"attribute {key!r}: dict keys must be strings")
        return {k: _jsonable(v, f"{key}.{k}") for k, v in value.items()}
    raise StoreError(f"attribute {key!r}: {type(value).__name__} is not JSON-serialisable")


def _group_exists(loc: _Loc, gpath: str) -> bool:
    meta = loc.get_json(f"{gpath}/zarr.json")
    return meta is not None and meta.get("node_type") == "group"


def _require_store(loc: _Loc) -> None:
    if not is_store(loc.url):
        raise StoreError(f"not a dynamics store: {loc}")


def _children(loc: _Loc, section: str) -> list[str]:
    return [n for n in loc.list_dir(section) if _NAME.match(n) and _group_exists(loc, f"{section}/{n}")]


def _default_run(loc: _Loc, run_id: str | None) -> str:
    runs = _children(loc, "runs")
    if run_id is None:
        if len(runs) == 1:
            return runs[0]
        if not runs:
            raise StoreError(f"no runs in {loc}")
        raise StoreError(f"{loc} holds {len(runs)} runs; pass run_id, one of: {', '.join(runs)}")
    if run_id not in runs:
        raise StoreError(f"no run {run_id!r} in {loc}; runs: {', '.join(runs) or '(none)'}")
    return run_id


def _open_group_ds(loc: _Loc, gpath: str) -> xr.Dataset:
    # consolidated=False: read the group's own metadata, never the (possibly stale) root index
    return xr.open_zarr(loc.url, group=gpath, consolidated=False)


# --------------------------------------------------------------------------- root index


def _node_entry(loc: _Loc, gpath: str) -> dict | None:
    meta = loc.get_json(f"{gpath}/zarr.json")
    if meta is None or meta.get("node_type") != "group":
        return None
    meta.pop("consolidated_metadata", None)  # shallow: zarr lists the group's members from the store
    return meta


def _empty_cm() -> dict:
    return {"kind": "inline", "must_understand": False, "metadata": {}}


def _write_root(loc: _Loc, root: dict) -> None:
    """Validate and serialise the root group metadata through zarr, then write it atomically."""
    meta = GroupMetadata.from_dict(copy.deepcopy(root))
    loc.set("zarr.json", meta.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes())


def _read_root(loc: _Loc) -> dict:
    root = loc.get_json("zarr.json")
    if root is None:
        raise StoreError(f"not a dynamics store: {loc}")
    return root


def _index_update(loc: _Loc, gpath: str) -> None:
    """Refresh the root-index entry of one ``<section>/<name>`` group (removed if it is gone)."""
    with _locked(loc):
        root = _read_root(loc)
        flat = root.get("consolidated_metadata", {}).get("metadata")
        if flat is None:
            _rebuild_index(loc)
            return
        section = gpath.split("/")[0]
        if section not in flat:
            flat[section] = {
                "zarr_format": 3,
                "node_type": "group",
                "attributes": {},
                "consolidated_metadata": _empty_cm(),
            }
        entry = _node_entry(loc, gpath)
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
                entry = _node_entry(loc, f"{section}/{name}") if _NAME.match(name) else None
                if entry is not None:
                    flat[f"{section}/{name}"] = entry
        root["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": flat}
        _write_root(loc, root)


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
        root = _Loc(path).get_json("zarr.json")
    except Exception:  # unreachable remote, bad URL: not a store we can use
        return False
    return bool(root and root.get("node_type") == "group" and "dynamics_store" in root.get("attributes", {}))


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
                if loc.list_dir(""):
                    raise StoreError(f"{loc} exists, is not empty and is not a dynamics store")
                root = zarr.create_group(loc.store, zarr_format=3, attributes={"dynamics_store": STORE_VERSION})
                for section in SECTIONS:
                    root.require_group(section)
                _rebuild_index(loc)
                return
    version = _read_root(loc)["attributes"]["dynamics_store"]
    if not isinstance(version, int) or version > STORE_VERSION:
        raise StoreError(f"{loc}: store version {version!r} is newer than this package supports ({STORE_VERSION})")
    if not all(_group_exists(loc, s) for s in SECTIONS) or "consolidated_metadata" not in _read_root(loc):
        with _locked(loc):
            root = zarr.open_group(loc.store, mode="r+", use_consolidated=False)
            for section in SECTIONS:
                root.require_group(section)
            _rebuild_index(loc)


def list_runs(path: str | os.PathLike) -> list[str]:
    """Sorted ids of the run groups in a store.

    Parameters
    ----------
    path : str or PathLike

    Returns
    -------
    list of str

    Raises
    ------
    StoreError
        If `path` is not a dynamics store.
    """
    loc = _Loc(path)
    _require_store(loc)
    return _children(loc, "runs")


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
    meta = loc.get_json(f"runs/{_check_name('run id', run_id)}/zarr.json")
    if meta is None:
        raise StoreError(f"no run {run_id!r} in {loc}")
    return meta.get("attributes", {})


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


# --------------------------------------------------------------------------- writing a run


def _chunks(dims: tuple[str, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for d, n in zip(dims, shape, strict=True):
        if d == SNAPSHOT:
            out.append(1)
        elif d == TRAIN_STEP:
            out.append(min(n, TRAIN_STEP_CHUNK))
        else:
            out.append(n)
    return tuple(max(c, 1) for c in out)


def _parse_dtype(name: str, dtype: Any) -> np.dtype | type:
    if dtype in (str, "str", "string") or (isinstance(dtype, np.dtype) and dtype.kind in "UT"):
        return str
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise StoreError(f"variable {name!r}: unknown dtype {dtype!r}") from None
    if dt.kind not in "biuf":
        raise StoreError(f"variable {name!r}: unsupported dtype {dt} (use float, int, bool or str)")
    return dt


def _fill(dt: np.dtype | type) -> Any:
    if dt is str:
        return ""
    return {"f": np.nan, "b": False}.get(dt.kind, 0)


class RunWriter:
    """Writes one run group: arrays created at full size, then filled snapshot by snapshot.

    Parameters
    ----------
    path : str or PathLike
        Store location; created if missing (see :func:`init_store`).
    run_id : str
        Name of the group ``runs/<run_id>``.
    variables : dict
        ``name -> (dims, shape, dtype)`` with the full shape. Float arrays start as NaN, int
        as 0. Chunks: one snapshot per chunk, ``train_step`` by 4096, full size otherwise.
    coords : dict
        ``name -> (dim, values)``, written as 1-D coordinate arrays (strings allowed). A
        coordinate not named after its dim (e.g. ``step`` on ``snapshot``) is declared as a
        coordinate of every variable with that dim, so xarray reads it as one.
    attrs : dict
        Group attributes (JSON-able). On resume they are merged into the existing ones.
    resume : bool
        False: refuse an existing run. True: reopen it (after a kill), keeping written
        data; the variables and coords must match what is stored.
    codec : str
        Key of :data:`CODECS` for numeric arrays.

    Example
    -------
    >>> w = RunWriter(store, "r1", variables={"gate": (("snapshot", "layer", "head"), (3, 2, 4), "float32")},
    ...               coords={"step": ("snapshot", np.array([0, 10, 20]))}, attrs={"status": "running"})  # doctest: +SKIP
    >>> w.write_snapshot(0, {"gate": np.ones((2, 4))})  # doctest: +SKIP
    >>> w.finalize()  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | os.PathLike,
        run_id: str,
        *,
        variables: dict[str, tuple[tuple[str, ...], tuple[int, ...], Any]],
        coords: dict[str, tuple[str, np.ndarray]],
        attrs: dict,
        resume: bool = False,
        codec: str = DEFAULT_CODEC,
    ) -> None:
        self.path, self.run_id = path, _check_name("run id", run_id)
        self._loc = loc = _Loc(path)
        self._gpath = gpath = f"runs/{run_id}"
        if codec not in CODECS:
            raise StoreError(f"unknown codec {codec!r}; one of: {', '.join(CODECS)}")
        specs = self._check_spec(variables, coords)
        clean_attrs = {k: _jsonable(v, k) for k, v in attrs.items()}

        init_store(path)
        with _locked(loc):  # check-and-create is atomic w.r.t. other writers of this store
            exists = _group_exists(loc, gpath)
            if exists and not resume:
                raise StoreError(f"run {run_id!r} already exists in {loc} (pass resume=True to continue it)")
            if exists:
                group = zarr.open_group(loc.store, path=gpath, mode="r+", use_consolidated=False)
                group.update_attributes(clean_attrs)
            else:
                group = zarr.create_group(loc.store, path=gpath, zarr_format=3, attributes=clean_attrs)

        existing = set(group.array_keys()) if exists else set()
        coord_of: dict[str, list[str]] = {}  # dim -> non-index coordinate names on it
        for name, (dim, _values) in coords.items():
            if name != dim:
                coord_of.setdefault(dim, []).append(name)
        used_dims = {d for dims, _, _ in specs.values() for d in dims}

        self._arrays: dict[str, Any] = {}
        to_create: dict[str, dict] = {}  # name -> create_array kwargs, created concurrently below
        for name, (dims, shape, dt) in specs.items():
            if name in existing:
                arr = self._arrays[name] = group[name]
                stored = (tuple(arr.metadata.dimension_names or ()), tuple(arr.shape))
                if stored != (dims, shape) or (dt is not str and arr.dtype != dt):
                    raise StoreError(
                        f"run {run_id!r}: stored {name!r} is {stored} {arr.dtype}, not {(dims, shape)} {dt}"
                    )
                continue
            cnames = [c for d in dims for c in coord_of.get(d, [])]
            to_create[name] = dict(
                shape=shape,
                dtype=dt,
                chunks=_chunks(dims, shape),
                compressors=CODECS[codec]() if dt is not str else "auto",
                fill_value=_fill(dt),
                dimension_names=dims,
                attributes={"coordinates": " ".join(cnames)} if cnames else None,
            )
        coord_values: dict[str, np.ndarray] = {}
        for name, (dim, values) in coords.items():
            values = np.asarray(values)
            is_str = values.dtype.kind in "UTO"
            if name in existing:
                stored = group[name][...]
                same = stored.shape == values.shape and (
                    [str(v) for v in stored] == [str(v) for v in values] if is_str else np.array_equal(stored, values)
                )
                if not same:
                    raise StoreError(f"run {run_id!r}: stored coordinate {name!r} differs from the one given")
                continue
            # a coordinate no variable can carry declares itself, so xarray still reads it as one
            own = {"coordinates": name} if name != dim and dim not in used_dims else None
            coord_values[name] = values.astype(str) if is_str else values
            to_create[name] = dict(
                shape=values.shape,
                dtype=str if is_str else values.dtype,
                chunks=(max(len(values), 1),),
                dimension_names=(dim,),
                attributes=own,
            )

        async def create() -> dict[str, Any]:
            # one round trip to zarr's event loop instead of one per array
            made = await asyncio.gather(
                *(
                    azarr.create_array(loc.store, name=f"{gpath}/{n}", zarr_format=3, **kw)
                    for n, kw in to_create.items()
                )
            )
            arrays = dict(zip(to_create, made, strict=True))
            await asyncio.gather(*(arrays[n].setitem(..., v) for n, v in coord_values.items()))
            return arrays

        for name, arr in _sync(create()).items():
            if name in specs:
                self._arrays[name] = zarr.Array(arr)
        _index_update(loc, gpath)

    @staticmethod
    def _check_spec(variables: dict, coords: dict) -> dict:
        specs, dim_sizes = {}, {}
        for name, spec in variables.items():
            _check_name("variable name", name)
            try:
                dims, shape, dtype = spec
            except (TypeError, ValueError):
                raise StoreError(f"variable {name!r}: expected (dims, shape, dtype), got {spec!r}") from None
            dims, shape = tuple(dims), tuple(int(n) for n in shape)
            if len(dims) != len(shape):
                raise StoreError(f"variable {name!r}: {len(dims)} dims {dims} but shape {shape}")
            for d, n in zip(dims, shape, strict=True):
                if dim_sizes.setdefault(d, n) != n:
                    raise StoreError(f"variable {name!r}: dim {d!r} has size {n}, elsewhere {dim_sizes[d]}")
            specs[name] = (dims, shape, _parse_dtype(name, dtype))
        for name, spec in coords.items():
            _check_name("coordinate name", name)
            try:
                dim, values = spec
            except (TypeError, ValueError):
                raise StoreError(f"coordinate {name!r}: expected (dim, values), got {spec!r}") from None
            if name in specs:
                raise StoreError(f"coordinate {name!r}: also given as a variable")
            n = len(np.asarray(values))
            if np.asarray(values).ndim != 1:
                raise StoreError(f"coordinate {name!r}: values must be 1-D")
            if dim_sizes.setdefault(dim, n) != n:
                raise StoreError(f"coordinate {name!r}: {n} values for dim {dim!r} of size {dim_sizes[dim]}")
        return specs

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finalize()

    def _array(self, name: str) -> Any:
        try:
            return self._arrays[name]
        except KeyError:
            raise StoreError(
                f"run {self.run_id!r}: no variable {name!r}; variables: {', '.join(self._arrays)}"
            ) from None

    def write_snapshot(self, index: int, arrays: dict[str, np.ndarray]) -> None:
        """Write ``arrays[name]`` into ``[index, ...]`` along ``snapshot`` of each named variable.

        Parameters
        ----------
        index : int
            Snapshot position, ``0 <= index < n_snapshots``.
        arrays : dict of str -> array
            Values with the variable's shape minus the snapshot dim; cast to its dtype.
        """
        writes = []
        for name, value in arrays.items():
            arr = self._array(name)
            dims = tuple(arr.metadata.dimension_names)
            if SNAPSHOT not in dims:
                raise StoreError(f"run {self.run_id!r}: variable {name!r} {dims} has no {SNAPSHOT!r} dim")
            axis = dims.index(SNAPSHOT)
            if not 0 <= index < arr.shape[axis]:
                raise StoreError(f"run {self.run_id!r}: snapshot {index} out of range 0..{arr.shape[axis] - 1}")
            value = np.asarray(value)
            expected = arr.shape[:axis] + arr.shape[axis + 1 :]
            if value.shape != expected:
                raise StoreError(f"run {self.run_id!r}: {name!r} snapshot has shape {value.shape}, expected {expected}")
            sel = [slice(None)] * arr.ndim
            sel[axis] = index
            writes.append(arr.async_array.setitem(tuple(sel), value))
        _sync(_gather(writes))  # one round trip to zarr's event loop; chunks encode concurrently

    def write_region(self, name: str, start: int, values: np.ndarray) -> None:
        """Write ``values`` into ``[start:start + len(values)]`` along the first dim of `name`.

        Parameters
        ----------
        name : str
            Variable, e.g. ``loss`` on ``train_step``.
        start : int
        values : array
            Shape ``(k, *rest)`` where ``rest`` is the variable's shape after the first dim.
        """
        arr = self._array(name)
        values = np.asarray(values)
        if values.ndim != arr.ndim or values.shape[1:] != arr.shape[1:]:
            raise StoreError(f"run {self.run_id!r}: {name!r} region has shape {values.shape}, variable is {arr.shape}")
        if start < 0 or start + len(values) > arr.shape[0]:
            raise StoreError(
                f"run {self.run_id!r}: {name!r} region [{start}:{start + len(values)}] outside 0..{arr.shape[0]}"
            )
        arr[start : start + len(values)] = values

    def set_attrs(self, **attrs: Any) -> None:
        """Merge JSON-able attributes into the run group (and its root-index entry)."""
        _update_group_attrs(self._loc, self._gpath, attrs)

    def finalize(self) -> None:
        """Refresh the run's root-index entry so plain ``xr.open_zarr`` sees its final attrs.

        Data needs no flush: every write above is on disk when it returns. Idempotent.
        """
        _index_update(self._loc, self._gpath)


# --------------------------------------------------------------------------- reading


def open_run(path: str | os.PathLike, run_id: str | None = None) -> xr.Dataset:
    """Open one run lazily (dask-backed), with the run's attributes.

    Parameters
    ----------
    path : str or PathLike
    run_id : str, optional
        Defaults to the only run in the store.

    Returns
    -------
    xarray.Dataset
        Dims and coordinates as recorded; ``attrs`` are the run group's, plus ``run_id``.

    Raises
    ------
    StoreError
        If the run is missing, or run_id is None and the store holds zero or several runs
        (the message lists them).

    Example
    -------
    >>> ds = open_run("runs.zarr")  # doctest: +SKIP
    >>> ds.attention.sel(layer=0).isel(snapshot=-1).mean("probe")  # doctest: +SKIP
    """
    loc = _Loc(path)
    _require_store(loc)
    run_id = _default_run(loc, run_id)
    ds = _open_group_ds(loc, f"runs/{run_id}")
    ds.attrs.setdefault("run_id", run_id)
    return ds


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
        Runs to include; default: the runs of the sweep index that exist in the store (or
        every run when there is no sweep index).

    Returns
    -------
    xarray.Dataset
        Coordinates on ``run``: the run ids; ``status``; for each sweep axis
        ``section.leaf`` a coordinate ``section_leaf`` and, when no other axis or variable
        shares the name, ``leaf`` too (values from the sweep index, else from the run's
        ``config`` attribute; list values joined with ","). Dims whose sizes differ between
        runs are padded at the end with NaN (indexed dims such as ``head`` by an outer join on
        their labels); ``head_mask`` (run, layer, head) is True where the head exists. ``step``
        becomes (run, snapshot) only when runs disagree on it. ``attrs``: ``sweep`` (the
        index, if any) and ``runs`` (each run's attributes).

    Example
    -------
    >>> sw = open_sweep("runs.zarr")  # doctest: +SKIP
    >>> sw.gate.where(sw.init_scale == 2.0).groupby("train_lr").mean()  # doctest: +SKIP
    """
    loc = _Loc(path)
    _require_store(loc)
    present = _children(loc, "runs")
    index = read_sweep_index(loc.url)
    if run_ids is None:
        run_ids = [r for r in index["runs"] if r in present] if index else present
    else:
        missing = [r for r in run_ids if r not in present]
        if missing:
            raise StoreError(f"no run(s) {', '.join(map(repr, missing))} in {loc}")
    run_ids = list(run_ids)
    if not run_ids:
        raise StoreError(f"no runs to open in {loc}")

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

    new_coords: dict[str, tuple[str, np.ndarray]] = {
        "status": (RUN, np.array([str(a.get("status", "unknown")) for a in attrs]))
    }
    axes = list(index["axes"]) if index else []
    leaves = [a.split(".")[-1] for a in axes]
    for axis, leaf in zip(axes, leaves, strict=True):
        section = axis.split(".")[0]
        values = []
        for rid, a in zip(run_ids, attrs, strict=True):
            point = index["runs"].get(rid, {})
            v = point[axis] if axis in point else a.get("config", {}).get(section, {}).get(leaf)
            values.append(_axis_value(v))
        arr = _coord_array(values)
        new_coords[axis.replace(".", "_")] = (RUN, arr)
        taken = set(sweep.variables) | set(sweep.dims) | set(new_coords)
        if leaves.count(leaf) == 1 and leaf not in taken:
            new_coords[leaf] = (RUN, arr)
    sweep = sweep.assign_coords(new_coords)
    sweep.attrs = {"runs": dict(zip(run_ids, attrs, strict=True))}
    if index:
        sweep.attrs["sweep"] = index
    return sweep


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
    _require_store(loc)
    return _read_root(loc).get("attributes", {}).get("sweep")


# --------------------------------------------------------------------------- derived data


def _write_whole(loc: _Loc, gpath: str, ds: xr.Dataset) -> None:
    """Replace group `gpath` with `ds` (loaded first: it may be read from that very group)."""
    if not isinstance(ds, xr.Dataset):
        raise StoreError(f"{gpath}: expected an xarray.Dataset, got {type(ds).__name__}")
    ds = ds.load().copy()
    for name, var in ds.variables.items():
        var.encoding = {}  # stale chunk/codec encodings from a source store do not apply here
        if var.dtype.kind in "US":  # fixed-width strings have no stable zarr v3 dtype: store vlen
            ds[name] = var.astype(str).astype(object)
    ds.attrs = {k: _jsonable(v, k) for k, v in ds.attrs.items()}
    ds.to_zarr(loc.url, group=gpath, mode="w", consolidated=False, zarr_format=3)
    _index_update(loc, gpath)


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


def open_analysis(path: str | os.PathLike, run_id: str | None = None) -> xr.Dataset | None:
    """Open ``analysis/<run_id>`` lazily, or None if it was never written.

    Parameters
    ----------
    path : str or PathLike
    run_id : str, optional
        Defaults to the only run (as :func:`open_run`).
    """
    loc = _Loc(path)
    _require_store(loc)
    run_id = _default_run(loc, run_id)
    if not _group_exists(loc, f"analysis/{run_id}"):
        return None
    return _open_group_ds(loc, f"analysis/{run_id}")


def write_derived(path: str | os.PathLike, name: str, ds: xr.Dataset) -> None:
    """Replace the sweep-level dataset ``derived/<name>`` with `ds`."""
    loc = _Loc(path)
    _require_store(loc)
    _write_whole(loc, f"derived/{_check_name('derived name', name)}", ds)


def open_derived(path: str | os.PathLike, name: str) -> xr.Dataset | None:
    """Open ``derived/<name>`` lazily, or None if it was never written."""
    loc = _Loc(path)
    _require_store(loc)
    gpath = f"derived/{_check_name('derived name', name)}"
    return _open_group_ds(loc, gpath) if _group_exists(loc, gpath) else None


# --------------------------------------------------------------------------- checkpoints


def checkpoint_path(path: str | os.PathLike, run_id: str) -> Path:
    """Local file for a run's checkpoint, ``STORE/checkpoints/<run_id>/ckpt.pt`` (parent created).

    Checkpoints are plain files, so they need a local store (a path or ``file://`` URL).

    Raises
    ------
    StoreError
        For a remote (fsspec) store.
    """
    loc = _Loc(path)
    if loc.local is None:
        raise StoreError(f"checkpoints need a local store, not {loc}")
    target = loc.local / "checkpoints" / _check_name("run id", run_id) / "ckpt.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `target` so that readers see the old file or the new one, never a mix.

    A temporary file in the same directory is written, fsynced and ``os.replace``d over
    the target; the directory is then fsynced (best effort) so the rename survives a crash.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
