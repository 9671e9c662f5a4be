"""How early: the first horizon at which early training beats every init-only baseline beyond the fold spread.

The curve answers "how early can a head's final role be read" only once someone decides what
"can be read" means. The criterion here is deliberately plain, and a pure function of the
table's means and sds, so it can be checked by hand against a printed table:

- A model's *band* at a horizon is its mean ± 1 sd over the folds, capped to the metric's
  range ([0, 1] for AUROC and balanced accuracy, [-1, 1] for Spearman): no fold can score past
  it, and with 2 or 3 folds mean + sd often does (0.878 ± 0.190 reaches 1.068).
- The target is *readable* at a horizon when the band of an early-training model (``linear``
  or ``boosting``) lies wholly above the band of every baseline (``chance``, ``layer``,
  ``init_linear``, ``init_boosting``): its mean - sd exceeds each baseline's mean + sd. Bands
  that touch or overlap are a tie, not a reading (ends within `TIE` of each other touch). The
  sd is the sample sd over the folds (ddof 1).
- Horizons whose features saw a run's final snapshot (which defines the target) are a ceiling,
  not a prediction, and are never readable; nor is a horizon without a spread (a metric defined
  on fewer than 2 folds).

This is a description of the spread, not a significance test: the folds share training runs,
so their scores are not independent, and an sd over 2 or 3 folds is itself rough. No p-value
is computed and none is claimed; more seeds (more folds) are what narrows the bands. How often
the criterion fires where there is nothing to read is measured, on the runs at hand, by the
null check (``PredictOptions.null``, ``dynamics predict --null N``): with 3 folds and a few
horizons and models to try, it need not be zero (README, "Predicting a head's final role").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from dynamics.predict.options import MODELS

BASELINES = ("chance", "layer", "init_linear", "init_boosting")
"""Models that know nothing of training after initialisation (a subset of `MODELS`)."""

EARLY = ("linear", "boosting")
"""Models on features of the training seen up to the horizon (the rest of `MODELS`)."""

METRIC_RANGE = {"auroc": (0.0, 1.0), "balanced_accuracy": (0.0, 1.0), "spearman": (-1.0, 1.0)}
"""Attrs ``metric`` -> the range its fold scores lie in, where bands are capped."""

TIE = 1e-9
"""Band ends closer than this touch: a tie. Sums of a table's decimals round either way in binary
(0.8 - 0.1 is 0.7000000000000001, 0.6 + 0.1 is 0.7), which named bands that touch a reading."""

CRITERION = ("readable: an early-training model's band (mean ± 1 sd over folds, capped to the metric's range) "
             "lies wholly above every init-only baseline's; a horizon whose features see a run's final snapshot is "
             "a ceiling, never readable; a description of the fold spread, not a significance test")
"""The criterion in one line, stored with the curve (attrs ``readable_criterion``)."""


@dataclass(frozen=True)
class Readable:
    """The how-early answer of one curve."""

    readable: tuple[bool, ...]
    """Per horizon (in curve order): does the criterion hold there."""
    horizon: float | None
    """The first horizon where it holds; None when it holds nowhere (or cannot be judged)."""
    model: str | None
    """The early model whose band clears the baselines' at `horizon` (the higher, if both do)."""
    baseline: str | None
    """The baseline whose band reaches highest at `horizon` (at the best horizon when none is readable)."""
    low: np.ndarray
    """(horizon, model) mean - sd capped to the metric's range; NaN without a spread."""
    high: np.ndarray
    """(horizon, model) mean + sd capped likewise."""
    line: str
    """The answer in one line, with its numbers."""
    judged: bool
    """Some horizon had bands to compare (False: every horizon a ceiling, or no spread)."""
    legible: str | None = None
    """The init-only model the line names as "legible at initialisation", where it says so."""


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


def _num(x: float) -> str:
    # capped ends print as the bound itself ("1", not "1.000"): a reader sees where the cap bit
    return f"{x:g}" if x in (0.0, 1.0, -1.0) else f"{x:.3f}"


def _cell(model: str, mean: float, low: float, high: float) -> str:
    return f"{model} {mean:.3f} (band {_num(low)} to {_num(high)})"


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


NULL_UNJUDGED = "their folds left fewer than 2 with a spread, e.g. one class, so they could name no horizon"


def judge(horizons: Sequence[float], mean, sd, metric: str, *, models: Sequence[str] = MODELS,
          ceiling: Sequence[bool] | None = None, labels: Sequence[str] | None = None,
          init_only: Sequence[bool] | None = None) -> Readable:
    """The how-early answer from a table of means and sds (see the module docstring).

    Parameters
    ----------
    horizons : sequence of float
        The curve's horizons, increasing.
    mean, sd : array (horizon, model)
        ``score_mean`` and ``score_std`` (NaN where undefined).
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

    Returns
    -------
    Readable

    Examples
    --------
    >>> mean = [[0.5, 0.5, 0.6, 0.6, 0.6, 0.6], [0.5, 0.5, 0.6, 0.6, 0.9, 0.7]]
    >>> sd = [[0.05] * 6, [0.05] * 6]
    >>> judge([0.0, 0.1], mean, sd, "auroc").horizon
    0.1
    """
    models = list(models)
    mean, sd = np.asarray(mean, dtype=np.float64), np.asarray(sd, dtype=np.float64)
    # An unknown metric was judged with no range cap; a table of other rows than horizons had
    # its extra rows ignored, or failed with an IndexError.
    if metric not in METRIC_RANGE:
        raise ValueError(f"judge: unknown metric {metric!r} (one of {', '.join(METRIC_RANGE)})")
    want = (len(horizons), len(models))
    if mean.shape != want or sd.shape != want:
        raise ValueError(f"judge: mean and sd must be (horizon, model) = {want}; got {mean.shape} and {sd.shape}")
    # Unsorted horizons named a later one "first readable"; a negative sd judged an inverted band;
    # labels or ceilings of another length were an IndexError.
    if len(horizons) > 1 and not (np.diff(np.asarray(horizons, dtype=np.float64)) > 0).all():
        raise ValueError(f"judge: horizons must be increasing; got {list(horizons)}")
    if (sd < 0).any():
        raise ValueError(f"judge: an sd is negative ({float(sd[sd < 0][0])}): a band needs sd >= 0")
    ceiling = [False] * len(horizons) if ceiling is None else [bool(c) for c in ceiling]
    labels = [f"h={h:g}" for h in horizons] if labels is None else list(labels)
    init_only = [h <= 0 for h in horizons] if init_only is None else [bool(b) for b in init_only]
    if len(ceiling) != len(horizons) or len(labels) != len(horizons) or len(init_only) != len(horizons):
        raise ValueError(f"judge: one ceiling, label and init_only per horizon ({len(horizons)}); got {len(ceiling)}, "
                         f"{len(labels)} and {len(init_only)}")
    low, high = score_band(mean, sd, metric)
    base = [models.index(m) for m in BASELINES]
    early = [models.index(m) for m in EARLY]

    def best_baseline(i: int) -> int | None:
        tops = high[i, base]
        # A baseline with a score but no band (a spread on one fold) could be the best: nothing
        # can be said to clear it, so the horizon is not judged rather than judged without it.
        if not np.isfinite(tops).any() or (np.isfinite(mean[i, base]) & ~np.isfinite(tops)).any():
            return None
        return base[int(np.nanargmax(tops))]

    # margin: how far an early model's band bottom sits above the highest baseline band top
    margin = np.full((len(horizons), len(early)), np.nan)
    for i in range(len(horizons)):
        b = best_baseline(i)
        if b is None or ceiling[i]:
            continue
        margin[i] = low[i, early] - high[i, b]
    readable = tuple(bool(np.any(row > TIE)) for row in margin)  # NaN (no band) never clears

    judged = [i for i in range(len(horizons)) if not ceiling[i] and np.isfinite(margin[i]).any()]
    skipped = [labels[i] for i in range(len(horizons)) if ceiling[i]]
    tail = f"; {', '.join(skipped)} not judged: features see a run's final snapshot (a ceiling)" if skipped else ""
    if not judged:
        why = "every horizon is a ceiling" if all(ceiling) else "the metric has a spread on fewer than 2 folds"
        return Readable(readable, None, None, None, low, high, f"how early: cannot be judged: {why}{tail}", False)
    if any(readable):
        i = readable.index(True)
        m = early[int(np.nanargmax(margin[i]))]
        b = best_baseline(i)
        later = [labels[j] for j in judged if j > i]
        also = [lab for lab, r in zip(labels, readable, strict=True) if r and lab in later]
        not_at = [lab for lab in later if lab not in also]
        rest = (f"; also at {', '.join(also)}" if also else "") + (f"; not at {', '.join(not_at)}" if not_at else "")
        line = (f"how early: first readable at {labels[i]}: {_cell(models[m], mean[i, m], low[i, m], high[i, m])} "
                f"clears the best baseline, {_cell(models[b], mean[i, b], low[i, b], high[i, b])}{rest}{tail}")
        return Readable(readable, float(horizons[i]), models[m], models[b], low, high, line, True)
    # none readable: say how close the nearest came, so a reader sees the size of the gap. At h = 0
    # the early models see the initialisation alone, the init baselines' very features: their
    # margin there is the baseline's own band against itself, and as the "nearest" (a narrow
    # band at h = 0 beats a wide one later) it named the baseline's twin as the closest miss; so at
    # any horizon whose features saw step 0 alone (a small fraction, before the next snapshot).
    trained = [i for i in judged if not init_only[i]] or judged
    flat = np.full(margin.shape, -np.inf)
    flat[trained] = np.where(np.isfinite(margin[trained]), margin[trained], -np.inf)
    i, k = np.unravel_index(int(np.argmax(flat)), flat.shape)
    m, b = early[k], best_baseline(i)
    span = labels[judged[0]] if len(judged) == 1 else f"{labels[judged[0]]} to {labels[judged[-1]]}"
    twin = " (there the early-training models see the initialisation alone)" if init_only[i] else ""
    line = (f"how early: not readable at any horizon measured ({span}): no early-training model's band clears the best "
            f"baseline's, {_cell(models[b], mean[i, b], low[i, b], high[i, b])}; nearest: "
            f"{_cell(models[m], mean[i, m], low[i, m], high[i, m])} at {labels[i]}{twin}{tail}")
    # A target set at initialisation reads "not readable": the early models can add nothing to
    # what the init-only ones already read, which is itself an answer, and said as one.
    blind = high[i, [models.index(n) for n in ("chance", "layer")]]
    init = [k for k in (models.index(n) for n in ("init_linear", "init_boosting"))
            if np.isfinite(blind).all() and low[i, k] > blind.max() + TIE]  # touching bands are a tie
    if init:
        # the best baseline where it is one of these; else the one reaching highest, as the best is
        # chosen: by its band's bottom, a narrow band was named, which an early model did clear,
        # and "early training adds nothing that clears it" was false (linear 0.569 to 0.676 against
        # init_boosting 0.432 to 0.449, the best baseline being init_linear 0.427 to 0.662)
        k = b if b in init else max(init, key=lambda k: high[i, k])
        line += (f"; it is legible at initialisation: {_cell(models[k], mean[i, k], low[i, k], high[i, k])} clears the "
                 f"chance and layer bands, and no early-training model clears the best baseline")
    return Readable(readable, None, None, models[b], low, high, line, True, models[k] if init else None)


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
    """`judge` applied to a curve from `predict_runs` (its ``score_mean``, ``score_std``, steps seen)."""
    return judge(curve["horizon"].values.tolist(), curve["score_mean"].transpose("horizon", "model").values,
                 curve["score_std"].transpose("horizon", "model").values, str(curve.attrs["metric"]),
                 models=[str(m) for m in curve["model"].values], ceiling=ceiling_horizons(curve), labels=labels,
                 init_only=init_only_horizons(curve))


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
