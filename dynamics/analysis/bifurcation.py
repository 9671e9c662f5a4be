"""When heads part ways: departure of a curve from its early noise band, label commitment,
and inequality of importance across heads.

All functions are vectorised xarray maths, lazy on dask-backed inputs, and pass extra
leading dims (``run``, ...) through. Snapshot times come from the ``step`` coordinate on
``snapshot`` (snapshot index if there is none).

Sources
-------
- Shewhart 1931, "Economic Control of Quality of Manufactured Product" (control limits
  mean +- 3 sigma estimated from an in-control baseline), the model for
  :func:`bifurcation_step`.
- Gini 1912, "Variabilita e mutabilita"; the mean-absolute-difference form used here is in
  e.g. Damgaard & Weiner 2000, "Describing inequality in plant size or fecundity".
- Michel, Levy, Neubig 2019, "Are Sixteen Heads Really Better than One?" (head importance,
  whose concentration :func:`winner_take_all` measures).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynamics.analysis.divergence import _as_b
from dynamics.schema import HEAD, SNAPSHOT, require_dims

STEP = "step"  # the snapshot coordinate (schema: "step" is the snapshot coordinate)


def _steps(da: xr.DataArray) -> xr.DataArray:
    """Training step of each snapshot as a coord-free float array: (snapshot,), or e.g.
    (run, snapshot) when a sweep's runs were recorded at different steps."""
    if STEP in da.coords and SNAPSHOT in da[STEP].dims:
        return xr.DataArray(da[STEP].variable.astype(np.float64))
    return xr.DataArray(np.arange(da.sizes[SNAPSHOT], dtype=np.float64), dims=SNAPSHOT)


def recorded(da: xr.DataArray) -> xr.DataArray:
    """True at the snapshots a run really took: (snapshot,), or (run, snapshot) in a sweep whose
    runs have different schedules, where ``open_sweep`` pads the shorter runs' ``step`` (and
    every array) with NaN at the end. Padding is not data: a run's last snapshot is its last
    recorded one, not the sweep's."""
    return _steps(da).notnull()


def last_recorded(da: xr.DataArray) -> xr.DataArray:
    """`da` at each run's last recorded snapshot (the last snapshot when nothing is padded).

    One run picked from a sweep (``.sel(run=...)``) keeps the sweep's padding with a 1-D step,
    NaN at its end: that is padding too. A step chunked by dask (``.chunk()`` on a whole dataset;
    open_sweep keeps it in memory) is not read, as the analysers only build a graph."""
    if STEP not in da.coords or SNAPSHOT not in da[STEP].dims:
        return da.isel({SNAPSHOT: -1})
    if da[STEP].ndim < 2 and (da[STEP].chunks is not None or bool(da[STEP].notnull().all())):
        return da.isel({SNAPSHOT: -1})
    position = xr.DataArray(np.arange(da.sizes[SNAPSHOT]), dims=SNAPSHOT)
    last = xr.where(recorded(da), position, 0).max(SNAPSHOT)  # numpy: step is an in-memory coord
    return da.isel({SNAPSHOT: last})  # pointwise along run


def _step_at(da: xr.DataArray, index: xr.DataArray) -> xr.DataArray:
    """Step of snapshot number ``index`` (NaN where index is out of range or points at a run's
    padding, whose step is NaN), without NaN reductions or dask-backed indexers: a one-hot
    selection summed over snapshot. The other snapshots add exact zeros, so a NaN step counts
    only where it is selected (a plain product would give NaN * 0 = NaN, and skipna then 0)."""
    n = da.sizes[SNAPSHOT]
    position = xr.DataArray(np.arange(n), dims=SNAPSHOT)
    step = xr.where(position == index, _steps(da), 0.0).sum(SNAPSHOT, skipna=False)
    return step.where((index >= 0) & (index < n))


def bifurcation_step(
    curve: xr.DataArray,
    n_baseline: int = 3,
    k: float = 3.0,
    rel_tol: float = 0.05,
    abs_tol: float = 1e-6,
) -> xr.DataArray:
    """Step at which a curve leaves its early noise band for good.

    Rule (a Shewhart control band whose limits come from the first snapshots):

    .. math::

        \\mu = \\operatorname{mean}(x_{0..n_b-1}),\\quad
        \\sigma = \\operatorname{std}_{ddof=1}(x_{0..n_b-1}),\\quad
        w = \\max(k\\sigma,\\ rel\\_tol\\,|\\mu|,\\ abs\\_tol)

        t^* = \\text{step}\\big[\\min\\{s : |x_{s'} - \\mu| > w \\ \\forall s' \\ge s\\}\\big]

    i.e. the first snapshot of the final stretch that lies strictly outside mu +- w. The
    relative floor ``rel_tol |mu|`` keeps a nearly flat baseline (sigma ~ 0) from flagging
    tiny drifts, and the absolute floor ``abs_tol`` does so where that baseline is 0 itself:
    heads that start with identical attention have a divergence of exactly 0, and float
    rounding later (1e-9) was reported as their bifurcation. With k >= 1.2 and n_b = 3 the
    baseline points always lie inside the band, so t* is after the baseline. A departure seen only at the last snapshot counts
    (nothing later can contradict it). NaN points count as inside, except a run's padding
    past its last recorded snapshot (NaN ``step``), which is not data.

    A split inside the baseline itself (a large learning rate: the heads part within the first
    steps) widens sigma until the band holds it, or crosses it only snapshots later, and the rule
    above said "never", or a late step, for the runs that split fastest (an lr sweep read 4, 4, 4
    where its splits began at steps 4, 2 and 1). So where the curve leaves its first value's
    floor band, ``x_0 +- max(rel_tol |x_0|, abs_tol)``, at a baseline snapshot and stays outside
    it at every later one, t* is that snapshot's step: the baseline measured the split, not
    noise. Such a t* lies within the baseline's steps, where the band's own t* never does, so a
    reader can tell which rule gave it; it has no noise estimate of its own, only the floor, and
    it takes any lasting move past the floor: a drift from 0.30 to 0.32 that holds dates the
    split there, even where a larger jump comes later (the curve tells which).

    Parameters
    ----------
    curve : DataArray
        Dims (..., snapshot), with a ``step`` coordinate on snapshot (else indices).
    n_baseline : int
        Number of leading snapshots that define the band; >= 2 and < number of snapshots.
    k : float
        Band half-width in baseline standard deviations (>= 0).
    rel_tol : float
        Minimum half-width as a fraction of |baseline mean| (>= 0).
    abs_tol : float
        Minimum half-width in the curve's own units (>= 0); the default suits curves of order
        0.1-1, as the divergences are.

    Returns
    -------
    DataArray
        float64 step, dims (...,); NaN if the curve ends inside the band (never departs).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> x = xr.DataArray([1.0, 1.01, 0.99, 1.0, 2.0, 2.1, 2.2], dims="snapshot",
    ...                  coords={"step": ("snapshot", [0, 10, 20, 30, 40, 50, 60])})
    >>> float(bifurcation_step(x))
    40.0
    >>> fast = x.copy(data=[0.3, 0.38, 0.56, 0.71, 0.73, 0.72, 0.73])  # split inside the baseline
    >>> float(bifurcation_step(fast))
    10.0
    """
    require_dims(curve, (SNAPSHOT,), "bifurcation_step: curve")  # a bare KeyError: 'snapshot' named no input
    n = curve.sizes[SNAPSHOT]
    if not 2 <= n_baseline < n:
        raise ValueError(f"n_baseline={n_baseline!r} must be >= 2 and < the {n} snapshots")
    if k < 0 or rel_tol < 0 or abs_tol < 0:
        raise ValueError(f"k={k!r}, rel_tol={rel_tol!r} and abs_tol={abs_tol!r} must be >= 0")
    baseline = curve.isel({SNAPSHOT: slice(0, n_baseline)})
    # mean and sample sd by hand: dask's nanmean and nanvar warn on an all-NaN baseline (a layer
    # of one head has no within-layer divergence), where numpy's, and these, give NaN silently
    count = baseline.count(SNAPSHOT)
    mu = baseline.sum(SNAPSHOT) / count.where(count > 0)
    sd = np.sqrt(((baseline - mu) ** 2).sum(SNAPSHOT) / (count - 1).where(count > 1))
    half_width = np.fmax(np.fmax(k * sd, rel_tol * abs(mu)), abs_tol)
    # NaN compares False: inside. Padding after a run's last recorded snapshot (ragged sweep)
    # counts as outside: it is not data and cannot contradict a departure.
    outside = (abs(curve - mu) > half_width) | ~recorded(curve)
    position = xr.DataArray(np.arange(n), dims=SNAPSHOT)
    last_inside = xr.where(outside, -1, position).max(SNAPSHOT)
    # without the coords along snapshot (step): kept, they would be compared with curve's, computing them
    start = curve.drop_vars([c for c in curve.coords if SNAPSHOT in curve[c].dims]).isel({SNAPSHOT: 0})
    floor = np.fmax(rel_tol * abs(start), abs_tol)
    # ~recorded: padding again; a NaN first value leaves every point "inside", so no early split
    left_start = (abs(curve - start) > floor) | ~recorded(curve)
    last_at_start = xr.where(left_start, -1, position).max(SNAPSHOT)
    split_in_baseline = last_at_start + 1 < n_baseline
    return _step_at(curve, xr.where(split_in_baseline, last_at_start + 1, last_inside + 1))


def commitment_step(labels: xr.DataArray) -> xr.DataArray:
    """Step from which a head's role label never changes again.

    .. math::

        s^* = \\max\\big(\\{0\\} \\cup \\{s \\ge 1 : \\ell_s \\ne \\ell_{s-1}\\}\\big),
        \\qquad t^* = \\text{step}[s^*]

    the first snapshot of the final constant run of labels; t* = step[0] for a head that
    never changes and step[-1] for one that changed at the last snapshot. t* lies in
    [step[0], step[-1]].

    Parameters
    ----------
    labels : DataArray
        Integer role codes, dims (..., snapshot, layer, head); float codes with NaN mark
        missing heads.

    Returns
    -------
    DataArray
        float64 step, dims (..., layer, head); NaN where the last label is NaN. In a sweep
        padded by ``open_sweep`` each run ends at its last recorded snapshot.

    Examples
    --------
    >>> import xarray as xr
    >>> lab = xr.DataArray([[[0]], [[1]], [[0]], [[2]], [[2]]],
    ...                    dims=("snapshot", "layer", "head"),
    ...                    coords={"step": ("snapshot", [0, 100, 200, 300, 400])})
    >>> float(commitment_step(lab)[0, 0])
    300.0
    """
    require_dims(labels, (SNAPSHOT,), "commitment_step: labels")
    n = labels.sizes[SNAPSHOT]
    later = labels.isel({SNAPSHOT: slice(1, None)})
    # Each label is compared with the last one seen before it: a head missing at one snapshot
    # (NaN) mid-run changed label twice when compared with its neighbours.
    seen = labels
    if np.issubdtype(labels.dtype, np.floating):  # integer codes have none missing
        # labels are (snapshot, layer, head) per run: one chunk along snapshot is small
        seen = xr.apply_ufunc(_carry_forward, labels, input_core_dims=[[SNAPSHOT]],
                              output_core_dims=[[SNAPSHOT]], dask="parallelized", output_dtypes=[labels.dtype],
                              dask_gufunc_kwargs={"allow_rechunk": True}).transpose(*labels.dims)
    earlier = seen.isel({SNAPSHOT: slice(None, -1)})
    # Positional comparison of neighbouring snapshots (Variables carry no coords to align).
    # A step into a run's padding (ragged sweep), or to a missing label, is not a change.
    taken = (recorded(labels) & labels.notnull()).isel({SNAPSHOT: slice(1, None)}).variable
    changed = later.copy(data=((later.variable != earlier.variable) & taken).data)
    position = xr.DataArray(np.arange(1, n), dims=SNAPSHOT)
    if n > 1:
        last_change = xr.where(changed, position, 0).max(SNAPSHOT)
    else:
        last_change = xr.zeros_like(labels.isel({SNAPSHOT: 0}, drop=True), dtype=np.int64)
    out = _step_at(labels, last_change).where(last_recorded(labels).drop_vars(STEP, errors="ignore").notnull())
    return out.transpose(*[d for d in labels.dims if d != SNAPSHOT])


def _carry_forward(a: np.ndarray) -> np.ndarray:
    """Each NaN along the last axis replaced by the last value before it (leading NaN stay)."""
    index = np.where(np.isnan(a), 0, np.arange(a.shape[-1]))
    np.maximum.accumulate(index, axis=-1, out=index)
    return np.take_along_axis(a, index, axis=-1)


def gini(x: xr.DataArray, dim: str = HEAD) -> xr.DataArray:
    """Gini coefficient of non-negative values across ``dim``.

    .. math::

        G = \\frac{\\sum_i \\sum_j |x_i - x_j|}{2 n \\sum_i x_i} \\in \\Big[0, \\frac{n-1}{n}\\Big]

    over the n non-missing values (Gini 1912): 0 when all are equal, (n-1)/n when one
    holds everything. All-zero input counts as equal (G = 0). Values must be >= 0 (not
    checked, to stay lazy).

    Parameters
    ----------
    x : DataArray
        Non-negative values; NaN entries are missing.
    dim : str
        The dim to measure inequality across.

    Returns
    -------
    DataArray
        float64, dims of ``x`` less ``dim``; NaN if no values are present.

    Examples
    --------
    >>> import xarray as xr
    >>> float(gini(xr.DataArray([0.0, 0.0, 0.0, 5.0], dims="head")))
    0.75
    """
    require_dims(x, (dim,), "gini: x")
    # Coords along ``dim`` other than its index would clash once renamed; they are not needed.
    x = x.drop_vars([c for c in x.coords if dim in x[c].dims and c != dim])
    dim_b = f"{dim}_b"
    mean_abs_diff = abs(x - _as_b(x, [dim])).sum((dim, dim_b), skipna=True)
    n = x.count(dim)
    total = x.sum(dim, skipna=True)
    g = mean_abs_diff / (2 * n * total.where(total > 0))
    return xr.where((total == 0) & (n > 0), 0.0, g).rename("gini")


def head_importance(importance: xr.DataArray, gate: xr.DataArray | None = None) -> xr.DataArray:
    """Michel et al. 2019's head importance from the recorded ``importance`` and ``gate``.

    Michel et al. put a gate xi, held at 1, on each head's output and take E_x |dL(x)/dxi|
    over sequences x. The recorder stores E_x |dL(x)/dg| for the model's own gate g, over the
    sequences of the step's batch (`dynamics.record`; runs begun before its ``importance_form``
    attr hold |dL/dg| of the batch's mean loss, whose sequences' gradients cancel); the head's
    output is g z, so a xi on it has dL(x)/dxi = g dL(x)/dg, and with g >= 0

    .. math::

        I_{l,h} = g_{l,h} \\, E_x |\\partial L(x) / \\partial g_{l,h}|

    It is the recorded value itself where g = 1 (fixed gates, the default; ``gate`` None
    means those). With learned gates |dL/dg| alone is what a head would matter if it were
    opened: a nearly shut head (g = 0.02) read about 50 times as important as it is.

    Parameters
    ----------
    importance : DataArray
        The recorded |dL/dg|, dims (..., snapshot, layer, head).
    gate : DataArray, optional
        The recorded gate values, same dims; None for fixed gates (g = 1).

    Returns
    -------
    DataArray
        Same dims, non-negative, NaN where either input is.

    Examples
    --------
    >>> import xarray as xr
    >>> imp = xr.DataArray([[2.0, 2.0]], dims=("layer", "head"))
    >>> head_importance(imp, xr.DataArray([[1.0, 0.25]], dims=("layer", "head"))).values.tolist()
    [[2.0, 0.5]]
    """
    # a whole run passed came back unchanged, and a run passed as gate failed in xarray's rename
    require_dims(importance, (HEAD,), "head_importance: importance")
    if gate is None:
        return importance
    require_dims(gate, (HEAD,), "head_importance: gate")
    return (importance * gate).rename(importance.name)


def winner_take_all(importance: xr.DataArray) -> xr.DataArray:
    """Concentration of head importance within each layer: Gini across heads.

    .. math::

        WTA_l = G(I_{l,1}, \\dots, I_{l,H}) \\in [0, (H-1)/H]

    with I the head importance of Michel et al. 2019 (non-negative; :func:`head_importance`
    makes it from what a run records). 0: all heads of a
    layer matter equally; (H-1)/H: one head carries the layer. A layer with fewer than two
    (non-missing) heads has no heads to compare: NaN, not the Gini of one value (0), which
    would read as "importance evenly spread".

    Parameters
    ----------
    importance : DataArray
        Michel et al.'s I (:func:`head_importance`), dims (..., snapshot, layer, head).

    Returns
    -------
    DataArray
        Dims (..., snapshot, layer); NaN for a layer with fewer than two heads present.

    Examples
    --------
    >>> import xarray as xr
    >>> imp = xr.DataArray([[[1.0, 1.0], [0.0, 2.0]]], dims=("snapshot", "layer", "head"))
    >>> winner_take_all(imp).values.tolist()
    [[0.0, 0.5]]
    """
    require_dims(importance, (HEAD,), "winner_take_all: importance")
    return gini(importance, HEAD).where(importance.count(HEAD) >= 2).rename("winner_take_all")
