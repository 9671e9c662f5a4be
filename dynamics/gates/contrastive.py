"""Contrastive CHG: gates that keep one task component and lose another, and the
``--contrast`` argument that names them."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from dynamics.config import ConfigError, RunConfig
from dynamics.gates._engine import Progress, _batches, _device, _nll_per_set, _optimise, _score, entry, start_logits
from dynamics.gates.fit import _coords
from dynamics.gates.maths import contrastive_loss
from dynamics.gates.options import HELDOUT_STEP, RESTART, GateOptions, gate_options
from dynamics.model import Transformer
from dynamics.schema import HEAD, LAYER


def parse_contrast(text: str, cfg: RunConfig) -> tuple[str, str]:
    """``"retain=induction,forget=offset_copy"`` -> ("induction", "offset_copy"), checked against the run.

    Raises
    ------
    ConfigError
        Bad syntax, a missing side, an unknown component, or retain == forget (one line).
    """
    names = cfg.task.component_names
    sides: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in ("retain", "forget") or not value or key in sides:
            raise ConfigError(f"--contrast {text!r}: expected retain=COMPONENT,forget=COMPONENT")
        sides[key] = value
    if set(sides) != {"retain", "forget"}:
        raise ConfigError(f"--contrast {text!r}: expected retain=COMPONENT,forget=COMPONENT")
    for key in ("retain", "forget"):
        if sides[key] not in names:
            raise ConfigError(f"--contrast: unknown component {sides[key]!r} for {key} "
                              f"(this run's components: {', '.join(names)})")
    if sides["retain"] == sides["forget"]:
        raise ConfigError(f"--contrast: retain and forget are both {sides['retain']!r}")
    return sides["retain"], sides["forget"]


@entry
def fit_contrastive(
    model: Transformer,
    cfg: RunConfig,
    retain: str,
    forget: str,
    options: GateOptions | None = None,
    *,
    init_logits: Tensor | None = None,
    progress: Progress | None = None,
) -> xr.Dataset:
    """Contrastive CHG: gates that keep component ``retain`` and lose component ``forget``.

    Minimises ``-logp_r + clamp(logp_f - stopgrad(logp_r), min=-max_diff) - lambda *
    mean(clamp(logit, -4, 4))`` with lambda = +options.lam (Nam et al. 2025, arXiv
    2505.13737), each update on one retain and one forget batch (eval split). The heads left
    open (gate >= threshold) are the sub-circuit serving ``retain`` and not ``forget``.

    Returns
    -------
    xarray.Dataset
        ``contrast_gate`` (restart, layer, head); ``contrast_loss`` (restart, side, state):
        held-out NLL on retain / forget data with all gates 1 ("full"), the fitted gates
        ("gated"), and the binarised sub-circuit ("circuit"); ``contrast_settle`` (restart, layer,
        head) each gate's absolute change over the fit's last tenth of updates. Attrs ``retain``, ``forget``.
    """
    opts = gate_options(options)
    names = cfg.task.component_names
    for name in (retain, forget):
        if name not in names:
            raise ConfigError(f"unknown component {name!r} (components: {', '.join(names)})")
    if retain == forget:  # as parse_contrast refuses it: the objective would fight itself
        raise ConfigError(f"fit_contrastive: retain and forget are both {retain!r}")
    device = _device(model)
    logits0 = start_logits("fit_contrastive", cfg, opts, init_logits).to(device)
    k = logits0.shape[0]
    data_r = _batches(cfg, 0, opts.fit_batches, opts.batch_size, device, retain)  # (n, B, T + 1)
    data_f = _batches(cfg, 0, opts.fit_batches, opts.batch_size, device, forget)  # (n, B, T + 1)

    def objective(logits: Tensor, step: int) -> Tensor:
        i = step % len(data_r)
        nll = _nll_per_set(model, torch.cat([data_r[i], data_f[i]]), logits.sigmoid(), groups=2)  # (S, 2)
        return contrastive_loss(-nll[:, 0], -nll[:, 1], logits, opts.lam, opts.max_diff, opts.clamp)

    stage = None if progress is None else (lambda done, total: progress("contrastive", done, total))
    logits, settle = _optimise(logits0, opts.steps, opts, objective, stage)  # (k, L, H) each
    gates = logits.sigmoid()  # (k, L, H)
    circuit = (gates >= opts.threshold).float()  # (k, L, H)
    sets = torch.cat([torch.ones_like(gates[:1]), gates, circuit])  # (1 + 2k, L, H)
    held = {n: _batches(cfg, HELDOUT_STEP, opts.eval_batches, opts.batch_size, device, n) for n in (retain, forget)}
    losses = []
    for name in (retain, forget):
        s = _score(model, held[name], sets)  # (1 + 2k,)
        losses.append(torch.stack([s[0].expand(k), s[1 : 1 + k], s[1 + k :]], dim=-1))  # (k, state)
    loss = torch.stack(losses, dim=1).cpu().numpy().astype(np.float32)  # (k, side, state)
    return xr.Dataset(
        {
            "contrast_gate": ((RESTART, LAYER, HEAD), gates.cpu().numpy().astype(np.float32)),
            "contrast_loss": ((RESTART, "side", "state"), loss),
            "contrast_settle": ((RESTART, LAYER, HEAD), settle.cpu().numpy().astype(np.float32)),
        },
        coords={**_coords(cfg, k), "side": ["retain", "forget"], "state": ["full", "gated", "circuit"]},
        attrs={"method": "contrastive causal head gating (Nam et al. 2025, arXiv 2505.13737)",
               "retain": retain, "forget": forget, "options": asdict(opts)},
    )
