"""``offset_copy``: each token copies the one delta back with probability p."""

from __future__ import annotations

import numpy as np

# ----------------------------------------------------------------------------- offset_copy


def _offset_copy(rng, n, T, V, delta, p):
    # Each residue class mod delta is its own chain: position t copies t - delta with
    # probability p. Vectorised as a forward fill of the last fresh draw along each chain.
    L = T + 1
    fresh = rng.integers(V, size=(n, L))
    copied = rng.random((n, L)) < p
    copied[:, :delta] = False
    m = -(-L // delta)  # chain length after padding to a multiple of delta
    pad = m * delta - L
    c = np.pad(copied, ((0, 0), (0, pad))).reshape(n, m, delta)
    j = np.arange(m)[None, :, None]
    src = np.maximum.accumulate(np.where(c, 0, j), axis=1)  # index of the last fresh draw
    pos = (src * delta + np.arange(delta)[None, None, :]).reshape(n, m * delta)[:, :L]
    tokens = np.take_along_axis(fresh, pos, axis=1)
    return tokens.astype(np.int64), copied[:, 1:].copy()
