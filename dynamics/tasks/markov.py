"""``markov``: a sparse random n-gram chain fixed by the task config, and its transition rules."""

from __future__ import annotations

import functools

import numpy as np

# ----------------------------------------------------------------------------- markov

_U64 = np.uint64
_MARKOV_SALT = 0x6D61726B6F76  # "markov"
_MARKOV_LEVELS = 256  # transition probabilities are multiples of 1/256
_MARKOV_LUT_MAX = 1 << 21  # next-token table entries (contexts x levels)
_MARKOV_TABLE_MAX = 1 << 22  # rule-table entries (contexts x branching); beyond, evaluate by hashing


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrap-around arithmetic)."""
    z = z + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def _markov_rules(ctx: np.ndarray, V: int, order: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Successors (N, K) int64 and cumulative levels (N, K) for contexts ctx (N, order), oldest first.

    The chain is a fixed hash of (vocab_size, order, branching, context), so it is the same
    for every run seed and split: seeds are replicates of one task. Successor weights are
    -log(U) normalised (Dirichlet(1, ..., 1) probabilities), rounded to multiples of
    1/_MARKOV_LEVELS; successor j is drawn for a uniform level q in [0, levels) when
    cum[j-1] <= q < cum[j]. Repeated ids merge and rounding can zero a weight, so a context
    has at most K successors.
    """
    h = np.full(ctx.shape[0], _MARKOV_SALT ^ (V << 24) ^ (order << 16) ^ K, dtype=np.uint64)
    for i in range(order):
        h = _mix64(h ^ ctx[:, i].astype(np.uint64))
    j = np.arange(1, K + 1, dtype=np.uint64)[None, :]
    succ = (_mix64(h[:, None] + j * _U64(0xD1B54A32D192ED03)) % _U64(V)).astype(np.int64)
    bits = _mix64(h[:, None] ^ (j * _U64(0x8CB92BA72F3D8DD7))) >> _U64(11)
    w = -np.log((bits.astype(np.float64) + 1.0) * 2.0**-53)
    cum = np.rint(np.cumsum(w, axis=1) / w.sum(axis=1, keepdims=True) * _MARKOV_LEVELS).astype(np.int64)
    cum[:, -1] = _MARKOV_LEVELS
    return succ, cum


def markov_transitions(V: int, order: int, K: int, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chain's rules for given contexts: (successors (N, K), probabilities (N, K)).

    Parameters
    ----------
    V, order, K : int
        ``model.vocab_size``, ``task.markov_order``, ``task.markov_branching``.
    contexts : np.ndarray
        ``(N, order)`` int tokens, oldest first.

    Returns
    -------
    tuple of np.ndarray
        Successor ids and their probabilities (rows sum to 1; ids may repeat).

    Example
    -------
    >>> succ, prob = markov_transitions(64, 1, 3, np.array([[5]]))
    >>> succ.shape, float(prob.sum())
    ((1, 3), 1.0)
    """
    for name, value in (("V", V), ("order", order), ("K", K)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            # an IndexError or a reshape error from deep in the rules otherwise (the CLI's config
            # checks refuse these first; this is for library callers)
            raise ValueError(f"markov_transitions: {name} must be an integer >= 1; got {value!r}")
    ctx = np.asarray(contexts)
    if ctx.size and (ctx.dtype.kind not in "iu" or ctx.min() < 0 or ctx.max() >= V or ctx.shape[-1] != order):
        # rules were returned for tokens the vocabulary does not have, and contexts of another
        # length were silently refolded into rows of `order`
        raise ValueError(f"markov_transitions: contexts must be (N, order={order}) int tokens in [0, {V}); "
                         f"got shape {ctx.shape}, dtype {ctx.dtype}, values {ctx.min()}..{ctx.max()}")
    succ, cum = _markov_rules(ctx.astype(np.int64).reshape(-1, order), V, order, K)
    return succ, np.diff(cum, axis=1, prepend=0) / _MARKOV_LEVELS


def _all_contexts(V: int, order: int) -> np.ndarray:
    """(V**order, order) contexts, row ctx = sum_i x_i V^(order-1-i), oldest token first."""
    idx = np.arange(V**order)
    return np.stack([(idx // V ** (order - 1 - i)) % V for i in range(order)], axis=1)


@functools.lru_cache(maxsize=8)
def _markov_lut(V: int, order: int, K: int) -> np.ndarray:
    """Flat next-token table: entry ctx * levels + q is the successor for level q."""
    succ, cum = _markov_rules(_all_contexts(V, order), V, order, K)
    counts = np.diff(cum, axis=1, prepend=0)
    return np.repeat(succ.ravel(), counts.ravel()).astype(np.int32)  # `levels` slots per context


@functools.lru_cache(maxsize=8)
def _markov_table(V: int, order: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Rules for every context, compact: successors int32 (N, K), levels int16 (N, K)."""
    succ, cum = _markov_rules(_all_contexts(V, order), V, order, K)
    return succ.astype(np.int32), cum.astype(np.int16)


def _markov(rng, n, L, V, order, K, method: str | None = None):
    """(n, L) tokens: the first `order` uniform, the rest sampled from the chain.

    Three evaluations of the same chain, fastest first, chosen by table size: "lut" (one
    gather per step), "table" (cached rules per context), "hash" (rules recomputed per step;
    no memory, any vocabulary and order).
    """
    M, N = _MARKOV_LEVELS, V**order
    if method is None:
        method = "lut" if N * M <= _MARKOV_LUT_MAX else "table" if N * K <= _MARKOV_TABLE_MAX else "hash"
    tokens = np.empty((L, n), dtype=np.int64)  # time-major: each step writes one contiguous row
    tokens[:order] = rng.integers(V, size=(order, n))
    q = rng.integers(M, size=(L, n))
    rows = np.arange(n)
    if method == "hash":
        for t in range(order, L):
            succ, cum = _markov_rules(tokens[t - order : t].T, V, order, K)
            tokens[t] = succ[rows, (cum <= q[t][:, None]).sum(axis=1)]
        return np.ascontiguousarray(tokens.T)
    ctx = np.zeros(n, dtype=np.int64)
    for i in range(order):
        ctx = ctx * V + tokens[i]
    span = V ** (order - 1)
    if method == "lut":
        lut = _markov_lut(V, order, K)
        for t in range(order, L):
            tokens[t] = lut[ctx * M + q[t]]
            ctx = (ctx % span) * V + tokens[t]
    else:
        succ_t, cum_t = _markov_table(V, order, K)
        for t in range(order, L):
            tokens[t] = succ_t[ctx, (cum_t[ctx] <= q[t][:, None]).sum(axis=1)]
            ctx = (ctx % span) * V + tokens[t]
    return np.ascontiguousarray(tokens.T)
