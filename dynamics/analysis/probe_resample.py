"""How much of a bifurcation step is the probe sample's: the step again on resampled probes.

Every attention-based figure is read on one fixed batch of probe sequences (``record.n_probe``),
drawn once per run. The bifurcation band is set from the run's own first snapshots, on those
same probes, so it holds none of the sample's noise: the quickstart sweep dated its
init-scale-0.5 runs 16 on 4 probes and 32 on 8, the runs bitwise the same (README, Analysis
definitions). This module redraws the probe sample from the recorded one, the bootstrap
(Efron 1979): each resample takes ``n_probe`` probes with replacement, the within-layer
divergence curve is rebuilt from their per-probe JS divergences
(`divergence.js_distance(..., by_probe=True)`), and `bifurcation.bifurcation_step` dates it
again. The spread of those steps is how far the step would move on another sample of probes
like these; it says nothing of the noise of training (seeds) or of probes unlike these.

Sources
-------
- Efron 1979, "Bootstrap methods: another look at the jackknife" (resampling the observed
  units with replacement to see a statistic's sampling variation).
- Hyndman & Fan 1996, "Sample quantiles in statistical packages" (definition 1, the inverse
  of the empirical distribution function, which :func:`probe_range` takes so that each bound
  is a step some resample gave).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynamics.analysis.bifurcation import bifurcation_step
from dynamics.analysis.divergence import HEAD_B, same_layer_block, within_layer_divergence
from dynamics.analysis.js_kernels import BLOCK_BYTES
from dynamics.schema import HEAD, LAYER, PROBE, SNAPSHOT, require_dims

RESAMPLE = "resample"
BOUND = "bound"
N_RESAMPLES = 200
"""Resamples per run: the 5% and 95% quantiles of 200 steps rest on 10 resamples each."""
SEED = 0
"""The resamples' generator seed: every run (and every analysis of it) draws the same ones."""
QUANTILES = (0.05, 0.95)
LABEL_AGREEMENT = 0.9
"""A head whose label fewer than this share of the resamples give is probe-sensitive: the
label counterpart of the step's 5%-95% range (`dynamics analyse` names such heads)."""


def probe_counts(n_probe: int, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.DataArray:
    """How many times each resample draws each recorded probe: multinomial counts of ``n_probe``
    draws with replacement; dims (resample, probe), int64, each row summing to ``n_probe``.

    The role scores weigh probes by these integers, not by :func:`probe_weights`' shares: a sum
    of shares k / P is inexact where P is no power of two, and a head scoring 1.0 on every probe
    read 0.9999999999999999, losing a tie between two roles it passed on every probe.

    Examples
    --------
    >>> c = probe_counts(4, 3)
    >>> c.dims, c.sum("probe").values.tolist()
    (('resample', 'probe'), [4, 4, 4])
    """
    if n_probe < 1 or n_resamples < 1:
        raise ValueError(f"n_probe={n_probe!r} and n_resamples={n_resamples!r} must be >= 1")
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n_probe, np.full(n_probe, 1.0 / n_probe), size=n_resamples)  # (R, P)
    return xr.DataArray(counts, dims=(RESAMPLE, PROBE))


def probe_weights(n_probe: int, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.DataArray:
    """Each resample's share of each recorded probe: :func:`probe_counts` over ``n_probe``;
    dims (resample, probe), each row summing to 1.

    Examples
    --------
    >>> w = probe_weights(4, 3)
    >>> w.dims, w.sum("probe").values.tolist()
    (('resample', 'probe'), [1.0, 1.0, 1.0])
    """
    return probe_counts(n_probe, n_resamples, seed) / n_probe


def weighted_probe_mean(values: xr.DataArray, weights: xr.DataArray, count: xr.DataArray | None = None) -> xr.DataArray:
    """``sum_p w_p values_p / sum_p w_p count_p`` over dim probe (``count_p`` = 1 by default): a
    mean over the multiset of probes that ``weights`` describes, each probe counted ``w_p`` times.

    ``values`` are per-probe means, or per-probe sums over ``count`` queries where probes hold
    unequal numbers of them (induction's queries with a previous occurrence). A NaN value stays
    NaN, whatever its weight, as in the unweighted means' ``skipna=False``; NaN where the weighted
    count is 0. ``weights``, ``(..., probe)``, non-negative with a positive sum over probe (e.g.
    :func:`probe_counts`), add their other dims to the result.

    Examples
    --------
    >>> v = xr.DataArray([1.0, 3.0], dims="probe")
    >>> weighted_probe_mean(v, xr.DataArray([[0.5, 0.5], [1.0, 0.0]], dims=("resample", "probe"))).values.tolist()
    [2.0, 1.0]
    """
    require_dims(weights, (PROBE,), "weights")
    if weights.sizes[PROBE] != values.sizes[PROBE]:
        raise ValueError(f"weights cover {weights.sizes[PROBE]} probes, the values {values.sizes[PROBE]}")
    w = np.asarray(weights.values, dtype=np.float64)
    if not np.isfinite(w).all() or (w < 0).any() or not (w.sum(axis=weights.get_axis_num(PROBE)) > 0).all():
        raise ValueError("weights must be finite and >= 0, with a positive sum over probe for each draw")
    total = xr.dot(values.astype(np.float64), weights, dim=PROBE)
    n = weights.sum(PROBE) if count is None else xr.dot(count.astype(np.float64), weights, dim=PROBE)
    return total / n.where(n > 0)


def _layer_kernel(js, weights, block_bytes):
    # js (..., L, H, H_b, P) within-layer mean JS per probe; weights (R, P) -> (..., R, L)
    lead = js.shape[:-4]
    flat = js.reshape(-1, *js.shape[-4:])  # (S, L, H, H_b, P)
    n_resample = weights.shape[0]
    out = np.empty((flat.shape[0], n_resample, js.shape[-4]))
    # snapshots a block: the (s, R, L, H, H_b) float64 temporary within block_bytes
    per_snapshot = max(1, n_resample * int(np.prod(js.shape[-4:-1])) * 8)
    step = int(max(1, block_bytes // per_snapshot))
    for s0 in range(0, flat.shape[0], step):
        # sum_p w_p JS_p: each resample's mean JS over its probes (a NaN probe stays NaN, as in the sum)
        dist = np.sqrt(np.clip(np.einsum("slhgp,rp->srlhg", flat[s0:s0 + step], weights), 0.0, None))
        within = within_layer_divergence(xr.DataArray(dist, dims=(SNAPSHOT, RESAMPLE, LAYER, HEAD, HEAD_B)))
        out[s0:s0 + step] = within.transpose(SNAPSHOT, RESAMPLE, LAYER).values
    return out.reshape(*lead, n_resample, js.shape[-4])


def resampled_layer_divergence(
    js_by_probe: xr.DataArray,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    block_bytes: int = BLOCK_BYTES,
) -> xr.DataArray:
    """Each layer's within-layer divergence on each resample of the probes, snapshot by snapshot.

    For resample r with weights w_rp (:func:`probe_weights`) and heads h, h' of one layer,
    D_r(h, h') = sqrt(sum_p w_rp JS_p(h, h')): the distance
    :func:`~dynamics.analysis.divergence.js_distance` gives on the resampled probes (each
    probe's JS is a mean over its queries, and every probe has the same queries); then the
    layer's mean over its pairs, as :func:`~dynamics.analysis.divergence.within_layer_divergence`
    takes it. Per snapshot, so a run analysed in blocks of snapshots keeps only these
    (resample x layer a snapshot), not every probe's divergences, past its block.

    Parameters
    ----------
    js_by_probe : DataArray
        Per-probe mean JS divergence, dims (..., layer, head, layer_b, head_b, probe) as
        ``js_distance(attn, by_probe=True)[1]`` gives, or within-layer already (no ``layer_b``).
    n_resamples, seed : int
        Resamples to draw, and their generator's seed (fixed: the same resamples every time).
    block_bytes : int
        Size of the float64 temporary of a block of snapshots.

    Returns
    -------
    DataArray
        float64, dims (..., resample, layer); NaN for a layer without two heads. Lazy on dask input.
    """
    require_dims(js_by_probe, (LAYER, HEAD, HEAD_B, PROBE), "resampled_layer_divergence: js_by_probe")
    js = same_layer_block(js_by_probe)
    weights = probe_weights(js.sizes[PROBE], n_resamples, seed)
    core = [LAYER, HEAD, HEAD_B, PROBE]
    if js.chunks is not None:
        js = js.chunk({d: -1 for d in core})
    out = xr.apply_ufunc(
        _layer_kernel, js, weights,
        input_core_dims=[core, [RESAMPLE, PROBE]],
        output_core_dims=[[RESAMPLE, LAYER]],
        kwargs={"block_bytes": int(block_bytes)},
        dask="parallelized",
        output_dtypes=[np.float64],
    )
    return out.rename("layer_divergence_resampled")


def bifurcation_of_resamples(layer_divergence: xr.DataArray, n_baseline: int = 3) -> xr.DataArray:
    """:func:`~dynamics.analysis.bifurcation.bifurcation_step` of each resample's mean over layers
    of :func:`resampled_layer_divergence` (dims (..., snapshot, resample, layer), with the
    ``step`` coordinate on snapshot): dims (..., resample), NaN where it never left its band."""
    require_dims(layer_divergence, (SNAPSHOT, RESAMPLE, LAYER), "bifurcation_of_resamples: layer_divergence")
    count = layer_divergence.count(LAYER)  # layers without two heads are skipped, as in mean_within_layer_divergence
    curve = layer_divergence.sum(LAYER, skipna=True) / count.where(count > 0)
    return bifurcation_step(curve, n_baseline=n_baseline).rename("bifurcation_resampled")


def resampled_bifurcation(
    js_by_probe: xr.DataArray,
    n_baseline: int = 3,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    block_bytes: int = BLOCK_BYTES,
) -> xr.DataArray:
    """The bifurcation step of the mean within-layer divergence on each resample of the probes:
    :func:`resampled_layer_divergence`, then :func:`bifurcation_of_resamples`.

    The curve and the step are those of the analysis (within-layer mean, mean over layers,
    :func:`~dynamics.analysis.bifurcation.bifurcation_step`) on the resampled distances. A
    resample that weights every probe 1/P is the recorded curve (to float rounding) and gives
    the recorded step.

    Parameters
    ----------
    js_by_probe : DataArray
        As for :func:`resampled_layer_divergence`, with a snapshot dim and the ``step``
        coordinate on it (else snapshot indices).
    n_baseline : int
        As for ``bifurcation_step``: the analysis's ``baseline_snapshots``.
    n_resamples, seed, block_bytes
        As for :func:`resampled_layer_divergence`.

    Returns
    -------
    DataArray
        float64 steps, dims (..., resample); NaN where the resampled curve never leaves its band
        (or is undefined: no layer with two heads). Lazy on dask input.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> js = np.zeros((5, 1, 2, 2, 2)); js[3:, 0, 0, 1] = js[3:, 0, 1, 0] = 0.2  # both probes split at snapshot 3
    >>> js = xr.DataArray(js, dims=("snapshot", "layer", "head", "head_b", "probe"),
    ...                   coords={"step": ("snapshot", [0, 1, 2, 4, 8])})
    >>> resampled_bifurcation(js, n_resamples=3).values.tolist()
    [4.0, 4.0, 4.0]
    """
    require_dims(js_by_probe, (SNAPSHOT,), "resampled_bifurcation: js_by_probe")
    layers = resampled_layer_divergence(js_by_probe, n_resamples, seed, block_bytes)
    return bifurcation_of_resamples(layers, n_baseline=n_baseline)


def probe_range(resampled: xr.DataArray, quantiles: tuple[float, float] = QUANTILES) -> xr.DataArray:
    """The steps at the two ``quantiles`` of the resampled steps, "never" (NaN) counted as later
    than any step; dims (..., bound), bound ``low`` and ``high``. Each bound is a step some
    resample gave (the inverse of the empirical distribution), NaN where that one never left its band.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> s = xr.DataArray([16.0] * 10 + [32.0] * 80 + [np.nan] * 10, dims="resample")
    >>> probe_range(s).values.tolist()
    [16.0, nan]
    """
    if len(quantiles) != 2 or not 0 <= quantiles[0] <= quantiles[1] <= 1:
        raise ValueError(f"quantiles={quantiles!r}: give a low and a high quantile in [0, 1]")

    def bounds(x):
        later = np.where(np.isnan(x), np.inf, x)
        q = np.quantile(later, list(quantiles), axis=-1, method="inverted_cdf")  # (2, ...)
        return np.moveaxis(np.where(np.isinf(q), np.nan, q), 0, -1)

    out = xr.apply_ufunc(bounds, resampled, input_core_dims=[[RESAMPLE]], output_core_dims=[[BOUND]],
                         dask="parallelized", output_dtypes=[np.float64],
                         dask_gufunc_kwargs={"output_sizes": {BOUND: 2}})
    return out.assign_coords({BOUND: ["low", "high"]}).rename("bifurcation_probe_range")


def label_agreement(labels: xr.DataArray, resampled: xr.DataArray) -> xr.DataArray:
    """Each head's share of the resamples that give it its label: ``resampled``, ``(resample,
    ...)`` codes (the analysis's ``role_resampled``), against ``labels``, ``(...)`` codes (its
    ``role`` at the last snapshot); NaN where the label is NaN (a sweep's padding).

    Examples
    --------
    >>> import xarray as xr
    >>> again = xr.DataArray([[3, 4], [3, 4], [3, 3], [3, 4]], dims=("resample", "head"))
    >>> label_agreement(xr.DataArray([3, 4], dims="head"), again).values.tolist()
    [1.0, 0.75]
    """
    require_dims(resampled, (RESAMPLE,), "label_agreement: resampled")
    return (resampled == labels).mean(RESAMPLE).where(labels.notnull() & resampled.notnull().all(RESAMPLE))
