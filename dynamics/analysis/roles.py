"""Role scores for every head at every snapshot, and one role label per head.

Sources
-------
- Cheng et al. 2026, arXiv 2601.08297: slash scores. Self is offset 0, previous-token is
  offset 1, and "slash" is any larger offset. Voita et al. 2019's positional head is the same
  offset by another rule: the row's largest weight on offset 1 in >= 90% of rows. Here, as for
  every offset, the mean weight on it is scored (``slash_score(1) >= 0.5``), so a head whose
  rows peak at offset 1 with 0.4 of their mass passes Voita's rule and not this one, and a
  head with 0.5 on average that peaks elsewhere in over 10% of rows passes this one only.
- Olsson et al. 2022, "In-context Learning and Induction Heads": attention to the token after
  the previous occurrence of the current token.
- Gu et al., ICLR 2025, "When Attention Sink Emerges in Language Models": alpha_0, with the
  threshold epsilon = 0.3.
- The slash-dominance post: the share of attention on a chosen token ('/' by default).

A head keeps all of its scores (`role_scores`, an `xarray.Dataset`, one variable per role) but
gets exactly one label (`assign_roles`, int8 codes into `ROLES`). The label rule is stated in
`assign_roles`. Everything is lazy on dask-backed input, and extra leading dims such as ``run``
pass through. NaN-padded heads get NaN scores and the label "none" from `assign_roles`
(int codes have no NaN); `analyse_run` masks a sweep's padding to NaN codes.
"""

from __future__ import annotations

import functools

import numpy as np
import xarray as xr
from scipy.special import entr

from dynamics.analysis.probe_resample import LABEL_AGREEMENT, RESAMPLE, label_agreement, weighted_probe_mean
from dynamics.analysis.role_thresholds import GENERIC_ROLES, ROLES, SPECIFIC_ROLES, RoleThresholds
from dynamics.analysis.slash import _check_square, best_offset, confounded_offsets, slash_score, token_share
from dynamics.schema import HEAD, KEY, LAYER, OFFSET, POSITION, PROBE, QUERY, require_dims

__all__ = [
    "GENERIC_ROLES",
    "ROLES",
    "SPECIFIC_ROLES",
    "RoleThresholds",
    "assign_roles",
    "diffuse_score",
    "induction_score",
    "local_score",
    "probe_sensitive_heads",
    "probe_sensitive_text",
    "role_names",
    "role_scores",
    "sink_score",
]


def _positions(n: int, dim: str) -> xr.DataArray:
    return xr.DataArray(np.arange(n), dims=dim)


def _probe_mean(per_query: xr.DataArray, weights: xr.DataArray | None) -> xr.DataArray:
    """The mean over (probe, query) of ``(..., probe, query)`` values, NaN kept; with weights, of
    each probe's mean over its queries (every probe has as many) over the weighted probes."""
    if weights is None:
        return per_query.mean([QUERY, PROBE], skipna=False)
    return weighted_probe_mean(per_query.mean(QUERY, skipna=False), weights)


def induction_score(attn: xr.DataArray, tokens: xr.DataArray, weights: xr.DataArray | None = None) -> xr.DataArray:
    """Attention to the token after a previous occurrence of the current token (Olsson et al. 2022).

    ``M_p[i, k] = 1 if 1 <= k < i and tok_p[k - 1] = tok_p[i]``. Key k is the token after an
    earlier occurrence j = k - 1 < i. The query's own position (k = i, when tok_p[i - 1] =
    tok_p[i]) is left out: attending there is the self role, and counting it credited a pure
    self head with induction on text with adjacent repeats (runs of spaces, say).

    ``induction = sum_{(p, i) in V} sum_k A_p[i, k] M_p[i, k] / |V|``, where
    ``V = {(p, i) : M_p[i, :] has a 1}`` pools the queries with a previous occurrence over all
    probe sequences.

    Bounds: [0, 1] (each query's mass clipped to [0, 1]: float16 rows do not sum exactly to 1).
    It is NaN when no query has a previous occurrence. Use probes that repeat
    random segments with varying periods: with a fixed period, a fixed-offset (slash) head
    scores as well as an induction head.

    Parameters
    ----------
    attn : DataArray
        ``(..., snapshot, layer, head, probe, query, key)``.
    tokens : DataArray
        ``(probe, position)`` non-negative int ids, with ``position`` as long as query/key.
    weights : DataArray, optional
        ``(..., probe)`` probe weights: see `role_scores`. Default: each probe once.

    Returns
    -------
    DataArray
        float64, ``(..., snapshot, layer, head)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> tokens = xr.DataArray([[7, 8, 7]], dims=("probe", "position"))
    >>> a = np.array([[1, 0, 0], [.5, .5, 0], [0, 1, 0]])  # query 2 (a 7) looks at the 8 after the first 7
    >>> induction_score(xr.DataArray(a[None], dims=("probe", "query", "key")), tokens).item()
    1.0
    """
    n = _check_square(attn)
    require_dims(tokens, (PROBE, POSITION), "induction_score: tokens")
    if tokens.sizes[POSITION] != n:
        raise ValueError(f"tokens need dim {POSITION!r} of length {n}; got {dict(tokens.sizes)}")
    # key 0 has no preceding token: masked by position, not by a fill value, since a -1 fill
    # wraps to a real id (255) in unsigned token ids and key 0 matched every query holding it
    preceding = tokens.rename({POSITION: KEY}).shift({KEY: 1}, fill_value=0)
    current = tokens.rename({POSITION: QUERY})
    key = _positions(n, KEY)
    match = (preceding == current) & (key >= 1) & (key < _positions(n, QUERY))  # (probe, query, key)
    # clipped as diffuse_score's rows are: a float16 row sums to up to 1 + 2**-11, and read 1.0004 here
    mass = xr.dot(attn.astype(np.float32), match.astype(np.float32), dim=KEY).astype(np.float64).clip(0.0, 1.0)
    valid = match.any(KEY)  # (probe, query)
    if weights is None:
        count = valid.sum([PROBE, QUERY])
        out = mass.where(valid, 0.0).sum([PROBE, QUERY], skipna=False) / count.where(count > 0)
    else:  # each probe's sum over its valid queries, over the weighted count of them
        out = weighted_probe_mean(mass.where(valid, 0.0).sum(QUERY, skipna=False), weights, count=valid.sum(QUERY))
    out.name = "induction"
    return out


def sink_score(attn: xr.DataArray, position: int = 0, weights: xr.DataArray | None = None) -> xr.DataArray:
    """Mean attention on one key position (Gu et al. 2025, alpha_k).

    ``alpha_k = mean_p [ 1 / (T - k) * sum_{i >= k} A_p[i, k] ]``. This is 0-indexed, and Gu
    et al. write the same thing 1-indexed. Their head sinks to k if ``alpha_k > 0.3``; the sink
    role here passes at ``alpha_0 >= RoleThresholds.sink``, inclusive like every threshold in
    this package.

    Bounds: [0, 1]. Uniform causal attention gives ``alpha_0 = H_T / T``.

    Parameters
    ----------
    attn : DataArray
        ``(..., snapshot, layer, head, probe, query, key)``.
    position : int
        The key position k. Defaults to 0, the first token.
    weights : DataArray, optional
        ``(..., probe)`` probe weights: see `role_scores`. Default: each probe once.

    Returns
    -------
    DataArray
        float64, ``(..., snapshot, layer, head)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> a = np.zeros((1, 4, 4)); a[..., 0] = 1
    >>> sink_score(xr.DataArray(a, dims=("probe", "query", "key"))).item()
    1.0
    """
    n = _check_square(attn)
    if not 0 <= position < n:
        raise ValueError(f"position must be in [0, {n - 1}]; got {position}")
    column = attn.isel({KEY: position}, drop=True).isel({QUERY: slice(position, None)}).astype(np.float64)
    out = _probe_mean(column, weights)
    out.name = "sink"
    return out


def local_score(attn: xr.DataArray, width: int = 3, weights: xr.DataArray | None = None) -> xr.DataArray:
    """Mean attention mass in a band of ``width`` offsets behind the diagonal.

    ``local = mean_p mean_{i >= w} sum_{d=0}^{w-1} A_p[i, i - d]``. Queries ``i < w`` are left
    out because for them the band covers every visible key, so their mass would be 1 whatever
    the head does.

    Bounds: [0, 1] (each query's mass clipped to [0, 1]: float16 rows do not sum exactly to 1).
    Uniform causal attention gives ``mean_{i >= w} w / (i + 1)``.

    Parameters
    ----------
    attn : DataArray
        ``(..., snapshot, layer, head, probe, query, key)``.
    width : int
        Band width w >= 1. It must be less than T.
    weights : DataArray, optional
        ``(..., probe)`` probe weights: see `role_scores`. Default: each probe once.

    Returns
    -------
    DataArray
        float64, ``(..., snapshot, layer, head)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> a = np.eye(5)[None]  # a self head is local
    >>> local_score(xr.DataArray(a, dims=("probe", "query", "key")), width=2).item()
    1.0
    """
    n = _check_square(attn)
    if not 1 <= width < n:
        raise ValueError(f"width must be in [1, {n - 1}]; got {width}")
    behind = _positions(n, QUERY) - _positions(n, KEY)
    band = ((behind >= 0) & (behind < width)).astype(np.float32)  # (query, key)
    mass = xr.dot(attn.astype(np.float32), band, dim=KEY).isel({QUERY: slice(width, None)})
    out = _probe_mean(mass.astype(np.float64).clip(0.0, 1.0), weights)  # clipped: see induction_score
    out.name = "local"
    return out


def diffuse_score(attn: xr.DataArray, weights: xr.DataArray | None = None) -> xr.DataArray:
    """Mean normalised entropy of the attention rows.

    ``diffuse = mean_p mean_{i >= 1} H(A_p[i, :]) / ln(i + 1)``, with
    ``H(a) = -sum_j a_j ln a_j`` and ``0 ln 0 = 0``. Query 0 has a single key, so it is left out.

    Bounds: [0, 1]. It is 1 for uniform causal attention and 0 for one-hot rows. Per-row
    values are clipped to [0, 1], because float16 rows do not sum exactly to 1.

    Parameters
    ----------
    attn : DataArray
        ``(..., snapshot, layer, head, probe, query, key)``.
    weights : DataArray, optional
        ``(..., probe)`` probe weights: see `role_scores`. Default: each probe once.

    Returns
    -------
    DataArray
        float64, ``(..., snapshot, layer, head)``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> uniform = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    >>> round(diffuse_score(xr.DataArray(uniform[None], dims=("probe", "query", "key"))).item(), 6)
    1.0
    """
    n = _check_square(attn)
    if n < 2:
        raise ValueError("diffuse_score needs at least 2 positions")
    # entr(x) = -x ln x with entr(0) = 0, elementwise and lazy on dask; NaN (padded) stays NaN.
    entropy = entr(attn.astype(np.float32)).sum(KEY, skipna=False).astype(np.float64)
    normalised = (entropy.isel({QUERY: slice(1, None)}) / np.log(_positions(n, QUERY)[1:] + 1.0)).clip(0.0, 1.0)
    out = _probe_mean(normalised, weights)
    out.name = "diffuse"
    return out


def role_scores(attn: xr.DataArray, tokens: xr.DataArray, thresholds: RoleThresholds | None = None,
                weights: xr.DataArray | None = None) -> xr.Dataset:
    """Every role score of every head at every snapshot.

    The variables, each ``(..., snapshot, layer, head)`` and float64:

    - ``previous_token`` = slash_score(1), ``self`` = slash_score(0) (Cheng et al. 2026);
    - ``slash`` = max slash_score(delta) over delta in [slash_min_offset, slash_max_offset],
      and ``slash_offset``, the delta where it is reached;
    - ``induction``, see `induction_score` (Olsson et al. 2022);
    - ``sink`` = alpha_0, see `sink_score` (Gu et al. 2025);
    - ``token`` = mean over probes of `dynamics.analysis.slash.token_share` for
      ``thresholds.token_id``. It is NaN when the token never appears;
    - ``local``, see `local_score`, with ``thresholds.local_width``;
    - ``diffuse``, see `diffuse_score`.

    All scores lie in [0, 1]. They are NaN for NaN-padded heads; ``slash`` (with
    ``slash_offset``) and ``local`` are NaN where the probes are too short for their offsets,
    and each positional role (previous_token, self, sink, local) is NaN where uniform
    causal attention over the probe's T positions, or (for all but sink) attention wholly on
    the first token, already reaches its threshold (sink for T <= 9, self for T <= 4,
    previous_token for T <= 3): such probes cannot tell that role from no pattern, or from a
    sink. ``induction`` is NaN where uniform attention on these probes' tokens reaches its
    threshold (few or repetitive tokens). ``slash`` leaves out, offset by offset, those where either does
    (`dynamics.analysis.slash.confounded_offsets`: at the default window, its one offset at
    T = 4; a window reaching T - 2, its last offsets at any T), and is NaN when none is left.

    Returning a Dataset rather than a DataArray stacked on a "role" dim keeps ``slash_offset``,
    which is not a score, next to the scores. It also lets each score carry its own attrs.
    ``scores[list(ROLES[:-1])].to_dataarray("role")`` stacks the scores if needed.

    Parameters
    ----------
    attn : DataArray
        ``(..., snapshot, layer, head, probe, query, key)``.
    tokens : DataArray
        ``(probe, position)`` int token ids.
    thresholds : RoleThresholds, optional
        Supplies token_id, local_width and the slash offset window. Defaults to `RoleThresholds()`.
    weights : DataArray, optional
        ``(..., probe)``, non-negative with a positive sum over probe: every score (and
        induction's chance level) is then read on the multiset of probe sequences the weights
        describe, each probe counted by its weight, and gains their other dims.
        `dynamics.analysis.probe_resample.probe_counts` gives bootstrap resamples ``(resample,
        probe)``, so that `assign_roles` labels each head on each resample: how far a label rests
        on the recorded probe sample. Default: each probe once.

    Returns
    -------
    Dataset
        The settings used are kept in ``attrs``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> a = np.eye(16, k=-1); a[0, 0] = 1  # previous-token head
    >>> attn = xr.DataArray(a[None, None, None, None], dims=("snapshot", "layer", "head", "probe", "query", "key"))
    >>> tokens = xr.DataArray(np.arange(16)[None], dims=("probe", "position"))
    >>> scores = role_scores(attn, tokens)
    >>> scores["previous_token"].item(), role_names(assign_roles(scores)).item()
    (1.0, 'previous_token')
    """
    thresholds = RoleThresholds() if thresholds is None else thresholds
    n = _check_square(attn)
    require_dims(tokens, (PROBE, POSITION), "role_scores: tokens")  # ds.probe_tokens, not its .values
    if tokens.sizes[PROBE] != attn.sizes[PROBE]:  # xarray's AlignmentError named the dim alone
        raise ValueError(f"role_scores: tokens have {tokens.sizes[PROBE]} probe rows but attention has "
                         f"{attn.sizes[PROBE]}; pass the probe tokens the attention was recorded on")
    if n < 2:  # as model.context >= 2: one position attends to itself whatever the head does
        raise ValueError(f"role_scores needs probes of at least 2 positions (no previous token to score at 1); "
                         f"got query={n}")
    max_offset = n // 2 if thresholds.slash_max_offset is None else thresholds.slash_max_offset
    max_offset = min(max(max_offset, 1), n - 1)
    diagonals = slash_score(attn, max_offset=max_offset, weights=weights)
    # Probes too short for a role's offsets (T < 4 leaves the default slash window empty; the
    # local band needs T > local_width) give it no score, NaN, which never passes: a run of any
    # valid context (2 and 3 are, for markov and offset_copy) is analysed, with the roles its
    # probes can show.
    unscored = xr.full_like(diagonals.isel({OFFSET: 0}, drop=True), np.nan)
    if thresholds.slash_min_offset <= max_offset:
        # Offset by offset, as slash-dominance does: a wide window's last offsets, which any
        # sink passes, must not blank the offsets a slash head can be told apart at.
        lost = confounded_offsets(n, range(thresholds.slash_min_offset, max_offset + 1), thresholds.slash)
        told = diagonals.where(~diagonals[OFFSET].isin(lost))  # (..., offset), NaN where any head passes
        slash_offset, slash = best_offset(told, thresholds.slash_min_offset, max_offset)
    else:
        slash_offset, slash = unscored, unscored
    # Induction's chance level rests on the tokens, not on T alone: on few or repetitive ones
    # uniform attention already reaches the threshold (0.75 on 4-token Markov probes), and every
    # head with no pattern read "induction". NaN there, as the positional roles below.
    keep = np.tril(np.ones((n, n)))
    uniform = xr.DataArray(np.broadcast_to(keep / keep.sum(1, keepdims=True), (tokens.sizes[PROBE], n, n)),
                           dims=(PROBE, QUERY, KEY))  # (P, T, T)
    by_chance = induction_score(uniform, tokens, weights)  # () over these probes; lazy on lazy tokens
    scores = _unless_confounded({
        "previous_token": diagonals.sel({OFFSET: 1}, drop=True),
        "self": diagonals.sel({OFFSET: 0}, drop=True),
        "slash": slash,
        "slash_offset": slash_offset,
        "induction": induction_score(attn, tokens, weights).where(by_chance < thresholds.induction),
        "sink": sink_score(attn, weights=weights),
        "token": _token_score(token_share(attn, tokens, thresholds.token_id), weights),
        "local": local_score(attn, thresholds.local_width, weights) if thresholds.local_width < n else unscored,
        "diffuse": diffuse_score(attn, weights),
    }, n, max_offset, thresholds)
    ds = xr.Dataset({name: value.rename(name) for name, value in scores.items()})
    for name in ROLES[:-1]:
        ds[name].attrs = {"units": "1", "threshold": float(getattr(thresholds, name))}
    ds["slash_offset"].attrs = {"long_name": "offset of the best slash score", "units": "positions"}
    ds.attrs = {
        "token_id": int(thresholds.token_id),
        "local_width": int(thresholds.local_width),
        "slash_min_offset": int(thresholds.slash_min_offset),
        "slash_max_offset": int(max_offset),
    }
    return ds


def _token_score(share: xr.DataArray, weights: xr.DataArray | None) -> xr.DataArray:
    """The mean of ``(..., probe)`` token shares over the probes that hold the token (NaN skipped)."""
    if weights is None:
        return share.mean(PROBE)
    return weighted_probe_mean(share.fillna(0.0), weights, count=share.notnull())


# Roles read from positions alone: on short probes a head with no such pattern can pass them.
# (slash is masked offset by offset in `role_scores`, not here as a whole)
_POSITIONAL_ROLES = ("previous_token", "self", "sink", "local")


def _positional_baselines(attn: xr.DataArray, max_offset: int, thresholds: RoleThresholds) -> dict[str, float]:
    """The positional role scores of one (probe, query, key) pattern."""
    n = attn.sizes[QUERY]
    diagonals = slash_score(attn, max_offset=max_offset)
    return {
        "previous_token": diagonals.sel({OFFSET: 1}).item(),
        "self": diagonals.sel({OFFSET: 0}).item(),
        "sink": sink_score(attn).item(),
        "local": local_score(attn, thresholds.local_width).item() if thresholds.local_width < n else np.nan,
    }


def _unless_confounded(scores: dict, n: int, max_offset: int, thresholds: RoleThresholds) -> dict:
    """`scores` with NaN for each positional role that uniform causal attention, or (for the roles
    other than sink) all attention on the first token, already passes over ``n`` positions.

    Probes that short cannot tell such a head from no pattern, or from a sink: alpha_0 = H_T / T
    reaches the sink threshold 0.3 up to T = 9 and self's 0.5 up to T = 4, so every head read
    "sink" there; at T <= 3 a sink head scores previous_token(1) = 0.5. NaN never passes.
    """
    out = dict(scores)
    for role in _confounded_roles(n, max_offset, thresholds):
        out[role] = xr.full_like(scores[role], np.nan)
    return out


@functools.lru_cache(maxsize=64)
def _confounded_roles(n: int, max_offset: int, thresholds: RoleThresholds) -> tuple[str, ...]:
    """The positional roles `_unless_confounded` blanks over ``n`` positions.

    A function of the probe length and the thresholds alone, so it is worked out once for each:
    scoring the two reference patterns cost about 27 ms, paid at every `role_scores` call (each
    block of a run read in blocks, each run the predictor loads).
    """
    keep = np.tril(np.ones((n, n)))
    uniform = xr.DataArray((keep / keep.sum(1, keepdims=True))[None], dims=(PROBE, QUERY, KEY))  # (1, T, T)
    first = xr.DataArray(np.eye(n)[[0] * n][None], dims=(PROBE, QUERY, KEY))  # (1, T, T): all on key 0
    by_uniform = _positional_baselines(uniform, max_offset, thresholds)
    by_first = _positional_baselines(first, max_offset, thresholds)
    return tuple(role for role in _POSITIONAL_ROLES
                 if by_uniform[role] >= getattr(thresholds, role)
                 or (role != "sink" and by_first[role] >= getattr(thresholds, role)))


def assign_roles(scores: xr.Dataset, thresholds: RoleThresholds | None = None) -> xr.DataArray:
    """One role label per head, as int8 codes into `ROLES`.

    The rule:

    1. A role passes if ``score >= threshold``. NaN never passes.
    2. If any specific role passes (previous_token, self, slash, induction, sink, token), the
       label is the passing specific role with the largest margin ``score / threshold``.
    3. Otherwise, if a generic role passes (local, diffuse), the label is the passing generic
       role with the largest margin.
    4. Otherwise the label is "none". Padded heads (all NaN) are labelled "none" too, so mask
       them with ``scores["diffuse"].notnull()``.

    Exact ties go to the role that comes first in `ROLES`. Specific roles come before generic
    ones because a previous-token or self head is also local, and a 50/50 mix of two positions
    is neither diffuse nor local, but one of the two may be a real pattern. Dividing by the
    threshold puts scores with different scales on one axis (sink passes at 0.3, slash at 0.5).

    Parameters
    ----------
    scores : Dataset
        Output of `role_scores`.
    thresholds : RoleThresholds, optional
        Must be those the scores were made with (`role_scores` blanks roles by them, and
        records each in its score's ``threshold`` attr): other ones raise ValueError. Defaults
        to the scores' own, and to `RoleThresholds()` for a score that records none.

    Returns
    -------
    DataArray
        int8, ``(..., snapshot, layer, head)``, with the CF attrs ``flag_values`` and
        ``flag_meanings``, so it stores cleanly in Zarr.

    Examples
    --------
    >>> import xarray as xr
    >>> s = xr.Dataset({r: ("head", [0.0, 0.0]) for r in ROLES[:-1]})
    >>> s["self"][0] = 0.9; s["diffuse"][:] = 0.95  # head 0: self and diffuse pass
    >>> role_names(assign_roles(s)).tolist()
    ['self', 'diffuse']
    """
    if not hasattr(scores, "data_vars"):  # one score failed as "The truth value of a Array is ambiguous"
        raise ValueError(f"assign_roles: scores must be the Dataset of every role score that role_scores returns; "
                         f"got {type(scores).__name__}")
    made = {r: scores[r].attrs["threshold"] for r in ROLES[:-1] if r in scores and "threshold" in scores[r].attrs}
    if thresholds is None:
        thresholds = RoleThresholds(**made)
    for role, value in made.items():
        if value != getattr(thresholds, role):
            # which roles role_scores blanks depends on them: a uniform head at T = 10, its sink
            # blanked at 0.3, kept 0.293 and read "sink" when labelled at 0.25
            raise ValueError(f"assign_roles: the {role} score was made with threshold {value!r}, not "
                             f"{getattr(thresholds, role)!r}; score again with these thresholds (role_scores)")
    role_dim = "_role"

    def ranked(roles):
        score = xr.concat([scores[r] for r in roles], dim=role_dim)
        limit = xr.DataArray([getattr(thresholds, r) for r in roles], dims=role_dim)
        passing = score >= limit
        return xr.where(passing, score / limit, -np.inf), passing.any(role_dim)

    specific, any_specific = ranked(SPECIFIC_ROLES)
    generic, any_generic = ranked(GENERIC_ROLES)
    codes = xr.where(
        any_specific,
        specific.argmax(role_dim),
        xr.where(any_generic, generic.argmax(role_dim) + len(SPECIFIC_ROLES), ROLES.index("none")),
    ).astype(np.int8)
    codes.name = "role"
    codes.attrs = {
        "long_name": "head role",
        "flag_values": list(range(len(ROLES))),
        "flag_meanings": " ".join(ROLES),
    }
    return codes


def role_names(codes) -> np.ndarray:
    """Role names for codes from `assign_roles`, as a numpy string array of the same shape.

    NaN codes (a head masked out, such as a sweep's padding) give "". This computes
    dask-backed input. Use it for reports and tests, not inside lazy pipelines.

    Examples
    --------
    >>> role_names([0, 8]).tolist()
    ['previous_token', 'none']
    >>> role_names([0.0, float("nan")]).tolist()
    ['previous_token', '']
    """
    codes = np.asarray(codes)
    missing = np.isnan(codes) if codes.dtype.kind == "f" else np.zeros(codes.shape, bool)
    known = codes[~missing]
    if known.size and (known.min() < 0 or known.max() >= len(ROLES) or (known != np.round(known)).any()):
        raise ValueError(f"role codes must be integers in [0, {len(ROLES) - 1}] (or NaN for a missing head); "
                         f"got {known.min()}..{known.max()}")
    names = np.asarray(ROLES + ("",))  # the extra "" is where missing codes point
    return names[np.where(missing, len(ROLES), codes).astype(np.int64)]


def probe_sensitive_heads(labels: xr.DataArray, resampled: xr.DataArray) -> list[dict]:
    """The heads whose label fewer than `LABEL_AGREEMENT` (90%) of the resamples give.

    ``labels``: one snapshot's codes ``(layer, head)`` (the analysis's ``role`` at its last);
    ``resampled``: theirs on probe resamples ``(resample, layer, head)`` (``role_resampled``).
    One dict a head, in (layer, head) order: ``layer``, ``head``, ``role`` (its label),
    ``agreement`` (`probe_resample.label_agreement`) and ``other``, the label most of the
    other resamples give (ties: the first in `ROLES`). A padded head (NaN label) is none.

    Examples
    --------
    >>> import xarray as xr
    >>> labels = xr.DataArray([[1, 4]], dims=("layer", "head"))
    >>> again = xr.DataArray([[[1, 4]], [[0, 4]], [[0, 4]], [[1, 4]]], dims=("resample", "layer", "head"))
    >>> probe_sensitive_heads(labels, again)
    [{'layer': 0, 'head': 0, 'role': 'self', 'agreement': 0.5, 'other': 'previous_token'}]
    """
    require_dims(resampled, (RESAMPLE, LAYER, HEAD), "probe_sensitive_heads: resampled")
    agreement = label_agreement(labels, resampled).transpose(LAYER, HEAD).values
    codes = labels.transpose(LAYER, HEAD).values
    again = resampled.transpose(LAYER, HEAD, RESAMPLE).values
    out = []
    for layer, head in zip(*np.nonzero(agreement < LABEL_AGREEMENT), strict=True):
        others = again[layer, head][again[layer, head] != codes[layer, head]]
        values, counts = np.unique(others, return_counts=True)  # sorted: a tie goes to the first role
        out.append({"layer": int(layer), "head": int(head), "role": str(role_names(codes[layer, head])),
                    "agreement": float(agreement[layer, head]), "other": str(role_names(values[np.argmax(counts)]))})
    return out


def probe_sensitive_text(head: dict) -> str:
    """One head of `probe_sensitive_heads` as the notes name it: ``L0H3 local 68.5% (else none)``.

    One decimal: 179 of 200 resamples, under the 90% that names a head, printed "90%" at none.
    """
    return f"L{head['layer']}H{head['head']} {head['role']} {head['agreement']:.1%} (else {head['other']})"
