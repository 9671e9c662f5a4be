"""store.staged: a group's zarr keys made in one go are the ones xarray's to_zarr writes."""

import asyncio

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from zarr.buffer import default_buffer_prototype
from zarr.storage import MemoryStore

from dynamics import store
from dynamics.store import CODECS, DEFAULT_CODEC
from dynamics.store._zarr_private import sync
from dynamics.store.staged import _plan, staged_keys


def to_zarr_keys(ds: xr.Dataset) -> dict[str, bytes]:
    """What xarray's to_zarr writes for `ds`, with the codecs _write_whole gives every array."""
    ds = ds.copy()
    for var in ds.variables.values():
        var.encoding = {"compressors": CODECS[DEFAULT_CODEC]()}
    staged = MemoryStore()
    ds.to_zarr(staged, mode="w", consolidated=False, zarr_format=3, write_empty_chunks=True)

    async def read():
        keys = [k async for k in staged.list()]
        values = await asyncio.gather(*(staged.get(k, prototype=default_buffer_prototype()) for k in keys))
        return {k: v.to_bytes() for k, v in zip(keys, values, strict=True)}

    return sync(read())


def made(ds: xr.Dataset) -> dict[str, bytes]:
    return {k: v.to_bytes() for k, v in staged_keys(ds.copy(), CODECS[DEFAULT_CODEC])}


def analysis_like() -> xr.Dataset:
    rng = np.random.default_rng(0)
    score = rng.random((5, 2, 3))
    score[1, 0, 2] = np.nan
    return xr.Dataset(
        {
            "score": (("snapshot", "layer", "head"), score, {"long_name": "a score", "units": "nats"}),
            "half": (("snapshot", "layer", "head"), score.astype(np.float16)),
            "single": (("snapshot", "head"), score[:, 0].astype(np.float32), {"kappa": 0.5, "delta": "any"}),
            "role": (("snapshot", "layer", "head"), rng.integers(0, 9, (5, 2, 3)).astype(np.int8),
                     {"flag_values": list(range(9)), "flag_meanings": "a b c d e f g h i"}),
            "count": (("layer",), np.array([3, 4], np.uint8)),
            "cluster": (("snapshot", "layer", "head"), rng.integers(-1, 4, (5, 2, 3))),
            "step_of_split": ((), np.nan),
            "nothing": (("empty",), np.zeros(0)),
            "all_nan": (("snapshot",), np.full(5, np.nan)),  # its chunk is stored too
            "pairs": (("snapshot", "layer", "head", "layer_b", "head_b"), rng.random((5, 2, 3, 2, 3))),
        },
        coords={
            "step": ("snapshot", np.array([0, 10, 20, 40, 80])),  # on every snapshot variable
            "layer": [0, 1],
            "head": [0, 1, 2],
            "role_name": ("role_name", np.array(["self", "sink"], dtype=object)),
            "label": ("role_name", np.array(["s", "k"], dtype=np.dtypes.StringDType())),  # on no data variable
        },
        attrs={"analysis_version": 8, "roles": ["self", "sink"], "thresholds": {"a": 0.5, "b": None},
               "flag": True},
    )


def test_the_keys_of_an_analysis_like_group_are_to_zarrs_byte_for_byte():
    ds = analysis_like()
    assert _plan(ds) is not None  # made directly, not by to_zarr
    assert made(ds) == to_zarr_keys(ds)


def test_a_large_array_gets_zarrs_automatic_chunks_as_with_to_zarr():
    ds = xr.Dataset({"big": (("snapshot", "query", "key"), np.ones((700, 64, 64), np.float32))})
    keys = made(ds)
    assert len([k for k in keys if k.startswith("big/c/")]) > 1  # chunked, not one 11 MB chunk
    assert keys == to_zarr_keys(ds)


@pytest.mark.parametrize("case", ["bool", "datetime", "fill value attr", "coordinates attr", "multiindex",
                                  "non-finite attr", "numpy attr", "mixed objects"])
def test_what_it_does_not_encode_exactly_goes_through_to_zarr(case):
    ds = xr.Dataset({"x": ("i", [1.0, 2.0])}, coords={"i": [0, 1]})
    if case == "bool":
        ds["x"] = ds.x > 1
    elif case == "datetime":
        ds = ds.assign_coords(i=pd.date_range("2026-01-01", periods=2))
    elif case == "fill value attr":
        ds.x.attrs["_FillValue"] = -1.0
    elif case == "coordinates attr":
        ds.x.attrs["coordinates"] = "i"
    elif case == "multiindex":
        ds = ds.assign_coords(a=("i", [0, 0]), b=("i", [1, 2])).set_index(i=["a", "b"])
    elif case == "non-finite attr":
        ds.x.attrs["scale"] = float("nan")
    elif case == "numpy attr":
        ds.x.attrs["scale"] = np.float32(2)
    elif case == "mixed objects":
        ds["x"] = ("i", np.array(["a", None], dtype=object))
    assert _plan(ds) is None
    if case not in ("multiindex", "mixed objects", "numpy attr", "non-finite attr"):
        assert made(ds) == to_zarr_keys(ds)  # to_zarr's own keys


def test_an_analysis_written_and_read_back_is_the_same_dataset(tmp_path):
    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    ds = analysis_like()
    store.write_analysis(path, "r1", ds)
    back = store.open_analysis(path, "r1", stale="allow").load()
    # the step coordinate labelled as open_analysis labels every analysis's
    xr.testing.assert_identical(back.drop_encoding(), ds.assign_coords(
        role_name=ds.role_name.astype(np.dtypes.StringDType()),
        step=ds.step.assign_attrs(long_name="training step", units="steps")))
