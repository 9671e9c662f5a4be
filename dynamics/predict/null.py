"""The null check's permutations: which runs may trade final roles (they label the same heads),
the draws that send each run's roles to a run of another seed, and the folds over the runs kept.
`dynamics.predict.curve` fits the curve on each permutation (``PredictOptions.null``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr


def same_head_blocks(rows: xr.Dataset) -> list[np.ndarray]:
    """Rows of the runs that label the same heads, as one (runs, heads) index array per such set
    of two or more runs, each run's rows in (layer, head) order: what the null check permutes."""
    run, layer, head = (rows[k].values for k in ("row_run", "row_layer", "row_head"))
    by_heads: dict[tuple, list[np.ndarray]] = {}
    for r in dict.fromkeys(run.tolist()):
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
    derangement's null fired 8 times in 40, this one's 0). Uniform over such permutations, drawn
    by rejection, where that takes few draws (distinct classes: a `derangement`); otherwise the
    indices, grouped by class, each sent the largest class's size along, then mixed by random
    swaps that keep every index off its class.
    """
    labels = _class_labels(classes)
    if not _can_cross(labels):
        return None
    n, largest = labels.size, int(np.bincount(labels).max())
    if largest == 1:
        return derangement(n, rng)
    for _ in range(100):
        order = rng.permutation(n)
        if (labels[order] != labels).all():
            return order
    at = rng.permutation(n)
    at = at[np.argsort(labels[at], kind="stable")]  # each class contiguous, in a random order within
    order = np.empty(n, dtype=np.int64)
    order[at] = at[(np.arange(n) + largest) % n]  # k and k + largest are never in one class's block
    for _ in range(20 * n):
        i, j = rng.integers(n, size=2)
        if labels[order[j]] != labels[i] and labels[order[i]] != labels[j]:
            order[i], order[j] = order[j], order[i]
    return order


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
