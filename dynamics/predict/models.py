"""Grouped cross-validation of the models and baselines, and the metrics that score them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import rankdata, spearmanr
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from dynamics.predict.options import MODELS, TARGETS, PredictError, PredictOptions

# --------------------------------------------------------------------------- cross-validation


def group_splits(groups: Sequence, n_splits: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) row indices of grouped K-fold: no group is ever on both sides.

    Parameters
    ----------
    groups : sequence
        Group label of each row (run id, seed or config).
    n_splits : int
        Folds; capped at the number of groups (then it is leave-one-group-out).

    Returns
    -------
    list of (ndarray, ndarray)

    Raises
    ------
    PredictError
        With fewer than two groups.

    Examples
    --------
    >>> [test.tolist() for _, test in group_splits(["a", "a", "b", "c"], 5)]
    [[0, 1], [3], [2]]
    """
    groups = np.asarray(groups).astype(str)
    n_groups = np.unique(groups).size
    if n_groups < 2:
        raise PredictError(f"{n_groups} group(s): grouped cross-validation needs at least 2")
    splitter = GroupKFold(n_splits=min(n_splits, n_groups))
    return [(train, test) for train, test in splitter.split(np.zeros((groups.size, 1)), groups=groups)]


# A number standing alone in a label (seed=10, lr=1e-3, x=-1), not a hex run id's digits; the
# minus sign only after "=", a space or a bracket, not the hyphen of "run-2".
_NUMBER = re.compile(r"(?:(?<![^=\s(\[{,:])-)?(?<![A-Za-z0-9_.])(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
                     r"(?![A-Za-z0-9_.])")


def group_key(label) -> tuple:
    """Sort key of a group label reading its numbers as numbers: seed=2 before seed=10, lr=1e-3
    before lr=0.01, where text order put "seed=10" first; ties (1 and 1.0) by the text.

    >>> sorted(["seed=10", "seed=2", "seed=9"], key=group_key)
    ['seed=2', 'seed=9', 'seed=10']
    """
    text, parts, at = str(label), [], 0
    for m in _NUMBER.finditer(text):
        parts += [(1, 0.0, text[at:m.start()]), (0, float(m.group()), "")]
        at = m.end()
    return (*parts, (1, 0.0, text[at:])), text


def group_names(labels) -> str:
    """The distinct labels of `labels`, in `group_key` order, as one string: a fold's test groups,
    each bracketed where a label holds a comma itself (a config's settings: ``--group config``),
    so that one group's end can be told from the next one's start.

    >>> group_names(["seed=1", "seed=0", "seed=1"])
    'seed=0, seed=1'
    >>> group_names(["lr=0.01, n_heads=4", "lr=0.001, n_heads=2"])
    '[lr=0.001, n_heads=2], [lr=0.01, n_heads=4]'
    """
    names = sorted({str(x) for x in labels}, key=group_key)
    return ", ".join(f"[{n}]" if any("," in m for m in names) else n for n in names)


def fold_names(groups, splits: Sequence[tuple[np.ndarray, np.ndarray]], *, in_order: bool = False) -> list[str]:
    """`group_names` of each fold's test rows, in the folds' order or, `in_order`, by `group_key`."""
    names = [group_names(np.asarray(groups)[test]) for _, test in splits]
    return sorted(names, key=group_key) if in_order else names


def in_group_order(curve):
    """`curve` with its folds in the order of the groups they test (`group_key`), ``row_fold``
    renumbered to match.

    GroupKFold numbers its folds by the text order of the labels (np.unique) and their sizes, so
    a curve of seeds 2, 9 and 10 listed seed=9, seed=2, seed=10. Only the listing moves: which
    groups share a fold is still GroupKFold's, as the README's tables were measured with, and
    this runs after every score is computed, so no number changes, not even in its last bit.
    """
    fold, group = curve["row_fold"].values, curve["row_group"].values
    n = curve.sizes["fold"]
    # by its groups' keys, not the joined text: a config label holds ", " itself
    order = sorted(range(n), key=lambda k: sorted(group_key(g) for g in set(group[fold == k].tolist())))
    if order == list(range(n)):
        return curve
    renumber = np.empty(n, dtype=np.int64)
    renumber[order] = np.arange(n)
    return curve.isel(fold=order).assign_coords(fold=np.arange(n), row_fold=("head_row", renumber[fold]))


def unseen_classes(target, splits: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """Per fold, the classes its test rows hold that its training rows lack.

    No model learns a class it never saw: in such a fold those heads are misses whatever the
    features say (balanced accuracy there is at most 1 - u/k for u of the k classes the fold
    holds), and a binary fold whose training rows are one class gets constant predictions.

    Examples
    --------
    >>> splits = group_splits(["a", "a", "b", "b"], 2)
    >>> [u.tolist() for u in unseen_classes([0, 2, 0, 1], splits)]
    [[1.0], [2.0]]
    """
    target = np.asarray(target, dtype=np.float64)
    return [np.setdiff1d(np.unique(target[test]), np.unique(target[train])) for train, test in splits]


def fold_classes(target, row_fold, classes, names, groups) -> str:
    """"seed=0: none=30, local=1, self=1; seed=1: ..." the classes each test fold holds, by count:
    one or two heads of a class decide a fold's balanced accuracy (a statistics audit's fold of
    30 none, 1 local and 1 self moved by 0.333 a head), and the totals do not show it.

    Examples
    --------
    >>> fold_classes([0, 0, 1, 1, 1, 2], [0, 0, 0, 1, 1, 1], [0, 1, 2], ["a", "b", "c"], ["s=0", "s=1"])
    's=0: a=2, b=1; s=1: b=2, c=1'
    """
    target, row_fold = np.asarray(target), np.asarray(row_fold)
    return "; ".join(f"{group}: " + ", ".join(f"{n}={int(np.sum(y == c))}" for c, n in zip(classes, names, strict=True)
                                               if np.any(y == c))
                     for group, y in ((g, target[row_fold == k]) for k, g in enumerate(groups)))


def balanced_chance(target, splits: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """Balanced accuracy of a constant guess of a class each test fold holds, 1/k for a fold of k
    classes, averaged over the folds that are scored: a fold of one class is not (`score`), and
    counted as 1 it raised the level a curve's header quotes. NaN where none is.

    Examples
    --------
    >>> folds = [(None, np.array([0, 1])), (None, np.array([2, 3, 4])), (None, np.array([5, 6, 7, 8]))]
    >>> balanced_chance([0, 0, 1, 1, 2, 0, 1, 2, 2], folds)  # fold 0 one class: (1/2 + 1/3) / 2
    0.41666666666666663
    """
    target = np.asarray(target)
    k = [np.unique(target[test]).size for _, test in splits]
    scored = [1.0 / n for n in k if n > 1]
    return float(np.mean(scored)) if scored else float("nan")


def _estimator(kind: str, task: str, options: PredictOptions, n_train: int):
    if kind == "linear":
        # median imputation, fitted on the training fold only (boosting takes NaN as is)
        prep = [SimpleImputer(strategy="median"), StandardScaler()]
        if task == "regression":
            return make_pipeline(*prep, Ridge(alpha=options.ridge_alpha))
        return make_pipeline(*prep, LogisticRegression(C=options.logistic_c, max_iter=5000, class_weight="balanced"))
    leaf = options.boosting_min_leaf or min(20, max(3, n_train // 8))
    kwargs = {"max_iter": options.boosting_iter, "min_samples_leaf": leaf, "early_stopping": False,
              "random_state": options.random_state}
    if task == "regression":
        return make_pipeline(HistGradientBoostingRegressor(**kwargs))
    return make_pipeline(HistGradientBoostingClassifier(class_weight="balanced", **kwargs))


def _layer_prior(layer_train, y_train, layer_test, task: str) -> np.ndarray:
    out = np.empty(layer_test.shape)
    if task == "regression":
        overall = y_train.mean()
        for i, layer in enumerate(layer_test):
            m = layer_train == layer
            out[i] = y_train[m].mean() if m.any() else overall
        return out
    if task == "binary":
        overall = (y_train.sum() + 1.0) / (y_train.size + 2.0)
        for i, layer in enumerate(layer_test):
            m = layer_train == layer
            out[i] = (y_train[m].sum() + 1.0) / (m.sum() + 2.0) if m.any() else overall  # Laplace
        return out
    # multiclass: the chance model within the head's layer, i.e. the layer's majority class.
    # A class-balanced rule (argmax_c P(layer | c), or a balanced classifier on the one-hot
    # layer) lets a class seen once in a layer claim the whole layer, and scored below a
    # constant guess whenever a test fold lacked that class.
    overall = _chance(task, y_train, 1)[0]
    for i, layer in enumerate(layer_test):
        m = layer_train == layer
        out[i] = _chance(task, y_train[m], 1)[0] if m.any() else overall
    return out


def _fit_predict(kind: str, task: str, X_train, y_train, X_test, options: PredictOptions) -> np.ndarray:
    if task != "regression" and np.unique(y_train).size < 2:
        return np.full(len(X_test), float(y_train[0]))  # one class to learn from: predict it
    # A feature with no value in the training fold (gradient cosines with one snapshot seen, a
    # token score when the token never appears) carries nothing, and boosting cannot bin it.
    keep = np.isfinite(X_train).any(axis=0)
    if not keep.any():
        return _chance(task, y_train, len(X_test))
    X_train, X_test = X_train[:, keep], X_test[:, keep]
    model = _estimator(kind, task, options, len(X_train))
    model.fit(X_train, y_train if task == "regression" else y_train.astype(np.int64))
    if task == "binary":
        proba = model.predict_proba(X_test)
        return proba[:, list(model.classes_).index(1)]
    return np.asarray(model.predict(X_test), dtype=np.float64)


def _chance(task: str, y_train, n_test: int) -> np.ndarray:
    if task == "multiclass":
        values, counts = np.unique(y_train, return_counts=True)
        return np.full(n_test, float(values[np.argmax(counts)]))
    return np.full(n_test, float(y_train.mean()))


def score(metric: str, y_true, y_pred) -> float:
    """One fold's metric; NaN when it is undefined there.

    - ``auroc``: NaN when the fold has one class; constant predictions give 0.5.
    - ``balanced_accuracy``: mean recall over the classes present in ``y_true``; a constant
      prediction gives 1 / (number of classes present) if it names one of them, else 0. NaN when
      the fold has one class: there a constant guess of it scores 1, so the fold would not be
      scored against the same chance level as the others.
    - ``spearman``: NaN when ``y_true`` is constant; constant predictions give 0 (no ranking).

    Examples
    --------
    >>> score("auroc", [0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    >>> score("balanced_accuracy", [0, 0, 0, 1], [0, 0, 0, 0])
    0.5
    >>> score("balanced_accuracy", [2, 2, 2], [2, 2, 2])
    nan
    """
    y_true, y_pred = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    if metric == "auroc":
        positive = y_true == 1
        n1, n0 = int(positive.sum()), int((~positive).sum())
        if n1 == 0 or n0 == 0:
            return float("nan")
        # Mann-Whitney: AUROC = (rank sum of positives - n1 (n1 + 1) / 2) / (n1 n0), ties averaged
        # (equal to sklearn's roc_auc_score, without its per-call validation cost)
        return float((rankdata(y_pred)[positive].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))
    if metric == "balanced_accuracy":
        classes = np.unique(y_true)
        return float(np.mean([np.mean(y_pred[y_true == c] == c) for c in classes])) if classes.size > 1 else float("nan")
    if metric == "spearman":
        if y_true.size < 3 or np.ptp(y_true) == 0:
            return float("nan")
        if np.ptp(y_pred) == 0:
            return 0.0
        return float(spearmanr(y_true, y_pred).statistic)
    raise PredictError(f"unknown metric {metric!r}")


def cross_validate(
    features: Mapping[float, np.ndarray],
    init_features: np.ndarray,
    target: np.ndarray,
    layer: np.ndarray,
    splits: Sequence[tuple[np.ndarray, np.ndarray]],
    options: PredictOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold predictions and per-fold scores of every model of `MODELS` at every horizon.

    Parameters
    ----------
    features : mapping horizon -> ndarray (n_rows, n_features)
        Features cut at each horizon (from `feature_table`).
    init_features : ndarray (n_rows, n_init_features)
        Features of the first snapshot only (the init baselines).
    target : ndarray (n_rows,)
    layer : ndarray (n_rows,)
        Layer index of each row (the layer prior).
    splits : sequence of (train, test)
        From `group_splits`; the test sets must partition the rows.
    options : PredictOptions
        Target (task and metric) and model settings.

    Returns
    -------
    predictions : ndarray (n_horizons, n_models, n_rows)
        P(positive) for binary targets, the predicted class code for multiclass, the
        predicted rank for importance; each row predicted by the fold that held it out.
    scores : ndarray (n_horizons, n_models, n_folds)
    """
    spec = TARGETS[options.target]
    horizons = list(features)
    n = target.size
    preds = np.full((len(horizons), len(MODELS), n), np.nan)
    # Tiny tables: OpenMP threads cost more than they save, and on a shared machine they spin.
    with threadpool_limits(1):
        for train, test in splits:
            y_tr = target[train]
            fixed = {
                "chance": _chance(spec.task, y_tr, test.size),
                "layer": _layer_prior(layer[train], y_tr, layer[test], spec.task),
                "init_linear": _fit_predict("linear", spec.task, init_features[train], y_tr, init_features[test], options),
                "init_boosting": _fit_predict("boosting", spec.task, init_features[train], y_tr, init_features[test], options),
            }
            for i, h in enumerate(horizons):
                X = features[h]
                for name, p in fixed.items():  # horizon-free: the same numbers at every h
                    preds[i, MODELS.index(name), test] = p
                for kind in ("linear", "boosting"):
                    preds[i, MODELS.index(kind), test] = _fit_predict(kind, spec.task, X[train], y_tr, X[test], options)
    scores = np.array([[[score(spec.metric, target[test], preds[i, m, test]) for _, test in splits]
                        for m in range(len(MODELS))] for i in range(len(horizons))])
    return preds, scores
