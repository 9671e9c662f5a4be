"""Sweep-wide figures: emergence curves over training, and bifurcation and emergence steps
against the swept parameters."""

from __future__ import annotations

import math

import numpy as np

from dynamics.analysis import ROLES
from dynamics.analysis.pipeline import AnalysisOptions
from dynamics.report.data import _Ctx, _is_seed, _Section
from dynamics.report.draw import (
    _analysed,
    _curves,
    _figure,
    _groups,
    _legend,
    _missing_runs_sentence,
    _save,
    _short,
    _step_axis,
)

# Swept axes the bifurcation figure plots against, in order, when swept.
_BIFURCATION_AXES = ("model.init_scale", "train.lr", "model.n_heads")


def _emergence_section(ctx: _Ctx) -> _Section:
    runs, axes, out = ctx.runs, ctx.axes, ctx.out
    sec = _Section("emergence", "Emergence curves over training")
    done = _analysed(runs)
    note = _missing_runs_sentence(runs, "emergence curves")
    if not done:
        sec.missing.append(note or "Not available: emergence curves because the store holds no runs.")
        return sec
    groups = _groups(done, axes)
    colour = f"coloured by {_short(groups.colour_axis)}" if groups.colour_axis else "one colour per run (no swept parameter)"
    spread = ("thick line: mean over seeds; band: range (min-max) over seeds; thin lines: single runs"
              if any(len(m) > 1 for m in groups.members.values()) else "one line per run")

    # Slash: the mean best-slash score over heads, and the share of slash-dominant heads.
    fig = _figure(10, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    best = {r.run_id: (r.analysis["step"].values, r.analysis["best_slash"].mean(("layer", "head")).values)
            for r in done if "best_slash" in r.analysis}
    dom = {r.run_id: (r.analysis["step"].values, r.analysis["slash_dominant"].astype(float).mean(("layer", "head")).values)
           for r in done if "slash_dominant" in r.analysis}
    _curves(ax1, groups, best)
    _curves(ax2, groups, dom)
    kappa = AnalysisOptions().kappa
    for ax, label in ((ax1, "best slash score, head mean (fraction)"), (ax2, "slash-dominant heads (fraction of heads)")):
        _step_axis(ax, np.concatenate([r.analysis["step"].values for r in done]))
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    ax1.axhline(kappa, color="grey", ls=":", lw=1)
    _legend(ax1, groups)
    sec.figures.append((_save(fig, out, "figures/emergence_slash.png"),
                        f"Slash pattern against training step, {colour}; {spread}. Left: best slash score "
                        f"(attention on the single best offset >= 1, Cheng et al. 2026) averaged over heads, dotted: kappa = {kappa}. "
                        f"Right: fraction of heads that are slash-dominant (best slash score >= kappa)."))

    # Roles: one panel per role that occurs anywhere.
    shares = {}
    for r in done:
        if "role" not in r.analysis:
            continue
        codes = r.analysis["role"].values  # (snapshot, layer, head) int codes into ROLES
        flat = codes.reshape(codes.shape[0], -1)
        shares[r.run_id] = {role: (flat == i).mean(1) for i, role in enumerate(ROLES)}
    present = [role for role in ROLES if any(s[role].any() for s in shares.values())]
    if present:
        ncol = min(4, len(present))
        nrow = math.ceil(len(present) / ncol)
        fig = _figure(3.1 * ncol + 0.4, 2.6 * nrow + 0.3)
        panels = np.atleast_1d(fig.subplots(nrow, ncol, squeeze=False)).ravel()
        steps_all = np.concatenate([r.analysis["step"].values for r in done])
        for ax, role in zip(panels, present, strict=False):
            _curves(ax, groups, {rid: (next(r for r in done if r.run_id == rid).analysis["step"].values, s[role])
                                 for rid, s in shares.items()})
            ax.set_title(role, fontsize=9)
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel("heads with this role (fraction)", fontsize=7)
            _step_axis(ax, steps_all)
            ax.xaxis.label.set_fontsize(7)
            ax.grid(alpha=0.3)
        for ax in panels[len(present):]:
            ax.set_visible(False)
        _legend(panels[0], groups)
        sec.figures.append((_save(fig, out, "figures/emergence_roles.png"),
                            f"Fraction of heads holding each role (one label per head, dynamics.analysis.roles) against "
                            f"training step, {colour}; {spread}. Roles that never occur are not drawn."))
    else:
        sec.missing.append("Not available: role shares because no analysed run has role labels.")

    fig = _figure(6.5, 3.8)
    ax = fig.subplots()
    div = {r.run_id: (r.analysis["step"].values, r.analysis["mean_divergence"].values) for r in done if "mean_divergence" in r.analysis}
    _curves(ax, groups, div)
    _step_axis(ax, np.concatenate([r.analysis["step"].values for r in done]))
    ax.set_ylabel("mean within-layer JS distance (sqrt(nats))")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(ax, groups)
    sec.figures.append((_save(fig, out, "figures/emergence_divergence.png"),
                        f"Divergence: JS distance between the attention of heads of the same layer (Clark et al. 2019), "
                        f"averaged over head pairs and layers, against training step, {colour}; {spread}. "
                        f"0 = identical heads; the maximum is sqrt(ln 2) = 0.83."))
    if note:
        sec.missing.append(note)
    return sec


def _bifurcation_section(ctx: _Ctx) -> _Section:
    runs, axes, out = ctx.runs, ctx.axes, ctx.out
    sec = _Section("bifurcation", "Bifurcation and emergence steps against swept parameters")
    done = _analysed(runs)
    swept = [a for a in _BIFURCATION_AXES if a in axes]
    if not swept:  # none of the three: fall back on any other numeric swept axis
        swept = [a for a in axes if not _is_seed(a)
                 and all(isinstance(r.params.get(a), (int, float)) and not isinstance(r.params.get(a), bool) for r in runs)]
    if not swept:
        index_axes = sorted({a for r in runs for a in r.params})
        why = (f"among the {len(runs)} run(s) in the store only {', '.join(axes)} varies (sweep axes: "
               f"{', '.join(index_axes)})" if axes else
               f"no swept value varies among the {len(runs)} run(s) in the store" if index_axes else
               "the store has no sweep index")
        sec.missing.append(f"Not available: bifurcation and emergence steps against init_scale, lr or n_heads because {why}.")
        return sec
    if not done:
        sec.missing.append(_missing_runs_sentence(runs, "bifurcation and emergence steps") or "Not available: no runs.")
        return sec
    groups = _groups(done, axes)
    rows = (("bifurcation_step", "bifurcation step (steps)"),
            ("slash_emergence_step", "first slash-dominant head (steps)"))
    fig = _figure(3.6 * len(swept) + 0.4, 6.0)
    grid = fig.subplots(2, len(swept), squeeze=False)
    top = max(float(np.nanmax(r.analysis["step"].values)) for r in done)
    never_y = top * 1.12
    for j, axis in enumerate(swept):
        for i, (var, ylabel) in enumerate(rows):
            ax = grid[i, j]
            xs, ys, cs, nev = [], [], [], []
            for r in done:
                if var not in r.analysis:
                    continue
                value = r.analysis[var].values
                y = float(np.nanmin(value)) if value.size and np.isfinite(value).any() else math.nan
                x = r.params.get(axis)
                if not isinstance(x, (int, float)):
                    continue
                key = next(k for k in groups.keys if r in groups.members[k])
                (xs if math.isfinite(y) else nev).append((float(x), y))
                if math.isfinite(y):
                    ys.append(y)
                    cs.append(groups.colours[key])
            if xs:
                x_arr = np.array([p[0] for p in xs])
                ax.scatter(x_arr, ys, c=cs, s=28, edgecolor="k", lw=0.4, zorder=3)
                means = {}
                for x, y in xs:
                    means.setdefault(x, []).append(y)
                mx = sorted(means)
                ax.plot(mx, [np.mean(means[x]) for x in mx], color="k", lw=1, alpha=0.6, zorder=2, label="mean over runs")
            if nev:
                ax.scatter([p[0] for p in nev], [never_y] * len(nev), marker="x", color="crimson", s=30, zorder=3,
                           label="never (within the run)")
            values = sorted({float(r.params[axis]) for r in runs if isinstance(r.params.get(axis), (int, float))})
            if values and min(values) > 0 and max(values) / min(values) >= 8:
                ax.set_xscale("log", base=2 if axis != "train.lr" else 10)
            ax.set_xlabel(f"{_short(axis)} ({'learning rate' if axis == 'train.lr' else 'multiplier' if axis == 'model.init_scale' else 'heads per layer' if axis == 'model.n_heads' else 'swept value'})")
            ax.set_ylabel(ylabel)
            ax.set_ylim(-0.03 * top, top * 1.18)
            if nev:  # name the row the "never" crosses sit on (dropping step ticks it would overlap)
                ticks = [t for t in ax.get_yticks() if -0.03 * top <= t <= top and never_y - t > 0.1 * top]
                ax.set_yticks([*ticks, never_y], [f"{t:g}" for t in ticks] + ["never"])
            ax.grid(alpha=0.3)
            if i == 0 and j == 0 and (xs or nev):
                ax.legend(fontsize=7, frameon=False, loc="upper right")
    sec.figures.append((_save(fig, out, "figures/bifurcation.png"),
                        "Top: bifurcation step of each run (the step at which the mean within-layer divergence leaves its "
                        "initial noise band for good, dynamics.analysis.bifurcation) against each swept parameter. Bottom: "
                        "step at which the first head becomes slash-dominant for good. Dots: runs (coloured as in the curves); "
                        "line: mean over runs per value; red crosses at the top: runs where it never happens."))
    note = _missing_runs_sentence(runs, "bifurcation points")
    if note:
        sec.missing.append(note)
    return sec
