"""Sweep-wide figures: emergence curves over training, and bifurcation and emergence steps
against the swept parameters."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
from matplotlib.transforms import offset_copy

from dynamics.analysis import ROLES
from dynamics.analysis.pipeline import AnalysisOptions
from dynamics.report.data import _Ctx, _finished, _is_seed, _Section
from dynamics.report.draw import (
    _analysed,
    _curves,
    _figure,
    _fmt,
    _legend,
    _legend_below,
    _missing_runs_sentence,
    _probe_sensitive_sentence,
    _save,
    _short,
    _step_axis,
    _step_axis_sentence,
    _symlog_steps,
    _ticks_at,
    _token_unseen_sentence,
    _voita_sentence,
)

# Swept axes the bifurcation figure plots against, in order, when swept.
_BIFURCATION_AXES = ("model.init_scale", "train.lr", "model.n_heads")


def _emergence_section(ctx: _Ctx) -> _Section:
    runs, out = ctx.runs, ctx.out
    sec = _Section("emergence", "Emergence curves over training")
    done = _analysed(runs)
    note = _missing_runs_sentence(runs, "emergence curves")
    if not done:
        sec.missing.append(note or "Not available: emergence curves because the store holds no runs.")
        if ctx.pending:
            sec.missing.append(_pending_sentence(ctx.pending))
        return sec
    groups = ctx.groups(done)
    undefined = _no_head_pairs(done)
    symlog = _symlog_steps(runs)  # one rule, from every run's schedule: the same axis in each figure
    axis_text = _step_axis_sentence(symlog)
    colour = groups.description()
    spread = ("thick line: mean over seeds; band: range (min-max) over seeds; thin lines: single runs"
              if any(len(m) > 1 for m in groups.members.values()) else "one line per run")
    ragged = _ragged_groups(groups)
    if ragged:  # "(mean of N)" in the legend would otherwise claim N seeds where fewer have reached
        spread += (f" (in {', '.join(ragged)}, not every seed has a value at every step, e.g. a run still going, "
                   f"stopped or diverged: there the mean and band are over the seeds that have one)")
    if diverged := [r.run_id for r in done if r.status == "diverged"]:
        # their lines stopped short of the others' with no mark: only the runs table said why
        spread += (f"; the lines of {len(diverged)} diverged run(s) end at their last snapshot before the divergence: "
                   + ", ".join(diverged[:4]) + (f", and {len(diverged) - 4} more" if len(diverged) > 4 else ""))

    # Slash: the mean best-slash score over heads, and the share of slash-dominant heads. A run
    # whose probes leave no offset to score (context <= 3) has none at any snapshot: left out
    # and named, where it had a legend entry and no line, and the caption a window it never had.
    unscored = _no_slash(done)
    scored = [r for r in done if r.run_id not in unscored]
    if scored:
        fig = _figure(10, 3.6)
        ax1, ax2 = fig.subplots(1, 2)
        best = {r.run_id: (r.analysis["step"].values, r.analysis["best_slash"].mean(("layer", "head")).values)
                for r in scored if "best_slash" in r.analysis}
        dom = {r.run_id: (r.analysis["step"].values,
                          r.analysis["slash_dominant"].astype(float).mean(("layer", "head")).values)
               for r in scored if "slash_dominant" in r.analysis}
        _curves(ax1, groups, best)
        _curves(ax2, groups, dom)
        kappas, kappa_text = _kappas(scored)
        for ax, label in ((ax1, "best slash score, head mean (fraction)"),
                          (ax2, "slash-dominant heads (fraction of heads)")):
            _step_axis(ax, symlog)
            ax.set_ylabel(label)
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        for kappa in kappas:  # one dotted line per threshold the runs were analysed with
            ax1.axhline(kappa, color="grey", ls=":", lw=1)
        _legend(ax1, groups)
        sec.figures.append((_save(fig, out, "emergence_slash.png"),
                            f"Slash pattern against training step, {colour}; {spread}. Left: best slash score "
                            f"(attention on the single best offset {_offset_window(scored)}, Cheng et al. 2026) "
                            f"averaged over heads, dotted: {kappa_text}. "
                            f"Right: fraction of heads that are slash-dominant (best slash score >= kappa)."
                            f"{axis_text}{_no_slash_sentence(unscored, 'this figure')}"))
    else:
        sec.missing.append(f"Not available: slash curves because the probes of every analysed run are {_TOO_SHORT}: "
                           f"{', '.join(unscored)}.")

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
        for ax, role in zip(panels, present, strict=False):
            _curves(ax, groups, {rid: (next(r for r in done if r.run_id == rid).analysis["step"].values, s[role])
                                 for rid, s in shares.items()})
            ax.set_title(role, fontsize=9)
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel("heads with this role (fraction)", fontsize=7)
            _step_axis(ax, symlog)
            ax.xaxis.label.set_fontsize(7)
            ax.grid(alpha=0.3)
        for ax in panels[len(present):]:
            ax.set_visible(False)
        _legend(panels[0], groups)
        sec.figures.append((_save(fig, out, "emergence_roles.png"),
                            f"Fraction of heads holding each role (one label per head, dynamics.analysis.roles) against "
                            f"training step, {colour}; {spread}. Roles that never occur are not drawn."
                            f"{_token_unseen_sentence(done)}{_voita_sentence(done)}{_probe_sensitive_sentence(done)}"
                            f"{axis_text}"))
    else:
        sec.missing.append("Not available: role shares because no analysed run has role labels.")

    fig = _figure(6.5, 3.8)
    ax = fig.subplots()
    div = {r.run_id: (r.analysis["step"].values, r.analysis["mean_divergence"].values) for r in done
           if "mean_divergence" in r.analysis and r.run_id not in undefined}
    _curves(ax, groups, div)
    _step_axis(ax, symlog)
    ax.set_ylabel("mean within-layer JS distance (sqrt(nats))")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend(ax, groups)
    sec.figures.append((_save(fig, out, "emergence_divergence.png"),
                        f"Divergence: JS distance between the attention of heads of the same layer (Clark et al. 2019), "
                        f"averaged over head pairs and layers, against training step, {colour}; {spread}. "
                        f"0 = identical heads; the maximum is sqrt(ln 2) = 0.83.{axis_text}{_no_pairs_sentence(undefined, 'this figure')}"))
    if note:
        sec.missing.append(note)
    if ctx.pending:
        sec.missing.append(_pending_sentence(ctx.pending))
    return sec


def _ragged_groups(groups) -> list[str]:
    """Labels of the groups with several runs whose analysed steps differ: `_curves` aligns such
    runs on the union of their steps, so the mean and band at some steps cover fewer seeds."""
    out = []
    for key in groups.keys:
        members = groups.members[key]
        steps = {tuple(np.asarray(r.analysis["step"].values).tolist()) for r in members}
        if len(members) > 1 and len(steps) > 1:
            out.append(groups.labels[key])
    return out


def _no_head_pairs(runs) -> list[str]:
    """Runs whose within-layer divergence is NaN at every snapshot: one head per layer, so no
    pair of heads to compare and no bifurcation step (undefined, not "never")."""
    return [r.run_id for r in runs if "mean_divergence" in r.analysis and r.analysis.sizes.get("head", 1) == 1
            and not np.isfinite(np.asarray(r.analysis["mean_divergence"].values, dtype=float)).any()]


_TOO_SHORT = ("too short to score any slash offset (no offset that uniform attention or a first-token "
              "sink does not already reach), so their slash scores are undefined, not 0")
"""Why a run has no slash score (`dynamics.analysis.slash.confounded_offsets`), in each caption that leaves it out."""


def _no_slash(runs) -> list[str]:
    """Runs whose best slash score is NaN at every snapshot: probes too short for any offset of
    the window that uniform attention or a first-token sink does not already pass (undefined, not 0)."""
    return [r.run_id for r in runs if "best_slash" in r.analysis
            and not np.isfinite(np.asarray(r.analysis["best_slash"].values, dtype=float)).any()]


def _no_slash_sentence(run_ids: list[str], where: str) -> str:
    if not run_ids:
        return ""
    return f" Left out of {where}: {len(run_ids)} run(s) whose probes are {_TOO_SHORT}: {', '.join(run_ids)}."


def _no_pairs_sentence(run_ids: list[str], where: str) -> str:
    if not run_ids:
        return ""
    return (f" Left out of {where}: {len(run_ids)} run(s) with one head per layer (no pair of heads to compare), "
            f"whose divergence and bifurcation step are undefined, not 'never': {', '.join(run_ids)}.")


def _pending_sentence(pending) -> str:
    return (f"Not available: {len(pending)} run(s) of the sweep index because they have not started yet (pending): "
            f"{', '.join(r.run_id for r in pending)}.")


def _kappas(runs) -> tuple[list[float], str]:
    """The slash-dominance thresholds the runs were analysed with (analysis attr ``kappa``), and
    the caption phrase naming them; the default for runs whose analysis does not say."""
    values = [r.analysis.attrs.get("kappa") if r.analysis is not None else None for r in runs]
    known = sorted({float(v) for v in values if v is not None})
    lacking = any(v is None for v in values)
    if not known:
        default = AnalysisOptions().kappa
        return [default], f"kappa = {default:g}"
    text = "kappa = " + " or ".join(f"{k:g}" for k in known)
    if len(known) > 1:
        text += " (each run's own, from its analysis)"
    if lacking:
        default = AnalysisOptions().kappa
        text += f"; {default:g} assumed for the runs whose analysis does not say"
        known = sorted({*known, default})
    return known, text


def _offset_window(runs) -> str:
    """The offsets the best slash score was taken over, from the analyses' ``slash_offsets`` attrs.

    `analyse_run` takes it over offsets slash_min_offset .. T // 2 (T: the context; the slash
    role's window), so the window depends on the run; named per window when runs differ.
    """
    default = AnalysisOptions()
    windows = []
    for r in runs:
        value = r.analysis.attrs.get("slash_offsets") if r.analysis is not None else None
        windows.append(tuple(int(v) for v in value) if value is not None and len(value) == 2 else None)
    known = sorted({w for w in windows if w is not None})
    fallback = f"{default.slash_min_offset}..T // 2, T: context length"
    if not known:
        return f"in {fallback}"
    text = " or ".join(f"{lo}..{hi}" for lo, hi in known)
    if len(known) > 1:
        text += f" (per run: {default.slash_min_offset}..T // 2 for context T)"
    if None in windows:
        text += f"; {fallback} for the runs whose analysis does not say"
    return f"in {text}"


def _bifurcation_section(ctx: _Ctx) -> _Section:
    runs, axes, out = ctx.runs, ctx.axes, ctx.out
    sec = _Section("bifurcation", "Bifurcation and emergence steps against swept parameters")
    done = _analysed(runs)
    swept = [a for a in _BIFURCATION_AXES if a in axes]
    if not swept:  # none of the three: fall back on any other numeric swept axis
        swept = [a for a in axes if not _is_seed(a)
                 and all(isinstance(r.params.get(a), (int, float)) and not isinstance(r.params.get(a), bool) for r in runs)]
    if not swept:  # then on a categorical one, its values in the order they first appear (model.pos: positional.toml's question)
        swept = [a for a in axes if not _is_seed(a) and all(isinstance(r.params.get(a), (str, bool)) for r in runs)]
    categories = {a: list(dict.fromkeys(r.params[a] for r in runs)) for a in swept
                  if any(not isinstance(r.params.get(a), (int, float)) or isinstance(r.params.get(a), bool) for r in runs)}
    if not swept:
        index_axes = sorted({a for r in runs for a in r.params})
        why = (f"among the {len(runs)} run(s) in the store only {', '.join(axes)} varies (sweep axes: "
               f"{', '.join(index_axes)})" if axes else
               f"no swept value varies among the {len(runs)} run(s) in the store" if index_axes else
               "the store has no sweep index")
        sec.missing.append(f"Not available: bifurcation and emergence steps against a swept parameter because {why}."
                           + _event_listing(done))
        return sec
    if not done:
        sec.missing.append(_missing_runs_sentence(runs, "bifurcation and emergence steps") or "Not available: no runs.")
        if ctx.pending:
            sec.missing.append(_pending_sentence(ctx.pending))
        return sec
    groups = ctx.groups(done)
    rows = (("bifurcation_step", "bifurcation step (steps)"),
            ("slash_emergence_step", "first slash-dominant head (steps)"))
    undefined, unscored = _no_head_pairs(done), _no_slash(done)
    # a run with no slash score (context <= 3) has no slash emergence: undefined, not "never"
    points = {var: _event_steps(done, var, skip=undefined if var == "bifurcation_step" else unscored)
              for var, _ in rows}
    fig = _figure(3.6 * len(swept) + 0.4, 6.0)
    grid = fig.subplots(2, len(swept), squeeze=False)
    top = max(float(np.nanmax(r.analysis["step"].values)) for r in done)
    # 0.15 x top above it, so "never"'s tick label clears the last step's
    never_y, not_yet_y = top * 1.15, top * 1.28
    counted: dict = {}  # axes -> [(x, y, n)]: the marks n > 1 runs share, labelled once the layout is final
    for j, axis in enumerate(swept):
        for i, (var, ylabel) in enumerate(rows):
            ax = grid[i, j]
            drawn = {"never": False, "not yet": False}
            means: dict[float, list[float]] = {}
            # runs at one swept value often share a step (snapshots are sparse): their marks lie
            # exactly on one another, and one dot read as one run
            stacked: collections.Counter = collections.Counter()
            bars: dict[float, list] = {}
            cats = categories.get(axis)
            for r, y in points[var]:
                x = r.params.get(axis)
                if cats is not None:
                    x = cats.index(x) if x in cats else None
                if not isinstance(x, (int, float)) or isinstance(x, bool):
                    continue
                key = groups.key_of(r)
                colour, marker, finished = groups.colours[key], groups.markers[key], _finished(r)
                stacked[float(x), y if math.isfinite(y) else never_y if finished else not_yet_y] += 1
                bar = _probe_bar(r) if var == "bifurcation_step" and finished else None
                if bar is not None:  # the step's 5%-95% range over resampled probes; "never" as its row
                    low, high = (never_y if math.isnan(v) else v for v in bar)
                    bars.setdefault(float(x), []).append((low, high, colour))
                    drawn["never"] |= high == never_y  # the row it reaches is named, as a cross's is
                if math.isfinite(y):
                    # Filled: a finished run; hollow: unfinished, its step may still move or vanish.
                    # Larger and on top, so a hollow mark stays visible over a finished run at the same point.
                    ax.scatter([float(x)], [y], marker=marker, s=30 if finished else 60, zorder=3 if finished else 4,
                               lw=0.4 if finished else 1.1, facecolor=colour if finished else "none",
                               edgecolor="k" if finished else colour)
                    if finished:
                        means.setdefault(float(x), []).append(y)
                elif finished:
                    ax.scatter([float(x)], [never_y], marker="x", color="crimson", s=30, zorder=3)
                    drawn["never"] = True
                else:
                    ax.scatter([float(x)], [not_yet_y], marker=marker, s=60, zorder=4, facecolor="none",
                               edgecolor=colour, lw=1.1)
                    drawn["not yet"] = True
            counted[ax] = [(x, y, n) for (x, y), n in stacked.items() if n > 1]
            for x, at_x in bars.items():  # side by side, 3 points apart: runs at one value drew one bar of their union
                for k, (low, high, colour) in enumerate(at_x):
                    shift = offset_copy(ax.transData, fig=fig, x=3.0 * (k - (len(at_x) - 1) / 2), units="points")
                    ax.vlines(x, low, high, color=colour, lw=1.2, alpha=0.55, zorder=2, transform=shift)
            if means:
                mx = sorted(means)
                # a marker too: events at one swept value give a one-point "line", drawn as nothing
                ax.plot(mx, [np.mean(means[x]) for x in mx], color="k", lw=1, alpha=0.6, zorder=2, marker="_", ms=14,
                        ls="none" if cats is not None else "-")  # no line between categories: no order to follow
            values = sorted({float(r.params[axis]) for r in runs if isinstance(r.params.get(axis), (int, float))})
            if cats is not None:
                ax.set_xticks(range(len(cats)), [_fmt(c) for c in cats])
                ax.set_xlim(-0.5, len(cats) - 0.5)
            elif values and min(values) > 0 and max(values) / min(values) >= 8:
                ax.set_xscale("log", base=2 if axis != "train.lr" else 10)
            if cats is None and 0 < len(values) <= 12:
                # ticks at the values swept, as written: matplotlib's put 1.5 heads per layer, 2^-1 for 0.5,
                # and left lr 3e-3 between 10^-3 and 10^-2 unlabelled
                _ticks_at(ax, values)
            ax.set_xlabel(f"{_short(axis)} ({'learning rate' if axis == 'train.lr' else 'multiplier' if axis == 'model.init_scale' else 'heads per layer' if axis == 'model.n_heads' else 'swept value'})")
            ax.set_ylabel(ylabel)
            ax.set_ylim(-0.03 * top, top * 1.38)
            extra = [(y, name) for y, name in ((never_y, "never"), (not_yet_y, "not yet")) if drawn[name]]
            if extra:  # name the rows the "never" / "not yet" marks sit on (dropping step ticks among them)
                # the last step's tick stays: "never" sits 0.15 x top above it (a strict test of that
                # gap, in floating point, dropped it, and the highest marks sat at an unlabelled height)
                ticks = [t for t in ax.get_yticks() if -0.03 * top <= t <= top]
                ax.set_yticks([*ticks, *(y for y, _ in extra)], [f"{t:g}" for t in ticks] + [n for _, n in extra])
            ax.grid(alpha=0.3)
    _bifurcation_legend(fig, groups, points)
    _count_labels(fig, counted)
    sec.figures.append((_save(fig, out, "bifurcation.png"),
                        _bifurcation_caption(groups, points) + _pooled_sentence(done, swept, groups.group_axes)
                        + _no_pairs_sentence(undefined, "the top row")
                        + _no_slash_sentence(unscored, "the bottom row")))
    note = _missing_runs_sentence(runs, "bifurcation points")
    if note:
        sec.missing.append(note)
    if ctx.pending:
        sec.missing.append(_pending_sentence(ctx.pending))
    return sec


def _probe_bar(run) -> tuple[float, float] | None:
    """The run's bifurcation step's range over resampled probes (low, high; NaN: never) where it
    differs from the step, as `dynamics analyse` shows it; None for an analysis without it (one
    probe, or an older one)."""
    from dynamics.analysis.probe_resample import probe_range

    if "bifurcation_resampled" not in run.analysis or "bifurcation_step" not in run.analysis:
        return None
    low, high = (float(v) for v in probe_range(run.analysis["bifurcation_resampled"]).values)
    step = float(np.nanmin(run.analysis["bifurcation_step"].values)) if np.isfinite(
        run.analysis["bifurcation_step"].values).any() else np.nan
    same = [a == step or (math.isnan(a) and math.isnan(step)) for a in (low, high)]
    return None if all(same) else (low, high)


def _step_text(value) -> str:
    value = np.asarray(value, dtype=float)
    return f"{np.nanmin(value):g}" if value.size and np.isfinite(value).any() else "never"


def _layer_steps(run) -> str | None:
    """", by layer: 32, never": each layer's bifurcation step, where one differs from the run's."""
    a = run.analysis
    if "layer_bifurcation_step" not in a or "bifurcation_step" not in a:
        return None
    layers = [_step_text(v) for v in np.atleast_1d(np.asarray(a["layer_bifurcation_step"].values, dtype=float))]
    return f"by layer: {', '.join(layers)}" if any(x != _step_text(a["bifurcation_step"].values) for x in layers) else None


def _said(run, var: str, undefined: bool) -> str:
    """A run's step of `var` as the figure tells it: undefined, the step, never, or not yet."""
    text = "undefined" if undefined else _step_text(run.analysis[var].values)
    return "not yet" if text == "never" and not _finished(run) else text


def _event_listing(done) -> str:
    """Each analysed run's steps, where no swept axis gives the figure (a store of `dynamics run`s):
    the page had none of them, while `dynamics analyse` prints them. As the figure: undefined
    where there is nothing to measure, "not yet" (and provisional) for a run still unfinished."""
    parts, pairless, slashless = [], set(_no_head_pairs(done)), set(_no_slash(done))
    for r in done[:12]:
        a = r.analysis
        if "bifurcation_step" not in a:
            continue

        # as `dynamics analyse` says it: the range over resampled probes, then the layers' steps
        bar = None if r.run_id in pairless or not _finished(r) else _probe_bar(r)
        said = [f"probes: {'-'.join(_step_text(v) for v in bar)}"] if bar else []
        said += [] if r.run_id in pairless or (layers := _layer_steps(r)) is None else [layers]
        text = (f"{r.run_id}{'' if _finished(r) else f' ({r.status}: provisional)'}: bifurcation "
                f"{_said(r, 'bifurcation_step', r.run_id in pairless)}" + (f" ({'; '.join(said)})" if said else ""))
        if "slash_emergence_step" in a:
            text += f", first slash-dominant head {_said(r, 'slash_emergence_step', r.run_id in slashless)}"
        parts.append(text)
    more = f"; and {len(done) - 12} more run(s)" if len(done) > 12 else ""
    return f" The steps, per run ({RUN_STEPS_RULE}): {'; '.join(parts)}{more}." if parts else ""


RUN_STEPS_RULE = ("bifurcation: the step the mean within-layer divergence leaves its initial noise band for good, a "
                  "split or a collapse, with its 5% to 95% range over 200 bootstrap resamples of the probes where that "
                  "differs; first slash-dominant head: from which one stays slash-dominant")


def _event_steps(runs, var: str, skip=()) -> list[tuple]:
    """(run, first step of the event or NaN: not reached) of every run whose analysis has `var`,
    except the runs in `skip` (where the event is undefined)."""
    out = []
    for r in runs:
        if var not in r.analysis or r.run_id in skip:
            continue
        value = np.asarray(r.analysis[var].values, dtype=float)
        out.append((r, float(np.nanmin(value)) if value.size and np.isfinite(value).any() else math.nan))
    return out


_LABEL_PT = 9.0  # height of a count label (7 pt type) and the gap between two, in points
_LABEL_GAP = 8.0  # from the mark's centre to its label's near edge, in points: clears the mean's "_" (14 pt wide)


def _count_labels(fig, counted: dict) -> None:
    """Label each mark that several runs share with "\u00d7n", beside it, no two labels overlapping.

    Runs of one swept value that reach the event at close steps (the dense early snapshots)
    give marks a few points apart: labels set above each overlapped into an unreadable smear
    (a 12-seed sweep's, bifurcating between steps 4 and 16). Each label sits level with its
    mark, right of it (left at the axes' right edge); where labels would overlap they are
    spread apart in one column, centred on their marks, each joined to its mark by a thin line.
    Positions need the figure's final layout, so it is drawn (not rendered) first.
    """
    if not any(counted.values()):
        return
    fig.draw_without_rendering()
    scale = 72.0 / fig.dpi  # pixels -> points
    for ax, items in counted.items():
        box = ax.get_window_extent()
        columns: dict = {}
        for x, y, n in items:
            px, py = ax.transData.transform((x, y))
            columns.setdefault(round(float(px), 1), []).append((float(py) * scale, x, y, n))
        for px, column in columns.items():
            # right of the marks, unless a label (up to "\u00d7999", about 18 pt) would cross the axes' right edge
            left = (box.x1 - px) * scale < _LABEL_GAP + 18
            column.sort()
            placed = _spread([c[0] for c in column], _LABEL_PT, box.y0 * scale + _LABEL_PT / 2,
                             box.y1 * scale - _LABEL_PT / 2)
            for (want, x, y, n), at in zip(column, placed, strict=True):
                moved = abs(at - want) > 1.0
                ax.annotate(f"\u00d7{n}", (x, y), xytext=(-_LABEL_GAP if left else _LABEL_GAP, at - want),
                            textcoords="offset points", fontsize=7, ha="right" if left else "left", va="center",
                            zorder=5, arrowprops=dict(arrowstyle="-", lw=0.4, color="0.45", shrinkA=0, shrinkB=3)
                            if moved else None)


def _spread(wanted: list[float], height: float, low: float, high: float) -> list[float]:
    """Centres for labels of `height` wanted at the sorted centres `wanted`, no two closer than
    `height`, as near their wants as that allows (least squares), and within [low, high] where
    they fit; where they do not, from `low` up.

    With ``y_i = x_i - i * height`` the spacing is ``y`` non-decreasing and the bounds the same
    for every ``y_i``, so the answer is the isotonic fit of ``want_i - i * height`` (pool adjacent
    violators: overlapping labels merged into runs, each centred on the mean of its wants),
    clipped to the bounds. Shifting the whole column instead left a label past `high` where
    crowds at both ends met (five labels of 9 in 91 points: one at 99.3 of 95.5)."""
    blocks: list[list[float]] = []  # [mean of the run's y, count]
    for i, w in enumerate(wanted):
        blocks.append([w - i * height, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            b = blocks.pop()
            a = blocks[-1]
            a[0], a[1] = (a[0] * a[1] + b[0] * b[1]) / (a[1] + b[1]), a[1] + b[1]
    top = high - (len(wanted) - 1) * height  # the highest y the last label allows
    fit = [min(max(m, low), top) if top >= low else low for m, count in blocks for _ in range(int(count))]
    return [y + i * height for i, y in enumerate(fit)]


def _bifurcation_legend(fig, groups, points) -> None:
    """One legend for the figure: the run groups, and what each kind of mark means."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="none", marker=groups.markers[k], color=groups.colours[k], markeredgecolor="k",
                      markeredgewidth=0.4, label=groups.legend_label(k)) for k in groups.keys]
    everything = [p for rows in points.values() for p in rows]
    unfinished = any(not _finished(r) for r, _ in everything)
    handles.append(Line2D([], [], color="k", lw=1, alpha=0.6, label="mean over the finished runs where it happened"))
    if any(_finished(r) and not math.isfinite(y) for r, y in everything):
        handles.append(Line2D([], [], ls="none", marker="x", color="crimson", label="never (finished run)"))
    if unfinished:
        handles.append(Line2D([], [], ls="none", marker="o", markerfacecolor="none", markeredgecolor="grey",
                              label="hollow: unfinished run (provisional; top row: not yet)"))
    _legend_below(fig, handles, groups.title)


def _pooled_sentence(runs, swept: list[str], group_axes: list[str]) -> str:
    """Where a panel's mean line pools runs at one of its values that differ in another setting:
    a store of several base configs averaged 1- and 2-layer induction with offset_copy there, and
    only the marks told them apart."""
    pooled = set()
    for axis in swept:
        at: dict[str, list] = {}
        for r in runs:
            at.setdefault(json.dumps(r.params.get(axis)), []).append(r)
        pooled |= {b for b in group_axes if b != axis
                   and any(len({json.dumps(r.params.get(b)) for r in rs}) > 1 for rs in at.values())}
    if not pooled:
        return ""
    return (f" Each line pools, at a value of its panel's parameter, runs that differ in "
            f"{', '.join(_short(b) for b in sorted(pooled))}: a mean over those groups, not within one (the marks "
            f"tell the groups apart).")


def _bifurcation_caption(groups, points) -> str:
    counts = []
    for var, name in (("bifurcation_step", "bifurcation"), ("slash_emergence_step", "slash emergence")):
        rows = points.get(var, [])
        fin = [(r, y) for r, y in rows if _finished(r)]
        never = sum(not math.isfinite(y) for _, y in fin)
        unf = [(r, y) for r, y in rows if not _finished(r)]
        not_yet = sum(not math.isfinite(y) for _, y in unf)
        text = f"{name}: {never} of {len(fin)} finished run(s) never reached it"
        if unf:
            text += f", {not_yet} of {len(unf)} unfinished run(s) not yet"
        counts.append(text)
    unfinished = sorted({(r.run_id, r.status) for rows in points.values() for r, _ in rows if not _finished(r)})
    named = ("Hollow marks: unfinished runs (" + ", ".join(f"{rid} ({status})" for rid, status in unfinished)
             + "), whose step can still move or appear; those without the event sit on the top row, 'not yet', "
               "and are left out of the mean. ") if unfinished else ""
    # "never" of the mean, while a layer left its own band (its heads split as another's merged)
    by_layer = [f"{r.run_id} ({layers})" for r, y in points.get("bifurcation_step", [])
                if _finished(r) and not math.isfinite(y) and (layers := _layer_steps(r)) is not None]
    layered = (f"Runs on the 'never' row with a layer that left its own band while the mean over layers stayed in "
               f"its own (a layer can, its change diluted by the others' or offset by them; `dynamics analyse` gives "
               f"each layer's step): "
               f"{', '.join(by_layer[:8])}{f', and {len(by_layer) - 8} more' if len(by_layer) > 8 else ''}. "
               if by_layer else "")
    return ("Top: bifurcation step of each run (the step at which the mean within-layer divergence leaves its "
            "initial noise band for good, rising (heads split) or falling (heads collapse together): the divergence "
            "curves tell which; dynamics.analysis.bifurcation) against each swept parameter. Bottom: "
            f"step at which the first head becomes slash-dominant for good. Marks: runs, {groups.description(scatter=True)} "
            "(the colours of the curves); vertical bars: the 5% to 95% range of a finished run's bifurcation step over "
            "200 bootstrap resamples of its probe sequences, where it spans more than one step (to the 'never' row: "
            "more than 5% of them never left the band), as `dynamics analyse` gives it: the band is set on the probes "
            "themselves, so it holds none of their noise; line: per swept value, the mean over the finished runs where the event "
            "happened (runs where it never happens are not in it); red crosses on the 'never' row: finished runs "
            "where it never happened within the run; \u00d7n beside a mark: n runs at that point. A run whose heads "
            "start far apart (a large init_scale) can stay in its initial band throughout: 'never' there may be "
            "heads split from initialisation, not heads that never split (the divergence curves tell which). "
            "A step among the first snapshots, which set the band: the divergence left its first value for good "
            "there, a split the band it set would date late or not at all (a large learning rate, a sparse schedule). "
            f"{layered}{named}Counts: {'; '.join(counts)}.")
