"""RunWriter resumes a run (one whose creation was cut short too) and refuses what would record the
wrong thing: a run that exists without resume, a bad spec, a resume that does not match what is stored,
a write outside a variable. Each refusal is one StoreError, and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynamics import store
from dynamics.store import StoreError
from tests.test_store import N_SNAP, L, snapshot, spec

pytestmark = pytest.mark.filterwarnings("error")


def writer(path, run_id="r1", variables=None, coords=None, **kw):
    v, c = spec()
    return store.RunWriter(path, run_id, variables=v if variables is None else variables,
                           coords=c if coords is None else coords, attrs=kw.pop("attrs", {}), **kw)


@pytest.mark.parametrize("variables, coords, message", [
    ({"z": (("x",), (2,), "complex64")}, {}, "variable 'z': unsupported dtype complex64"),
    ({"v": (("x",), (2,), "float32", np.nan, "extra")}, {},
     r"variable 'v': expected \(dims, shape, dtype\[, fill\]\)"),
    ({"v": (("x", "y"), (2,), "float32")}, {}, r"variable 'v': 2 dims \('x', 'y'\) but shape \(2,\)"),
    ({"a": (("x",), (2,), "float32"), "b": (("x",), (3,), "float32")}, {},
     "variable 'b': dim 'x' has size 3, elsewhere 2"),
    ({"v": (("x",), (2,), "float32")}, {"v": ("x", [0, 1])}, "coordinate 'v': also given as a variable"),
    ({}, {"c": ("x", np.zeros((2, 2)))}, "coordinate 'c': values must be 1-D"),
    ({"v": (("x",), (2,), "float32")}, {"x": ("x", [0, 1, 2])}, "coordinate 'x': 3 values for dim 'x' of size 2"),
])
def test_a_spec_that_cannot_be_recorded_is_refused_before_anything_is_made(tmp_path, variables, coords, message):
    path = tmp_path / "s.zarr"
    with pytest.raises(StoreError, match=f"^{message}"):
        store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={})
    assert not path.exists()


@pytest.mark.parametrize("change, message", [
    (lambda v, c: v.update(gate=(v["gate"][0], v["gate"][1], "float64")), "stored 'gate' is"),
    # same shape, another dim: the stored gate is (snapshot, layer, head)
    (lambda v, c: v.update(gate=(("snapshot", "layer", "unit"), v["gate"][1], "float32")), "stored 'gate' is"),
    (lambda v, c: c.update(step=("snapshot", np.array([0, 5, 11]))), "stored coordinate 'step' differs"),
])
def test_a_resume_that_does_not_match_what_is_stored_is_refused(tmp_path, change, message):
    # Resumed with another dtype, other dim names or other steps, the run would hold two runs'
    # data under one id, read back as one.
    path = tmp_path / "s.zarr"
    writer(path, attrs={"status": "interrupted"})
    v, c = spec()
    change(v, c)
    with pytest.raises(StoreError, match=message):
        store.RunWriter(path, "r1", variables=v, coords=c, attrs={"status": "running"}, resume=True)
    assert store.run_attrs(path, "r1")["status"] == "interrupted"


def test_a_coordinate_no_variable_carries_is_still_a_coordinate(tmp_path):
    # A variable names the non-index coordinates of its dims; one on a dim no variable has must
    # declare itself, or plain xarray reads it as a data variable.
    path = tmp_path / "s.zarr"
    store.RunWriter(path, "r1", variables={"loss": (("train_step",), (4,), "float32")},
                    coords={"step": ("snapshot", np.array([0, 5, 10]))}, attrs={})
    ds = xr.open_zarr(path, group="runs/r1")
    assert "step" in ds.coords and "step" not in ds.data_vars and list(ds.step.values) == [0, 5, 10]


def test_writes_outside_a_variable_are_refused_and_leave_it_as_it_was(tmp_path):
    # A negative index is Python's "from the end": snapshot -1 would overwrite the last snapshot,
    # a region at -1 the last train step.
    path = tmp_path / "s.zarr"
    w = writer(path)
    with pytest.raises(StoreError, match=rf"snapshot -1 out of range 0..{N_SNAP - 1}"):
        w.write_snapshot(-1, snapshot(np.random.default_rng(0)))
    with pytest.raises(StoreError, match=r"'loss' region \[-1:0\] outside 0..10"):
        w.write_region("loss", -1, np.ones(1, np.float32))
    with pytest.raises(StoreError, match=r"'probe_tokens' region has shape \(1, 3\), variable is \(2, 7\)"):
        w.write_region("probe_tokens", 0, np.ones((1, 3), np.int64))
    with pytest.raises(StoreError, match=r"variable 'loss' \('train_step',\) has no 'snapshot' dim"):
        w.write_snapshot(0, {"loss": np.ones(10, np.float32)})
    ds = store.open_run(path)
    assert np.isnan(ds.gate.values).all() and np.isnan(ds.loss.values).all()
    assert (ds.probe_tokens.values == 0).all() and ds.gate.shape == (N_SNAP, L, 4)


def test_an_unknown_codec_is_named_with_the_codecs_there_are(tmp_path):
    with pytest.raises(StoreError, match=r"^unknown codec 'zstd-2'; one of: none, zstd-1, zstd-3, "):
        writer(tmp_path / "s.zarr", codec="zstd-2")
    assert not (tmp_path / "s.zarr").exists()


def test_every_array_the_store_writes_ends_in_a_checksum_and_a_changed_byte_fails_its_read(tmp_path):
    # Without one, a flipped bit in a zstd chunk decoded to a wrong number without a word
    import json

    from tests.test_store import write_run

    path = tmp_path / "s.zarr"
    write_run(path, "r1")
    ds = xr.Dataset({"x": (("a",), np.arange(3.0)), "name": (("a",), np.array(["p", "q", "r"]))},
                    coords={"a": [1, 2, 3], "label": ("a", np.array(["u", "v", "w"]))})
    store.write_analysis(path, "r1", ds)
    store.write_derived(path, "d", ds)
    metas = [json.loads(m.read_text()) for m in path.rglob("zarr.json")]
    codecs = [[c["name"] for c in m["codecs"]] for m in metas if m["node_type"] == "array"]
    # the runs' arrays (variables and coordinates, numbers and strings), the analysis's and the derived
    assert len(codecs) == 12 + 4 + 4
    assert all(c[-2:] == ["zstd", "crc32c"] for c in codecs), codecs
    chunk = path / "runs" / "r1" / "gate" / "c" / "1" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        store.open_run(path, "r1")["gate"].load()


def test_run_writer_refuses_existing_run_unless_resume(tmp_path):
    path = tmp_path / "s.zarr"
    variables, coords = spec()
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running", "starts": 1})
    first = snapshot(np.random.default_rng(1))
    w.write_snapshot(0, first)
    w.write_region("loss", 0, np.arange(4, dtype=np.float32))
    with pytest.raises(StoreError, match="already exists"):
        store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={})

    w2 = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"starts": 2}, resume=True)
    w2.write_snapshot(1, snapshot(np.random.default_rng(2)))
    w2.write_region("loss", 4, np.arange(4, 8, dtype=np.float32))
    ds = store.open_run(path)
    np.testing.assert_array_equal(ds.attention.isel(snapshot=0).values, first["attention"])
    assert not np.isnan(ds.gate.isel(snapshot=1).values).any()
    np.testing.assert_array_equal(ds.loss.values[:8], np.arange(8))
    assert store.run_attrs(path, "r1") == {"status": "running", "starts": 2, "empty_chunks_written": True}

    other_variables, other_coords = spec(n_heads=8)
    with pytest.raises(StoreError, match="attention"):
        store.RunWriter(path, "r1", variables=other_variables, coords=other_coords, attrs={}, resume=True)


def test_a_refused_resume_leaves_the_run_attrs_as_they_were(tmp_path):
    path = tmp_path / "s.zarr"
    variables, coords = spec()
    store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "interrupted", "starts": 1})
    other_variables, other_coords = spec(n_heads=8)
    with pytest.raises(StoreError, match="stored 'attention'"):
        store.RunWriter(path, "r1", variables=other_variables, coords=other_coords,
                        attrs={"status": "running", "starts": 2}, resume=True)
    assert store.run_attrs(path, "r1") == {"status": "interrupted", "starts": 1, "empty_chunks_written": True}


class Died(Exception):
    """Stands for the process being killed: nothing after it runs."""


def test_a_run_whose_creation_was_cut_short_resumes(tmp_path, monkeypatch):
    # The group and its arrays exist, but the coordinates' values never landed (SIGKILL between
    # the two): a resume writes them instead of refusing the run for ever.
    import zarr.core.array

    path = tmp_path / "s.zarr"
    variables, coords = spec()

    async def killed(self, *args, **kwargs):
        raise Died

    with monkeypatch.context() as m:
        m.setattr(zarr.core.array.AsyncArray, "setitem", killed)
        with pytest.raises(Died):
            store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running"})
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"starts": 2}, resume=True)
    w.write_snapshot(0, snapshot(np.random.default_rng(0)))
    ds = xr.open_zarr(path, group="runs/r1")
    assert list(ds.step.values) == [0, 5, 10] and [str(v) for v in ds.weight.values] == ["q", "k", "v", "o"]
    assert list(ds.component.values) == ["induction", "markov"]
    assert ds.attrs == {"status": "running", "starts": 2, "empty_chunks_written": True}


def test_write_region_and_write_snapshot_check_their_input(tmp_path):
    path = tmp_path / "s.zarr"
    variables, coords = spec(steps=5000)  # spans two 4096-step chunks
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={})
    w.write_region("loss", 4090, np.arange(10, dtype=np.float32))
    loss = store.open_run(path).loss
    assert loss.encoding["chunks"] == (4096,)
    np.testing.assert_array_equal(loss.values[4090:4100], np.arange(10))
    assert np.isnan(loss.values[:4090]).all() and np.isnan(loss.values[4100:]).all()
    with pytest.raises(StoreError, match="outside"):
        w.write_region("loss", 4999, np.zeros(2, np.float32))
    with pytest.raises(StoreError, match="out of range"):
        w.write_snapshot(N_SNAP, {"gate": np.zeros((L, 4))})
    with pytest.raises(StoreError, match="expected"):
        w.write_snapshot(0, {"gate": np.zeros((L, 3))})
    with pytest.raises(StoreError, match="no variable 'nope'"):
        w.write_snapshot(0, {"nope": np.zeros(1)})
    with pytest.raises(StoreError, match="JSON"):
        w.set_attrs(bad=object())
