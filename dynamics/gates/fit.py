"""Fitting causal head gating: lambda = 0, then G+ and G- (:func:`fit_chg`), and the recorder's
snapshot of it (:func:`chg_snapshot`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from dynamics.config import RunConfig
from dynamics.gates._engine import Progress, _batches, _device, _nll_per_set, _optimise, _score, entry, start_logits
from dynamics.gates.maths import chg_loss, chg_roles, label_agreement
from dynamics.gates.options import CHG_ROLES, RESTART, STAGES, GateOptions, gate_options
from dynamics.model import Transformer
from dynamics.schema import FIT, FITS, HEAD, LAYER

# ----------------------------------------------------------------------------- fits


def _coords(cfg: RunConfig, k: int) -> dict:
    return {RESTART: np.arange(k), LAYER: np.arange(cfg.model.n_layers), HEAD: np.arange(cfg.model.n_heads)}


def _stage(progress: Progress | None, stage: str):
    return None if progress is None else (lambda done, total: progress(stage, done, total))


@entry
def fit_chg(
    model: Transformer, cfg: RunConfig, options: GateOptions | None = None, *, init_logits: Tensor | None = None,
    progress: Progress | None = None,
) -> xr.Dataset:
    """Fit causal head gating: lambda = 0, then G+ (+lambda) and G- (-lambda) from its result.

    ``L(G) = NLL - lambda * mean(clamp(logit, -4, 4))`` on the run's task data (eval split,
    batches 0 .. fit_batches - 1, mixture rows as in training), model frozen (Nam et al. 2025,
    arXiv 2505.13737). ``restarts`` gate sets are fitted as one batch; G+ and G- of all of
    them form one batch of 2 * restarts sets, started from the lambda = 0 logits (clamped to
    [-clamp, clamp] when ``clamp_start``).

    Parameters
    ----------
    model : Transformer
        Frozen; its weights and ``.grad``s are left as they are.
    cfg : RunConfig
        The run's config (task data, seed).
    options : GateOptions, optional
    init_logits : Tensor or array, shape (k, L, H), optional
        Initial logits instead of the seeded U(init_low, init_high) draw (k overrides restarts).
    progress : callable, optional
        ``progress(stage, done, total)`` after each update; stages ``"lambda=0"`` and ``"G+/G-"``.

    Returns
    -------
    xarray.Dataset
        ``chg`` (restart, layer, head, fit) G+ / G-; ``chg_init`` (restart, layer, head) the
        lambda = 0 gates (the unfitted initial draw when ``init_steps`` is 0); ``chg_role``
        (restart, layer, head) int8 codes into CHG_ROLES; ``role`` (layer, head) majority code
        and ``agreement`` (layer, head) the fraction of restarts giving it; ``nll`` (restart,
        stage) mean NLL on the fit batches with each stage's gates; ``settle`` (restart, stage,
        layer, head) each gate's absolute change over its stage's last tenth of updates
        (:func:`~dynamics.gates._engine._optimise`), 0 for a stage of no updates. Attrs: ``nll_full`` (all
        gates 1), ``roles``, ``options``.

    Example
    -------
    >>> ds = fit_chg(model, cfg, GateOptions(steps=200, restarts=4))  # doctest: +SKIP
    >>> ds.chg.sel(fit="minus").mean("restart")  # doctest: +SKIP
    """
    opts = gate_options(options)
    device = _device(model)
    logits0 = start_logits("fit_chg", cfg, opts, init_logits).to(device)
    k = logits0.shape[0]
    data = _batches(cfg, 0, opts.fit_batches, opts.batch_size, device)  # (n, B, T + 1)

    def objective(lam: Tensor) -> Callable[[Tensor, int], Tensor]:
        def f(logits: Tensor, step: int) -> Tensor:
            nll = _nll_per_set(model, data[step % len(data)], logits.sigmoid())[:, 0]  # (S,)
            return chg_loss(nll, logits, lam, opts.clamp)

        return f

    zero = torch.zeros(k, device=device)
    init_steps = opts.steps if opts.init_steps is None else opts.init_steps
    init, settle0 = _optimise(logits0, init_steps, opts, objective(zero), _stage(progress, "lambda=0"))  # (k, L, H) each
    signs = torch.cat([torch.full((k,), opts.lam), torch.full((k,), -opts.lam)]).to(device)  # (2k,)
    start = init.clamp(-opts.clamp, opts.clamp) if opts.clamp_start else init  # (k, L, H)
    pm, settle_pm = _optimise(torch.cat([start, start]), opts.steps, opts, objective(signs),
                              _stage(progress, "G+/G-"))  # (2k, L, H) each
    gates = torch.cat([init, pm]).sigmoid()  # (3k, L, H): init, plus, minus
    nll = _score(model, data, gates).view(3, k).T  # (k, stage)
    nll_full = _score(model, data, torch.ones_like(gates[:1]))[0]

    g = gates.view(3, k, *gates.shape[1:]).cpu().numpy().astype(np.float32)  # (stage, k, L, H)
    settle = torch.cat([settle0, settle_pm]).view(3, k, *gates.shape[1:]).cpu().numpy().astype(np.float32)  # (stage, k, L, H)
    roles = chg_roles(g[1], g[2], opts.threshold)  # (k, L, H)
    majority, agreement = label_agreement(roles)
    dims3 = (RESTART, LAYER, HEAD)
    ds = xr.Dataset(
        {
            "chg": ((*dims3, FIT), np.stack([g[1], g[2]], axis=-1)),
            "chg_init": (dims3, g[0]),
            "chg_role": (dims3, roles),
            "role": ((LAYER, HEAD), majority),
            "agreement": ((LAYER, HEAD), agreement),
            "nll": ((RESTART, "stage"), nll.cpu().numpy().astype(np.float32)),
            "settle": ((RESTART, "stage", LAYER, HEAD), settle.transpose(1, 0, 2, 3)),
        },
        coords={**_coords(cfg, k), FIT: list(FITS), "stage": list(STAGES)},
        attrs={
            "method": "causal head gating (Nam et al. 2025, arXiv 2505.13737)",
            "roles": list(CHG_ROLES),
            "nll_full": float(nll_full),
            # NaN with no fitted head (a diverged model), without numpy's empty-slice warning
            "mean_agreement": float(np.nanmean(agreement)) if np.isfinite(agreement).any() else float("nan"),
            "options": asdict(opts),
        },
    )
    return ds


def chg_snapshot(
    model: Transformer, cfg: RunConfig, steps: int | None = None, options: GateOptions | None = None,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """CHG of the model as it is now, for the recorder: ``(chg (L, H, 2) float32, chg_role (L, H) int8)``.

    ``chg[..., 0]`` is G+ and ``chg[..., 1]`` G- (schema.FITS order); roles are codes into
    :data:`CHG_ROLES`. Deterministic given (cfg, options): the initial gates come from a
    numpy generator seeded by train.seed, the data are eval-split batches, and neither the
    torch RNG, the model's weights nor their ``.grad``s change, so training goes on exactly
    as without it. Safe to call under ``torch.no_grad``. With several restarts, G+/G- are
    their means and the role their majority.

    Parameters
    ----------
    model : Transformer
    cfg : RunConfig
    steps : int, optional
        Updates per stage; default ``cfg.record.chg_steps``.
    options : GateOptions, optional
        Default: one restart.
    progress : callable, optional
        As :func:`fit_chg`'s: training looks for a stop (a sweep's, by its progress callback)
        through it, since a fit takes seconds.

    Example
    -------
    >>> chg, role = chg_snapshot(model, cfg)  # doctest: +SKIP
    >>> chg.shape, role.dtype  # doctest: +SKIP
    ((2, 4, 2), dtype('int8'))
    """
    # `steps or ...` read steps=0 as "the default" (200 updates)
    opts = replace(options or GateOptions(restarts=1), steps=cfg.record.chg_steps if steps is None else steps)
    ds = fit_chg(model, cfg, opts, progress=progress)
    chg = ds.chg.mean(RESTART).transpose(LAYER, HEAD, FIT).values.astype(np.float32)
    role = ds.chg_role.values[0] if opts.restarts == 1 else ds.role.values
    return chg, role.astype(np.int8)
