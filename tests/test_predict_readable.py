"""The how-early criterion of `dynamics.predict.readable`: `judge` on tables of known answer, and
the answer stored with the planted curve."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynamics import predict
from dynamics.predict import MODELS, PredictOptions
from dynamics.predict.readable import ceiling_horizons, null_count
from tests.test_predict import FAST, make_runs


def table(rows: dict[str, list[tuple[float, float]]]) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sd) arrays (horizon, model) in MODELS order from {model: [(mean, sd) per horizon]}."""
    cells = np.array([rows[m] for m in MODELS], dtype=float)  # (model, horizon, 2)
    return cells[..., 0].T, cells[..., 1].T


def flat(mean_sd, n=3):
    return [mean_sd] * n


# ----------------------------------------------------------------------------- known answers


def test_baselines_and_early_models_are_the_models():
    assert (*predict.BASELINES, *predict.EARLY) == MODELS


def test_how_early_is_the_first_horizon_clearly_above_every_baseline():
    # Known answer: the baselines' bands reach 0.6 at most (init_boosting 0.55 + 0.05); linear
    # clears it from h=0.2 (0.8 - 0.05 = 0.75 > 0.6), boosting never (0.62 - 0.1 = 0.52).
    mean, sd = table({"chance": flat((0.5, 0.0)), "layer": flat((0.5, 0.0)), "init_linear": flat((0.5, 0.05)),
                      "init_boosting": flat((0.55, 0.05)), "linear": [(0.5, 0.05), (0.8, 0.05), (0.9, 0.05)],
                      "boosting": flat((0.62, 0.1))})
    got = predict.judge([0.0, 0.2, 0.5], mean, sd, "auroc")
    assert got.readable == (False, True, True)
    assert (got.horizon, got.model, got.baseline) == (0.2, "linear", "init_boosting")
    assert got.line == ("how early: first readable at h=0.2: linear 0.800 (band 0.750 to 0.850) clears the best "
                        "baseline, init_boosting 0.550 (band 0.500 to 0.600); also at h=0.5")


def test_how_early_says_not_readable_when_no_band_clears_and_names_the_nearest():
    mean, sd = table({"chance": flat((0.2, 0.04)), "layer": flat((0.2, 0.04)), "init_linear": flat((0.35, 0.1)),
                      "init_boosting": flat((0.44, 0.14)), "linear": [(0.35, 0.1), (0.46, 0.13), (0.52, 0.15)],
                      "boosting": [(0.44, 0.14), (0.52, 0.14), (0.37, 0.07)]})
    got = predict.judge([0.0, 0.1, 0.5], mean, sd, "balanced_accuracy")
    assert got.readable == (False, False, False) and got.horizon is None and got.model is None
    assert got.line == ("how early: not readable at any horizon measured (h=0 to h=0.5): no early-training model's "
                        "band clears the best baseline's, init_boosting 0.440 (band 0.300 to 0.580); nearest: "
                        "boosting 0.520 (band 0.380 to 0.660) at h=0.1; it is legible at initialisation: "
                        "init_boosting 0.440 (band 0.300 to 0.580) clears the chance and layer bands, and no "
                        "early-training model clears the best baseline")


def test_the_nearest_miss_is_never_h0_where_the_early_models_are_the_init_ones():
    # At h=0 linear and boosting see the init snapshot alone: the init baselines' numbers. Their
    # narrow bands there (margin -2 sd) beat h=0.25's wider miss, and the line named "linear
    # 0.929 at h=0", the baseline's twin, as the nearest early-training model.
    mean, sd = table({"chance": [(0.5, 0.0)] * 2, "layer": [(0.55, 0.05)] * 2, "init_linear": [(0.9, 0.01)] * 2,
                      "init_boosting": [(0.85, 0.01)] * 2, "linear": [(0.9, 0.01), (0.85, 0.1)],
                      "boosting": [(0.85, 0.01), (0.8, 0.1)]})
    got = predict.judge([0.0, 0.25], mean, sd, "auroc")
    assert got.horizon is None and got.readable == (False, False)
    assert got.line.startswith("how early: not readable at any horizon measured (h=0 to h=0.25): no early-training "
                               "model's band clears the best baseline's, init_linear 0.900 (band 0.890 to 0.910); "
                               "nearest: linear 0.850 (band 0.750 to 0.950) at h=0.25; it is legible")
    # h=0 alone: named, and said to be the initialisation's
    one = predict.judge([0.0], mean[:1], sd[:1], "auroc")
    assert ("nearest: linear 0.900 (band 0.890 to 0.910) at h=0 (there the early-training models see the "
            "initialisation alone); it is legible") in one.line


def test_a_small_horizon_that_saw_step_0_alone_is_the_init_baselines_twin_too():
    # h=1e-7 of a 500-step run sees step 0 alone, as h=0 does: the guard read h > 0 and named the
    # baseline's twin at h=1e-07 (step 0) the nearest, without saying so.
    mean, sd = table({"chance": [(0.5, 0.0)] * 2, "layer": [(0.55, 0.05)] * 2, "init_linear": [(0.9, 0.01)] * 2,
                      "init_boosting": [(0.85, 0.01)] * 2, "linear": [(0.9, 0.01), (0.85, 0.1)],
                      "boosting": [(0.85, 0.01), (0.8, 0.1)]})
    got = predict.judge([1e-7, 0.25], mean, sd, "auroc", init_only=[True, False])
    assert "nearest: linear 0.850 (band 0.750 to 0.950) at h=0.25;" in got.line
    one = predict.judge([1e-7], mean[:1], sd[:1], "auroc", init_only=[True])
    assert "at h=1e-07 (there the early-training models see the initialisation alone)" in one.line
    with pytest.raises(ValueError, match=r"one ceiling, label and init_only per horizon \(2\); got 2, 2 and 1"):
        predict.judge([1e-7, 0.25], mean, sd, "auroc", init_only=[True])
    # a curve says it from the snapshots its features saw: one, at every run, is the initialisation's
    from dynamics.predict.readable import init_only_horizons

    curve = xr.Dataset({"n_snapshots_seen": (("horizon", "run"), [[1, 1], [1, 2], [3, 4]])},
                       coords={"horizon": [1e-7, 0.01, 0.2]})
    assert init_only_horizons(curve) == [True, False, False]


def test_bands_that_touch_are_no_legibility_at_initialisation():
    # chance 0.5 +- 0.1 and init_linear 0.8 +- 0.2 both end at 0.600: a tie, as everywhere else in
    # the criterion, where the line said init_linear "clears the chance and layer bands".
    mean, sd = table({"chance": flat((0.5, 0.1)), "layer": flat((0.5, 0.1)), "init_linear": flat((0.8, 0.2)),
                      "init_boosting": flat((0.5, 0.1)), "linear": flat((0.5, 0.1)), "boosting": flat((0.5, 0.1))})
    assert "legible" not in predict.judge([0.0, 0.1, 0.5], mean, sd, "auroc").line
    mean[:, MODELS.index("init_linear")] = 0.8 + 1e-6
    assert "it is legible at initialisation: init_linear" in predict.judge([0.0, 0.1, 0.5], mean, sd, "auroc").line


def test_a_target_set_at_initialisation_is_said_to_be_legible_there_not_just_unreadable():
    # Every model, the init-only ones included, reads it perfectly: "not readable" alone read as
    # "unpredictable". Where no init baseline clears chance and layer, nothing is added.
    mean, sd = table({"chance": flat((0.5, 0.0)), "layer": flat((0.5, 0.02)), "init_linear": flat((1.0, 0.0)),
                      "init_boosting": flat((0.97, 0.02)), "linear": flat((1.0, 0.0)), "boosting": flat((0.98, 0.01))})
    got = predict.judge([0.0, 0.1, 0.5], mean, sd, "auroc")
    assert got.horizon is None
    assert got.line.endswith("; it is legible at initialisation: init_linear 1.000 (band 1 to 1) clears the chance and "
                             "layer bands, and no early-training model clears the best baseline")
    assert got.legible == "init_linear"  # what the null check counts
    mean[:, MODELS.index("init_linear")] = mean[:, MODELS.index("init_boosting")] = 0.51
    none = predict.judge([0.0, 0.1, 0.5], mean, sd, "auroc")
    assert "legible" not in none.line and none.legible is None


def test_a_baseline_with_a_score_but_no_band_is_not_passed_over():
    # init_boosting scores 0.9 with no spread (one fold); linear's band clears the other
    # baselines only. Judged against the banded baselines alone it read "first readable".
    mean, sd = table({"chance": flat((0.5, 0.01), 2), "layer": flat((0.5, 0.01), 2), "init_linear": flat((0.5, 0.01), 2),
                      "init_boosting": flat((0.9, float("nan")), 2), "linear": [(0.5, 0.01), (0.7, 0.01)],
                      "boosting": [(0.5, 0.01), (0.5, 0.01)]})
    got = predict.judge([0.0, 0.1], mean, sd, "auroc")
    assert got.readable == (False, False) and got.horizon is None
    assert got.line.startswith("how early: cannot be judged")


def test_judge_refuses_an_unknown_metric_and_a_table_of_other_rows():
    mean, sd = table({m: flat((0.5, 0.1), 2) for m in MODELS})
    with pytest.raises(ValueError, match="unknown metric 'acc'"):  # judged with no range cap
        predict.judge([0.0, 0.1], mean, sd, "acc")
    with pytest.raises(ValueError, match=r"must be \(horizon, model\) = \(1, 6\); got \(2, 6\)"):  # rows ignored
        predict.judge([0.0], mean, sd, "auroc")


def test_bands_that_touch_are_a_tie_not_a_reading():
    # exact in binary: init_boosting's band tops at 0.625, linear's starts at 0.625
    mean, sd = table({"chance": flat((0.5, 0.0), 2), "layer": flat((0.5, 0.0), 2), "init_linear": flat((0.5, 0.125), 2),
                      "init_boosting": flat((0.5, 0.125), 2), "linear": [(0.5, 0.125), (0.75, 0.125)],
                      "boosting": [(0.5, 0.125), (0.625, 0.0)]})
    assert predict.judge([0.0, 0.1], mean, sd, "auroc").readable == (False, False)
    mean[1, MODELS.index("linear")] += 2 ** -10  # a hair above: now it clears
    assert predict.judge([0.0, 0.1], mean, sd, "auroc").readable == (False, True)


def test_bands_that_touch_in_decimals_are_a_tie_whichever_way_binary_rounds_them():
    # 0.8 - 0.1 is 0.7000000000000001 and 0.6 + 0.1 is 0.7 in binary: the touching bands were "readable"
    mean, sd = table({"chance": flat((0.3, 0.05), 1), "layer": flat((0.3, 0.05), 1), "init_linear": flat((0.6, 0.1), 1),
                      "init_boosting": flat((0.4, 0.05), 1), "linear": flat((0.8, 0.1), 1),
                      "boosting": flat((0.6, 0.05), 1)})
    assert 0.8 - 0.1 > 0.6 + 0.1  # the rounding the tie tolerance absorbs
    got = predict.judge([0.1], mean, sd, "balanced_accuracy")
    assert got.readable == (False,) and got.line.startswith("how early: not readable")


def test_judge_refuses_unsorted_horizons_a_negative_sd_and_labels_or_ceilings_of_another_length():
    mean, sd = table({m: flat((0.5, 0.1), 2) for m in MODELS})
    with pytest.raises(ValueError, match=r"^judge: horizons must be increasing; got \[0.5, 0.1\]$"):
        predict.judge([0.5, 0.1], mean, sd, "auroc")  # named h=0.5 "first readable", h=0.1 "also"
    with pytest.raises(ValueError, match=r"^judge: horizons must be increasing"):
        predict.judge([0.1, 0.1], mean, sd, "auroc")
    neg = sd.copy()
    neg[1, 0] = -0.5
    with pytest.raises(ValueError, match=r"^judge: an sd is negative \(-0.5\): a band needs sd >= 0$"):
        predict.judge([0.0, 0.1], mean, neg, "auroc")  # an inverted band, judged
    with pytest.raises(ValueError, match=r"^judge: one ceiling, label and init_only per horizon \(2\); got 1, 2 and 2$"):
        predict.judge([0.0, 0.1], mean, sd, "auroc", ceiling=[False])  # an IndexError
    with pytest.raises(ValueError, match=r"^judge: one ceiling, label and init_only per horizon \(2\); got 2, 3 and 2$"):
        predict.judge([0.0, 0.1], mean, sd, "auroc", labels=["a", "b", "c"])
    sd[0, 0] = np.nan  # no spread is NaN, not negative: judged as before
    predict.judge([0.0, 0.1], mean, sd, "auroc")


def test_a_ceiling_horizon_is_never_readable_and_a_later_miss_is_named():
    mean, sd = table({"chance": flat((0.5, 0.0), 4), "layer": flat((0.5, 0.0), 4), "init_linear": flat((0.5, 0.05), 4),
                      "init_boosting": flat((0.5, 0.05), 4),
                      "linear": [(0.5, 0.05), (0.7, 0.05), (0.55, 0.05), (1.0, 0.0)], "boosting": flat((0.5, 0.05), 4)})
    got = predict.judge([0.0, 0.1, 0.2, 1.0], mean, sd, "auroc", ceiling=[False, False, False, True])
    assert got.readable == (False, True, False, False) and got.horizon == 0.1
    assert got.line.endswith("; not at h=0.2; h=1 not judged: features see a run's final snapshot (a ceiling)")
    only_ceiling = predict.judge([0.0, 1.0], mean[[0, 3]], sd[[0, 3]], "auroc", ceiling=[False, True])
    assert only_ceiling.horizon is None and "not readable" in only_ceiling.line


def test_without_a_spread_nothing_is_judged():
    # one defined fold: no sd, so no band and no claim either way
    mean, sd = table({m: flat((0.9 if m in ("linear", "boosting") else 0.5, float("nan")), 2) for m in MODELS})
    got = predict.judge([0.0, 0.1], mean, sd, "auroc")
    assert got.horizon is None and got.readable == (False, False)
    assert got.line == "how early: cannot be judged: the metric has a spread on fewer than 2 folds"


def test_bands_are_capped_to_the_metrics_range():
    # with 2 or 3 folds mean + sd passes 1 (0.878 +- 0.190 reaches 1.068): no fold can score there
    low, high = predict.score_band([0.878, 0.1, 0.5], [0.190, 0.3, 0.1], "balanced_accuracy")
    np.testing.assert_allclose(low, [0.688, 0.0, 0.4])
    np.testing.assert_allclose(high, [1.0, 0.4, 0.6])
    low, high = predict.score_band([-0.95, 0.95], [0.1, 0.1], "spearman")
    np.testing.assert_allclose(low, [-1.0, 0.85])
    np.testing.assert_allclose(high, [-0.85, 1.0])


def test_how_early_on_the_tables_readme_quotes():
    # README quotes these three tables with the line this criterion gives on their numbers
    # (the command adds each horizon's step): a pure function of the means and sds.
    def quoted(text):
        rows = [r.split(" | ")[1:] for r in text.strip().splitlines()]
        return table({m: [tuple(float(x) for x in c.strip(" |").split(" +- ")) for c in r]
                      for m, r in zip(MODELS, rows, strict=True)})

    quickstart = quoted("""
| chance | 0.306 +- 0.048 | 0.306 +- 0.048 | 0.306 +- 0.048 | 0.306 +- 0.048 | 0.306 +- 0.048 |
| layer | 0.306 +- 0.048 | 0.306 +- 0.048 | 0.306 +- 0.048 | 0.306 +- 0.048 | 0.306 +- 0.048 |
| init_linear | 0.413 +- 0.253 | 0.413 +- 0.253 | 0.413 +- 0.253 | 0.413 +- 0.253 | 0.413 +- 0.253 |
| init_boosting | 0.374 +- 0.183 | 0.374 +- 0.183 | 0.374 +- 0.183 | 0.374 +- 0.183 | 0.374 +- 0.183 |
| linear | 0.413 +- 0.253 | 0.331 +- 0.142 | 0.362 +- 0.164 | 0.384 +- 0.148 | 0.495 +- 0.106 |
| boosting | 0.374 +- 0.183 | 0.385 +- 0.160 | 0.391 +- 0.191 | 0.412 +- 0.155 | 0.458 +- 0.120 |""")
    # (the command printed band 0.160 to 0.665 from its unrounded mean and sd)
    got = predict.judge([0, 0.05, 0.1, 0.2, 0.5], *quickstart, "balanced_accuracy")
    assert got.line == ("how early: not readable at any horizon measured (h=0 to h=0.5): no early-training model's "
                        "band clears the best baseline's, init_linear 0.413 (band 0.160 to 0.666); nearest: "
                        "linear 0.495 (band 0.389 to 0.601) at h=0.5")
    init_scale = quoted("""
| chance | 0.222 +- 0.048 | 0.222 +- 0.048 | 0.222 +- 0.048 | 0.222 +- 0.048 | 0.222 +- 0.048 |
| layer | 0.349 +- 0.076 | 0.349 +- 0.076 | 0.349 +- 0.076 | 0.349 +- 0.076 | 0.349 +- 0.076 |
| init_linear | 0.468 +- 0.091 | 0.468 +- 0.091 | 0.468 +- 0.091 | 0.468 +- 0.091 | 0.468 +- 0.091 |
| init_boosting | 0.496 +- 0.058 | 0.496 +- 0.058 | 0.496 +- 0.058 | 0.496 +- 0.058 | 0.496 +- 0.058 |
| linear | 0.468 +- 0.091 | 0.530 +- 0.113 | 0.489 +- 0.067 | 0.610 +- 0.115 | 0.878 +- 0.190 |
| boosting | 0.496 +- 0.058 | 0.554 +- 0.173 | 0.546 +- 0.170 | 0.661 +- 0.158 | 0.785 +- 0.285 |""")
    got = predict.judge([0, 0.05, 0.1, 0.2, 0.5], *init_scale, "balanced_accuracy")
    assert got.readable == (False, False, False, False, True)
    assert got.line == ("how early: first readable at h=0.5: linear 0.878 (band 0.688 to 1) clears the best baseline, "
                        "init_linear 0.468 (band 0.377 to 0.559)")
    head_count = quoted("""
| chance | 0.206 +- 0.042 | 0.206 +- 0.042 | 0.206 +- 0.042 | 0.206 +- 0.042 | 0.206 +- 0.042 |
| layer | 0.206 +- 0.042 | 0.206 +- 0.042 | 0.206 +- 0.042 | 0.206 +- 0.042 | 0.206 +- 0.042 |
| init_linear | 0.349 +- 0.095 | 0.349 +- 0.095 | 0.349 +- 0.095 | 0.349 +- 0.095 | 0.349 +- 0.095 |
| init_boosting | 0.437 +- 0.143 | 0.437 +- 0.143 | 0.437 +- 0.143 | 0.437 +- 0.143 | 0.437 +- 0.143 |
| linear | 0.349 +- 0.095 | 0.457 +- 0.130 | 0.451 +- 0.157 | 0.403 +- 0.120 | 0.523 +- 0.149 |
| boosting | 0.437 +- 0.143 | 0.462 +- 0.175 | 0.515 +- 0.140 | 0.476 +- 0.112 | 0.374 +- 0.069 |""")
    got = predict.judge([0, 0.05, 0.1, 0.2, 0.5], *head_count, "balanced_accuracy")
    assert got.horizon is None
    assert got.line == ("how early: not readable at any horizon measured (h=0 to h=0.5): no early-training model's "
                        "band clears the best baseline's, init_boosting 0.437 (band 0.294 to 0.580); nearest: "
                        "boosting 0.515 (band 0.375 to 0.655) at h=0.1; it is legible at initialisation: init_boosting "
                        "0.437 (band 0.294 to 0.580) clears the chance and layer bands, and no early-training model "
                        "clears the best baseline")


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
    text = predict.format_curve(curve)
    assert curve.attrs["readable_summary"] in text.splitlines()
    assert "not a significance test" in text.splitlines()[-1]


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


def test_legible_at_initialisation_needs_the_init_band_above_chance_and_layer_both():
    # Known answer: init_linear's band (0.68 to 0.72) clears chance's (0.5) but not the layer
    # prior's (0.65 to 0.75): the layer alone reads as much, so nothing is legible from the
    # init features. Clearing the lower of the two bands is not enough.
    mean, sd = table({"chance": flat((0.5, 0.0)), "layer": flat((0.7, 0.05)), "init_linear": flat((0.7, 0.02)),
                      "init_boosting": flat((0.5, 0.05)), "linear": flat((0.6, 0.05)), "boosting": flat((0.6, 0.05))})
    got = predict.judge([0.0, 0.1, 0.5], mean, sd, "auroc")
    assert got.horizon is None and got.baseline == "layer"
    assert "legible" not in got.line
    # and with the layer band below init_linear's, it is
    mean[:, MODELS.index("layer")] = 0.6
    assert "; it is legible at initialisation: init_linear 0.700" in predict.judge([0.0, 0.1, 0.5], mean, sd, "auroc").line


# Known answers that mutants of this module passed (a mutation audit's): each pins a behaviour
# a mutant changed without any other test noticing.


def _table(rows: dict) -> tuple[np.ndarray, np.ndarray]:
    cells = np.array([rows[m] for m in MODELS], dtype=float)  # (model, horizon, 2)
    return cells[..., 0].T, cells[..., 1].T


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


def test_a_spearman_band_capped_at_minus_one_prints_the_bound_itself():
    # Mutant dropping -1.0 from `_num`'s bounds: a band capped at -1 printed "-1.000", hiding
    # that the cap bit (as 0 and 1 are shown for AUROC).
    base = [(0.0, 0.1)]
    mean, sd = _table({"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
                       "linear": [(-0.5, 0.7)], "boosting": [(-0.9, 0.3)]})
    got = predict.judge([0.1], mean, sd, "spearman")
    assert got.horizon is None
    assert "nearest: linear -0.500 (band -1 to 0.200) at h=0.1" in got.line


def test_unjudged_for_want_of_a_spread_is_not_blamed_on_a_later_ceiling():
    # Mutant `all(ceiling)` -> `any(ceiling)`: with h=0.1 unjudged for lack of a spread and h=1
    # a ceiling, the line said "every horizon is a ceiling", which is false.
    mean, sd = _table({m: [(0.6, np.nan), (0.9, np.nan)] for m in MODELS})
    got = predict.judge([0.1, 1.0], mean, sd, "auroc", ceiling=[False, True])
    assert not got.judged and got.horizon is None
    assert got.line == ("how early: cannot be judged: the metric has a spread on fewer than 2 folds; h=1 not judged: "
                        "features see a run's final snapshot (a ceiling)")


def test_one_early_model_with_a_band_is_enough_to_judge_a_horizon():
    # Mutant `np.isfinite(margin[i]).any()` -> `.all()`: boosting without a spread made the
    # horizon unjudged, though linear's band clears every baseline's (0.85 > 0.6).
    base = [(0.5, 0.1)]
    mean, sd = _table({"chance": base, "layer": base, "init_linear": base, "init_boosting": base,
                       "linear": [(0.9, 0.05)], "boosting": [(0.9, np.nan)]})
    got = predict.judge([0.1], mean, sd, "auroc")
    assert got.judged and got.readable == (True,)
    assert (got.horizon, got.model, got.baseline) == (0.1, "linear", "chance")


def test_the_init_model_said_legible_is_the_best_baseline_not_a_narrower_band():
    # init_linear 0.545 (0.427 to 0.662) is the best baseline; init_boosting 0.440 (0.432 to 0.449)
    # has the higher bottom and was named, with "early training adds nothing that clears it",
    # while linear's band, 0.569 to 0.676, lies wholly above it (an audit's 150-run sweep)
    mean, sd = table({"chance": flat((0.3, 0.01)), "layer": flat((0.3, 0.01)), "init_linear": flat((0.545, 0.1175)),
                      "init_boosting": flat((0.4405, 0.0085)), "linear": flat((0.6225, 0.0535)),
                      "boosting": flat((0.5, 0.05))})
    got = predict.judge([0.0, 0.1, 0.5], mean, sd, "balanced_accuracy")
    assert got.horizon is None and got.baseline == "init_linear"
    assert got.line.endswith("; it is legible at initialisation: init_linear 0.545 (band 0.428 to 0.663) clears the "
                             "chance and layer bands, and no early-training model clears the best baseline"), got.line
