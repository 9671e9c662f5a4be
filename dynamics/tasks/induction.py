"""``induction``: a random segment of random period repeated."""

from __future__ import annotations

import numpy as np

# ----------------------------------------------------------------------------- induction


SORT_BLOCK = 2**18
"""Random keys sorted at once by :func:`_permutation_prefix` (rows x vocabulary): 4 MiB of them."""


def permutation_sampler(k: int, V: int) -> bool:
    """Whether a segment of ``k`` tokens of ``V`` is drawn as a permutation's prefix (else i.i.d.:
    with repeats redrawn for k <= V, as they are for k > V, where no distinct segment exists).
    Redrawing is a coupon collector's endgame as k nears V: 43 s a batch of 32 at k = V = 2048,
    so past V / 2 the permutation is drawn there too."""
    return k <= V and (V <= 1024 or 2 * k > V)


def _permutation_prefix(rng: np.random.Generator, n: int, k: int, V: int) -> np.ndarray:
    """(n, k) int64: per row, the first k of a random permutation of range(V).

    The keys are drawn and sorted a block of rows at a time: the same draws in the same order as
    all at once (so the same tokens), but no longer 16 V bytes per row of keys and argsort at once:
    a low-data pool of 200,000 rows at V = 1024 peaked at 3.16 GB for its 50 MiB of tokens, and
    at 169 MB drawn by blocks."""
    out = np.empty((n, k), dtype=np.int64)
    rows = max(1, SORT_BLOCK // V)
    for i in range(0, n, rows):
        m = min(rows, n - i)
        out[i:i + m] = np.argsort(rng.random((m, V)), axis=1)[:, :k]  # (m, V) keys -> (m, k)
    return out


def _distinct_rows(rng: np.random.Generator, n: int, k: int, V: int) -> np.ndarray:
    """(n, k) int64 tokens from range(V), distinct within each row when k <= V."""
    if k > V:
        return rng.integers(V, size=(n, k))
    if permutation_sampler(k, V):
        return _permutation_prefix(rng, n, k, V)
    # Large vocabularies, short segments: draw i.i.d. and redraw the (rare) repeats until none remain.
    x = rng.integers(V, size=(n, k))
    while True:
        order = np.argsort(x, axis=1, kind="stable")
        s = np.take_along_axis(x, order, axis=1)
        dup = np.zeros_like(x, dtype=bool)
        np.put_along_axis(dup, order[:, 1:], s[:, 1:] == s[:, :-1], axis=1)
        if not dup.any():
            return x
        x[dup] = rng.integers(V, size=int(dup.sum()))


def _induction(rng, n, T, V, min_period, max_period):
    # Period per row, then the row is its first P tokens repeated. Tokens within a segment
    # are distinct (when the vocabulary allows), so after the first period the current
    # token alone says where to look back: exactly the induction-head lookup.
    P = rng.integers(min_period, max_period + 1, size=n)
    seg = _distinct_rows(rng, n, max_period, V)
    idx = np.arange(T + 1)[None, :] % P[:, None]  # (n, T+1)
    tokens = np.take_along_axis(seg, idx, axis=1)  # (n, T+1) int64 already: no copy
    mask = (np.arange(1, T + 1)[None, :] >= P[:, None])  # target t+1 repeats token t+1-P
    return tokens, mask
