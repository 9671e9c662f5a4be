"""Features of every head from a run cut at a horizon: the only view of a run features may see."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from scipy.stats import rankdata

from dynamics.analysis.bifurcation import head_importance
from dynamics.analysis.divergence import divergence_from_init, js_distance
from dynamics.analysis.pipeline import AnalysisOptions, slash_dominance
from dynamics.analysis.roles import ROLES, role_scores
from dynamics.analysis.slash import slash_score
from dynamics.predict.options import UNITS, PredictError, PredictOptions, Run, check_arguments
from dynamics.schema import HEAD, LAYER, SNAPSHOT, TRAIN_STEP, WEIGHT

_TINY = 1e-12  # floor before log10: a zero gradient norm stays finite (-12), not -inf


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
    >>> horizon_steps(xr.Dataset(coords={"step": ("snapshot", [0, 400])}), [0.575], "fraction").tolist()
    [230.0]
    """
    if unit not in UNITS:  # "fractions" was taken as steps: h = 0.5 a step, not half the run
        raise ValueError(f"horizon_steps: unknown unit {unit!r}; one of: {', '.join(UNITS)}")
    final = float(np.nanmax(run["step"].values))  # a run picked from a sweep: NaN steps are its padding
    h = np.asarray(horizons, dtype=np.float64)
    if unit != "fraction":
        return h
    if not ((h >= 0.0) & (h <= 1.0)).all():  # 2.0 of a 40-step run was step 80, past its end
        raise ValueError(f"horizon_steps: fraction horizons must be in [0, 1]; got {h.tolist()}")
    # Steps are whole numbers, and a fraction given in decimal is rarely exact in binary:
    # 0.575 * 400 is 229.99999999999997, which would leave out the snapshot at step 230.
    steps = h * final
    whole = np.round(steps)
    return np.where(np.abs(steps - whole) <= 1e-9 * max(final, 1.0), whole, steps)


# --------------------------------------------------------------------------- features


def _rel(x: np.ndarray) -> np.ndarray:
    # (L, H) minus the layer mean: where a head stands among its peers, free of run-level scale
    # (learning rate and init scale move every head's gradients together).
    return x - x.mean(axis=1, keepdims=True)


def _rank_in_layer(x: np.ndarray) -> np.ndarray:
    # (L, H) -> rank in [0, 1] among each layer's non-NaN heads (average ties); 0.5 for a head
    # with no peer; NaN where x is. Plain rankdata made a whole layer NaN for one NaN head.
    ok = ~np.isnan(x)
    n = ok.sum(axis=1, keepdims=True)  # (L, 1)
    rank = rankdata(x, axis=1, nan_policy="omit")  # (L, H), 1..n per layer, NaN where x is
    return np.where(ok, np.where(n > 1, (rank - 1.0) / np.maximum(n - 1.0, 1.0), 0.5), np.nan)


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
    check_arguments("head_features", options, AnalysisOptions, early)
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
        imp = head_importance(early["importance"], early["gate"] if "gate" in early else None)  # Michel et al.'s
        imp = np.asarray(imp.transpose(SNAPSHOT, LAYER, HEAD).values, dtype=np.float64)
        _trajectory(out, "importance", np.log10(imp + _TINY), t)
        out["importance_rank_init"] = _rank_in_layer(imp[0])
        out["importance_rank_h"] = _rank_in_layer(imp[-1])
        # Michel et al.'s per-layer l2 norm, over the layer's finite heads as the ranks are: a
        # plain sum made one NaN head's whole layer NaN
        norm = np.sqrt(np.nansum(imp[-1] ** 2, axis=1, keepdims=True))
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
        # the targets' offsets (a sink head is not a long slash), less those where a sink or no
        # pattern already reaches kappa, as analyse_run leaves them out
        slash = slash_score(attn, max_offset=opt.slash_window(T))
        offset, best, _ = slash_dominance(slash, opt, T)
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


# --------------------------------------------------------------------------- feature table


def feature_table(runs: Sequence[Run], rows: xr.Dataset, horizon: float | None, options: PredictOptions,
                  cache: dict | None = None) -> xr.DataArray:
    """Features (head_row, feature) of the heads in `rows`, each from its run cut at the horizon.

    Parameters
    ----------
    runs : sequence of Run
    rows : Dataset
        From `target_table` (``row_run``, ``row_layer``, ``row_head``).
    horizon : float or None
        In ``options.unit``; None means the first snapshot only (initialisation).
    options : PredictOptions
    cache : dict, optional
        Kept across calls with the same runs and options (`predict_runs` passes one): a run cut
        at the same snapshot for two horizons (or for a horizon and initialisation) has its
        features computed once. Keyed by run id and the number of snapshots seen.

    Returns
    -------
    DataArray
        float64 ``(head_row, feature)``; only the features every run provides. ``attrs``
        ``horizon_step`` and ``n_snapshots`` per run id: the step of the last snapshot seen (at or before the horizon)
        and how many were seen.
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
        steps[rid] = float(np.max(early["step"].values))
        seen[rid] = int(early.sizes[SNAPSHOT])
        # early_snapshots keeps a prefix of the snapshots, so its length says which; head_features
        # reads per-snapshot variables only, not the loss that the cut also shortens by step
        key = (rid, seen[rid])
        if cache is not None and key in cache:
            per_run[rid] = cache[key]
            continue
        per_run[rid] = head_features(early, options.analysis)
        if cache is not None:
            cache[key] = per_run[rid]
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
