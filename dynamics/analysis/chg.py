"""The causal-head-gating taxonomy (Nam, Conklin, Yang, Griffiths, Cohen, Leslie 2025, arXiv
2505.13737): a head's role from its gates fitted toward open (G+) and toward shut (G-), and the
majority role over restarts.

numpy only, so the report and the predictor read stored fits without torch; ``dynamics.gates``
fits the gates and re-exports these.
"""

from __future__ import annotations

import numpy as np

CHG_ROLES = ("facilitating", "irrelevant", "interfering", "inconsistent", "unfitted")
"""Role names by int8 code; code -1 (no fit) indexes the last entry, "unfitted"."""
FACILITATING, IRRELEVANT, INTERFERING, INCONSISTENT, UNFITTED = 0, 1, 2, 3, -1

RHO_CAUTION = 0.3
"""Below this Spearman rho between G- and the single-head ablation delta (a `dynamics gates` fit's
attr ``rho``), the labels do not rank heads as ablation does: `dynamics gates` and the report say so."""


def chg_roles(plus: np.ndarray, minus: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Role codes into :data:`CHG_ROLES` from G+ and G- (any matching shapes).

    facilitating (0): G+ >= t and G- >= t; irrelevant (1): G+ >= t, G- < t;
    interfering (2): both < t; inconsistent (3): G+ < t, G- >= t; unfitted (-1): either is NaN
    (Nam et al. 2025, arXiv 2505.13737, the causal taxonomy).

    Example
    -------
    >>> chg_roles(np.array([0.9, 0.9, 0.1, 0.1]), np.array([0.9, 0.1, 0.1, 0.9])).tolist()
    [0, 1, 2, 3]
    """
    plus, minus = np.asarray(plus, dtype=np.float64), np.asarray(minus, dtype=np.float64)
    if plus.shape != minus.shape:
        # numpy would broadcast a (heads,) G- against (restarts, heads) G+ into labels for
        # pairs that were never fitted together
        raise ValueError(f"chg_roles: plus has shape {plus.shape} but minus has {minus.shape}; "
                         "they must match head for head")
    hp, hm = plus >= threshold, minus >= threshold
    role = np.select([hp & hm, hp & ~hm, ~hp & ~hm], [FACILITATING, IRRELEVANT, INTERFERING], INCONSISTENT)
    role[np.isnan(plus) | np.isnan(minus)] = UNFITTED
    return role.astype(np.int8)


def label_agreement(roles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Majority role across restarts (axis 0) and the fraction of restarts that give it.

    Ties go to the lower code; unfitted restarts (-1) do not vote, and a head no restart
    fitted gets role -1 and agreement NaN.

    Example
    -------
    >>> maj, agree = label_agreement(np.array([[0, 1], [0, 2], [1, 2]]))
    >>> maj.tolist(), [round(float(a), 2) for a in agree]
    ([0, 2], [0.67, 0.67])
    """
    roles = np.asarray(roles)
    counts = np.stack([(roles == code).sum(0) for code in range(len(CHG_ROLES) - 1)])  # (4, ...)
    fitted = counts.sum(0)
    majority = np.where(fitted > 0, counts.argmax(0), UNFITTED).astype(np.int8)
    with np.errstate(invalid="ignore", divide="ignore"):
        agreement = np.where(fitted > 0, counts.max(0) / fitted, np.nan)
    return majority, agreement.astype(np.float32)


def tied_majority(roles: np.ndarray) -> np.ndarray:
    """Where the majority of :func:`label_agreement` is a tie: two or more roles share the top
    count over restarts (axis 0), so its label is the lower code, not a majority.

    Example
    -------
    >>> tied_majority(np.array([[0, 1], [1, 2], [2, 2]])).tolist()
    [True, False]
    """
    roles = np.asarray(roles)
    counts = np.stack([(roles == code).sum(0) for code in range(len(CHG_ROLES) - 1)])  # (4, ...)
    top = counts.max(0)
    return (top > 0) & ((counts == top).sum(0) > 1)
