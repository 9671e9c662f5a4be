"""Drawing helpers shared by the figures: Agg figures, run groups and colours, step axes, curves."""

from __future__ import annotations

import html
import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dynamics.report.data import _is_seed, _Run

_DPI = 90


# --------------------------------------------------------------------------- drawing helpers


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself to the figure: savefig needs a canvas, not pyplot
    return fig


def _save(fig: Figure, out: Path, rel: str) -> str:
    """Write `fig` as the PNG `out`/`rel`: the pixels of ``fig.savefig(out / rel, dpi=_DPI)``.

    savefig first draws the figure with rendering off, so that the layout engine has run, and
    then draws it again, running the constrained layout a second time; one canvas draw does
    both once, and the page's figures took about a fifth less time to write.
    """
    from PIL import Image

    fig.canvas.draw()
    Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).save(out / rel)  # RGBA, as savefig writes it
    return rel


def _short(axis: str) -> str:
    return axis.split(".")[-1]


LABEL_WIDTH = 48
"""Characters in one line of a legend entry or title: a store of runs that differ in 13 settings
drew each entry as one 300-character line, and the figure's panels collapsed to nothing."""


def _wrap(parts: str | list[str], width: int = LABEL_WIDTH) -> str:
    """``parts`` (a list, or a text split at its ", ") joined by ", " and broken after a part's comma
    into lines of at most ``width`` characters where it can be; a part longer than that keeps
    its own line, and a part is never broken (a list value: ``components=['induction', 'markov']``).

    Examples
    --------
    >>> print(_wrap("init_scale=0.5, context=32, d_model=64, n_heads=4", 30))
    init_scale=0.5, context=32,
    d_model=64, n_heads=4
    >>> print(_wrap(["lr=0.01", "components=['induction', 'markov']"], 20))
    lr=0.01,
    components=['induction', 'markov']
    """
    lines: list[str] = []
    for part in parts.split(", ") if isinstance(parts, str) else parts:
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += f", {part}"
        else:
            lines.append(part)
    return ",\n".join(lines)


def _no_mathtext(text: str) -> str:
    """`text` as matplotlib shows it literally: a pair of `$` would start mathtext (a teacher store
    path "runs/$a_$.zarr" swept as an axis raised ValueError and lost the whole section)."""
    return text.replace("$", r"\$")


_CODE = re.compile(r"`([^`]+)`")


def _prose(text: str) -> str:
    """`text` as HTML: escaped, with each `quoted` command or name set as code.

    Notes and captions quote commands the way the terminal output does (`dynamics analyse`);
    escaped alone, the page showed the backticks themselves.
    """
    return _CODE.sub(r"<code>\1</code>", html.escape(text))


def _plain(text: str) -> str:
    """`text` without the backticks that quote code, for places that take no markup (alt text)."""
    return _CODE.sub(r"\1", text)


def _alt(caption: str, most: int = 120) -> str:
    """A figure's alt text: its caption's opening, at most `most` characters, cut between words
    and marked where cut (the caption beside it reads whole); it was cut mid-word ("... over see").

    Example
    -------
    >>> _alt("Divergence over training: the mean of `js_distance` over heads", 40)
    'Divergence over training: the mean of ...'
    """
    text = _plain(caption)
    if len(text) <= most:
        return text
    return text[:most + 1].rsplit(" ", 1)[0].rstrip(" ,;:(") + " ..."


def _fmt(value: Any) -> str:
    if value is None:  # a setting a run lacks (an [intervene] section), as `dynamics status` prints it
        return "none"
    if isinstance(value, float):
        # compact where that is exact; "g" alone keeps 6 digits, and showed lr 1.0000001e-3 as 0.001,
        # the same label as lr 1e-3's
        return short if float(short := f"{value:g}") == value else repr(value)
    return str(value)


# Second channel for groups that share a colour: line style in curves, marker in scatters.
# Distinct dash patterns and filled marker shapes; beyond them, patterns are generated.
VIRIDIS_TOP = 0.6
"""The end of viridis a sweep's colours stop at: its colours there keep 3:1 against white."""

_LINESTYLES = ["-", (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (2, 3)), (0, (9, 2, 1, 2, 1, 2)),
               (0, (3, 1, 3, 4)), (0, (1, 4))]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]


def _linestyle(i: int):
    return _LINESTYLES[i] if i < len(_LINESTYLES) else (0, (2 + i, 2, 1, 2))


def _marker(i: int) -> str:
    return _MARKERS[i % len(_MARKERS)]


@dataclass
class _Groups:
    """Runs grouped by their non-seed swept values; each group one (colour, style) pair.

    The colour follows the first non-seed swept axis (viridis, by rank); the line style in
    curves and the marker in scatters follow the other non-seed axes together, so groups that
    differ only there still look different. Without such axes every run is its own group.
    """

    group_axes: list[str]
    keys: list[tuple]
    members: dict[tuple, list[_Run]]
    colours: dict[tuple, Any]
    styles: dict[tuple, Any]  # matplotlib linestyle
    markers: dict[tuple, str]
    labels: dict[tuple, str]

    @property
    def title(self) -> str:
        """Legend title: which axis the colour and which the line style / marker show."""
        if not self.group_axes:
            return "run"
        if len(self.group_axes) == 1:
            return _short(self.group_axes[0])
        rest = ", ".join(_short(a) for a in self.group_axes[1:])
        return _wrap(f"{_short(self.group_axes[0])} (colour) x {rest} (line style / marker)")

    def description(self, scatter: bool = False) -> str:
        """Caption phrase: how groups are told apart (in curves, or in a scatter: markers)."""
        second = "marker shape" if scatter else "line style"
        if not self.group_axes:
            return "one colour per run (no swept parameter)" + (
                f", then a new {second} every 10 runs" if len(self.keys) > 10 else "")
        if len(self.group_axes) == 1:
            return f"coloured by {_short(self.group_axes[0])}"
        rest = " and ".join(_short(a) for a in self.group_axes[1:])
        return f"coloured by {_short(self.group_axes[0])}, {second} by {rest}"

    def legend_label(self, key: tuple) -> str:
        """`labels[key]` for a legend (drawn as written, never as mathtext)."""
        return _no_mathtext(self.labels[key])

    def key_of(self, run: _Run) -> tuple:
        return _group_key(run, self.group_axes)

    def subset(self, runs: list[_Run]) -> _Groups:
        """The groups of `runs` only, with the colours, styles and labels built for all runs."""
        members: dict[tuple, list[_Run]] = {}
        for r in runs:
            members.setdefault(self.key_of(r), []).append(r)
        unknown = [k for k in members if k not in self.colours]
        if unknown:  # a run the mapping was not built from: rebuild over both (colours may shift)
            full = _groups([*(r for m in self.members.values() for r in m), *runs], self.group_axes)
            return full.subset(runs)
        keys = [k for k in self.keys if k in members]
        return _Groups(self.group_axes, keys, members, self.colours, self.styles, self.markers, self.labels)


def _group_key(run: _Run, group_axes: list[str]) -> tuple:
    return tuple(json.dumps(run.params.get(a)) for a in group_axes) if group_axes else (run.run_id,)


def _groups(runs: list[_Run], axes: list[str]) -> _Groups:
    """Group by every non-seed swept axis; colour by rank of the first one (viridis), line
    style and marker by rank of the others together.

    Rank, not value, sets the colour so a geometric grid (0.5, 1, 2, 4) spreads evenly.
    Without a sweep index every run is its own group (tab10, and a line style and marker cycling
    with a period of 8).
    """
    from matplotlib import colormaps

    group_axes = [a for a in axes if not _is_seed(a)]
    members: dict[tuple, list[_Run]] = {}
    for r in runs:
        members.setdefault(_group_key(r, group_axes), []).append(r)

    def sort_key(key):
        return tuple((0, float(v), "") if _is_number(v) else (1, 0.0, v) for v in key)

    keys = sorted(members, key=sort_key)
    if group_axes:
        cmap = colormaps["viridis"]
        firsts = sorted({k[0] for k in keys}, key=lambda v: sort_key((v,)))
        # up to VIRIDIS_TOP: past it viridis is too pale on white (0.9's yellow-green 1.5:1, the
        # largest swept value all but invisible; 3:1, WCAG's for graphics, holds up to here)
        pos = {v: (i / max(1, len(firsts) - 1)) * VIRIDIS_TOP for i, v in enumerate(firsts)}
        rests = sorted({k[1:] for k in keys}, key=sort_key)
        style_of = {v: i for i, v in enumerate(rests)}
        colours = {k: cmap(pos[k[0]]) for k in keys}
        style_index = {k: style_of[k[1:]] for k in keys}
        labels = {k: _wrap([f"{_short(a)}={_fmt(json.loads(v))}" for a, v in zip(group_axes, k, strict=True)])
                  for k in keys}
    else:
        cmap = colormaps["tab10"]
        colours = {k: cmap(i % 10) for i, k in enumerate(keys)}
        # a style of its own per run too (tab10's green and red are one colour to a deuteranope):
        # the styles' cycle of 8 and the colours' of 10 meet again only after 40 runs
        style_index = {k: i % len(_LINESTYLES) for i, k in enumerate(keys)}
        labels = {k: k[0] for k in keys}
    styles = {k: _linestyle(i) for k, i in style_index.items()}
    markers = {k: _marker(i) for k, i in style_index.items()}
    return _Groups(group_axes, keys, members, colours, styles, markers, labels)


def _is_number(text: str) -> bool:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _symlog_steps(runs: list[_Run]) -> bool:
    """The report's one rule for its step axes: symmetric-log where any run's schedule has a
    snapshot at step 1 (the start of the recorder's geometric phase, record.dense_until >= 1, the
    default), so the steps 1, 2, 4, ... where heads first move are spread out; else linear.

    Read from the runs' schedules, not from the steps a figure draws: a rule on the drawn steps'
    spread (last step > 20 x the first after 0) gave quickstart's 300-step sweep a symmetric-log
    axis and the same sweep at 16 steps a linear one, and could differ between two figures of one
    report (the slash curves leave out the runs they cannot score).
    """
    return any(bool((np.asarray(r.steps) == 1).any()) for r in runs)


def _step_axis(ax, symlog: bool) -> None:
    if symlog:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("symlog", linthresh=1.0, linscale=0.3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 100, not 10^2: steps are counts
        ax.set_xlabel("training step (steps, symmetric-log axis)")
    else:
        ax.set_xlabel("training step (steps, linear axis)")
    ax.set_xlim(left=0)


def _step_axis_sentence(symlog: bool) -> str:
    """The rule `_symlog_steps` applies, for a caption: two reports' step axes differ only by it."""
    rule = ("symmetric-log where a run recorded step 1 (record.dense_until >= 1, the default), "
            "linear where none did")
    if symlog:
        return f" Step axis symmetric-log (linear from 0 to 1, logarithmic above); every report draws it {rule}."
    return f" Step axis linear: no run recorded step 1; every report draws it {rule}."


def _curves(ax, groups: _Groups, series: dict[str, tuple[np.ndarray, np.ndarray]]) -> bool:
    """One thin line per run; per group with several runs, the mean (thick) and min-max band.

    `series` maps run id -> (steps, values). Runs of a group are aligned on the union of
    their steps (a running seed contributes only the steps it has reached).
    """
    drawn = False
    for key in groups.keys:
        colour = groups.colours[key]
        members = [r for r in groups.members[key] if r.run_id in series]
        if not members:
            continue
        style = groups.styles[key]
        for r in members:
            s, v = series[r.run_id]
            ax.plot(s, v, color=colour, ls=style, lw=0.8 if len(members) > 1 else 1.4,
                    alpha=0.45 if len(members) > 1 else 1.0, label=None if len(members) > 1 else groups.legend_label(key))
        if len(members) > 1:
            grid = np.unique(np.concatenate([series[r.run_id][0] for r in members]))
            table = np.full((len(members), grid.size), np.nan)
            for i, r in enumerate(members):
                s, v = series[r.run_id]
                table[i, np.searchsorted(grid, s)] = v
            with np.errstate(all="ignore"), _quiet():
                mean, lo, hi = np.nanmean(table, 0), np.nanmin(table, 0), np.nanmax(table, 0)
            ax.fill_between(grid, lo, hi, color=colour, alpha=0.15, lw=0)
            ax.plot(grid, mean, color=colour, ls=style, lw=2.2, label=f"{groups.legend_label(key)} (mean of {len(members)})")
        drawn = True
    return drawn


class _quiet:
    """Silence numpy's all-NaN-slice warnings (a group may lack a step in every seed)."""

    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


LEGEND_ROWS = 18
"""Entries in one legend column; a legend of more than 8 goes outside the axes, right of the figure."""


def _column_inches(texts: list[str]) -> float:
    """Width of a legend column holding ``texts``: its handle and its longest line, at 7 pt text
    about 0.055 inch a character."""
    return 0.6 + 0.055 * max(len(line) for text in texts for line in text.split("\n"))


def _tallest_column(rows: list[int], ncol: int) -> int:
    """Lines of a legend's tallest column, its entries of ``rows`` lines each dealt out as
    matplotlib deals them into ``ncol`` columns: near-equal counts, the first columns the longer.

    >>> _tallest_column([2, 1, 1, 1, 1], 2)  # columns of 3 and 2 entries
    4
    """
    size, large = divmod(len(rows), ncol)
    sizes = [size + 1] * large + [size] * (ncol - large)
    starts = [sum(sizes[:i]) for i in range(ncol)]
    return max(sum(rows[s:s + n]) for s, n in zip(starts, sizes, strict=True))


def _ticks_at(ax, values: list[float]) -> None:
    """The x axis ticked at ``values``, written as the runs table writes them, where the labels fit
    side by side; where they would run into each other (lr 1e-4, 2e-4, 5e-4, ...: "0.00050.001"),
    matplotlib's own ticks stay, which never do."""
    from matplotlib.ticker import NullLocator

    axis = ax.xaxis
    kept = axis.get_major_locator(), axis.get_major_formatter(), axis.get_minor_locator()
    ax.set_xticks(values, [_fmt(v) for v in values])
    axis.set_minor_locator(NullLocator())
    ax.get_xlim()  # the limits settled (autoscaling is lazy) before positions are read from them
    renderer = ax.figure.canvas.get_renderer()
    centres = [ax.transData.transform((v, 0))[0] for v in values]
    widths = [t.get_window_extent(renderer).width for t in ax.get_xticklabels()]
    pairs = zip(centres, widths, centres[1:], widths[1:], strict=False)  # each label and the next
    if any(c0 + w0 / 2 + 3 > c1 - w1 / 2 for c0, w0, c1, w1 in pairs):
        axis.set_major_locator(kept[0])
        axis.set_major_formatter(kept[1])
        axis.set_minor_locator(kept[2])


def _legend(ax, groups: _Groups) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    # handlelength: long enough to show each line style's dash pattern
    style = dict(title=_no_mathtext(groups.title), fontsize=7, title_fontsize=8, frameon=False, handlelength=3.2)
    rows = [label.count("\n") + 1 for label in labels]  # lines of each entry (wrapped: LABEL_WIDTH)
    fig = ax.figure
    width, height = fig.get_size_inches()
    column = max(1.9, _column_inches([*labels, groups.title]))
    # inside where it is short and no wider than its panel: four 55-character entries covered a
    # roles panel and the next panel's label
    if len(handles) <= 8 and sum(rows) <= 8 and column <= ax.get_position().width * width:
        # framed, half-clear: "best" finds no empty spot among many curves, which ran through the text
        ax.legend(handles, labels, loc="best", **{**style, "frameon": True, "framealpha": 0.8, "edgecolor": "none"})
        return
    # A 5 x 4 sweep's 20 groups inside the axes covered the curves and ran off the figure: outside,
    # in columns, the figure widened (and heightened) for them so that the panels keep their size,
    # by the legend's longest line and its tallest column
    ncol = math.ceil(len(handles) / max(1, LEGEND_ROWS // max(rows)))
    lines = _tallest_column(rows, ncol) + groups.title.count("\n") + 1
    fig.set_size_inches(width + column * ncol, max(height, 0.15 * lines + 0.9))
    fig.legend(handles, labels, loc="outside right upper", ncol=ncol, **style)


def _legend_below(fig, handles: list, title: str) -> None:
    """One legend for the figure, below its panels: as many columns as fit the figure's width, each
    as wide as the longest line (7 pt text: about 0.055 inch a character), and the figure taller by
    the legend's lines, so that the panels keep their height (a 42-group sweep's rows, or entries
    wrapped over 5 lines, crushed them; anchored below one panel, a legend squeezed that panel)."""
    labels = [h.get_label() for h in handles]
    ncol = max(1, min(len(handles), int(fig.get_figwidth() // max(2.7, _column_inches([*labels, title])))))
    lines = _tallest_column([label.count("\n") + 1 for label in labels], ncol) + title.count("\n")
    fig.set_size_inches(fig.get_figwidth(), fig.get_figheight() + 0.15 * lines)
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=7, frameon=False,
               title=_no_mathtext(title), title_fontsize=7)


def _analysed(runs: list[_Run]) -> list[_Run]:
    return [r for r in runs if r.analysis is not None]


def _missing_runs_sentence(runs: list[_Run], what: str) -> str | None:
    lacking = [r for r in runs if r.analysis is None]
    if not lacking:
        return None
    names = "; ".join(f"{r.run_id} ({r.status}: {r.analysis_note})" for r in lacking)
    return f"Not available: {what} for {len(lacking)} run(s) because they have no analysis: {names}."


def _token_unseen(run: _Run) -> int | None:
    """The token id the token role looks for where none of `run`'s probe sequences holds it, else
    None: as `dynamics.analysis.pipeline.summary_row`'s ``token_unseen``, from the analysis's
    ``token_share`` (NaN at every head and snapshot: no visible occurrence to share attention on)."""
    if run.analysis is None or "token_share" not in run.analysis:
        return None
    share = np.asarray(run.analysis["token_share"].values, dtype=float)
    if share.size and np.isnan(share).all():
        return int(run.analysis.attrs.get("token_id", ord("/")))
    return None


def _token_unseen_sentence(runs: list[_Run], chosen: bool = False) -> str:
    """The note `dynamics analyse` prints under its table, for a caption that shows roles: a count of
    0 token heads, or no token panel, is otherwise read as a finding. `chosen`: of one run."""
    unseen = {r.run_id: t for r in runs if (t := _token_unseen(r)) is not None}
    if not unseen:
        return ""
    ids = ", ".join(str(t) for t in sorted(set(unseen.values())))
    why = "(a vocabulary without it, or too few probes: record.n_probe)"
    if chosen:
        return (f" Token {ids} is in none of this run's probe sequences, so none of its heads can be measured as a "
                f"token head {why}: no 'token' label here is no finding.")
    if len(runs) == 1:  # "of any of these 1 runs ... none of their heads"
        return (f" Token roles: token {ids} is in no probe sequence of this run, so none of its heads can be "
                f"measured as a token head {why}: a missing or empty token panel here is no finding.")
    which = (f"any of these {len(unseen)} runs" if len(unseen) == len(runs) else f"{len(unseen)} of these {len(runs)} "
             f"runs ({', '.join(list(unseen)[:8])}{f', and {len(unseen) - 8} more' if len(unseen) > 8 else ''})")
    return (f" Token roles: token {ids} is in no probe sequence of {which}, so none of their heads can be "
            f"measured as a token head {why}: a missing or empty token panel there is no finding.")


def _peak_not_previous_token(run: _Run) -> int:
    """`summary_row`'s ``peak_not_previous_token`` of `run`, at its last analysed snapshot (0 unread)."""
    from dynamics.analysis.positional import missed_previous_token

    a = run.analysis
    if a is None or "previous_token_peak" not in a or "role" not in a or not a.sizes.get("snapshot"):
        return 0
    last = a.isel(snapshot=-1)
    return missed_previous_token(last["previous_token_peak"].values, last["role"].values)


def _voita_sentence(runs: list[_Run], chosen: bool = False) -> str:
    """The note `dynamics analyse` prints under its table on previous-token heads by Voita et al.'s
    rule that are labelled otherwise, for a caption that shows roles. `chosen`: of one run."""
    counts = {r.run_id: n for r in runs if (n := _peak_not_previous_token(r))}
    if not counts:
        return ""
    from dynamics.analysis.positional import MISSED_NOTE

    rule = f"{MISSED_NOTE}; the analysis's previous_token_peak names them"
    if chosen:
        return f" {sum(counts.values())} head(s) of this run {rule}."
    named = ", ".join(f"{rid} ({n})" for rid, n in list(counts.items())[:8]) + (
        f", and {len(counts) - 8} more run(s)" if len(counts) > 8 else "")
    return f" Previous-token heads: {sum(counts.values())} head(s) {rule}: {named}."


def _probe_sensitive(run: _Run) -> list[dict]:
    """`summary_row`'s ``probe_sensitive_roles`` of `run`, at its last analysed snapshot ([] unread)."""
    from dynamics.analysis.roles import probe_sensitive_heads

    a = run.analysis
    if a is None or "role_resampled" not in a or "role" not in a or not a.sizes.get("snapshot"):
        return []
    return probe_sensitive_heads(a["role"].isel(snapshot=-1), a["role_resampled"])


def _probe_sensitive_sentence(runs: list[_Run], chosen: bool = False) -> str:
    """The note `dynamics analyse` prints under its table on heads whose final label fewer than 90%
    of the probe resamples give, for a caption that shows roles. `chosen`: of one run, head by head."""
    heads = {r.run_id: found for r in runs if (found := _probe_sensitive(r))}
    if not heads:
        return ""
    from dynamics.analysis.probe_resample import LABEL_AGREEMENT, N_RESAMPLES
    from dynamics.analysis.roles import probe_sensitive_text

    rule = (f"get their final label on fewer than {LABEL_AGREEMENT:.0%} of {N_RESAMPLES} bootstrap resamples of "
            f"their run's probe sequences, so other probes like these may label them otherwise (role_resampled)")
    if chosen:
        found = next(iter(heads.values()))
        named = ", ".join(map(probe_sensitive_text, found))
        return f" Probe-sensitive roles: {len(found)} head(s) of this run {rule}: {named}."
    named = ", ".join(f"{rid} ({len(found)})" for rid, found in list(heads.items())[:8]) + (
        f", and {len(heads) - 8} more run(s)" if len(heads) > 8 else "")
    return f" Probe-sensitive roles: {sum(map(len, heads.values()))} head(s) {rule}: {named}."


def _warn(note: str) -> None:
    """A note for a caller who passed no handler for it: a RuntimeWarning, not a line on stdout."""
    warnings.warn(note, RuntimeWarning, stacklevel=3)
