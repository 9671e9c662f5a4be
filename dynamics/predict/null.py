"""The null check's permutations: which runs may trade final roles (they label the same heads),
the draws that send each run's roles to a run of another seed, and the folds over the runs kept.
`dynamics.predict.curve` fits the curve on each permutation (``PredictOptions.null``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr


def same_head_blocks(rows: xr.Dataset) -> list[np.ndarray]:
    """Rows of the runs that label the same heads, as one (runs, heads) index array per such set
    of two or more runs, each run's rows in (layer, head) order: what the null check permutes.

    The sets, and the runs in each, are in run-id order, not the rows' order: the draws go to
    them in turn, so a store listing the same runs in another order (its sweep index, then its
    groups) had other permutations, and counted 0 of 20 where the same runs in another order
    counted 2."""
    run, layer, head = (rows[k].values for k in ("row_run", "row_layer", "row_head"))
    by_heads: dict[tuple, list[np.ndarray]] = {}
    for r in sorted(set(run.tolist())):
        idx = np.flatnonzero(run == r)
        idx = idx[np.lexsort((head[idx], layer[idx]))]
        by_heads.setdefault(tuple(zip(layer[idx].tolist(), head[idx].tolist(), strict=True)), []).append(idx)
    return [np.stack(group) for group in by_heads.values() if len(group) > 1]


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation of ``range(n)`` that moves every index (n >= 2), uniform over all such.

    Drawn by rejection from plain shuffles: about e of them per draw, since the share of
    permutations with no fixed point tends to 1/e. A plain shuffle left a run its own targets
    with probability 1 - 1/e per block (one run of a block of 2 in every second permutation), and
    with them its own signal, in the null.
    """
    if n < 2:
        raise ValueError(f"no derangement of {n} item(s)")
    while True:
        order = rng.permutation(n)
        if (order != np.arange(n)).all():
            return order


def derangement_across(classes: Sequence, rng: np.random.Generator) -> np.ndarray | None:
    """A permutation sending every index to one of another class, or None where none exists (a
    class holding more than half of them).

    The null check's classes are seeds: runs of one seed share their initial weights and data
    order whatever else differs, so a run given its same-seed twin's final roles keeps much of its
    own signal (on 4 configs x 3 seeds whose heads' fates were set by the seed, a plain
    derangement's null fired 8 times in 40, this one's 0). Uniform over such permutations: the
    first that crosses of up to `REJECTION_DRAWS` plain shuffles, drawn in batches (distinct
    classes: a `derangement`). On 4 configs x 3 seeds about 1 shuffle in 100 crosses, and the
    100 tries this took before failed in a third of the draws. Where crossing shuffles are rarer
    still (10 configs x 3 seeds: 1 in 145,000, by exact count), a chain:
    from a crossing start (the indices, grouped by class, each sent the largest class's size
    along), `MIXING_MOVES` x n moves, each a random transposition or 3-cycle of images kept where
    every index stays off its class. Its proposals are symmetric, so it tends to the uniform;
    the 3-cycles are what let it leave a cyclic flow (seed 0's runs all sent to seed 1's, 1's to
    2's, 2's to 0's), which swaps alone can never change: the fallback before them, swaps only,
    sent seed 0's runs to seed 1's every time it was taken, and, taken in a third of the draws,
    twice as often overall as to seed 2's (chi-squared 6907 on 84 df over 4000 draws).
    """
    labels = _class_labels(classes)
    if not _can_cross(labels):
        return None
    n, largest = labels.size, int(np.bincount(labels).max())
    if largest == 1:
        return derangement(n, rng)
    base = np.broadcast_to(np.arange(n), (REJECTION_BATCH, n))
    for _ in range(REJECTION_DRAWS // REJECTION_BATCH):
        draws = rng.permuted(base, axis=1)  # (batch, n) plain shuffles
        crosses = (labels[draws] != labels).all(axis=1)
        if crosses.any():  # the first that crosses of iid uniform draws: uniform over those that cross
            return draws[int(np.argmax(crosses))].astype(np.int64)
    at = rng.permutation(n)
    at = at[np.argsort(labels[at], kind="stable")]  # each class contiguous, in a random order within
    order = np.empty(n, dtype=np.int64)
    order[at] = at[(np.arange(n) + largest) % n]  # k and k + largest are never in one class's block
    picks = rng.integers(n, size=(MIXING_MOVES * n, 3))
    threes = rng.random(MIXING_MOVES * n) < 0.5
    for (i, j, k), three in zip(picks.tolist(), threes.tolist(), strict=True):
        if three:  # i takes j's image, j takes k's, k takes i's
            if len({i, j, k}) == 3 and labels[order[j]] != labels[i] and labels[order[k]] != labels[j] \
                    and labels[order[i]] != labels[k]:
                order[i], order[j], order[k] = order[j], order[k], order[i]
        elif labels[order[j]] != labels[i] and labels[order[i]] != labels[j]:
            order[i], order[j] = order[j], order[i]
    return order


REJECTION_BATCH = 512
REJECTION_DRAWS = 8 * REJECTION_BATCH
"""Plain shuffles `derangement_across` tries before its chain: under a millisecond of numpy."""
MIXING_MOVES = 200
"""Moves of the chain per index (a 3-cycle is uniform among the n (n-1) (n-2) ordered triples)."""


def _class_labels(classes: Sequence) -> np.ndarray:
    """Integer labels of `classes`; None is a class unknown, of its own."""
    tokens = [f"\0{i}" if c is None else str(c) for i, c in enumerate(classes)]
    return np.unique(np.asarray(tokens, dtype=str), return_inverse=True)[1]


def _can_cross(labels: np.ndarray) -> bool:
    """Whether a permutation can send every index to another class: none holds more than half."""
    return labels.size >= 2 and 2 * int(np.bincount(labels).max()) <= labels.size


def null_folds(blocks: list[np.ndarray], splits, n_rows: int) -> tuple[np.ndarray, list]:
    """The rows the null check fits (those of `blocks`), and the folds over them.

    A run that labels heads no other run labels has no one to trade targets with: kept, its rows
    would carry their real targets, and their signal, into every null curve, so they are left out.
    Folds keep their membership, renumbered into the kept rows; a fold left with no test or no
    training row is dropped.
    """
    keep = np.sort(np.concatenate([b.ravel() for b in blocks]))
    index = np.full(n_rows, -1)
    index[keep] = np.arange(keep.size)
    folds = [(index[train][index[train] >= 0], index[test][index[test] >= 0]) for train, test in splits]
    return keep, [(train, test) for train, test in folds if train.size and test.size]
