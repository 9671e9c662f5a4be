"""bench/role_agreement.py: the calibration check of a head's label agreement over resampled probes."""

import numpy as np
import xarray as xr

from bench import role_agreement as bench_role_agreement

DIMS = ("layer", "head", "probe", "query", "key")


def _heads(kinds):
    # one layer, 2 heads, T = 12: head 0 previous-token on probes of kind 0 and self on kind 1;
    # head 1 previous-token on every probe
    prev, own = np.eye(12, k=-1), np.eye(12)
    prev[0, 0] = 1.0
    attn = np.stack([np.stack([prev if k == 0 else own for k in kinds]), np.stack([prev] * len(kinds))])[None]
    tokens = xr.DataArray(np.tile(np.arange(12), (len(kinds), 1)), dims=("probe", "position"))
    return xr.DataArray(attn, dims=DIMS), tokens


def test_a_head_alike_on_every_probe_agrees_everywhere_and_keeps_its_label():
    attn, tokens = _heads([0] * 6)
    got = bench_role_agreement.calibration(attn, tokens, probes=3, draws=4, seed=0)
    assert got["agreement"].tolist() == [1.0] * 8 and got["same"].all()


def test_a_sample_of_one_kind_of_probe_agrees_fully_and_misses_the_other_kind():
    # 2 probes of each kind, samples of 2: an A of one kind gives head 0 that kind's label on
    # every resample (agreement 1) and B, the other kind, the other label; a mixed A reads self
    # (its margin, 13/24 against 1/2), as a mixed B does, and its resamples of one kind disagree
    attn, tokens = _heads([0, 0, 1, 1])
    got = bench_role_agreement.calibration(attn, tokens, probes=2, draws=30, seed=7)
    rng = np.random.default_rng(7)
    mixed = np.array([len({int(p) < 2 for p in rng.permutation(4)[:2]}) == 2 for _ in range(30)])
    assert 0 < mixed.sum() < 30
    head0 = slice(0, None, 2)
    assert np.array_equal(got["same"][head0], mixed)
    assert (got["agreement"][head0][~mixed] == 1.0).all() and (got["agreement"][head0][mixed] < 1.0).all()
    assert got["same"][1::2].all() and (got["agreement"][1::2] == 1.0).all()


def test_it_runs_on_a_store_and_says_how_often_b_kept_the_label(tiny_probe_store, capsys):
    assert bench_role_agreement.main([tiny_probe_store, "--probes", "2", "--draws", "3"]) == 0
    out = capsys.readouterr().out
    assert "1 runs; samples of 2 probes, 3 disjoint pairs a run, 200 resamples of each A" in out
    assert "(head, draw) pairs by their agreement on A:" in out and "named (under 90%)" in out
    assert "not named (90% or more)" in out


def test_too_few_probes_are_refused_in_one_line_before_any_work(tiny_probe_store, capsys):
    assert bench_role_agreement.main([tiny_probe_store, "--probes", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recorded 4 probes, fewer than 2 x --probes 3" in err[0]
