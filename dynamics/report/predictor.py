"""The early-role predictor's metric against horizon, from ``derived/predict.<target>``."""

from __future__ import annotations

import re

import numpy as np
import xarray as xr

from dynamics import store
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from dynamics.predict.targets import probe_sensitive_note
from dynamics.report.data import _Ctx, _float_or_none, _open_derived, _Section, _why, is_damage
from dynamics.report.draw import _figure, _quiet, _save, _ticks_at

# --------------------------------------------------------------------------- predictor


_MODEL_DIMS = ("model", "predictor", "method", "estimator")
_FOLD_DIMS = ("fold", "folds", "split", "cv_fold")
# dynamics.predict.MODELS that are baselines (named here so the report needs no sklearn import).
_BASELINES = ("chance", "layer", "init_linear", "init_boosting")
# a marker per model, not colour alone: init_linear's green and init_boosting's red, both dashed,
# are one olive to a deuteranope (the how-early answer is judged against the better of them)
_MARKERS = ("o", "d", "v", "^", "o", "D", "P", "X")
_METRICS = {  # attrs["metric"] -> (axis name, unit)
    "auroc": ("AUROC", "0.5 = chance, 1 = perfect"),
    "balanced_accuracy": ("balanced accuracy", "fraction"),
    "spearman": ("Spearman correlation", "-1 to 1"),
}


def _predict_section(ctx: _Ctx) -> _Section:
    path, out = ctx.path, ctx.out
    sec = _Section("predict", "Predicting final roles from early training")
    names = [n for n in ctx.derived() if re.match(r"^predict[/._-]", n)]
    if ctx.derived_problem:
        sec.missing.append(f"Not available: the predictor curves because derived/ could not be read "
                           f"({ctx.derived_problem}).")
        return sec
    completed = sum(r.status == "completed" for r in ctx.runs)
    if not names and completed < 2:
        # `dynamics predict` refuses such a store (exit 2): the command named below would fail
        sec.missing.append(f"Not available: the predictor curves because the store has {completed} completed run(s), "
                           f"and `dynamics predict` needs at least 2 (the runs of a sweep: `dynamics sweep`).")
        return sec
    if not names:
        # the default target, slash, is refused as constant where no head ends slash-dominant (the
        # quickstart's store): the command named must be one that runs
        role = _no_slash_heads(ctx.runs)
        # and predict groups by seed: runs of one seed are one group, refused (exit 2)
        seeds = {r.seed for r in ctx.runs if r.status == "completed"}
        one_seed = len(seeds) == 1 and None not in seeds
        group = " --group run" if one_seed else ""
        why = (f"; its completed runs share one seed ({next(iter(seeds))}), so they are grouped by run, where the "
               f"default grouping by seed would have one group" if one_seed else "")
        sec.missing.append("Not available: the predictor curves because the store has no derived predict.<target> "
                           f"dataset (`dynamics predict {path}{' --target role' if role else ''}{group}` writes one, "
                           f"from the finished sweep's runs{role}{why}).")
        return sec
    for name in names:
        try:
            # small, and read as one version: loaded after the open, a `predict` saving another
            # curve in between gave this one's horizons and attributes with that one's scores
            ds = _open_derived(path, name, load=True)  # a chunk failing its checksum fails here
        except Exception as e:  # noqa: BLE001 - damaged: this curve is not shown, the others are
            why = ("a chunk failed its checksum" if store.failed_checksum(e)
                   else str(e) if isinstance(e, store.StoreError) else f"{type(e).__name__}: {e}")
            sec.missing.append(f"Not available: the predictor curve derived/{name} because it could not be read ({why}).")
            if is_damage(e):
                ctx.damaged.append(f"derived/{name}: {_why(e)}")
            continue
        target = str(ds.attrs.get("target") or re.split(r"[/._-]", name, maxsplit=1)[1]) if ds is not None else name
        if ds is None or "horizon" not in ds.dims:
            sec.missing.append(f"Not available: predictor curves for {target} because derived/{name} has no horizon dim.")
            continue
        lines, fold = _predict_lines(ds)
        if not lines and "score" in ds and fold in ds["score"].dims:
            # The curve is there, but every test fold held one class (or a constant target), as
            # `dynamics predict` says with n/a throughout: "no numeric variable" would be untrue.
            metric = _METRICS.get(str(ds.attrs.get("metric", "")), ("score",))[0]
            sec.missing.append(f"Not available: predictor curves for {target} because its {metric} is undefined on "
                               f"every test fold of derived/{name}{_undefined_folds(ds, fold, metric)}.")
            continue
        if not lines:
            sec.missing.append(f"Not available: predictor curves for {target} because derived/{name} holds no numeric "
                               f"variable over horizon.")
            continue
        fig = _figure(8.6, 4.2)
        ax = fig.subplots()
        drawn: list[tuple[str, np.ndarray, np.ndarray]] = []
        # `dynamics predict` measures one horizon by default: there the models stand side by
        # side. Over several, each model's points are set a little apart at every horizon, its
        # +-1 sd a bar: six shaded bands over one another had blurred into one grey.
        one = ds.sizes["horizon"] == 1
        dodge = _dodge(lines[0][1], len(lines)) if not one else 0.0  # (horizon,)
        for k, (label, x, mean, band, baseline) in enumerate(lines):
            # The layer prior often scores what the chance model does at every horizon: its line
            # covered chance's, whose legend entry then pointed at nothing to be seen.
            twin = next((name for name, x0, m0 in drawn
                         if np.array_equal(x0, x) and np.array_equal(m0, mean, equal_nan=True)), None)
            drawn.append((label, np.asarray(x), np.asarray(mean)))
            x = np.array([float(k)]) if one else np.asarray(x, dtype=float) + (k - (len(lines) - 1) / 2) * dodge
            notes = ["baseline"] * baseline + [f"the same scores as {twin} at every horizon"] * (twin is not None)
            # a hollow square around the marker it lies on, so both stay visible
            (line,) = ax.plot(x, mean, marker="s" if twin else _MARKERS[k % len(_MARKERS)], ms=6 if twin else 3.5,
                              mfc="none" if twin else None,
                              ls="--" if baseline else "-", lw=1.1 if baseline else 1.8,
                              label=label + (f" ({'; '.join(notes)})" if notes else ""))
            if band is not None:
                low, high = (np.asarray(b, dtype=float) for b in band)
                ok = np.isfinite(low) & np.isfinite(high)
                ax.vlines(x[ok], low[ok], high[ok], colors=line.get_color(), lw=4 if one else 2.5, alpha=0.3)
        metric_key = str(ds.attrs.get("metric", ""))
        chance, chance_text = _chance_level(ds, metric_key, fold)
        if chance is not None:
            ax.axhline(chance, color="grey", ls=":", lw=1, label=f"chance level ({chance:.2f})")
        metric, unit = _METRICS.get(metric_key, (metric_key or "score", "score"))
        horizon_unit = str(ds.attrs.get("horizon_unit") or ds["horizon"].attrs.get("units") or "step")
        ax.set_xlabel("horizon: fraction of each run's training seen by the features (fraction)"
                      if horizon_unit == "fraction" else f"horizon: training seen by the features ({horizon_unit}s)")
        if not one:
            _ticks_at(ax, [float(h) for h in ds["horizon"].values])  # the horizons measured, not 0.1 apart
        if one:
            ax.set_xticks([(len(lines) - 1) / 2], [f"{float(ds['horizon'][0]):g}"])
            ax.set_xlim(-0.7, len(lines) - 0.3)
            ax.set_xlabel(ax.get_xlabel() + "\nthe one horizon measured: its models side by side, in the legend's order")
        ax.set_ylabel(f"{metric} ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
        spread = _spread_text(ds, fold, metric)
        ceiling = _ceiling(ds, horizon_unit)
        description = ds.attrs.get("description") or target
        version = ds.attrs.get("analysis_version")
        stale = "" if version == ANALYSIS_VERSION else (
            f" Stale: this curve was computed with {'analysers of version ' + str(version) if version is not None else 'analysers older than version stamping'} "
            f"(this page: version {ANALYSIS_VERSION}), so its targets may not be the roles shown above; rerun `dynamics predict`.")
        stale += _outdated(ds, ctx)
        # Told as `dynamics predict` tells them: runs left out of the curve (survivorship), and
        # folds whose test runs share a seed with training runs (twins, not prediction).
        left_out = list(ds.attrs.get("runs_left_out") or [])
        damaged = [r for r in left_out if r.endswith(" (damaged)")]
        unfinished = [r for r in left_out if r not in damaged]
        unlabelled = list(ds.attrs.get("runs_unlabelled") or [])
        caveats = "".join(f" Left out: {len(ids)} run(s) {why} ({_first_few(ids)})." for ids, why in (
            (unfinished, "not completed, so without a final role"), (damaged, "that could not be read"),
            (unlabelled, "completed with no head labelled for this target")) if ids)
        # as `dynamics predict` says it under a role curve (ends without its period)
        caveats += "".join(f" {line[0].upper()}{line[1:]}." for line in probe_sensitive_note(ds.get("target_agreement")))
        if ds.attrs.get("folds_sharing_seeds"):
            caveats += (f" Caution: in {ds.attrs['folds_sharing_seeds']} of {ds.attrs.get('n_splits', '?')} folds a test "
                        "run shares its seed (initial weights, data order) with a training run, so scores may "
                        "overstate prediction.")
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", target)
        side = ("one horizon measured: the models side by side" if one
                else "at each horizon the models' points a little apart, in the legend's order")
        sec.figures.append((_save(fig, out, f"predict_{safe}.png"),
                            f"Predicting, for every head, the target {target!r} ({description}; derived/{name}) from "
                            f"features of the training seen up to each horizon: {metric} against horizon, one line per model"
                            f" ({side}); dashed: "
                            f"baselines (chance: a constant, the training folds' majority class or prior; layer prior; "
                            f"initialisation-only features); {chance_text}{spread}.{ceiling}{_how_early(ds)}{caveats}"
                            f"{stale}"))
    return sec


def _no_slash_heads(runs) -> str:
    """Why to name ``--target role``: no completed run's analysis has a slash-dominant head at its
    last snapshot, so predict's default target would be constant; empty where one has, or where a
    completed run has no analysis here to tell."""
    completed = [r for r in runs if r.status == "completed"]
    finals = [r.analysis["slash_dominant"].isel(snapshot=-1).values for r in completed
              if r.analysis is not None and "slash_dominant" in r.analysis]
    # every completed run seen (--no-compute leaves unanalysed ones out): else it may be false
    if not finals or len(finals) < len(completed) or any(np.nansum(np.asarray(f, dtype=float)) > 0 for f in finals):
        return ""
    return "; no completed run has a slash-dominant head, so the default target, slash, is constant there"


def _dodge(horizons: np.ndarray, n: int) -> np.ndarray:
    """Per horizon, how far apart (in horizon units) `n` models' points stand there: a small share
    of the axis, less only where a neighbouring horizon is so near that its points would be reached
    (one close pair of horizons had squeezed the points together at every horizon).

    Example
    -------
    >>> _dodge(np.array([0.0, 0.01, 0.5]), 6).round(5).tolist()
    [0.00143, 0.00143, 0.006]
    """
    h = np.asarray(horizons, dtype=float)
    span = float(h.max() - h.min()) if h.size else 0.0
    if span <= 0:
        return np.zeros(h.shape)
    gaps = np.abs(h[:, None] - h[None, :]) + np.where(np.eye(h.size, dtype=bool), np.inf, 0.0)
    return np.minimum(span * 0.012, gaps.min(axis=1) / (n + 1))


def _first_few(ids: list[str]) -> str:
    """Up to five run ids, and "and more" past them: a caption names runs, it does not list a sweep."""
    return ", ".join(ids[:5]) + (" and more" if len(ids) > 5 else "")


def _outdated(ds: xr.Dataset, ctx: _Ctx) -> str:
    """A caveat when the curve's runs are not the store's completed runs now: the curve and its
    "left out" list are what `dynamics predict` saw when it ran, and the page around it is not."""
    if "run" not in ds.coords:
        return ""
    used = {str(r) for r in ds["run"].values}
    completed = {r.run_id for r in ctx.runs if r.status == "completed"}
    new, gone = sorted(completed - used), sorted(used - completed)
    if not new and not gone:
        return ""
    # a damaged run may still say "completed": it is unreadable, not no longer completed
    damaged = {r.run_id for r in ctx.runs if r.status == "damaged"}
    unread, gone = [r for r in gone if r in damaged], [r for r in gone if r not in damaged]
    parts = ([f"{len(new)} completed run(s) it leaves out ({_first_few(new)})"] if new else []) + (
        [f"{len(gone)} of its runs the store no longer holds as completed ({_first_few(gone)})"] if gone else []) + (
        [f"{len(unread)} of its runs that can no longer be read (damaged: {_first_few(unread)})"] if unread else [])
    return (f" Out of date: this curve was computed from other runs than the store's completed runs now: "
            f"{'; '.join(parts)}; rerun `dynamics predict`.")


def _ceiling(ds: xr.Dataset, unit: str) -> str:
    """The caption's sentence on horizons whose features saw a run's final snapshot, the one that
    defines the target, as `dynamics predict` prints it (predict.readable.ceiling_horizons, redone
    here: the report imports no sklearn). It named only h = 1 of a fraction curve: a step curve's
    last step, or a fraction short of 1 that reached a run's final snapshot, went unmarked."""
    horizons = ds["horizon"].values
    if "horizon_step" in ds and "final_step" in ds:
        seen = np.asarray(ds["horizon_step"].transpose("horizon", "run").values, dtype=np.float64)
        final = np.asarray(ds["final_step"].values, dtype=np.float64)
        at = [bool(np.any(s >= final)) for s in seen]
    else:  # a curve saved without the steps it saw: a fraction of 1 is the final snapshot
        at = [unit == "fraction" and float(h) >= 1 for h in horizons]
    labels = [f"h = {float(h):g}" if unit == "fraction" else f"step {int(h)}" for h, c in zip(horizons, at, strict=True) if c]
    if not labels:
        return ""
    return (f" {', '.join(labels)} {'sees' if len(labels) == 1 else 'see'} a run's final snapshot, which defines the "
            "target: a ceiling, not a prediction.")


def _how_early(ds: xr.Dataset) -> str:
    """The curve's answer to "how early", as `dynamics predict` printed it, for the caption."""
    summary = ds.attrs.get("readable_summary")
    text = f" {summary[0].upper()}{summary[1:]}." if isinstance(summary, str) and summary else ""
    if text and "gain_t" not in ds:  # saved before the fold-by-fold test: its answer compared bands
        text += (" (The answer of an older version, which compared each model's band with each baseline's; "
                 "`dynamics predict` again judges it by this version's fold-by-fold test.)")
    # "passes the test" names no test: the page is read without the command's criterion line
    # the level the curve was judged at, as saved with it (0.05 for curves saved before it was)
    alpha = float(ds.attrs.get("readable_alpha", 0.05))
    test = (f" The test: a one-sided paired t-test at {alpha:g} on each fold's gain over the best baseline there, with "
            "Nadeau and Bengio's correction for the training runs the folds share; the bars drawn are each model's "
            "own spread, not what it compares.") if text and "gain_t" in ds else ""
    n, k = ds.attrs.get("null_permutations"), ds.attrs.get("null_readable")
    if text and n and k is not None:  # saved by `dynamics predict --null N`
        twins = ds.attrs.get("null_same_seed_runs", 0)
        seeds = "" if "null_same_seed_runs" not in ds.attrs else " and other seeds" if not twins else \
            " and, where their set allows, other seeds"  # absent: saved before seeds were kept apart
        m = int(ds.attrs.get("null_judged", n))  # absent: saved before unjudged permutations were told apart
        if m == 0:
            return text + (f" Null check: none of the {n} permutations could be judged (their folds left fewer than "
                           f"2 scored for every model), so it says nothing here.") + test
        count = (f"{k} of {n} permutations ({k / n:.0%})" if m == n else
                 f"{k} of the {m} permutations it could judge ({k / m:.0%}; {n - m} of {n} could not be)")
        legible = ds.attrs.get("null_legible")  # absent: saved before the legible clause was counted
        text += (f" Null check: on final roles permuted between runs with the same heads{seeds}, the "
                 f"criterion named a horizon in {count}"
                 + (f", and the line said \"legible at initialisation\" in {legible} of {m}" if legible is not None
                    else "")
                 + (f"; {twins} runs could only trade with runs of their own seed, so it may overstate." if twins
                    else "."))
    return text + test


def _predict_lines(ds: xr.Dataset) -> tuple[list[tuple], str | None]:
    """(label, horizon, mean, band (low, high) or None, is_baseline) per model, and the fold dim used.

    Reads the per-fold ``score`` of `dynamics.predict` (horizon, model, fold) when present
    (mean over the folds where defined, and the band `dynamics predict` saved with it,
    ``score_low`` / ``score_high``: mean -+ s.d. capped to the metric's range, each model's own
    spread; mean -+ s.d. for a curve saved without them; its "how early" line judges per-fold gains,
    ``gain``, not these bands); otherwise every numeric
    variable over horizon, split by a model-like dim and summarised over a fold-like dim.
    """
    saved_band = "score_low" in ds and "score_high" in ds
    fold = next((d for d in _FOLD_DIMS if d in ds.dims), None)
    model = next((d for d in _MODEL_DIMS if d in ds.dims), None)
    if "score" in ds and "horizon" in ds["score"].dims:
        metrics = ["score"]
    else:
        metrics = [v for v in ds.data_vars if "horizon" in ds[v].dims and ds[v].dtype.kind in "fiu"
                   and not str(v).endswith(("_std", "_sd"))]
    lines = []
    for var in metrics:
        da = ds[var].load().astype(float)
        use_fold = fold if fold in da.dims else None
        extra = [d for d in da.dims if d not in ("horizon", use_fold, model)]
        if extra:  # e.g. per-class scores: summarise by their mean so one line stays one model
            da = da.mean(extra)
        labels = [None] if model is None or model not in da.dims else [str(m) for m in da[model].values]
        for lab in labels:
            sub = (da if lab is None else da.sel({model: lab})).transpose("horizon", ...)
            with np.errstate(all="ignore"), _quiet():
                values = sub.values.reshape(sub.sizes["horizon"], -1)
                mean = np.nanmean(values, 1) if use_fold else values[:, 0]
                sd = np.nanstd(values, 1, ddof=1) if use_fold and values.shape[1] > 1 else None
            if not np.isfinite(mean).any():
                continue
            band = None if sd is None else (mean - sd, mean + sd)
            if sd is not None and saved_band and var == "score" and lab is not None:
                band = tuple(ds[b].sel({model: lab}).transpose("horizon").values.astype(float)
                             for b in ("score_low", "score_high"))
            name = (var if lab is None else lab) if len(metrics) == 1 else f"{var}: {lab}"
            baseline = lab in _BASELINES or "baseline" in f"{var} {lab}".lower()
            lines.append((name, ds["horizon"].values.astype(float), mean, band, baseline))
    return lines, fold


def _chance_level(ds: xr.Dataset, metric: str, fold: str | None) -> tuple[float | None, str]:
    """The dotted chance level and the caption phrase saying what it is.

    For balanced accuracy a constant guess scores 1 / (classes the test fold holds) when it
    names one of them, so the level is the mean of that over the scored test folds (a fold of
    one class is not scored: `dynamics.predict.models.score`), counted from the stored targets
    (``target``, ``row_fold``) when the curve has them, as `dynamics.predict.curve` counts it
    (not imported: it would import sklearn): curves written before `dynamics.predict` used that
    definition carry ``attrs["chance"]`` = 1 / (classes in the whole table), a level no constant
    guess reaches when a fold lacks classes.
    """
    stored = _float_or_none(ds.attrs.get("chance"))
    if metric == "balanced_accuracy" and "target" in ds and "row_fold" in ds.coords and fold:
        target = np.asarray(ds["target"].values, dtype=float)
        row_fold = np.asarray(ds["row_fold"].values)
        counts = [np.unique(target[(row_fold == k) & np.isfinite(target)]).size for k in ds[fold].values]
        counts = [c for c in counts if c > 1]
        if counts:
            level = float(np.mean([1.0 / c for c in counts]))
            return level, (f"dotted: chance level {level:.2f}, what a constant guess of a class each test fold holds "
                           f"scores (1 / the classes in the fold, mean over the scored folds); ")
        return None, ""  # no fold is scored: no level to draw
    if stored is None:
        return None, ""
    if metric == "balanced_accuracy":
        return stored, f"dotted: chance level {stored:.2f} as stored with the curve; "
    return stored, f"dotted: chance level {stored:.2f}; "


def _spread_text(ds: xr.Dataset, fold: str | None, metric: str) -> str:
    """Caption phrase for the bars: over how many folds, and which folds the metric is undefined on."""
    if not fold:
        return "no fold dimension, so no spread"
    n = ds.sizes[fold]
    held = f" holding out whole {ds.attrs['group_by']}s" if ds.attrs.get("group_by") else ""
    undefined: list[int] = []
    if "score" in ds and fold in ds["score"].dims:
        values = np.asarray(ds["score"].transpose(fold, ...).values, dtype=float).reshape(n, -1)
        undefined = [k for k in range(n) if not np.isfinite(values[k]).any()]
    # drawn from the curve's capped bands where it has them (_predict_lines): a band past 1 was cut at 1
    capped = " (capped to the metric's range)" if "score_low" in ds else ""
    if not undefined:
        return f"bars: +-1 s.d.{capped} over {n} cross-validation folds{held}"
    left = n - len(undefined)
    band = "no bar from one fold" if left == 1 else f"bars: +-1 s.d.{capped} over those {left}"
    return (f"{metric} is undefined on {len(undefined)} of {n} cross-validation folds{held}"
            f"{_undefined_folds(ds, fold, metric, undefined)}: points are means over the other {left}, {band}")


def _undefined_folds(ds: xr.Dataset, fold: str, metric: str, undefined: list[int] | None = None) -> str:
    """Caption phrase naming the test folds (default: all) whose metric is undefined, and why."""
    undefined = list(range(ds.sizes[fold])) if undefined is None else undefined
    which = ""
    if "test_groups" in ds and fold in ds["test_groups"].dims:
        which = " (" + "; ".join(str(ds["test_groups"].values[k]) for k in undefined) + ")"
    why = {"AUROC": ", whose test targets are one class", "balanced accuracy": ", whose test targets are one class",
           "Spearman correlation": ", whose test targets are constant"}
    return which + why.get(metric, "")
