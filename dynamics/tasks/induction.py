"""``induction``: a random segment of random period repeated."""

from __future__ import annotations

import numpy as np

# ----------------------------------------------------------------------------- induction


def _distinct_rows(rng: np.random.Generator, n: int, k: int, V: int) -> np.ndarray:
    """(n, k) int64 tokens from range(V), distinct within each row when k <= V."""
    if k > V:
        return rng.integers(V, size=(n, k))
    if V <= 1024:  # exact: the first k of a random permutation of range(V)
        return np.argsort(rng.random((n, V)), axis=1)[:, :k].astype(np.int64)
    # Large vocabularies: draw i.i.d. and redraw the (rare) repeats until none remain.
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
    tokens = np.take_along_axis(seg, idx, axis=1)
    mask = (np.arange(1, T + 1)[None, :] >= P[:, None])  # target t+1 repeats token t+1-P
    return tokens.astype(np.int64), mask
