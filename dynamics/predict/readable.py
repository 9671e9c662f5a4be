"""How early: the first horizon at which early training beats every init-only baseline, fold by fold, beyond chance.

The curve answers "how early can a head's final role be read" only once someone decides what
"can be read" means. The criterion here is plain, and a pure function of the table's per-fold
scores, so it can be checked by hand against the printed line, which quotes them:

- An early-training model's (``linear`` or ``boosting``) *gain* in a test fold is its score
  there minus the best score any init-only baseline (``chance``, ``layer``, ``init_linear``,
  ``init_boosting``) reaches in that same fold. Each fold is compared with itself: the heads a
  fold tests set its chance level (balanced accuracy 1/k for the k classes it holds) and how
  hard it is, and that moves every model's score from fold to fold as much as any model does
  (on an audit's store chance alone read 0.25, 0.33, 0.33 and 0.5 over four folds). Comparing
  each model's mean ± sd band with each baseline's counted that shared movement as noise: a
  model ahead of every baseline by 0.09 to 0.27 in each of 4 folds read "not readable".
- The target is *readable* at a horizon when some early model's gains, over the J >= 2 folds
  where it and every baseline are scored, pass a one-sided paired t-test at `ALPHA` with
  Nadeau and Bengio's (2003) correction for the training data the folds share:
  t = mean / (sd * sqrt(1/J + n_test/n_train)) above the t distribution's 1 - `ALPHA` point
  with J - 1 degrees of freedom (sd the sample sd, ddof 1; n_test/n_train the test folds' size
  against their training folds', averaged, 1/(K - 1) for K equal folds). The folds of one
  cross-validation share most of their training rows, so their gains are not independent, and
  the plain paired t (variance sd²/J) fires far more often than its level where there is
  nothing to read; the correction widens it by that share. A mean gain within `TIE` of 0 is a
  tie, not a reading.
- Horizons whose features saw a run's final snapshot (which defines the target) are a ceiling,
  not a prediction, and are never readable; nor is a horizon where fewer than 2 folds have a
  gain.
- "Legible at initialisation" is the same test for the init-only models against the better of
  chance and layer: what step 0 alone tells beyond a head's layer.

Each horizon and early model is a test of its own, at `ALPHA` each, with no correction for how
many are tried (4 horizons and 2 models are 8): how often the line names some horizon where
there is nothing to read is what the null check measures, on the runs at hand
(``PredictOptions.null``, ``dynamics predict --null N``; README, "Predicting a head's final
role"). The table's own bands (each model's mean ± sd over the folds, `score_band`) describe its
spread for plots; the criterion does not compare them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr
from scipy import stats

from dynamics.predict.options import MODELS
from dynamics.schema import ANALYSIS_VERSION

BASELINES = ("chance", "layer", "init_linear", "init_boosting")
"""Models that know nothing of training after initialisation (a subset of `MODELS`)."""

EARLY = ("linear", "boosting")
"""Models on features of the training seen up to the horizon (the rest of `MODELS`)."""

BLIND = ("chance", "layer")
"""Baselines that know nothing of a head but its layer: what "legible at initialisation" must beat."""

INIT = ("init_linear", "init_boosting")
"""Models on the step-0 features alone."""

METRIC_RANGE = {"auroc": (0.0, 1.0), "balanced_accuracy": (0.0, 1.0), "spearman": (-1.0, 1.0)}
"""Attrs ``metric`` -> the range its fold scores lie in, where bands are capped."""

ALPHA = 0.05
"""One-sided level of each horizon's test (see the module docstring)."""

TIE = 1e-9
"""A mean gain this close to 0 is a tie: sums of a table's decimals round either way in binary
(0.1 + 0.2 is 0.30000000000000004), and gains equal in every fold have sd 0, so t = +inf."""

CRITERION = ("readable: an early-training model's gain over the best init-only baseline in each test fold (its score "
             "minus the best of chance, layer, init_linear and init_boosting in that fold) passes a one-sided paired "
             f"t-test at {ALPHA:g} over the folds, corrected for the training data they share (Nadeau and Bengio "
             "2003: t = mean / (sd sqrt(1/J + n_test/n_train)), J - 1 df); a horizon whose features see a run's final "
             "snapshot is a ceiling, never readable; each horizon and model a test of its own, uncorrected for how "
             "many are tried: the null check measures how often some fires on these runs")
"""The criterion in one line, stored with the curve (attrs ``readable_criterion``)."""


@dataclass(frozen=True)
class Readable:
    """The how-early answer of one curve."""

    readable: tuple[bool, ...]
    """Per horizon (in curve order): does the criterion hold there."""
    horizon: float | None
    """The first horizon where it holds; None when it holds nowhere (or cannot be judged)."""
    model: str | None
    """The early model whose gains pass at `horizon` (the one with the larger t)."""
    baseline: str | None
    """The baseline with the highest mean score at `horizon` (at the nearest miss when none is readable)."""
    low: np.ndarray
    """(horizon, model) mean - sd of the scores, capped to the metric's range; NaN without a spread."""
    high: np.ndarray
    """(horizon, model) mean + sd capped likewise."""
    gain: np.ndarray
    """(horizon, early model, fold) the early model's score minus the best baseline's in that fold
    (NaN where the fold lacks a score of either, or the horizon is a ceiling)."""
    gain_t: np.ndarray
    """(horizon, early model) the corrected t of those gains (NaN under 2 folds)."""
    gain_critical: np.ndarray
    """(horizon, early model) the t it must pass: the 1 - `ALPHA` point with J - 1 df."""
    line: str
    """The answer in one line, with its numbers."""
    judged: bool
    """Some horizon had gains to test (False: every horizon a ceiling, or under 2 folds)."""
    legible: str | None = None
    """The init-only model the line names as "legible at initialisation", where it says so."""


def saved_cautions(curve: xr.Dataset) -> list[str]:
    """What `format_curve` adds, under its how-early line, of a curve saved by another version."""
    a, lines = curve.attrs, []
    # saved by a version that judged otherwise: its stored answer and null count are that rule's (the
    # report tells it the same way; the criterion's wording may change without changing the rule)
    if "readable_summary" in a and "gain_t" not in curve:
        lines.append("caution: this curve was saved judged by an older criterion (its attrs readable_criterion and "
                     "readable_summary); the line above is this version's answer on its scores"
                     + (", and the null check below counted the older one's" if a.get("null_permutations") else "")
                     + ": `dynamics predict` again saves both anew")
    # its targets and features from other analysers: the report's "Stale" said so, the text nothing
    if (version := a.get("analysis_version")) != ANALYSIS_VERSION:
        which = "before the analysers were versioned" if version is None else f"with analysers version {version}"
        lines.append(f"caution: this curve was computed {which}, these are version {ANALYSIS_VERSION}: its targets "
                     "may not be the roles this version finds; `dynamics predict` again recomputes it")
    return lines


def score_band(mean, sd, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean ∓ sd, capped to the metric's range; NaN where the sd is (one fold, no spread).

    Examples
    --------
    >>> low, high = score_band([0.878, 0.05], [0.190, 0.1], "auroc")
    >>> [round(float(x), 3) for x in low], [round(float(x), 3) for x in high]
    ([0.688, 0.0], [1.0, 0.15])
    """
    lo, hi = METRIC_RANGE.get(metric, (-np.inf, np.inf))
    mean, sd = np.asarray(mean, dtype=np.float64), np.asarray(sd, dtype=np.float64)
    return np.clip(mean - sd, lo, hi), np.clip(mean + sd, lo, hi)


def fold_gain(scores, rivals) -> np.ndarray:
    """(..., fold) `scores` minus the best of `rivals` (..., rival, fold) in each fold; NaN where
    the fold lacks a score of either (a gain over a baseline that was not scored is no gain).

    Examples
    --------
    >>> fold_gain([0.5, 0.6, np.nan], [[0.25, 0.5, 0.3], [0.4, np.nan, 0.2]]).round(3).tolist()
    [0.1, nan, nan]
    """
    scores, rivals = np.asarray(scores, dtype=np.float64), np.asarray(rivals, dtype=np.float64)
    best = np.max(rivals, axis=-2)  # NaN wherever a rival is: the gain is undefined there
    return scores - best


def corrected_t(gain, holdout) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, sd (ddof 1), Nadeau and Bengio's corrected t, and the number of folds J, of
    (..., fold) gains over the folds that have one: t = mean / (sd sqrt(1/J + r)), r the mean over
    those folds of `holdout`, each fold's n_test / n_train: one per fold, or one number for all.
    Mean, sd and t are NaN under 2 folds; sd 0 gives t = ±inf (0 for a mean within `TIE` of 0):
    a lead every fold agrees on to the last bit passes, however small.

    Examples
    --------
    >>> mean, sd, t, n = corrected_t([0.086, 0.098, 0.267, 0.167], 1 / 3)
    >>> [round(float(x), 3) for x in (mean, sd, t)], int(n)
    ([0.154, 0.083, 2.435], 4)
    """
    gain = np.asarray(gain, dtype=np.float64)
    mean, sd, n = fold_mean_sd(gain)
    ok = np.isfinite(gain)
    ratio = np.broadcast_to(np.asarray(holdout, dtype=np.float64), gain.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        # over the J folds scored for every model: an unscored fold of another size moved it
        r = np.where(ok, ratio, 0.0).sum(axis=-1) / n
        tied = np.abs(mean) <= TIE
        t = np.where(tied, 0.0, mean / (sd * np.sqrt(1.0 / n + r)))
    few = n < 2
    return np.where(few, np.nan, mean), np.where(few, np.nan, sd), np.where(few, np.nan, t), n


def fold_mean_sd(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean (NaN with no fold), sd (ddof 1; NaN under 2 folds) and count of (..., fold) `values`
    over the folds where they are finite."""
    ok = np.isfinite(values)
    n = ok.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, values, 0.0).sum(axis=-1) / n
        sd = np.sqrt(np.where(ok, (values - mean[..., None]) ** 2, 0.0).sum(axis=-1) / (n - 1))
    return mean, np.where(n >= 2, sd, np.nan), n


def critical_t(n_folds) -> np.ndarray:
    """The one-sided 1 - `ALPHA` point of t with J - 1 df, for J folds (NaN under 2).

    Examples
    --------
    >>> [round(float(x), 3) for x in critical_t([2, 3, 4, 1])[:3]]
    [6.314, 2.92, 2.353]
    """
    n = np.asarray(n_folds, dtype=np.float64)
    return np.where(n >= 2, stats.t.ppf(1.0 - ALPHA, np.maximum(n - 1, 1)), np.nan)


def passes(gain, holdout) -> np.ndarray:
    """(...,) whether (..., fold) gains pass the test: a mean above `TIE` and a corrected t
    above the critical point, over at least 2 folds.

    Examples
    --------
    >>> passes([[0.1, 0.2, 0.15], [0.05, 0.3, -0.1], [0.1, np.nan, np.nan]], 0.5).tolist()
    [True, False, False]
    """
    mean, _, t, n = corrected_t(gain, holdout)
    return (n >= 2) & (mean > TIE) & (t > critical_t(n))  # NaN compares False


def _gains_text(gain: np.ndarray) -> str:
    """'+0.136, -0.020, +0.278' over the folds scored for every model; each rounded as printed."""
    return ", ".join(f"{g:+.3f}" for g in gain if np.isfinite(g))


def _test_text(gain: np.ndarray, holdout) -> str:
    mean, sd, t, n = (float(x) for x in corrected_t(gain, holdout))
    crit = float(critical_t(n))
    return f"mean {mean:.3f}, sd {sd:.3f}: corrected t {t:.2f} {'>' if t > crit else '<='} {crit:.2f}"


def null_count(attrs: dict) -> str:
    """"k of n permutations (p%)" from a curve's null attrs, over the permutations that could be
    judged (``null_judged``, at least 1; all of them for a curve saved without it), naming those
    that could not."""
    k, n = int(attrs["null_readable"]), int(attrs["null_permutations"])
    m = int(attrs.get("null_judged", n))
    if m == n:
        return f"{k} of {n} permutations ({k / n:.0%})"
    return (f"{k} of the {m} permutations it could judge ({k / m:.0%}; {n - m} of {n} could not be: "
            f"{NULL_UNJUDGED})")


NULL_UNJUDGED = "their folds left fewer than 2 scored for every model, e.g. one class, so they could name no horizon"


def judge(horizons: Sequence[float], scores, metric: str, *, models: Sequence[str] = MODELS,
          ceiling: Sequence[bool] | None = None, labels: Sequence[str] | None = None,
          init_only: Sequence[bool] | None = None, holdout=None) -> Readable:
    """The how-early answer from a table of per-fold scores (see the module docstring).

    Parameters
    ----------
    horizons : sequence of float
        The curve's horizons, increasing.
    scores : array (horizon, model, fold)
        ``score``: each model's metric on each test fold (NaN where undefined, e.g. one class).
    metric : str
        ``"auroc"``, ``"balanced_accuracy"`` or ``"spearman"``.
    models : sequence of str
        The model of each column; must include the `BASELINES` and `EARLY` models.
    ceiling : sequence of bool, optional
        Per horizon: its features saw a run's final snapshot. Default: none.
    labels : sequence of str, optional
        How each horizon is named in the line (default ``h=<horizon>``).
    init_only : sequence of bool, optional
        Per horizon: its features saw the initial snapshot alone, where the early-training models
        are the init baselines' twins (default: horizons <= 0).
    holdout : float or array (fold,), optional
        Each test fold's size against its training folds' (Nadeau and Bengio's n2/n1), averaged
        over the folds scored for every model; one number for all. Default 1/(K - 1) for the K folds of
        `scores`, as for equal folds.

    Returns
    -------
    Readable

    Examples
    --------
    Chance varies with each fold's classes; linear leads every baseline in each fold at h=0.5:

    >>> base = [[0.25, 0.33, 0.5]] * 2 + [[0.2, 0.3, 0.45], [0.22, 0.3, 0.4]]
    >>> at_0, at_half = base + [[0.25, 0.3, 0.5], [0.2, 0.3, 0.4]], base + [[0.45, 0.5, 0.72], [0.3, 0.3, 0.5]]
    >>> answer = judge([0.0, 0.5], [at_0, at_half], "balanced_accuracy")
    >>> answer.horizon, answer.model
    (0.5, 'linear')
    """
    models = list(models)
    scores = np.asarray(scores, dtype=np.float64)
    # An unknown metric was judged with no range cap; a table of other rows than horizons had
    # its extra rows ignored, or failed with an IndexError.
    if metric not in METRIC_RANGE:
        raise ValueError(f"judge: unknown metric {metric!r} (one of {', '.join(METRIC_RANGE)})")
    if scores.ndim != 3 or scores.shape[:2] != (len(horizons), len(models)):
        raise ValueError(f"judge: scores must be (horizon, model, fold) with {len(horizons)} horizons and "
                         f"{len(models)} models; got shape {scores.shape}")
    # Unsorted horizons named a later one "first readable"; labels or ceilings of another length
    # were an IndexError.
    if len(horizons) > 1 and not (np.diff(np.asarray(horizons, dtype=np.float64)) > 0).all():
        raise ValueError(f"judge: horizons must be increasing; got {list(horizons)}")
    ceiling = [False] * len(horizons) if ceiling is None else [bool(c) for c in ceiling]
    labels = [f"h={h:g}" for h in horizons] if labels is None else list(labels)
    init_only = [h <= 0 for h in horizons] if init_only is None else [bool(b) for b in init_only]
    if len(ceiling) != len(horizons) or len(labels) != len(horizons) or len(init_only) != len(horizons):
        raise ValueError(f"judge: one ceiling, label and init_only per horizon ({len(horizons)}); got {len(ceiling)}, "
                         f"{len(labels)} and {len(init_only)}")
    if holdout is None:
        holdout = 1.0 / max(scores.shape[2] - 1, 1)
    holdout = np.asarray(holdout, dtype=np.float64)
    if holdout.shape not in ((), (scores.shape[2],)) or not (holdout > 0).all():
        raise ValueError(f"judge: holdout must be one n_test / n_train > 0, or one per fold ({scores.shape[2]}); "
                         f"got {holdout.tolist()}")
    mean, sd, _ = fold_mean_sd(scores)  # (horizon, model)
    low, high = score_band(mean, sd, metric)
    col = {m: models.index(m) for m in (*BASELINES, *EARLY)}
    base, early = [col[m] for m in BASELINES], [col[m] for m in EARLY]

    gain = fold_gain(scores[:, early, :], scores[:, None, base, :])  # (horizon, early, fold)
    gain[np.asarray(ceiling, dtype=bool)] = np.nan  # a ceiling's scores are no prediction
    _, _, gain_t, n_gain = corrected_t(gain, holdout)  # (horizon, early)
    critical = critical_t(n_gain)
    lead = passes(gain, holdout)  # (horizon, early)
    readable = tuple(bool(row.any()) for row in lead)

    def best_baseline(i: int) -> str:
        means = mean[i, base]
        return BASELINES[int(np.nanargmax(means))] if np.isfinite(means).any() else BASELINES[0]

    def versus(i: int, e: int) -> str:
        b = best_baseline(i)
        return f"{models[e]} {mean[i, e]:.3f} against the highest baseline mean, {b} {mean[i, col[b]]:.3f}"

    judged = [i for i in range(len(horizons)) if (n_gain[i] >= 2).any()]  # t = ±inf (sd 0) is judged too
    skipped = [labels[i] for i in range(len(horizons)) if ceiling[i]]
    tail = f"; {', '.join(skipped)} not judged: features see a run's final snapshot (a ceiling)" if skipped else ""
    if not judged:
        why = "every horizon is a ceiling" if all(ceiling) else "fewer than 2 folds have a score of every model"
        return Readable(readable, None, None, None, low, high, gain, gain_t, critical,
                        f"how early: cannot be judged: {why}{tail}", False)
    if any(readable):
        i = readable.index(True)
        k = int(np.nanargmax(np.where(lead[i], gain_t[i], -np.inf)))
        later = [labels[j] for j in judged if j > i]
        also = [lab for lab, r in zip(labels, readable, strict=True) if r and lab in later]
        not_at = [lab for lab in later if lab not in also]
        rest = (f"; also at {', '.join(also)}" if also else "") + (f"; not at {', '.join(not_at)}" if not_at else "")
        line = (f"how early: first readable at {labels[i]}: {EARLY[k]}'s gain over the best init-only baseline in "
                f"each test fold, {_gains_text(gain[i, k])} ({_test_text(gain[i, k], holdout)}); "
                f"{versus(i, early[k])}{rest}{tail}")
        return Readable(readable, float(horizons[i]), EARLY[k], best_baseline(i), low, high, gain, gain_t, critical,
                        line, True)
    # none readable: say how close the nearest came, so a reader sees the size of the gap. Where
    # the features saw step 0 alone the early models are the init baselines' twins, whose gain
    # over them is at most 0 by construction: the nearest is sought after it, where there is one.
    # Nearest by the gap to the critical point, not by t: that point moves with the folds scored
    # (t 3.87 of 2 folds, 6.31 needed, was named before t 2.15 of 4, 2.35 needed).
    trained = [i for i in judged if not init_only[i]] or judged
    flat = np.full(gain_t.shape, -np.inf)
    gap = gain_t[trained] - critical[trained]  # (trained horizon, early)
    flat[trained] = np.where(np.isfinite(gap), gap, -np.inf)
    i, k = np.unravel_index(int(np.argmax(flat)), flat.shape)
    span = labels[judged[0]] if len(judged) == 1 else f"{labels[judged[0]]} to {labels[judged[-1]]}"
    twin = " (there the early-training models see the initialisation alone)" if init_only[i] else ""
    line = (f"how early: not readable at any horizon measured ({span}): no early-training model's gain over the best "
            f"init-only baseline in each test fold passes the test; nearest: {EARLY[k]} at {labels[i]}{twin}, gains "
            f"{_gains_text(gain[i, k])} ({_test_text(gain[i, k], holdout)}), {versus(i, early[k])}{tail}")
    # A target set at initialisation reads "not readable": the early models can add nothing to
    # what the init-only ones already read, which is itself an answer, and said as one.
    blind = scores[i][[col[m] for m in BLIND]]  # (blind, fold)
    init_gain = fold_gain(scores[i][[col[m] for m in INIT]], blind[None])  # (init, fold)
    init_lead = passes(init_gain, holdout)
    legible = None
    if init_lead.any():
        j = int(np.nanargmax(np.where(init_lead, corrected_t(init_gain, holdout)[2], -np.inf)))
        legible = INIT[j]
        line += (f"; it is legible at initialisation: {legible}'s gain over the better of chance and layer in each "
                 f"test fold, {_gains_text(init_gain[j])} ({_test_text(init_gain[j], holdout)}), passes it, and no "
                 f"early-training model's gain over the best baseline does")
    return Readable(readable, None, None, best_baseline(i), low, high, gain, gain_t, critical, line, True, legible)


def ceiling_horizons(curve: xr.Dataset) -> list[bool]:
    """Per horizon of `curve`: did its features see some run's final snapshot."""
    if "horizon_step" in curve and "final_step" in curve:
        seen = np.asarray(curve["horizon_step"].transpose("horizon", "run").values, dtype=np.float64)
        final = np.asarray(curve["final_step"].values, dtype=np.float64)
        return [bool(np.any(s >= final)) for s in seen]
    # a curve without the steps it saw: a fraction of 1 is the final snapshot
    whole = curve.attrs.get("horizon_unit") == "fraction"
    return [whole and float(h) >= 1.0 for h in curve["horizon"].values]


def init_only_horizons(curve: xr.Dataset) -> list[bool]:
    """Per horizon of `curve`: did its features see every run's initial snapshot alone."""
    if "n_snapshots_seen" in curve:
        seen = np.asarray(curve["n_snapshots_seen"].transpose("horizon", "run").values, dtype=np.float64)
        return [bool(np.all(s <= 1)) for s in seen]
    return [float(h) <= 0 for h in curve["horizon"].values]


def readable_of(curve: xr.Dataset, labels: Sequence[str] | None = None) -> Readable:
    """`judge` applied to a curve from `predict_runs` (its per-fold ``score``, steps seen, fold sizes)."""
    return judge(curve["horizon"].values.tolist(), curve["score"].transpose("horizon", "model", "fold").values,
                 str(curve.attrs["metric"]), models=[str(m) for m in curve["model"].values],
                 ceiling=ceiling_horizons(curve), labels=labels, init_only=init_only_horizons(curve),
                 holdout=holdout_of(curve))


def holdout_of(curve: xr.Dataset) -> np.ndarray | None:
    """Each fold's test size against its training folds' (None without ``n_test``)."""
    if "n_test" not in curve:
        return None
    n_test = np.asarray(curve["n_test"].values, dtype=np.float64)
    return holdout_ratios(n_test, curve.sizes["head_row"])


def holdout_ratios(n_test, n_rows: int) -> np.ndarray:
    """(fold,) n_test / (n_rows - n_test): Nadeau and Bengio's n2/n1 of each fold, whose training
    rows are all the rows it does not test.

    Examples
    --------
    >>> holdout_ratios([48, 16, 16], 80).tolist()
    [1.5, 0.25, 0.25]
    """
    n_test = np.asarray(n_test, dtype=np.float64)
    return n_test / (n_rows - n_test)


def null_lines(a: dict, permuted: str) -> list[str]:
    """The lines `dynamics predict` prints under a curve's answer on its null check (``--null N``),
    from the curve's attrs ``a``; none for a curve without one. ``permuted``: what the null check
    permutes ("roles", "importance ranks")."""
    lines: list[str] = []
    if a.get("null_permutations"):
        n = a["null_permutations"]
        left = a.get("null_left_out_runs", 0)
        twins = a.get("null_same_seed_runs", 0)
        # a curve saved before the seeds were kept apart has no such attr: its partner may share a seed
        seeds = "" if "null_same_seed_runs" not in a else " and another seed" if not twins else \
            " and, where its set allows, another seed"
        if a.get("null_judged", n) == 0:  # a rate of 0% here could never have been more
            lines.append(f"null check: none of the {n} permutations could be judged ({NULL_UNJUDGED}): it says "
                         f"nothing on how often the criterion reads a horizon on these runs")
        else:
            lines.append(f"null check: with each run's final {permuted} given whole to "
                         f"another run with the same heads"
                         f"{seeds}, the criterion named a readable horizon in {null_count(a)}: "
                         f"how often it reads one on these runs where there is nothing to read" + _legible_rate(a) + (
                             f" ({left} run{'s' if left > 1 else ''} labelling heads no other run labels left out of "
                             f"it)" if left else ""))
        if twins:  # their init and data order carry into the null: it may fire more often than it should
            lines.append(f"caution: {twins} of these runs are in sets where one seed holds more than half the runs, "
                         f"so they may be given the roles of a run of their own seed (its initial weights and data "
                         f"order): the null count may overstate how often the criterion fires on nothing")
    return lines


def _legible_rate(attrs: dict) -> str:
    """How often the null's curves said "legible at initialisation", for the null line (nothing for
    a curve saved before it was counted)."""
    if "null_legible" not in attrs:
        return ""
    k, n = int(attrs["null_legible"]), int(attrs.get("null_judged", attrs["null_permutations"]))
    return (f"; and said \"legible at initialisation\" in {k} of {n} ({k / n:.0%}), which a legible line on "
            f"these runs is to be read against")
