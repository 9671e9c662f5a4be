"""Voita et al.'s positional head: where each row of attention peaks, not how much it holds there.

Sources
-------
- Voita, Talbot, Moiseev, Sennrich, Titov 2019, "Analyzing Multi-Head Self-Attention": a head is
  positional when its largest weight falls at a fixed offset (here 1, the previous token) in at
  least 90% of cases. The slash score (`dynamics.analysis.slash`) and the previous_token role
  (`dynamics.analysis.roles`) ask instead for a mean weight there, which a head peaking one step
  back in every row can fall short of.

Attention is ``(..., probe, query, key)``, causal rows, as in `dynamics.analysis.slash`;
dask-backed input gives dask-backed output.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
import xarray as xr

from dynamics.analysis.slash import _check_square
from dynamics.schema import KEY, PROBE, QUERY

__all__ = ["MISSED_NOTE", "VOITA_PEAK", "missed_previous_token", "peak_share"]

VOITA_PEAK = 0.9
"""Share of rows peaking at offset 1 that makes Voita et al. 2019's positional head (`peak_share`)."""


def _peak_rows(a: np.ndarray, delta: int) -> np.ndarray:
    # a: (..., probe, query, key) -> (...). A row counts when its weight at key i - delta is
    # larger than at every other visible key: strictly, so a uniform row (all keys tied) is no
    # hit. Rows whose key at that offset is the first token (i = delta) are not rows of the rule:
    # a sink head peaks there (at T = 2 it had met the rule), and for delta = 0 it is the row
    # with one visible key.
    n = a.shape[-1]
    start = delta + 1
    if start >= n:
        return np.full(a.shape[:-3], np.nan)
    rows = np.arange(start, n)  # (R,)
    a = a[..., start:, :].astype(np.float32)  # (..., P, R, T)
    target = a[..., np.arange(rows.size), rows - delta]  # (..., P, R)
    visible = np.arange(n)[None, :] <= rows[:, None]  # (R, T)
    visible[np.arange(rows.size), rows - delta] = False  # the others
    others = np.where(visible, a, -np.inf).max(-1)  # (..., P, R)
    hit = (target > others).astype(np.float64)
    hit[np.isnan(target)] = np.nan  # a padded head: NaN, not a miss
    return hit.mean(axis=(-2, -1))


def peak_share(attn: xr.DataArray, delta: int = 1) -> xr.DataArray:
    """Share of rows whose largest weight is at offset ``delta``: Voita et al. 2019's rule.

    ``mean_{p, i > delta} [A_p[i, i - delta] > A_p[i, k] for every other k <= i]``.
    Voita et al.'s positional head (delta = 1, previous token) has it >= 0.9. It asks where each
    row peaks, not how much it holds there: a head peaking one step back in every row while
    holding 0.4 of its attention there meets it, and scores 0.4 on ``slash_score(1)``, short of
    the previous_token role's 0.5. Ties are no peak (a uniform row has none), so uniform causal
    attention scores 0; the row whose key at the offset is the first token is not counted, so a
    sink head scores 0 too.

    Parameters
    ----------
    attn : DataArray
        ``(..., probe, query, key)`` attention.
    delta : int
        The offset, 0 <= delta < T.

    Returns
    -------
    DataArray
        ``(...)`` in [0, 1], float64; NaN for a NaN-padded head, and where no row is counted
        (T <= delta + 1).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> weak = 0.3 * np.eye(8, k=-1) + 0.7 * np.tril(np.ones((8, 8))) / np.arange(1, 9)[:, None]
    >>> a = xr.DataArray(weak[None], dims=("probe", "query", "key"))  # 0.3 one step back, the rest uniform
    >>> from dynamics.analysis.slash import slash_score
    >>> round(peak_share(a).item(), 3), round(slash_score(a).sel(offset=1).item(), 3)
    (1.0, 0.472)
    """
    n = _check_square(attn)
    if not (isinstance(delta, Integral) and 0 <= delta < n):
        raise ValueError(f"delta must be an integer in [0, {n - 1}]; got {delta!r}")
    out = xr.apply_ufunc(
        _peak_rows, attn, input_core_dims=[[PROBE, QUERY, KEY]], kwargs={"delta": int(delta)},
        dask="parallelized", output_dtypes=[np.float64],
        dask_gufunc_kwargs={"allow_rechunk": True},  # as slash_score: chunked along probe, query or key too
    )
    out.name = "peak_share"
    out.attrs = {"long_name": f"share of rows whose largest weight is at offset {int(delta)} (Voita et al.: >= 0.9)",
                 "units": "1", "offset": int(delta)}
    return out


MISSED_NOTE = ("put their largest weight one step back in >= 90% of rows at the last snapshot (Voita et al.'s "
               "positional head) but are not labelled previous_token, which asks for a mean weight of 0.5 there (or "
               "another role's margin is larger)")
"""What `dynamics analyse` and the report say of the heads `missed_previous_token` counts."""


def missed_previous_token(peak, role) -> int:
    """Heads meeting Voita et al.'s rule (``peak >= VOITA_PEAK``) whose role label is not
    previous_token: ``peak`` a snapshot's ``previous_token_peak``, ``role`` its role codes (NaN:
    a sweep's padded head, no head).

    >>> missed_previous_token([0.99, 0.95, 0.5], [6, 0, 8])
    1
    """
    from dynamics.analysis.roles import ROLES

    peak, role = np.asarray(peak, dtype=float), np.asarray(role, dtype=float)
    return int(((peak >= VOITA_PEAK) & (role != ROLES.index("previous_token"))).sum())
