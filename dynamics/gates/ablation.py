"""Head ablations: held-out NLL per component with head sets zero- or mean-ablated, single heads
and sets of heads; and the gradient head importance of Michel et al. 2019."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr
from torch import Tensor

from dynamics.config import ConfigError, RunConfig
from dynamics.gates._engine import _batches, _device, _score, entry
from dynamics.gates.maths import component_weights, layer_normalised
from dynamics.gates.options import HELDOUT_STEP, GateOptions, gate_options
from dynamics.model import Transformer
from dynamics.schema import COMPONENT, HEAD, LAYER

# ----------------------------------------------------------------------------- ablations


def _masks(fn: str, ablate, L: int, H: int) -> np.ndarray:
    """``ablate`` as bool (N, L, H), N >= 1; ConfigError naming it otherwise (a flat or wrong-width
    mask failed inside the model's forward, naming its ``head_gates``)."""
    given = np.asarray(ablate)
    # G- values or a NaN mask cast to bool as "remove every head": only True/False (or 0/1) are masks
    if given.dtype != bool and given.size and not np.isin(given, (0, 1)).all():  # empty: a shape to name
        raise ConfigError(f"{fn}: ablate must be a bool array (True where a head is removed), got {given.dtype} "
                          f"values other than 0 and 1 (threshold gate values first, e.g. gates < 0.5)")
    masks = given.astype(bool)
    masks = masks[None] if masks.ndim == 2 else masks  # (N, L, H)
    if masks.ndim != 3 or masks.shape[1:] != (L, H) or masks.shape[0] < 1:
        raise ConfigError(f"{fn}: ablate must be a bool array of shape (layer, head) = ({L}, {H}) or (set, layer, "
                          f"head) for this model, got shape {np.shape(ablate)}")
    return masks


@torch.no_grad()
def _mean_z(model: Transformer, tokens: Tensor) -> list[Tensor]:
    """Per layer, each head's z averaged over the reference rows at each position: (T, H, dh)."""
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]
    sums = [None] * len(names)
    for batch in tokens:  # (B, T + 1)
        _, cache = model.run_with_cache(batch[:, :-1], names)
        for i, name in enumerate(names):
            z = cache[name].sum(0)  # (T, H, dh)
            sums[i] = z if sums[i] is None else sums[i] + z
    rows = tokens.shape[0] * tokens.shape[1]
    return [s / rows for s in sums]


@entry
def ablation_losses(
    model: Transformer, cfg: RunConfig, ablate: np.ndarray, method: str = "zero", options: GateOptions | None = None
) -> xr.DataArray:
    """Held-out NLL per task component with head sets removed.

    Parameters
    ----------
    model : Transformer
    cfg : RunConfig
    ablate : bool array, shape (N, L, H) or (L, H)
        True where a head is removed; one set per leading index.
    method : {"zero", "mean"}
        zero: the head's z times 0 (``head_gates``); mean: z replaced by its mean over the
        reference rows (all components' held-out batches pooled) at each position, through
        ``blocks.{l}.attn.hook_z``. Mean-ablation keeps what a head writes regardless of the
        input (e.g. a sink's constant output) and removes only the input-dependent part.
    options : GateOptions, optional
        ``eval_batches`` x ``batch_size`` held-out rows per component.

    Returns
    -------
    xarray.DataArray, dims (set, component)
        Mean next-token NLL.

    Example
    -------
    >>> ablation_losses(model, cfg, np.zeros((1, 2, 4), bool)).sel(set=0)  # doctest: +SKIP
    """
    if method not in ("zero", "mean"):
        raise ConfigError(f"ablation method: expected zero or mean, got {method!r}")
    opts = gate_options(options)
    device = _device(model)
    masks = _masks("ablation_losses", ablate, cfg.model.n_layers, cfg.model.n_heads)  # (N, L, H)
    keep = torch.from_numpy(~masks).float().to(device)  # (N, L, H)
    names = cfg.task.component_names
    data = [_batches(cfg, HELDOUT_STEP, opts.eval_batches, opts.batch_size, device, n) for n in names]
    hooks = None
    if method == "mean":
        means = _mean_z(model, torch.cat(data))  # per layer (T, H, dh)

        def hooks(g: Tensor, rows: int):
            def substitute(layer: int):
                m = g[:, layer].repeat_interleave(rows, dim=0)[:, None, :, None]  # (S * B, 1, H, 1)
                return lambda z, name: z * m + means[layer] * (1 - m)  # (S * B, T, H, dh)

            return [(f"blocks.{layer}.attn.hook_z", substitute(layer)) for layer in range(model.cfg.n_layers)]

    loss = torch.stack([_score(model, d, keep, hooks) for d in data], dim=-1)  # (N, C)
    return xr.DataArray(loss.cpu().numpy().astype(np.float32), dims=("set", COMPONENT),
                        coords={COMPONENT: list(names)}, name="loss", attrs={"method": method})


def head_ablation(
    model: Transformer, cfg: RunConfig, method: str = "zero", options: GateOptions | None = None
) -> xr.DataArray:
    """Delta held-out NLL when each single head is removed, per task component.

    ``delta[l, h, c] = NLL_c(model without head (l, h)) - NLL_c(model)`` (Michel, Levy, Neubig
    2019, single-head ablation). Zero for a head that writes nothing (W_O = 0) under either method.

    Returns
    -------
    xarray.DataArray, dims (layer, head, component)
        Named ``delta_loss``; attrs ``method`` and ``loss_full`` (per component).

    Example
    -------
    >>> head_ablation(model, cfg, "mean").sel(component="induction")  # doctest: +SKIP
    """
    L, H = cfg.model.n_layers, cfg.model.n_heads
    masks = np.zeros((1 + L * H, L, H), dtype=bool)
    i = np.arange(L * H)
    masks[1 + i, i // H, i % H] = True  # set 0 keeps every head; set 1 + i removes head i (flat order)
    loss = ablation_losses(model, cfg, masks, method, options).values  # (1 + L*H, C)
    delta = (loss[1:] - loss[0]).reshape(L, H, -1)
    return xr.DataArray(delta, dims=(LAYER, HEAD, COMPONENT), name="delta_loss",
                        coords={LAYER: np.arange(L), HEAD: np.arange(H), COMPONENT: list(cfg.task.component_names)},
                        attrs={"method": method, "loss_full": loss[0].tolist()})


def set_ablation(
    model: Transformer, cfg: RunConfig, ablate: np.ndarray, method: str = "zero", options: GateOptions | None = None
) -> xr.DataArray:
    """Delta held-out NLL per component for head sets (bool (N, L, H) or (L, H)); dims (set, component)."""
    masks = _masks("set_ablation", ablate, cfg.model.n_layers, cfg.model.n_heads)  # (N, L, H)
    loss = ablation_losses(model, cfg, np.concatenate([np.zeros_like(masks[:1]), masks]), method, options)
    return (loss[1:] - loss[0].values).rename("delta_loss").assign_attrs(method=method)


@entry
def head_importance(model: Transformer, cfg: RunConfig, options: GateOptions | None = None) -> xr.DataArray:
    """Head importance ``I_h = E_x |dL(x) / d xi_h|``, l2-normalised within each layer.

    Michel, Levy, Neubig 2019 ("Are Sixteen Heads Really Better than One?"): a gate xi_h held
    at 1 on each head's output, the absolute derivative of each sequence's mean next-token NLL
    with respect to it, averaged over sequences (per component over its held-out batches, then
    mixture-weighted), and divided by its l2 norm over the heads of its layer, as the paper
    does before ranking heads across layers. Per-sequence gradients come from one backward: a
    gate set per row, so row b's loss is the only one that depends on ``gates[b]``.

    Returns
    -------
    xarray.DataArray, dims (layer, head)
        Named ``importance``; attr ``raw`` (layer, head) the unnormalised E_x |dL/dxi| as a list.

    Example
    -------
    >>> head_importance(model, cfg).sel(layer=0)  # doctest: +SKIP
    """
    opts = gate_options(options)
    device = _device(model)
    L, H = cfg.model.n_layers, cfg.model.n_heads
    per_component = []
    with torch.enable_grad():
        for name in cfg.task.component_names:
            total = torch.zeros(L, H, device=device)
            data = _batches(cfg, HELDOUT_STEP, opts.eval_batches, opts.batch_size, device, name)  # (n, B, T + 1)
            for batch in data:  # (B, T + 1)
                gates = torch.ones(batch.shape[0], L, H, device=device, requires_grad=True)  # (B, L, H)
                logits = model(batch[:, :-1], head_gates=gates)  # (B, T, V)
                nll = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none").mean(1)  # (B,)
                (grad,) = torch.autograd.grad(nll.sum(), [gates])  # (B, L, H): row b is dL(x_b)/dxi
                total += grad.abs().sum(0)
            per_component.append(total / (data.shape[0] * data.shape[1]))
    raw = (torch.stack(per_component, -1).cpu().double().numpy() @ component_weights(cfg))  # (L, H)
    return xr.DataArray(layer_normalised(raw).astype(np.float32), dims=(LAYER, HEAD), name="importance",
                        coords={LAYER: np.arange(L), HEAD: np.arange(H)},
                        attrs={"method": "Michel, Levy, Neubig 2019", "raw": raw.tolist()})
