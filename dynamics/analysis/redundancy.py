"""Redundant heads: clusters of near-identical attention, map correlation, and whether
different seeds of one config end up with the same heads.

Vectorised xarray maths, lazy on dask-backed inputs; the per-matrix scipy routines
(linkage, linear_sum_assignment) run through ``xr.apply_ufunc(vectorize=True)`` over the
leading dims. Missing heads (NaN, padded sweeps) are left out and labelled -1.

Sources
-------
- Clark, Khandelwal, Levy, Manning 2019, "What Does BERT Look At?" (cluster heads on their
  JS distance matrix).
- Sokal & Michener 1958, "A statistical method for evaluating systematic relationships"
  (average linkage, UPGMA).
- Singh et al. 2024, "What needs to go right for an induction head?" (redundant heads).
- Li, Yosinski, Clune, Lipson, Hopcroft 2016, "Convergent Learning: Do different neural
  networks learn the same representations?" (match units across seeds by bipartite
  matching); Kuhn 1955, "The Hungarian method for the assignment problem".
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import squareform

from dynamics.analysis.divergence import (
    HEAD_B,
    LAYER_B,
    _as_b,
    _causal_mask,
    _nanmean,
    _single_chunk,
)
from dynamics.schema import HEAD, KEY, LAYER, PROBE, QUERY, RUN, require_dims

PAIR = "pair"
GROUP = "group"
# Linkages defined on an arbitrary distance matrix (centroid, median, ward need Euclidean).
_METHODS = ("single", "complete", "average", "weighted")


def _check_method(method: str) -> None:
    if method not in _METHODS:
        raise ValueError(f"method={method!r} is not one of {_METHODS}")


def _valid_square(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flatten (L, H, L, H) -> (N, N), drop missing (NaN-diagonal) heads, make it a clean
    symmetric, zero-diagonal, non-negative distance matrix for scipy."""
    n = d.shape[0] * d.shape[1] if d.ndim == 4 else d.shape[0]
    d = d.reshape(n, n).astype(np.float64)
    valid = ~np.isnan(np.diagonal(d))
    sub = d[np.ix_(valid, valid)]
    sub = np.clip(0.5 * (sub + sub.T), 0.0, None)
    np.fill_diagonal(sub, 0.0)
    return sub, valid


def _cluster_one(d, threshold, method):
    # d (L, H, L, H) -> labels (L, H); -1 for missing heads
    sub, valid = _valid_square(d)
    labels = np.full(valid.size, -1, dtype=np.int64)
    m = sub.shape[0]
    if m == 1:
        labels[valid] = 0
    elif m > 1:
        raw = fcluster(linkage(squareform(sub, checks=False), method=method), t=threshold, criterion="distance")
        # Canonical numbering 0, 1, ... in order of each cluster's first head (layer-major),
        # so labels are reproducible and comparable across snapshots.
        _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
        rank = np.empty_like(first)
        rank[np.argsort(first)] = np.arange(first.size)
        labels[valid] = rank[inverse]
    return labels.reshape(d.shape[:2])


def _cluster_all(d: np.ndarray, threshold: float, method: str) -> np.ndarray:
    """`_cluster_one` over the leading dims: (..., L, H, L, H) -> (..., L, H).

    Where every pair of present heads lies farther apart than `threshold`, the answer is known
    without scipy: each linkage method here merges first at the smallest distance and never
    lower after, so no merge reaches the cut and each head is its own cluster, numbered in
    head order. Most snapshots of a trained run are such; on a run of 3,997 snapshots the
    per-snapshot linkage took 2.9 s of its 7.3 s of analysers.
    """
    lead, (L, H) = d.shape[:-4], d.shape[-4:-2]
    n = L * H
    flat = d.reshape(-1, n, n).astype(np.float64)  # (B, N, N)
    valid = ~np.isnan(np.diagonal(flat, axis1=1, axis2=2))  # (B, N)
    sym = 0.5 * (flat + flat.transpose(0, 2, 1))  # as _valid_square makes it, to the bit
    pair = valid[:, :, None] & valid[:, None, :] & ~np.eye(n, dtype=bool)  # (B, N, N)
    apart = ((sym > threshold) | ~pair).all(axis=(1, 2))  # a NaN distance is not apart: scipy decides
    labels = np.where(valid, np.cumsum(valid, axis=1) - 1, -1).astype(np.int64)  # (B, N)
    for b in np.flatnonzero(~apart):
        labels[b] = _cluster_one(flat[b].reshape(L, H, L, H), threshold, method).reshape(n)
    return labels.reshape(*lead, L, H)


def cluster_heads(jsd: xr.DataArray, threshold: float = 0.1, method: str = "average") -> xr.DataArray:
    """Hierarchical clusters of all heads of the model on their distance matrix.

    Agglomerative clustering (scipy ``linkage``; average linkage = UPGMA, Sokal & Michener
    1958) of the N = layers x heads heads of each snapshot, cut where the merge distance
    exceeds ``threshold`` (``fcluster(criterion="distance")``): with average linkage, every
    cluster's mean within-cluster distance is <= threshold.

    Why 0.1 (JS distance, nats^(1/2)): D = 0.1 is a mean JS divergence of 0.01 nats per
    query. Moving a mass delta of one-hot attention to another key costs
    JS ~ (ln 2 / 2) delta, so 0.1 means heads that differ by about 3% of their attention
    mass: near-duplicates. That is well above float16 storage noise (D < 1e-3) and far
    below the distance between distinct patterns (previous-token vs. sink heads,
    D ~ 0.7 on short probes, of the sqrt(ln 2) ~ 0.83 maximum).

    Parameters
    ----------
    jsd : DataArray
        Distances, dims (..., layer, head, layer_b, head_b), e.g. from
        :func:`dynamics.analysis.divergence.js_distance`.
    threshold : float
        Cut height in distance units.
    method : {"single", "complete", "average", "weighted"}
        scipy linkage method.

    Returns
    -------
    DataArray
        int64 cluster labels, dims (..., layer, head), numbered 0, 1, ... in order of first
        appearance (layer-major) per snapshot; -1 for missing heads.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> d = np.array([[0, .01, .8], [.01, 0, .8], [.8, .8, 0]])
    >>> jsd = xr.DataArray(d.reshape(1, 3, 1, 3), dims=("layer", "head", "layer_b", "head_b"))
    >>> cluster_heads(jsd).values.tolist()
    [[0, 0, 1]]
    """
    _check_method(method)
    if not threshold >= 0:  # a negative (or NaN) cut merged nothing, silently; 0 merges exact duplicates
        raise ValueError(f"cluster_heads: threshold must be >= 0 (a distance); got {threshold!r}")
    core = [LAYER, HEAD, LAYER_B, HEAD_B]
    require_dims(jsd, core, "cluster_heads: jsd")
    jsd = _single_chunk(jsd, core)
    return xr.apply_ufunc(
        _cluster_all,
        jsd,
        input_core_dims=[core],
        output_core_dims=[[LAYER, HEAD]],
        kwargs={"threshold": float(threshold), "method": method},
        dask="parallelized",
        output_dtypes=[np.int64],
    ).rename("cluster")


def redundancy_fraction(labels: xr.DataArray) -> xr.DataArray:
    """Share of heads that share their cluster with at least one other head.

    .. math::

        R = \\frac{1}{N} \\#\\{h : |C(h)| \\ge 2\\} \\in [0, 1]

    over the N non-missing heads (label >= 0), with C(h) the cluster of head h from
    :func:`cluster_heads`. R = 0 when every head is unique, 1 when none is. With N < 2 there
    is no pair of heads, so R is undefined (NaN), not 0: a lone head is not "unique" among
    others.

    Parameters
    ----------
    labels : DataArray
        Cluster labels, dims (..., layer, head); -1 (or NaN) marks missing heads.

    Returns
    -------
    DataArray
        float64, dims (...,) e.g. (snapshot,); NaN if fewer than two heads are present.

    Examples
    --------
    >>> import xarray as xr
    >>> lab = xr.DataArray([[0, 0, 1, 2]], dims=("layer", "head"))
    >>> float(redundancy_fraction(lab))
    0.5
    """
    require_dims(labels, (LAYER, HEAD), "redundancy_fraction: labels (of cluster_heads)")
    valid = labels >= 0
    same = (labels == _as_b(labels, [LAYER, HEAD])) & valid
    shares = same.sum((LAYER_B, HEAD_B)) >= 2  # the head itself plus at least one other
    n_valid = valid.sum((LAYER, HEAD))
    return ((shares & valid).sum((LAYER, HEAD)) / n_valid.where(n_valid >= 2)).rename("redundancy_fraction")


def attention_correlation(attn: xr.DataArray) -> xr.DataArray:
    """Pearson correlation between heads' attention maps, over all heads of the model.

    Each head's map is flattened over (probe, query, key) keeping only causal entries
    (key position <= query position); then

    .. math::

        r(a, b) = \\frac{\\sum_e (x_{a,e} - \\bar x_a)(x_{b,e} - \\bar x_b)}
                       {\\sqrt{\\sum_e (x_{a,e} - \\bar x_a)^2 \\sum_e (x_{b,e} - \\bar x_b)^2}}
                  \\in [-1, 1].

    r = 1 for identical maps. This is the check the specialisation essay uses for
    redundant heads; unlike the JS distance it ignores a head's overall sharpness.

    Parameters
    ----------
    attn : DataArray
        Dims (..., layer, head, probe, query, key).

    Returns
    -------
    DataArray
        float64, dims (..., layer, head, layer_b, head_b); NaN for a missing or constant map.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> a = np.tril(np.random.default_rng(0).random((4, 4)))
    >>> attn = xr.DataArray(np.broadcast_to(a, (1, 2, 1, 4, 4)),
    ...                     dims=("layer", "head", "probe", "query", "key"))
    >>> attention_correlation(attn).round(6).values.ravel().tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    require_dims(attn, (LAYER, HEAD, PROBE, QUERY, KEY), "attention_correlation: attn")
    mask = xr.DataArray(_causal_mask(attn), dims=(QUERY, KEY))
    core = [PROBE, QUERY, KEY]
    x = attn.astype(np.float64).where(mask, 0.0)
    n_entries = attn.sizes[PROBE] * int(mask.sum())
    mean = x.sum(core, skipna=False) / n_entries  # NaN for a missing head
    centred = (x - mean).where(mask, 0.0)
    var = (centred**2).sum(core, skipna=False)
    centred_b = _as_b(centred, [LAYER, HEAD])
    cov = xr.dot(centred, centred_b, dim=core)
    denom = np.sqrt(var * _as_b(var, [LAYER, HEAD]))
    out = (cov / denom.where(denom > 0)).clip(-1.0, 1.0)  # method, not np.clip: stays lazy
    lead = [d for d in attn.dims if d not in (LAYER, HEAD, *core)]
    return out.transpose(*lead, LAYER, HEAD, LAYER_B, HEAD_B).rename("attention_correlation")


def linkage_matrix(jsd_one_snapshot, method: str = "average") -> np.ndarray:
    """scipy linkage of one snapshot's head distances, for the report's dendrogram.

    Same clustering as :func:`cluster_heads` (average linkage, Sokal & Michener 1958, on
    the distance matrix of Clark et al. 2019), returned whole so a dendrogram can be drawn
    (``scipy.cluster.hierarchy.dendrogram(Z)``). Merge heights lie in the range of the
    distances, [0, sqrt(ln 2)] for JS distances.

    Parameters
    ----------
    jsd_one_snapshot : DataArray or ndarray
        One snapshot's distances: DataArray dims (layer, head, layer_b, head_b) (other dims
        of size 1 are squeezed), or an (N, N) / (L, H, L, H) array. Loaded into memory.
    method : {"single", "complete", "average", "weighted"}
        scipy linkage method.

    Returns
    -------
    ndarray
        Linkage matrix Z, shape (M - 1, 4), over the M non-missing heads; leaf i is the
        i-th non-missing head in layer-major order (layer * n_head + head).

    Examples
    --------
    >>> import numpy as np
    >>> linkage_matrix(np.array([[0, .2, .9], [.2, 0, .9], [.9, .9, 0]]))[:, 2].tolist()
    [0.2, 0.9]
    """
    _check_method(method)
    if isinstance(jsd_one_snapshot, xr.DataArray):
        da = jsd_one_snapshot.squeeze(drop=True)
        extra = set(da.dims) - {LAYER, HEAD, LAYER_B, HEAD_B}
        if extra:
            raise ValueError(f"linkage_matrix takes one snapshot; got extra dims {sorted(extra)}")
        d = np.asarray(da.transpose(*[x for x in (LAYER, HEAD, LAYER_B, HEAD_B) if x in da.dims]).values)
    else:
        d = np.asarray(jsd_one_snapshot)
    if d.ndim not in (2, 4):
        raise ValueError(f"expected an (N, N) or (L, H, L, H) matrix, got shape {d.shape}")
    sub, _ = _valid_square(d)
    if sub.shape[0] < 2:
        raise ValueError("linkage_matrix needs at least 2 non-missing heads")
    return linkage(squareform(sub, checks=False), method=method)


def _match_one(cos):
    # cos (H, H): head of run a x head of run b -> (match (H,), similarity (H,))
    missing_a = np.isnan(cos).all(1)
    missing_b = np.isnan(cos).all(0)
    both_missing = missing_a[:, None] & missing_b[None, :]
    # Missing heads pair off among themselves; a present head never trades for a missing
    # one (-3 is below any cosine).
    score = np.where(both_missing, 0.0, np.where(np.isnan(cos), -3.0, cos))
    rows, cols = linear_sum_assignment(score, maximize=True)
    match = np.full(cos.shape[0], -1, dtype=np.int64)
    match[rows] = cols
    ok = ~missing_a & (match >= 0)
    ok[ok] &= ~missing_b[match[ok]]
    match = np.where(ok, match, -1)
    sim = np.where(ok, cos[np.arange(cos.shape[0]), np.maximum(match, 0)], np.nan)
    return match, sim


def cross_seed_consistency(
    profiles: xr.DataArray,
    run_group,
    *,
    feature_dim: str = "feature",
) -> xr.Dataset:
    """Do different seeds of one config grow the same heads? Matched profile similarity.

    For every pair of runs (a, b), a < b, with the same group label, heads of each layer
    are matched one-to-one by the Hungarian algorithm (Kuhn 1955;
    ``scipy.optimize.linear_sum_assignment``) maximising the summed cosine similarity of
    their role-score profiles, as Li et al. 2016 match units across networks:

    .. math::

        \\pi^* = \\arg\\max_{\\pi} \\sum_h \\cos(f_{a,l,h}, f_{b,l,\\pi(h)}),
        \\qquad S_{ab} = \\operatorname{mean}_{l,h} \\cos(f_{a,l,h}, f_{b,l,\\pi^*(h)})

    and a group's consistency is the mean of S_ab over its pairs, in [-1, 1] (in [0, 1]
    for non-negative profiles); 1 means every seed has the same heads up to a permutation.
    Matching stays within a layer because only heads of one layer are interchangeable
    (permuting them leaves the network's function unchanged). A head with an all-zero
    profile has cosine 0 with everything.

    Profiles of non-negative scores share a positive cone, so unrelated heads already have a
    large cosine. ``unmatched_similarity`` is the reference: the same mean over each pair's
    runs with every head of a layer set against every head of that layer in the other run
    (mean_{l,h,h'} cos(f_{a,l,h}, f_{b,l,h'})). Matching can only raise the figure above it;
    a similarity near it says the seeds' heads do not correspond.

    Parameters
    ----------
    profiles : DataArray
        Dims (..., run, layer, head, feature). A head whose whole profile is NaN is missing
        (padding: its run has fewer heads), matched to nothing; a NaN feature of a head that
        has other features counts 0 (a score its probes could not give, such as the token
        share when the token never occurs).
    run_group : array-like, DataArray or str
        Group label per run, shape (run,) (same config, different seeds), or the name of a
        coordinate of ``profiles`` along run. A DataArray with run labels is matched to
        ``profiles`` by label (it must hold the same runs); an array by position. Labels decide which pairs exist, so they are
        read into memory (metadata, not data).
    feature_dim : str
        Name of the profile dim.

    Returns
    -------
    Dataset
        ``similarity`` (..., group): mean matched similarity per group (NaN for a group
        with one run); ``unmatched_similarity`` (..., group): its all-pairs reference;
        ``pair_similarity`` (..., pair): S_ab; ``match`` (..., pair, layer,
        head) int: the head of run b (same layer) matched to each head of run a, -1 if
        missing; ``matched_similarity`` (..., pair, layer, head). Coords on pair:
        ``run_a``, ``run_b`` (run labels) and ``pair_group``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> f = np.eye(3)[None, None]                       # (run, layer, head, feature)
    >>> prof = xr.DataArray(np.concatenate([f, f[:, :, [2, 0, 1]]]),
    ...                     dims=("run", "layer", "head", "feature"))
    >>> out = cross_seed_consistency(prof, ["cfg", "cfg"])
    >>> float(out.similarity.sel(group="cfg")), out.match.values.ravel().tolist()
    (1.0, [1, 2, 0])
    """
    if isinstance(run_group, str):
        run_group = profiles[run_group]
    if isinstance(run_group, xr.DataArray) and RUN in run_group.indexes and RUN in profiles.indexes:
        # by label, as xarray would: read by position, a DataArray in another run order
        # paired the wrong seeds without a word
        mine, theirs = profiles.indexes[RUN], run_group.indexes[RUN]
        if not (theirs.is_unique and len(theirs) == len(mine) and set(theirs) == set(mine)):
            raise ValueError(f"run_group's run labels {list(theirs)} are not those of profiles {list(mine)}")
        run_group = run_group.sel({RUN: mine})
    groups = np.asarray(run_group.values if isinstance(run_group, xr.DataArray) else run_group)
    n_run = profiles.sizes[RUN]
    if groups.shape != (n_run,):
        raise ValueError(f"run_group must have one label per run ({n_run}), got shape {groups.shape}")
    run_labels = np.asarray(profiles.indexes[RUN]) if RUN in profiles.indexes else np.arange(n_run)

    # All within-group pairs a < b at once.
    a_idx, b_idx = np.triu_indices(n_run, 1)
    keep = groups[a_idx] == groups[b_idx]
    a_idx, b_idx = a_idx[keep], b_idx[keep]
    pair_coords = {
        "run_a": (PAIR, run_labels[a_idx]),
        "run_b": (PAIR, run_labels[b_idx]),
        "pair_group": (PAIR, groups[a_idx]),
    }

    prof = profiles.drop_vars([c for c in profiles.coords if RUN in profiles[c].dims])
    # Treating any NaN feature as a missing head made every head missing whenever one score is
    # NaN throughout (the token share on a task without the token), and the result all NaN.
    prof = prof.fillna(0.0).where(prof.notnull().any(feature_dim))
    norm = np.sqrt((prof**2).sum(feature_dim, skipna=False))
    unit = xr.where(norm == 0, 0.0, prof / norm.where(norm > 0))  # NaN stays NaN (missing)
    unit_a = unit.isel({RUN: xr.DataArray(a_idx, dims=PAIR)})
    unit_b = unit.isel({RUN: xr.DataArray(b_idx, dims=PAIR)})
    cos = xr.dot(unit_a, _as_b(unit_b, [HEAD]), dim=feature_dim)  # (..., pair, layer, head, head_b)
    cos = _single_chunk(cos, (HEAD, HEAD_B))

    match, sim = xr.apply_ufunc(
        _match_one,
        cos,
        input_core_dims=[[HEAD, HEAD_B]],
        output_core_dims=[[HEAD], [HEAD]],
        vectorize=True,
        dask="parallelized",
        output_dtypes=[np.int64, np.float64],
    )
    pair_sim = _nanmean(sim, (LAYER, HEAD))

    # Group means as a one-hot weighted average over pairs (no loop over groups).
    names = np.unique(groups)
    onehot = xr.DataArray(groups[a_idx][:, None] == names[None, :], dims=(PAIR, GROUP))
    present = pair_sim.notnull()
    weight = (present * onehot).sum(PAIR)
    similarity = (pair_sim.fillna(0.0) * onehot).sum(PAIR) / weight.where(weight > 0)
    pair_unmatched = _nanmean(cos, (LAYER, HEAD, HEAD_B))
    unmatched = (pair_unmatched.fillna(0.0) * onehot).sum(PAIR) / weight.where(weight > 0)

    out = xr.Dataset(
        {
            "similarity": similarity,
            "unmatched_similarity": unmatched,
            "pair_similarity": pair_sim,
            "match": match,
            "matched_similarity": sim,
        }
    )
    return out.assign_coords({GROUP: names, **pair_coords})
