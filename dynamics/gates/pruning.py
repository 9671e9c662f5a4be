"""Pruning: the CHG order of heads, least needed first, and held-out loss against heads removed."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynamics.config import ConfigError, RunConfig
from dynamics.gates.ablation import ablation_losses, head_importance
from dynamics.gates.maths import component_weights
from dynamics.gates.options import PRUNE_ORDERS, GateOptions, gate_options
from dynamics.model import Transformer


def pruning_order(plus: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """Flat head indices, least-needed first, by CHG: G- ascending, ties by G+ ascending.

    A head that stays shut under -lambda (low G-) is one the model does without; among
    those, a low G+ (interfering) is removed before a high one (irrelevant). The most
    facilitating heads (highest G-) go last.
    """
    return np.lexsort((np.asarray(plus).ravel(), np.asarray(minus).ravel()))


def _reduce_hint(name: str, values, ndim: int) -> str:
    if isinstance(values, xr.DataArray) and {"layer", "head"} <= set(values.dims):
        extra = [d for d in values.dims if d not in ("layer", "head")]
        if "fit" in extra:  # G+ and G- side by side: a mean over them is neither
            fit = "plus" if name == "plus" else "minus"
            return f" (pick one fit first, .sel(fit={fit!r})" + (", then reduce over restart)" if "restart" in extra else ")")
        if "component" in extra:
            return " (reduce over component first, weighted by gates.component_weights(cfg))"
        if extra:  # name the dims it has, not the one a caller might have
            return f" (reduce over {', '.join(map(str, extra))} first, e.g. .mean({str(extra[0])!r}))"
    if ndim == 3:
        return (" (reduce over the extra dimension first: fit_chg's restarts by a mean, head_ablation's "
                "components weighted by gates.component_weights(cfg))")
    return ""


def per_head(name: str, values, L: int, H: int) -> np.ndarray:
    """``values`` as an (L, H) array, layer-major; ValueError naming ``name`` otherwise.

    A DataArray is put in (layer, head) order by its dim names first: flattened as given, a
    (head, layer) one gave another pruning order without a word, and a (layer, head, component)
    one an IndexError deep inside.
    """
    if isinstance(values, xr.DataArray) and {"layer", "head"} <= set(values.dims):
        values = values.transpose("layer", "head", ...)
        # and by label: after a sortby or an isel the positions are not the heads, and read by
        # position the ablation masks went to other heads than the values' own, without a word
        for dim, n in (("layer", L), ("head", H)):
            if dim in values.coords:
                labels = np.asarray(values[dim].values)
                if labels.shape != (n,) or sorted(labels.tolist()) != list(range(n)):
                    raise ValueError(f"pruning_curves: {name} must hold each {dim} 0..{n - 1} of this model once, "
                                     f"got {dim} labels {labels.tolist()}")
                values = values.sortby(dim)
    out = np.asarray(values, dtype=np.float64)
    if out.shape != (L, H):
        raise ValueError(f"pruning_curves: {name} must be one value per head, shape (layer, head) = ({L}, {H}) "
                         f"for this model, got shape {out.shape}" + _reduce_hint(name, values, out.ndim))
    return out


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
    """Held-out loss against the number of heads removed, in four orders.

    - ``chg``: :func:`pruning_order` (G- ascending, then G+): least needed first.
    - ``importance``: Michel et al. 2019's head importance ascending (:func:`head_importance`:
      E_x |dL(x)/dxi_h|, l2-normalised within each layer), least important first, as they prune.
    - ``ablation``: single-head ablation delta ascending (least costly to remove first).
    - ``random``: the mean over ``n_random`` seeded random orders.

    The loss is the mixture-weighted mean of the per-component held-out NLL. Heads are removed
    cumulatively: point j removes the first j heads of the order.

    Parameters
    ----------
    plus, minus : array or DataArray (L, H)
        G+ and G- (e.g. means over restarts). A DataArray is read by its ``layer`` and
        ``head`` dims, whatever their order.
    delta : array or DataArray (L, H)
        Single-head ablation delta (e.g. mixture-weighted over components).

    Returns
    -------
    xarray.Dataset
        ``loss`` (order, removed), ``random_loss`` (draw, removed), ``order_heads`` (order, rank)
        flat head indices (-1 for random), ``importance`` (layer, head) the normalised head
        importance that ordered ``importance``; coordinate ``fraction`` = removed / (L * H).
    """
    if n_random < 1:
        raise ConfigError(f"pruning_curves: n_random must be >= 1 (the random order is their mean), got {n_random}")
    opts = gate_options(options)
    L, H = cfg.model.n_layers, cfg.model.n_heads
    n = L * H
    plus, minus, delta = (per_head(name, x, L, H) for name, x in (("plus", plus), ("minus", minus), ("delta", delta)))
    rng = np.random.default_rng(np.random.SeedSequence([cfg.train.seed, opts.seed, 0x5052]))
    importance = head_importance(model, cfg, opts)  # (L, H)
    orders = [pruning_order(plus, minus), np.argsort(importance.values.ravel(), kind="stable"),
              np.argsort(np.asarray(delta).ravel(), kind="stable")]
    orders += [rng.permutation(n) for _ in range(n_random)]
    masks = np.zeros((len(orders), n + 1, n), dtype=bool)
    for i, order in enumerate(orders):
        for j in range(1, n + 1):
            masks[i, j, order[:j]] = True
    loss = ablation_losses(model, cfg, masks.reshape(-1, L, H), method, opts).values  # (orders * (n+1), C)
    total = (loss @ component_weights(cfg)).reshape(len(orders), n + 1)
    fixed = len(PRUNE_ORDERS) - 1  # every order but random
    curves = np.stack([*total[:fixed], total[fixed:].mean(0)])
    heads = np.full((len(PRUNE_ORDERS), n), -1)
    heads[:fixed] = orders[:fixed]
    removed = np.arange(n + 1)
    return xr.Dataset(
        {"loss": (("order", "removed"), curves.astype(np.float32)),
         "random_loss": (("draw", "removed"), total[fixed:].astype(np.float32)),
         "order_heads": (("order", "rank"), heads), "importance": importance.drop_attrs()},
        coords={"order": list(PRUNE_ORDERS), "removed": removed, "fraction": ("removed", removed / n)},
        attrs={"method": method, "n_random": n_random},
    )
