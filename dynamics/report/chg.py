"""Causal head gating: the G+/G- taxonomy labels and the figure of G+ against G-."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynamics import store
from dynamics.report.data import _Ctx, _open_derived, _Run, _Section
from dynamics.report.draw import _figure, _groups, _save, _short

CHG_THRESHOLD = 0.5
"""Gate value separating "high" from "low" G+ / G- (Nam et al. 2025, Figure 1c)."""

CHG_LABELS = ("facilitating", "irrelevant", "interfering", "inconsistent", "unfitted")
"""CHG taxonomy, as ``dynamics.gates.CHG_ROLES``: G+ and G- high; G+ high, G- low; both low;
G+ low, G- high (contradicts both fits); no fit (NaN)."""


def chg_label(g_plus, g_minus, threshold: float = CHG_THRESHOLD) -> np.ndarray:
    """CHG taxonomy label of each head from its G+ and G- gate values (Nam et al. 2025).

    facilitating: G+ >= t and G- >= t (the head stays open even when pushed shut);
    irrelevant: G+ >= t and G- < t (kept when free, dropped when pushed: not needed);
    interfering: G+ < t and G- < t (shut even when pushed open: removing it helps);
    inconsistent: G+ < t <= G- (contradicts both fits); unfitted: either value is NaN.
    The same rule as ``dynamics.gates.chg_roles``, restated because gates imports torch.

    Parameters
    ----------
    g_plus, g_minus : array-like
        Gate values in [0, 1], same shape.
    threshold : float

    Returns
    -------
    ndarray of str, same shape.

    Example
    -------
    >>> chg_label([0.9, 0.9, 0.1], [0.9, 0.1, 0.1]).tolist()
    ['facilitating', 'irrelevant', 'interfering']
    """
    gp, gm = np.asarray(g_plus, dtype=float), np.asarray(g_minus, dtype=float)
    out = np.full(np.broadcast(gp, gm).shape, CHG_LABELS[3], dtype=object)
    out[(gp >= threshold) & (gm >= threshold)] = CHG_LABELS[0]
    out[(gp >= threshold) & (gm < threshold)] = CHG_LABELS[1]
    out[(gp < threshold) & (gm < threshold)] = CHG_LABELS[2]
    out[np.isnan(gp) | np.isnan(gm)] = CHG_LABELS[4]
    return out.astype(str)


def _gate_pair(ds: xr.Dataset) -> xr.DataArray | None:
    """(..., layer, head, fit=[plus, minus]) gate values from a run or a gates dataset."""
    for name in ("chg", "gates", "gate_fit", "G"):
        if name in ds and "fit" in ds[name].dims:
            return ds[name]
    plus = next((ds[n] for n in ("g_plus", "G_plus", "plus", "gate_plus") if n in ds), None)
    minus = next((ds[n] for n in ("g_minus", "G_minus", "minus", "gate_minus") if n in ds), None)
    if plus is not None and minus is not None:
        return xr.concat([plus, minus], dim=xr.Variable("fit", ["plus", "minus"]))
    return None


def _chg_of_run(path, run: _Run, derived: list[str]) -> tuple[xr.DataArray | None, str]:
    """CHG gates of one run, (snapshot, layer, head, fit), from the run or derived gates.<run_id>."""
    ds = store.open_run(path, run.run_id)
    if "chg" in ds:
        chg = ds["chg"].load().transpose("snapshot", "layer", "head", "fit")
        fitted = chg.notnull().any([d for d in chg.dims if d != "snapshot"]).values  # NaN: not fitted at that snapshot
        if fitted.any():
            return chg.isel(snapshot=np.flatnonzero(fitted)), "recorded during training (chg)"
    for name in (f"gates.{run.run_id}", f"gates/{run.run_id}"):
        if name in derived:
            pair = _gate_pair(_open_derived(path, name))
            if pair is not None:
                # Several restarts (gates.fit_chg): their mean, as gates.chg_snapshot records.
                pair = pair.load().mean([d for d in pair.dims if d not in ("snapshot", "layer", "head", "fit")])
                if "snapshot" not in pair.dims:
                    # `dynamics gates` fits the latest checkpoint, which is the last recorded snapshot.
                    last = int(run.steps[run.recorded][-1]) if run.recorded.any() else 0
                    pair = pair.expand_dims("snapshot").assign_coords(step=("snapshot", [last]))
                return pair.transpose("snapshot", "layer", "head", "fit"), f"derived/{name} (`dynamics gates`)"
    return None, ""


def _chg_section(ctx: _Ctx) -> _Section:
    path, runs, chosen, axes, out = ctx.path, ctx.runs, ctx.chosen, ctx.axes, ctx.out
    sec = _Section("chg", "Causal head gating: G+ against G-")
    derived = ctx.derived()
    found = {}
    for r in runs:
        pair, source = _chg_of_run(path, r, derived)
        if pair is not None:
            found[r.run_id] = (pair, source)
    if not found:
        sec.missing.append("Not available: the CHG scatter because no run recorded fitted `chg` gates "
                           "(record.chg_every = 0, or no fit reached yet) and the store has no derived gates.<run_id> dataset.")
        return sec
    t = CHG_THRESHOLD
    groups = _groups([r for r in runs if r.run_id in found], axes)
    fig = _figure(11.5, 4.4)
    ax1, ax2, ax3 = fig.subplots(1, 3, width_ratios=[1, 1, 1.1])
    for ax in (ax1, ax2):
        _chg_regions(ax, t)
    for key in groups.keys:
        for r in groups.members[key]:
            pair = found[r.run_id][0].isel(snapshot=-1)
            gp, gm = pair.sel(fit="plus").values.ravel(), pair.sel(fit="minus").values.ravel()
            ax1.scatter(gp, gm, color=groups.colours[key], s=30, edgecolor="k", lw=0.4, zorder=3, alpha=0.85)
    ax1.set_title("every head, last fitted snapshot", fontsize=9)
    handles = [ax1.scatter([], [], color=groups.colours[k], s=30, edgecolor="k", lw=0.4, label=groups.labels[k]) for k in groups.keys]
    if len(handles) <= 12:  # below the panel: inside it would hide heads
        ax1.legend(handles=handles, fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                   ncol=min(4, len(handles)), title=_short(groups.colour_axis) if groups.colour_axis else "run",
                   title_fontsize=7)

    # Over training: the chosen run if it has fits, else the first run with fits.
    rid = chosen if chosen in found else next(iter(found))
    pair, source = found[rid]
    steps = pair["step"].values if "step" in pair.coords else np.arange(pair.sizes["snapshot"])
    gp = pair.sel(fit="plus").values.reshape(pair.sizes["snapshot"], -1)
    gm = pair.sel(fit="minus").values.reshape(pair.sizes["snapshot"], -1)
    from matplotlib import colormaps

    cmap = colormaps["plasma"]
    for h in range(gp.shape[1]):
        ax2.plot(gp[:, h], gm[:, h], color="grey", lw=0.7, alpha=0.6, zorder=2)
    sc = ax2.scatter(gp.ravel(), gm.ravel(), c=np.repeat(steps, gp.shape[1]), cmap=cmap, s=18, zorder=3,
                     edgecolor="k", lw=0.2)
    fig.colorbar(sc, ax=ax2, shrink=0.8, label="training step (steps)")
    ax2.set_title(f"run {rid}: each head over training", fontsize=9)
    labels = chg_label(gp, gm, t)
    for name, colour in zip(CHG_LABELS, ("#2a9d8f", "#e9c46a", "#e76f51", "#7a5195", "#999999"), strict=True):
        share = (labels == name).mean(1)
        if share.any() or name in CHG_LABELS[:3]:
            ax3.plot(steps, share, marker="o", ms=3, color=colour, label=name)
    ax3.set_ylim(-0.02, 1.02)
    ax3.set_xlabel("training step (steps)")
    ax3.set_ylabel("heads with this CHG label (fraction)")
    ax3.set_title(f"run {rid}: taxonomy shares", fontsize=9)
    ax3.legend(fontsize=7, frameon=False)
    ax3.grid(alpha=0.3)
    sources = sorted({s for _, s in found.values()})
    sec.figures.append((_save(fig, out, "figures/chg.png"),
                        f"Causal head gating (Nam et al. 2025): each head's gate fitted toward open (G+, x) and toward shut "
                        f"(G-, y), both fractions in [0, 1], threshold {t}. Regions: facilitating (both high), irrelevant "
                        f"(G+ high, G- low), interfering (both low). Left: every head of {len(found)} run(s) at its last fit; "
                        f"middle and right: run {rid} over training. Source: {', '.join(sources)}."))
    lacking = [r.run_id for r in runs if r.run_id not in found]
    if lacking:
        sec.missing.append(f"Not available: CHG gates for {len(lacking)} run(s) ({', '.join(lacking)}) because they recorded "
                           f"no fitted chg and have no derived gates dataset.")
    return sec


def _chg_regions(ax, t: float) -> None:
    """Shade and name the three CHG taxonomy regions (Nam et al. 2025, Figure 1c)."""
    ax.fill_between([t, 1.05], t, 1.05, color="#2a9d8f", alpha=0.14, lw=0)
    ax.fill_between([t, 1.05], -0.05, t, color="#e9c46a", alpha=0.18, lw=0)
    ax.fill_between([-0.05, t], -0.05, t, color="#e76f51", alpha=0.14, lw=0)
    ax.axvline(t, color="k", lw=0.6, ls=":")
    ax.axhline(t, color="k", lw=0.6, ls=":")
    ax.text(0.98, 0.98, "facilitating", ha="right", va="top", fontsize=8, color="#1d6e64")
    ax.text(0.98, 0.02, "irrelevant", ha="right", va="bottom", fontsize=8, color="#8a6d1c")
    ax.text(0.02, 0.02, "interfering", ha="left", va="bottom", fontsize=8, color="#a0402a")
    ax.text(0.02, 0.98, "inconsistent", ha="left", va="top", fontsize=8, color="#777777")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_aspect("equal")
    ax.set_xlabel("G+ (gate fitted toward open, fraction)")
    ax.set_ylabel("G- (gate fitted toward shut, fraction)")
