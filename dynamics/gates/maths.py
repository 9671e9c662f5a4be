"""Pure maths of CHG: the CHG and contrastive objectives, role labels, their agreement, mixture
weights, and the rank agreement of G- with single-head ablation."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dynamics.config import RunConfig
from dynamics.gates.options import CHG_ROLES, FACILITATING, INCONSISTENT, INTERFERING, IRRELEVANT, UNFITTED

# ----------------------------------------------------------------------------- pure maths


def chg_loss(nll: Tensor, logits: Tensor, lam: Tensor | float, clamp: float = 4.0) -> Tensor:
    """CHG objective per gate set: ``NLL - lambda * mean(clamp(logit, -c, c))``.

    Nam et al. 2025 (arXiv 2505.13737), eq. for L(G). lambda > 0 lowers the loss for open gates
    (G+), lambda < 0 for shut ones (G-); the regulariser's gradient is ``-lambda / (L * H)`` per
    logit inside (-c, c) and 0 outside.

    Parameters
    ----------
    nll : Tensor, shape (S,)
        Mean next-token NLL of each gate set.
    logits : Tensor, shape (S, L, H)
        Gate logits.
    lam : float or Tensor of shape (S,)
        Signed lambda per set.
    clamp : float
        c.

    Returns
    -------
    Tensor, shape (S,)

    Example
    -------
    >>> chg_loss(torch.tensor([1.0]), torch.tensor([[[-9.0, 0.0, 2.0, 9.0]]]), 0.1)
    tensor([0.9500])
    """
    reg = logits.clamp(-clamp, clamp).flatten(1).mean(1)  # (S,)
    return nll - torch.as_tensor(lam, dtype=nll.dtype, device=nll.device) * reg


def contrastive_loss(
    logp_retain: Tensor, logp_forget: Tensor, logits: Tensor, lam: float, max_diff: float = 5.0, clamp: float = 4.0
) -> Tensor:
    """Contrastive CHG objective per gate set.

    ``-logp_r + clamp(logp_f - stopgrad(logp_r), min=-max_diff) - lambda * mean(clamp(logit, -c, c))``
    (Nam et al. 2025, arXiv 2505.13737, contrastive CHG). The stop-gradient makes the forget term
    push logp_f down without pulling logp_r up; the clamp stops it once logp_f is max_diff nats
    per token below logp_r.

    Parameters
    ----------
    logp_retain, logp_forget : Tensor, shape (S,)
        Mean per-token log-probability on retain and forget data.
    logits : Tensor, shape (S, L, H)
    lam, max_diff, clamp : float

    Returns
    -------
    Tensor, shape (S,)

    Example
    -------
    >>> z = torch.zeros(1, 1, 2)
    >>> contrastive_loss(torch.tensor([-1.0]), torch.tensor([-9.0]), z, 0.1)
    tensor([-4.])
    """
    forget = (logp_forget - logp_retain.detach()).clamp(min=-max_diff)  # (S,)
    return -logp_retain + forget - lam * logits.clamp(-clamp, clamp).flatten(1).mean(1)


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
    >>> maj.tolist(), agree.round(2).tolist()
    ([0, 2], [0.67, 0.67])
    """
    roles = np.asarray(roles)
    counts = np.stack([(roles == code).sum(0) for code in range(len(CHG_ROLES) - 1)])  # (4, ...)
    fitted = counts.sum(0)
    majority = np.where(fitted > 0, counts.argmax(0), UNFITTED).astype(np.int8)
    with np.errstate(invalid="ignore", divide="ignore"):
        agreement = np.where(fitted > 0, counts.max(0) / fitted, np.nan)
    return majority, agreement.astype(np.float32)


def component_weights(cfg: RunConfig) -> np.ndarray:
    """Mixture weights of ``cfg.task.component_names`` (normalised; 1.0 for a single task)."""
    names = cfg.task.component_names
    w = np.asarray(cfg.task.weights if cfg.task.name == "mixture" and cfg.task.weights else [1.0] * len(names))
    return w / w.sum()


def rank_agreement(minus: np.ndarray, delta: np.ndarray) -> float:
    """Spearman's rho between G- and the single-head ablation delta-loss over all heads.

    Both say how much the model needs a head; CHG's validation is that they rank heads alike
    (Nam et al. 2025, arXiv 2505.13737). NaN when either is constant.
    """
    from scipy.stats import spearmanr

    a, b = np.asarray(minus, dtype=np.float64).ravel(), np.asarray(delta, dtype=np.float64).ravel()
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)
