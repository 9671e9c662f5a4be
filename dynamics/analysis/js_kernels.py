"""The smoothed Jensen-Shannon distance on numpy blocks: the kernels of `divergence.js_distance`.

Its formula and sources are in :func:`dynamics.analysis.divergence.js_distance`. These work on
whole numpy arrays (a dask chunk, or a whole in-memory run) a block at a time, and in place,
because their float64 temporaries, not the float16 input, are what bound the analysis's
memory. A distance's bits do not depend on how its run is chunked, so a run analysed
lazily in chunks gives its in-memory values.
"""

from __future__ import annotations

import numpy as np

# Bytes of one float64 temporary in the JS kernels; peak use is a few times this.
BLOCK_BYTES = 16 * 2**20


def _xlogx(x: np.ndarray) -> np.ndarray:
    """x ln x with 0 ln 0 = 0; NaN stays NaN so missing heads propagate.

    The bits of ``x * ln(where(x > 0, x, 1))`` with one temporary of x's size, not three.
    """
    out = np.zeros_like(x)
    np.log(x, out=out, where=x > 0)
    out *= x
    return out


def _smooth(a: np.ndarray, mask: np.ndarray, eps: float) -> np.ndarray:
    """Renormalise rows over visible keys, then p' = eps/n + (1 - eps) p (Clark et al. 2019).

    ``a`` (..., Q, K); ``mask`` (Q, K). Renormalising undoes float16 storage rounding, so
    the smoothed rows are exact distributions and the JS bound holds. A row with no mass on
    its visible keys is no distribution: it comes out NaN, as a missing head's does (smoothed,
    it summed to eps and sat about 0.59 from every real pattern). Computed in place in one
    float64 copy of ``a`` (the same operations as out-of-place, so the same bits): a float16
    block's float64 temporaries are what bound the analysis's memory.
    """
    out = np.asarray(a).astype(np.float64, order="C")
    hidden = ~mask
    np.copyto(out, 0.0, where=hidden)
    total = out.sum(-1, keepdims=True)
    out /= np.where(total > 0, total, np.where(mask.any(-1, keepdims=True), np.nan, 1.0))
    n = np.maximum(mask.sum(-1, keepdims=True), 1)  # (Q, 1) visible keys per query
    out *= 1.0 - eps
    out += eps / n
    np.copyto(out, 0.0, where=hidden)
    return out


def _js_terms_sum(p, q, fp, fq, *, overwrite: bool = False):
    """Per-key JS terms (f(p) + f(q))/2 - f((p+q)/2), f(x) = x ln x, summed over key and
    averaged over (probe, query): ``(...,)`` from ``(..., P, Q, K)``.

    Each term is >= 0 by convexity of f, is exactly 0 when p == q, and is symmetric in
    (p, q) bit for bit, so identical heads get distance exactly 0. Built in place, the same
    operations as out of place (so the same bits): these float64 blocks are what bound the
    analysis's memory. ``overwrite``: ``p`` and ``fp`` are scratch, of the broadcast shape,
    and hold (p + q)/2 and the terms on return, so only one temporary is made, not six.
    """
    m = np.add(p, q, out=p if overwrite else None)
    m *= 0.5  # (p + q) / 2
    fm = _xlogx(m)
    f = np.add(fp, fq, out=fp if overwrite else None)
    f *= 0.5  # (f(p) + f(q)) / 2
    f -= fm
    return f.sum(-1).mean((-2, -1))


def js_aligned_kernel(a, b, mask, eps, block_bytes=BLOCK_BYTES):
    # a, b broadcastable (..., P, Q, K) -> (...,) JS distance, mean over probe and query.
    # Taken a block of the leading dims at a time (into the next leading dim when one item of
    # the first is over block_bytes, as one snapshot of a large model is), so a whole
    # in-memory run costs a few block_bytes of float64 on top of its input; each output
    # reduces only its own trailing (P, Q, K) block, so the values do not depend on the blocking.
    lead = np.broadcast_shapes(a.shape[:-3], b.shape[:-3])
    core = np.broadcast_shapes(a.shape[-3:], b.shape[-3:])
    a = a.reshape((1,) * (len(lead) + 3 - a.ndim) + a.shape)
    b = b.reshape((1,) * (len(lead) + 3 - b.ndim) + b.shape)
    out = np.empty(lead)
    # An operand the other is compared against throughout (divergence_from_init's first
    # snapshot, broadcast along snapshot) is smoothed once, not once per block.
    fixed = {}
    for name, x in (("a", a), ("b", b)):
        if x.size < np.prod(lead + core) and x.size * 8 <= block_bytes:
            s = _smooth(x, mask, eps)
            fixed[name] = (s, _xlogx(s))
    _js_aligned_into(out, a, b, mask, eps, block_bytes, int(np.prod(core)) * 8, fixed)
    return np.sqrt(np.clip(out, 0.0, None))


def _js_aligned_into(out, a, b, mask, eps, block_bytes, per_item, fixed):
    """Fill ``out`` (the leading shape) with the JS divergences of ``a`` and ``b``; see
    js_aligned_kernel. ``fixed``: the operands smoothed already, with their x ln x."""
    if out.ndim == 0 or out.size * per_item <= block_bytes:
        full = np.broadcast_shapes(np.shape(a), np.shape(b))
        terms = []  # (smoothed, its x ln x, whether it is this block's own scratch of the full shape)
        for name, x in (("a", a), ("b", b)):
            if name in fixed:
                terms.append((*fixed[name], False))
            else:
                s = _smooth(x, mask, eps)
                terms.append((s, _xlogx(s), s.shape == full))
        # The terms are symmetric in (p, q) bit for bit: the operand that may be overwritten goes first.
        (p, fp, scratch), (q, fq, _) = sorted(terms, key=lambda t: not t[2])
        out[...] = np.broadcast_to(_js_terms_sum(p, q, fp, fq, overwrite=scratch), out.shape)
        return

    step = int(max(1, block_bytes // (int(np.prod(out.shape[1:], dtype=np.int64)) * per_item)))
    for i in range(0, out.shape[0], step):
        if step == 1:  # one item is over the block: into the next leading dim, this one indexed away
            def sub(x, i=i):
                return x[0, ...] if x.shape[0] == 1 else x[i, ...]
            target = out[i, ...]  # a 0-d view, not a copied scalar, when out is 1-d
        else:
            def sub(x, i=i):
                return x if x.shape[0] == 1 else x[i:i + step]
            target = out[i:i + step]
        _js_aligned_into(target, sub(a), sub(b), mask, eps, block_bytes, per_item,
                         {k: (sub(s), sub(f)) for k, (s, f) in fixed.items()})


def _pair_terms_sum(pq, fq, iu, ju, by_probe=False):
    """The JS terms of :func:`_js_terms_sum` between heads ``iu`` and ``ju``, summed over
    (probe, query, key), with as few full-size temporaries; ``by_probe``: also over (query,
    key) alone, a second sum of the same terms, so the first keeps its bits."""
    m = np.take(pq, iu, axis=1)
    m += np.take(pq, ju, axis=1)
    m *= 0.5  # m = (p + q) / 2
    f = np.take(fq, iu, axis=1)
    f += np.take(fq, ju, axis=1)
    f *= 0.5  # (f(p) + f(q)) / 2
    fm = _xlogx(m)
    f -= fm
    if by_probe:
        return f.sum(axis=(-3, -2, -1)), f.sum(axis=(-2, -1))
    return f.sum(axis=(-3, -2, -1))


def js_pairwise_kernel(a, mask, eps, block_bytes, by_probe=False):
    # a (..., L, H, P, Q, K) -> (..., L, H, L, H); by_probe: and the mean JS divergence (nats, not
    # its root) of each probe alone, (..., L, H, L, H, P), whose mean over probes is the square of the first
    *lead, n_layer, n_head, n_probe, n_query, n_key = a.shape
    n = n_layer * n_head
    flat = a.reshape(-1, n, n_probe, n_query, n_key)  # (S, N, P, Q, K)
    # Keys beyond the last visible one of a query block contribute exact zeros: skip them.
    any_visible = mask.any(-1)
    key_end = np.where(any_visible, n_key - np.argmax(mask[:, ::-1], axis=-1), 0)  # (Q,)
    # The pairwise tensor of m = (p + q)/2 has no einsum shortcut (ln of a sum), so it is
    # built for a block of queries at a time, sized to ``block_bytes`` for one snapshot.
    # The loop runs over memory blocks, not single queries: one pass when it fits. The
    # blocks depend on one snapshot's shape only, so every snapshot sums the same blocks in
    # the same order whatever the chunking (in memory, or one snapshot per dask chunk).
    per_query = max(1, n * n * n_probe * n_key * 8)
    q_block = int(max(1, min(n_query, block_bytes // per_query)))
    # The terms are symmetric in (p, q) bit for bit, so only pairs i < j are computed and
    # mirrored. A head against itself has every term f(p) - f(p) = +0.0 exactly ((p + p)/2 is
    # p), or NaN where p is (a missing head): the diagonal is set so, not computed (a fifth of
    # the pairs of 4 heads a layer, 2 layers).
    iu, ju = np.triu_indices(n, k=1)
    diag = np.arange(n)
    total = np.empty((flat.shape[0], n, n))
    per_probe = np.empty((flat.shape[0], n, n, n_probe)) if by_probe else None
    # As many snapshots at a time as fit in block_bytes (at least one): p and f(p), and the
    # pairwise block, stay a few block_bytes even for a whole run held in memory.
    per_snapshot = max(2 * n * n_probe * n_query * n_key * 8, n * n * n_probe * q_block * n_key * 8)
    s_step = int(max(1, block_bytes // per_snapshot))
    for s0 in range(0, flat.shape[0], s_step):
        sl = slice(s0, s0 + s_step)
        p = _smooth(flat[sl], mask, eps)  # (s, N, P, Q, K)
        fp = _xlogx(p)
        pairs = np.zeros((p.shape[0], iu.size))
        pairs_p = np.zeros((p.shape[0], iu.size, n_probe)) if by_probe else None
        for q0 in range(0, n_query, q_block):
            q1 = min(n_query, q0 + q_block)
            k1 = int(key_end[q0:q1].max())
            if k1 == 0:
                continue
            sums = _pair_terms_sum(p[..., q0:q1, :k1], fp[..., q0:q1, :k1], iu, ju, by_probe)
            if by_probe:
                pairs += sums[0]  # (s, pairs)
                pairs_p += sums[1]  # (s, pairs, P)
            else:
                pairs += sums  # (s, pairs)
        total[sl, iu, ju] = pairs
        total[sl, ju, iu] = pairs
        missing = np.isnan(p).any(axis=(-2, -1))  # (s, N, P)
        total[sl, diag, diag] = np.where(missing.any(-1), np.nan, 0.0)  # (s, N)
        if by_probe:
            per_probe[sl, iu, ju] = pairs_p
            per_probe[sl, ju, iu] = pairs_p
            per_probe[sl, diag, diag] = np.where(missing, np.nan, 0.0)  # (s, N, P)
    js = 0.5 * (total + total.swapaxes(-1, -2)) / (n_probe * n_query)
    dist = np.sqrt(np.clip(js, 0.0, None)).reshape(*lead, n_layer, n_head, n_layer, n_head)
    if not by_probe:
        return dist
    js_p = np.clip(0.5 * (per_probe + per_probe.swapaxes(1, 2)) / n_query, 0.0, None)
    return dist, js_p.reshape(*lead, n_layer, n_head, n_layer, n_head, n_probe)
