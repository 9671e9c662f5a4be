"""A Dataset encoded as the zarr v3 keys of its group, in memory, ready to be written in one go.

``Dataset.to_zarr`` makes each array with its own blocking calls into zarr's event loop (create
the array, write its chunk), and zarr's per-array work there dominates a small group: 90-200 ms
for the 34 arrays of a demo run's analysis, the largest part of writing it. For the datasets
the analysers and predictor write (numbers and strings, CF attributes of no special meaning),
:func:`staged_keys` makes every array in one event-loop call, concurrently, with what
``to_zarr`` writes for them, byte for byte (tests/test_store_staged.py compares the two): the
``coordinates`` attributes, NaN fill values with their base64 ``_FillValue``, zarr's
automatic chunks, dimension names. Anything else (booleans, dates, CF encodings,
``_FillValue`` or ``coordinates`` set by hand, a MultiIndex) goes through ``to_zarr``.
"""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.buffer import default_buffer_prototype
from zarr.storage import MemoryStore

from dynamics.store._zarr_private import sync as _sync

if TYPE_CHECKING:
    import xarray as xr

_NAN_ATTR = base64.standard_b64encode(struct.pack("<d", math.nan)).decode()

_CF_ATTRS = frozenset({
    # what xarray's CF encoder reads or writes itself, and the CF attributes that name other
    # variables (they change which coordinates go in "coordinates")
    "_FillValue", "missing_value", "scale_factor", "add_offset", "_Unsigned", "_Encoding", "dtype",
    "calendar", "coordinates", "bounds", "cell_measures", "formula_terms", "ancillary_variables",
    "climatology", "geometry", "grid_mapping", "node_coordinates", "node_count", "part_node_count",
    "interior_ring",
})


def staged_keys(ds: xr.Dataset, compressors: Any) -> list[tuple[str, Any]]:
    """Every key of `ds`'s zarr v3 group and its bytes (zarr buffers), the group's ``zarr.json`` last.

    ``ds`` is loaded, with JSON-able attrs; its variables' encodings are replaced, so that every
    array gets zarr's automatic chunks and the codecs ``compressors()`` makes (a fresh tuple per
    array). Every chunk is stored, all-NaN ones too (zarr's ``write_empty_chunks``).
    """
    for var in ds.variables.values():
        var.encoding = {"compressors": compressors()}
    plan = _plan(ds)
    staged = MemoryStore()
    if plan is None:
        ds.to_zarr(staged, mode="w", consolidated=False, zarr_format=3, write_empty_chunks=True)
    else:
        _sync(_make(staged, *plan, compressors))

    async def read() -> list[tuple[str, Any]]:
        keys = sorted([k async for k in staged.list()], key=lambda k: k == "zarr.json")
        proto = default_buffer_prototype()
        values = await asyncio.gather(*(staged.get(k, prototype=proto) for k in keys))
        return list(zip(keys, values, strict=True))

    return _sync(read())


def _plan(ds: xr.Dataset) -> tuple[dict, list[tuple[str, np.ndarray, dict, tuple, Any]]] | None:
    """(group attrs, [(name, values, attrs, dims, fill value)]) as to_zarr encodes them; None
    when `ds` holds anything this does not encode exactly as it does."""
    import xarray as xr

    if any(type(index) is not xr.indexes.PandasIndex for index in ds.xindexes.values()):  # a MultiIndex, say
        return None
    names = list(ds.variables)
    if not all(isinstance(n, str) and n and "/" not in n for n in names):
        return None
    extra = [c for c in ds.coords if c not in ds.dims]
    if any(" " in c for c in extra):  # to_zarr writes those as data variables, with a warning
        return None
    if not _plain_json(ds.attrs) or "coordinates" in ds.attrs:
        return None
    arrays = []
    written: set[str] = set()
    for name, var in ds.variables.items():
        if not _plain_json(var.attrs) or _CF_ATTRS & set(var.attrs):
            return None
        values = var.values
        kind = values.dtype.kind
        if kind == "O" and not all(isinstance(v, str) for v in values.flat):
            return None
        if kind not in "fiuOT" or (kind == "f" and values.dtype.itemsize not in (2, 4, 8)):
            return None
        attrs = dict(var.attrs)
        # xarray's CF rule: a non-dimension coordinate goes in the "coordinates" attribute of each
        # other variable (not a coordinate itself) whose dims hold all of its own
        if name not in extra and name not in var.dims:
            attached = sorted(c for c in extra if set(ds.variables[c].dims) <= set(var.dims))
            if attached:
                attrs["coordinates"] = " ".join(attached)
                written.update(attached)
        if kind == "f":  # xarray's fill for floats, and its attribute: base64 of the float64 bytes, any width
            fill: Any = np.nan
            attrs["_FillValue"] = _NAN_ATTR
        else:
            fill = 0 if kind in "iu" else ""
        arrays.append((name, values, attrs, var.dims, fill))
    group_attrs = dict(ds.attrs)
    if unattached := set(extra) - written:  # a coordinate no variable names: listed on the group
        group_attrs["coordinates"] = " ".join(sorted(unattached))
    return group_attrs, arrays


def _plain_json(value: Any) -> bool:
    """Whether `value` is made of str, int, finite float, bool, None, lists and str-keyed dicts
    only, which zarr and xarray both write as the same JSON."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_plain_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_json(v) for k, v in value.items())
    return False


async def _make(staged: MemoryStore, group_attrs: dict, arrays: list, compressors: Any) -> None:
    root = await zarr.api.asynchronous.open_group(store=staged, mode="w", zarr_format=3, attributes=group_attrs)

    async def one(name: str, values: np.ndarray, attrs: dict, dims: tuple, fill: Any) -> None:
        array = await root.create_array(
            name=name, shape=values.shape, dtype=str if values.dtype.kind in "OT" else values.dtype,
            fill_value=fill, compressors=compressors(), attributes=attrs,
            dimension_names=dims or None, config={"write_empty_chunks": True})
        await array.setitem(Ellipsis, values)

    await asyncio.gather(*(one(*a) for a in arrays))
