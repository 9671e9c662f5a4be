"""Causal head gating: the G+/G- taxonomy labels and the figure of G+ against G-."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynamics import store
from dynamics.analysis.chg import CHG_ROLES, RHO_CAUTION, chg_roles, label_agreement
from dynamics.report.data import _Ctx, _open_derived, _Run, _Section, _why, is_damage
from dynamics.report.draw import _figure, _legend_below, _save
from dynamics.schema import FINISHED_STATUSES

CHG_THRESHOLD = 0.5
"""Gate value separating "high" from "low" G+ / G- (Nam et al. 2025, Figure 1c)."""

CHG_LABELS = CHG_ROLES
"""CHG taxonomy (``dynamics.analysis.chg``): G+ and G- high; G+ high, G- low; both low;
G+ low, G- high (contradicts both fits); no fit (NaN)."""


def chg_label(g_plus, g_minus, threshold: float = CHG_THRESHOLD) -> np.ndarray:
    """CHG taxonomy label of each head from its G+ and G- gate values (Nam et al. 2025).

    facilitating: G+ >= t and G- >= t (the head stays open even when pushed shut);
    irrelevant: G+ >= t and G- < t (kept when free, dropped when pushed: not needed);
    interfering: G+ < t and G- < t (shut even when pushed open: removing it helps);
    inconsistent: G+ < t <= G- (contradicts both fits); unfitted: either value is NaN.
    The names of :func:`dynamics.analysis.chg.chg_roles`.

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
    gp, gm = np.broadcast_arrays(np.asarray(g_plus, dtype=float), np.asarray(g_minus, dtype=float))
    return np.asarray(CHG_LABELS)[chg_roles(gp, gm, threshold)]  # -1 (unfitted) indexes the last name


def _gate_pair(ds: xr.Dataset) -> xr.DataArray | None:
    """(..., layer, head, fit=[plus, minus]) gate values of a gates dataset (`dynamics gates`' ``chg``:
    the only name any version wrote them under; the other names this looked for, none did)."""
    return ds["chg"] if "chg" in ds and "fit" in ds["chg"].dims else None


def _majority(codes: np.ndarray, axis: int = 0) -> np.ndarray:
    """Majority role code over `axis` (restarts), as `dynamics gates` reports it."""
    return label_agreement(np.moveaxis(np.asarray(codes), axis, 0))[0]


def _role_codes(ds: xr.Dataset, keep: tuple[str, ...]) -> xr.DataArray | None:
    """Stored CHG role codes of a gates dataset: ``role`` (the majority over restarts that
    `dynamics gates` prints), else the majority of the per-restart ``chg_role``; None if neither."""
    if "role" in ds and ds["role"].dtype.kind in "iu":
        role = ds["role"].load()
    elif "chg_role" in ds and ds["chg_role"].dtype.kind in "iu":
        role = ds["chg_role"].load()
    else:
        return None
    for d in [d for d in role.dims if d not in keep]:  # restarts: majority vote, never a mean
        role = xr.apply_ufunc(_majority, role, input_core_dims=[[d]], kwargs={"axis": -1})
    return role


def _chg_fits(path, run: _Run, derived: list[str]) -> list[tuple[xr.DataArray, xr.DataArray | None, str]]:
    """Every CHG fit of one run: the gates recorded during training (``chg``), then the
    `dynamics gates` fit (derived ``gates.<run_id>``), each where present.

    Each is (gates (snapshot, layer, head, fit), stored role codes (snapshot, layer, head) or
    None, source). With several restarts the gates are their mean (positions only) and the
    codes their majority, as `dynamics gates` labels heads; codes that do not cover every
    fitted head are dropped (the labels then come from the positions, and the caption says so).
    """
    fits = []
    ds = store.open_run(path, run.run_id, dask=False)
    if "chg" in ds:
        chg = ds["chg"].load().transpose("snapshot", "layer", "head", "fit")
        fitted = chg.notnull().any([d for d in chg.dims if d != "snapshot"]).values  # NaN: not fitted at that snapshot
        if fitted.any():
            idx = np.flatnonzero(fitted)
            role = _role_codes(ds[["chg_role"]], ("snapshot", "layer", "head")) if "chg_role" in ds else None
            if role is not None:
                role = role.transpose("snapshot", "layer", "head").isel(snapshot=idx)
            pair = chg.isel(snapshot=idx)
            fits.append((pair, _checked_roles(pair, role), "recorded during training (chg)"))
    for name in (f"gates.{run.run_id}", f"gates/{run.run_id}"):
        if name in derived:
            # the gates and codes this reads (another array's bad chunk is no loss here), as one version
            gates = _open_derived(path, name, load=("chg", "role", "chg_role"))
            pair = _gate_pair(gates)
            if pair is not None:
                # Several restarts (gates.fit_chg): their mean as the position, as gates.chg_snapshot records.
                pair = pair.load().mean([d for d in pair.dims if d not in ("snapshot", "layer", "head", "fit")])
                role = _role_codes(gates, ("snapshot", "layer", "head"))
                if "snapshot" not in pair.dims:
                    # `dynamics gates` fits the latest checkpoint and records its step; gates saved
                    # before it did are placed at the last recorded snapshot.
                    last = int(run.steps[run.recorded][-1]) if run.recorded.any() else 0
                    fitted_at = int(gates.attrs.get("step", last))
                    pair = pair.expand_dims("snapshot").assign_coords(step=("snapshot", [fitted_at]))
                if role is not None and "snapshot" not in role.dims:
                    role = role.expand_dims("snapshot")
                pair = pair.transpose("snapshot", "layer", "head", "fit")
                if role is not None:
                    role = role.transpose("snapshot", "layer", "head")
                # labelled at the threshold it was fitted with (GateOptions.threshold, Python API only)
                opts = gates.attrs.get("options")
                thr = opts.get("threshold", CHG_THRESHOLD) if isinstance(opts, dict) else CHG_THRESHOLD
                thr = thr if isinstance(thr, (int, float)) and 0 < thr < 1 else CHG_THRESHOLD  # as GateOptions checks
                pair = pair.assign_attrs(chg_threshold=float(thr))
                if isinstance(gates.attrs.get("rho"), (int, float)):  # G- against the ablation cost: the caution's
                    pair = pair.assign_attrs(rho=float(gates.attrs["rho"]))
                fits.append((pair, _checked_roles(pair, role), f"derived/{name} (`dynamics gates`{_fit_options(gates)})"))
                break
    return fits


def _fit_options(gates: xr.Dataset) -> str:
    """", 4 restarts x 500 updates, lambda 0.1": how a `dynamics gates` fit was made (attrs
    ``options`` of gates.fit_chg), so a reader can tell a re-fit from the first one; "" if unsaid."""
    opts = gates.attrs.get("options")
    if not isinstance(opts, dict):
        return ""
    parts = []
    if "restarts" in opts:
        parts.append(f"{opts['restarts']} restart(s)" + (f" x {opts['steps']} updates" if "steps" in opts else ""))
    if "lam" in opts:
        parts.append(f"lambda {float(opts['lam']):g}")
    return "".join(f", {p}" for p in parts)


def _last_step(pair: xr.DataArray) -> float:
    return float(pair["step"].values[-1]) if "step" in pair.coords else float("nan")


def _chg_of_run(path, run: _Run, derived: list[str]) -> tuple[xr.DataArray | None, xr.DataArray | None, str]:
    """The fit of one run that the "last fit" panel shows: of the recorded and the `dynamics
    gates` fit, the one at the later step; at the same step the `dynamics gates` one (an
    explicit re-fit, often with more restarts). (None, None, "") for a run without fits."""
    fits = _chg_fits(path, run, derived)
    if not fits:
        return None, None, ""
    return max(reversed(fits), key=lambda f: _last_step(f[0]) if np.isfinite(_last_step(f[0])) else -1.0)


def _checked_roles(pair: xr.DataArray, role: xr.DataArray | None) -> xr.DataArray | None:
    """`role` if it labels every head `pair` has gates for (shape matches, no -1 there); else None."""
    if role is None or role.shape != pair.shape[:-1]:
        return None
    fitted = pair.notnull().all("fit").values
    codes = role.values
    if ((codes < -1) | (codes >= len(CHG_LABELS) - 1)).any() or (codes[fitted] < 0).any():
        return None
    return role


def _chg_classes(pair: xr.DataArray, role: xr.DataArray | None, threshold: float = CHG_THRESHOLD) -> tuple[np.ndarray, bool]:
    """CHG label of every head at every fitted snapshot, (snapshot, layer * head) str.

    The stored role codes when there are any (True): with several restarts they are the
    majority vote, which can differ from the region of the mean G+ / G-; else the taxonomy of
    the gate values (False).
    """
    n = pair.sizes["snapshot"]
    if role is not None:
        codes = role.values.reshape(n, -1).astype(int)
        return np.asarray(CHG_LABELS)[codes], True  # -1 (unfitted) indexes the last name
    gp = pair.sel(fit="plus").values.reshape(n, -1)
    gm = pair.sel(fit="minus").values.reshape(n, -1)
    return chg_label(gp, gm, threshold), False


def _chg_section(ctx: _Ctx) -> _Section:
    path, runs, chosen, out = ctx.path, ctx.runs, ctx.chosen, ctx.out
    sec = _Section("chg", "Causal head gating: G+ against G-")
    derived = ctx.derived()
    found, over, both, unreadable = {}, {}, [], {}
    for r in runs:
        try:
            fits = _chg_fits(path, r, derived)
        except Exception as e:  # noqa: BLE001 - a damaged run or gates dataset: the others' gates still shown
            unreadable[r.run_id] = _unread_why(path, r, derived, e)
            if r.status != "damaged" and is_damage(e):
                ctx.damaged.append(f"run {r.run_id}: its CHG gates could not be read ({unreadable[r.run_id]})")
            continue
        if fits:
            found[r.run_id] = _chg_of_run(path, r, derived) if len(fits) > 1 else fits[0]
            over[r.run_id] = fits[0]  # over training: the fits recorded during training, where there are any
            both += [r.run_id] if len(fits) > 1 else []
    unread = (f"Not available: CHG gates for {len(unreadable)} run(s) because they could not be read: "
              f"{'; '.join(f'{rid} ({why})' for rid, why in unreadable.items())}.")
    if not found:
        sec.missing.append(f"Not available: the CHG scatter because no {'readable ' if unreadable else ''}run recorded "
                           "fitted `chg` gates (record.chg_every = 0, or no fit reached yet) and the store has no "
                           f"{'readable ' if unreadable else ''}derived gates.<run_id> dataset (`dynamics gates "
                           f"{ctx.path} --run ID` fits and saves one for a run).")
        sec.missing += [unread] if unreadable else []
        sec.missing += [f"derived/ could not be read ({ctx.derived_problem})."] if ctx.derived_problem else []
        return sec
    def threshold(pair: xr.DataArray) -> float:  # training's fits use GateOptions' default
        return float(pair.attrs.get("chg_threshold", CHG_THRESHOLD))

    # The left panel's regions at the threshold its fits share; where they differ, each head's
    # label and ring still at its own fit's, and the caption names them
    shown = sorted({threshold(p) for p, _, _ in found.values()})
    t = shown[0] if len(shown) == 1 else CHG_THRESHOLD
    groups = ctx.groups([r for r in runs if r.run_id in found])
    fig = _figure(11.5, 4.4)
    ax1, ax2, ax3 = fig.subplots(1, 3, width_ratios=[1, 1, 1.1])
    ringed = heads = 0
    for key in groups.keys:
        for r in groups.members[key]:
            pair, role, _ = found[r.run_id]
            labels, _stored = _chg_classes(pair, role, threshold(pair))
            last = pair.isel(snapshot=-1)
            gp, gm = last.sel(fit="plus").values.ravel(), last.sel(fit="minus").values.ravel()
            ax1.scatter(gp, gm, color=groups.colours[key], marker=groups.markers[key], s=30, edgecolor="k", lw=0.4,
                        zorder=3, alpha=0.85)
            ringed += _ring_disagreements(ax1, gp, gm, labels[-1], threshold(pair))
            heads += gp.size
    ax1.set_title("every head, latest fit", fontsize=9)
    handles = [ax1.scatter([], [], color=groups.colours[k], marker=groups.markers[k], s=30, edgecolor="k", lw=0.4,
                           label=groups.legend_label(k)) for k in groups.keys]
    if len(handles) <= 12:  # below the panels: inside it would hide heads
        _legend_below(fig, handles, groups.title)

    by_id = {r.run_id: r for r in runs}
    # Over training: the chosen run if it has fits, else the run with the most fitted snapshots (the
    # first had been taken, a lone `dynamics gates` fit one point, beside a run fitted all along)
    rid = chosen if chosen in found else max(found, key=lambda k: over[k][0].sizes["snapshot"])
    pair, role, source = over[rid]
    t_over = threshold(pair)  # the middle panel's regions at its own fit's threshold
    _chg_regions(ax1, t)
    _chg_regions(ax2, t_over)
    steps = pair["step"].values if "step" in pair.coords else np.arange(pair.sizes["snapshot"])
    gp = pair.sel(fit="plus").values.reshape(pair.sizes["snapshot"], -1)
    gm = pair.sel(fit="minus").values.reshape(pair.sizes["snapshot"], -1)
    from matplotlib import colormaps

    cmap = colormaps["plasma"]
    for h in range(gp.shape[1]):
        ax2.plot(gp[:, h], gm[:, h], color="grey", lw=0.7, alpha=0.6, zorder=2)
    sc = ax2.scatter(gp.ravel(), gm.ravel(), c=np.repeat(steps, gp.shape[1]), cmap=cmap, s=18, zorder=3,
                     edgecolor="k", lw=0.2)
    labels, stored = _chg_classes(pair, role, t_over)
    _ring_disagreements(ax2, gp.ravel(), gm.ravel(), labels.ravel(), t_over)
    bar = fig.colorbar(sc, ax=ax2, shrink=0.8, label="training step (steps)")
    if np.unique(steps).size == 1:
        # one fit (a lone `dynamics gates`): matplotlib widens a one-value scale to +-10% around
        # it, which read as fits from step 54 to 66 for one at 60
        bar.set_ticks([float(steps[0])], labels=[f"{float(steps[0]):g}"])
    so_far = "" if by_id[rid].status in FINISHED_STATUSES else " so far"  # still training, or stopped
    one_fit = np.unique(steps).size == 1  # a lone `dynamics gates` fit: one point per head, no course
    ax2.set_title(f"run {rid}: each head at its fit, step {float(steps[0]):g}" if one_fit
                  else f"run {rid}: each head over training{so_far}", fontsize=9)
    taxonomy = [(name, colour, (labels == name).mean(1))
             for name, colour in zip(CHG_LABELS, ("#2a9d8f", "#e9c46a", "#e76f51", "#7a5195", "#999999"), strict=True)
             if (labels == name).any() or name in CHG_LABELS[:3]]
    if one_fit:
        # one fit: a bar per label, as points at one step the labels with equal shares (0 often)
        # hid one another
        ax3.bar(range(len(taxonomy)), [float(share[0]) for _, _, share in taxonomy],
                color=[c for _, c, _ in taxonomy], tick_label=[name for name, _, _ in taxonomy])
        ax3.tick_params(axis="x", labelsize=7)
        ax3.set_xlabel(f"CHG label (the one fit, step {float(steps[0]):g})")
    else:
        # a marker each, larger for those drawn first: two labels with the same shares (0 at every
        # fit, often) had the later line hide the earlier, its legend entry pointing at nothing
        for i, (name, colour, share) in enumerate(taxonomy):
            ax3.plot(steps, share, marker="osD^v"[i % 5], ms=7 - i, mfc="none" if i % 2 else colour, color=colour,
                     lw=1.2, label=name)
        ax3.set_xlabel("training step (steps)")
        ax3.legend(fontsize=7, frameon=False)
    ax3.set_ylim(-0.02, 1.02)
    ax3.set_ylabel("heads with this CHG label (fraction)")
    ax3.set_title(f"run {rid}: taxonomy shares ({'stored labels' if stored else 'from mean gates'})", fontsize=9)
    ax3.grid(alpha=0.3)
    by_source: dict[str, list[str]] = {}
    for k, (_, _, s) in found.items():
        by_source.setdefault(s, []).append(k)
    sources = "Left: " + "; ".join(f"{s} for run(s) {', '.join(ks)}" for s, ks in sorted(by_source.items()))
    sources += f". Middle and right: {source}."
    if both:  # a later `dynamics gates` re-fit must not be hidden behind the fits made during training
        sources += (f" Run(s) {', '.join(both)} have fits recorded during training and a `dynamics gates` fit: the left "
                    f"panel shows the one at the later step (the `dynamics gates` one at the same step)"
                    + (", the middle and right panels the fits recorded during training." if rid in both else "."))
    early = [(k, by_id[k], _last_step(p)) for k, (p, _, _) in found.items()]
    early = [f"{k} ({r.status}, step {s:g} of {int(r.steps.max())})" for k, r, s in early
             if r.steps.size and np.isfinite(s) and s < r.steps.max()]
    if early:
        sources += (f" Fitted before the end of training, so provisional (a run still training, stopped, or a fit of "
                    f"an earlier checkpoint): {', '.join(early)}.")
    # the caution `dynamics gates` prints with such a fit: the page drew its labels without it
    # the fits the panels draw: each run's on the left, and the middle panel's run's (merged into one
    # dict, that run's `dynamics gates` fit on the left had been replaced by its training fits, rho-less)
    against = {k: p.attrs["rho"] for k, (p, _, _) in [*found.items(), (rid, over[rid])]
               if np.isfinite(p.attrs.get("rho", np.nan)) and p.attrs["rho"] < RHO_CAUTION}
    if against:
        sources += (" Caution: in the `dynamics gates` fit of run(s) "
                    + ", ".join(f"{k} (rho {v:.3f})" for k, v in against.items())
                    + f", G- ranks the heads against, or barely by, their single-head ablation cost (Spearman rho "
                      f"below {RHO_CAUTION:g}, as `dynamics gates` warns), so those labels are no reading of each "
                      f"head's causal importance (an under-trained model can do this; its ablation deltas say more).")
    unlabelled = [k for k, (_, role, _) in found.items() if role is None]
    how = ("Labels (the shares on the right, and the rings) are the role codes stored with the fits: with several "
           "restarts the majority vote over restarts, as `dynamics gates` reports them; dots sit at G+ and G- averaged "
           "over restarts, so a dot can fall in another region than its head's label. ")
    if unlabelled:
        how += (f"Run(s) {', '.join(unlabelled)} have no stored role codes: their labels are the region of the "
                f"plotted gates. ")
    rings = (f"Red rings (left and middle): points whose label differs from the region they are drawn in; left: "
             f"{ringed} of {heads} heads. " if ringed else "At the last fit no head's label differs from the region it is drawn in. ")
    if len(shown) == 1 and t_over == t:
        at = f"threshold {t:g}"
    else:
        by = {rid_: threshold(p) for rid_, (p, _, _) in found.items()}
        at = ("thresholds by run (each head labelled and ringed at its own fit's): "
              + "; ".join(f"{v:g} for {', '.join(k for k, x in by.items() if x == v)}" for v in sorted(set(by.values())))
              + f"; regions drawn at {t:g} on the left and {t_over:g} in the middle")
    # the page's per-run figures show `chosen`: these panels may not, and say so
    elsewhere = f" (run {chosen}, which the other per-run figures show, has no gate fits)" if chosen and rid != chosen else ""
    sec.figures.append((_save(fig, out, "chg.png"),
                        f"Causal head gating (Nam et al. 2025): each head's gate fitted toward open (G+, x) and toward shut "
                        f"(G-, y), both fractions in [0, 1], {at}. Regions: facilitating (both high), irrelevant "
                        f"(G+ high, G- low), interfering (both low). Left: every head of {len(found)} run(s) at its latest fit, "
                        f"{groups.description(scatter=True)}; middle and right: run {rid} "
                        f"{f'at its one fit (step {float(steps[0]):g})' if one_fit else 'over training'}{elsewhere}. {how}{rings}"
                        f"Sources: {sources}"))
    sec.missing += [unread] if unreadable else []
    lacking = [r.run_id for r in runs if r.run_id not in found and r.run_id not in unreadable]
    if lacking:
        sec.missing.append(f"Not available: CHG gates for {len(lacking)} run(s) ({', '.join(lacking)}) because they recorded "
                           f"no fitted chg and have no derived gates dataset.")
    return sec


def _unread_why(path, run: _Run, derived: list[str], error: Exception) -> str:
    """Why a run's CHG fits could not be read, for the page. "See Runs" only where the runs table
    says it (a damaged run): a damaged ``derived/gates.<run_id>`` or ``chg`` chunk of a readable
    run was sent there too, and its row said nothing."""
    if run.status == "damaged":
        return "see Runs"
    if store.failed_checksum(error):
        found = store.unreadable_chunk(path, run.run_id)  # a recorded chunk (chg): its run, array and snapshot
        if found is not None:
            return str(found)
        name = next((n for n in (f"gates.{run.run_id}", f"gates/{run.run_id}") if n in derived), None)
        return f"a chunk of derived/{name} failed its checksum" if name else "a chunk failed its checksum"
    return _why(error)


def _ring_disagreements(ax, gp: np.ndarray, gm: np.ndarray, labels: np.ndarray, t: float) -> int:
    """Ring the points whose label is not the region they are drawn in; returns how many."""
    off = (chg_label(gp, gm, t) != np.asarray(labels)) & np.isfinite(gp) & np.isfinite(gm)
    if off.any():
        ax.scatter(gp[off], gm[off], s=110, facecolor="none", edgecolor="red", lw=1.1, zorder=4)
    return int(off.sum())


def _chg_regions(ax, t: float) -> None:
    """Shade and name the three CHG taxonomy regions (Nam et al. 2025, Figure 1c)."""
    ax.fill_between([t, 1.05], t, 1.05, color="#2a9d8f", alpha=0.14, lw=0)
    ax.fill_between([t, 1.05], -0.05, t, color="#e9c46a", alpha=0.18, lw=0)
    ax.fill_between([-0.05, t], -0.05, t, color="#e76f51", alpha=0.14, lw=0)
    ax.axvline(t, color="k", lw=0.6, ls=":")
    ax.axhline(t, color="k", lw=0.6, ls=":")
    ax.text(0.98, 0.98, "facilitating", ha="right", va="top", fontsize=8, color="#1d6e64")
    ax.text(0.98, 0.02, "irrelevant", ha="right", va="bottom", fontsize=8, color="#735a12")
    ax.text(0.02, 0.02, "interfering", ha="left", va="bottom", fontsize=8, color="#a0402a")
    ax.text(0.02, 0.98, "inconsistent", ha="left", va="top", fontsize=8, color="#666666")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_aspect("equal")
    ax.set_xlabel("G+ (gate fitted toward open, fraction)")
    ax.set_ylabel("G- (gate fitted toward shut, fraction)")
