"""The store as a whole: plain xarray reads what RunWriter writes, and every part the store writes is
readable as the umask says. `spec`, `snapshot` and `write_run` make the runs tests/test_store_*.py use."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynamics import store

pytestmark = pytest.mark.filterwarnings("error")

N_SNAP, L, P, T = 3, 2, 2, 6


def spec(n_heads: int = 4, n_snap: int = N_SNAP, steps: int = 10):
    variables = {
        "attention": (("snapshot", "layer", "head", "probe", "query", "key"), (n_snap, L, n_heads, P, T, T), "float16"),
        "grad_norm": (("snapshot", "layer", "head", "weight"), (n_snap, L, n_heads, 4), "float32"),
        "gate": (("snapshot", "layer", "head"), (n_snap, L, n_heads), "float32"),
        "eval_loss": (("snapshot", "component"), (n_snap, 2), "float32"),
        "probe_tokens": (("probe", "position"), (P, T + 1), "int64"),
        "loss": (("train_step",), (steps,), "float32"),
    }
    coords = {
        "step": ("snapshot", np.arange(n_snap) * 5),
        "layer": ("layer", np.arange(L)),
        "head": ("head", np.arange(n_heads)),
        "weight": ("weight", np.array(["q", "k", "v", "o"])),
        "component": ("component", np.array(["induction", "markov"])),
        "train_step": ("train_step", np.arange(steps)),
    }
    return variables, coords


def snapshot(rng, n_heads: int = 4, fill: float | None = None) -> dict:
    gate = np.full((L, n_heads), fill, np.float32) if fill is not None else rng.random((L, n_heads), np.float32)
    return {
        "attention": rng.random((L, n_heads, P, T, T)).astype(np.float16),
        "grad_norm": rng.random((L, n_heads, 4), np.float32),
        "gate": gate,
        "eval_loss": rng.random(2, np.float32),
    }


def write_run(path, run_id, *, n_heads=4, n_snap=N_SNAP, fill=None, attrs=None, seed=0):
    rng = np.random.default_rng(seed)
    variables, coords = spec(n_heads, n_snap)
    w = store.RunWriter(path, run_id, variables=variables, coords=coords, attrs=attrs or {"status": "completed"})
    snaps = [snapshot(rng, n_heads, fill) for _ in range(n_snap)]
    for i, s in enumerate(snaps):
        w.write_snapshot(i, s)
    w.finalize()
    return snaps


def test_plain_open_zarr_round_trip(tmp_path):
    path = tmp_path / "s.zarr"
    store.init_store(path)
    rng = np.random.default_rng(0)
    variables, coords = spec()
    w = store.RunWriter(path, "r1", variables=variables, coords=coords, attrs={"status": "running", "config": {"a": 1}})
    snaps = [snapshot(rng) for _ in range(2)]  # snapshot 2 never written
    for i, s in enumerate(snaps):
        w.write_snapshot(i, s)
    w.write_region("probe_tokens", 0, np.arange(P * (T + 1)).reshape(P, T + 1))
    w.set_attrs(status="completed", last_loss=np.float32(0.5), shape=(1, 2))
    w.finalize()

    ds = xr.open_zarr(path, group="runs/r1")  # no package, no warnings (module filter: error)
    assert ds.attention.dims == ("snapshot", "layer", "head", "probe", "query", "key")
    assert ds.attention.dtype == np.float16
    assert "step" in ds.coords and ds.step.dims == ("snapshot",)
    assert list(ds.step.values) == [0, 5, 10]
    assert [str(v) for v in ds.weight.values] == ["q", "k", "v", "o"]
    assert [str(v) for v in ds.component.values] == ["induction", "markov"]
    assert float(ds.grad_norm.sel(weight="k").isel(snapshot=0, layer=1, head=2)) == snaps[0]["grad_norm"][1, 2, 1]
    np.testing.assert_array_equal(ds.attention.values[:2], np.stack([s["attention"] for s in snaps]))
    assert np.isnan(ds.attention.values[2]).all() and np.isnan(ds.loss.values).all()
    assert ds.probe_tokens.dtype == np.int64 and ds.probe_tokens.values[1, 0] == T + 1
    assert ds.attrs == {"status": "completed", "config": {"a": 1}, "last_loss": 0.5, "shape": [1, 2],
                        "empty_chunks_written": True}
    assert ds.attention.encoding["chunks"] == (1, L, 4, P, T, T)
    assert xr.open_zarr(path).attrs["dynamics_store"] == store.STORE_VERSION


def test_what_the_store_writes_is_readable_as_the_umask_says(tmp_path):
    # mkdtemp (0700) and mkstemp (0600) made every analysis, derived group and checkpoint readable by
    # its writer alone: a colleague with read access to the store got PermissionError from predict,
    # gates and report. Known answer: umask 022 gives 0755 folders and 0644 files, as zarr's own.
    import os
    import stat

    old = os.umask(0o022)
    try:
        path = tmp_path / "s.zarr"
        write_run(path, "r1")
        store.write_analysis(path, "r1", xr.Dataset({"score": ("head", [1.0, 2.0])}))
        store.write_derived(path, "curves", xr.Dataset({"auc": ("fold", [0.7])}))
        store.write_checkpoint(path, "r1", b"weights")
    finally:
        os.umask(old)
    for p in (path / "analysis" / "r1", path / "derived" / "curves", path / "runs" / "r1"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o755, p
    for p in (path / "analysis" / "r1" / "zarr.json", path / "checkpoints" / "r1" / "ckpt.pt"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_an_interrupt_as_zarrs_event_loop_is_made_waits_until_it_is_whole(tmp_path):
    # A SIGTERM inside asyncio's loop constructor, as `dynamics analyse` opened its first run, left
    # a half-made loop whose __del__ printed "Exception ignored ... '_debug'" and a traceback
    # under the "interrupted" line. The interrupt lands here at the constructor's set_debug call.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import asyncio.base_events, signal
        set_debug = asyncio.base_events.BaseEventLoop.set_debug
        def interrupted(self, enabled):
            signal.raise_signal(signal.SIGINT)  # a Ctrl-C at this very instant
            set_debug(self, enabled)
        asyncio.base_events.BaseEventLoop.set_debug = interrupted
        from dynamics import store
        try:
            store.init_store({str(tmp_path / "s.zarr")!r})  # its first zarr write makes the loop
            print("no interrupt")
        except KeyboardInterrupt:
            from zarr.core.sync import loop
            print("interrupted; loop whole:", loop[0] is not None and loop[0].get_debug() is not None)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "interrupted; loop whole: True"
    assert proc.stderr == ""
