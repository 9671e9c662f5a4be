"""The early-gradient predictor on constructed sweeps whose answer is planted (no training).

Each constructed run has 2 layers x 8 heads. A head's "fate" is a coin flip; fated heads
get a large q gradient norm from step 5 on (not at initialisation) and a slash pattern at
offset 3 in the final snapshot only. Everything else is noise, and the attention up to the
last snapshot is near-uniform, so only the early gradients carry the fate.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import xarray as xr

from dynamics import cli, predict, store
from dynamics.analysis import analyse_run
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from dynamics.predict import MODELS, PredictError, PredictOptions, Run

STEPS = np.array([0, 5, 10, 20, 40, 70, 100])
L, H, P, T = 2, 8, 2, 8
OFFSET = 3
H_STEP = 10  # the horizon of the leak tests: h = 0.1 of a 100-step run


def uniform_rows(rng, noise: float = 0.05) -> np.ndarray:
    """(L, H, P, T, T) causal rows, near-uniform with a little noise."""
    a = np.tril(np.ones((T, T))) * (1.0 + noise * rng.random((L, H, P, T, T)))
    a *= np.tril(np.ones((T, T)))
    return a / a.sum(-1, keepdims=True)


def slash_rows(rng, fate: np.ndarray) -> np.ndarray:
    """Final attention: fated heads put 0.9 on key i - OFFSET (queries that can see it)."""
    a = uniform_rows(rng)
    for layer, head in zip(*np.nonzero(fate), strict=True):
        for i in range(OFFSET, T):
            row = np.zeros(T)
            row[: i + 1] = 0.1 / i
            row[i - OFFSET] = 0.9
            a[layer, head, :, i] = row
    return a


def make_run(seed: int, fate: np.ndarray, *, config: str = "base", signal: float = 2.0) -> xr.Dataset:
    """One run's recordings as an in-memory dataset with the store's dims and coords."""
    rng = np.random.default_rng(1000 + seed)
    S = STEPS.size
    grad_norm = rng.lognormal(0.0, 0.3, (S, L, H, 4))
    grad_norm[1:, :, :, 0] *= np.exp(signal * fate)  # planted: q gradients of fated heads, after init
    grad_cosine = rng.uniform(-1, 1, (S, L, H, 4))
    grad_cosine[0] = np.nan  # no earlier gradient at the first snapshot
    attention = np.stack([uniform_rows(rng) for _ in range(S - 1)] + [slash_rows(rng, fate)])
    ds = xr.Dataset(
        {
            "attention": (("snapshot", "layer", "head", "probe", "query", "key"), attention.astype(np.float16)),
            "probe_tokens": (("probe", "position"), rng.integers(0, 40, (P, T))),
            "grad_norm": (("snapshot", "layer", "head", "weight"), grad_norm.astype(np.float32)),
            "grad_cosine": (("snapshot", "layer", "head", "weight"), grad_cosine.astype(np.float32)),
            "importance": (("snapshot", "layer", "head"), rng.lognormal(0, 0.5, (S, L, H)).astype(np.float32)),
            "gate": (("snapshot", "layer", "head"), np.ones((S, L, H), np.float32)),
            "loss": (("train_step",), rng.random(int(STEPS[-1])).astype(np.float32)),
        },
        coords={
            "step": ("snapshot", STEPS),
            "layer": np.arange(L),
            "head": np.arange(H),
            "weight": ["q", "k", "v", "o"],
            "train_step": np.arange(int(STEPS[-1])),
        },
        attrs={"run_id": f"r{seed}-{config}", "status": "completed"},
    )
    return ds


def make_runs(n_seeds: int = 8, configs=("base",), coin: int = 0, fate_by_seed: bool = False, **kw) -> list[Run]:
    """Runs of each config x seed; ``fate_by_seed``: a seed's heads have one fate in every config,
    as runs sharing initial weights and data order tend to."""
    rng = np.random.default_rng(coin)
    runs, fates = [], {}
    for config in configs:
        for seed in range(n_seeds):
            fate = rng.random((L, H)) < 0.5
            fate = fates.setdefault(seed, fate) if fate_by_seed else fate
            ds = make_run(seed + 100 * len(runs), fate, config=config, **kw)
            runs.append(Run(f"r{seed}-{config}", ds, seed=seed, config=config))
    return runs


def scramble_after(ds: xr.Dataset, step: float, rng, *, keep_final: bool) -> xr.Dataset:
    """Every array along snapshot/train_step past `step` replaced by a permutation of itself plus noise."""
    ds = ds.copy(deep=True)
    snap = np.flatnonzero(ds["step"].values > step)
    if keep_final:
        snap = snap[:-1]
    for name, var in ds.data_vars.items():
        values = var.values
        if "snapshot" in var.dims and snap.size:
            axis = var.dims.index("snapshot")
            block = np.take(values, snap, axis=axis)
            block = rng.permutation(block.ravel()).reshape(block.shape)
            if name != "attention":
                block = block * rng.lognormal(0, 1, block.shape)
            idx = [slice(None)] * values.ndim
            idx[axis] = snap
            values[tuple(idx)] = block
        if "train_step" in var.dims:
            late = ds["train_step"].values > step
            values[late] = rng.random(late.sum())
        ds[name] = (var.dims, values)
    return ds


def null_band(target: np.ndarray, z: float = 4.0) -> float:
    """Half-width of a z-sigma band around 0.5 for the AUROC of scores independent of the labels.

    Under the null, AUROC = U / (n1 n0) with the Mann-Whitney U, whose variance without ties
    is n1 n0 (n1 + n0 + 1) / 12 (Mann & Whitney 1947). z = 4 fails a correct predictor with
    probability ~6e-5.
    """
    n1 = int(np.sum(target == 1))
    n0 = target.size - n1
    return z * math.sqrt((n1 + n0 + 1) / (12.0 * n1 * n0))


FAST = {"boosting_iter": 20}


@pytest.fixture(scope="module")
def planted():
    """The planted sweep and its curve at h = 0 and h = 0.1 (computed once)."""
    runs = make_runs()
    opt = PredictOptions(target="slash", horizons=(0.0, 0.1), **FAST)
    return runs, opt, predict.predict_runs(runs, opt)


@pytest.fixture(scope="module")
def tables(planted):
    """The planted sweep's head rows, its features at h = 0.1 and at init, and its folds."""
    runs, opt, _ = planted
    rows = predict.target_table(runs, opt)
    feats = predict.feature_table(runs, rows, 0.1, opt)
    init = predict.feature_table(runs, rows, None, opt)
    return rows, feats, init, predict.group_splits(rows.row_group.values, opt.n_splits)


# ----------------------------------------------------------------------------- finding the plant


def test_planted_signal_is_found(planted):
    _, _, curve = planted
    at = curve.score_mean.sel(horizon=0.1)
    assert float(at.sel(model="linear")) > 0.95
    assert float(at.sel(model="boosting")) > 0.95
    assert float(curve.score_pooled.sel(horizon=0.1, model="linear")) > 0.95
    # init carries no plant: its baselines are at chance within the null band
    band = null_band(curve.target.values)
    for model in ("init_linear", "init_boosting", "layer"):
        assert abs(float(curve.score_pooled.sel(horizon=0.1, model=model)) - 0.5) < band


def test_targets_are_the_planted_fates(planted):
    runs, _, curve = planted
    for r in runs[:3]:
        fate = r.data.grad_norm.isel(snapshot=1, weight=0).values > np.exp(1.0)  # signal 2 vs noise sd 0.3
        rows = curve.row_run.values == r.run_id
        got = curve.target.values[rows].reshape(L, H)
        np.testing.assert_array_equal(got, fate.astype(float))
    assert set(curve.target_offset.values[curve.target.values == 1]) == {float(OFFSET)}


def test_baselines_in_the_table(planted):
    _, _, curve = planted
    assert list(curve.model.values) == list(MODELS)
    assert {"chance", "layer", "init_linear", "init_boosting"} <= set(curve.model.values)
    assert np.isfinite(curve.score_mean.values).all()
    np.testing.assert_allclose(curve.score.sel(model="chance").values, 0.5)  # a constant ranks nothing
    # the init baselines do not depend on the horizon
    for model in ("chance", "layer", "init_linear", "init_boosting"):
        np.testing.assert_array_equal(curve.prediction.sel(model=model, horizon=0.0),
                                      curve.prediction.sel(model=model, horizon=0.1))
    # at h = 0 the features are the init features: the models coincide with their init baselines
    for kind in ("linear", "boosting"):
        np.testing.assert_allclose(curve.prediction.sel(model=kind, horizon=0.0),
                                   curve.prediction.sel(model=f"init_{kind}", horizon=0.0))
    text = predict.format_curve(curve)
    for model in MODELS:
        assert model in text
    assert "AUROC" in text and "h=0.1" in text


def test_the_table_says_which_step_each_horizon_saw_and_marks_the_ceiling(planted):
    # A horizon is an upper bound: the features see the last snapshot at or before it (h=0.05 of
    # the demo's 500 steps saw step 16), and a horizon at the final snapshot sees the target.
    _, _, curve = planted
    text = predict.format_curve(curve)
    assert "features saw snapshots up to step h=0: 0, h=0.1: 10 (final step 100)" in text
    assert "ceiling" not in text
    seen = curve.horizon_step.values.copy()
    seen[1, 0] = 100.0  # one run seen to its end at h=0.1
    text = predict.format_curve(curve.assign(horizon_step=(curve.horizon_step.dims, seen)))
    assert "h=0.1: 10-100 (final step 100)" in text
    assert "h=0.1: features see a run's final snapshot, which defines the target: a ceiling" in text


def test_the_step_line_reads_once_with_step_horizons(planted):
    # With --unit step the horizon labels are "step 10" themselves: the line read "up to step step 10: 10".
    _, _, curve = planted
    stepped = curve.assign_coords(horizon=[0.0, 10.0]).assign_attrs(horizon_unit="step")
    text = predict.format_curve(stepped)
    assert "step step" not in text
    assert "features saw snapshots up to step, by horizon: step 0: 0, step 10: 10 (final step 100)" in text


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


# ----------------------------------------------------------------------------- how early


def table(rows: dict[str, list[tuple[float, float]]]) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sd) arrays (horizon, model) in MODELS order from {model: [(mean, sd) per horizon]}."""
    cells = np.array([rows[m] for m in MODELS], dtype=float)  # (model, horizon, 2)
    return cells[..., 0].T, cells[..., 1].T


def flat(mean_sd, n=3):
    return [mean_sd] * n


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
                        "init_boosting 0.440 (band 0.300 to 0.580) clears the chance and layer bands, and early "
                        "training adds nothing that clears it")


def test_a_target_set_at_initialisation_is_said_to_be_legible_there_not_just_unreadable():
    # Every model, the init-only ones included, reads it perfectly: "not readable" alone read as
    # "unpredictable". Where no init baseline clears chance and layer, nothing is added.
    mean, sd = table({"chance": flat((0.5, 0.0)), "layer": flat((0.5, 0.02)), "init_linear": flat((1.0, 0.0)),
                      "init_boosting": flat((0.97, 0.02)), "linear": flat((1.0, 0.0)), "boosting": flat((0.98, 0.01))})
    got = predict.judge([0.0, 0.1, 0.5], mean, sd, "auroc")
    assert got.horizon is None
    assert got.line.endswith("; it is legible at initialisation: init_linear 1.000 (band 1 to 1) clears the chance and "
                             "layer bands, and early training adds nothing that clears it")
    mean[:, MODELS.index("init_linear")] = mean[:, MODELS.index("init_boosting")] = 0.51
    assert "legible" not in predict.judge([0.0, 0.1, 0.5], mean, sd, "auroc").line


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
| init_linear | 0.418 +- 0.232 | 0.418 +- 0.232 | 0.418 +- 0.232 | 0.418 +- 0.232 | 0.418 +- 0.232 |
| init_boosting | 0.426 +- 0.155 | 0.426 +- 0.155 | 0.426 +- 0.155 | 0.426 +- 0.155 | 0.426 +- 0.155 |
| linear | 0.418 +- 0.232 | 0.260 +- 0.097 | 0.212 +- 0.023 | 0.413 +- 0.101 | 0.426 +- 0.030 |
| boosting | 0.426 +- 0.155 | 0.395 +- 0.148 | 0.358 +- 0.074 | 0.373 +- 0.053 | 0.383 +- 0.039 |""")
    got = predict.judge([0, 0.05, 0.1, 0.2, 0.5], *quickstart, "balanced_accuracy")
    assert got.line == ("how early: not readable at any horizon measured (h=0 to h=0.5): no early-training model's "
                        "band clears the best baseline's, init_linear 0.418 (band 0.186 to 0.650); nearest: "
                        "linear 0.426 (band 0.396 to 0.456) at h=0.5")  # 0.187 as printed: unrounded
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
                        "0.437 (band 0.294 to 0.580) clears the chance and layer bands, and early training adds nothing "
                        "that clears it")


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


def test_the_null_check_permutes_whole_runs_between_runs_with_the_same_heads(planted, tables):
    runs, _, _ = planted
    rows = tables[0]
    [block] = predict.same_head_blocks(rows)  # every planted run labels all L x H heads
    assert block.shape == (len(runs), L * H)
    for r, idx in enumerate(block):
        assert set(rows.row_run.values[idx]) == {runs[r].run_id}
        assert list(zip(rows.row_layer.values[idx], rows.row_head.values[idx], strict=True)) == [
            (layer, head) for layer in range(L) for head in range(H)]
    # a run that labels other heads has no peer: it is left as it is
    fewer = rows.isel(head_row=np.flatnonzero(~((rows.row_run.values == runs[0].run_id) & (rows.row_head.values == 0))))
    [block] = predict.same_head_blocks(fewer)
    assert block.shape == (len(runs) - 1, L * H)


def test_the_null_check_counts_how_often_the_criterion_fires_on_permuted_targets(planted):
    runs, opt, curve = planted
    said = []
    null = predict.predict_runs(runs, dataclasses.replace(opt, null=4), progress=said.append)
    # each stage said as it starts: with --null N, N more curves ran in silence
    assert said[1].startswith("fitting 6 models x") and said[0].startswith(f"{len(runs)} runs, ")
    assert said[2:] == [f"null check {i}/4: the curve on permuted final roles" for i in range(1, 5)]
    # the real curve is untouched by it
    np.testing.assert_array_equal(null.score.values, curve.score.values)
    assert null.attrs["null_permutations"] == 4
    # each run's plant is its own: given another run's fates, nothing early predicts them
    assert null.attrs["null_readable"] == 0
    assert predict.format_curve(null).splitlines()[-1] == (
        "null check: with each run's final roles given whole to another run with the same heads and another seed, "
        "the criterion named a readable horizon in 0 of 4 permutations (0%): how often it reads one on these runs "
        "where there is nothing to read")
    old = null.copy()
    del old.attrs["null_same_seed_runs"]  # saved before seeds were kept apart: not said to have been
    assert predict.format_curve(old).splitlines()[-1].startswith(
        "null check: with each run's final roles given whole to another run with the same heads, the criterion")
    # every run with the same fates: a permutation changes no target, so each null curve is the real
    # one, readable at h=0.1 as it is
    same = [Run(r.run_id, make_run(i, np.eye(L, H, dtype=bool)), seed=r.seed, config=r.config)
            for i, r in enumerate(runs)]
    alike = predict.predict_runs(same, dataclasses.replace(opt, null=3))
    assert alike.attrs["readable_horizon"] == 0.1 and alike.attrs["null_readable"] == 3
    with pytest.raises(predict.PredictError, match="null: permutations must be in"):
        dataclasses.replace(opt, null=-1)


def test_a_null_permutation_moves_every_run_uniformly_over_such():
    from dynamics.predict.curve import derangement

    rng = np.random.default_rng(0)
    draws = [tuple(derangement(3, rng)) for _ in range(2000)]
    # of 3! orders, (1, 2, 0) and (2, 0, 1) leave no index in place; a plain shuffle drew the other 4 too
    assert set(draws) == {(1, 2, 0), (2, 0, 1)}
    assert abs(draws.count((1, 2, 0)) / len(draws) - 0.5) < 0.05
    assert all(tuple(derangement(2, rng)) == (1, 0) for _ in range(5))
    with pytest.raises(ValueError, match="no derangement of 1 item"):
        derangement(1, rng)


@pytest.mark.parametrize("classes", [[0, 0, 1, 1], [0, 0, 0, 1, 1, 2], [None, None, None],
                                     [0] * 20 + [1] * 20 + [2] * 20])  # the last: past the rejection draws
def test_a_null_permutation_across_seeds_sends_every_run_to_another_seed(classes):
    from dynamics.predict.curve import derangement_across

    rng = np.random.default_rng(0)
    labels = np.array([f"none{i}" if c is None else str(c) for i, c in enumerate(classes)])
    draws = [derangement_across(classes, rng) for _ in range(200)]
    for order in draws:
        assert sorted(order.tolist()) == list(range(len(classes)))
        assert (labels[order] != labels).all()
    assert len({tuple(o) for o in draws}) > 1  # drawn, not one fixed order


def test_a_null_permutation_across_seeds_is_uniform_and_refused_where_none_exists():
    from dynamics.predict.curve import derangement_across

    rng = np.random.default_rng(1)
    draws = [tuple(derangement_across(["a", "a", "b", "b"], rng)) for _ in range(4000)]
    # 0 and 1 go to 2 and 3, and 2 and 3 to 0 and 1: 2 x 2 orders, equally likely
    assert set(draws) == {(2, 3, 0, 1), (2, 3, 1, 0), (3, 2, 0, 1), (3, 2, 1, 0)}
    assert all(abs(draws.count(d) / len(draws) - 0.25) < 0.03 for d in set(draws))
    assert derangement_across([0, 0, 0, 1], rng) is None  # seed 0 holds 3 of 4: one must stay in it
    assert derangement_across([7], rng) is None


def test_the_null_never_gives_a_run_the_roles_of_a_run_of_its_own_seed(monkeypatch):
    # Runs of one seed share initial weights and data order, so their heads' fates agree: a twin's
    # roles kept the run's own signal, and the null fired 8 times in 40 where it fired 0 without.
    from dynamics.predict import curve as cv

    runs = make_runs(3, configs=("a", "b", "c", "d"), fate_by_seed=True)
    seen, real = [], cv.cross_validate
    monkeypatch.setattr(cv, "cross_validate", lambda *a, **k: (seen.append(a[2].copy()), real(*a, **k))[1])
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.1,), null=4, n_splits=3, **FAST))
    row_run = curve.row_run.values
    seed = {r.run_id: r.seed for r in runs}
    y = seen[0]
    block = {r: y[row_run == r] for r in seed}
    assert len({tuple(b) for b in block.values()}) == 3  # one target set per seed: a twin's is recognisable
    for permuted in seen[1:]:
        for r in seed:
            given = [o for o in seed if np.array_equal(block[o], permuted[row_run == r])]
            assert given and all(seed[o] != seed[r] for o in given), (r, given)
    assert curve.attrs["null_same_seed_runs"] == 0
    assert "another seed" in predict.format_curve(curve).splitlines()[-1]


def test_the_null_says_when_one_seed_holds_most_runs():
    runs = make_runs(1, configs=("a", "b", "c")) + make_runs(1, configs=("d",), coin=5)
    runs = [Run(r.run_id, r.data, seed=0 if i < 3 else 1, config=r.config) for i, r in enumerate(runs)]
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.1,), null=1, group_by="run",
                                                      n_splits=2, **FAST))
    assert curve.attrs["null_same_seed_runs"] == 4
    lines = predict.format_curve(curve).splitlines()
    assert lines[-1].startswith("caution: 4 of these runs are in sets where one seed holds more than half the runs")
    # not said to have gone to another seed, where they could not
    assert lines[-2].startswith("null check: with each run's final roles given whole to another run with the same "
                                "heads and, where its set allows, another seed, the criterion")


def test_a_horizon_seeing_the_final_snapshot_is_never_named_readable():
    # the plant is in the final snapshot's attention only: h=1 reads it, and is the ceiling
    runs = make_runs(signal=0.0)
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.0, 1.0), **FAST))
    assert float(curve.score_mean.sel(horizon=1.0, model="linear")) > 0.9
    assert curve.attrs["readable_horizon"] is None and not bool(curve.readable.values[-1])


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


def test_the_null_fits_on_the_real_folds(monkeypatch):
    from dynamics.predict import curve as cv

    runs = make_runs(n_seeds=4, configs=("a", "b"))
    seen, real = [], cv.cross_validate
    monkeypatch.setattr(cv, "cross_validate", lambda *a, **k: (seen.append(a[4]), real(*a, **k))[1])
    curve = predict.predict_runs(runs, PredictOptions(target="slash", horizons=(0.1,), null=2, **FAST))
    groups = curve.row_group.values
    assert len(seen) == 3
    for splits in seen[1:]:
        assert [sorted(t) for _, t in splits] == [sorted(t) for _, t in seen[0]]
        for train, test in splits:
            assert not set(groups[train]) & set(groups[test])


def test_the_null_check_in_blocks_of_two_runs_gives_no_run_its_own_targets():
    # 8 runs, each pair missing another head at the end, so 4 blocks of 2 runs. A plain shuffle
    # left one run of a block its own fates in half the permutations, and with them its plant:
    # the criterion fired on 4 of 6 "null" curves.
    runs = []
    rng = np.random.default_rng(0)
    for seed in range(8):
        ds = make_run(seed, rng.random((L, H)) < 0.5)
        a = ds["attention"].values.astype(np.float32)
        a[-1, 1, seed // 2] = np.nan
        runs.append(Run(f"r{seed}", ds.assign(attention=(ds["attention"].dims, a)), seed=seed, config="base"))
    opt = PredictOptions(target="slash", horizons=(0.0, 0.1), null=6, **FAST)
    assert [b.shape for b in predict.same_head_blocks(predict.target_table(runs, opt))] == [(2, L * H - 1)] * 4
    curve = predict.predict_runs(runs, opt)
    assert curve.attrs["readable_horizon"] == 0.1
    assert curve.attrs["null_readable"] == 0 and curve.attrs["null_left_out_runs"] == 0


def test_a_run_with_no_peer_is_left_out_of_the_null_check(planted):
    from dynamics.predict.curve import null_folds

    runs, opt, _ = planted
    lone = runs[0].data.copy()
    a = lone["attention"].values.astype(np.float32)
    a[-1, 0, 0] = np.nan  # its head (0, 0) unlabelled: no other run labels the same heads
    runs = [Run(runs[0].run_id, lone.assign(attention=(lone["attention"].dims, a)), seed=runs[0].seed,
                config=runs[0].config)] + runs[1:]
    rows = predict.target_table(runs, opt)
    blocks = predict.same_head_blocks(rows)
    splits = predict.group_splits(rows.row_group.values, opt.n_splits)
    keep, folds = null_folds(blocks, splits, rows.sizes["head_row"])
    assert set(rows.row_run.values[keep]) == {r.run_id for r in runs[1:]}
    assert len(folds) == len(splits)
    # renumbered into the kept rows, each fold holds the kept rows it held before
    for (train, test), (new_train, new_test) in zip(splits, folds, strict=True):
        assert keep[new_test].tolist() == [i for i in test if i in set(keep)]
        assert keep[new_train].tolist() == [i for i in train if i in set(keep)]
    curve = predict.predict_runs(runs, dataclasses.replace(opt, null=2))
    assert curve.attrs["null_left_out_runs"] == 1 and curve.attrs["null_readable"] == 0
    assert predict.format_curve(curve).splitlines()[-1].endswith(
        "(1 run labelling heads no other run labels left out of it)")


def test_a_null_check_whose_runs_fill_one_fold_is_refused_before_any_fit(planted, monkeypatch):
    from dynamics.predict import curve as curve_module

    runs, opt, _ = planted
    rows = predict.target_table(runs, opt)
    _, test = predict.group_splits(rows.row_group.values, opt.n_splits)[0]
    one_fold = [np.stack([np.flatnonzero(rows.row_run.values == r) for r in dict.fromkeys(rows.row_run.values[test])])]
    monkeypatch.setattr(curve_module, "same_head_blocks", lambda rows: one_fold)  # peers all in fold 0: no fold trains on one
    monkeypatch.setattr(curve_module, "cross_validate", lambda *a, **k: pytest.fail("fitted before refusing"))
    with pytest.raises(predict.PredictError, match=(
            "^null check: the runs that share their heads with another run leave 0 of 5 folds with both training "
            "and test runs; it needs 2$")):
        predict.predict_runs(runs, dataclasses.replace(opt, null=2))


def test_a_null_check_with_nothing_to_permute_is_refused_before_any_fit(planted, monkeypatch):
    from dynamics.predict import curve as curve_module

    runs, opt, _ = planted
    monkeypatch.setattr(curve_module, "same_head_blocks", lambda rows: [])  # as when every run labels other heads
    monkeypatch.setattr(curve_module, "cross_validate", lambda *a, **k: pytest.fail("fitted before refusing"))
    with pytest.raises(predict.PredictError, match="^null check: no two runs label the same heads"):
        predict.predict_runs(runs, dataclasses.replace(opt, null=2))


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


def test_the_features_attr_lists_only_features_with_a_value(planted, tables):
    # attrs["features"] listed every column of the first horizon's table, values or not: at h=0
    # gradient agreement (NaN at the first snapshot) and, here, the sink and token scores (the
    # probe never holds the token) are NaN for every head, and no model can use them.
    runs, opt, curve = planted
    rows, _, init, _ = tables
    def with_values(t):
        return {f for f, ok in zip(t.feature.values, np.isfinite(t.values).any(0), strict=True) if ok}

    valued = set().union(*(with_values(predict.feature_table(runs, rows, h, opt)) for h in opt.horizons))
    assert set(curve.attrs["features"]) == valued
    assert set(curve.attrs["init_features"]) == with_values(init)
    assert set(curve.attrs["features_empty"]) == set(init.feature.values) - valued
    # known by construction: gradient agreement has no value at init (h=0), one for every head at h=0.1
    assert "grad_cosine_q_h" in curve.attrs["features"] and "grad_cosine_q_h" not in curve.attrs["init_features"]
    n = curve.n_feature_values.sel(feature="grad_cosine_q_h")
    assert n.values.tolist() == [0, curve.sizes["head_row"]]
    # a recording with no value at all (gradient agreement NaN in every run) is named empty, not a feature
    blank = [Run(r.run_id, r.data.assign(grad_cosine=r.data.grad_cosine * np.nan), r.seed, r.config) for r in runs[:3]]
    empty = predict.predict_runs(blank, PredictOptions(horizons=(0.1,), n_splits=3, boosting_iter=5))
    cosines = {f"grad_cosine_{w}_{s}" for w in "qkvo" for s in ("mean", "h")}
    assert cosines <= set(empty.attrs["features_empty"])
    assert not cosines & set(empty.attrs["features"])
    assert (empty.n_feature_values.sel(feature=sorted(cosines)) == 0).all()


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
    opt = PredictOptions(horizons=(0.575,))
    rows = predict.target_table(runs, opt)
    feats = predict.feature_table(runs, rows, 0.575, opt)
    assert feats.attrs["horizon_step"] == {r.run_id: 230.0 for r in runs}
    assert feats.attrs["n_snapshots"] == {r.run_id: 6 for r in runs}


def test_horizons_are_kept_in_increasing_order():
    # The curve's x axis: the report draws its lines through the horizons in stored order, so
    # "--horizons 0.5,0,0.1" drew a zigzag (0.5 -> 0 -> 0.1) and the table's columns were out of order.
    # (predict_runs builds every axis, table and stored option from these.)
    assert PredictOptions(horizons=(0.5, 0, 0.1)).horizons == (0, 0.1, 0.5)
    assert PredictOptions(horizons=(200, 20), unit="step").horizons == (20, 200)


# ----------------------------------------------------------------------------- grouping


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


def test_folds_whose_test_runs_have_a_seed_twin_in_training_are_flagged(planted):
    # Runs of one seed share init and data order: with twins (same seed, same fate, no early
    # signal) in 2 configs, --group config let init_boosting reach AUROC 0.998 by matching
    # twins, under a header that only said "holding out whole configs"; --group seed is at 0.46.
    fates = [np.random.default_rng(0).random((L, H)) < 0.5 for _ in range(2)]
    runs = [Run(f"r{s}-{c}", make_run(s, fates[s], signal=0.0), seed=s, config=c) for c in ("a", "b") for s in range(2)]
    curve = predict.predict_runs(runs, PredictOptions(horizons=(0.0,), group_by="config", boosting_iter=5))
    assert curve.attrs["folds_sharing_seeds"] == 2
    assert "caution: in 2 of 2 folds a test run shares its seed" in predict.format_curve(curve)
    _, _, by_seed = planted
    assert by_seed.attrs["folds_sharing_seeds"] == 0
    assert "caution" not in predict.format_curve(by_seed)


def test_auroc_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60)
    p = np.round(rng.random(60), 1)  # ties
    assert predict.score("auroc", y, p) == pytest.approx(roc_auc_score(y, p))
    assert np.isnan(predict.score("auroc", np.ones(5), p[:5]))
    assert predict.score("auroc", y, np.zeros(60)) == 0.5


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
    from dynamics.predict.models import _mean_sd

    # Folds scoring 0.5, 0.7, 0.9 (and one undefined): mean 0.7, and the sample sd (n - 1 = 2)
    # sqrt((0.2**2 + 0 + 0.2**2) / 2) = 0.2 (the population sd would be 0.2 * sqrt(2/3) = 0.163).
    mean, sd = _mean_sd(np.array([0.5, np.nan, 0.7, 0.9]))
    assert mean == pytest.approx(0.7) and sd == pytest.approx(0.2)
    mean, sd = _mean_sd(np.array([0.6, np.nan]))
    assert mean == 0.6 and np.isnan(sd)  # one fold: no spread


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
    assert text.splitlines()[-1] == "how early: cannot be judged: the metric has a spread on fewer than 2 folds"
    assert curve.attrs["readable_horizon"] is None


def test_config_groups_ignore_where_a_run_ran():
    from dynamics.predict.load import _config_of

    def attrs(seed, device, lr=1e-3):
        return {"config": {"train": {"seed": seed, "device": device, "threads": 2, "lr": lr}, "model": {"d_model": 64}}}

    assert _config_of({}, [], attrs(0, "cpu")) == _config_of({}, [], attrs(1, "cuda"))
    assert _config_of({}, [], attrs(0, "cpu")) != _config_of({}, [], attrs(0, "cpu", lr=3e-3))


def test_config_groups_tell_apart_configs_that_share_their_swept_values(tmp_path):
    # A second sweep of the same grid from another base config (--set train.lr=...) into one
    # store: grouped by swept values alone, "holding out whole configs (2 groups)" held out 4.
    path = tmp_path / "m.zarr"
    runs = make_runs(n_seeds=2, configs=("a", "b"))
    write_store(path, runs)
    points = {}
    for r in runs:
        lr = {"a": 1e-3, "b": 1e-2}[r.config]
        store.update_run_attrs(path, r.run_id, config={"train": {"seed": r.seed, "lr": lr}, "model": {"init_scale": 1.0}})
        points[r.run_id] = {"model.init_scale": 1.0, "train.seed": r.seed}
    store.write_sweep_index(path, {"axes": ["model.init_scale", "train.seed"], "runs": points})
    loaded = predict.load_runs(str(path), PredictOptions(group_by="config"))
    assert {r.run_id: r.group("config") for r in loaded} == {
        r.run_id: f"model.init_scale=1.0, train.lr={ {'a': 0.001, 'b': 0.01}[r.config]}" for r in runs}


def test_group_splits_rejects_a_single_group():
    with pytest.raises(PredictError, match="at least 2"):
        predict.group_splits(["a"] * 5)


# ----------------------------------------------------------------------------- other targets


def test_other_targets_and_chg_where_fitted():
    runs = make_runs(n_seeds=3)
    quick = {"boosting_iter": 10, "n_splits": 2, "horizons": (0.1,)}
    rng = np.random.default_rng(5)
    with_chg = []
    for i, r in enumerate(runs):
        ds = r.data
        if i != 1:  # two runs fitted CHG; the other has no chg_role at all
            codes = np.full((STEPS.size, L, H), -1, np.int8)
            codes[-1] = rng.integers(0, 3, (L, H))
            codes[-1, 0, 0] = -1  # one unfitted head
            ds = ds.assign(chg_role=(("snapshot", "layer", "head"), codes))
        with_chg.append(Run(r.run_id, ds, r.seed, r.config))
    chg = predict.predict_runs(with_chg, PredictOptions(target="chg", **quick))
    assert chg.attrs["metric"] == "balanced_accuracy"
    assert chg.sizes["head_row"] == 2 * (L * H - 1)  # 2 fitted runs, one unfitted head each
    assert set(chg.attrs["classes"]) <= {0, 1, 2}
    assert set(chg.attrs["class_names"]) <= {"facilitating", "irrelevant", "interfering"}
    assert runs[1].run_id not in chg.row_run.values

    imp = predict.predict_runs(runs, PredictOptions(target="importance", group_by="run", **quick))
    assert imp.attrs["metric"] == "spearman"
    assert float(imp.score.sel(model="chance").mean()) == 0.0
    ranks = imp.target.values[imp.row_run.values == runs[0].run_id].reshape(L, H)
    np.testing.assert_allclose(np.sort(ranks, axis=1), np.tile(np.linspace(0, 1, H), (L, 1)))

    role = predict.predict_runs(runs, PredictOptions(target="role", **quick))
    assert role.attrs["metric"] == "balanced_accuracy"
    assert "slash" in role.attrs["class_names"]
    assert np.isfinite(role.score.values).all()

    red = predict.final_targets(runs[0].data, "redundant")
    assert red.attrs["source"] == "computed from the final snapshot"
    assert set(np.unique(red.target.values)) <= {0.0, 1.0}


def test_stored_analysis_gives_the_same_targets():
    r = make_runs(n_seeds=1)[0]
    analysis = analyse_run(r.data).load()
    for target in ("slash", "role", "redundant"):
        stored = predict.final_targets(r.data, target, analysis)
        fresh = predict.final_targets(r.data, target)
        assert stored.attrs["source"] == "stored analysis"
        np.testing.assert_array_equal(stored.target.values, fresh.target.values)
    stale = analysis.isel(snapshot=slice(0, -1))  # analysed before the run finished
    assert predict.final_targets(r.data, "slash", stale).attrs["source"] == "computed from the final snapshot"


def flip_a_bit(array_dir) -> None:
    """Flip one bit in the middle of the first chunk file of a stored array."""
    chunk = next(p for p in sorted((array_dir / "c").rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x04
    chunk.write_bytes(bytes(data))


def test_a_damaged_stored_analysis_is_recomputed_and_named_not_read(tmp_path, capsys):
    # Without a checksum a flipped bit in a stored analysis chunk could decode to another label,
    # read as the run's target; with one the read failed with a traceback out of `predict`
    path = tmp_path / "s.zarr"
    write_store(path, make_runs(n_seeds=3))
    ids = store.list_runs(path)
    for rid in ids:
        store.write_analysis(path, rid, analyse_run(store.open_run(path, rid)))
    flip_a_bit(path / "analysis" / ids[1] / "slash_dominant")
    opts = PredictOptions(target="slash", horizons=(0.1,), n_splits=2)
    curve = predict.predict_store(str(path), opts)
    assert curve.attrs["analysis_unreadable"] == [ids[1]]
    assert curve.attrs["target_sources"] == {"stored analysis": 2, predict.targets.UNREADABLE_SOURCE: 1}
    fresh = predict.predict_store(str(path), dataclasses.replace(opts, use_stored_analysis=False))
    np.testing.assert_array_equal(curve.target.values, fresh.target.values)
    assert (f"recomputed from the final snapshot: the target of 1 run(s) whose stored analysis could not be read "
            f"(damaged; `dynamics analyse` writes it again): {ids[1]}") in predict.format_curve(curve).splitlines()
    assert fresh.attrs["analysis_unreadable"] == []
    # a chunk file lost, which zarr would read as its fill value (0: no head slash-dominant)
    next(p for p in sorted((path / "analysis" / ids[2] / "slash_dominant" / "c").rglob("*")) if p.is_file()).unlink()
    lost = predict.predict_store(str(path), opts)
    assert lost.attrs["analysis_unreadable"] == [ids[1], ids[2]]
    np.testing.assert_array_equal(lost.target.values, fresh.target.values)
    # an index coordinate, which xarray decodes as the group is opened (a ValueError out of open_analysis)
    flip_a_bit(path / "analysis" / ids[0] / "head")
    coord = predict.predict_store(str(path), opts)
    assert coord.attrs["analysis_unreadable"] == ids
    np.testing.assert_array_equal(coord.target.values, fresh.target.values)
    # without attention there is nothing to recompute it from: one line naming the run
    run = store.open_run(path, ids[1]).drop_vars("attention")
    with pytest.raises(PredictError, match=f"run {ids[1]!r}'s stored analysis cannot be read \\(ValueError: Stored "
                                           f"and computed checksum do not match"):
        predict.final_targets(run, "slash", store.open_analysis(path, ids[1]))


def test_a_run_whose_recordings_fail_their_checksum_is_left_out_and_named(tmp_path, capsys):
    # A flipped bit in a chunk predict reads (a gradient statistic at a horizon, or an index
    # coordinate read on opening) ended `dynamics predict` with zarr's traceback
    path = tmp_path / "s.zarr"
    write_store(path, make_runs(n_seeds=3))
    ids = store.list_runs(path)
    flip_a_bit(path / "runs" / ids[0] / "head")
    grad = path / "runs" / ids[1] / "grad_norm"
    chunk = next(p for p in sorted((grad / "c").rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x04
    chunk.write_bytes(bytes(data))
    assert cli.main(["predict", str(path), "--target", "slash", "--horizons", "0,0.1", "--folds", "2",
                     "--no-save", "--group", "run"]) == 2  # one run left: no curve, one line
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"dynamics: error: {path}: 1 completed run(s)")
    write_store(tmp_path / "t.zarr", make_runs(n_seeds=4))
    path = tmp_path / "t.zarr"
    ids = store.list_runs(path)
    flip_a_bit(path / "runs" / ids[0] / "grad_norm")
    assert cli.main(["predict", str(path), "--target", "slash", "--horizons", "0,0.1", "--folds", "2", "--no-save",
                     "--group", "run"]) == 1
    out, err = capsys.readouterr()
    assert f"left out: 1 run(s) that could not be read (damaged): {ids[0]}" in out.splitlines()
    assert "Traceback" not in err and (f"dynamics: {path}: run {ids[0]}: array grad_norm at snapshot 0 (step 0): its chunk "
                                       f"runs/{ids[0]}/grad_norm/c/0/0/0/0 cannot be decoded (damaged: its CRC32C "
                                       f"checksum does not match") in err


def test_use_stored_analysis_false_computes_targets_even_when_runs_carry_an_analysis():
    # predict_runs read each Run's analysis whatever the option said: a curve recording
    # use_stored_analysis=False had its targets from the stored analysis.
    runs = [dataclasses.replace(r, analysis=analyse_run(r.data).load()) for r in make_runs(n_seeds=2)]
    assert predict.target_table(runs, PredictOptions()).attrs["sources"] == {"stored analysis": 2}
    fresh = predict.target_table(runs, PredictOptions(use_stored_analysis=False))
    assert fresh.attrs["sources"] == {"computed from the final snapshot": 2}
    blind = [dataclasses.replace(r, data=r.data.drop_vars("attention")) for r in runs]
    predict.check_runs(blind, PredictOptions())  # the stored analysis gives the targets
    with pytest.raises(PredictError, match="no attention to compute it from"):  # was a KeyError mid-way
        predict.check_runs(blind, PredictOptions(use_stored_analysis=False))


def test_a_lone_head_has_no_redundancy_target():
    # It was labelled 0 ("not redundant"), a claim about a comparison that cannot be made.
    r = make_runs(n_seeds=1)[0]
    one = r.data.isel(layer=[0], head=[0])
    assert np.isnan(predict.final_targets(one, "redundant").target.values).all()
    two = r.data.isel(layer=[0], head=[0, 1])
    assert np.isfinite(predict.final_targets(two, "redundant").target.values).all()


def test_a_nan_importance_leaves_its_peers_ranked():
    # rankdata made the whole layer NaN: one head's NaN importance took every head of its layer
    # out of the importance target and out of both rank features
    from dynamics.predict.features import head_features

    imp = np.array([[[1.0, np.nan, 3.0, 2.0], [4.0, 3.0, 2.0, 1.0]]])  # (snapshot, layer, head)
    ds = xr.Dataset({"importance": (("snapshot", "layer", "head"), imp)},
                    coords={"step": ("snapshot", [100]), "layer": [0, 1], "head": [0, 1, 2, 3]})
    expected = [[0.0, np.nan, 1.0, 0.5], [1.0, 2 / 3, 1 / 3, 0.0]]
    np.testing.assert_allclose(predict.final_targets(ds, "importance").target.values, expected)
    np.testing.assert_allclose(head_features(ds).sel(feature="importance_rank_h").values, expected)
    # one importance left in a layer: no peer to rank against, so no target (a feature of 0.5)
    lone = ds.copy(data={"importance": np.array([[[1.0, np.nan, np.nan, np.nan], [4.0, 3.0, 2.0, 1.0]]])})
    assert np.isnan(predict.final_targets(lone, "importance").target.values[0]).all()
    np.testing.assert_allclose(head_features(lone).sel(feature="importance_rank_h").values[0],
                               [0.5, np.nan, np.nan, np.nan])


def test_stored_analysis_under_other_thresholds_is_not_read_as_the_target():
    # The curve records the thresholds of its options; a stored analysis made under others
    # defines another target, so the target is recomputed (or refused without attention).
    from dynamics.analysis.pipeline import AnalysisOptions

    r = make_runs(n_seeds=1)[0]
    analysis = analyse_run(r.data).load()  # kappa 0.5, cluster threshold 0.1
    strict = AnalysisOptions(kappa=0.95)  # the planted slash heads put 0.9 on their offset
    got = predict.final_targets(r.data, "slash", analysis, strict)
    assert got.attrs["source"] == "computed from the final snapshot"
    assert got.target.values.sum() == 0 < predict.final_targets(r.data, "slash", analysis).target.values.sum()
    loose = AnalysisOptions(cluster_threshold=0.9)
    np.testing.assert_array_equal(predict.final_targets(r.data, "redundant", analysis, loose).target.values,
                                  predict.final_targets(r.data, "redundant", None, loose).target.values)
    other_token = AnalysisOptions(roles=dataclasses.replace(strict.roles, token_id=3))
    assert predict.final_targets(r.data, "role", analysis, other_token).attrs["source"] != "stored analysis"
    other_induction = AnalysisOptions(roles=dataclasses.replace(strict.roles, induction=0.9))
    assert predict.final_targets(r.data, "role", analysis, other_induction).attrs["source"] != "stored analysis"
    assert predict.final_targets(r.data, "role", analysis).attrs["source"] == "stored analysis"
    with pytest.raises(PredictError, match="kappa"):
        predict.final_targets(r.data.drop_vars("attention"), "slash", analysis, strict)
    # An analysis stored by older analysers (no or another analysis_version) is not read either.
    old = analysis.copy()
    old.attrs = {k: v for k, v in analysis.attrs.items() if k != "analysis_version"}
    assert predict.final_targets(r.data, "role", old).attrs["source"] == "computed from the final snapshot"


def test_a_sink_head_is_not_a_slash_target_nor_a_long_offset_feature():
    # A sink head puts all of every row on key 0, so slash_score(T - 1) = A[T-1, 0] = 1; the
    # offset window (T // 2) must keep it out of the slash target however the target is read.
    r = make_runs(n_seeds=1)[0]
    attention = r.data["attention"].values.copy()
    sink = np.zeros((P, T, T))
    sink[..., 0] = 1.0
    attention[:, 0, 0] = sink  # every snapshot: the feature below reads an early one
    ds = r.data.assign(attention=(r.data["attention"].dims, attention))
    stored = predict.final_targets(ds, "slash", analyse_run(ds).load())
    fresh = predict.final_targets(ds, "slash")
    assert fresh.attrs["source"] == "computed from the final snapshot"
    for targets in (stored, fresh):
        assert targets.target.values[0, 0] == 0.0
        assert targets.offset.values[0, 0] <= T // 2
    np.testing.assert_array_equal(stored.target.values, fresh.target.values)
    np.testing.assert_array_equal(stored.offset.values, fresh.offset.values)
    features = predict.head_features(ds.isel(snapshot=slice(0, 3)))
    assert float(features.sel(layer=0, head=0, feature="best_offset_h")) <= T // 2


def test_bad_options_and_runs():
    with pytest.raises(PredictError, match="unknown target"):
        PredictOptions(target="nope")
    # a bare 0.1 raised "'float' object is not iterable", "0.1" named horizon '0', True became h = 1
    for bad in (0.1, "0.1"):
        with pytest.raises(PredictError, match="horizons must be a sequence of numbers"):
            PredictOptions(horizons=bad)
    with pytest.raises(PredictError, match="horizon True is not a number"):
        PredictOptions(horizons=(True,))
    with pytest.raises(PredictError, match="n_splits must be an integer; got 2.5"):  # failed inside sklearn
        PredictOptions(n_splits=2.5)
    assert PredictOptions(horizons=np.array([0.2, 0.1])).horizons == (0.1, 0.2)
    with pytest.raises(PredictError, match="out of range"):
        PredictOptions(horizons=(1.5,))
    with pytest.raises(PredictError, match="out of range"):
        PredictOptions(horizons=(-3.0,), unit="step")
    with pytest.raises(PredictError, match="horizon step 0.5 is not a whole step"):
        PredictOptions(horizons=(0.5,), unit="step")
    runs = make_runs(n_seeds=3)
    one_seed = [Run(r.run_id, r.data, 0, r.config) for r in runs]
    with pytest.raises(PredictError, match="one group"):
        predict.predict_runs(one_seed, PredictOptions())
    with pytest.raises(PredictError, match="config"):
        predict.predict_runs(runs, PredictOptions(group_by="config"))
    with pytest.raises(PredictError, match="chg_role"):
        predict.predict_runs(runs, PredictOptions(target="chg"))
    with pytest.raises(PredictError, match="ends at step"):
        predict.predict_runs(runs, PredictOptions(horizons=(500,), unit="step"))
    never = [Run(r.run_id, r.data.isel(snapshot=slice(0, -1)), r.seed, r.config) for r in runs]  # no slash yet
    with pytest.raises(PredictError, match=r"constant: .*; another --target \(role, importance, chg, redundant\) "
                                           r"may vary here$"):
        predict.predict_runs(never, PredictOptions())


# ----------------------------------------------------------------------------- store and CLI


def write_store(path, runs: list[Run], *, statuses=None) -> None:
    statuses = statuses or {}
    for r in runs:
        ds = r.data
        variables = {name: (var.dims, var.shape, str(var.dtype)) for name, var in ds.data_vars.items()}
        coords = {name: (ds[name].dims[0], ds[name].values) for name in ("step", "layer", "head", "weight", "train_step")}
        w = store.RunWriter(path, r.run_id, variables=variables, coords=coords,
                            attrs={"status": statuses.get(r.run_id, "completed"), "seed": r.seed})
        for i in range(ds.sizes["snapshot"]):
            w.write_snapshot(i, {n: v.isel(snapshot=i).values for n, v in ds.data_vars.items() if "snapshot" in v.dims})
        w.write_region("probe_tokens", 0, ds.probe_tokens.values)
        w.write_region("loss", 0, ds.loss.values)
        w.finalize()
    store.write_sweep_index(path, {"axes": ["train.seed"],
                                   "runs": {r.run_id: {"train.seed": r.seed} for r in runs}})


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("predict") / "sweep.zarr"
    write_store(path, make_runs(n_seeds=3))
    return str(path)


def test_cli_prints_the_curve_and_saves_it(small_store, capsys):
    rc = cli.main(["predict", small_store, "--target", "slash", "--horizons", "0,0.1", "--folds", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "AUROC" in out and "init_boosting" in out and "derived/predict.slash" in out
    curve = store.open_derived(small_store, predict.derived_name("slash"))
    assert dict(curve.score.sizes) == {"horizon": 2, "model": len(MODELS), "fold": 2}
    assert curve.horizon.values.tolist() == [0.0, 0.1]
    assert curve.attrs["target_sources"] == {"computed from the final snapshot": 3}
    assert curve.horizon_step.sel(horizon=0.1).values.tolist() == [10.0] * 3
    assert curve.attrs["readable_summary"] in out.splitlines()
    assert curve.readable.values.tolist() == [False, curve.attrs["readable_horizon"] == 0.1]


@pytest.mark.parametrize("streams", ["stdout", "both"])
def test_cli_saves_the_curve_when_its_reader_has_gone(small_store, tmp_path, streams):
    # `dynamics predict S | head -3`: the curve is printed before it is saved, and the closed
    # pipe ended the command there, with a BrokenPipeError traceback and nothing saved; with
    # `2>&1 | head` the progress lines on stderr did so first.
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "copy.zarr"
    shutil.copytree(small_store, path)
    proc = subprocess.Popen([sys.executable, "-m", "dynamics", "predict", str(path), "--target", "slash",
                             "--horizons", "0,0.1", "--folds", "2"],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if streams == "both" else subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    proc.stdout.close()  # long before the first line: the imports alone take a second
    err = "" if streams == "both" else proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err  # exit 1 with a traceback, unread, where it broke
    assert "Traceback" not in err
    assert store.open_derived(str(path), predict.derived_name("slash")).horizon.values.tolist() == [0.0, 0.1]


def test_cli_says_when_nothing_is_readable_and_stores_none(small_store, capsys):
    # at h=0 the early models see initialisation only: they are the init baselines, never above them
    assert cli.main(["predict", small_store, "--horizons", "0", "--folds", "3"]) == 0
    out = capsys.readouterr().out
    assert "how early: not readable at any horizon measured (h=0 (step 0)): " in out
    assert "(mean ± 1 sd over the 3 folds, capped to [0, 1])" in out
    curve = store.open_derived(small_store, predict.derived_name("slash"))
    assert curve.attrs["readable_horizon"] is None and curve.attrs["readable_model"] is None
    assert curve.readable.values.tolist() == [False]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target", "nope"], "unknown target"),
        (["--horizon", "1.5"], "out of range"),
        (["--horizons", "0,abc"], "--horizons"),
        (["--horizon", "0.1,0.2"], "--horizon: expected one number, got '0.1,0.2'"),
        (["--horizon", "1e400"], "horizon inf is not a finite number"),
        (["--null", "-1"], "error: --null: permutations must be in [0, 1000]; got -1"),  # the flag, not the field
        (["--null", "1001"], "error: --null: permutations must be in [0, 1000]; got 1001"),
        (["--horizon", "0.1", "--horizons", "0.2"], "not both"),
        (["--group", "config"], "one group"),
        (["--target", "chg"], "chg_role"),
        (["--unit", "step", "--horizon", "1000"], "ends at step"),
        (["--folds", "1"], "--folds: must be >= 2, got 1"),
    ],
)
def test_cli_bad_input_exits_2(small_store, capsys, argv, message):
    rc = cli.main(["predict", small_store, *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_run_outside_the_sweep_index_is_one_of_the_runs(tmp_path):
    # as `dynamics run` leaves one in a sweep's store: analyse and report count it, and so must predict
    runs = make_runs(n_seeds=4)
    path = tmp_path / "mixed.zarr"
    write_store(path, runs)
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {r.run_id: {"train.seed": r.seed} for r in runs[:3]}})
    loaded = predict.load_runs(str(path))
    assert [r.run_id for r in loaded] == [r.run_id for r in runs]
    assert loaded[-1].seed == runs[-1].seed


def test_runs_left_out_are_named_with_their_status_or_as_damaged(tmp_path, capsys):
    # a curve over the runs that finished says nothing of those that diverged: a reader must be told.
    # One damaged run among many refused the whole store (exit 2), and a run whose attention chunk
    # was lost was predicted from the NaN zarr reads in its place: both left out and named, exit 1.
    runs = make_runs(n_seeds=5)
    path = tmp_path / "survivors.zarr"
    write_store(path, runs, statuses={runs[1].run_id: "diverged"})
    cut, lost = runs[2].run_id, runs[3].run_id
    meta = path / "runs" / cut / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    (path / "runs" / lost / "attention" / "c" / "2" / "0" / "0" / "0" / "0" / "0").unlink()
    loaded, left_out = predict.load_store(str(path))
    assert [r.run_id for r in loaded] == [runs[0].run_id, runs[4].run_id]
    assert left_out == [f"{runs[1].run_id} (diverged)", f"{cut} (damaged)", f"{lost} (damaged)"]
    assert cli.main(["predict", str(path), "--horizon", "0", "--folds", "2"]) == 1
    out, err = capsys.readouterr()
    assert "heads in 2 runs" in out
    assert f"left out: 1 run(s) not completed, so without a final role: {runs[1].run_id} (diverged)" in out
    assert f"left out: 2 run(s) that could not be read (damaged): {cut}, {lost}" in out
    assert f"runs/{cut} exists but its metadata" in err and f"run {lost}: array attention at snapshot 2" in err
    assert err.strip().splitlines()[-1] == f"dynamics: 2 run(s) could not be read (damaged), skipped: {cut}, {lost}"
    assert store.open_derived(str(path), predict.derived_name("slash")).attrs["runs_left_out"] == left_out


def test_sweep_points_not_started_are_named_as_left_out(tmp_path, capsys):
    # predict on a sweep still running (or stopped part-way): its points not started yet are runs
    # of the sweep, as `status` and the report list them; unnamed, 3 of 5 points read as 3 of 3
    runs = make_runs(n_seeds=3)
    path = tmp_path / "partway.zarr"
    write_store(path, runs)
    points = {r.run_id: {"train.seed": r.seed} for r in runs}
    store.write_sweep_index(path, {"axes": ["train.seed"], "runs": {**points, "rnotstarted1": {"train.seed": 3},
                                                                    "rnotstarted2": {"train.seed": 4}}})
    loaded, left_out = predict.load_store(str(path))
    assert [r.run_id for r in loaded] == [r.run_id for r in runs]
    assert left_out == ["rnotstarted1 (pending)", "rnotstarted2 (pending)"]
    assert cli.main(["predict", str(path), "--horizon", "0", "--folds", "2", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "heads in 3 runs" in out
    assert ("left out: 2 run(s) not completed, so without a final role: rnotstarted1 (pending), "
            "rnotstarted2 (pending)") in out


def test_a_killed_run_is_left_out_as_stopped_not_running(tmp_path):
    # A killed run's attrs still say "running": predict named it so while status, analyse and the
    # report said "stopped"; one being trained (its lock held) is still "running".
    runs = make_runs(n_seeds=4)
    path = tmp_path / "killed.zarr"
    write_store(path, runs, statuses={runs[2].run_id: "running", runs[3].run_id: "running"})
    with store.run_lock(str(path), runs[3].run_id):
        _, left_out = predict.load_store(str(path))
    assert left_out == [f"{runs[2].run_id} (stopped)", f"{runs[3].run_id} (running)"]


def test_cli_store_problems_exit_2(tmp_path, capsys):
    assert cli.main(["predict", str(tmp_path / "missing.zarr")]) == 2
    assert "missing.zarr: the path does not exist" in capsys.readouterr().err
    runs = make_runs(n_seeds=2)
    path = tmp_path / "few.zarr"
    write_store(path, runs, statuses={runs[0].run_id: "diverged"})
    assert cli.main(["predict", str(path)]) == 2
    err = capsys.readouterr().err
    assert "1 completed run" in err and len(err.strip().splitlines()) == 1


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


def test_a_horizon_between_snapshots_is_said_to_see_the_last_snapshot_before_it():
    # Known answer: h = 0.15 of the 100-step runs is step 15, but the snapshots are at 0, 5, 10,
    # 20...: the features saw step 10 (3 snapshots), and the table must say 10, not 15.
    runs = make_runs(n_seeds=3)
    curve = predict.predict_runs(runs, PredictOptions(horizons=(0.15,), n_splits=3, boosting_iter=5))
    assert curve.horizon_step.values.tolist() == [[10.0] * 3]
    assert curve.n_snapshots_seen.values.tolist() == [[3] * 3]
    assert "features saw snapshots up to step h=0.15: 10 (final step 100)" in predict.format_curve(curve)
    assert "h=0.15 (step 10)" in curve.attrs["readable_summary"]


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
