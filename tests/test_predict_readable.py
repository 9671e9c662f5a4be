"""The how-early criterion of `dynamics.predict.readable`: `judge` on per-fold scores of known
answer, and the answer stored with the planted curve."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from dynamics import predict
from dynamics.predict import MODELS, PredictOptions
from dynamics.predict.readable import (
    ceiling_horizons,
    corrected_t,
    critical_t,
    fold_gain,
    holdout_ratios,
    init_only_horizons,
    null_count,
    passes,
)
from tests.test_predict import FAST, make_runs


def folds(rows: dict[str, list[list[float]]]) -> np.ndarray:
    """(horizon, model, fold) scores in MODELS order from {model: [[score per fold] per horizon]}."""
    return np.array([rows[m] for m in MODELS], dtype=float).transpose(1, 0, 2)


def same(scores: list[float], n: int = 3) -> list[list[float]]:
    """One model's fold scores, the same at each of `n` horizons (the baselines')."""
    return [list(scores)] * n


# ----------------------------------------------------------------------------- known answers


def test_baselines_and_early_models_are_the_models():
    assert (*predict.BASELINES, *predict.EARLY) == MODELS


def test_gains_are_each_folds_score_minus_its_best_baseline_and_their_t_is_corrected():
    # fold 0: best baseline 0.4 (init_linear), fold 1: 0.5 (chance), fold 2: a baseline unscored
    got = fold_gain([0.6, 0.7, 0.9], [[0.25, 0.5, np.nan], [0.4, 0.3, 0.2]])
    np.testing.assert_allclose(got, [0.2, 0.2, np.nan])
    # Known answer: gains 0.1, 0.3 have mean 0.2, sd sqrt(0.02); with n_test/n_train 1 (2 equal
    # folds) t = 0.2 / (sqrt(0.02) sqrt(1/2 + 1)) = 1.1547; the plain paired t would be 2.0
    mean, sd, t, n = corrected_t([0.1, 0.3, np.nan], 1.0)
    np.testing.assert_allclose([mean, sd, t], [0.2, 0.02 ** 0.5, 0.2 / (0.02 ** 0.5 * 1.5 ** 0.5)])
    assert n == 2
    assert np.isnan(corrected_t([0.5, np.nan], 1.0)[2])  # one fold: no spread, no test
    np.testing.assert_allclose(critical_t([2, 3, 5]), [6.3138, 2.9200, 2.1318], atol=1e-4)  # t tables, 95% one-sided
    assert passes([[0.1, 0.1, 0.1], [0.0, 0.0, 0.0], [0.1, 0.2, np.nan]], 0.5).tolist() == [True, False, False]


def test_on_independent_gains_of_mean_0_the_test_fires_at_its_known_rate():
    # Known answers: for J iid normal gains of mean 0 the plain paired t has J - 1 df, so the test
    # with no correction (n_test/n_train ~0) fires at its level, 0.05, and with 3 equal folds'
    # correction (1/2) at P(t_2 > 2.92 sqrt(3 (1/3 + 1/2))) = 0.022: the correction widens what
    # independent folds would need, for folds that share training runs and are not independent.
    from scipy import stats

    gains = np.random.default_rng(0).normal(size=(40_000, 3))
    assert passes(gains, 1e-12).mean() == pytest.approx(0.05, abs=0.004)  # 4 sd of 40,000 draws
    want = stats.t.sf(float(critical_t(3)) * (3 * (1 / 3 + 1 / 2)) ** 0.5, 2)
    assert want == pytest.approx(0.0219, abs=1e-4)
    assert passes(gains, 0.5).mean() == pytest.approx(want, abs=0.003)


def test_a_model_ahead_in_every_fold_is_readable_though_chance_moves_from_fold_to_fold():
    # Known answer (an audit's store): balanced-accuracy chance is 1/k for the k classes a fold
    # holds, 0.25, 0.333, 0.333 and 0.5 here, a spread no model can narrow. linear leads the best
    # baseline of each fold by 0.086 to 0.267: mean 0.154, sd 0.083, and with 4 equal folds
    # (n_test/n_train 1/3) t = 0.154 / (0.083 sqrt(1/4 + 1/3)) = 2.44 > 2.35 (3 df). Judged by
    # each model's own band, linear's (0.38 to 0.67) overlapped chance's (0.25 to 0.46) and the
    # line read "not readable".
    chance = [0.25, 1 / 3, 1 / 3, 0.5]
    rows = {"chance": same(chance, 2), "layer": same(chance, 2), "init_linear": same([0.252, 0.3, 0.3, 0.45], 2),
            "init_boosting": same([0.2, 0.402, 0.25, 0.4], 2), "linear": [[0.252, 0.3, 0.3, 0.45],
                                                                          [0.338, 0.5, 0.6, 0.667]],
            "boosting": [[0.2, 0.402, 0.25, 0.4], [0.3, 0.4, 0.5, 0.6]]}
    got = predict.judge([0.0, 0.5], folds(rows), "balanced_accuracy")
    assert got.readable == (False, True)
    assert (got.horizon, got.model, got.baseline) == (0.5, "linear", "chance")
    np.testing.assert_allclose(got.gain[1, 0], [0.338 - 0.252, 0.5 - 0.402, 0.6 - 1 / 3, 0.667 - 0.5])
    assert got.line == ("how early: first readable at h=0.5: linear's gain over the best init-only baseline in each "
                        "test fold, +0.086, +0.098, +0.267, +0.167 (mean 0.154, sd 0.083: corrected t 2.44 > 2.35); "
                        "linear 0.526 against the highest baseline mean, chance 0.354")
    # the same gains with folds whose training share is smaller (n_test/n_train 1/2) do not pass
    assert predict.judge([0.0, 0.5], folds(rows), "balanced_accuracy", holdout=0.5).horizon is None
    # the table's bands are still each model's own spread, for plots
    np.testing.assert_allclose(got.high[1, MODELS.index("chance")], np.mean(chance) + np.std(chance, ddof=1))


def test_a_model_ahead_on_average_but_behind_in_a_fold_is_not_readable():
    # linear's mean (0.567) is above every baseline's (0.5), as in the table, but it trails the
    # best baseline in fold 2: gains +0.2, +0.2, -0.2, t 0.32
    base = same([0.5, 0.5, 0.5], 2)
    rows = {"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
            "linear": [[0.5, 0.5, 0.5], [0.7, 0.7, 0.3]], "boosting": [[0.5, 0.5, 0.5], [0.5, 0.5, 0.45]]}
    got = predict.judge([0.0, 0.1], folds(rows), "auroc")
    assert got.readable == (False, False) and got.horizon is None and got.model is None
    assert got.line == ("how early: not readable at any horizon measured (h=0 to h=0.1): no early-training model's "
                        "gain over the best init-only baseline in each test fold passes the test; nearest: linear at "
                        "h=0.1, gains +0.200, +0.200, -0.200 (mean 0.067, sd 0.231: corrected t 0.32 <= 2.92), "
                        "linear 0.567 against the highest baseline mean, chance 0.500")


def test_the_nearest_miss_is_the_one_nearest_its_critical_point_not_the_largest_t():
    # linear at h=0.1 is scored in 2 folds: t 3.87 against 6.31 needed; boosting at h=0.2 in 4:
    # t 2.15 against 2.35 (gains mean 0.15, sd 0.0913, t = 0.15 / (0.0913 sqrt(1/4 + 1/3))).
    base = same([0.5] * 4, 2)
    rows = {"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
            "linear": [[0.66, 0.74, np.nan, np.nan], [0.4] * 4], "boosting": [[0.4] * 4, [0.6, 0.7, 0.55, 0.75]]}
    got = predict.judge([0.1, 0.2], folds(rows), "auroc", holdout=1 / 3)
    assert got.horizon is None
    assert ("nearest: boosting at h=0.2, gains +0.100, +0.200, +0.050, +0.250 (mean 0.150, sd 0.091: corrected t "
            "2.15 <= 2.35), boosting 0.650 against the highest baseline mean, chance 0.500") in got.line


def test_the_nearest_miss_is_never_a_horizon_that_saw_the_initialisation_alone():
    # At h=0 linear and boosting see the init snapshot alone: the init baselines' scores, so
    # their gain over those is at most 0 there: a nearer miss than a real one, by t.
    base = {"chance": same([0.5, 0.5, 0.5], 2), "layer": same([0.5, 0.6, 0.55], 2),
            "init_linear": same([0.9, 0.89, 0.91], 2), "init_boosting": same([0.85, 0.84, 0.86], 2)}
    rows = {**base, "linear": [[0.9, 0.89, 0.91], [0.8, 0.95, 0.8]], "boosting": [[0.85, 0.84, 0.86], [0.7, 0.8, 0.9]]}
    got = predict.judge([0.0, 0.25], folds(rows), "auroc")
    assert got.horizon is None and got.readable == (False, False)
    assert "nearest: linear at h=0.25, gains -0.100, +0.060, -0.110" in got.line
    one = predict.judge([0.0], folds(rows)[:1], "auroc")
    assert "nearest: linear at h=0 (there the early-training models see the initialisation alone), gains" in one.line
    # a small horizon that saw step 0 alone is the init baselines' twin too (a curve says which)
    tiny = predict.judge([1e-7, 0.25], folds(rows), "auroc", init_only=[True, False])
    assert "nearest: linear at h=0.25," in tiny.line
    with pytest.raises(ValueError, match=r"one ceiling, label and init_only per horizon \(2\); got 2, 2 and 1"):
        predict.judge([1e-7, 0.25], folds(rows), "auroc", init_only=[True])
    curve = xr.Dataset({"n_snapshots_seen": (("horizon", "run"), [[1, 1], [1, 2], [3, 4]])},
                       coords={"horizon": [1e-7, 0.01, 0.2]})
    assert init_only_horizons(curve) == [True, False, False]


def test_gains_just_past_the_critical_point_pass_and_just_short_do_not():
    # gains 0.1 - d, 0.1, 0.1 + d over 3 equal folds: sd = d, t = 0.1 / (d sqrt(1/3 + 1/2)); at
    # the critical 2.92 (2 df), d = 0.1 / (2.92 sqrt(5/6)) = 0.03752: a hair either side decides
    d_star = 0.1 / (float(critical_t(3)) * (5 / 6) ** 0.5)
    base = same([0.5, 0.5, 0.5], 1)
    for d, want in ((d_star * 0.999, True), (d_star * 1.001, False)):
        rows = {"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
                "linear": [[0.6 - d, 0.6, 0.6 + d]], "boosting": base}
        assert predict.judge([0.1], folds(rows), "auroc").readable == (want,), d


def test_gains_that_are_0_in_decimals_are_a_tie_whichever_way_binary_rounds_them():
    # 0.1 + 0.2 is 0.30000000000000004 in binary: a gain of 0.3 over 0.3 is 5.6e-17 in every
    # fold, sd 0, so t = +inf: "readable" on a tie
    rows = {"chance": same([0.3, 0.3], 1), "layer": same([0.2, 0.2], 1), "init_linear": same([0.2, 0.2], 1),
            "init_boosting": same([0.2, 0.2], 1), "linear": same([0.1 + 0.2, 0.1 + 0.2], 1),
            "boosting": same([0.2, 0.2], 1)}
    assert 0.1 + 0.2 - 0.3 > 0  # the rounding the tie tolerance absorbs
    got = predict.judge([0.1], folds(rows), "balanced_accuracy")
    assert got.readable == (False,) and got.line.startswith("how early: not readable")
    # a real lead equal in every fold (sd 0) passes
    rows["linear"] = same([0.4, 0.4], 1)
    assert predict.judge([0.1], folds(rows), "balanced_accuracy").readable == (True,)


def test_gains_equal_in_every_fold_are_judged_not_left_unjudged():
    # sd 0 makes t = +inf or -inf: "cannot be judged: fewer than 2 folds..." was printed with every
    # fold scored (a reviewer's case), and the null check dropped such a permutation from both counts
    base = same([0.5, 0.5], 1)
    rows = {"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
            "linear": same([0.75, 0.75], 1), "boosting": same([0.625, 0.625], 1)}
    got = predict.judge([0.1], folds(rows), "balanced_accuracy")
    assert got.judged and got.readable == (True,) and (got.horizon, got.model) == (0.1, "linear")
    assert "corrected t inf > 6.31" in got.line
    rows["linear"], rows["boosting"] = same([0.4, 0.4], 1), same([0.3, 0.3], 1)
    got = predict.judge([0.1], folds(rows), "balanced_accuracy")
    assert got.judged and got.horizon is None and got.line.startswith("how early: not readable")


def test_the_holdout_share_is_averaged_over_the_folds_with_a_gain():
    # Known answer: folds of 48, 16 and 16 of 80 heads (n_test/n_train 1.5, 0.25, 0.25); the big
    # fold has one class, so no gain. Gains 0.2 and 0.25: mean 0.225, sd 0.0354; over the 2 folds
    # tested, t = 0.225 / (0.0354 sqrt(1/2 + 0.25)) = 7.35 > 6.31; with the untested fold's 1.5 in
    # the mean (0.667) t was 5.89, and the horizon was not named.
    ratios = holdout_ratios([48, 16, 16], 80)
    base = same([np.nan, 0.5, 0.5], 1)
    rows = {"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
            "linear": [[np.nan, 0.7, 0.75]], "boosting": base}
    mean, sd, t, n = corrected_t(fold_gain([np.nan, 0.7, 0.75], [[np.nan, 0.5, 0.5]]), ratios)
    assert t == pytest.approx(0.225 / (0.05 / 2 ** 0.5 * 0.75 ** 0.5)) and n == 2
    assert predict.judge([0.1], folds(rows), "auroc", holdout=ratios).readable == (True,)
    assert predict.judge([0.1], folds(rows), "auroc", holdout=float(np.mean(ratios))).readable == (False,)


def test_a_fold_without_a_baselines_score_gives_no_gain_and_one_fold_no_judgement():
    # init_boosting is unscored in fold 1: linear's lead there is over an unknown, so only fold 0
    # has a gain, and one gain has no spread: nothing is judged
    rows = {"chance": same([0.5, 0.5], 2), "layer": same([0.5, 0.5], 2), "init_linear": same([0.5, 0.5], 2),
            "init_boosting": same([0.5, np.nan], 2), "linear": [[0.5, 0.5], [0.9, 0.9]],
            "boosting": same([0.5, 0.5], 2)}
    got = predict.judge([0.0, 0.1], folds(rows), "auroc")
    assert np.isnan(got.gain[1, 0, 1]) and got.gain[1, 0, 0] == pytest.approx(0.4)
    assert got.readable == (False, False) and got.horizon is None and not got.judged
    assert got.line == "how early: cannot be judged: fewer than 2 folds have a score of every model"


def test_one_early_model_with_gains_is_enough_to_judge_a_horizon():
    base = same([0.5, 0.5, 0.5], 1)
    rows = {"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
            "linear": [[0.9, 0.85, 0.95]], "boosting": [[0.9, np.nan, np.nan]]}
    got = predict.judge([0.1], folds(rows), "auroc")
    assert got.judged and got.readable == (True,)
    assert (got.horizon, got.model, got.baseline) == (0.1, "linear", "chance")


def test_a_ceiling_horizon_is_never_readable_and_a_later_miss_is_named():
    base = same([0.5, 0.5, 0.5], 4)
    rows = {"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
            "linear": [[0.5, 0.5, 0.5], [0.7, 0.75, 0.8], [0.5, 0.55, 0.45], [1.0, 1.0, 1.0]], "boosting": base}
    got = predict.judge([0.0, 0.1, 0.2, 1.0], folds(rows), "auroc", ceiling=[False, False, False, True])
    assert got.readable == (False, True, False, False) and got.horizon == 0.1
    assert np.isnan(got.gain[3]).all()
    assert got.line.endswith("; not at h=0.2; h=1 not judged: features see a run's final snapshot (a ceiling)")
    only_ceiling = predict.judge([0.0, 1.0], folds(rows)[[0, 3]], "auroc", ceiling=[False, True])
    assert only_ceiling.horizon is None and "not readable" in only_ceiling.line
    every = predict.judge([1.0], folds(rows)[[3]], "auroc", ceiling=[True])
    assert every.line == ("how early: cannot be judged: every horizon is a ceiling; h=1 not judged: features see a "
                          "run's final snapshot (a ceiling)")


def test_unjudged_for_want_of_folds_is_not_blamed_on_a_later_ceiling():
    # h=0.1 has one fold, h=1 is a ceiling: "every horizon is a ceiling" would be false
    rows = {m: [[0.6, np.nan], [0.9, 0.9]] for m in MODELS}
    got = predict.judge([0.1, 1.0], folds(rows), "auroc", ceiling=[False, True])
    assert not got.judged and got.horizon is None
    assert got.line == ("how early: cannot be judged: fewer than 2 folds have a score of every model; h=1 not judged: "
                        "features see a run's final snapshot (a ceiling)")


def test_legible_at_initialisation_needs_gains_over_chance_and_layer_both():
    # init_linear leads chance by 0.2 in each fold, but the layer prior by 0, +0.04 and -0.02:
    # the layer alone reads as much, so nothing is legible from step 0
    rows = {"chance": same([0.5, 0.5, 0.5]), "layer": same([0.7, 0.68, 0.72]), "init_linear": same([0.7, 0.72, 0.7]),
            "init_boosting": same([0.5, 0.55, 0.45]), "linear": same([0.6, 0.6, 0.6]),
            "boosting": same([0.6, 0.6, 0.6])}
    got = predict.judge([0.0, 0.1, 0.5], folds(rows), "auroc")
    assert got.horizon is None and got.baseline == "init_linear" and got.legible is None
    assert "legible" not in got.line
    # with the layer prior at 0.6 in each fold, init_linear leads it by 0.1 to 0.12: legible
    scores = folds(rows)
    scores[:, MODELS.index("layer")] = 0.6
    got = predict.judge([0.0, 0.1, 0.5], scores, "auroc")
    assert got.legible == "init_linear"  # what the null check counts
    assert got.line.endswith("; it is legible at initialisation: init_linear's gain over the better of chance and "
                             "layer in each test fold, +0.100, +0.120, +0.100 (mean 0.107, sd 0.012: corrected t 10.12 "
                             "> 2.92), passes it, and no early-training model's gain over the best baseline does")


def test_judge_refuses_an_unknown_metric_unsorted_horizons_and_tables_of_other_shapes():
    scores = folds({m: same([0.5, 0.6], 2) for m in MODELS})
    with pytest.raises(ValueError, match="unknown metric 'acc'"):
        predict.judge([0.0, 0.1], scores, "acc")
    with pytest.raises(ValueError, match=r"must be \(horizon, model, fold\) with 1 horizons and 6 models; "
                                         r"got shape \(2, 6, 2\)"):
        predict.judge([0.0], scores, "auroc")
    with pytest.raises(ValueError, match=r"must be \(horizon, model, fold\)"):  # a table of means, no folds
        predict.judge([0.0, 0.1], scores.mean(axis=-1), "auroc")
    with pytest.raises(ValueError, match=r"^judge: horizons must be increasing; got \[0.5, 0.1\]$"):
        predict.judge([0.5, 0.1], scores, "auroc")
    with pytest.raises(ValueError, match=r"^judge: one ceiling, label and init_only per horizon \(2\); got 1, 2 and 2$"):
        predict.judge([0.0, 0.1], scores, "auroc", ceiling=[False])
    with pytest.raises(ValueError, match=r"^judge: one ceiling, label and init_only per horizon \(2\); got 2, 3 and 2$"):
        predict.judge([0.0, 0.1], scores, "auroc", labels=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"^judge: holdout must be one n_test / n_train > 0, or one per fold \(2\)"):
        predict.judge([0.0, 0.1], scores, "auroc", holdout=0.0)
    with pytest.raises(ValueError, match=r"^judge: holdout must be one"):
        predict.judge([0.0, 0.1], scores, "auroc", holdout=[0.5, 0.5, 0.5])


def test_bands_are_capped_to_the_metrics_range():
    # with 2 or 3 folds mean + sd passes 1 (0.878 +- 0.190 reaches 1.068): no fold can score there
    low, high = predict.score_band([0.878, 0.1, 0.5], [0.190, 0.3, 0.1], "balanced_accuracy")
    np.testing.assert_allclose(low, [0.688, 0.0, 0.4])
    np.testing.assert_allclose(high, [1.0, 0.4, 0.6])
    low, high = predict.score_band([-0.95, 0.95], [0.1, 0.1], "spearman")
    np.testing.assert_allclose(low, [-1.0, 0.85])
    np.testing.assert_allclose(high, [-0.85, 1.0])


# ----------------------------------------------------------------------------- the planted curve


def test_the_planted_curve_is_readable_at_the_horizon_that_sees_the_plant(planted):
    # The plant starts at step 5: h=0 sees initialisation only (where a model on its features
    # is the init baseline itself, so never readable), h=0.1 sees steps 0-10.
    _, _, curve = planted
    assert curve.readable.values.tolist() == [False, True]
    assert curve.attrs["readable_horizon"] == 0.1 and curve.attrs["readable_model"] in ("linear", "boosting")
    assert curve.attrs["readable_summary"].startswith("how early: first readable at h=0.1 (step 10): ")
    assert ((curve.score_low >= 0) & (curve.score_high <= 1)).all()
    np.testing.assert_allclose(curve.score_high.values, np.minimum(1, curve.score_mean + curve.score_std))
    # the gains the criterion judged: each early model's fold score minus the best baseline's there
    best = curve.score.sel(model=list(predict.BASELINES)).max("model", skipna=False)
    np.testing.assert_allclose(curve.gain.transpose("horizon", "early_model", "fold").values,
                               (curve.score.sel(model=list(predict.EARLY)) - best)
                               .rename(model="early_model").transpose("horizon", "early_model", "fold").values)
    passed = curve.gain_t > curve.gain_critical
    assert passed.sel(horizon=0.1).any() and not passed.sel(horizon=0.0).any()
    text = predict.format_curve(curve)
    assert curve.attrs["readable_summary"] in text.splitlines()
    assert "a one-sided paired t-test at 0.05" in text.splitlines()[-1]
    # folds of 32, 32, 32, 16 and 16 of the 128 heads: (3 x 32/96 + 2 x 16/112) / 5
    assert "n_test/n_train 0.257 here" in text.splitlines()[-1]


def test_a_horizon_seeing_the_final_snapshot_is_never_named_readable():
    # the plant is in the final snapshot's attention only: h=1 reads it, and is the ceiling
    runs = make_runs(signal=0.0)
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.0, 1.0), **FAST))
    assert float(curve.score_mean.sel(horizon=1.0, model="linear")) > 0.9
    assert curve.attrs["readable_horizon"] is None and not bool(curve.readable.values[-1])


def test_a_horizon_that_saw_one_runs_final_snapshot_is_a_ceiling():
    # Runs of different lengths, horizons in steps: step 400 is the final snapshot of the
    # 400-step run, so that run's target was in view there, though not the 1000-step run's.
    import xarray as xr

    from dynamics.predict.readable import ceiling_horizons

    curve = xr.Dataset({"horizon_step": (("horizon", "run"), [[100.0, 100.0], [400.0, 400.0]]),
                        "final_step": ("run", [400.0, 1000.0])}, coords={"horizon": [100.0, 400.0]})
    assert ceiling_horizons(curve) == [False, True]


# Known answers that mutants of this module passed (a mutation audit's).


def test_a_saved_fraction_curve_without_steps_counts_h1_as_a_ceiling():
    # Mutant `float(h) >= 1.0` -> `> 1.0`: a curve saved without horizon_step/final_step had its
    # h = 1 (the final snapshot, which defines the target) judged as a prediction.
    curve = xr.Dataset(coords={"horizon": [0.0, 0.5, 1.0]}, attrs={"horizon_unit": "fraction"})
    assert ceiling_horizons(curve) == [False, False, True]
    steps = xr.Dataset(coords={"horizon": [0.0, 1.0]}, attrs={"horizon_unit": "step"})
    assert ceiling_horizons(steps) == [False, False]  # step 1 is no fraction of a run


def test_the_null_rate_is_over_the_permutations_that_could_be_judged():
    # Mutant `k / m` -> `k / n` in the percentage: 1 hit of the 4 judged permutations is 25%,
    # not 10% of all 10 (the unjudged ones could never have fired).
    got = null_count({"null_readable": 1, "null_permutations": 10, "null_judged": 4})
    assert got.startswith("1 of the 4 permutations it could judge (25%; 6 of 10 could not be: ")
    assert null_count({"null_readable": 3, "null_permutations": 4}) == "3 of 4 permutations (75%)"


def test_a_curve_saved_under_an_older_criterion_says_so(planted):
    # A curve saved before the fold-by-fold test keeps that rule's answer and null count: printed
    # anew, its line is this version's, and the table said nothing of the older null count (a
    # reviewer's); the report, which quotes the saved answer, says whose it is.
    from dynamics.report.predictor import _how_early

    _, _, curve = planted
    assert "older criterion" not in predict.format_curve(curve) and "older version" not in _how_early(curve)
    old = curve.drop_vars(["gain", "gain_t", "gain_critical"]).assign_attrs(
        readable_criterion="readable: an early-training model's band (mean ± 1 sd over folds) lies wholly above ...",
        null_permutations=4, null_readable=0, null_judged=4)
    text = predict.format_curve(old)
    assert ("caution: this curve was saved judged by an older criterion (its attrs readable_criterion and "
            "readable_summary); the line above is this version's answer on its scores, and the null check below "
            "counted the older one's") in text
    assert "(The answer of an older version, which compared each model's band with each baseline's" in _how_early(old)


def test_a_curve_of_other_analysers_says_so_in_its_text_as_the_report_does(planted):
    # The report called such a curve "Stale"; its text, predict.format_curve(open_derived(...)), nothing.
    from dynamics.schema import ANALYSIS_VERSION

    _, _, curve = planted
    assert "caution" not in predict.format_curve(curve)
    for version, which in ((ANALYSIS_VERSION - 2, f"with analysers version {ANALYSIS_VERSION - 2}"),
                           (None, "before the analysers were versioned")):
        attrs = {k: v for k, v in curve.attrs.items() if k != "analysis_version"}
        old = curve.copy()
        old.attrs = {**attrs, **({} if version is None else {"analysis_version": version})}
        lines = predict.format_curve(old).splitlines()
        assert lines.count(f"caution: this curve was computed {which}, these are version {ANALYSIS_VERSION}: its "
                           "targets may not be the roles this version finds; `dynamics predict` again recomputes it") == 1


_LINE = re.compile(r"(?:gain over the best init-only baseline in each test fold, |, gains )([-+0-9., ]+) "
                   r"\(mean (-?[0-9.]+), sd ([0-9.]+): corrected t (-?[0-9.]+) (>|<=) ([0-9.]+)\)")


def test_the_how_early_lines_readme_quotes_add_up():
    # Every how-early line README quotes prints its gains: their mean, sd and t (its stores' folds
    # are equal: n_test/n_train 1/(J - 1)) must be what those gains give, to the decimals printed,
    # and the verdict what the test says.
    text = (Path(__file__).parent.parent / "README.md").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("how early:") and "corrected t" in ln]
    assert len(lines) >= 3
    for line in lines:
        match = _LINE.search(line)
        assert match, line
        gains = [float(g) for g in match.group(1).split(", ")]
        mean, sd, t, n = corrected_t(gains, 1 / (len(gains) - 1))
        np.testing.assert_allclose([mean, sd], [float(match.group(2)), float(match.group(3))], atol=0.0011, err_msg=line)
        np.testing.assert_allclose(t, float(match.group(4)), rtol=0.02, atol=0.011, err_msg=line)
        assert float(match.group(6)) == round(float(critical_t(n)), 2), line
        assert (match.group(5) == ">") == line.startswith("how early: first readable"), line


def test_the_gains_readme_quotes_in_prose_add_up_to_their_t():
    # "by +0.086, +0.098, +0.267 and +0.167 at h=0.5 (corrected t 2.57 > 2.35 now)": a t no 4
    # equal folds give for those gains (2.44), unchecked since the test above reads only the
    # printed how-early lines (a statistics audit)
    text = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    quoted = re.findall(r"by ([-+][0-9.]+(?:, [-+][0-9.]+)*,? and [-+][0-9.]+) at h=[0-9.]+ \(corrected t (-?[0-9.]+) "
                        r"(>|<=) ([0-9.]+)", text)
    assert quoted
    for gains_text, t, verdict, bar in quoted:
        gains = [float(g) for g in re.split(r",? and |, ", gains_text)]
        _, _, got, _ = corrected_t(gains, 1 / (len(gains) - 1))
        assert abs(got - float(t)) <= 0.011, (gains_text, t, got)
        assert (got > float(bar)) == (verdict == ">")
