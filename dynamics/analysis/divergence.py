"""How far apart heads are: attention-pattern distances and weight-subspace similarity.

Every function maps named-dim ``xarray.DataArray`` inputs to named-dim outputs, works
lazily on dask-backed inputs (chunk by chunk, through ``xr.apply_ufunc``) and passes any
extra leading dims (``run``, ``snapshot``, ...) straight through. Missing heads (NaN, as
in a padded sweep) give NaN wherever they take part.

Sources
-------
- Clark, Khandelwal, Levy, Manning 2019, "What Does BERT Look At? An Analysis of BERT's
  Attention" (smoothed Jensen-Shannon distance between heads).
- Endres & Schindelin 2003, "A new metric for probability distributions" (sqrt(JS) is a
  metric, bounded by sqrt(ln 2) in nats).
- Bjorck & Golub 1973, "Numerical methods for computing angles between linear subspaces"
  (principal angles from the SVD of Q_a^T Q_b).
- Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits" (the QK circuit
  W_Q W_K^T).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynamics.analysis.js_kernels import BLOCK_BYTES, js_aligned_kernel, js_pairwise_kernel
from dynamics.schema import D_HEAD, D_MODEL, HEAD, KEY, LAYER, PROBE, QUERY, SNAPSHOT, WEIGHT, WEIGHTS, require_dims

LAYER_B = f"{LAYER}_b"
HEAD_B = f"{HEAD}_b"
ANGLE = "angle"

_ATTN_CORE = (PROBE, QUERY, KEY)


# ----------------------------------------------------------------------------- helpers


def _single_chunk(da: xr.DataArray, dims) -> xr.DataArray:
    """Core dims of a dask-backed array must sit in one chunk for apply_ufunc."""
    if da.chunks is None:
        return da
    return da.chunk({d: -1 for d in dims})


def _as_b(da: xr.DataArray, dims) -> xr.DataArray:
    """Rename ``dims`` (and coords along them) to ``<dim>_b`` for pairwise broadcasting."""
    dims = set(dims)
    names = {d: f"{d}_b" for d in dims if d in da.dims}
    names.update({c: f"{c}_b" for c in da.coords if c not in dims and dims & set(da[c].dims)})
    return da.rename(names)


def _nanmean(da: xr.DataArray, dims) -> xr.DataArray:
    """Mean over non-missing values; NaN (without a warning) when none are left."""
    count = da.count(dims)
    return da.sum(dims, skipna=True) / count.where(count > 0)


def _positions(da: xr.DataArray, dim: str) -> np.ndarray:
    """Token positions along ``dim``: its numeric index if it has one, else 0..n-1."""
    if dim in da.indexes:
        values = np.asarray(da.indexes[dim])
        if np.issubdtype(values.dtype, np.number):
            return values
    return np.arange(da.sizes[dim])


def _causal_mask(attn: xr.DataArray) -> np.ndarray:
    """(query, key) boolean: key position <= query position (what a causal head can see).

    Positions come from numeric query/key coordinates, else 0..n-1; without them a cut along one
    dim (``isel(query=slice(4, None))``) would pair query 4 with key 0's visibility, and the
    distances come out plausible and wrong, so unequal sizes without coordinates are refused. A
    cut of equal length along both (``query=slice(4, None), key=slice(None, -4)``) cannot be
    told from whole attention: give coordinates before any cut.
    """
    named = all(dim in attn.indexes and np.issubdtype(np.asarray(attn.indexes[dim]).dtype, np.number)
                for dim in (QUERY, KEY))
    if attn.sizes[QUERY] != attn.sizes[KEY] and not named:
        raise ValueError(f"attention has {attn.sizes[QUERY]} queries but {attn.sizes[KEY]} keys and no numeric "
                         f"query/key coordinates to say which positions they are: keep query and key whole, or "
                         f"give both their positions (assign_coords(query=..., key=...)) before a cut")
    q = _positions(attn, QUERY)
    k = _positions(attn, KEY)
    return k[None, :] <= q[:, None]


def _check_eps(eps: float) -> None:
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps must lie in [0, 1], got eps={eps!r}")


# ----------------------------------------------------------------------------- JS distance


def js_distance(
    attn_a: xr.DataArray,
    attn_b: xr.DataArray | None = None,
    *,
    eps: float = 1e-3,
    block_bytes: int = BLOCK_BYTES,
    by_probe: bool = False,
) -> xr.DataArray | tuple[xr.DataArray, xr.DataArray]:
    """Smoothed Jensen-Shannon distance between attention patterns (Clark et al. 2019).

    For each attention row (one probe, one query) over its n visible keys (causal: key
    position <= query position), rows are renormalised (float16 storage rounding) and
    smoothed, ``p' = eps/n + (1 - eps) p``. Then

    .. math::

        JS(p, q) = \\tfrac12 KL(p \\| m) + \\tfrac12 KL(q \\| m),\\quad m = (p + q)/2,

        D(a, b) = \\sqrt{\\operatorname{mean}_{probe,\\,query} JS(p'_a, p'_b)}

    in nats. D is 0 for identical patterns, symmetric, and bounded by sqrt(ln 2) ~ 0.833;
    the bound is approached by disjoint one-hot rows over many keys (smoothing keeps it
    strictly below, and a query that sees one key always contributes 0). A row with no mass
    on its visible keys is no distribution, so a head with one such row is NaN to every head,
    as a missing (NaN) head is. Clark et al. sum
    over tokens; the mean here keeps D comparable across probe lengths. The root of the
    mean is a metric on the concatenated rows (Endres & Schindelin 2003).

    Parameters
    ----------
    attn_a : DataArray
        Attention with dims (..., layer, head, probe, query, key); any float dtype.
    attn_b : DataArray, optional
        If given, the distance is taken element by element between ``attn_a`` and
        ``attn_b`` after xarray broadcasting (e.g. against one snapshot): output dims are
        the broadcast dims less (probe, query, key). If None, the head-by-head matrix of
        ``attn_a`` over all heads of the model is returned.
    eps : float
        Smoothing mass in [0, 1]; Clark et al. use 0.001.
    block_bytes : int
        Size of one float64 temporary. Each chunk (a whole in-memory array too) is
        smoothed a block of snapshots at a time, and in head-by-head mode the (heads x
        heads x probe x query x key) tensor of mixtures m, which has no einsum shortcut,
        is built a block of queries at a time, so peak memory is a few times this per
        chunk whatever the run's length.
    by_probe : bool
        Head-by-head only: also return each probe's own mean JS divergence (nats, before the
        root), ``js_by_probe`` (..., layer, head, layer_b, head_b, probe), from the same pass:
        what resampling the probe sequences needs (`dynamics.analysis.probe_resample`). Its mean
        over probes is the distance squared, to float rounding; the distance keeps its bits.

    Returns
    -------
    DataArray
        float64 in [0, sqrt(ln 2)]. Head-by-head: dims (..., layer, head, layer_b, head_b).
        With ``by_probe``, the tuple ``(distance, js_by_probe)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> a = np.tril(np.ones((4, 4))); a /= a.sum(-1, keepdims=True)
    >>> attn = xr.DataArray(np.broadcast_to(a, (1, 2, 1, 4, 4)),
    ...                     dims=("layer", "head", "probe", "query", "key"))
    >>> js_distance(attn).dims
    ('layer', 'head', 'layer_b', 'head_b')
    >>> float(js_distance(attn).max())
    0.0
    """
    _check_eps(eps)
    if by_probe and attn_b is not None:
        raise ValueError("js_distance: by_probe is for the head-by-head matrix (no attn_b)")
    require_dims(attn_a, _ATTN_CORE if attn_b is not None else (LAYER, HEAD, *_ATTN_CORE), "js_distance: attn_a")
    mask = _causal_mask(attn_a)
    if attn_b is not None:
        require_dims(attn_b, _ATTN_CORE, "js_distance: attn_b")
        a = _single_chunk(attn_a, _ATTN_CORE)
        b = _single_chunk(attn_b, _ATTN_CORE)
        return xr.apply_ufunc(
            js_aligned_kernel,
            a,
            b,
            input_core_dims=[list(_ATTN_CORE)] * 2,
            kwargs={"mask": mask, "eps": eps, "block_bytes": int(block_bytes)},
            dask="parallelized",
            output_dtypes=[np.float64],
        ).rename("js_distance")
    core = [LAYER, HEAD, *_ATTN_CORE]
    a = _single_chunk(attn_a, core)
    pair = [LAYER, HEAD, LAYER_B, HEAD_B]
    out = xr.apply_ufunc(
        js_pairwise_kernel,
        a,
        input_core_dims=[core],
        output_core_dims=[pair, [*pair, PROBE]] if by_probe else [pair],
        kwargs={"mask": mask, "eps": eps, "block_bytes": int(block_bytes), "by_probe": by_probe},
        dask="parallelized",
        output_dtypes=[np.float64] * (2 if by_probe else 1),
        dask_gufunc_kwargs={"output_sizes": {LAYER_B: a.sizes[LAYER], HEAD_B: a.sizes[HEAD]}},
    )
    if by_probe:
        dist, js = out
        return (_copy_b_coords(dist, a, (LAYER, HEAD)).rename("js_distance"),
                _copy_b_coords(js, a, (LAYER, HEAD)).rename("js_by_probe"))
    return _copy_b_coords(out, a, (LAYER, HEAD)).rename("js_distance")


def _copy_b_coords(out: xr.DataArray, src: xr.DataArray, dims) -> xr.DataArray:
    """Give the ``<dim>_b`` axes the same index labels as ``<dim>``."""
    return out.assign_coords({f"{d}_b": src.indexes[d].values for d in dims if d in src.indexes})


def same_layer_block(jsd: xr.DataArray) -> xr.DataArray:
    """(..., layer, head, layer_b, head_b) -> (..., layer, head, head_b) with layer_b == layer; input
    without ``layer_b`` (within-layer already) is returned as it is."""
    if LAYER_B not in jsd.dims:
        return jsd
    n_layer = jsd.sizes[LAYER]
    same = xr.DataArray(np.eye(n_layer, dtype=bool), dims=(LAYER, LAYER_B))
    # One non-NaN entry per row survives the mask; min_count keeps a missing head NaN.
    block = jsd.where(same).sum(LAYER_B, skipna=True, min_count=1)
    return block.drop_vars([c for c in block.coords if LAYER_B in block[c].dims])


def within_layer_divergence(jsd: xr.DataArray) -> xr.DataArray:
    """Mean distance between distinct heads of the same layer.

    .. math::

        W_l = \\frac{1}{H_l (H_l - 1)} \\sum_{h \\ne h'} D(h, h')

    over the H_l non-missing heads of layer l. Bounds are those of ``jsd``: [0, sqrt(ln 2)]
    for :func:`js_distance`. High W means the layer's heads do different things
    (specialisation; Clark et al. 2019 find heads of one layer often behave alike).

    Parameters
    ----------
    jsd : DataArray
        Head-by-head distances, dims (..., layer, head, layer_b, head_b) as returned by
        :func:`js_distance`, or already within-layer, dims (..., layer, head, head_b).

    Returns
    -------
    DataArray
        Dims (..., layer) e.g. (snapshot, layer); NaN for a layer with fewer than 2 heads.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> d = xr.DataArray(np.array([[0.0, 0.4], [0.4, 0.0]])[None, :, None, :],
    ...                  dims=("layer", "head", "layer_b", "head_b"))
    >>> float(within_layer_divergence(d)[0])
    0.4
    """
    # without head_b this averaged any input (importance, attention) into a plausible curve
    require_dims(jsd, (LAYER, HEAD, HEAD_B), "within_layer_divergence: jsd (of js_distance)")
    block = same_layer_block(jsd)
    n_head = block.sizes[HEAD]
    off_diagonal = xr.DataArray(~np.eye(n_head, dtype=bool), dims=(HEAD, HEAD_B))
    return _nanmean(block.where(off_diagonal), (HEAD, HEAD_B)).rename("within_layer_divergence")


def mean_within_layer_divergence(jsd: xr.DataArray) -> xr.DataArray:
    """Model-level specialisation: :func:`within_layer_divergence` averaged over layers.

    .. math::

        \\bar W = \\frac{1}{L} \\sum_l W_l, \\quad \\bar W \\in [0, \\sqrt{\\ln 2}]

    (layers without a defined W_l are skipped). Clark et al. 2019 distances.

    Parameters
    ----------
    jsd : DataArray
        As for :func:`within_layer_divergence`.

    Returns
    -------
    DataArray
        Dims (...,), e.g. (snapshot,) or (run, snapshot).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> d = xr.DataArray(np.array([[0.0, 0.4], [0.4, 0.0]])[None, :, None, :],
    ...                  dims=("layer", "head", "layer_b", "head_b"))
    >>> float(mean_within_layer_divergence(d))
    0.4
    """
    return _nanmean(within_layer_divergence(jsd), LAYER).rename("mean_divergence")


def divergence_from_init(attn: xr.DataArray, *, eps: float = 1e-3) -> xr.DataArray:
    """Each head's JS distance from its own pattern at the first snapshot.

    .. math::

        D_h(t) = \\sqrt{\\operatorname{mean}_{probe,\\,query} JS(p'_{h,t}, p'_{h,0})}

    with the smoothing of :func:`js_distance` (Clark et al. 2019). D_h(0) = 0 and
    D_h(t) in [0, sqrt(ln 2)].

    Parameters
    ----------
    attn : DataArray
        Dims (..., snapshot, layer, head, probe, query, key).
    eps : float
        Smoothing mass, as in :func:`js_distance`.

    Returns
    -------
    DataArray
        Dims (..., snapshot, layer, head).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> a = np.tril(np.ones((3, 3))); a /= a.sum(-1, keepdims=True)
    >>> attn = xr.DataArray(np.broadcast_to(a, (2, 1, 1, 1, 3, 3)),
    ...                     dims=("snapshot", "layer", "head", "probe", "query", "key"))
    >>> divergence_from_init(attn).values.ravel().tolist()
    [0.0, 0.0]
    """
    require_dims(attn, (SNAPSHOT, *_ATTN_CORE), "divergence_from_init: attn")
    return js_distance(attn, attn.isel({SNAPSHOT: 0}, drop=True), eps=eps).rename("divergence_from_init")


# ----------------------------------------------------------------------------- weights


def _select_weight(head_weights: xr.DataArray, name: str) -> xr.DataArray:
    require_dims(head_weights, (HEAD, WEIGHT, D_MODEL, D_HEAD), "head_weights")
    if name not in WEIGHTS:
        raise ValueError(f"weight={name!r} is not one of {WEIGHTS}")
    if WEIGHT in head_weights.indexes:
        return head_weights.sel({WEIGHT: name}, drop=True)
    return head_weights.isel({WEIGHT: WEIGHTS.index(name)}, drop=True)


def _gram(w):
    # (..., H, M, D) -> (..., H, H, D, D): W_a^T W_b for every pair of heads. As one batched
    # matmul (BLAS), not np.einsum, whose unoptimised loop took 10x as long on a demo run's
    # weights (8.5 ms against 0.9 ms; three per run, in principal_angles and qk_cosine).
    return np.swapaxes(w, -1, -2)[..., :, None, :, :] @ w[..., None, :, :, :]


def _real_blocks(w):
    """Slices of w (N, H, M, D) grouped by the d_model rows and d_head columns that hold a value
    in any head: (indices, rows, cols) per group, for the slices with any value at all.

    open_sweep pads a narrower run's d_model and d_head with NaN in every head (a head-count
    sweep at a fixed d_model, a width sweep), and one NaN column made each of its real heads
    missing. Each width is computed on its own columns: zero columns instead would keep QK^T but
    add an arbitrary QR completion to the subspaces."""
    finite = ~np.isnan(w)
    masks = np.concatenate([finite.any(axis=(1, 3)), finite.any(axis=(1, 2))], axis=1)  # (N, M + D)
    if (masks == masks[:1]).all():  # one width throughout (one run, or a sweep of one width): no sorting
        kinds, which = masks[:1], np.zeros(len(masks), int)
    else:
        kinds, which = np.unique(masks, axis=0, return_inverse=True)
    for k, mask in enumerate(kinds):
        rows, cols = mask[: w.shape[2]], mask[w.shape[2]:]
        if rows.any() and cols.any():
            yield np.flatnonzero(which.ravel() == k), rows, cols


def _crop(w, idx, rows, cols):
    """w[idx] on those rows and columns, C-contiguous (a boolean index's result was not, and the
    batched matmuls on it ran 5x slower); w itself where that is all of it."""
    if len(idx) == len(w) and rows.all() and cols.all():
        return w
    return w[idx].take(np.flatnonzero(rows), axis=2).take(np.flatnonzero(cols), axis=3)


def _principal_cos_block(w):
    # w (N, H, M, D) without padding -> cosines of principal angles (N, H, H, min(M, D)), descending
    missing = np.isnan(w).any(axis=(-2, -1))  # (N, H)
    q, _ = np.linalg.qr(np.where(np.isnan(w), 0.0, w.astype(np.float64)))  # (N, H, M, D)
    overlap = _gram(q)  # (N, H, H, D, D) = Q_a^T Q_b
    cos = np.clip(np.linalg.svd(overlap, compute_uv=False), 0.0, 1.0)
    bad = missing[..., :, None] | missing[..., None, :]
    return np.where(bad[..., None], np.nan, cos)


def _principal_cos_kernel(w):
    # w (..., H, M, D) -> cosines of principal angles (..., H, H, min(M, D)), descending; NaN past
    # a padded slice's own min(M, D)
    *lead, H, M, D = w.shape
    flat = w.reshape(-1, H, M, D)
    out = np.full((flat.shape[0], H, H, min(M, D)), np.nan)
    for idx, rows, cols in _real_blocks(flat):
        cos = _principal_cos_block(_crop(flat, idx, rows, cols))  # (n, H, H, r)
        out[idx, :, :, : cos.shape[-1]] = cos
    return out.reshape(*lead, H, H, min(M, D))


def _mean_cos_kernel(w):
    cos = _principal_cos_kernel(w)
    n = np.count_nonzero(~np.isnan(cos), axis=-1)  # a slice's own number of angles; 0 for a missing head
    return np.where(n > 0, np.nansum(cos, axis=-1) / np.maximum(n, 1), np.nan)


def _angles_kernel(w):
    return np.arccos(_principal_cos_kernel(w))


def principal_angles(head_weights: xr.DataArray, weight: str = "q", *, kind: str = "mean_cos") -> xr.DataArray:
    """Principal angles between heads' column subspaces of one weight, within each layer.

    For heads a, b of a layer, orthonormalise W_a, W_b (d_model x d_head) by QR,
    W = Q R, then (Bjorck & Golub 1973)

    .. math::

        \\cos\\theta_i = \\sigma_i(Q_a^T Q_b), \\quad i = 1..r,\\ r = \\min(d_{model}, d_{head}),
        \\qquad \\text{mean\\_cos} = \\frac{1}{r} \\sum_i \\cos\\theta_i \\in [0, 1].

    mean_cos = 1 for the same subspace, 0 for orthogonal subspaces, and well below 1 for
    random subspaces when d_head << d_model. A rank-deficient W gives an arbitrary QR
    completion, so its angles are not meaningful. With d_head >= d_model every full-rank W
    spans all of R^d_model, so there are d_model angles, all 0 (mean_cos = 1).

    Parameters
    ----------
    head_weights : DataArray
        Dims (..., layer, head, weight, d_model, d_head), weight coord ["q","k","v","o"].
    weight : {"q", "k", "v", "o"}
        Which matrix's column space to compare.
    kind : {"mean_cos", "angles"}
        "mean_cos" (default): mean cosine of the principal angles, dims
        (..., layer, head, head_b). "angles": the angles themselves in radians,
        ascending, dims (..., layer, head, head_b, angle), angle of length
        min(d_model, d_head).

    Returns
    -------
    DataArray
        float64; NaN where either head is missing. Each slice is taken on the d_model rows and
        d_head columns its heads hold: in a sweep from ``open_sweep``, whose narrower runs are
        padded with NaN, a run's heads are compared on its own width, and with
        ``kind="angles"`` its angles past its own min(d_model, d_head) are NaN.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> w = np.zeros((1, 2, 4, 4, 2)); w[0, 0, 0, :2] = w[0, 1, 0, 2:] = np.eye(2)
    >>> hw = xr.DataArray(w, dims=("layer", "head", "weight", "d_model", "d_head"),
    ...                   coords={"weight": ["q", "k", "v", "o"]})
    >>> principal_angles(hw).round(6).values[0].tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    kernels = {"mean_cos": (_mean_cos_kernel, []), "angles": (_angles_kernel, [ANGLE])}
    if kind not in kernels:
        raise ValueError(f"kind={kind!r} is not one of {sorted(kernels)}")
    kernel, extra = kernels[kind]
    w = _single_chunk(_select_weight(head_weights, weight), (HEAD, D_MODEL, D_HEAD))
    # Reduced QR of a (d_model, d_head) W keeps min(d_model, d_head) columns, so that many angles.
    n_angle = min(w.sizes[D_MODEL], w.sizes[D_HEAD])
    out = xr.apply_ufunc(
        kernel,
        w,
        input_core_dims=[[HEAD, D_MODEL, D_HEAD]],
        output_core_dims=[[HEAD, HEAD_B, *extra]],
        dask="parallelized",
        output_dtypes=[np.float64],
        dask_gufunc_kwargs={"output_sizes": {HEAD_B: w.sizes[HEAD], **{a: n_angle for a in extra}}},
    )
    return _copy_b_coords(out, w, (HEAD,)).rename(f"{weight}_subspace_{kind}")


def _qk_cosine_kernel(wq, wk):
    # wq, wk (..., H, M, D) -> (..., H, H), each slice on its own rows and columns (_real_blocks)
    *lead, H, M, D = wq.shape
    fq, fk = wq.reshape(-1, H, M, D), wk.reshape(-1, H, M, D)
    out = np.full((fq.shape[0], H, H), np.nan)
    for idx, rows, cols in _real_blocks(fq):
        out[idx] = _qk_cosine_block(_crop(fq, idx, rows, cols), _crop(fk, idx, rows, cols))
    return out.reshape(*lead, H, H)


def _qk_cosine_block(wq, wk):
    # wq, wk (N, H, M, D) without padding -> (N, H, H)
    wq, wk = wq.astype(np.float64), wk.astype(np.float64)
    # <Wq_a Wk_a^T, Wq_b Wk_b^T>_F = sum_ij (Wq_a^T Wq_b)_ij (Wk_a^T Wk_b)_ij: (D x D) Gram
    # blocks per pair instead of (d_model x d_model) circuits.
    gram_q, gram_k = _gram(wq), _gram(wk)  # (..., H, H, D, D)
    inner = np.einsum("...hgij,...hgij->...hg", gram_q, gram_k)
    norm = np.sqrt(np.clip(np.diagonal(inner, axis1=-2, axis2=-1), 0.0, None))  # (..., H)
    denom = norm[..., :, None] * norm[..., None, :]
    return np.clip(inner / np.where(denom > 0, denom, np.nan), -1.0, 1.0)


def qk_cosine(head_weights: xr.DataArray) -> xr.DataArray:
    """Cosine between heads' QK circuits W_Q W_K^T, within each layer.

    .. math::

        c(a, b) = \\frac{\\langle W_Q^a W_K^{aT}, W_Q^b W_K^{bT} \\rangle_F}
                        {\\|W_Q^a W_K^{aT}\\|_F \\, \\|W_Q^b W_K^{bT}\\|_F} \\in [-1, 1]

    with the d_model x d_model bilinear forms of Elhage et al. 2021, evaluated without
    forming them: <A_a, A_b>_F = sum_ij (W_Q^aT W_Q^b)_ij (W_K^aT W_K^b)_ij. c = 1 for the
    same circuit (up to positive scale), -1 when one W_Q is negated. Rotary embeddings are
    applied after these weights, so this is the content circuit at relative offset 0.

    Parameters
    ----------
    head_weights : DataArray
        Dims (..., layer, head, weight, d_model, d_head), weight coord ["q","k","v","o"].

    Returns
    -------
    DataArray
        Dims (..., layer, head, head_b); NaN for a missing or all-zero head. Each slice is
        taken on the d_model rows and d_head columns its heads hold, so a narrower run of a
        sweep from ``open_sweep`` (padded with NaN) is compared on its own width.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> w = np.random.default_rng(0).normal(size=(1, 2, 4, 6, 2))
    >>> w[0, 1] = w[0, 0]; w[0, 1, 0] *= -1  # head 1: head 0 with W_Q negated
    >>> hw = xr.DataArray(w, dims=("layer", "head", "weight", "d_model", "d_head"),
    ...                   coords={"weight": ["q", "k", "v", "o"]})
    >>> qk_cosine(hw).round(6).values[0].tolist()
    [[1.0, -1.0], [-1.0, 1.0]]
    """
    core = (HEAD, D_MODEL, D_HEAD)
    wq = _single_chunk(_select_weight(head_weights, "q"), core)
    wk = _single_chunk(_select_weight(head_weights, "k"), core)
    out = xr.apply_ufunc(
        _qk_cosine_kernel,
        wq,
        wk,
        input_core_dims=[list(core)] * 2,
        output_core_dims=[[HEAD, HEAD_B]],
        dask="parallelized",
        output_dtypes=[np.float64],
        dask_gufunc_kwargs={"output_sizes": {HEAD_B: wq.sizes[HEAD]}},
    )
    return _copy_b_coords(out, wq, (HEAD,)).rename("qk_cosine")
