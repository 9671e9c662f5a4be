"""dynamics.analysis.probe_resample, and js_distance's per-probe divergences it reads: known answers."""

import numpy as np
import pytest
import xarray as xr

from dynamics.analysis.bifurcation import bifurcation_step
from dynamics.analysis.divergence import js_distance, mean_within_layer_divergence, same_layer_block
from dynamics.analysis.probe_resample import N_RESAMPLES, probe_range, probe_weights, resampled_bifurcation

ATTN = ("snapshot", "layer", "head", "probe", "query", "key")
WITHIN = ("snapshot", "layer", "head", "head_b", "probe")


def _random_attention(shape, seed=0):
    a = np.tril(np.random.default_rng(seed).random(shape))
    return xr.DataArray(a / a.sum(-1, keepdims=True), dims=ATTN)


def test_by_probe_keeps_the_distances_bits_and_its_mean_is_their_square():
    attn = _random_attention((5, 2, 3, 4, 8, 8))
    alone = js_distance(attn)
    dist, js = js_distance(attn, by_probe=True)
    assert np.array_equal(alone.values, dist.values)
    assert js.dims == ("snapshot", "layer", "head", "layer_b", "head_b", "probe")
    np.testing.assert_allclose(js.mean("probe"), dist ** 2, rtol=1e-12, atol=1e-15)
    lazy_dist, lazy_js = js_distance(attn.chunk({"snapshot": 2}), by_probe=True)
    assert np.array_equal(lazy_dist.values, dist.values) and np.array_equal(lazy_js.values, js.values)


def test_per_probe_divergence_of_disjoint_one_hot_rows_is_ln2_on_each_query_that_sees_two_keys():
    # head 0 attends to key 0, head 1 to the query itself: on probe 0 every query past the first
    # puts them on disjoint keys (JS ln 2 unsmoothed); probe 1 has both heads on key 0 throughout
    T = 4
    first, own = np.zeros((T, T)), np.eye(T)
    first[:, 0] = 1.0
    a = np.stack([np.stack([first, first]), np.stack([own, first])])[None, None]  # (1, 1, H=2, P=2, T, T)
    _, js = js_distance(xr.DataArray(a, dims=ATTN), eps=0.0, by_probe=True)
    pair = js.isel(snapshot=0, layer=0, layer_b=0, head=0, head_b=1).values
    np.testing.assert_allclose(pair, [np.log(2) * (T - 1) / T, 0.0], rtol=1e-12)
    assert js.isel(snapshot=0, layer=0, layer_b=0, head=1, head_b=0).values.tolist() == pair.tolist()  # symmetric
    assert (js.isel(snapshot=0, layer=0, layer_b=0).values[[0, 1], [0, 1]] == 0).all()  # each head against itself


def test_a_nan_row_makes_only_its_probe_nan_where_the_distance_loses_the_head():
    attn = _random_attention((1, 1, 3, 2, 4, 4))
    values = attn.values.copy()
    values[0, 0, 1, 1, 2] = np.nan  # head 1, probe 1, query 2
    dist, js = js_distance(attn.copy(data=values), by_probe=True)
    at = js.isel(snapshot=0, layer=0, layer_b=0)
    assert np.isnan(at.isel(head=1, head_b=0, probe=1)) and np.isfinite(at.isel(head=1, head_b=0, probe=0))
    assert np.isfinite(at.isel(head=0, head_b=2)).all()
    assert np.isnan(dist.isel(snapshot=0, layer=0, layer_b=0, head=1)).all()


def test_by_probe_is_refused_for_the_aligned_distance():
    attn = _random_attention((1, 1, 1, 1, 3, 3)).isel(layer=0, head=0)
    with pytest.raises(ValueError, match="by_probe is for the head-by-head matrix"):
        js_distance(attn, attn, by_probe=True)


def test_probe_weights_are_multinomial_shares_drawn_the_same_every_time():
    w = probe_weights(8, 500)
    assert w.dims == ("resample", "probe") and w.shape == (500, 8)
    np.testing.assert_allclose(w.sum("probe"), 1.0)
    assert np.array_equal(w.values * 8, np.round(w.values * 8))  # whole draws of 8
    assert np.array_equal(probe_weights(8, 500).values, w.values)
    assert not np.array_equal(probe_weights(8, 500, seed=1).values, w.values)
    # each probe is drawn 1/8 of the time: 4,000 draws, sd of a share 0.0052
    np.testing.assert_allclose(w.mean("resample"), 1 / 8, atol=0.02)
    with pytest.raises(ValueError, match="must be >= 1"):
        probe_weights(0)


def _within(js_per_probe, steps):
    # (snapshot, probe) JS of one pair of heads, as a 1-layer 2-head within-layer array
    js = np.asarray(js_per_probe, dtype=float)
    out = np.zeros((js.shape[0], 1, 2, 2, js.shape[1]))
    out[:, 0, 0, 1] = out[:, 0, 1, 0] = js
    return xr.DataArray(out, dims=WITHIN, coords={"step": ("snapshot", steps)})


STEPS = [0, 1, 2, 4, 8, 16]


def test_probes_that_agree_give_every_resample_the_recorded_step():
    js = _within([[0.01] * 3] * 3 + [[0.2] * 3] * 3, STEPS)
    got = resampled_bifurcation(js)
    recorded = bifurcation_step(mean_within_layer_divergence(np.sqrt(js.mean("probe"))))
    assert float(recorded) == 4.0
    assert got.dims == ("resample",) and got.sizes["resample"] == N_RESAMPLES
    assert (got.values == 4.0).all()
    assert probe_range(got).values.tolist() == [4.0, 4.0]


def test_a_resample_without_the_splitting_probe_never_splits():
    # probe 0 splits at step 4, probe 1 never: a resample splits exactly where it drew probe 0
    js = _within([[0.01, 0.01]] * 3 + [[0.3, 0.01]] * 3, STEPS)
    got = resampled_bifurcation(js, n_resamples=400).values
    drew = probe_weights(2, 400).values[:, 0] > 0
    assert np.array_equal(np.isnan(got), ~drew)
    assert (got[drew] == 4.0).all()
    assert 0.15 < (~drew).mean() < 0.35  # both draws miss probe 0 a quarter of the time
    assert probe_range(xr.DataArray(got, dims="resample")).values[0] == 4.0
    assert np.isnan(probe_range(xr.DataArray(got, dims="resample")).values[1])  # "never" in the top 5%


def test_blocks_chunks_full_matrices_and_a_sweeps_runs_give_the_same_steps():
    attn = _random_attention((6, 2, 3, 4, 6, 6), seed=3)
    attn = attn.assign_coords(step=("snapshot", STEPS))
    _, js = js_distance(attn, by_probe=True)
    whole = resampled_bifurcation(js)
    assert np.array_equal(resampled_bifurcation(same_layer_block(js)).values, whole.values, equal_nan=True)
    assert np.array_equal(resampled_bifurcation(js, block_bytes=1).values, whole.values, equal_nan=True)
    assert np.array_equal(resampled_bifurcation(js.chunk({"snapshot": 2})).compute().values, whole.values,
                          equal_nan=True)
    # a sweep: the second run is the first with its last snapshot padded away (NaN step and values)
    other = js.where(xr.DataArray(np.arange(6) < 5, dims="snapshot"))
    sweep = xr.concat([js, other], "run").assign_coords(
        step=(("run", "snapshot"), np.array([STEPS, STEPS[:5] + [np.nan]], dtype=float)))
    both = resampled_bifurcation(sweep)
    assert np.array_equal(both.isel(run=0).values, whole.values, equal_nan=True)
    alone = resampled_bifurcation(other.isel(snapshot=slice(0, 5)))
    assert np.array_equal(both.isel(run=1).values, alone.values, equal_nan=True)


def test_probe_range_takes_the_inverse_of_the_empirical_distribution():
    steps = xr.DataArray(np.arange(1.0, 201.0), dims="resample")
    assert probe_range(steps).values.tolist() == [10.0, 190.0]  # the 10th and 190th of 200
    assert probe_range(steps, (0.0, 1.0)).values.tolist() == [1.0, 200.0]
    mixed = xr.DataArray([16.0] * 10 + [32.0] * 80 + [np.nan] * 10, dims="resample")
    assert np.array_equal(probe_range(mixed).values, [16.0, np.nan], equal_nan=True)
    assert np.isnan(probe_range(xr.DataArray([np.nan] * 5, dims="resample")).values).all()
    assert probe_range(steps).coords["bound"].values.tolist() == ["low", "high"]
    with pytest.raises(ValueError, match="give a low and a high quantile"):
        probe_range(steps, (0.9, 0.1))


# ----------------------------------------------------------------------------- in analyse_run


def _uniform(t):
    a = np.tril(np.ones((t, t)))
    return a / a.sum(-1, keepdims=True)


def _previous(t):
    a = np.eye(t, k=-1)
    a[0, 0] = 1.0
    return a


def _run(frames, steps):
    """One run as open_run gives it, from frames (snapshot, layer, head, probe, T, T)."""
    attn = np.asarray(frames, dtype=np.float64)
    s, n_layer, n_head, n_probe, t, _ = attn.shape
    return xr.Dataset({"attention": (ATTN, attn.astype(np.float16)),
                       "probe_tokens": (("probe", "position"), np.tile(np.arange(t), (n_probe, 1))),
                       "importance": (("snapshot", "layer", "head"), np.ones((s, n_layer, n_head)))},
                      coords={"step": ("snapshot", np.asarray(steps))})


def test_analyse_run_dates_the_split_again_on_resampled_probes():
    # 1 layer x 2 heads, T = 8, 2 probes: on probe 0 head 0 turns previous-token at step 23, on
    # probe 1 both stay uniform. Every resample that draws probe 0 splits at 23; one drawing
    # probe 1 twice (a quarter of them) never does, so the 95% bound is "never".
    from dynamics.analysis.pipeline import analyse_run, summary_row

    u, prev = _uniform(8), _previous(8)
    frames = np.array([[[u, u], [u, u]]] * 3 + [[[prev, u], [u, u]]] * 2)[:, None]  # (snapshot, layer, head, probe, Q, K)
    result = analyse_run(_run(frames, [0, 7, 19, 23, 31]))
    drew = probe_weights(2).values[:, 0] > 0
    assert np.array_equal(result["bifurcation_resampled"].values, np.where(drew, 23.0, np.nan), equal_nan=True)
    row = summary_row(result)
    assert row["bifurcation_step"] == 23 and row["bifurcation_probe_range"] == [23, None]
    assert result.attrs["probe_resamples"] == 200 and result.attrs["probe_resample_seed"] == 0
    # one probe: nothing to resample, nothing stored, nothing said
    one = analyse_run(_run(frames[:, :, :, :1], [0, 7, 19, 23, 31]))
    assert "bifurcation_resampled" not in one and one.attrs["probe_resamples"] == 0
    assert summary_row(one)["bifurcation_probe_range"] is None and summary_row(one)["bifurcation_step"] == 23


def test_a_model_of_one_head_a_layer_has_no_range_as_it_has_no_step():
    # no pair of heads: the step is "undefined", and its resamples all NaN must not read
    # "never-never" beside it
    from dynamics.analysis.pipeline import analyse_run, summary_row

    u, prev = _uniform(8), _previous(8)
    frames = np.array([[[u, u]]] * 3 + [[[prev, u]]] * 2)[:, None]  # 1 head, 2 probes
    result = analyse_run(_run(frames, [0, 7, 19, 23, 31]))
    assert np.isnan(result["bifurcation_resampled"].values).all()
    row = summary_row(result)
    assert row["bifurcation_step"] == "undefined" and row["bifurcation_probe_range"] is None


def test_the_resampled_step_takes_the_options_baseline():
    # every probe the same sequence and pattern, so every resample is the recorded curve: its
    # steps must be the recorded step under each baseline, which these patterns date apart (a
    # resample dated on the default baseline whatever the options would not be)
    from dynamics.analysis.pipeline import AnalysisOptions, analyse_run

    attn = _random_attention((8, 1, 3, 1, 6, 6), seed=1).values  # baselines 2 and 3 date it 16, 4 dates it 4
    attn[5:, 0, 0] = _previous(6)  # head 0 turns previous-token late
    ds = _run(np.repeat(attn, 3, axis=3), [0, 1, 2, 4, 8, 16, 32, 64])
    recorded = {}
    for n in (2, 3, 4):
        out = analyse_run(ds, AnalysisOptions(baseline_snapshots=n))
        recorded[n] = out["bifurcation_step"].item()
        assert np.array_equal(out["bifurcation_resampled"].values, np.full(200, recorded[n]), equal_nan=True), n
    assert len(set(np.nan_to_num(list(recorded.values()), nan=-1))) > 1, recorded


def test_weighted_probe_mean_counts_each_probe_by_its_weight_and_its_queries():
    from dynamics.analysis.probe_resample import weighted_probe_mean

    w = xr.DataArray([[0.5, 0.5], [1.0, 0.0], [0.0, 2.0]], dims=("resample", "probe"))
    assert weighted_probe_mean(xr.DataArray([1.0, 3.0], dims="probe"), w).values.tolist() == [2.0, 1.0, 3.0]
    # per-probe sums over 1 and 3 queries: (2 + 6) / (1 + 3) pooled
    sums, count = xr.DataArray([2.0, 6.0], dims="probe"), xr.DataArray([1, 3], dims="probe")
    assert weighted_probe_mean(sums, w, count=count).values.tolist() == [2.0, 2.0, 2.0]
    # a NaN stays NaN whatever its weight; a weighted count of 0 is NaN, not 0
    nan = weighted_probe_mean(xr.DataArray([1.0, np.nan], dims="probe"), w).values
    assert np.isnan(nan).all()
    none = weighted_probe_mean(sums, w, count=xr.DataArray([0, 3], dims="probe")).values
    assert np.isnan(none[1]) and none[2] == 2.0


def test_label_agreement_is_the_share_of_resamples_giving_the_label():
    from dynamics.analysis.probe_resample import label_agreement

    again = xr.DataArray([[3, 4, 0], [3, 4, 0], [3, 3, 0], [2, 4, 0]], dims=("resample", "head"), name="x")
    out = label_agreement(xr.DataArray([3.0, 4.0, np.nan], dims="head"), again.astype(float))
    np.testing.assert_array_equal(out.values, [0.75, 0.75, np.nan])
    with pytest.raises(ValueError, match="resample"):
        label_agreement(again.isel(resample=0), again.isel(resample=0))


def test_analyse_run_labels_each_head_again_on_the_resampled_probes():
    # head 0 is previous-token on probe 0 and self on probe 1; head 1 is a sink on both. Both
    # probes: self by its margin (13/24 against 1/2); a resample without probe 1 (a quarter of
    # them) reads previous_token; the sink holds everywhere (T = 12: at T <= 9 uniform attention is one)
    from dynamics.analysis.pipeline import analyse_run, summary_row
    from dynamics.analysis.roles import ROLES
    from dynamics.tables import role_notes

    prev, own, sink = _previous(12), np.eye(12), np.zeros((12, 12))
    sink[:, 0] = 1.0
    frames = np.array([[[prev, own], [sink, sink]]] * 5)[:, None]  # (snapshot, layer, head, probe, Q, K)
    result = analyse_run(_run(frames, [0, 7, 19, 23, 31]))
    again = result["role_resampled"]
    assert again.dims == ("resample", "layer", "head") and again.dtype == np.int8
    drew_self = probe_weights(2).values[:, 1] > 0
    expected = np.where(drew_self, ROLES.index("self"), ROLES.index("previous_token"))
    np.testing.assert_array_equal(again.isel(layer=0, head=0), expected)
    assert (again.isel(layer=0, head=1) == ROLES.index("sink")).all()
    lazy = analyse_run(_run(frames, [0, 7, 19, 23, 31]).chunk({"snapshot": 2}))
    np.testing.assert_array_equal(lazy["role_resampled"].values, again.values)
    row = summary_row(result)
    assert row["probe_sensitive_roles"] == [{"layer": 0, "head": 0, "role": "self", "agreement": drew_self.mean(),
                                             "other": "previous_token"}]
    assert 0.6 < drew_self.mean() < 0.9  # about 3/4 of 200 draws: the head is named
    note = role_notes([{"run": "r1"} | row])[-1]
    assert note.startswith("probe-sensitive roles: 1 head(s) get their final label on fewer than 90% of 200 bootstrap")
    assert note.endswith(f"r1 L0H0 self {drew_self.mean():.1%} (else previous_token)")
    # one probe: none stored, none named
    one = analyse_run(_run(frames[:, :, :, :1], [0, 7, 19, 23, 31]))
    assert "role_resampled" not in one and summary_row(one)["probe_sensitive_roles"] is None
