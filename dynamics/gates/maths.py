"""Pure maths of CHG: the CHG and contrastive objectives, role labels, their agreement, mixture
weights, and the rank agreement of G- with single-head ablation."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dynamics.analysis.chg import chg_roles as chg_roles  # the taxonomy, torch-free: the report reads it too
from dynamics.analysis.chg import label_agreement as label_agreement
from dynamics.analysis.chg import tied_majority as tied_majority
from dynamics.config import RunConfig

# ----------------------------------------------------------------------------- pure maths


def chg_loss(nll: Tensor, logits: Tensor, lam: Tensor | float, clamp: float = 4.0) -> Tensor:
    """CHG objective per gate set: ``NLL - lambda * mean(clamp(logit, -c, c))``.

    Nam et al. 2025 (arXiv 2505.13737), eq. for L(G). lambda > 0 lowers the loss for open gates
    (G+), lambda < 0 for shut ones (G-); the regulariser's gradient is ``-lambda / (L * H)`` per
    logit in [-c, c] (torch's clamp passes the gradient at the bounds themselves, so G+ and G-
    can start from logits clamped to +-c) and 0 outside.

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


def component_weights(cfg: RunConfig) -> np.ndarray:
    """Mixture weights of ``cfg.task.component_names`` (normalised; 1.0 for a single task)."""
    names = cfg.task.component_names
    w = np.asarray(cfg.task.weights if cfg.task.name == "mixture" and cfg.task.weights else [1.0] * len(names))
    return w / w.sum()


def layer_normalised(importance: np.ndarray) -> np.ndarray:
    """Head importance (L, H) divided by its l2 norm over each layer's heads (Michel et al. 2019).

    A layer whose heads all have importance 0 stays 0 rather than 0/0.

    Example
    -------
    >>> layer_normalised(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6, 0.8], [0.0, 0.0]]
    """
    imp = np.asarray(importance, dtype=np.float64)
    norm = np.linalg.norm(imp, axis=-1, keepdims=True)  # (L, 1)
    return imp / np.where(norm > 0, norm, 1.0)


def _paired(minus, delta) -> tuple[np.ndarray, np.ndarray]:
    """G- and the ablation delta as two flat arrays, head for head: DataArrays matched by dim name
    (a (head, layer) delta beside a (layer, head) G- paired other heads: rho 0.80 for identical
    values), and one value per head on each side."""
    if hasattr(minus, "dims") and hasattr(delta, "dims") and set(minus.dims) == set(delta.dims):
        delta = delta.transpose(*minus.dims)
    a, b = np.asarray(minus, dtype=np.float64), np.asarray(delta, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"rank_agreement: G- has shape {a.shape} and the ablation delta {b.shape}; give each "
                         f"one value per head (a delta of several task components: weight or sum them first)")
    return a.ravel(), b.ravel()


def rank_agreement_undefined(minus: np.ndarray, delta: np.ndarray) -> str | None:
    """Why :func:`rank_agreement` of these heads is undefined (NaN), or None where it is defined."""
    a, b = _paired(minus, delta)
    if a.size < 3:
        # Two heads have ranks (1, 2) on either side, so rho is +-1 whatever the fits: a sign, not a correlation.
        return f"{a.size} head{'s' if a.size != 1 else ''}; a rank correlation needs 3 or more"
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return "G- or the ablation delta is not finite for some head"
    if np.ptp(a) == 0:
        return "G- is the same for every head"
    if np.ptp(b) == 0:
        return "the ablation delta is the same for every head"
    return None


def rank_agreement(minus: np.ndarray, delta: np.ndarray) -> float:
    """Spearman's rho between G- and the single-head ablation delta-loss over all heads.

    Both say how much the model needs a head; CHG's validation is that they rank heads alike
    (Nam et al. 2025, arXiv 2505.13737). NaN where :func:`rank_agreement_undefined` gives a
    reason: fewer than 3 heads, a non-finite value, or either side constant.
    """
    from scipy.stats import spearmanr

    if rank_agreement_undefined(minus, delta) is not None:
        return float("nan")
    a, b = _paired(minus, delta)
    return float(spearmanr(a, b).statistic)


def unsettled(gates: np.ndarray, settle: np.ndarray, threshold: float) -> np.ndarray:
    """Where a thresholded label may still change: ``|gate - threshold| <= settle`` (same shapes).

    ``settle`` is how far each gate moved over its fit's last updates. A gate that moved at
    least as far as it now sits from the threshold could cross it with as many updates
    again, so its high/low reading (and the CHG role built from it) is not yet settled. A
    heuristic, not a bound: Adam's steps shrink as a fit settles. A NaN gate or movement (a
    model whose loss is not finite) is never settled: its comparison is False either way.

    Example
    -------
    >>> unsettled(np.array([0.55, 0.9, 0.5, np.nan]), np.array([0.1, 0.1, 0.0, 0.0]), 0.5).tolist()
    [True, False, True, True]
    """
    return ~(np.abs(gates - threshold) > settle)
