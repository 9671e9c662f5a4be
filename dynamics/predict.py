"""Predict each head's final specialisation from what it recorded early in training.

The question: how early is a head's fate decided? For every head (run, layer, head) a
target is read from the run's FINAL snapshot, features are computed from the snapshots up
to a horizon step h only, and grouped cross-validation scores how well the features predict
the target, next to baselines that know only the head's layer or only its initialisation.
Sweeping h gives the "how early can we know" curve.

Targets (``TARGETS``), all at the final snapshot:

- ``slash``: slash-dominant or not (Cheng et al. 2026, kappa of `AnalysisOptions`), AUROC;
  the offset of each head's best slash score is kept next to it.
- ``role``: the role label of `dynamics.analysis.roles.assign_roles`, balanced accuracy.
- ``importance``: rank of the head's importance within its layer, scaled to [0, 1]
  (Michel et al. 2019), Spearman correlation.
- ``chg``: the causal-head-gating class recorded in ``chg_role`` (Nam et al. 2025), where
  fitted (code >= 0), balanced accuracy.
- ``redundant``: the head shares its JS-distance cluster with another head
  (`dynamics.analysis.redundancy.cluster_heads`), AUROC.

Leakage discipline (the evaluation must be beyond reproach)
------------------------------------------------------------
1. Features for horizon h come from `head_features` applied to `early_snapshots` (run, h):
   the run is cut to the snapshots with ``step <= h`` (and losses with ``train_step <= h``)
   *before* anything is computed. Analysis-derived features (role scores, slash scores, JS
   distances) are recomputed from that cut; the stored analysis, computed on the full run,
   is read only for targets, and only at the final snapshot.
2. Cross-validation is grouped, so a run's heads are never split between train and test.
   By default whole seeds are held out: runs of different configs with one seed can share
   their initial weights and data order, so a held-out run's "twin" in training would make
   the init features look predictive for the wrong reason.
3. Imputation and scaling are fitted inside each training fold (scikit-learn pipelines).
4. Baselines (chance, layer-only prior, step-0 features) use the very same folds.
5. Nothing is tuned: every model has the fixed settings of `PredictOptions`, so no fold
   is ever used to choose among models or hyperparameters.

Features (per head; ``g`` is a weight in q, k, v, o; "rel" is relative to the mean over the
head's layer; "slope" is the least-squares slope against log(1 + step) over the snapshots
seen, since snapshots are geometric early on): log10 grad_norm of g at init, at h, mean,
slope, rel at init and at h; grad_cosine of g (gradient-direction agreement between
consecutive snapshots) mean and at h; log10 importance likewise, plus its rank and l2 share
within the layer; every role score (entropy is ``diffuse``) at init, at h and its change;
best slash score at init and at h and its offset; mean JS distance to the other heads of the
layer and to the nearest other head at init and at h, and divergence from init; log10
weight norms at init and their change when head weights were recorded; layer index and
relative depth. Only features every run can provide are used.

Sources
-------
- Michel, Levy, Neubig 2019, "Are Sixteen Heads Really Better than One?" (importance).
- Cheng et al. 2026, arXiv 2601.08297 (slash scores, (kappa, delta)-slash-dominance).
- Clark, Khandelwal, Levy, Manning 2019 (JS distance between heads).
- Nam et al. 2025, arXiv 2505.13737 (causal head gating classes).
- Mann & Whitney 1947 (AUROC as a rank statistic; its null variance sets the tests' bands).

This module never imports torch: it reads the store and the analysers only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import dask
import numpy as np
import xarray as xr
from scipy.stats import rankdata, spearmanr
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from dynamics import store
from dynamics.analysis.divergence import divergence_from_init, js_distance
from dynamics.analysis.pipeline import AnalysisOptions
from dynamics.analysis.redundancy import cluster_heads
from dynamics.analysis.roles import ROLES, assign_roles, role_scores
from dynamics.analysis.slash import best_offset, slash_dominant, slash_score
from dynamics.schema import HEAD, LAYER, SNAPSHOT, TRAIN_STEP, WEIGHT

__all__ = [
    "CHG_CLASSES",
    "GROUPINGS",
    "MODELS",
    "TARGETS",
    "UNITS",
    "PredictError",
    "PredictOptions",
    "Run",
    "TargetSpec",
    "check_runs",
    "cross_validate",
    "derived_name",
    "early_snapshots",
    "feature_table",
    "final_targets",
    "format_curve",
    "group_splits",
    "head_features",
    "horizon_steps",
    "load_runs",
    "predict_runs",
    "predict_store",
    "score",
    "target_table",
    "write_curve",
]


@dataclass(frozen=True)
class TargetSpec:
    """What a target is and how a prediction of it is scored."""

    task: str
    """"binary", "multiclass" or "regression"."""
    metric: str
    """"auroc", "balanced_accuracy" or "spearman"."""
    chance: float | None
    """Metric of an uninformed predictor (None for balanced accuracy: 1 / number of classes)."""
    description: str
    """One line for tables and the report."""


TARGETS: dict[str, TargetSpec] = {
    "slash": TargetSpec("binary", "auroc", 0.5, "slash-dominant at the final snapshot"),
    "role": TargetSpec("multiclass", "balanced_accuracy", None, "role label at the final snapshot"),
    "importance": TargetSpec("regression", "spearman", 0.0, "importance rank within the layer at the final snapshot"),
    "chg": TargetSpec("multiclass", "balanced_accuracy", None, "causal-head-gating class at the final snapshot"),
    "redundant": TargetSpec("binary", "auroc", 0.5, "shares its cluster with another head at the final snapshot"),
}
"""Target name -> what it is; see the module docstring."""

MODELS = ("chance", "layer", "init_linear", "init_boosting", "linear", "boosting")
"""Model names, in table order: the baselines first.

- ``chance``: a constant (the training-fold prior, or its majority class).
- ``layer``: the training-fold prior of the head's layer index (class-balanced for
  multiclass targets, the layer mean for importance).
- ``init_linear``, ``init_boosting``: the models below on features of the first snapshot
  (initialisation) only; they do not depend on the horizon.
- ``linear``: logistic regression (ridge regression for importance) on standardised features.
- ``boosting``: histogram gradient boosting on the raw features.
"""

GROUPINGS = ("seed", "run", "config")
"""What cross-validation holds out together: a whole seed, a run, or a whole config
(the swept values other than the seed)."""

UNITS = ("fraction", "step")
"""How horizons are given: a fraction of each run's length, or a training step."""

CHG_CLASSES = ("facilitating", "irrelevant", "interfering", "inconsistent")
"""Names of the ``chg_role`` codes 0..3, as ``dynamics.gates.CHG_ROLES`` (not imported here:
that module imports torch); -1 means not fitted."""

SEED_AXIS = "train.seed"
_TINY = 1e-12  # floor before log10: a zero gradient norm stays finite (-12), not -inf
_SNAPSHOT_VARS = ("grad_norm", "grad_cosine", "importance")  # small; loaded whole once per run


class PredictError(ValueError):
    """Bad input for the predictor (unknown target, too few runs, a single group...): one line."""


@dataclass(frozen=True)
class PredictOptions:
    """Everything that decides one prediction table; stored in the result's attrs."""

    target: str = "slash"
    """One of `TARGETS`."""
    horizons: tuple[float, ...] = (0.1,)
    """Horizons h: features see the snapshots with step <= h (see `unit`)."""
    unit: str = "fraction"
    """"fraction": h in [0, 1] of each run's length (its final snapshot's step; h = 1 sees
    the final snapshot, which defines the target: a ceiling, not a prediction). "step": h is a
    training step, at most the shortest run's length."""
    group_by: str = "seed"
    """What cross-validation holds out together, one of `GROUPINGS`."""
    n_splits: int = 5
    """Folds of GroupKFold; fewer when there are fewer groups (then one group per fold)."""
    use_stored_analysis: bool = True
    """Read final-snapshot targets from ``analysis/<run_id>`` when it covers the run's final
    step; otherwise (or when False) they are computed from the final snapshot."""
    analysis: AnalysisOptions = field(default_factory=AnalysisOptions)
    """Thresholds of the analysers, for targets computed here and for early features."""
    min_heads: int = 10
    """Fewest labelled heads a table may have."""
    logistic_c: float = 1.0
    """Inverse l2 strength of the logistic regression."""
    ridge_alpha: float = 1.0
    """l2 strength of the ridge regression (importance target)."""
    boosting_iter: int = 100
    """Boosting iterations (trees per class); no early stopping, so results are reproducible."""
    boosting_min_leaf: int | None = None
    """Fewest training heads per leaf. None: min(20, max(3, n_train // 8)), so that the small
    tables of a modest sweep can still be split (scikit-learn's fixed 20 would leave a fold of
    40 heads with at most one split)."""
    random_state: int = 0
    """Seed of the boosting models."""

    def __post_init__(self):
        if self.target not in TARGETS:
            raise PredictError(f"unknown target {self.target!r}; one of: {', '.join(TARGETS)}")
        if self.unit not in UNITS:
            raise PredictError(f"unknown horizon unit {self.unit!r}; one of: {', '.join(UNITS)}")
        if self.group_by not in GROUPINGS:
            raise PredictError(f"unknown grouping {self.group_by!r}; one of: {', '.join(GROUPINGS)}")
        if not self.horizons:
            raise PredictError("no horizons given")
        for h in self.horizons:
            if not isinstance(h, (int, float)) or not math.isfinite(h):
                raise PredictError(f"horizon {h!r} is not a number")
            if self.unit == "fraction" and not 0.0 <= h <= 1.0:
                raise PredictError(f"horizon {h} out of range: a fraction of the run must lie in [0, 1]")
            if self.unit == "step" and h < 0:
                raise PredictError(f"horizon step {h} out of range: must be >= 0")
        if len(set(self.horizons)) != len(self.horizons):
            raise PredictError(f"horizons repeat: {list(self.horizons)}")
        if self.n_splits < 2:
            raise PredictError(f"n_splits must be >= 2; got {self.n_splits}")
        if self.min_heads < 2:
            raise PredictError(f"min_heads must be >= 2; got {self.min_heads}")
        if self.boosting_iter < 1:
            raise PredictError(f"boosting_iter must be >= 1; got {self.boosting_iter}")
        if self.boosting_min_leaf is not None and self.boosting_min_leaf < 1:
            raise PredictError(f"boosting_min_leaf must be >= 1; got {self.boosting_min_leaf}")


@dataclass(frozen=True)
class Run:
    """One run as the predictor sees it: its recordings and what groups it."""

    run_id: str
    data: xr.Dataset
    """Recorded variables as from `dynamics.store.open_run` (lazy is fine)."""
    seed: Any = None
    """The run's seed (grouping "seed")."""
    config: str = ""
    """The run's swept values other than the seed, as one label (grouping "config")."""
    analysis: xr.Dataset | None = None
    """Stored analysis, used for final-snapshot targets only."""

    def group(self, group_by: str) -> str:
        """The cross-validation group label of this run."""
        if group_by == "run":
            return self.run_id
        if group_by == "seed":
            if self.seed is None:
                raise PredictError(f"run {self.run_id!r} records no seed; use grouping 'run'")
            return f"seed={self.seed}"
        return self.config


# --------------------------------------------------------------------------- slicing


def early_snapshots(run: xr.Dataset, step: float) -> xr.Dataset:
    """The run as recorded up to training step `step`: the only view features may see.

    Every variable along ``snapshot`` keeps the snapshots with ``step <= step``, every
    variable along ``train_step`` the steps ``<= step``; variables without a time dim (probe
    tokens) are kept whole.

    Parameters
    ----------
    run : Dataset
        A run, with the ``step`` coordinate on ``snapshot``.
    step : float
        The horizon, in training steps.

    Returns
    -------
    Dataset
        Lazy when `run` is.

    Raises
    ------
    PredictError
        If no snapshot was taken at or before `step`.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"importance": (("snapshot",), np.arange(4.0))},
    ...                 coords={"step": ("snapshot", [0, 10, 20, 40])})
    >>> early_snapshots(ds, 15)["importance"].values.tolist()
    [0.0, 1.0]
    """
    steps = np.asarray(run["step"].values, dtype=np.float64)
    keep = np.flatnonzero(steps <= step)
    if keep.size == 0:
        rid = run.attrs.get("run_id", "?")
        raise PredictError(f"run {rid!r} has no snapshot at or before step {step:g} (first is {steps.min():g})")
    out = run.isel({SNAPSHOT: keep})
    if TRAIN_STEP in out.dims:
        ts = np.asarray(out[TRAIN_STEP].values if TRAIN_STEP in out.coords else np.arange(out.sizes[TRAIN_STEP]))
        out = out.isel({TRAIN_STEP: np.flatnonzero(ts <= step)})
    return out


def horizon_steps(run: xr.Dataset, horizons: Sequence[float], unit: str) -> np.ndarray:
    """Horizons in training steps for one run (fractions scale its final snapshot's step).

    Examples
    --------
    >>> import xarray as xr
    >>> ds = xr.Dataset(coords={"step": ("snapshot", [0, 10, 200])})
    >>> horizon_steps(ds, [0, 0.1, 1.0], "fraction").tolist()
    [0.0, 20.0, 200.0]
    """
    final = float(np.max(run["step"].values))
    h = np.asarray(horizons, dtype=np.float64)
    return h * final if unit == "fraction" else h


# --------------------------------------------------------------------------- features


def _rel(x: np.ndarray) -> np.ndarray:
    # (L, H) minus the layer mean: where a head stands among its peers, free of run-level scale
    # (learning rate and init scale move every head's gradients together).
    return x - x.mean(axis=1, keepdims=True)


def _rank_in_layer(x: np.ndarray) -> np.ndarray:
    # (L, H) -> rank in [0, 1] within each layer (average ties); 0.5 for a lone head.
    n = x.shape[1]
    if n < 2:
        return np.full(x.shape, 0.5)
    return (rankdata(x, axis=1) - 1.0) / (n - 1.0)


def _masked_mean(x: np.ndarray, axis: int = 0) -> np.ndarray:
    # NaN-skipping mean that stays NaN (without a warning) where nothing is left.
    ok = np.isfinite(x)
    count = ok.sum(axis=axis)
    total = np.where(ok, x, 0.0).sum(axis=axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _slope(series: np.ndarray, t: np.ndarray) -> np.ndarray:
    # least-squares slope of (S, L, H) against t (S,); 0 with a single snapshot.
    if t.size < 2 or np.ptp(t) == 0:
        return np.zeros(series.shape[1:])
    tc = (t - t.mean())[:, None, None]
    return (tc * (series - series.mean(axis=0))).sum(axis=0) / (tc**2).sum()


def _trajectory(out: dict, name: str, series: np.ndarray, t: np.ndarray) -> None:
    # series (S, L, H) over the snapshots seen, first = initialisation, last = horizon.
    out[f"{name}_init"] = series[0]
    out[f"{name}_h"] = series[-1]
    out[f"{name}_mean"] = series.mean(axis=0)
    out[f"{name}_slope"] = _slope(series, t)
    out[f"{name}_rel_init"] = _rel(series[0])
    out[f"{name}_rel_h"] = _rel(series[-1])


def _distance_features(out: dict, jsd: np.ndarray, when: str) -> None:
    # jsd (L, H, L, H) of one snapshot -> mean distance to the layer's other heads, and to the
    # nearest other head of the model.
    L, H = jsd.shape[:2]
    d = jsd.reshape(L * H, L * H).copy()
    np.fill_diagonal(d, np.nan)
    nearest = np.where(np.isnan(d), np.inf, d).min(axis=1)  # inf: no other head to compare with
    out[f"js_nearest_{when}"] = np.where(np.isfinite(nearest), nearest, np.nan).reshape(L, H)
    block = np.stack([jsd[layer, :, layer, :] for layer in range(L)]).astype(np.float64)  # (L, H, H)
    for layer in range(L):
        np.fill_diagonal(block[layer], np.nan)
    out[f"js_layer_{when}"] = _masked_mean(block, axis=2)


def head_features(early: xr.Dataset, options: AnalysisOptions | None = None) -> xr.DataArray:
    """Features of every head from a run cut to its early snapshots.

    Pass the output of `early_snapshots`: this function uses every snapshot it is given, the
    first as initialisation and the last as the horizon. The features are listed in the
    module docstring; analysis-derived ones (role scores, slash scores, JS distances) are
    computed here from the given attention, at its first and last snapshots.

    Parameters
    ----------
    early : Dataset
        ``grad_norm``, ``grad_cosine`` (snapshot, layer, head, weight), ``importance``,
        ``attention``, ``probe_tokens``; optionally ``head_weights``. Missing variables drop
        their features.
    options : AnalysisOptions, optional
        Role thresholds (token id, band width, slash window) and the slash offset range.

    Returns
    -------
    DataArray
        float64 ``(layer, head, feature)``, with the feature names as the coordinate.

    Examples
    --------
    >>> feats = head_features(early_snapshots(run, 100))  # doctest: +SKIP
    >>> feats.sel(feature="grad_norm_q_slope")  # doctest: +SKIP
    """
    opt = options or AnalysisOptions()
    t = np.log1p(np.asarray(early["step"].values, dtype=np.float64))
    first_last = [0, early.sizes[SNAPSHOT] - 1]
    ref = next((early[v] for v in ("importance", "grad_norm", "attention") if v in early), None)
    if ref is None:
        raise PredictError(f"run {early.attrs.get('run_id', '?')!r} records no grad_norm, importance or attention")
    L, H = ref.sizes[LAYER], ref.sizes[HEAD]
    out: dict[str, np.ndarray] = {}
    layer = np.broadcast_to(np.arange(L, dtype=np.float64)[:, None], (L, H))
    out["layer"] = layer
    out["depth"] = layer / max(L - 1, 1)

    for var in ("grad_norm", "grad_cosine"):
        if var not in early:
            continue
        arr = early[var].transpose(SNAPSHOT, LAYER, HEAD, WEIGHT)
        names = [str(w) for w in arr[WEIGHT].values] if WEIGHT in arr.coords else [str(i) for i in range(arr.sizes[WEIGHT])]
        values = np.asarray(arr.values, dtype=np.float64)
        for i, w in enumerate(names):
            if var == "grad_norm":
                _trajectory(out, f"grad_norm_{w}", np.log10(values[..., i] + _TINY), t)
            else:  # undefined (NaN) at the first snapshot: there is no earlier gradient
                out[f"grad_cosine_{w}_mean"] = _masked_mean(values[1:, ..., i]) if len(values) > 1 else np.full((L, H), np.nan)
                out[f"grad_cosine_{w}_h"] = values[-1, ..., i] if len(values) > 1 else np.full((L, H), np.nan)

    if "importance" in early:
        imp = np.asarray(early["importance"].transpose(SNAPSHOT, LAYER, HEAD).values, dtype=np.float64)
        _trajectory(out, "importance", np.log10(imp + _TINY), t)
        out["importance_rank_init"] = _rank_in_layer(imp[0])
        out["importance_rank_h"] = _rank_in_layer(imp[-1])
        norm = np.sqrt((imp[-1] ** 2).sum(axis=1, keepdims=True))  # Michel et al.'s per-layer l2 norm
        out["importance_share_h"] = np.where(norm > 0, imp[-1] / np.where(norm > 0, norm, 1.0), np.nan)

    if "attention" in early and "probe_tokens" in early:
        # plain positional arrays: the analysers' coordinate alignment costs more than their
        # arithmetic on arrays this small
        attn = early["attention"].isel({SNAPSHOT: first_last}).transpose(SNAPSHOT, LAYER, HEAD, ...)
        attn = xr.DataArray(np.asarray(attn.values), dims=attn.dims)
        tokens = xr.DataArray(np.asarray(early["probe_tokens"].values), dims=early["probe_tokens"].dims)
        T = attn.sizes["query"]
        scores = role_scores(attn, tokens, opt.roles)
        for role in ROLES[:-1]:
            s = np.asarray(scores[role].values, dtype=np.float64)
            out[f"{role}_init"], out[f"{role}_h"], out[f"{role}_change"] = s[0], s[1], s[1] - s[0]
        slash = slash_score(attn, max_offset=min(opt.max_offset, T - 1))
        offset, best = best_offset(slash, min_offset=min(opt.slash_min_offset, T - 1))
        best = np.asarray(best.values, dtype=np.float64)
        out["best_slash_init"], out["best_slash_h"] = best[0], best[1]
        out["best_offset_h"] = np.asarray(offset.values, dtype=np.float64)[1]
        jsd = np.asarray(js_distance(attn).values, dtype=np.float64)  # (2, L, H, L, H)
        _distance_features(out, jsd[0], "init")
        _distance_features(out, jsd[1], "h")
        out["divergence_from_init_h"] = np.asarray(divergence_from_init(attn).values, dtype=np.float64)[1]

    if "head_weights" in early:
        w = early["head_weights"].isel({SNAPSHOT: first_last}).transpose(SNAPSHOT, LAYER, HEAD, WEIGHT, ...)
        values = np.asarray(w.values, dtype=np.float64)
        norms = np.log10(np.sqrt((values**2).reshape(*values.shape[:4], -1).sum(-1)) + _TINY)  # (2, L, H, 4)
        names = [str(x) for x in w[WEIGHT].values] if WEIGHT in w.coords else [str(i) for i in range(w.sizes[WEIGHT])]
        for i, name in enumerate(names):
            out[f"weight_norm_{name}_init"] = norms[0, ..., i]
            out[f"weight_norm_{name}_rel_init"] = _rel(norms[0, ..., i])
            out[f"weight_norm_{name}_change"] = norms[1, ..., i] - norms[0, ..., i]

    names = list(out)
    data = np.stack([np.broadcast_to(np.asarray(out[n], dtype=np.float64), (L, H)) for n in names], axis=-1)
    coords = {d: ref[d].values for d in (LAYER, HEAD) if d in ref.coords}
    return xr.DataArray(data, dims=(LAYER, HEAD, "feature"), coords={**coords, "feature": names}, name="features")


# --------------------------------------------------------------------------- targets


def _final_stored(run: xr.Dataset, analysis: xr.Dataset | None, needed: tuple[str, ...]) -> xr.Dataset | None:
    # The stored analysis's final snapshot, if it has what is needed and covers the run's end.
    if analysis is None or any(v not in analysis for v in needed) or "step" not in analysis.coords:
        return None
    if float(analysis["step"].values[-1]) != float(np.max(run["step"].values)):
        return None  # analysed before the run finished: its last snapshot is not the final one
    return analysis[list(needed)].isel({SNAPSHOT: -1})


def final_targets(
    run: xr.Dataset,
    target: str,
    analysis: xr.Dataset | None = None,
    options: AnalysisOptions | None = None,
) -> xr.Dataset:
    """One target per head, read from the run's final snapshot.

    From the stored analysis when it is given and covers the final step, else computed from
    the final snapshot with the analysers (the same calls as `analyse_run`).

    Parameters
    ----------
    run : Dataset
        The whole run.
    target : str
        One of `TARGETS`.
    analysis : Dataset, optional
        ``analysis/<run_id>`` as stored.
    options : AnalysisOptions, optional
        Thresholds used when the targets are computed here.

    Returns
    -------
    Dataset
        ``(layer, head)``: ``target`` float64, NaN where a head has no label (no CHG fit,
        missing head, a lone head for the importance rank); for ``slash`` also ``offset``, the
        best slash offset. ``attrs["source"]`` says where the targets came from.

    Examples
    --------
    >>> final_targets(open_run("runs.zarr"), "slash")["target"].values  # doctest: +SKIP
    """
    if target not in TARGETS:
        raise PredictError(f"unknown target {target!r}; one of: {', '.join(TARGETS)}")
    opt = options or AnalysisOptions()
    last = run.isel({SNAPSHOT: -1})
    out = xr.Dataset()
    source = "recorded"

    if target == "importance":
        imp = np.asarray(last["importance"].transpose(LAYER, HEAD).values, dtype=np.float64)
        rank = _rank_in_layer(imp) if imp.shape[1] > 1 else np.full(imp.shape, np.nan)
        out["target"] = ((LAYER, HEAD), np.where(np.isnan(imp), np.nan, rank))
    elif target == "chg":
        codes = np.asarray(last["chg_role"].transpose(LAYER, HEAD).values, dtype=np.float64)
        out["target"] = ((LAYER, HEAD), np.where(codes >= 0, codes, np.nan))  # -1: not fitted
    else:
        needed = {"slash": ("slash_dominant", "best_offset"), "role": ("role",), "redundant": ("cluster",)}[target]
        stored = _final_stored(run, analysis, needed)
        if stored is not None:
            source = "stored analysis"
        else:
            source = "computed from the final snapshot"
            attn = last["attention"].transpose(LAYER, HEAD, ...).load()
            if target == "slash":
                scores = slash_score(attn, max_offset=min(opt.max_offset, attn.sizes["query"] - 1))
                offset, _ = best_offset(scores, min_offset=opt.slash_min_offset)
                dominant = slash_dominant(scores, kappa=opt.kappa, min_offset=opt.slash_min_offset)
                stored = xr.Dataset({"slash_dominant": dominant, "best_offset": offset})
            elif target == "role":
                stored = xr.Dataset({"role": assign_roles(role_scores(attn, last["probe_tokens"].load(), opt.roles), opt.roles)})
            else:
                stored = xr.Dataset({"cluster": cluster_heads(js_distance(attn), threshold=opt.cluster_threshold)})
        stored = stored.transpose(LAYER, HEAD, ...)
        if target == "slash":
            flag = np.asarray(stored["slash_dominant"].values, dtype=np.float64)
            present = (last["attention"].isel(probe=0, query=0, key=0).transpose(LAYER, HEAD).notnull().values
                       if "attention" in last else np.ones(flag.shape, bool))
            out["target"] = ((LAYER, HEAD), np.where(present, flag, np.nan))
            out["offset"] = ((LAYER, HEAD), np.asarray(stored["best_offset"].values, dtype=np.float64))
        elif target == "role":
            out["target"] = ((LAYER, HEAD), np.asarray(stored["role"].values, dtype=np.float64))
        else:
            labels = np.asarray(stored["cluster"].values, dtype=np.int64)
            valid = labels >= 0
            counts = np.bincount(labels[valid].ravel(), minlength=1) if valid.any() else np.zeros(1, int)
            shared = counts[np.where(valid, labels, 0)] >= 2
            out["target"] = ((LAYER, HEAD), np.where(valid, shared.astype(np.float64), np.nan))
    out = out.assign_coords({d: last[d].values for d in (LAYER, HEAD) if d in last.coords})
    out.attrs["source"] = source
    return out


# --------------------------------------------------------------------------- loading


def _seed_of(rid: str, point: Mapping, attrs: Mapping) -> Any:
    if SEED_AXIS in point:
        return point[SEED_AXIS]
    if "seed" in attrs:
        return attrs["seed"]
    return attrs.get("config", {}).get("train", {}).get("seed")


def _config_of(point: Mapping, axes: Sequence[str], attrs: Mapping) -> str:
    if axes:
        return ", ".join(f"{a}={point.get(a)}" for a in axes if a != SEED_AXIS)
    # no sweep index: the whole resolved config less the seed names the config
    cfg = json.loads(json.dumps(attrs.get("config", {})))
    cfg.pop("sweep", None)
    cfg.get("train", {}).pop("seed", None)
    return json.dumps(cfg, sort_keys=True)


def load_runs(path: str, options: PredictOptions | None = None) -> list[Run]:
    """The completed runs of a store, opened lazily, with their groups; checks before any work.

    Runs whose status is not "completed" (running, diverged, failed...) are left out: their
    last snapshot is not a final specialisation. Reads only metadata.

    Parameters
    ----------
    path : str
        A dynamics store.
    options : PredictOptions, optional

    Returns
    -------
    list of Run
        In sweep-index order (store order without an index).

    Raises
    ------
    PredictError
        Fewer than two completed runs; fewer than two groups for the chosen grouping; a
        target whose inputs no run has (``chg_role``, or both attention and analysis); a
        step horizon past the end of a run.
    store.StoreError
        If `path` is not a store.
    """
    opt = options or PredictOptions()
    index = store.read_sweep_index(path) or {}
    present = store.list_runs(path)
    ids = [r for r in index.get("runs", {}) if r in present] if index else present
    axes = list(index.get("axes", []))
    runs, skipped = [], []
    for rid in ids:
        attrs = store.run_attrs(path, rid)
        if attrs.get("status") != "completed":
            skipped.append(f"{rid} ({attrs.get('status', 'no status')})")
            continue
        point = index.get("runs", {}).get(rid, {})
        data = store.open_run(path, rid)
        analysis = store.open_analysis(path, rid) if opt.use_stored_analysis else None
        runs.append(Run(rid, data, _seed_of(rid, point, attrs), _config_of(point, axes, attrs), analysis))
    note = f" ({len(skipped)} not completed: {', '.join(skipped[:3])}{'...' if len(skipped) > 3 else ''})" if skipped else ""
    if len(runs) < 2:
        raise PredictError(f"{path}: {len(runs)} completed run(s){note}; prediction needs at least 2")
    check_runs(runs, opt)
    return runs


def check_runs(runs: Sequence[Run], options: PredictOptions) -> None:
    """Checks that need no array values: groups, target inputs, horizon range."""
    groups = sorted({r.group(options.group_by) for r in runs})
    if len(groups) < 2:
        alt = "; try --group run" if options.group_by != "run" else ""
        raise PredictError(
            f"grouping by {options.group_by}: all {len(runs)} runs fall in one group ({groups[0]!r}), "
            f"so cross-validation is impossible{alt}"
        )
    t = options.target
    if t == "chg" and not any("chg_role" in r.data for r in runs):
        raise PredictError("target 'chg': no run records chg_role (causal head gating was never fitted)")
    if t == "importance":
        lacking = [r.run_id for r in runs if "importance" not in r.data]
        if lacking:
            raise PredictError(f"target 'importance': run {lacking[0]!r} records no importance")
    if t in ("slash", "role", "redundant"):
        lacking = [r.run_id for r in runs if "attention" not in r.data and r.analysis is None]
        if lacking:
            raise PredictError(f"target {t!r}: run {lacking[0]!r} has neither attention nor a stored analysis")
    if not any(v in r.data for r in runs for v in ("grad_norm", "importance", "attention")):
        raise PredictError("no run records grad_norm, importance or attention: nothing to build features from")
    if options.unit == "step":
        for r in runs:
            final = float(np.max(r.data["step"].values))
            if max(options.horizons) > final:
                raise PredictError(
                    f"horizon step {max(options.horizons):g} out of range: run {r.run_id!r} ends at step {final:g}"
                )


# --------------------------------------------------------------------------- tables


def target_table(runs: Sequence[Run], options: PredictOptions) -> xr.Dataset:
    """Targets of every labelled head, one row per head (``head_row``).

    Returns
    -------
    Dataset
        ``target`` (head_row) and, for slash, ``offset``; coords ``row_run``, ``row_layer``,
        ``row_head``, ``row_group``; ``attrs["sources"]`` counts runs by target source.

    Raises
    ------
    PredictError
        Fewer than ``options.min_heads`` labelled heads, or a target with one value only.
    """
    pieces, sources = [], {}
    for r in runs:
        if options.target == "chg" and "chg_role" not in r.data:
            continue  # CHG not fitted in this run: its heads have no label
        ft = final_targets(r.data, options.target, r.analysis, options.analysis)
        sources[ft.attrs["source"]] = sources.get(ft.attrs["source"], 0) + 1
        L, H = ft.sizes[LAYER], ft.sizes[HEAD]
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        keep = np.isfinite(ft["target"].values).ravel()
        row = {
            "target": ft["target"].values.ravel()[keep],
            "row_run": np.full(keep.sum(), r.run_id, dtype=object),
            "row_layer": layer.ravel()[keep],
            "row_head": head.ravel()[keep],
            "row_group": np.full(keep.sum(), r.group(options.group_by), dtype=object),
        }
        if "offset" in ft:
            row["offset"] = ft["offset"].values.ravel()[keep]
        pieces.append(row)
    cat = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]} if pieces else {}
    n = len(cat.get("target", ()))
    spec = TARGETS[options.target]
    if n < options.min_heads:
        raise PredictError(f"target {options.target!r}: {n} labelled head(s), need at least {options.min_heads}")
    values = np.unique(cat["target"])
    if values.size < 2:
        raise PredictError(f"target {options.target!r} is constant: every one of {n} heads has the value {values[0]:g}")
    if len(set(cat["row_group"])) < 2:
        raise PredictError(f"target {options.target!r}: labelled heads fall in one group, so cross-validation is impossible")
    ds = xr.Dataset(
        {"target": ("head_row", cat["target"])},
        coords={k: ("head_row", cat[k].astype(str) if cat[k].dtype == object else cat[k])
                for k in ("row_run", "row_layer", "row_head", "row_group")},
    )
    if "offset" in cat:
        ds["offset"] = ("head_row", cat["offset"])
    ds.attrs.update(target=options.target, task=spec.task, sources=sources)
    return ds


def feature_table(runs: Sequence[Run], rows: xr.Dataset, horizon: float | None, options: PredictOptions) -> xr.DataArray:
    """Features (head_row, feature) of the heads in `rows`, each from its run cut at the horizon.

    Parameters
    ----------
    runs : sequence of Run
    rows : Dataset
        From `target_table` (``row_run``, ``row_layer``, ``row_head``).
    horizon : float or None
        In ``options.unit``; None means the first snapshot only (initialisation).
    options : PredictOptions

    Returns
    -------
    DataArray
        float64 ``(head_row, feature)``; only the features every run provides. ``attrs``
        ``horizon_step`` and ``n_snapshots`` per run id: the step cut at and snapshots seen.
    """
    by_id = {r.run_id: r for r in runs}
    wanted = list(dict.fromkeys(rows["row_run"].values.tolist()))
    per_run, steps, seen = {}, {}, {}
    for rid in wanted:
        data = by_id[rid].data
        if horizon is None:
            step = float(np.min(data["step"].values))
        else:
            step = float(horizon_steps(data, [horizon], options.unit)[0])
        early = early_snapshots(data, step)  # cut FIRST: nothing below sees later snapshots
        per_run[rid] = head_features(early, options.analysis)
        steps[rid] = float(np.max(early["step"].values))
        seen[rid] = int(early.sizes[SNAPSHOT])
    names = {rid: set(p["feature"].values.tolist()) for rid, p in per_run.items()}
    common = [f for f in per_run[wanted[0]]["feature"].values.tolist() if all(f in n for n in names.values())]
    run_of = rows["row_run"].values
    layer_of, head_of = rows["row_layer"].values, rows["row_head"].values
    X = np.empty((rows.sizes["head_row"], len(common)))
    for rid, feats in per_run.items():
        sel = np.flatnonzero(run_of == rid)
        values = feats.sel(feature=common).values  # (L, H, F), positional layer/head
        X[sel] = values[layer_of[sel], head_of[sel]]
    return xr.DataArray(
        X, dims=("head_row", "feature"), coords={"feature": common}, name="features",
        attrs={"horizon_step": steps, "n_snapshots": seen},
    )


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
    # multiclass: argmax_c P(layer | c), the class-balanced decision (the models are balanced too)
    classes = np.unique(y_train)
    layers = np.unique(layer_train)
    counts = np.array([[np.sum((y_train == c) & (layer_train == layer)) for layer in layers] for c in classes])
    p_layer = (counts + 1.0) / (counts.sum(axis=1, keepdims=True) + layers.size)  # (C, layers)
    majority = classes[np.argmax([np.sum(y_train == c) for c in classes])]
    for i, layer in enumerate(layer_test):
        j = np.flatnonzero(layers == layer)
        out[i] = classes[np.argmax(p_layer[:, j[0]])] if j.size else majority
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
    - ``balanced_accuracy``: mean recall over the classes present in ``y_true``; any
      constant prediction gives 1 / (number of classes).
    - ``spearman``: NaN when ``y_true`` is constant; constant predictions give 0 (no ranking).

    Examples
    --------
    >>> score("auroc", [0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    >>> score("balanced_accuracy", [0, 0, 0, 1], [0, 0, 0, 0])
    0.5
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
        return float(np.mean([np.mean(y_pred[y_true == c] == c) for c in classes])) if classes.size else float("nan")
    if metric == "spearman":
        if y_true.size < 3 or np.ptp(y_true) == 0:
            return float("nan")
        if np.ptp(y_pred) == 0:
            return 0.0
        return float(spearmanr(y_true, y_pred).statistic)
    raise PredictError(f"unknown metric {metric!r}")


def _mean_sd(values: np.ndarray) -> tuple[float, float]:
    ok = values[np.isfinite(values)]
    if ok.size == 0:
        return float("nan"), float("nan")
    return float(ok.mean()), float(ok.std(ddof=1)) if ok.size > 1 else 0.0


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


# --------------------------------------------------------------------------- whole pipeline


def _preload(data: xr.Dataset) -> xr.Dataset:
    # Read the small variables once: each horizon then slices memory, not the store (a dask
    # compute per access costs more than the features). Attention and head weights stay lazy:
    # only the snapshots a horizon needs are ever read.
    small = [n for n in data.data_vars if n not in ("attention", "head_weights")]
    with dask.config.set(scheduler="synchronous"):  # one small read: a thread pool only adds overhead
        loaded = data[small].reset_coords().compute()
    return data.assign(loaded.data_vars).assign_coords(loaded.coords)


def predict_runs(runs: Sequence[Run], options: PredictOptions | None = None) -> xr.Dataset:
    """Targets, features at every horizon, grouped cross-validation, as one dataset.

    Parameters
    ----------
    runs : sequence of Run
        From `load_runs`, or built in memory.
    options : PredictOptions, optional

    Returns
    -------
    Dataset
        The curve (see `predict_store` for the schema).

    Raises
    ------
    PredictError
        For the cases of `check_runs` and `target_table`.
    """
    opt = options or PredictOptions()
    check_runs(runs, opt)
    runs = [Run(r.run_id, _preload(r.data), r.seed, r.config, r.analysis) for r in runs]
    spec = TARGETS[opt.target]
    rows = target_table(runs, opt)
    groups = rows["row_group"].values
    splits = group_splits(groups, opt.n_splits)
    fold_of = np.empty(rows.sizes["head_row"], dtype=np.int64)
    for k, (_, test) in enumerate(splits):
        fold_of[test] = k

    init = feature_table(runs, rows, None, opt)
    tables = {h: feature_table(runs, rows, h, opt) for h in opt.horizons}
    preds, scores = cross_validate(
        {h: t.values for h, t in tables.items()}, init.values, rows["target"].values,
        rows["row_layer"].values, splits, opt,
    )
    pooled = np.array([[score(spec.metric, rows["target"].values, preds[i, m]) for m in range(len(MODELS))]
                       for i in range(len(opt.horizons))])
    summary = np.array([[_mean_sd(scores[i, m]) for m in range(len(MODELS))] for i in range(len(opt.horizons))])

    run_ids = list(dict.fromkeys(rows["row_run"].values.tolist()))
    horizon_step = np.array([[tables[h].attrs["horizon_step"][r] for r in run_ids] for h in opt.horizons])
    n_seen = np.array([[tables[h].attrs["n_snapshots"][r] for r in run_ids] for h in opt.horizons])
    ds = xr.Dataset(
        {
            "score": (("horizon", "model", "fold"), scores),
            "score_mean": (("horizon", "model"), summary[..., 0]),
            "score_std": (("horizon", "model"), summary[..., 1]),
            "score_pooled": (("horizon", "model"), pooled),
            "prediction": (("horizon", "model", "head_row"), preds),
            "target": rows["target"],
            "n_test": ("fold", np.array([test.size for _, test in splits])),
            "test_groups": ("fold", np.array([", ".join(sorted(set(groups[test]))) for _, test in splits])),
            "horizon_step": (("horizon", "run"), horizon_step),
            "n_snapshots_seen": (("horizon", "run"), n_seen),
        },
        coords={
            "horizon": np.asarray(opt.horizons, dtype=np.float64),
            "model": list(MODELS),
            "fold": np.arange(len(splits)),
            "run": run_ids,
            **{k: rows[k] for k in ("row_run", "row_layer", "row_head", "row_group")},
            "row_fold": ("head_row", fold_of),
        },
    )
    if "offset" in rows:
        ds["target_offset"] = rows["offset"]
    classes = np.unique(rows["target"].values)
    ds.attrs.update(
        target=opt.target,
        description=spec.description,
        task=spec.task,
        metric=spec.metric,
        chance=spec.chance if spec.chance is not None else 1.0 / classes.size,
        horizon_unit=opt.unit,
        group_by=opt.group_by,
        n_splits=len(splits),
        n_runs=len(run_ids),
        n_groups=int(np.unique(groups).size),
        features=tables[opt.horizons[0]]["feature"].values.tolist(),
        init_features=init["feature"].values.tolist(),
        target_sources=rows.attrs["sources"],
        options={k: v for k, v in asdict(opt).items() if k != "analysis"},
        analysis_options={k: v for k, v in asdict(opt.analysis).items() if k != "roles"},
        role_thresholds=asdict(opt.analysis.roles),
    )
    if spec.task != "regression":
        ds.attrs["classes"] = classes.astype(int).tolist()
        ds.attrs["class_counts"] = [int(np.sum(rows["target"].values == c)) for c in classes]
    if opt.target in ("role", "chg"):
        names = ROLES if opt.target == "role" else CHG_CLASSES
        ds.attrs["class_names"] = [names[int(c)] if 0 <= c < len(names) else str(int(c)) for c in classes]
    return ds


def predict_store(path: str, options: PredictOptions | None = None) -> xr.Dataset:
    """The "how early can we know" curve of one target over the completed runs of a store.

    Parameters
    ----------
    path : str
        A dynamics store with at least two completed runs in at least two groups.
    options : PredictOptions, optional

    Returns
    -------
    Dataset
        Dims ``horizon`` (the horizons, in ``attrs["horizon_unit"]``), ``model`` (`MODELS`),
        ``fold``, ``head_row`` (one labelled head), ``run``:

        - ``score`` (horizon, model, fold): the metric ``attrs["metric"]`` on each test fold
          (NaN where undefined, e.g. a fold with one class);
        - ``score_mean``, ``score_std`` (horizon, model): over the folds where defined;
        - ``score_pooled`` (horizon, model): the metric over all out-of-fold predictions;
        - ``prediction`` (horizon, model, head_row): out-of-fold predictions;
        - ``target`` (head_row), and ``target_offset`` for the slash target;
        - ``n_test``, ``test_groups`` (fold); ``horizon_step``, ``n_snapshots_seen``
          (horizon, run): the step each run was cut at and the snapshots its features saw;
        - coords ``row_run``, ``row_layer``, ``row_head``, ``row_group``, ``row_fold``.

        ``attrs``: target, description, task, metric, chance, horizon_unit, group_by,
        n_splits, n_runs, n_groups, features, init_features, target_sources, options,
        classes / class_counts (classification), class_names (role, chg).

    Example
    -------
    >>> curve = predict_store("runs.zarr", PredictOptions(target="slash", horizons=(0, 0.1, 0.5)))  # doctest: +SKIP
    >>> curve.score_mean.sel(model="boosting") - curve.score_mean.sel(model="init_boosting")  # doctest: +SKIP
    """
    opt = options or PredictOptions()
    return predict_runs(load_runs(path, opt), opt)


def derived_name(target: str) -> str:
    """Name of the curve of `target` under ``STORE/derived/`` (a group name has no '/')."""
    return f"predict.{target}"


def write_curve(path: str, curve: xr.Dataset) -> str:
    """Store `curve` as ``derived/predict.<target>`` (replacing it); returns that name."""
    name = derived_name(curve.attrs["target"])
    store.write_derived(path, name, curve)
    return name


def _horizon_label(h: float, unit: str) -> str:
    return f"h={h:g}" if unit == "fraction" else f"step {h:g}"


def format_curve(curve: xr.Dataset) -> str:
    """The curve as a text table: one row per model, one column per horizon, mean ± sd over folds.

    Example
    -------
    >>> print(format_curve(predict_store("runs.zarr")))  # doctest: +SKIP
    """
    a = curve.attrs
    metric = {"auroc": "AUROC", "balanced_accuracy": "balanced accuracy", "spearman": "Spearman"}[a["metric"]]
    lines = [
        f"target {a['target']}: {a['description']}",
        f"{curve.sizes['head_row']} heads in {a['n_runs']} runs; {a['n_splits']} folds holding out whole "
        f"{a['group_by']}s ({a['n_groups']} groups); {metric}, mean ± sd over folds (chance {a['chance']:.2f})",
    ]
    if "classes" in a:
        names = a.get("class_names", a["classes"])
        lines.append("classes: " + ", ".join(f"{n}={c}" for n, c in zip(names, a["class_counts"], strict=True)))
    header = ["model"] + [_horizon_label(float(h), a["horizon_unit"]) for h in curve["horizon"].values]
    rows = []
    for m in curve["model"].values:
        cells = [str(m)]
        for h in curve["horizon"].values:
            mean = float(curve["score_mean"].sel(horizon=h, model=m))
            sd = float(curve["score_std"].sel(horizon=h, model=m))
            cells.append("n/a" if math.isnan(mean) else f"{mean:.3f} ± {sd:.3f}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)
