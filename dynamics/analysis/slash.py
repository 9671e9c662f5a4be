"""Slash (fixed-offset) and token-dominance patterns in recorded attention, and when they emerge.

Sources
-------
- Cheng et al. 2026, "Demystifying the Slash Pattern in Attention: The Role of RoPE",
  arXiv 2601.08297: the slash score and (kappa, delta)-slash-dominance.
- Voita et al. 2019: the "positional head" is the delta = 1 case, by its own rule (the row's largest
  weight at offset 1 in >= 90% of rows, `dynamics.analysis.positional`); the scores here are mean
  weights (see `roles`).
- The slash-dominance post: a head is token-dominant when it puts more than half of its
  attention on "/" tokens whenever one is visible, in 3 or more consecutive samples. Here the
  token id is a parameter. The post's claims (share of heads, layers, emergence phases) are
  what `token_dominant`, `dominant_share` and `emergence_step` let us test.

Every function takes and returns `xarray.DataArray`s with named dims (see `dynamics.schema`).
Attention is ``(..., snapshot, layer, head, probe, query, key)``: causal softmax rows, stored
as float16, so sums are taken in float32/float64. Leading dims such as ``run`` pass through, and
NaN-padded heads (a sweep over head counts) come out as NaN scores and NaN flags (undefined,
not False). Nothing is computed eagerly: dask-backed inputs give dask-backed outputs.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral

import numpy as np
import xarray as xr

from dynamics.analysis.bifurcation import recorded
from dynamics.schema import HEAD, KEY, LAYER, OFFSET, POSITION, PROBE, QUERY, SNAPSHOT, require_dims

__all__ = [
    "DEFAULT_KAPPA",
    "best_offset",
    "dominant_share",
    "emergence_step",
    "slash_dominant",
    "slash_score",
    "token_dominant",
    "token_ratio",
    "token_share",
]

DEFAULT_KAPPA = 0.5
"""Default slash-dominance threshold. At kappa = 0.5 the diagonal holds most of the head's
attention, so the slash is the head's main behaviour rather than a bias. Only one offset can
reach it in any one row. It is also well above what uniform causal attention gives at offset 0,
which is H_T / T (0.21 at T = 16, 0.07 at T = 64)."""


def _check_square(attn: xr.DataArray) -> int:
    require_dims(attn, (PROBE, QUERY, KEY), "attention")
    n = attn.sizes[QUERY]
    if attn.sizes[KEY] != n:
        raise ValueError(f"attention needs as many keys as queries; got query={n}, key={attn.sizes[KEY]}")
    return n


def _diagonal_means(a: np.ndarray, max_offset: int, by_probe: bool = False) -> np.ndarray:
    # a: (..., probe, query, key) -> (..., offset), or (..., probe, offset) by probe. One gather over an (offset, query) grid
    # replaces a loop over offsets. Cells with i < delta point at key 0 and are masked out.
    n = a.shape[-1]
    delta = np.arange(max_offset + 1)[:, None]  # (D, 1)
    i = np.arange(n)[None, :]  # (1, T)
    valid = i >= delta  # (D, T)
    diag = a[..., np.broadcast_to(i, valid.shape), np.where(valid, i - delta, 0)]  # (..., P, D, T)
    # float32: numpy's float16 arithmetic is slow, and 64-term sums lose nothing that matters.
    diag = diag.astype(np.float32, copy=False)
    diag[..., ~valid] = 0.0
    per_probe = diag.sum(axis=-1, dtype=np.float64) / (n - delta[:, 0])  # (..., P, D)
    return per_probe if by_probe else per_probe.mean(axis=-2)


def slash_score(attn: xr.DataArray, max_offset: int | None = None, weights: xr.DataArray | None = None) -> xr.DataArray:
    """Mean attention on each diagonal ``key = query - delta`` (Cheng et al. 2026).

    ``slash_score(delta) = mean_p [ 1 / (T - delta) * sum_{i = delta}^{T-1} A_p[i, i - delta] ]``

    The positions are 0-indexed, so queries ``i >= delta`` are the ``T - delta`` rows that can
    see offset ``delta``. This is the paper's ``1/(N - delta) * sum_{i > delta}`` written
    1-indexed. The mean over p runs over probe sequences.

    Bounds: [0, 1]. A head with ``A[i, i - delta] = 1`` scores 1 at ``delta``. Uniform causal
    attention scores ``mean_{i >= delta} 1 / (i + 1)``. The largest offsets average over only
    a few queries: ``slash_score(T - 1) = mean_p A_p[T - 1, 0]``. So bound the offset range
    before taking a maximum (see `best_offset`).

    Parameters
    ----------
    attn : DataArray
        ``(..., probe, query, key)`` attention, normally ``(snapshot, layer, head, probe,
        query, key)``. Extra leading dims pass through.
    max_offset : int, optional
        Largest offset scored. Defaults to ``T - 1``.
    weights : DataArray, optional
        ``(..., probe)``: the mean over p taken over the multiset of probes these weights
        describe, with their other dims (see `dynamics.analysis.roles.role_scores`). Default:
        each probe once.

    Returns
    -------
    DataArray
        ``(..., snapshot, layer, head, offset)``, float64, with ``offset`` coordinate
        ``0..max_offset``. NaN-padded heads give NaN.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> dims = ("snapshot", "layer", "head", "probe", "query", "key")
    >>> prev = xr.DataArray(np.eye(4, k=-1)[None, None, None, None], dims=dims)  # key = query - 1
    >>> slash_score(prev).values.squeeze().tolist()
    [0.0, 1.0, 0.0, 0.0]
    """
    n = _check_square(attn)
    max_offset = n - 1 if max_offset is None else int(max_offset)
    if not 0 <= max_offset < n:
        raise ValueError(f"max_offset must be in [0, {n - 1}]; got {max_offset}")
    out = xr.apply_ufunc(
        _diagonal_means,
        attn,
        input_core_dims=[[PROBE, QUERY, KEY]],
        output_core_dims=[[OFFSET] if weights is None else [PROBE, OFFSET]],
        kwargs={"max_offset": max_offset, "by_probe": weights is not None},
        dask="parallelized",
        output_dtypes=[np.float64],
        # A run chunked by snapshot keeps (probe, query, key) whole, so this rarely rechunks.
        dask_gufunc_kwargs={"output_sizes": {OFFSET: max_offset + 1}, "allow_rechunk": True},
    )
    if weights is not None:
        from dynamics.analysis.probe_resample import weighted_probe_mean

        out = weighted_probe_mean(out, weights)
    out = out.assign_coords({OFFSET: np.arange(max_offset + 1)})
    out.name = "slash_score"
    # n_query: the window `best_offset` and `slash_dominant` take by default, as `dynamics analyse`'s
    out.attrs = {"long_name": "mean attention on diagonal key = query - offset", "units": "1", "n_query": n}
    return out


def _offset_window(scores: xr.DataArray, min_offset: int, max_offset: int | None) -> xr.DataArray:
    require_dims(scores, (OFFSET,), "scores (of slash_score)")
    default = ""
    if max_offset is None and isinstance(scores.attrs.get("n_query"), (int, np.integer)):
        max_offset = int(scores.attrs["n_query"]) // 2
        default = f" (max_offset: by default T // 2 of the scores' n_query {scores.attrs['n_query']}; pass max_offset=)"
    window = scores.sel({OFFSET: slice(min_offset, max_offset)})
    if window.sizes[OFFSET] == 0:
        raise ValueError(
            f"no offsets in [{min_offset}, {max_offset}]{default}; scores cover "
            f"{int(scores[OFFSET].min())}..{int(scores[OFFSET].max())}"
        )
    return window


def confounded_offsets(n_query: int, offsets: Iterable[int], threshold: float) -> list[int]:
    """The `offsets` at which a head with no pattern, or a sink, already scores ``threshold``.

    Over T = `n_query` positions, uniform causal attention scores ``mean_{i >= delta} 1 / (i + 1)``
    at offset delta, and attention wholly on the first token ``1 / (T - delta)`` (its one entry
    on that diagonal, at query delta). Where either reaches the threshold, ``slash_score(delta)``
    cannot tell a slash from no pattern or from a sink, so readers leave those offsets out: the
    slash role and slash-dominance alike. At the defaults (threshold 0.5, window up to T // 2)
    only contexts of 4 or less lose offsets; a window reaching T - 2 loses its last offsets at
    any T.

    Examples
    --------
    >>> confounded_offsets(16, range(2, 15), 0.5)
    [14]
    >>> confounded_offsets(4, [2], 0.5)
    [2]
    """
    i = np.arange(n_query)
    return [int(d) for d in offsets
            if np.mean(1.0 / (i[d:] + 1)) >= threshold or 1.0 / (n_query - d) >= threshold]


def best_offset(
    scores: xr.DataArray, min_offset: int = 1, max_offset: int | None = None
) -> tuple[xr.DataArray, xr.DataArray]:
    """Offset with the highest slash score, and that score.

    ``delta* = argmax_{min_offset <= delta <= max_offset} slash_score(delta)``.
    If two offsets tie, the smaller one wins.

    Parameters
    ----------
    scores : DataArray
        Output of `slash_score`, ``(..., offset)``.
    min_offset, max_offset : int
        The offset window, inclusive. The defaults are `dynamics analyse`'s window (its
        ``best_offset``; the slash role's starts at 2, `RoleThresholds.slash_min_offset`):
        from 1, since offset 0 is the self diagonal, a self head's, to ``T // 2`` where the
        scores say their T (`slash_score` records it as ``attrs["n_query"]``), else the largest
        scored offset. Offsets near ``T - 1`` average over only a few queries (see
        `slash_score`): a sink head scores 1 at ``T - 1``. On probes of T <= 4 the analysis
        also leaves out offsets uniform attention or a first-token sink passes (its
        ``slash_offsets_unscored``; :func:`confounded_offsets`).

    Returns
    -------
    offset, score : DataArray, DataArray
        Both ``(..., snapshot, layer, head)``. The offset is float, so that all-NaN (padded)
        heads can hold NaN. The score lies in [0, 1].

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> s = xr.DataArray([0.95, 0.2, 0.9, 0.3], dims="offset", coords={"offset": range(4)})
    >>> [x.item() for x in best_offset(s)]  # offset 0, the self diagonal, is left out
    [2.0, 0.9]
    """
    window = _offset_window(scores, min_offset, max_offset)
    offset = window.idxmax(OFFSET).astype(np.float64)
    offset.name = "best_offset"
    # idxmax keeps the scores' attrs, which made an offset read "mean attention ..., units 1"
    offset.attrs = {"long_name": "offset of the largest slash score", "units": "positions"}
    score = window.max(OFFSET)
    score.name = "best_slash_score"
    score.attrs = {"long_name": "largest slash score in the offset window", "units": "1"}  # not slash_score's
    return offset, score


def slash_dominant(
    scores: xr.DataArray,
    kappa: float = DEFAULT_KAPPA,
    delta: int | None = None,
    min_offset: int = 1,
    max_offset: int | None = None,
) -> xr.DataArray:
    """(kappa, delta)-slash-dominance (Cheng et al. 2026): ``slash_score(delta) >= kappa``.

    If ``delta`` is None, a head counts when any offset in ``[min_offset, max_offset]``
    reaches kappa: ``max_{delta in window} slash_score(delta) >= kappa``. The default window
    is `best_offset`'s, `dynamics analyse`'s: 1 (Voita's positional head, the previous-token
    case) to ``T // 2``. Use ``min_offset=2`` to leave out the previous-token case too, and
    ``min_offset=0`` to count self heads.

    Parameters
    ----------
    scores : DataArray
        Output of `slash_score`, ``(..., offset)``.
    kappa : float
        Threshold in [0, 1]. The default, `DEFAULT_KAPPA` = 0.5, asks that the diagonal hold
        most of the head's attention.
    delta : int, optional
        The offset to test. None means any offset in the window.
    min_offset, max_offset : int
        The window used when ``delta`` is None, inclusive; defaults as `best_offset`'s.

    Returns
    -------
    DataArray
        float64 1.0 (dominant) or 0.0, ``(..., snapshot, layer, head)``; NaN (undefined) where
        the score is NaN at every offset tested: padded heads, or offsets left unscored.

    Examples
    --------
    >>> import xarray as xr
    >>> s = xr.DataArray([0.1, 0.2, 0.9], dims="offset", coords={"offset": range(3)})
    >>> bool(slash_dominant(s, delta=2)), bool(slash_dominant(s, kappa=0.95))
    (True, False)
    """
    if not 0.0 <= kappa <= 1.0:
        raise ValueError(f"kappa must be in [0, 1]; got {kappa}")
    require_dims(scores, (OFFSET,), "slash_dominant: scores (of slash_score)")
    if delta is not None:
        if delta not in scores[OFFSET]:
            raise ValueError(f"delta={delta} was not scored; offsets are {scores[OFFSET].values.tolist()}")
        score = scores.sel({OFFSET: delta}, drop=True)
    else:
        score = _offset_window(scores, min_offset, max_offset).max(OFFSET)
    # Three-valued: a head with no scored offset (padded, or a context too short for any
    # offset the window allows) is undefined, not "not dominant", so that a share of
    # dominant heads leaves it out instead of counting it a zero.
    out = (score >= kappa).astype(np.float64).where(score.notnull())
    out.name = "slash_dominant"
    out.attrs = {"kappa": float(kappa), "delta": "any" if delta is None else int(delta)}
    return out


def _token_masks(tokens: xr.DataArray, token_id: int, n: int) -> tuple[xr.DataArray, xr.DataArray]:
    # (probe, query, key) weights of the visible occurrences of token_id, and their count per query.
    require_dims(tokens, (PROBE, POSITION), "tokens")
    if POSITION not in tokens.dims or tokens.sizes[POSITION] != n:
        raise ValueError(f"tokens need dim {POSITION!r} of length {n} (= query/key); got {dict(tokens.sizes)}")
    is_token = tokens.rename({POSITION: KEY}) == token_id
    causal = xr.DataArray(np.arange(n), dims=KEY) <= xr.DataArray(np.arange(n), dims=QUERY)
    mask = (is_token & causal).astype(np.float32)
    return mask, mask.sum(KEY)


def _mean_over_valid_queries(per_query: xr.DataArray, valid: xr.DataArray) -> xr.DataArray:
    # Mean over the queries where `valid`, NaN when none are. skipna=False so that NaN attention
    # (padded heads) stays NaN instead of summing to 0.
    n = valid.sum(QUERY)
    return per_query.where(valid, 0.0).sum(QUERY, skipna=False) / n.where(n > 0)


def _token_mass(attn: xr.DataArray, tokens: xr.DataArray, token_id: int):
    n = _check_square(attn)
    mask, visible = _token_masks(tokens, token_id, n)
    if tokens.sizes[PROBE] != attn.sizes[PROBE]:
        # xarray's own AlignmentError names the dim but not which argument is short
        raise ValueError(f"tokens have {tokens.sizes[PROBE]} probe rows but attention has "
                         f"{attn.sizes[PROBE]}; pass the probe tokens the attention was recorded on")
    # float16 storage -> float32 for the contraction; the per-query result is small.
    # clipped: a float16 row sums to up to 1 + 2**-11, and a share read 1.00004 past its bound of 1
    mass = xr.dot(attn.astype(np.float32), mask, dim=KEY).astype(np.float64).clip(0.0, 1.0)  # (..., probe, query)
    return mass, visible


def token_share(attn: xr.DataArray, tokens: xr.DataArray, token_id: int = ord("/")) -> xr.DataArray:
    """Share of attention on visible occurrences of ``token_id``, per probe sequence.

    ``share_p = mean_{i in V_p} sum_{j <= i, tok_p[j] = t} A_p[i, j]``, where
    ``V_p = {i : exists j <= i with tok_p[j] = t}`` is the set of queries that can see the token.

    This is the quantity behind the slash-dominance post's criterion (there with t = '/').
    The post's "whenever one is visible" is read as which queries count (those in V_p), and a
    sample's share as their mean: the post gives no per-query rule, so a head that gives the
    token 100% at half of those queries and 0% at the others has share 0.5 here. A per-query
    reading would be ``min`` instead of ``mean`` over V_p, a stricter test.

    Bounds: [0, 1] (each query's mass clipped to [0, 1]: float16 rows do not sum exactly to 1).
    It is NaN for probe sequences where no query sees the token (the token is absent), and for
    padded heads.

    Parameters
    ----------
    attn : DataArray
        ``(..., snapshot, layer, head, probe, query, key)`` attention.
    tokens : DataArray
        ``(probe, position)`` int token ids, with ``position`` as long as query/key. The token
        at position j is the one attended at key j.
    token_id : int
        The token. Defaults to ``ord('/') = 47``.

    Returns
    -------
    DataArray
        float64, ``(..., snapshot, layer, head, probe)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> tokens = xr.DataArray([[47, 5, 6]], dims=("probe", "position"))
    >>> a = np.zeros((1, 3, 3)); a[:, :, 0] = 1  # every query looks at the '/' in position 0
    >>> attn = xr.DataArray(a, dims=("probe", "query", "key"))
    >>> token_share(attn, tokens).values.tolist()
    [1.0]
    """
    mass, visible = _token_mass(attn, tokens, token_id)
    out = _mean_over_valid_queries(mass, visible > 0)
    out.name = "token_share"
    out.attrs = {"long_name": f"attention share on visible token {token_id}", "token_id": int(token_id), "units": "1"}
    return out


def token_ratio(attn: xr.DataArray, tokens: xr.DataArray, token_id: int = ord("/")) -> xr.DataArray:
    """Attention on ``token_id`` relative to uniform causal attention, per probe sequence.

    ``ratio_p = mean_{i in V_p} [ sum_{j <= i, tok_p[j] = t} A_p[i, j] / (c_p(i) / (i + 1)) ]``,
    where ``c_p(i)`` counts the visible occurrences and ``V_p`` is the set of queries with
    ``c_p(i) > 0`` (as in `token_share`).

    Bounds: [0, T]. Uniform causal attention gives exactly 1. It is NaN where the token is
    never visible. The post's "5-8 times the response to other tokens" is related but not the
    same: this ratio's reference is uniform attention over every visible key, the token's own
    occurrences included, not the attention a single other token gets, and queries that see
    nothing but the token always score 1. Compare it with the post's figure as an order of
    magnitude only.

    Parameters
    ----------
    attn, tokens, token_id
        As in `token_share`.

    Returns
    -------
    DataArray
        float64, ``(..., snapshot, layer, head, probe)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> tokens = xr.DataArray([[47, 5, 6]], dims=("probe", "position"))
    >>> uniform = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]
    >>> attn = xr.DataArray(uniform[None], dims=("probe", "query", "key"))
    >>> token_ratio(attn, tokens).values.round(6).tolist()
    [1.0]
    """
    mass, visible = _token_mass(attn, tokens, token_id)
    valid = visible > 0
    expected = visible.where(valid) / (xr.DataArray(np.arange(visible.sizes[QUERY]), dims=QUERY) + 1)
    out = _mean_over_valid_queries(mass / expected, valid)
    out.name = "token_ratio"
    out.attrs = {"long_name": f"attention on token {token_id} / uniform causal", "token_id": int(token_id)}
    return out


def _has_run(share: np.ndarray, threshold: float, run_length: int) -> np.ndarray:
    # share: (..., probe) -> (...) float: 1 / 0, or NaN where fewer than run_length probes hold
    # the token, so that no run could be seen either way. NaN probes (token absent) are skipped:
    # they neither extend nor break a run. hits - (hits at the last miss) is the length of the
    # current run, and cumsum / running max replace a loop over probes.
    valid = ~np.isnan(share)
    hit = valid & (np.nan_to_num(share, nan=-np.inf) >= threshold)
    hits = np.cumsum(hit, axis=-1)
    at_last_miss = np.maximum.accumulate(np.where(valid & ~hit, hits, 0), axis=-1)
    found = (hits - at_last_miss >= run_length).any(axis=-1)
    return np.where(valid.sum(axis=-1) >= run_length, found, np.nan)


def token_dominant(share: xr.DataArray, threshold: float = 0.5, run_length: int = 3) -> xr.DataArray:
    """The slash-dominance post's criterion: share >= threshold in >= run_length consecutive probes.

    A head is token-dominant at a snapshot if ``token_share >= threshold`` holds in at least
    ``run_length`` consecutive probe sequences that contain the token. Probes where the token is
    never visible (NaN share) are skipped: they neither count nor break a run. With fewer than
    ``run_length`` probes holding the token (probes without it, or fewer probes than that
    recorded), the criterion can be neither met nor failed: undefined (NaN), not "not
    dominant", so that a share of dominant heads does not count it a zero. Probes are taken
    in ``probe`` order. The post says "more than 50%"; ``>=`` is used here so that the threshold
    reads the same way as the other thresholds in this package.

    Parameters
    ----------
    share : DataArray
        Output of `token_share`, ``(..., probe)``.
    threshold : float
        Share in [0, 1]. The post uses 0.5.
    run_length : int
        Number of consecutive probes needed. The post uses 3.

    Returns
    -------
    DataArray
        float64 1.0 (dominant) or 0.0, ``(..., snapshot, layer, head)``; NaN (undefined) where
        fewer than ``run_length`` probes hold the token, padded heads included.

    Examples
    --------
    >>> import xarray as xr
    >>> s = xr.DataArray([[0.9, 0.8, 0.1, 0.7, float("nan"), 0.6, 0.9]], dims=("head", "probe"))
    >>> token_dominant(s).values.tolist()  # 0.7, (skip NaN), 0.6, 0.9
    [1.0]
    >>> token_dominant(s.isel(probe=[0, 1])).values.tolist()  # two probes cannot hold a run of 3
    [nan]
    """
    require_dims(share, (PROBE,), "token_dominant: share")  # else "tuple.index(x): x not in tuple"
    if not isinstance(run_length, Integral) or isinstance(run_length, bool):  # 2.5 ran as 2, 1.9 as 1
        raise TypeError(f"token_dominant: run_length must be an integer; got {run_length!r}")
    if run_length < 1:
        raise ValueError(f"run_length must be >= 1; got {run_length}")
    out = xr.apply_ufunc(
        _has_run,
        share,
        input_core_dims=[[PROBE]],
        kwargs={"threshold": float(threshold), "run_length": int(run_length)},
        dask="parallelized",
        output_dtypes=[np.float64],
        dask_gufunc_kwargs={"allow_rechunk": True},
    )
    out.name = "token_dominant"
    out.attrs = {"threshold": float(threshold), "run_length": int(run_length)}
    return out


def _as_flag(dominant: xr.DataArray) -> xr.DataArray:
    # Accept bool or float (NaN for padded heads and undefined flags); NaN is not dominant.
    return dominant if dominant.dtype == bool else dominant.fillna(0) != 0


def emergence_step(dominant: xr.DataArray) -> xr.DataArray:
    """First step from which a head stays dominant until the last snapshot.

    ``emergence = min { step[s] : dominant[s'] for every s' >= s }``. It is NaN if the head is
    not dominant at the last snapshot. A head that drops out and comes back emerges at its
    last entry, not its first.

    Parameters
    ----------
    dominant : DataArray
        bool ``(..., snapshot, layer, head)``, for example from `token_dominant` or
        `slash_dominant`. The ``step`` coordinate on ``snapshot`` gives the steps. Without it,
        the snapshot coordinate (or index) is used. NaN counts as not dominant; a run's
        padding in a ragged sweep (NaN step) is not data, so each run ends at its last
        recorded snapshot.

    Returns
    -------
    DataArray
        float64 steps, ``(..., layer, head)``.

    Examples
    --------
    >>> import xarray as xr
    >>> d = xr.DataArray([[False, True, False, True, True]], dims=("head", "snapshot"),
    ...                  coords={"step": ("snapshot", [0, 10, 20, 30, 40])})
    >>> emergence_step(d).values.tolist()
    [30.0]
    """
    require_dims(dominant, (SNAPSHOT,), "emergence_step: dominant")
    # A run's padding past its last recorded snapshot (ragged sweep, NaN step) is not data: it
    # neither breaks the final stretch nor can start it (its NaN step drops out of the min).
    flag = _as_flag(dominant) | ~recorded(dominant)
    steps = dominant["step"] if "step" in dominant.coords else dominant[SNAPSHOT]
    reverse = slice(None, None, -1)
    # Misses from s to the end; zero exactly on the final stretch where the head stays dominant.
    misses_after = (~flag).isel({SNAPSHOT: reverse}).cumsum(SNAPSHOT).isel({SNAPSHOT: reverse})
    stays = misses_after == 0
    # The +inf fill keeps min() free of all-NaN warnings; no final stretch -> inf -> NaN.
    first = xr.where(stays, steps.astype(np.float64), np.inf).min(SNAPSHOT)
    out = first.where(np.isfinite(first))
    out.name = "emergence_step"
    return out


def dominant_share(dominant: xr.DataArray, present: xr.DataArray | None = None) -> xr.DataArray:
    """Share of dominant heads in each layer at each snapshot.

    ``share[s, l] = (1 / H_l) * sum_h dominant[s, l, h]``, where ``H_l`` counts the heads that
    are present and whose flag is defined (not NaN); NaN where no head's is.

    Bounds: [0, 1]. The post claims 15-20% of heads, mostly in middle layers.

    Parameters
    ----------
    dominant : DataArray
        ``(..., snapshot, layer, head)``, bool, or float with NaN for padded heads and undefined
        flags (as `token_dominant` and `slash_dominant` give).
    present : DataArray, optional
        bool ``(..., layer, head)``, True for real heads. Bool flags cannot hold NaN, so pass it
        when a sweep pads heads, for example ``token_share(...).notnull().any("probe")``.
        Otherwise padded heads would count as not dominant. Float input with NaN is masked
        without it.

    Returns
    -------
    DataArray
        float64, ``(..., snapshot, layer)``.

    Examples
    --------
    >>> import xarray as xr
    >>> d = xr.DataArray([[[True, False, False, True]]], dims=("snapshot", "layer", "head"))
    >>> dominant_share(d).values.tolist()
    [[0.5]]
    """
    require_dims(dominant, (HEAD,), "dominant_share: dominant")
    flag = dominant.astype(np.float64)
    if present is not None:
        flag = flag.where(present)
    out = flag.mean(HEAD)
    out.name = "dominant_share"
    out.attrs = {"long_name": f"share of dominant heads per {LAYER}", "units": "1"}
    return out
