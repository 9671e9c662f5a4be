"""Pruning: the CHG order of heads, least needed first, and held-out loss against heads removed."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynamics.config import RunConfig
from dynamics.gates.ablation import ablation_losses
from dynamics.gates.maths import component_weights
from dynamics.gates.options import PRUNE_ORDERS, GateOptions
from dynamics.model import Transformer


def pruning_order(plus: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """Flat head indices, least-needed first, by CHG: G- ascending, ties by G+ ascending.

    A head that stays shut under -lambda (low G-) is one the model does without; among
    those, a low G+ (interfering) is removed before a high one (irrelevant). The most
    facilitating heads (highest G-) go last.
    """
    return np.lexsort((np.asarray(plus).ravel(), np.asarray(minus).ravel()))


def pruning_curves(
    model: Transformer,
    cfg: RunConfig,
    plus: np.ndarray,
    minus: np.ndarray,
    delta: np.ndarray,
    *,
    n_random: int = 8,
    method: str = "zero",
    options: GateOptions | None = None,
) -> xr.Dataset:
    """Held-out loss against the number of heads removed, in three orders.

    - ``chg``: :func:`pruning_order` (G- ascending, then G+): least needed first.
    - ``importance``: single-head ablation delta ascending (least important first).
    - ``random``: the mean over ``n_random`` seeded random orders.

    The loss is the mixture-weighted mean of the per-component held-out NLL. Heads are removed
    cumulatively: point j removes the first j heads of the order.

    Parameters
    ----------
    plus, minus : array (L, H)
        G+ and G- (e.g. means over restarts).
    delta : array (L, H)
        Single-head ablation delta (e.g. mixture-weighted over components).

    Returns
    -------
    xarray.Dataset
        ``loss`` (order, removed), ``random_loss`` (draw, removed), ``order_heads`` (order, rank)
        flat head indices (-1 for random); coordinate ``fraction`` = removed / (L * H).
    """
    opts = options or GateOptions()
    L, H = cfg.model.n_layers, cfg.model.n_heads
    n = L * H
    rng = np.random.default_rng(np.random.SeedSequence([cfg.train.seed, opts.seed, 0x5052]))
    orders = [pruning_order(plus, minus), np.argsort(np.asarray(delta).ravel(), kind="stable")]
    orders += [rng.permutation(n) for _ in range(n_random)]
    masks = np.zeros((len(orders), n + 1, n), dtype=bool)
    for i, order in enumerate(orders):
        for j in range(1, n + 1):
            masks[i, j, order[:j]] = True
    loss = ablation_losses(model, cfg, masks.reshape(-1, L, H), method, opts).values  # (orders * (n+1), C)
    total = (loss @ component_weights(cfg)).reshape(len(orders), n + 1)
    curves = np.stack([total[0], total[1], total[2:].mean(0)])
    heads = np.full((3, n), -1)
    heads[0], heads[1] = orders[0], orders[1]
    removed = np.arange(n + 1)
    return xr.Dataset(
        {"loss": (("order", "removed"), curves.astype(np.float32)),
         "random_loss": (("draw", "removed"), total[2:].astype(np.float32)),
         "order_heads": (("order", "rank"), heads)},
        coords={"order": list(PRUNE_ORDERS), "removed": removed, "fraction": ("removed", removed / n)},
        attrs={"method": method, "n_random": n_random},
    )
