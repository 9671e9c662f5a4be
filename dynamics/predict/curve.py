"""The whole pipeline: the "how early can we know" curve of a target, stored and printed."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace

import dask
import numpy as np
import xarray as xr

from dynamics import store
from dynamics.analysis.pipeline import ANALYSIS_VERSION
from dynamics.caveats import notes, of_run
from dynamics.predict.features import feature_table, horizon_steps
from dynamics.predict.load import check_runs, load_store, naming_damaged
from dynamics.predict.models import (
    balanced_chance,
    cross_validate,
    fold_classes,
    fold_names,
    group_splits,
    in_group_order,
    score,
    unseen_classes,
)
from dynamics.predict.null import (
    _can_cross,
    _class_labels,
    derangement,
    derangement_across,
    null_folds,
    same_head_blocks,
)
from dynamics.predict.options import MODELS, TARGETS, PredictError, PredictOptions, Run, check_arguments
from dynamics.predict.readable import (
    ALPHA,
    CRITERION,
    EARLY,
    ceiling_horizons,
    fold_mean_sd,
    holdout_of,
    holdout_ratios,
    init_only_horizons,
    judge,
    null_lines,
    readable_of,
    saved_cautions,
)
from dynamics.predict.targets import class_name, probe_sensitive_note, target_table

# --------------------------------------------------------------------------- whole pipeline

METRIC_NAMES = {"auroc": "AUROC", "balanced_accuracy": "balanced accuracy", "spearman": "Spearman"}
PERMUTED = {"importance": "importance ranks"}  # what the null check permutes, where "final roles" is wrong


def _check_some_fold_scored(rows: xr.Dataset, splits: Sequence[tuple[np.ndarray, np.ndarray]], metric: str,
                            options: PredictOptions) -> None:
    """PredictError when the metric is undefined on every test fold, before any model is fitted.

    Each run's heads can all share one class (every head of a seed diffuse, say) while the store
    holds both: then every fold holding out whole groups tests one class, and the table would be
    all n/a. Whether a fold can be scored depends on its targets alone, so scoring the targets
    against themselves tells."""
    y = rows["target"].values
    if any(np.isfinite(score(metric, y[test], y[test])) for _, test in splits):
        return
    groups = rows["row_group"].values
    what = "a constant target or under 3 heads" if metric == "spearman" else "one class"
    tested = "; ".join(fold_names(groups, splits, in_order=True))
    hint = "; fewer --folds put more groups in a test fold" if len(splits) > 2 else ""
    raise PredictError(f"target {options.target!r}: {METRIC_NAMES[metric]} is undefined on every one of the "
                       f"{len(splits)} test folds holding out whole {options.group_by}s, each of {what} "
                       f"({tested}), so no model can be scored{hint}")


def _versions() -> dict[str, str]:
    import scipy
    import sklearn

    import dynamics

    return {"dynamics": dynamics.__version__, "scikit-learn": sklearn.__version__, "numpy": np.__version__,
            "scipy": scipy.__version__}


def _preload(data: xr.Dataset) -> xr.Dataset:
    # Read the small variables once: each horizon then slices memory, not the store (a dask
    # compute per access costs more than the features). Attention and head weights stay lazy:
    # only the snapshots a horizon needs are ever read.
    small = [n for n in data.data_vars if n not in ("attention", "head_weights")]
    with dask.config.set(scheduler="synchronous"):  # one small read: a thread pool only adds overhead
        loaded = data[small].reset_coords().compute()
    return data.assign(loaded.data_vars).assign_coords(loaded.coords)


def _unpadded(data: xr.Dataset) -> xr.Dataset:
    """``data`` without the snapshots past a run's end, and the heads and layers it lacks, that a
    padded sweep gives it.

    A run picked from a sweep (``open_sweep(...).sel(run=...)``) keeps the sweep's padding: steps
    NaN after its last snapshot. Its final step read NaN, so the h = 1 horizon was not flagged a
    ceiling and a step horizon past its end was not refused; the first step read NaN and the
    init features failed with "no snapshot at or before step nan". And its padded heads (where
    ``head_mask`` is False) made every layer mean and norm of its real heads' features NaN (the
    ``*_rel_*`` features and ``importance_share_h``, then imputed with medians: scores up to 0.27
    apart from the same runs opened alone), as its weights' padded d_model and d_head columns did
    the ``weight_norm_*`` features. The package's own loader opens runs one by one, with no
    padding."""
    if "head_mask" in data.coords and data["head_mask"].ndim >= 1 and not bool(data["head_mask"].all()):
        mask = data["head_mask"]
        keep = {d: np.flatnonzero(mask.any([o for o in mask.dims if o != d]).values) if mask.ndim > 1
                else np.flatnonzero(mask.values) for d in mask.dims}
        data = data.isel(keep)
    if "head_weights" in data and data["head_weights"].size:
        # open_sweep pads a narrower run's columns at the end; its width, from its first head's
        # initial weights, as analyse reads it
        first = data["head_weights"].isel({d: 0 for d in data["head_weights"].dims if d not in ("d_model", "d_head")})
        width = {"d_model": int(first.isel(d_head=0).notnull().sum()), "d_head": int(first.isel(d_model=0).notnull().sum())}
        if all(width.values()) and any(n < data.sizes[d] for d, n in width.items()):
            data = data.isel({d: slice(0, n) for d, n in width.items()})
    if "step" not in data.coords or data["step"].dims != ("snapshot",):
        return data  # check_runs names what is missing
    finite = np.isfinite(np.asarray(data["step"].values, dtype=np.float64))
    return data if finite.all() else data.isel(snapshot=np.flatnonzero(finite))


def _never_judged(runs: list[Run], horizon: float, unit: str) -> bool:
    """Whether the features at ``horizon`` see some run's final snapshot (a ceiling, as
    `ceiling_horizons`) or every run's first snapshot alone (as `init_only_horizons`)."""
    steps = [(float(horizon_steps(r.data, [horizon], unit)[0]), np.sort(r.data["step"].values)) for r in runs]
    return any(h >= s[-1] for h, s in steps) or all(s.size < 2 or h < s[1] for h, s in steps)


def predict_runs(runs: Sequence[Run], options: PredictOptions | None = None,
                 left_out: Sequence[str] = (), progress: Callable[[str], None] | None = None) -> xr.Dataset:
    """Targets, features at every horizon, grouped cross-validation, as one dataset.

    Parameters
    ----------
    runs : sequence of Run
        From `load_runs`, or built in memory.
    options : PredictOptions, optional
    left_out : sequence of str, optional
        The store's runs not among `runs` (from `load_store`), kept as attr ``runs_left_out``
        and named by `format_curve`.
    progress : callable, optional
        ``progress(text)`` as each stage starts (features, fits, each null permutation): a
        curve with ``null`` permutations fits that many more curves.

    Returns
    -------
    Dataset
        The curve (see `predict_store` for the schema).

    Raises
    ------
    PredictError
        For the cases of `check_runs` and `target_table`.
    """
    check_arguments("predict_runs", options, PredictOptions)
    runs = list(runs)
    if not runs or not all(isinstance(r, Run) for r in runs):
        got = "none" if not runs else type(next(r for r in runs if not isinstance(r, Run))).__name__
        raise TypeError(f"predict_runs: runs must be Run(run_id, data, seed, config)s, as load_runs gives them; got {got}")
    opt = options or PredictOptions()
    runs = [replace(r, data=_unpadded(r.data)) for r in runs]
    check_runs(runs, opt)
    say = progress or (lambda text: None)
    # the first line came after every run was read: 19 s of silence with 150 tiny runs
    say(f"{len(runs)} runs: reading their recordings and final targets")
    runs = [replace(r, data=_preload(r.data)) for r in runs]
    spec = TARGETS[opt.target]
    rows = target_table(runs, opt)
    blocks = same_head_blocks(rows) if opt.null else []
    if opt.null and not blocks:  # before any model is fitted
        raise PredictError("null check: no two runs label the same heads, so there is nothing to permute")
    groups = rows["row_group"].values
    splits = group_splits(groups, opt.n_splits)
    _check_some_fold_scored(rows, splits, spec.metric, opt)
    if opt.null and all(_never_judged(runs, h, opt.unit) for h in opt.horizons):
        # judge never names a ceiling, nor a horizon where the early models are the init baselines'
        # twins: "0 of N permutations" would be certain before any fit
        raise PredictError("null check: every horizon given is a ceiling (its features see a run's final snapshot, "
                           "which defines the target) or sees the initialisation alone (the early-training models "
                           "are then the init baselines), and none is ever named readable, so 0 of N would say "
                           "nothing; give a horizon between the runs' first snapshot after step 0 and their ends")
    if opt.null:
        null_rows, null_splits = null_folds(blocks, splits, rows.sizes["head_row"])
        if len(null_splits) < 2:  # judge names nothing over fewer than 2 folds: 0 of N would say nothing
            raise PredictError(f"null check: the runs that share their heads with another run leave {len(null_splits)} "
                               f"of {len(splits)} folds with both training and test runs; it needs 2")
    fold_of = np.empty(rows.sizes["head_row"], dtype=np.int64)
    for k, (_, test) in enumerate(splits):
        fold_of[test] = k

    say(f"{len(runs)} runs, {rows.sizes['head_row']} heads: features at {len(opt.horizons)} horizon(s)")
    cut: dict = {}  # horizons that see the same snapshots of a run share its features
    init = feature_table(runs, rows, None, opt, cut)
    tables = {h: feature_table(runs, rows, h, opt, cut) for h in opt.horizons}
    say(f"fitting {len(MODELS)} models x {len(splits)} folds at {len(opt.horizons)} horizon(s)")
    preds, scores = cross_validate(
        {h: t.values for h, t in tables.items()}, init.values, rows["target"].values,
        rows["row_layer"].values, splits, opt,
    )
    pooled = np.array([[score(spec.metric, rows["target"].values, preds[i, m]) for m in range(len(MODELS))]
                       for i in range(len(opt.horizons))])
    score_mean, score_sd, _ = fold_mean_sd(scores)  # (horizon, model): over the scored folds

    # A class a fold's training rows lack is a miss there for every model: said, not averaged in silently.
    y = rows["target"].values
    unseen = ["" if spec.task == "regression" else ", ".join(
        f"{class_name(opt.target, c)} ({int(np.sum(y[test] == c))} head{'s' if np.sum(y[test] == c) > 1 else ''})"
        for c in missing) for (_, test), missing in zip(splits, unseen_classes(y, splits), strict=True)]

    run_ids = list(dict.fromkeys(rows["row_run"].values.tolist()))
    horizon_step = np.array([[tables[h].attrs["horizon_step"][r] for r in run_ids] for h in opt.horizons])
    n_seen = np.array([[tables[h].attrs["n_snapshots"][r] for r in run_ids] for h in opt.horizons])
    names = tables[opt.horizons[0]]["feature"].values.tolist()  # the same columns at every horizon
    valued = np.array([np.isfinite(tables[h].values).sum(axis=0) for h in opt.horizons])
    init_names, init_valued = init["feature"].values.tolist(), np.isfinite(init.values).sum(axis=0)
    by_id = {r.run_id: r for r in runs}
    final_step = np.array([float(np.max(by_id[r].data["step"].values)) for r in run_ids])
    ds = xr.Dataset(
        {
            "score": (("horizon", "model", "fold"), scores),
            "score_mean": (("horizon", "model"), score_mean),
            "score_std": (("horizon", "model"), score_sd),
            "score_pooled": (("horizon", "model"), pooled),
            "prediction": (("horizon", "model", "head_row"), preds),
            "target": rows["target"],
            "n_test": ("fold", np.array([test.size for _, test in splits])),
            "test_groups": ("fold", np.array(fold_names(groups, splits))),
            "unseen_classes": ("fold", np.array(unseen, dtype=str)),
            "horizon_step": (("horizon", "run"), horizon_step),
            "n_snapshots_seen": (("horizon", "run"), n_seen),
            "final_step": ("run", final_step),
            "n_feature_values": (("horizon", "feature"), valued),
        },
        coords={
            "horizon": np.asarray(opt.horizons, dtype=np.float64),
            "model": list(MODELS),
            "fold": np.arange(len(splits)),
            "run": run_ids,
            "feature": names,
            **{k: rows[k] for k in ("row_run", "row_layer", "row_head", "row_group")},
            "row_fold": ("head_row", fold_of),
        },
    )
    if "offset" in rows:
        ds["target_offset"] = rows["offset"]
    if "agreement" in rows:  # the role target: each label's share of the probe resamples (NaN: none)
        ds["target_agreement"] = rows["agreement"]
    # Runs of one seed share their initial weights and data order whatever else differs: with
    # --group run or config a held-out head's twin can sit in training, and a model that matches
    # twins scores well without predicting anything (init features included).
    seed_of = {r.run_id: None if r.seed is None else str(r.seed) for r in runs}
    row_run = rows["row_run"].values
    sharing = sum(bool(({seed_of[r] for r in set(row_run[test])} & {seed_of[r] for r in set(row_run[train])}) - {None})
                  for train, test in splits)
    classes = np.unique(rows["target"].values)
    chance = balanced_chance(rows["target"].values, splits) if spec.chance is None else spec.chance
    ds.attrs.update(
        target=opt.target,
        description=spec.description,
        task=spec.task,
        metric=spec.metric,
        chance=chance,
        horizon_unit=opt.unit,
        group_by=opt.group_by,
        n_splits=len(splits),
        n_runs=len(run_ids),
        n_groups=int(np.unique(groups).size),
        folds_sharing_seeds=int(sharing),
        runs_left_out=list(left_out),
        # completed runs without a label for this target (no CHG fit): beside the curve, not in it
        runs_unlabelled=rows.attrs["unlabelled"],
        # in the curve, with heads labelled like any run's: training made them worse, or never moved them
        runs_caveats={r.run_id: said for r in runs if (said := of_run(r.data, r.data.attrs.get("status", "completed"),
                                                                       r.analysis))},
        # Only features with a value for some head: grad_cosine before a second snapshot, or a
        # token score when the token never appears, is NaN everywhere and no model can use it.
        features=[f for f, n in zip(names, valued.max(axis=0), strict=True) if n > 0],
        init_features=[f for f, n in zip(init_names, init_valued, strict=True) if n > 0],
        features_empty=[f for f, n in zip(names, valued.max(axis=0), strict=True) if n == 0],
        target_sources=rows.attrs["sources"],
        analysis_unreadable=rows.attrs["analysis_unreadable"],
        # Targets and role/slash features come from these analysers: the report flags a curve of other ones.
        analysis_version=ANALYSIS_VERSION,
        options={k: v for k, v in asdict(opt).items() if k != "analysis"},
        analysis_options={k: v for k, v in asdict(opt.analysis).items() if k != "roles"},
        role_thresholds=asdict(opt.analysis.roles),
        # Identical features give other boosting scores under another scikit-learn (measured:
        # up to 0.017 balanced accuracy on the quickstart sweep): a curve says what fitted it.
        versions=_versions(),
    )
    # The answer to "how early", stored with the curve so that Python and the report read the
    # same one the command prints (None where no horizon is readable: a JSON null in the store).
    # Judged on the folds in group order, the order the line quotes their gains in.
    ds = in_group_order(ds)
    answer = readable_of(ds, _readable_labels(ds))
    ds["score_low"] = (("horizon", "model"), answer.low)
    ds["score_high"] = (("horizon", "model"), answer.high)
    ds["gain"] = (("horizon", "early_model", "fold"), answer.gain)
    ds["gain_t"] = (("horizon", "early_model"), answer.gain_t)
    ds["gain_critical"] = (("horizon", "early_model"), answer.gain_critical)
    ds = ds.assign_coords(early_model=list(EARLY))
    ds["readable"] = ("horizon", np.array(answer.readable, dtype=bool))
    ds.attrs.update(readable_horizon=answer.horizon, readable_model=answer.model, readable_baseline=answer.baseline,
                    readable_summary=answer.line, readable_criterion=CRITERION, readable_alpha=ALPHA)
    if opt.null:
        hits, judged, same_seed, legible = _null_readable(ds, tables, init, rows, blocks, null_rows, null_splits,
                                                          opt, say, seed_of)
        ds.attrs.update(null_permutations=opt.null, null_readable=hits, null_judged=judged, null_same_seed_runs=same_seed,
                        null_left_out_runs=len(run_ids) - sum(len(b) for b in blocks), null_legible=legible)
    if spec.task != "regression":
        ds.attrs["classes"] = classes.astype(int).tolist()
        ds.attrs["class_counts"] = [int(np.sum(rows["target"].values == c)) for c in classes]
    if opt.target in ("role", "chg"):
        ds.attrs["class_names"] = [class_name(opt.target, c) for c in classes]
    return ds


def _null_readable(ds: xr.Dataset, tables: dict, init: xr.DataArray, rows: xr.Dataset, blocks: list[np.ndarray],
                   keep: np.ndarray, splits, opt, say: Callable[[str], None], seed_of: dict
                   ) -> tuple[int, int, int, int]:
    """In how many of ``opt.null`` curves on permuted targets `judge` names a readable horizon, in
    how many it could judge one at all, how many runs could not be kept from trading with a
    run of their own seed, and in how many it says "legible at initialisation" (an init-only
    model's gains over the better of chance and layer passing the same test).

    A permutation can leave all but one fold with one class, where no gains can be tested:
    such a curve could never name a horizon, and counted with the rest it made the false
    alarm rate look lower than it is (0 of 20 where no permutation could have fired).

    Each permutation gives every run's final roles, whole, to another run labelling the same
    heads (``blocks``, from :func:`same_head_blocks`), of another seed (`derangement_across`; where
    one seed holds more than half a block's runs, any other run: a `derangement`): a head keeps
    its layer and position (the layer prior still holds), but its target no longer comes from its
    own training, nor from a twin's with its initial weights and data, which every early model,
    and every init baseline, reads. The features and criterion are the real curve's, and so are
    the folds, over the rows ``keep`` (`null_folds`: runs with no peer left out).
    """
    row_run = rows["row_run"].values
    seeds = [[seed_of[row_run[b[r, 0]]] for r in range(len(b))] for b in blocks]
    across = [_can_cross(_class_labels(s)) for s in seeds]
    y = rows["target"].values
    spec, ceiling, labels, blind = TARGETS[opt.target], ceiling_horizons(ds), _readable_labels(ds), init_only_horizons(ds)
    features = {h: t.values[keep] for h, t in tables.items()}
    init_kept, layer = init.values[keep], rows["row_layer"].values[keep]
    rng = np.random.default_rng(opt.random_state)
    holdout = holdout_ratios([len(test) for _, test in splits], int(keep.size))
    hits = judged = legible = 0
    for i in range(opt.null):
        say(f"null check {i + 1}/{opt.null}: the curve on permuted final {PERMUTED.get(opt.target, 'roles')}")
        permuted = y.copy()
        for block, block_seeds, ok in zip(blocks, seeds, across, strict=True):  # (runs, heads)
            order = derangement_across(block_seeds, rng) if ok else derangement(len(block), rng)
            permuted[block.ravel()] = y[block[order].ravel()]
        _, scores = cross_validate(features, init_kept, permuted[keep], layer, splits, opt)
        answer = judge(opt.horizons, scores, spec.metric, models=MODELS, ceiling=ceiling, labels=labels,
                       init_only=blind, holdout=holdout)
        hits += answer.horizon is not None
        judged += answer.judged
        legible += answer.legible is not None
    return hits, judged, sum(len(b) for b, ok in zip(blocks, across, strict=True) if not ok), legible


def predict_store(path: str, options: PredictOptions | None = None,
                  progress: Callable[[str], None] | None = None) -> xr.Dataset:
    """The "how early can we know" curve of one target over the completed runs of a store.

    Parameters
    ----------
    path : str
        A dynamics store with at least two completed runs in at least two groups.
    options : PredictOptions, optional
    progress : callable, optional
        As for `predict_runs`.

    Returns
    -------
    Dataset
        Dims ``horizon`` (the horizons, in ``attrs["horizon_unit"]``), ``model`` (`MODELS`),
        ``fold``, ``head_row`` (one labelled head), ``run``:

        - ``score`` (horizon, model, fold): the metric ``attrs["metric"]`` on each test fold
          (NaN where undefined, e.g. a fold with one class);
        - ``score_mean``, ``score_std`` (horizon, model): over the folds where defined (the sd
          NaN when only one is);
        - ``score_pooled`` (horizon, model): the metric over all out-of-fold predictions, whose
          scale differs between folds: a constant per fold is no constant when pooled, so the
          chance and layer rows' pooled AUROC can sit well below 0.5 (a fold's training prior
          falls as its test fold's rises); compare models by ``score_mean``;
        - ``prediction`` (horizon, model, head_row): out-of-fold predictions;
        - ``target`` (head_row), and ``target_offset`` for the slash target, ``target_agreement``
          for the role target (`analysis.probe_resample.label_agreement` of each final label);
        - ``n_test``, ``test_groups``, ``unseen_classes`` (fold: the classes, with their head
          counts, that the fold tests but its training rows lack; "" for none); ``horizon_step``, ``n_snapshots_seen``
          (horizon, run): the step of the last snapshot each run's features saw (at or before
          the horizon) and how many snapshots they saw;
          ``final_step`` (run): the step of its final snapshot, where the target is read;
        - ``score_low``, ``score_high`` (horizon, model): each model's band, mean -/+ sd capped to
          the metric's range (NaN without an sd), for plots;
        - ``gain`` (horizon, early_model, fold): the early model's score minus the best init-only
          baseline's in that fold (NaN where either is unscored, or at a ceiling), and
          ``gain_t`` (horizon, early_model): their corrected paired t, and ``gain_critical`` the
          t it must pass; ``readable`` (horizon): the how-early criterion holds there
          (`dynamics.predict.readable`);
        - ``n_feature_values`` (horizon, feature): how many heads have a value of each feature
          (0: empty there, e.g. gradient agreement before a second snapshot);
        - coords ``row_run``, ``row_layer``, ``row_head``, ``row_group``, ``row_fold``.

        ``attrs``: target, description, task, metric, chance, horizon_unit, group_by,
        analysis_version (of the analysers that gave targets and features), n_splits, n_runs,
        n_groups, runs_left_out ("<run_id> (<status>)" of the runs not completed),
        runs_unlabelled ("<run_id> (<why>)" of the completed runs with no head labelled for the
        target, e.g. no CHG fit),
        folds_sharing_seeds (folds whose test runs share a seed with their training runs; 0 when
        grouped by seed), readable_horizon (the first horizon where the criterion holds, None
        if none), readable_model, readable_baseline, readable_summary (the "how early" line the
        command prints), readable_criterion, readable_alpha (the test's level), features (those
        with a value for some head at some horizon), init_features (with a value at initialisation), features_empty (computed for
        every run but without a value at any horizon, so no model used them), target_sources,
        analysis_unreadable (runs whose stored analysis was damaged: their targets recomputed),
        options, analysis_options and role_thresholds (those the targets and features were
        computed with), versions (of dynamics, scikit-learn, numpy and scipy, which fitted and scored
        the models), classes / class_counts (classification), class_names (role, chg); with
        ``options.null``: null_permutations, null_readable (in how many of them the criterion
        named a horizon), null_judged (in how many it could judge one: some horizon had at least 2
        folds scored for every model), null_left_out_runs (runs labelling heads no other run labels, left
        out of the null fits), null_same_seed_runs (runs of a set where one seed holds more than
        half, which may trade roles with a run of their own seed), null_legible (in how many the
        line said "legible at initialisation").

    Example
    -------
    >>> curve = predict_store("runs.zarr", PredictOptions(target="slash", horizons=(0, 0.1, 0.5)))  # doctest: +SKIP
    >>> curve.score_mean.sel(model="boosting") - curve.score_mean.sel(model="init_boosting")  # doctest: +SKIP
    """
    opt = options or PredictOptions()
    runs, left_out = load_store(path, opt)
    while True:
        try:
            return predict_runs(runs, opt, left_out, progress)
        except PredictError as e:
            raise naming_damaged(e, left_out) from None
        except Exception:
            # A chunk that cannot be decoded (failing its checksum, cut short) is found only when
            # read, deep in the features: that run is left out and named, as a run missing a chunk
            # is, and the curve fitted again without it; any other error is the error.
            bad = [r.run_id for r in runs if store.unreadable_chunk(path, r.run_id) is not None]
            if not bad:
                raise
        runs = [r for r in runs if r.run_id not in bad]
        left_out = [*left_out, *(f"{r} (damaged)" for r in bad)]
        if len(runs) < 2:
            raise PredictError(f"{path}: {len(runs)} completed run(s) whose recordings decode ({', '.join(bad)} "
                               f"damaged); prediction needs at least 2") from None


def _first_five(ids: Sequence[str]) -> str:
    """Up to five run ids, and how many more: a line names runs, it does not list a sweep."""
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _horizon_label(h: float, unit: str) -> str:
    return f"h={h:g}" if unit == "fraction" else f"step {int(h)}"  # whole steps: {:g} gave 1.23457e+06


def _span(values) -> str:
    lo, hi = float(np.min(values)), float(np.max(values))
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def _readable_labels(curve: xr.Dataset) -> list[str]:
    # "h=0.2 (step 300)": a fraction alone hides how much training the answer needed
    unit = curve.attrs["horizon_unit"]
    labels = [_horizon_label(float(h), unit) for h in curve["horizon"].values]
    if unit == "fraction" and "horizon_step" in curve:
        seen = curve["horizon_step"].transpose("horizon", "run").values
        labels = [f"{lab} (step {_span(s)})" for lab, s in zip(labels, seen, strict=True)]
    return labels


def _criterion_line(curve: xr.Dataset) -> str:
    scored = np.isfinite(curve["score"].transpose("horizon", "model", "fold").values).any(axis=(0, 1))
    defined = int(scored.sum())
    ratios = holdout_of(curve)
    ratio = 1.0 / max(curve.sizes["fold"] - 1, 1) if ratios is None else float(np.mean(ratios[scored]))
    line = ("readable: an early-training model's gain over the best init-only baseline (chance, layer, init_linear, "
            "init_boosting) in each test fold, its score there minus the best of theirs (each fold compared with "
            "itself: the heads a fold tests move every model's score there, chance's too), passes a one-sided paired "
            f"t-test at {ALPHA:g} over the J folds where every model is scored ({defined} here), with Nadeau and Bengio's "
            f"correction for the training data folds share: t = mean / (sd sqrt(1/J + n_test/n_train)), "
            f"n_test/n_train {ratio:.3f} here (over the scored folds), against t's {1 - ALPHA:g} point with J - 1 df; each horizon and model "
            "a test of its own, uncorrected for how many are tried (--null N counts how often some fires on these runs)")
    return line + ("; with so few folds, the sd itself is rough" if defined <= 3 else "")


def format_curve(curve: xr.Dataset) -> str:
    """The curve as a text table: one row per model, one column per horizon, mean ± sd over folds,
    closed by the "how early" line of `dynamics.predict.readable` and the criterion it used.

    Example
    -------
    >>> print(format_curve(predict_store("runs.zarr")))  # doctest: +SKIP
    """
    a = curve.attrs
    metric = METRIC_NAMES[a["metric"]]
    lines = [
        f"target {a['target']}: {a['description']}",
        f"{curve.sizes['head_row']} heads in {a['n_runs']} runs; {a['n_splits']} folds holding out whole "
        f"{a['group_by']}s ({a['n_groups']} groups); {metric}, mean ± sd over folds (chance {a['chance']:.2f})",
    ]
    if a["metric"] == "balanced_accuracy":
        # The header's level guesses a class each test fold holds; the chance row guesses the
        # training folds' majority, which scores 0 on a fold that lacks it (--group config).
        lines[-1] = lines[-1].removesuffix(")") + ": a constant guess of a class the test fold holds; "
        lines[-1] += "the chance row guesses the training folds' majority)"
    if a.get("runs_left_out"):
        # Runs that diverged or failed have no final role: the curve speaks for the runs that
        # finished, and without this line a reader would not know the others existed.
        unread = [r for r in a["runs_left_out"] if r.endswith(" (damaged)")]
        for out, why in (([r for r in a["runs_left_out"] if r not in unread], "not completed, so without a final role"),
                         ([r.removesuffix(" (damaged)") for r in unread], "that could not be read (damaged)")):
            if out:
                lines.append(f"left out: {len(out)} run(s) {why}: "
                             + _first_five(out))
    if out := a.get("runs_unlabelled"):
        lines.append(f"left out: {len(out)} run(s) with no head labelled for target {a['target']}: "
                     + _first_five(out))
    lines += notes(a.get("runs_caveats", {})) + probe_sensitive_note(curve.get("target_agreement"))
    if unreadable := a.get("analysis_unreadable"):
        lines.append(f"recomputed from the final snapshot: the target of {len(unreadable)} run(s) whose stored analysis "
                     f"could not be read (damaged; `dynamics analyse` writes it again): "
                     + _first_five(unreadable))
    # AUROC and Spearman are undefined on a test fold whose target is constant (one class), and
    # balanced accuracy is left undefined there (a constant guess of the one class scores 1):
    # such a fold is left out of every mean and sd, so say which, and how many remain.
    undefined = [k for k in range(curve.sizes["fold"]) if np.isnan(curve["score"].isel(fold=k).values).all()]
    if undefined:
        groups = "; ".join(str(curve["test_groups"].values[k]) for k in undefined)
        left = curve.sizes["fold"] - len(undefined)
        why = "a constant target or under 3 heads" if a["metric"] == "spearman" else "one class"
        lines.append(f"{metric} undefined on {len(undefined)} of {curve.sizes['fold']} test folds ({why}: {groups}); "
                     f"means over the other {left}" + (", no sd from one fold" if left == 1 else ""))
    unseen = [k for k in range(curve.sizes["fold"]) if "unseen_classes" in curve and curve["unseen_classes"].values[k]]
    if unseen:
        # Balanced accuracy there is capped below 1 whatever the features say (a rare role held by
        # one seed): a reader comparing models across folds must know which folds are capped.
        lines.append("classes never in training: " + "; ".join(
            f"{curve['unseen_classes'].values[k]} in the fold testing {curve['test_groups'].values[k]}" for k in unseen)
            + " (absent from that fold's training folds: no model can predict them there, so they count as misses)")
    if "horizon_step" in curve and "final_step" in curve:
        # A horizon is an upper bound: the features see the last snapshot at or before it, which
        # on a geometric-then-every-N schedule can be well before it (h=0.05 of 500 steps: 16).
        seen, final = curve["horizon_step"].values, curve["final_step"].values
        labels = [_horizon_label(float(h), a["horizon_unit"]) for h in curve["horizon"].values]
        # In steps the labels begin with "step" themselves: "up to step step 10: 10" read as a typo.
        lead = "features saw snapshots up to step " if a["horizon_unit"] == "fraction" else \
            "features saw snapshots up to step, by horizon: "
        lines.append(lead + ", ".join(f"{lab}: {_span(s)}" for lab, s in zip(labels, seen, strict=True))
                     + f" (final step {_span(final)})")
        ceiling = [lab for lab, s in zip(labels, seen, strict=True) if np.any(s >= final)]
        if ceiling:
            lines.append(f"{', '.join(ceiling)}: features see a run's final snapshot, which defines the target: "
                         "a ceiling, not a prediction")
    if a.get("folds_sharing_seeds"):
        lines.append(f"caution: in {a['folds_sharing_seeds']} of {a['n_splits']} folds a test run shares its seed (initial "
                     "weights, data order) with a training run; a model can match such twins, init features included, "
                     "so scores may overstate prediction (--group seed holds out whole seeds)")
    if "classes" in a:
        names = a.get("class_names", a["classes"])
        lines.append("classes: " + ", ".join(f"{n}={c}" for n, c in zip(names, a["class_counts"], strict=True)))
        lines.append("by test fold: " + fold_classes(curve["target"].values, curve["row_fold"].values, a["classes"],
                                                     names, curve["test_groups"].values.tolist()))
    header = ["model"] + [_horizon_label(float(h), a["horizon_unit"]) for h in curve["horizon"].values]
    rows = []
    for m in curve["model"].values:
        cells = [str(m)]
        for h in curve["horizon"].values:
            mean = float(curve["score_mean"].sel(horizon=h, model=m))
            sd = float(curve["score_std"].sel(horizon=h, model=m))
            cells.append("n/a" if math.isnan(mean) else f"{mean:.3f}" if math.isnan(sd) else f"{mean:.3f} ± {sd:.3f}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    # Recomputed, not read from attrs: a curve saved before the answer existed gets one too.
    answer = readable_of(curve, _readable_labels(curve))
    lines += [answer.line, _criterion_line(curve)] if answer.judged else [answer.line]
    lines += saved_cautions(curve)
    lines += null_lines(a, PERMUTED.get(a.get("target"), "roles"))
    return "\n".join(lines)

