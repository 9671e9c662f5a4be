"""bench/probe_range.py: the calibration check of the bifurcation step's probe range."""

import tomllib

import numpy as np
import pytest
import xarray as xr

from bench import probe_range as bench_probe_range
from tests.conftest import TINY

STEPS = [0, 1, 2, 4, 8, 16]


def _population(js_per_probe):
    # (snapshot, probe) JS of one pair of heads, as a 1-layer 2-head within-layer array
    js = np.asarray(js_per_probe, dtype=float)
    out = np.zeros((js.shape[0], 1, 2, 2, js.shape[1]))
    out[:, 0, 0, 1] = out[:, 0, 1, 0] = js
    return xr.DataArray(out, dims=("snapshot", "layer", "head", "head_b", "probe"),
                        coords={"step": ("snapshot", STEPS)})


def test_probes_that_agree_are_always_covered():
    got = bench_probe_range.coverage(_population([[0.01] * 6] * 3 + [[0.3] * 6] * 3), probes=3, draws=5, seed=0)
    assert got["inside"] == 5 and got["steps"] == [4.0] * 5 and got["all"] == 4.0


def test_a_sample_of_one_kind_of_probe_misses_the_other_kind():
    # probes 0 and 1 split at step 4, 2 and 3 never; samples of 2, so B is the two A left.
    # A of both kinds: its resamples split or not, the range 4..never holds B's step whatever it
    # is. A of one kind: every resample agrees, and B, the other kind, falls outside.
    js = _population([[0.01] * 4] * 3 + [[0.3, 0.3, 0.01, 0.01]] * 3)
    got = bench_probe_range.coverage(js, probes=2, draws=30, seed=7)
    rng = np.random.default_rng(7)
    mixed = sum(len({int(p) < 2 for p in rng.permutation(4)[:2]}) == 2 for _ in range(30))
    assert 0 < mixed < 30 and got["inside"] == mixed
    assert sorted(set(np.nan_to_num(got["steps"], nan=-1.0))) == [-1.0, 4.0]


def test_it_runs_on_a_store_and_says_how_often_the_range_covered(tiny_probe_store, capsys):
    assert bench_probe_range.main([tiny_probe_store, "--probes", "2", "--draws", "3"]) == 0
    out = capsys.readouterr().out
    assert "1 runs; samples of 2 probes, 3 disjoint pairs a run" in out
    assert "on all 4 probes " in out and "B inside A's range " in out
    assert "overall: B's step inside A's 5%-95% probe range in " in out and "/3 (" in out


@pytest.mark.parametrize("argv, needle", [
    (["--probes", "3"], "recorded 4 probes, fewer than 2 x --probes 3"),
    (["--probes", "1"], "--probes: must be at least 2"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_probe_store, argv, needle, capsys):
    try:
        code = bench_probe_range.main([tiny_probe_store, *argv])
    except SystemExit as e:  # the parser's own refusals
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_a_store_that_is_not_one_is_refused(tmp_path, capsys):
    assert bench_probe_range.main([str(tmp_path / "none.zarr")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _train(path, steps=40, **model):
    from dynamics.config import from_dict
    from dynamics.train import train_run

    raw = tomllib.loads(TINY.format(steps=steps, every=10))
    raw["model"].update(model)
    train_run(from_dict(raw), str(path))


def test_a_run_too_short_for_the_band_is_refused_before_any_work(tmp_path, capsys):
    _train(tmp_path / "s.zarr", steps=2)  # snapshots at steps 0, 1, 2: the band's 3 and nothing after
    assert bench_probe_range.main([str(tmp_path / "s.zarr"), "--probes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "recorded 3 snapshots; a bifurcation step needs more than the band's 3" in err


def test_runs_of_one_head_a_layer_are_left_out_not_counted_as_covered(tmp_path, capsys):
    # their step is undefined, and "never" matched "never": 3 of 3 covered, inflating the figure
    path = tmp_path / "s.zarr"
    _train(path, n_heads=1)
    assert bench_probe_range.main([str(path), "--probes", "2", "--draws", "3"]) == 2
    assert "has a layer of two heads: its bifurcation step is undefined" in capsys.readouterr().err
    _train(path)  # a second run, of two heads a layer, in the same store
    assert bench_probe_range.main([str(path), "--probes", "2", "--draws", "3"]) == 0
    out = capsys.readouterr().out
    assert "one head a layer, its bifurcation undefined: left out" in out
    assert "overall: B's step inside A's 5%-95% probe range in " in out and "/3 (" in out  # the other run's 3 draws only


def test_a_run_not_completed_is_refused_before_any_work(tmp_path, capsys):
    # its snapshots past where it stopped are unwritten (NaN), which would read as a split or not
    import json

    from dynamics import store

    path = tmp_path / "s.zarr"
    _train(path)
    (rid,) = store.list_runs(str(path))
    meta = path / "runs" / rid / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["status"] = "running"
    meta.write_text(json.dumps(doc))
    assert bench_probe_range.main([str(path), "--probes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"run {rid} is stopped: only completed runs are compared" in err  # no process holds it
