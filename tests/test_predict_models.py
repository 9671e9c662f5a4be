"""`dynamics.predict.models`: grouped folds, the scores and the baselines, by known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynamics import predict
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from dynamics.predict import MODELS, PredictError, PredictOptions, Run
from tests.test_predict import FAST, H, L, make_run, make_runs, null_band


def test_shuffled_targets_are_at_chance(planted, tables):
    _, opt, _ = planted
    rows, feats, init, splits = tables
    shuffled = np.random.default_rng(7).permutation(rows.target.values)
    preds, scores = predict.cross_validate({0.1: feats.values}, init.values, shuffled, rows.row_layer.values, splits, opt)
    band = null_band(shuffled)
    for kind in ("linear", "boosting"):
        pooled = predict.score("auroc", shuffled, preds[0, MODELS.index(kind)])
        assert abs(pooled - 0.5) < band, (kind, pooled, band)
        # the fold mean, against its own spread: within 4 standard errors of 0.5
        fold = scores[0, MODELS.index(kind)]
        assert abs(fold.mean() - 0.5) < 4 * fold.std(ddof=1) / math.sqrt(fold.size) + 1e-9


def test_a_test_rows_prediction_ignores_the_other_test_rows():
    # the imputer and scaler are fitted on training rows only: rescaling other test rows changes nothing
    from dynamics.predict import models

    rng = np.random.default_rng(0)
    x_train, y_train, x_test = rng.normal(size=(40, 5)), (rng.random(40) < 0.5).astype(float), rng.normal(size=(10, 5))
    other = x_test.copy()
    other[1:] = other[1:] * 100 + 50
    other[1:, 0] = np.nan
    for kind in ("linear", "boosting"):
        a = models._fit_predict(kind, "binary", x_train, y_train, x_test, PredictOptions(**FAST))[0]
        b = models._fit_predict(kind, "binary", x_train, y_train, other, PredictOptions(**FAST))[0]
        assert a == b, kind


@pytest.mark.parametrize("group_by", ["run", "seed", "config"])
def test_no_group_on_both_sides_of_a_split(group_by):
    # 2 configs x 4 seeds: a seed appears in both configs, a config in every seed
    runs = make_runs(n_seeds=4, configs=("lr=1", "lr=2"))
    opt = PredictOptions(group_by=group_by, n_splits=3)
    rows = predict.target_table(runs, opt)
    splits = predict.group_splits(rows.row_group.values, opt.n_splits)
    run_of = rows.row_run.values
    seed_of = {r.run_id: r.seed for r in runs}
    config_of = {r.run_id: r.config for r in runs}
    tested = np.concatenate([test for _, test in splits])
    assert np.array_equal(np.sort(tested), np.arange(run_of.size))  # the test sets partition the heads
    for train, test in splits:
        assert not set(run_of[train]) & set(run_of[test])
        assert not set(rows.row_group.values[train]) & set(rows.row_group.values[test])
        if group_by == "seed":
            assert not {seed_of[r] for r in run_of[train]} & {seed_of[r] for r in run_of[test]}
        if group_by == "config":
            assert not {config_of[r] for r in run_of[train]} & {config_of[r] for r in run_of[test]}
    assert len(splits) == {"run": 3, "seed": 3, "config": 2}[group_by]


def test_auroc_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60)
    p = np.round(rng.random(60), 1)  # ties
    assert predict.score("auroc", y, p) == pytest.approx(roc_auc_score(y, p))
    assert np.isnan(predict.score("auroc", np.ones(5), p[:5]))
    assert predict.score("auroc", y, np.zeros(60)) == 0.5


def test_spearman_matches_scipy_and_is_zero_for_constant_predictions():
    # constant predictions rank nothing: 0, not NaN, which would drop the fold from the mean
    # and leave the model scored on its better folds
    from scipy.stats import spearmanr

    y, p = np.array([3.0, 1.0, 2.0, 5.0]), np.array([0.2, 0.1, 0.4, 0.3])
    assert predict.score("spearman", y, p) == pytest.approx(spearmanr(y, p).statistic)
    assert predict.score("spearman", [1, 2, 3], [5, 5, 5]) == 0.0
    assert np.isnan(predict.score("spearman", [2, 2, 2], [1, 2, 3]))


@pytest.mark.parametrize("kind", ["linear", "boosting"])
def test_the_classifiers_weigh_each_class_equally(kind):
    # class_weight="balanced" (README): 18 heads at x = 0 of class 0 and 2 at x = 1 of class 1
    # weigh the same in all, so the problem is symmetric. The logistic fit (intercept unpenalised)
    # is then 0.5 at the midpoint; boosting, whose leaves need 3 heads and so cannot split off
    # the 2, predicts the weighted prior, 0.5, everywhere. Unweighted: 0.5 -> 0.28, and 0.1.
    from dynamics.predict.models import _fit_predict

    X, y = np.r_[np.zeros(18), np.ones(2)][:, None], np.r_[np.zeros(18), np.ones(2)].astype(int)
    p = _fit_predict(kind, "binary", X, y, np.array([[0.5], [0.0], [1.0]]), PredictOptions())
    assert p[0] == pytest.approx(0.5, abs=1e-3)
    assert p[1] + p[2] == pytest.approx(1.0, abs=1e-3)


def test_layer_baseline_is_the_layers_majority_class():
    from dynamics.predict.models import _layer_prior

    # Layer 0 is mostly class 1, layer 1 mostly class 2, class 0 spread over both, and one
    # head of class 3 in layer 0: a class-balanced rule would hand layer 0 to that one head.
    layer = np.r_[[0] * 40, [1] * 40, 0]
    y = np.r_[[1] * 25, [0] * 15, [2] * 25, [0] * 15, 3].astype(float)
    got = _layer_prior(layer, y, np.array([0, 1, 2]), "multiclass")
    assert got.tolist() == [1.0, 2.0, 0.0]  # layer 2 unseen: the overall majority (class 0, 30 heads)
    test_y = np.r_[[1] * 5, [0] * 5, [2] * 5, [0] * 5].astype(float)
    pred = _layer_prior(layer, y, np.r_[[0] * 10, [1] * 10], "multiclass")
    assert predict.score("balanced_accuracy", test_y, pred) == pytest.approx((0 + 1 + 1) / 3)


def test_binary_layer_baseline_is_each_layers_smoothed_rate():
    from dynamics.predict.models import _layer_prior

    # Layer 0 holds 3 positives of 4 heads, layer 1 holds 1 of 4: with Laplace's (k + 1) / (n + 2)
    # the layer prior is 4/6 and 2/6, and a layer the training fold lacks gets the overall rate,
    # (4 + 1) / (8 + 2) = 0.5. The overall rate everywhere would say 0.5 for every layer.
    layer = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    y = np.array([1, 1, 1, 0, 0, 0, 0, 1], dtype=float)
    got = _layer_prior(layer, y, np.array([0, 1, 2, 0]), "binary")
    np.testing.assert_allclose(got, [4 / 6, 2 / 6, 0.5, 4 / 6])
    # importance (regression): each layer's mean rank, the overall mean for an unseen layer
    ranks = np.array([0.0, 0.2, 0.4, 0.6, 1.0, 1.0, 0.8, 0.6])
    np.testing.assert_allclose(_layer_prior(layer, ranks, np.array([0, 1, 2]), "regression"), [0.3, 0.85, 0.575])


def test_fold_spread_is_the_sample_sd_over_the_folds_that_have_a_score():
    from dynamics.predict.readable import fold_mean_sd

    # Folds scoring 0.5, 0.7, 0.9 (and one undefined): mean 0.7, and the sample sd (n - 1 = 2)
    # sqrt((0.2**2 + 0 + 0.2**2) / 2) = 0.2 (the population sd would be 0.2 * sqrt(2/3) = 0.163).
    # One fold leaves the spread unknown: NaN, not a "± 0" that reads as perfect agreement; no
    # fold leaves the mean unknown too. A leading (horizon, model) shape is kept.
    mean, sd, n = fold_mean_sd(np.array([[0.5, np.nan, 0.7, 0.9], [0.6, np.nan, np.nan, np.nan],
                                          [np.nan] * 4]))
    np.testing.assert_allclose(mean[:2], [0.7, 0.6])
    np.testing.assert_allclose(sd[0], 0.2)
    assert np.isnan(sd[1]) and np.isnan(mean[2]) and np.isnan(sd[2]) and n.tolist() == [3, 1, 0]


def test_balanced_accuracy_chance_counts_the_classes_each_fold_holds():
    # A constant names one of k classes: 1/k where the fold holds k classes, 0 if it names none.
    assert predict.score("balanced_accuracy", [0, 0, 1, 1], [1, 1, 1, 1]) == 0.5
    assert predict.score("balanced_accuracy", [1, 1, 2, 2], [0, 0, 0, 0]) == 0.0
    # one class: a constant guess of it scored 1 (a chance row of 0.875 +- 0.25 with three such
    # folds of four), so the fold is not scored, as under AUROC
    assert np.isnan(predict.score("balanced_accuracy", [2, 2, 2], [2, 2, 2]))
    runs = make_runs(n_seeds=3)
    curve = predict.predict_runs(runs, PredictOptions(target="role", boosting_iter=10, n_splits=3, horizons=(0.1,)))
    folds = [curve.target.values[curve.row_fold.values == k] for k in range(curve.sizes["fold"])]
    assert curve.attrs["chance"] == pytest.approx(np.mean([1 / np.unique(f).size for f in folds]))
    # Stamped, so the report can tell a curve of older analysers (other targets) from a current one.
    assert curve.attrs["analysis_version"] == ANALYSIS_VERSION
    # and with what fitted it: another scikit-learn scores boosting on the same features otherwise
    import sklearn

    assert curve.attrs["versions"]["scikit-learn"] == sklearn.__version__
    assert set(curve.attrs["versions"]) == {"dynamics", "scikit-learn", "numpy", "scipy"}
    # every fold names the classes it tests that its training rows lack (here computed by hand)
    names = dict(zip(curve.attrs["classes"], curve.attrs["class_names"], strict=True))
    for k, f in enumerate(folds):
        rest = curve.target.values[curve.row_fold.values != k]
        lacking = [names[int(c)] for c in np.setdiff1d(f, rest)]
        assert [x.split(" (")[0] for x in str(curve.unseen_classes.values[k]).split(", ") if x] == lacking


def test_a_class_its_training_folds_lack_is_named_as_never_in_training(planted):
    # The quickstart store's one previous-token head sits in seed 0: in the fold testing seed 0
    # no model has seen that class, so it is a miss whatever the features say, and the table
    # said nothing of it. Known answer: class 2 held by seed 0 alone.
    from dynamics.predict.models import unseen_classes

    groups = np.repeat(["seed=0", "seed=1", "seed=2"], 4)
    y = np.array([0, 1, 2, 2, 0, 1, 1, 0, 0, 0, 1, 1], dtype=float)
    splits = predict.group_splits(groups, 3)
    got = {groups[test][0]: u.tolist() for (_, test), u in zip(splits, unseen_classes(y, splits), strict=True)}
    assert got == {"seed=0": [2.0], "seed=1": [], "seed=2": []}
    # the best a model of classes 0 and 1 can do on seed 0's fold: 2 of its 3 classes recalled
    assert predict.score("balanced_accuracy", y[:4], [0, 1, 1, 1]) == pytest.approx(2 / 3)
    _, _, curve = planted
    assert "never in training" not in predict.format_curve(curve)
    unseen = [""] * curve.sizes["fold"]
    unseen[1] = "1 (2 heads)"
    text = predict.format_curve(curve.assign(unseen_classes=("fold", unseen)))
    assert (f"classes never in training: 1 (2 heads) in the fold testing {curve.test_groups.values[1]} (absent from "
            "that fold's training folds: no model can predict them there, so they count as misses)") in text


def test_folds_of_one_role_are_not_scored_by_balanced_accuracy():
    # Seeds 1 and 2 grow no slash head: every head of theirs is "diffuse", and a constant guess
    # of it scored 1 on their folds, so chance read (1 + 1 + 1/2) / 3 = 0.83 and every model as much.
    fates = [np.random.default_rng(0).random((L, H)) < 0.5, np.zeros((L, H), bool), np.zeros((L, H), bool)]
    runs = [Run(f"r{s}", make_run(s, fate), seed=s) for s, fate in enumerate(fates)]
    curve = predict.predict_runs(runs, PredictOptions(target="role", horizons=(0.1,), n_splits=3, boosting_iter=10))
    one_class = [np.unique(curve.target.values[curve.row_fold.values == k]).size == 1 for k in range(3)]
    assert sorted(one_class) == [False, True, True]
    assert np.isnan(curve.score.values[..., one_class]).all()
    assert np.isfinite(curve.score.values[..., [not c for c in one_class]]).all()
    assert curve.attrs["chance"] == 0.5  # the two-class fold's alone
    assert "balanced accuracy undefined on 2 of 3 test folds (one class: " in predict.format_curve(curve)


def test_folds_where_auroc_is_undefined_are_named_and_one_fold_has_no_sd():
    # Seeds 1 and 2 grow no slash head, so their test folds hold one class and AUROC is
    # undefined there: the "mean ± sd over folds" rests on seed 0's fold alone.
    fates = [np.random.default_rng(0).random((L, H)) < 0.5, np.zeros((L, H), bool), np.zeros((L, H), bool)]
    runs = [Run(f"r{s}", make_run(s, fate), seed=s) for s, fate in enumerate(fates)]
    curve = predict.predict_runs(runs, PredictOptions(horizons=(0.1,), n_splits=3, boosting_iter=10))
    defined = np.isfinite(curve.score.values)
    assert defined.sum(axis=-1).tolist() == [[1] * len(MODELS)]
    assert np.isnan(curve.score_std.values).all()  # one fold: no spread to report, not 0
    np.testing.assert_array_equal(curve.score_mean.values, curve.score.values[defined].reshape(1, -1))
    text = predict.format_curve(curve)
    assert "AUROC undefined on 2 of 3 test folds (one class: " in text
    assert "seed=1" in text and "seed=2" in text and "means over the other 1" in text
    assert "±" not in text.split("\n", 4)[-1]  # no "± 0.000" in the table
    assert text.splitlines()[-1] == "how early: cannot be judged: fewer than 2 folds have a score of every model"
    assert curve.attrs["readable_horizon"] is None


def test_group_splits_rejects_a_single_group():
    with pytest.raises(PredictError, match="at least 2"):
        predict.group_splits(["a"] * 5)


# Known answers that mutants of this module passed (a mutation audit's): each pins a behaviour
# a mutant changed without any other test noticing.


def test_a_layer_the_training_fold_lacks_gets_the_smoothed_overall_rate():
    # Mutant `(k + 1) / (n + 2)` -> `k / n` for the overall rate: the existing answer (4 of 8) is
    # 0.5 either way. 3 positives of 8: Laplace gives 4/10, the raw rate 3/8.
    from dynamics.predict.models import _layer_prior

    layer = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    y = np.array([1, 1, 0, 0, 1, 0, 0, 0], dtype=float)
    np.testing.assert_allclose(_layer_prior(layer, y, np.array([0, 1, 2]), "binary"), [3 / 6, 2 / 6, 4 / 10])


def test_a_recorded_target_is_not_called_recomputed_when_the_analysis_is_damaged():
    # Mutant dropping `source != "recorded"`: the importance target is read from the recordings,
    # never from the analysis, yet a run whose analysis could not be opened was named as recomputed.
    runs = [Run(r.run_id, r.data, seed=r.seed, config=r.config, analysis_unreadable="checksum")
            for r in make_runs(n_seeds=2)]
    rows = predict.target_table(runs, PredictOptions(target="importance"))
    assert rows.attrs["sources"] == {"recorded": 2} and rows.attrs["analysis_unreadable"] == []


def test_boosting_leaf_size_follows_the_training_rows():
    # Mutant `n_train // 8` -> `// 4`: the default leaf is an eighth of the training rows,
    # floored at 3 and capped at 20 (80 rows: 10, not 20), unless set.
    import dataclasses

    from dynamics.predict.models import _estimator

    opt = PredictOptions()
    leaf = {n: _estimator("boosting", "binary", opt, n)[-1].min_samples_leaf for n in (8, 40, 80, 400)}
    assert leaf == {8: 3, 40: 5, 80: 10, 400: 20}
    assert _estimator("boosting", "regression", dataclasses.replace(opt, boosting_min_leaf=7), 80)[-1].min_samples_leaf == 7


def test_a_feature_missing_for_some_training_heads_is_still_used():
    # Mutant `isfinite(X).any(axis=0)` -> `.all(axis=0)`: a feature with one NaN in the training
    # fold (a token score where the token never appears for one head) was dropped, and with it
    # the only signal: linear fell back to the constant chance guess.
    from dynamics.predict.models import _fit_predict

    x = np.array([0, 1, 0, 1, 0, 1, 0, 1, np.nan, 1], dtype=float)
    y = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1], dtype=float)
    got = _fit_predict("linear", "binary", x[:, None], y, np.array([[0.0], [1.0]]), PredictOptions())
    assert got[0] < 0.3 and got[1] > 0.7


def test_the_chance_row_predicts_the_training_folds_base_rate():
    # Mutant predicting the training median: the stored chance predictions of a binary target are
    # P(positive) = the training fold's positive share (AUROC alone, 0.5 for any constant, hides it).
    from dynamics.predict.models import cross_validate

    y = np.array([1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1], dtype=float)
    groups = np.repeat(["a", "b", "c"], 4)
    splits = predict.group_splits(groups, 3)
    X = np.arange(12, dtype=float)[:, None]
    preds, _ = cross_validate({0.1: X}, X, y, np.zeros(12), splits, PredictOptions(boosting_iter=2))
    chance = preds[0, MODELS.index("chance")]
    for train, test in splits:
        np.testing.assert_allclose(chance[test], y[train].mean())


def test_spearman_needs_three_heads_in_a_fold():
    # Mutant `size < 3` -> `< 2`: two heads always rank +-1, a perfect score from nothing; the
    # table names such folds "a constant target or under 3 heads".
    assert np.isnan(predict.score("spearman", [0.0, 1.0], [0.2, 0.9]))
    assert predict.score("spearman", [0.0, 1.0, 0.5], [0.3, 0.9, 0.2]) == pytest.approx(0.5)


def test_folds_and_their_groups_are_listed_by_value_with_the_same_scores():
    # Seeds 2, 3, 10, 11 in 2 folds: GroupKFold (text order of the labels) put seeds 3 and 11 in
    # fold 0 and 2 and 10 in fold 1, listed "seed=11, seed=3" then "seed=10, seed=2". By value:
    # the fold of 2 and 10 first, each fold's seeds ascending. Which seeds share a fold, and
    # every score, stay GroupKFold's: the per-fold scores are the same numbers, moved.
    from dynamics.predict.models import group_key

    fates = {s: np.random.default_rng(s).random((L, H)) < 0.5 for s in (2, 3, 10, 11)}
    runs = [Run(f"r{s}", make_run(s, fate), seed=s) for s, fate in fates.items()]
    opt = PredictOptions(horizons=(0.1,), n_splits=2, boosting_iter=5)
    curve = predict.predict_runs(runs, opt)
    assert curve.test_groups.values.tolist() == ["seed=2, seed=10", "seed=3, seed=11"]
    for k, names in enumerate(curve.test_groups.values):  # row_fold follows its fold
        assert ", ".join(sorted(set(curve.row_group.values[curve.row_fold.values == k]), key=group_key)) == names
    groups = curve.row_group.values
    splits = predict.group_splits(groups, 2)  # the folds as GroupKFold numbers them
    assert [sorted(set(groups[test])) for _, test in splits] == [["seed=11", "seed=3"], ["seed=10", "seed=2"]]
    from dynamics.predict.features import feature_table

    rows = predict.target_table(runs, opt)
    feats = {0.1: feature_table(runs, rows, 0.1, opt, {}).values}
    _, scores = predict.cross_validate(feats, feature_table(runs, rows, None, opt, {}).values, rows["target"].values,
                                       rows["row_layer"].values, splits, opt)
    np.testing.assert_array_equal(curve.score.values, scores[..., ::-1])
    assert curve.score_mean.values.tolist() == [[float(np.mean(s[np.isfinite(s)])) for s in scores[0]]]
    assert sorted(["seed=10", "seed=9", "seed=2", "lr=1e-3"], key=group_key) == ["lr=1e-3", "seed=2", "seed=9",
                                                                                 "seed=10"]


def test_the_chance_level_leaves_out_folds_of_one_class():
    # Known answer: folds holding 1, 2 and 3 classes. The one-class fold is not scored, so the
    # level is (1/2 + 1/3) / 2; counted as 1/1 it read (1 + 1/2 + 1/3) / 3 = 0.61 (a mutation audit's).
    from dynamics.predict.models import balanced_chance

    folds = [(None, np.array([0, 1])), (None, np.array([2, 3, 4])), (None, np.array([5, 6, 7, 8]))]
    assert balanced_chance([0, 0, 1, 1, 2, 0, 1, 2, 2], folds) == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert np.isnan(balanced_chance([0, 0, 1, 1], [(None, np.array([0, 1])), (None, np.array([2, 3]))]))


def test_the_classes_of_each_test_fold_are_counted():
    # Known answer: one head of a class decides a fold's balanced accuracy, and the totals hid
    # where they sat (a statistics audit's fold of 30 none, 1 local and 1 self)
    from dynamics.predict.models import fold_classes

    got = fold_classes([3, 3, 1, 3, 0, 1], [1, 1, 1, 0, 0, 0], [0, 1, 3], ["self", "local", "none"], ["seed=0", "seed=1"])
    assert got == "seed=0: self=1, local=1, none=1; seed=1: local=1, none=2"


def test_a_folds_groups_are_all_bracketed_where_any_label_holds_a_comma():
    # from a mutation audit: bracketing only the labels with commas, or only where all had one,
    # survived (the doctest's labels all had commas or none did)
    from dynamics.predict.models import group_names

    assert group_names(["seed=0", "lr=0.01, n_heads=4"]) == "[lr=0.01, n_heads=4], [seed=0]"
    assert group_names(["seed=1", "seed=0"]) == "seed=0, seed=1"
