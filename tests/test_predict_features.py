"""`dynamics.predict.features`: runs cut at the horizon, and features that never read past it."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynamics import predict
from dynamics.predict import PredictError, PredictOptions, Run
from tests.test_predict import FAST, H_STEP, H, L, make_run, make_runs, scramble_after

# ----------------------------------------------------------------------------- no leakage


def test_scrambling_after_the_horizon_leaves_predictions_unchanged(planted):
    runs, _, base = planted
    opt = PredictOptions(target="slash", horizons=(0.1,), **FAST)
    rng = np.random.default_rng(3)
    # the final snapshot defines the target, so the whole pipeline keeps it ...
    scrambled = [Run(r.run_id, scramble_after(r.data, H_STEP, rng, keep_final=True), r.seed, r.config) for r in runs]
    assert not scrambled[0].data.attention.isel(snapshot=4).equals(runs[0].data.attention.isel(snapshot=4))
    again = predict.predict_runs(scrambled, opt)
    np.testing.assert_array_equal(again.target.values, base.target.values)
    np.testing.assert_array_equal(again.prediction.sel(horizon=0.1).values, base.prediction.sel(horizon=0.1).values)
    np.testing.assert_array_equal(again.score.sel(horizon=0.1).values, base.score.sel(horizon=0.1).values)


def test_features_never_read_past_the_horizon(planted, tables):
    runs, opt, base = planted
    rows, before, init, splits = tables  # targets from the intact runs
    rng = np.random.default_rng(4)
    # ... and the features, with the final snapshot scrambled too, are bit-identical
    scrambled = [Run(r.run_id, scramble_after(r.data, H_STEP, rng, keep_final=False), r.seed, r.config) for r in runs]
    after = predict.feature_table(scrambled, rows, 0.1, opt)
    np.testing.assert_array_equal(before.values, after.values)
    preds, _ = predict.cross_validate({0.1: after.values}, init.values, rows.target.values, rows.row_layer.values,
                                      splits, opt)
    np.testing.assert_array_equal(preds[0], base.prediction.sel(horizon=0.1).values)
    # the test has teeth: scrambling the horizon snapshot itself does change the features
    touched = [Run(r.run_id, scramble_after(r.data, H_STEP - 1, rng, keep_final=False), r.seed, r.config)
               for r in runs[:2]]
    two = rows.isel(head_row=np.isin(rows.row_run.values, [r.run_id for r in touched]))
    changed = predict.feature_table(touched, two, 0.1, opt).values
    assert not np.array_equal(changed, before.values[: changed.shape[0]], equal_nan=True)


def test_early_snapshots_cut_every_time_axis():
    ds = make_run(0, np.zeros((L, H), bool))
    early = predict.early_snapshots(ds, H_STEP)
    assert early.step.values.tolist() == [0, 5, 10]
    assert early.sizes["train_step"] == H_STEP + 1
    assert early.probe_tokens.equals(ds.probe_tokens)
    with pytest.raises(PredictError, match="no snapshot"):
        predict.early_snapshots(ds.isel(snapshot=slice(1, None)), 2)


def test_a_snapshot_one_step_past_the_horizon_is_never_seen():
    # The planted runs' snapshots (0, 5, 10, 20) leave a gap after h = 10, so a cut a step or
    # a few late saw the same data. Here step 20 is moved to 11, one step past the horizon, and
    # everything from step 11 on is scrambled: the features at h = 10 must be those of the
    # snapshots 0, 5, 10 alone, whatever snapshot 11 holds.
    steps = np.array([0, 5, 10, 11, 40, 70, 100])
    runs = [Run(r.run_id, r.data.assign_coords(step=("snapshot", steps)), r.seed, r.config)
            for r in make_runs(n_seeds=3)]
    early = predict.early_snapshots(runs[0].data, H_STEP)
    assert early.step.values.tolist() == [0, 5, 10]
    assert early.sizes["train_step"] == H_STEP + 1  # train steps 0..10
    rng = np.random.default_rng(5)
    scrambled = [Run(r.run_id, scramble_after(r.data, H_STEP, rng, keep_final=False), r.seed, r.config) for r in runs]
    assert not scrambled[0].data.grad_norm.isel(snapshot=3).equals(runs[0].data.grad_norm.isel(snapshot=3))
    opt = PredictOptions(horizons=(H_STEP,), unit="step")
    rows = predict.target_table(runs, opt)
    before = predict.feature_table(runs, rows, H_STEP, opt)
    after = predict.feature_table(scrambled, rows, H_STEP, opt)
    assert after.attrs["horizon_step"] == {r.run_id: 10.0 for r in runs}
    assert after.attrs["n_snapshots"] == {r.run_id: 3 for r in runs}
    np.testing.assert_array_equal(after.values, before.values)
    # known answer: the features of the first three snapshots, cut by hand
    by_hand = predict.head_features(scrambled[0].data.isel(snapshot=[0, 1, 2]), opt.analysis)
    mine = rows.row_run.values == runs[0].run_id
    by_hand = by_hand.sel(feature=after.feature.values).values  # (layer, head, feature)
    np.testing.assert_array_equal(after.values[mine], by_hand[rows.row_layer.values[mine], rows.row_head.values[mine]])


def test_a_fraction_horizon_on_a_snapshot_keeps_that_snapshot():
    # 0.575 of a 400-step run is step 230 exactly, but 0.575 * 400 is 229.99999999999997 in
    # binary floating point: the snapshot at 230 must still be seen.
    steps = np.array([0, 20, 40, 80, 160, 230, 400])
    runs = [Run(r.run_id, r.data.assign_coords(step=("snapshot", steps)), r.seed, r.config)
            for r in make_runs(n_seeds=2)]
    assert predict.horizon_steps(runs[0].data, [0.575], "fraction").tolist() == [230.0]
    # a misspelled unit was taken as steps (h = 0.575 a step), a fraction past 1 as a step past the end
    with pytest.raises(ValueError, match=r"^horizon_steps: unknown unit 'fractions'; one of: fraction, step$"):
        predict.horizon_steps(runs[0].data, [0.575], "fractions")
    with pytest.raises(ValueError, match=r"^horizon_steps: fraction horizons must be in \[0, 1\]; got \[2.0\]$"):
        predict.horizon_steps(runs[0].data, [2.0], "fraction")
    opt = PredictOptions(horizons=(0.575,))
    rows = predict.target_table(runs, opt)
    feats = predict.feature_table(runs, rows, 0.575, opt)
    assert feats.attrs["horizon_step"] == {r.run_id: 230.0 for r in runs}
    assert feats.attrs["n_snapshots"] == {r.run_id: 6 for r in runs}


def test_gradient_features_by_hand_are_relative_to_the_heads_own_layer():
    # Known answer for the trajectory features of one weight: a head's "rel" is its log10 norm
    # minus the mean over ITS layer's heads (not over the layers at its head index), its slope
    # the least-squares slope against log(1 + step). Layers here differ in scale by 100x, so a
    # mean over the wrong axis moves every rel value.
    steps = np.array([0, 3, 15])
    gn = np.empty((3, 2, 3, 4))
    gn[..., :] = 1.0
    gn[:, 0, :, 0] = [[1.0, 10.0, 100.0], [10.0, 10.0, 10.0], [100.0, 10.0, 1.0]]  # layer 0, weight q
    gn[:, 1, :, 0] = [[1e4, 1e4, 1e6], [1e4, 1e5, 1e4], [1e3, 1e4, 1e5]]  # layer 1, 100x larger
    ds = xr.Dataset({"grad_norm": (("snapshot", "layer", "head", "weight"), gn)},
                    coords={"step": ("snapshot", steps), "weight": ["q", "k", "v", "o"]})
    f = predict.head_features(ds)
    lg = np.log10(gn[..., 0])  # (S, L, H)
    np.testing.assert_allclose(f.sel(feature="grad_norm_q_init").values, lg[0], atol=1e-9)
    np.testing.assert_allclose(f.sel(feature="grad_norm_q_h").values, lg[-1], atol=1e-9)
    np.testing.assert_allclose(f.sel(feature="grad_norm_q_mean").values, lg.mean(0), atol=1e-9)
    np.testing.assert_allclose(f.sel(feature="grad_norm_q_rel_init").values, [[-1, 0, 1], [-2 / 3, -2 / 3, 4 / 3]],
                               atol=1e-9)
    np.testing.assert_allclose(f.sel(feature="grad_norm_q_rel_h").values, [[1, 0, -1], [-1, 0, 1]], atol=1e-9)
    t = np.log1p(steps)
    slope = [[np.polyfit(t, lg[:, layer, head], 1)[0] for head in range(3)] for layer in range(2)]
    np.testing.assert_allclose(f.sel(feature="grad_norm_q_slope").values, slope, atol=1e-9)
    assert f.sel(feature="layer").values.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert f.sel(feature="depth").values.tolist() == [[0, 0, 0], [1, 1, 1]]


def test_importance_share_is_each_heads_part_of_its_layers_l2_norm():
    # Michel et al. normalise importance by the l2 norm within a layer: heads of 3 and 4 share
    # 3/5 and 4/5 (an l1 norm gives 3/7 and 4/7); the first snapshot is not the horizon's.
    ds = xr.Dataset({"importance": (("snapshot", "layer", "head"), np.array([[[1.0, 1.0]], [[3.0, 4.0]]]))},
                    coords={"step": ("snapshot", [0, 10])})
    np.testing.assert_allclose(predict.head_features(ds).sel(feature="importance_share_h").values, [[0.6, 0.8]])


def test_importance_share_skips_a_nan_head_as_the_ranks_do():
    # One NaN head leaves its own share NaN; its peers' shares are of the finite heads' norm
    # (3, 4 -> 0.6, 0.8), not NaN for the whole layer. A layer of NaN heads stays NaN.
    imp = np.array([[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [[3.0, np.nan, 4.0], [np.nan, np.nan, np.nan]]])
    ds = xr.Dataset({"importance": (("snapshot", "layer", "head"), imp)}, coords={"step": ("snapshot", [0, 10])})
    np.testing.assert_allclose(predict.head_features(ds).sel(feature="importance_share_h").values,
                               [[0.6, np.nan, 0.8], [np.nan, np.nan, np.nan]])


def test_attention_features_are_changes_from_init_and_distances_to_other_heads():
    # role *_change is the horizon's score minus the initial one (not the reverse), and
    # js_nearest the JS distance to the nearest OTHER head, never the head to itself (0)
    from dynamics.analysis import js_distance

    ds = make_run(0, np.ones((L, H), bool))  # every head planted: a slash pattern at the last snapshot
    f = predict.head_features(ds)
    roles = [str(n)[: -len("_change")] for n in f.feature.values if str(n).endswith("_change")
             and not str(n).startswith("weight_norm")]
    change = {r: f.sel(feature=f"{r}_h").values - f.sel(feature=f"{r}_init").values for r in roles}
    for role in roles:
        np.testing.assert_allclose(f.sel(feature=f"{role}_change").values, change[role])
    assert np.abs(change["slash"]).min() > 0.1  # the plant moved it: a sign error would show
    d = np.asarray(js_distance(ds["attention"].isel(snapshot=[-1])).values, dtype=np.float64)[0].reshape(L * H, L * H)
    np.fill_diagonal(d, np.inf)
    np.testing.assert_allclose(f.sel(feature="js_nearest_h").values, d.min(axis=1).reshape(L, H))
    assert (f.sel(feature="js_nearest_h").values > 0).all()


def test_a_horizon_between_snapshots_is_said_to_see_the_last_snapshot_before_it():
    # Known answer: h = 0.15 of the 100-step runs is step 15, but the snapshots are at 0, 5, 10,
    # 20...: the features saw step 10 (3 snapshots), and the table must say 10, not 15.
    runs = make_runs(n_seeds=3)
    curve = predict.predict_runs(runs, PredictOptions(horizons=(0.15,), n_splits=3, boosting_iter=5))
    assert curve.horizon_step.values.tolist() == [[10.0] * 3]
    assert curve.n_snapshots_seen.values.tolist() == [[3] * 3]
    assert "features saw snapshots up to step h=0.15: 10 (final step 100)" in predict.format_curve(curve)
    assert "h=0.15 (step 10)" in curve.attrs["readable_summary"]


def test_horizons_that_see_the_same_snapshots_share_their_features(monkeypatch):
    # h = 0 and init both cut at step 0, h = 0.12 and h = 0.15 both at step 10 (snapshots at 0,
    # 5, 10, 20, 40, 70, 100; h = 0.5 sees 5 of them): with the cache predict_runs passes, each run's features are computed once per
    # cut, 3 cuts in all, and the tables equal those computed without it
    from dynamics.predict import features

    runs = make_runs(n_seeds=3)
    opt = PredictOptions(horizons=(0.0, 0.12, 0.15, 0.5), n_splits=3, boosting_iter=5)
    rows = predict.target_table(runs, opt)
    calls: list[int] = []
    real = features.head_features
    monkeypatch.setattr(features, "head_features", lambda early, o=None: calls.append(early.sizes["snapshot"]) or real(early, o))
    cache: dict = {}
    shared = [features.feature_table(runs, rows, h, opt, cache) for h in (None, *opt.horizons)]
    assert sorted(calls) == sorted([1, 3, 5] * len(runs)) and len(cache) == 3 * len(runs)
    alone = [features.feature_table(runs, rows, h, opt) for h in (None, *opt.horizons)]
    for a, b in zip(shared, alone, strict=True):
        xr.testing.assert_identical(a, b)
    calls.clear()
    predict.predict_runs(runs, opt)  # which passes its cache
    assert len(calls) == 3 * len(runs)


# Known answers that mutants of this module passed (a mutation audit's): each pins a behaviour
# a mutant changed without any other test noticing.


def test_importance_rank_in_layer_by_hand():
    # Mutants of `_rank_in_layer`: rank / n (ranks 1/3..1, never 0) and a lone head's 0.5 -> 0.
    # Layer 0: importances 1, 3, 2 rank 0, 1, 0.5; layer 1: one importance left (others NaN), no peer: 0.5.
    imp = np.array([[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [[1.0, 3.0, 2.0], [5.0, np.nan, np.nan]]])
    ds = xr.Dataset({"importance": (("snapshot", "layer", "head"), imp)}, coords={"step": ("snapshot", [0, 10])})
    got = predict.head_features(ds).sel(feature="importance_rank_h").values
    np.testing.assert_allclose(got, [[0.0, 1.0, 0.5], [0.5, np.nan, np.nan]])
    np.testing.assert_allclose(predict.head_features(ds).sel(feature="importance_rank_init").values,
                               [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])  # ties averaged: (2 - 1) / 2


def test_a_two_snapshot_slope_is_the_line_through_them():
    # Mutant `t.size < 2` -> `< 3`: with init and one later snapshot (h at the second snapshot)
    # the slope was 0, not (log10 100 - log10 1) / log(1 + 10).
    gn = np.ones((2, 1, 2, 4))
    gn[1, 0, 0, 0] = 100.0
    ds = xr.Dataset({"grad_norm": (("snapshot", "layer", "head", "weight"), gn)},
                    coords={"step": ("snapshot", [0, 10]), "weight": ["q", "k", "v", "o"]})
    got = predict.head_features(ds).sel(feature="grad_norm_q_slope").values
    np.testing.assert_allclose(got, [[2.0 / np.log(11.0), 0.0]], atol=1e-9)


def test_a_head_alone_in_its_layer_has_no_mean_distance_to_its_layer():
    # Mutant `count > 0` -> `count >= 0` in `_masked_mean`: a layer of one head has no other head
    # to be distant from, and its js_layer read 0 (as close as can be) rather than NaN.
    ds = make_run(0, np.zeros((2, 8), bool)).isel(head=[0])
    f = predict.head_features(ds)
    assert np.isnan(f.sel(feature="js_layer_init").values).all()
    assert np.isnan(f.sel(feature="js_layer_h").values).all()
    assert (f.sel(feature="js_nearest_h").values > 0).all()  # the other layer's head is still a neighbour


def test_js_layer_is_the_mean_distance_to_the_layers_other_heads():
    # Mutant keeping the diagonal in the layer block: each head's own distance 0 was averaged in,
    # shrinking js_layer by (H - 1) / H.
    from dynamics.analysis import js_distance

    ds = make_run(0, np.ones((2, 8), bool))
    f = predict.head_features(ds)
    d = np.asarray(js_distance(ds["attention"].isel(snapshot=[-1])).values, dtype=np.float64)[0]  # (L, H, L, H)
    want = [[(d[layer, h, layer].sum() - d[layer, h, layer, h]) / 7 for h in range(8)] for layer in range(2)]
    np.testing.assert_allclose(f.sel(feature="js_layer_h").values, want, rtol=1e-6)


def test_the_horizons_offset_and_divergence_are_read_at_the_horizon_not_at_init():
    # Mutants reading best_offset_h and divergence_from_init_h at the first snapshot: the planted
    # heads' slash at offset 3 appears only at the final snapshot, and init diverges from itself by 0.
    from dynamics.analysis import divergence_from_init
    from tests.test_predict import OFFSET, make_run

    ds = make_run(0, np.ones((2, 8), bool))
    f = predict.head_features(ds)
    assert (f.sel(feature="best_offset_h").values == OFFSET).all()
    first_last = ds["attention"].isel(snapshot=[0, -1])
    want = np.asarray(divergence_from_init(first_last).values, dtype=np.float64)[1]
    np.testing.assert_allclose(f.sel(feature="divergence_from_init_h").values, want, rtol=1e-6)
    assert (want > 0.05).all()


def test_weight_norm_features_by_hand():
    # Mutants of the weight features: change is log10(norm at h) - log10(norm at init), not the
    # reverse, rel_init is minus the layer's mean, and a norm is the l2 norm (not its square).
    # Head (0, 0): q slice of 4 ones (norm 2) grows 10x; head (0, 1): q slice of 4 twos (norm 4), fixed.
    w = np.ones((2, 1, 2, 4, 2, 2))
    w[:, 0, 1] = 2.0
    w[1, 0, 0, 0] = 10.0
    ds = xr.Dataset({"head_weights": (("snapshot", "layer", "head", "weight", "d_model", "d_head"), w),
                     "importance": (("snapshot", "layer", "head"), np.ones((2, 1, 2)))},
                    coords={"step": ("snapshot", [0, 10]), "weight": ["q", "k", "v", "o"]})
    f = predict.head_features(ds)
    np.testing.assert_allclose(f.sel(feature="weight_norm_q_init").values, [[np.log10(2.0), np.log10(4.0)]])
    np.testing.assert_allclose(f.sel(feature="weight_norm_q_change").values, [[1.0, 0.0]], atol=1e-9)
    half = (np.log10(4.0) - np.log10(2.0)) / 2
    np.testing.assert_allclose(f.sel(feature="weight_norm_q_rel_init").values, [[-half, half]], atol=1e-9)


def test_a_fraction_of_one_is_the_runs_final_step():
    # Mutant `h <= 1.0` -> `h < 1.0`: the whole run (h = 1, the ceiling the table marks) was refused.
    ds = xr.Dataset(coords={"step": ("snapshot", [0, 10, 200])})
    assert predict.horizon_steps(ds, [0, 0.1, 1.0], "fraction").tolist() == [0.0, 20.0, 200.0]
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        predict.horizon_steps(ds, [1.5], "fraction")


def test_features_one_run_lacks_are_left_out_of_the_table():
    # Mutant `all(...)` -> `any(...)` for the common features: a run without gradient agreement
    # recorded made the table fail, rather than keep the features every run has.
    runs = make_runs(n_seeds=3)
    runs[1] = Run(runs[1].run_id, runs[1].data.drop_vars("grad_cosine"), seed=runs[1].seed, config=runs[1].config)
    opt = PredictOptions(horizons=(0.1,), n_splits=3)
    rows = predict.target_table(runs, opt)
    table = predict.feature_table(runs, rows, 0.1, opt)
    names = table["feature"].values.tolist()
    assert not [n for n in names if n.startswith("grad_cosine")] and "grad_norm_q_slope" in names
    assert table.shape == (rows.sizes["head_row"], len(names))


def test_gradient_agreement_at_the_horizon_and_its_mean_by_hand():
    # Mutant reading grad_cosine_h at the second snapshot: the horizon is the last one seen.
    # Cosines NaN (no earlier gradient), 0.2, 0.8: h = 0.8, mean over the defined ones 0.5.
    gc = np.full((3, 1, 1, 4), 0.0)
    gc[0] = np.nan
    gc[1, 0, 0, 0], gc[2, 0, 0, 0] = 0.2, 0.8
    ds = xr.Dataset({"grad_cosine": (("snapshot", "layer", "head", "weight"), gc),
                     "importance": (("snapshot", "layer", "head"), np.ones((3, 1, 1)))},
                    coords={"step": ("snapshot", [0, 5, 10]), "weight": ["q", "k", "v", "o"]})
    f = predict.head_features(ds)
    assert float(f.sel(feature="grad_cosine_q_h").values[0, 0]) == pytest.approx(0.8)
    assert float(f.sel(feature="grad_cosine_q_mean").values[0, 0]) == pytest.approx(0.5)


def test_slash_features_leave_out_the_offsets_the_analysis_leaves_out():
    # At T = 4 the slash window is offsets 1-2, and at offset 2 a first-token sink scores
    # (A[2,0] + A[3,1]) / 2 = 0.5 = kappa: analyse_run leaves that offset out. The features read
    # it still, so a sink head's best_slash_h was 0.5 at offset 2 where its analysis (and its
    # target) had 1/3 at offset 1: A[1,0] + A[2,1] + A[3,2] over 3 rows.
    from dynamics.analysis import analyse_run

    T = 4
    sink = np.zeros((4, 1, 1, 1, T, T))  # (snapshot, layer, head, probe, query, key)
    sink[..., 0] = 1.0
    ds = xr.Dataset({"attention": (("snapshot", "layer", "head", "probe", "query", "key"), sink),
                     "probe_tokens": (("probe", "position"), np.arange(T)[None]),
                     "importance": (("snapshot", "layer", "head"), np.ones((4, 1, 1)))},
                    coords={"step": ("snapshot", [0, 10, 20, 30])})
    f = predict.head_features(ds)
    assert f.sel(feature="best_offset_h").item() == 1
    np.testing.assert_allclose(f.sel(feature=["best_slash_init", "best_slash_h"]).values.ravel(), [1 / 3, 1 / 3])
    analysis = analyse_run(ds)
    assert analysis.attrs["slash_offsets_unscored"] == [2]
    assert analysis["best_offset"].isel(snapshot=-1).item() == f.sel(feature="best_offset_h").item()
    assert analysis["best_slash"].isel(snapshot=-1).item() == pytest.approx(f.sel(feature="best_slash_h").item())
    # at T = 3 no offset is left (1 is the window, and a sink's A[1,0] + A[2,1] is 1/2 there):
    # the analysis has no best offset, and nor has the feature
    f3 = predict.head_features(ds.isel(query=slice(0, 3), key=slice(0, 3), position=slice(0, 3)))
    assert np.isnan(f3.sel(feature=["best_offset_h", "best_slash_h"]).values).all()
