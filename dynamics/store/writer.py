"""Writing one run group: arrays created at full size, then filled snapshot by snapshot."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import zarr
import zarr.api.asynchronous as azarr
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from dynamics.schema import SNAPSHOT, TRAIN_STEP
from dynamics.store._loc import (
    StoreError,
    _check_name,
    _group_exists,
    _jsonable,
    _Loc,
    _locked,
    _unreadable_member,
)
from dynamics.store._zarr_private import sync as _sync
from dynamics.store.index import _index_update
from dynamics.store.root import _update_group_attrs, init_store

TRAIN_STEP_CHUNK = 4096

EMPTY_CHUNKS_WRITTEN = "empty_chunks_written"
"""Run attribute, true for a run created by a writer that stores every chunk it writes, even one
whose values all equal the fill value (zarr's ``write_empty_chunks``). In such a run a chunk file
that is not there was never written or was lost, never "all NaN" or "all 0", so
`check_recorded` can name a lost ``probe_tokens`` chunk or a lost gradient chunk at a run's last
snapshot, which in earlier runs read like values that were written (all token 0; a NaN gradient)."""
_WRITE_ALL = {"write_empty_chunks": True}


# name -> factory of the bytes->bytes codecs for numeric arrays: COMPRESSORS without the checksum
# (bench/store.py times the store's with and without it), CODECS with. bench/store.py measures them all.
# Each of CODECS ends in a CRC32C of the stored bytes: without it a flipped bit in a zstd chunk decoded,
# silently, to one wrong number (checked: one float32 of 1000 changed, no error); with it the read
# fails, and integrity.unreadable_chunk names the run, array and snapshot. 4 bytes a chunk.
COMPRESSORS: dict[str, Callable[[], tuple]] = {
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
CODECS: dict[str, Callable[[], tuple]] = {
    name: (lambda make=make: (*make(), Crc32cCodec())) for name, make in COMPRESSORS.items()}
DEFAULT_CODEC = "zstd-1"
"""Codec of recorded numeric arrays (see ``python bench/store.py``)."""


# --------------------------------------------------------------------------- writing a run


async def _gather(coros: list) -> None:
    await asyncio.gather(*coros)


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
        ``name -> (dims, shape, dtype)`` or ``(dims, shape, dtype, fill)`` with the full
        shape. What was never written reads as ``fill``: by default NaN for float, 0 for int,
        so give an int array whose 0 is a real value its own "missing" code. Chunks: one
        snapshot per chunk, ``train_step`` by 4096, full size otherwise.
    coords : dict
        ``name -> (dim, values)``, written as 1-D coordinate arrays (strings allowed). A
        coordinate not named after its dim (e.g. ``step`` on ``snapshot``) is declared as a
        coordinate of every variable with that dim, so xarray reads it as one.
    attrs : dict
        Group attributes (JSON-able). On resume they are merged into the existing ones, once
        the stored arrays are known to match: a refused resume changes nothing.
    resume : bool
        False: refuse an existing run. True: reopen it (after a kill), keeping written
        data; the variables and coords must match what is stored.
    codec : str
        Key of :data:`CODECS` for numeric arrays.
    before_create : callable, optional
        Called with no arguments under the store's lock when the run's group is new, just
        before it is made; what it raises refuses the run with nothing written. A check of the
        store's other runs made here sees every group another process made before this one
        (``dynamics run``'s twin check), which one made before taking the lock could miss.

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
        before_create: Callable[[], None] | None = None,
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
            if exists:  # its attrs are merged below, once the stored arrays are known to match
                group = zarr.open_group(loc.store, path=gpath, mode="r+", use_consolidated=False)
            else:
                if before_create is not None:
                    before_create()
                group = zarr.create_group(loc.store, path=gpath, zarr_format=3,
                                          attributes={**clean_attrs, EMPTY_CHUNKS_WRITTEN: True})

        try:
            existing = set(group.array_keys()) if exists else set()
        except ValueError as e:  # json.JSONDecodeError among them: refused before the attrs below change
            damaged = _unreadable_member(loc, gpath)
            if damaged is None:
                raise
            raise damaged from e
        coord_of: dict[str, list[str]] = {}  # dim -> non-index coordinate names on it
        for name, (dim, _values) in coords.items():
            if name != dim:
                coord_of.setdefault(dim, []).append(name)
        used_dims = {d for dims, *_ in specs.values() for d in dims}

        self._arrays: dict[str, Any] = {}
        to_create: dict[str, dict] = {}  # name -> create_array kwargs, created concurrently below
        for name, (dims, shape, dt, fill) in specs.items():
            if name in existing:
                # write_empty_chunks is a runtime setting, not stored: set again on every open, though a
                # run begun before it (no EMPTY_CHUNKS_WRITTEN attr) stays checked as such runs are
                arr = self._arrays[name] = group[name].with_config(_WRITE_ALL)
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
                compressors=CODECS[codec](),
                fill_value=fill,
                dimension_names=dims,
                attributes={"coordinates": " ".join(cnames)} if cnames else None,
                config=_WRITE_ALL,
            )
        coord_values: dict[str, np.ndarray] = {}
        refill: dict[str, Any] = {}  # name -> stored coordinate array that never received its values
        for name, (dim, values) in coords.items():
            values = np.asarray(values)
            is_str = values.dtype.kind in "UTO"
            if name in existing:
                arr = group[name].with_config(_WRITE_ALL)
                if arr.nchunks_initialized == 0 and arr.shape == values.shape:
                    # created, then the process died before its values landed: they are written now
                    # (a coordinate equal to its fill value has no chunk either; rewriting it is a no-op)
                    coord_values[name] = values.astype(str) if is_str else values
                    refill[name] = arr.async_array
                    continue
                stored = arr[...]
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
                compressors=CODECS[codec](),
                dimension_names=(dim,),
                attributes=own,
                config=_WRITE_ALL,
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
            targets = refill | arrays
            await asyncio.gather(*(targets[n].setitem(..., v) for n, v in coord_values.items()))
            return arrays

        if exists:  # only now: a refused resume leaves the run's attrs as they were
            _update_group_attrs(loc, gpath, clean_attrs)
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
                dims, shape, dtype, *fill = spec
                if len(fill) > 1:
                    raise ValueError
            except (TypeError, ValueError):
                raise StoreError(f"variable {name!r}: expected (dims, shape, dtype[, fill]), got {spec!r}") from None
            dims, shape = tuple(dims), tuple(int(n) for n in shape)
            if len(dims) != len(shape):
                raise StoreError(f"variable {name!r}: {len(dims)} dims {dims} but shape {shape}")
            for d, n in zip(dims, shape, strict=True):
                if dim_sizes.setdefault(d, n) != n:
                    raise StoreError(f"variable {name!r}: dim {d!r} has size {n}, elsewhere {dim_sizes[d]}")
            dt = _parse_dtype(name, dtype)
            specs[name] = (dims, shape, dt, fill[0] if fill else _fill(dt))
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
