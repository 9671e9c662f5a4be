"""The ``dynamics gates`` report: CHG fit, ablation and contrastive fit in one dataset, as a table
and summary lines."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynamics.analysis.chg import RHO_CAUTION, chg_roles
from dynamics.config import ConfigError, RunConfig
from dynamics.gates._engine import Progress, settle_window
from dynamics.gates.ablation import head_ablation
from dynamics.gates.contrastive import fit_contrastive
from dynamics.gates.fit import fit_chg
from dynamics.gates.maths import component_weights, rank_agreement, rank_agreement_undefined, tied_majority, unsettled
from dynamics.gates.options import CHG_ROLES, RESTART, GateOptions, gate_options
from dynamics.interventions.common import forward_changes
from dynamics.model import Transformer
from dynamics.schema import COMPONENT, HEAD, LAYER

# ----------------------------------------------------------------------------- report


def check_fittable(cfg: RunConfig) -> None:
    """ConfigError for a run whose forward pass is not its checkpoint's weights alone.

    Hard templates and conditioned gates act through hooks outside the weights: gates fitted
    to the loaded model would describe another network than the one trained.
    """
    changed = forward_changes(cfg.intervene)
    if changed:
        raise ConfigError(f"gates: the run was trained with {' and '.join(changed)} (intervene), which change its "
                          "forward pass outside the checkpoint's weights; gates fitted to the bare model would "
                          "describe another network")


def gate_report(
    model: Transformer,
    cfg: RunConfig,
    options: GateOptions | None = None,
    *,
    contrast: tuple[str, str] | None = None,
    method: str = "zero",
    progress: Progress | None = None,
) -> xr.Dataset:
    """CHG fit, single-head ablation and (optionally) a contrastive fit, in one dataset.

    Returns the :func:`fit_chg` variables plus ``delta_loss`` (layer, head, component) and, with
    ``contrast=(retain, forget)``, the :func:`fit_contrastive` variables. Attr ``rho``:
    Spearman's rho between mean G- and the mixture-weighted delta (:func:`rank_agreement`);
    NaN where it is undefined, with the reason in attr ``rho_undefined`` ("" where defined).
    ``progress(stage, done, total)`` is called through the fits (their stages) and around the
    ablations (stage ``"ablation"``, 0 then 1 of 1).

    Raises
    ------
    ConfigError
        For a run trained with hard templates or conditioned gates: their hooks are not part
        of ``model``, so gates fitted to it would describe another network than the one trained.
    """
    check_fittable(cfg)
    opts = gate_options(options)
    ds = fit_chg(model, cfg, opts, progress=progress)
    if progress is not None:
        progress("ablation", 0, 1)
    delta = head_ablation(model, cfg, method, opts)
    if progress is not None:
        progress("ablation", 1, 1)
    ds["delta_loss"] = delta
    weighted = (delta.values * component_weights(cfg)).sum(-1)  # (L, H)
    minus = ds.chg.sel(fit="minus").mean(RESTART).values
    ds.attrs.update(ablation=method, loss_full=delta.attrs["loss_full"], weights=component_weights(cfg).tolist(),
                    rho=rank_agreement(minus, weighted), rho_undefined=rank_agreement_undefined(minus, weighted) or "")
    if contrast is not None:
        c = fit_contrastive(model, cfg, *contrast, opts, progress=progress)
        ds = ds.merge(c, combine_attrs="override")
        ds.attrs.update(retain=c.attrs["retain"], forget=c.attrs["forget"])
    return ds


def report_table(ds: xr.Dataset) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a :func:`gate_report`: one row per head.

    Columns: layer, head, G+ and G- (means over restarts), the majority label (marked ``*``
    where restarts tie: see :func:`report_lines`; ``^`` where the means shown beside it would give
    another label, as G- 0.468 beside "facilitating" from restarts at 0.41, 0.37, 0.51, 0.59), the fraction of restarts agreeing with it,
    the ablation delta (mixture-weighted, then per component), and with a contrastive fit the
    mean contrastive gate ("keep") and the fraction of restarts on its majority side of the
    threshold ("k.agree": restarts that keep a head and restarts that drop it average to a
    gate near the threshold, which alone reads as undecided).
    """
    comps = [str(c) for c in ds[COMPONENT].values]
    weights = np.asarray(ds.attrs.get("weights", None) or [1.0 / len(comps)] * len(comps))
    plus = ds.chg.sel(fit="plus").mean(RESTART).values
    minus = ds.chg.sel(fit="minus").mean(RESTART).values
    delta = ds.delta_loss.values  # (L, H, C)
    header = ["layer", "head", "G+", "G-", "label", "agree", "dloss", *[f"d:{c}" for c in comps]]
    keep = None
    if "contrast_gate" in ds:
        keep = ds.contrast_gate.mean(RESTART).values
        kept = (ds.contrast_gate >= _threshold(ds)).mean(RESTART).values  # share of restarts keeping the head
        keep_agree = np.maximum(kept, 1.0 - kept)
        header += ["keep", "k.agree"]
    tied = tied_majority(ds.chg_role.transpose(RESTART, LAYER, HEAD).values)
    # from the means as printed (3 decimals): a G- of 0.49996 shows 0.500, which gives the label
    of_means = chg_roles(np.round(plus, 3), np.round(minus, 3), _threshold(ds))
    rows = []
    for layer in range(plus.shape[0]):
        for head in range(plus.shape[1]):
            row = [str(layer), str(head), f"{plus[layer, head]:.3f}", f"{minus[layer, head]:.3f}",
                   CHG_ROLES[int(ds.role.values[layer, head])] + ("*" if tied[layer, head] else "")
                   + ("^" if of_means[layer, head] != ds.role.values[layer, head] else ""),
                   f"{ds.agreement.values[layer, head]:.2f}",
                   f"{float(delta[layer, head] @ weights):+.4f}", *[f"{d:+.4f}" for d in delta[layer, head]]]
            if keep is not None:
                row += [f"{keep[layer, head]:.3f}", f"{keep_agree[layer, head]:.2f}"]
            rows.append(row)
    return header, rows


def report_lines(ds: xr.Dataset) -> list[str]:
    """Summary lines of a :func:`gate_report`: NLLs, label stability, rho (with a caution below
    `RHO_CAUTION`), the heads whose label is marked ``*`` or ``^``, how settled the fits were
    when they stopped, and the contrastive losses."""
    nll = ds.nll.mean(RESTART)
    # With no lambda = 0 updates the 'init' stage is the random initial draw, not a fit.
    init = "unfitted initial gates" if ds.attrs.get("options", {}).get("init_steps") == 0 else "lambda=0"
    lines = [
        f"NLL on the fit data: all gates open {ds.attrs['nll_full']:.4f}, {init} {float(nll.sel(stage='init')):.4f}, "
        f"G+ {float(nll.sel(stage='plus')):.4f}, G- {float(nll.sel(stage='minus')):.4f}",
        # One restart agrees with itself: 1.00 would read as stable labels that were never tested.
        (f"labels: {ds.sizes[RESTART]} restarts, mean agreement with the majority {ds.attrs['mean_agreement']:.2f}"
         if ds.sizes[RESTART] > 1 else "labels: 1 restart, so their stability across restarts is not measured"),
        f"Spearman rho(G-, {ds.attrs['ablation']}-ablation delta) = "
        + (f"{ds.attrs['rho']:.3f}" if np.isfinite(ds.attrs["rho"]) else
           f"undefined ({ds.attrs.get('rho_undefined') or 'NaN'})"),
    ]
    rho = float(ds.attrs["rho"])
    if np.isfinite(rho) and rho < RHO_CAUTION:
        # Measured on an under-trained model with MLPs (400 steps): at lambda 0.1, rho -0.95, the
        # layer-0 heads whose ablation costs 4x the others' labelled "irrelevant" (G- 0.42-0.57),
        # at 0.3 rho 0.74 with every head "irrelevant"; 0.64 on the same config at 3000 steps.
        lines.append(f"caution: rho {rho:.3f}: G- ranks these heads {'against' if rho < 0 else 'barely by'} their "
                     f"{ds.attrs['ablation']}-ablation cost, so the labels are no reading of each head's causal "
                     f"importance here (an under-trained model can do this; try another --lam, and read the "
                     f"ablation deltas)")
    shared = _shared_starts(ds)
    if shared.any():
        where = ("every head" if shared.all() else f"{int(shared.sum())} of {shared.size} heads ("
                 + ", ".join(f"L{layer}H{head}" for layer, head in zip(*np.nonzero(shared), strict=True)) + ")")
        clamp = ds.attrs.get("options", {}).get("clamp", 4.0)
        # With every head shared the restarts repeat one another; with some, those heads' fits still
        # differ through the others' gates (a tie at such a head was measured), only less than elsewhere.
        after = ("the restarts then repeat one another, so their agreement is the lambda=0 fit's, not G+ and G- "
                 "fitted again from different starts" if shared.all() else
                 "their restarts differ there only through the other heads' gates, so the agreement at those heads "
                 "tests less than G+ and G- fitted again from different starts")
        lines.append(f"labels: at {where} every restart's lambda=0 fit ended past the clamp (|logit| >= {clamp:g}) on "
                     f"one side, so G+ and G- started from one point in every restart there: {after}")
    tied = tied_majority(ds.chg_role.transpose(RESTART, LAYER, HEAD).values)
    if tied.any():
        where = [f"L{layer}H{head}" for layer, head in zip(*np.nonzero(tied), strict=True)]
        lines.append(f"labels marked *: the restarts tie at {len(where)} head{'s' if len(where) > 1 else ''} "
                     f"({', '.join(where)}), so no role is a majority there; the label shown is the first tied "
                     f"one in the order {', '.join(CHG_ROLES[:-1])}")
    means = chg_roles(np.round(ds.chg.sel(fit="plus").mean(RESTART).values, 3),
                      np.round(ds.chg.sel(fit="minus").mean(RESTART).values, 3), _threshold(ds))
    if (apart := means != ds.role.values).any():
        where = [f"L{layer}H{head}" for layer, head in zip(*np.nonzero(apart), strict=True)]
        lines.append(f"labels marked ^: at {', '.join(where)} the mean G+ and G- shown would give another label; "
                     f"the label is the restarts' majority, each restart labelled from its own gates")
    lines += _settle_lines(ds)
    if "contrast_loss" in ds:
        loss = ds.contrast_loss
        for side in ("retain", "forget"):
            full, gated, circuit = (loss.sel(side=side, state=s) for s in ("full", "gated", "circuit"))
            lines.append(f"contrast {side} {ds.attrs[side]}: held-out NLL {float(full.mean()):.4f} -> "
                         f"{_over_restarts(gated)} gated, {_over_restarts(circuit)} with only the kept heads "
                         f"(gate >= threshold)")
        lines += _contrast_settle_lines(ds)
    return lines


def _shared_starts(ds: xr.Dataset) -> np.ndarray:
    """(L, H) True where every restart started G+ and G- from the same logits.

    With ``clamp_start`` the fits start from the lambda = 0 logits clamped to [-clamp, clamp]: a
    head whose logit ended past the clamp on one side in every restart starts from that bound in
    each. Where every head does, the fits, on the same batches, repeat one another; where some
    do, those heads' fits differ only through the other heads' gates.
    """
    opts = ds.attrs.get("options", {})
    shape = ds.role.shape
    if ds.sizes[RESTART] < 2 or not opts.get("clamp_start", True) or "chg_init" not in ds:
        return np.zeros(shape, dtype=bool)
    clamp = opts.get("clamp", 4.0)
    gates = ds.chg_init.transpose(RESTART, LAYER, HEAD).values.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # a saturated gate's logit is +-inf; NaN stays False
        logits = np.log(gates) - np.log1p(-gates)
    return (logits >= clamp).all(0) | (logits <= -clamp).all(0)


def _threshold(ds: xr.Dataset) -> float:
    return ds.attrs.get("options", {}).get("threshold", 0.5)


def _over_restarts(values: xr.DataArray) -> str:
    """The mean over restarts, with their range where they differ in the printed digits: restarts
    that found different sub-circuits average to a loss none of them has."""
    mean, low, high = float(values.mean()), float(values.min()), float(values.max())
    if f"{low:.4f}" == f"{high:.4f}":
        return f"{mean:.4f}"
    return f"{mean:.4f} (restarts {low:.4f} to {high:.4f})"


def _settle_lines(ds: xr.Dataset) -> list[str]:
    """How far each stage's gates still moved at the end, and the heads whose labels that leaves open."""
    if "settle" not in ds:  # a fit saved before settle was recorded
        return []
    opts = ds.attrs.get("options", {})
    steps, init_steps = opts.get("steps"), opts.get("init_steps")
    moved = ds.settle.max((RESTART, LAYER, HEAD))
    stages = [("lambda=0", "init", steps if init_steps is None else init_steps), ("G+", "plus", steps),
              ("G-", "minus", steps)]
    parts = [f"{float(moved.sel(stage=s)):.3f} ({name}, last {settle_window(n)} of {n} updates)"
             for name, s, n in stages if n]
    lines = ["convergence of the fits: the largest change of any gate over a stage's last tenth: " + ", ".join(parts)]
    fits = [(ds.chg.sel(fit=fit), ds.settle.sel(stage=fit)) for fit in ("plus", "minus")]
    return lines + _open_lines("convergence of the labels", "G+ or G- gate", "every G+ and G- gate", fits,
                               _threshold(ds))


def _contrast_settle_lines(ds: xr.Dataset) -> list[str]:
    """As :func:`_settle_lines`, for the contrastive gates, whose kept heads are its result."""
    if "contrast_settle" not in ds:  # a fit saved before contrast_settle was recorded
        return []
    n = ds.attrs.get("options", {}).get("steps")
    window = f"last {settle_window(n)} of {n} updates" if n else "last tenth of its updates"
    lines = [f"convergence of the contrastive fit: the largest change of any gate over its {window}: "
             f"{float(ds.contrast_settle.max()):.3f}"]
    return lines + _open_lines("convergence of the kept heads", "contrastive gate", "every contrastive gate",
                               [(ds.contrast_gate, ds.contrast_settle)], _threshold(ds))


def _open_lines(what: str, a_gate: str, every_gate: str, fits: list[tuple[xr.DataArray, xr.DataArray]],
                threshold: float) -> list[str]:
    """The heads whose thresholded reading any restart of these (gates, settle) pairs leaves open."""
    shape = fits[0][0].isel({RESTART: 0}).shape
    open_ = np.zeros(shape, dtype=bool)  # (L, H)
    lost = np.zeros(shape, dtype=bool)  # (L, H): a gate that is not a number
    for gates, settle in fits:
        gates = gates.transpose(RESTART, LAYER, HEAD).values  # (restart, L, H)
        open_ |= unsettled(gates, settle.transpose(RESTART, LAYER, HEAD).values, threshold).any(0)
        lost |= ~np.isfinite(gates).all(0)
    lines = []
    if lost.any():
        # more updates cannot settle a gate the fit lost: the model's loss was not finite
        heads = ", ".join(f"L{layer}H{head}" for layer, head in zip(*np.nonzero(lost), strict=True))
        lines.append(f"{what}: undefined at {heads} (a {a_gate} is not a number: the model's loss was not finite)")
        open_ &= ~lost
    if open_.any():
        heads = ", ".join(f"L{layer}H{head}" for layer, head in zip(*np.nonzero(open_), strict=True))
        lines.append(f"{what}: not settled at {heads} (a {a_gate} moved over its last tenth at least as far "
                     f"as it now sits from the {threshold:g} threshold); refit with more --steps")
    elif not lost.all():
        where = " at the other heads" if lost.any() else ""
        lines.append(f"{what}: settled{where} ({every_gate}{where and ' there'} sits farther from the "
                     f"{threshold:g} threshold than it moved over its last tenth)")
    return lines


def save_fit(path: str, run_id: str, ds: xr.Dataset) -> str:
    """Write `ds` as ``derived/gates.<run_id>``, and the line that says so, naming the fit it
    replaces: a quick refit took the place of a longer contrastive one with nothing said but
    "saved to derived/gates.<run>"."""
    from dynamics import store

    name = f"gates.{run_id}"
    try:
        before = store.open_derived(path, name)
    except Exception:  # noqa: BLE001 - damaged: replaced all the same, and its readers name it
        before = None
    store.write_derived(path, name, ds)
    if before is None:
        return f"saved to derived/{name}"
    opts = before.attrs.get("options", {})
    what = ", ".join(x for x in [
        f"step {before.attrs['step']}" if "step" in before.attrs else "",
        f"{opts['restarts']} restart(s) x {opts['steps']} updates" if {"restarts", "steps"} <= set(opts) else "",
        # None: as many as steps (GateOptions.init_steps); a quick refit's 0 told apart from a long fit
        f"{opts['steps'] if opts['init_steps'] is None else opts['init_steps']} lambda=0 updates"
        if {"init_steps", "steps"} <= set(opts) else "",
        f"lambda {opts['lam']:g}" if "lam" in opts else "",
        f"contrast retain={before.attrs['retain']},forget={before.attrs['forget']}"
        if {"retain", "forget"} <= set(before.attrs) else "no contrast"] if x)
    return (f"saved to derived/{name} (replacing the fit saved before: {what}; --no-save prints a fit without "
            f"replacing it)")
