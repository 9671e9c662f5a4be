"""The report: PNG figures (matplotlib, Agg) and one self-contained HTML page per store.

``write_report(store, out_dir)`` writes ``out_dir/index.html`` and ``out_dir/figures/*.png``.
The page opens from ``file://`` with no server: its script is inline, plain JavaScript, and
loads nothing from the network. It shows

1. the attention maps of every head of one run, one PNG per snapshot, scrubbed with a step
   slider (the reader watches the heads specialise);
2. emergence curves against training step for every run (slash score, share of each role,
   mean within-layer JS divergence), coloured by a swept parameter, with the mean and range
   over seeds;
3. bifurcation and slash-emergence steps against the swept init_scale, lr and n_heads;
4. the redundancy dendrogram and the JS distance matrix of one run at its last snapshot;
5. causal head gating: G+ against G- per head with the taxonomy regions (Nam et al. 2025,
   Figure 1c) and the same over training (the runs' recorded ``chg``, or
   ``derived/gates.<run_id>`` written by ``dynamics gates``);
6. the early-role predictor's metric against horizon (``derived/predict.<target>``, written by
   ``dynamics predict``).

Partial stores
--------------
A sweep may still be running. The page never fails on a missing part: it says
"Not available: <what> because <why>" in its place. Runs without stored analysis are
analysed here, in memory, on the snapshots recorded so far (``compute_missing=True``, the
default; nothing is written to the store, so a report never races a running sweep); the
runs table says which runs were analysed this way. With ``compute_missing=False`` those runs
are left out of the analysis figures and named as missing.

Sources: Nam, Conklin, Yang, Griffiths, Cohen, Leslie 2025, "Causal Head Gating"
(arXiv 2505.13737, the G+/G- taxonomy, threshold 0.5); Clark et al. 2019 (JS distances and
clustering); Cheng et al. 2026 (slash scores). See docs in :mod:`dynamics.analysis`.

This module never imports torch (nor pyplot: figures are drawn on ``matplotlib.figure.Figure``
with the Agg canvas, so the caller's backend is left alone).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dynamics import store
from dynamics.analysis import ROLES, analyse_run, linkage_matrix
from dynamics.analysis.pipeline import AnalysisOptions

__all__ = ["CHG_LABELS", "CHG_THRESHOLD", "chg_label", "write_report"]

CHG_THRESHOLD = 0.5
"""Gate value separating "high" from "low" G+ / G- (Nam et al. 2025, Figure 1c)."""

CHG_LABELS = ("facilitating", "irrelevant", "interfering", "inconsistent", "unfitted")
"""CHG taxonomy, as ``dynamics.gates.CHG_ROLES``: G+ and G- high; G+ high, G- low; both low;
G+ low, G- high (contradicts both fits); no fit (NaN)."""

# Analysis variables the sweep-wide figures read for every run (small: no query/key dims).
_RUN_VARS = ("best_slash", "slash_dominant", "role", "mean_divergence", "bifurcation_step", "slash_emergence_step")
# Swept axes the bifurcation figure plots against, in order, when swept.
_BIFURCATION_AXES = ("model.init_scale", "train.lr", "model.n_heads")
_DPI = 90
_MIN_SNAPSHOTS = AnalysisOptions().baseline_snapshots + 1  # bifurcation_step needs more than the baseline


# --------------------------------------------------------------------------- collected data


@dataclass
class _Run:
    """What the report knows about one run."""

    run_id: str
    status: str
    params: dict[str, Any]
    last_loss: float | None
    n_snapshots: int
    recorded: np.ndarray  # bool (snapshot,): snapshot holds data (a running sweep fills them in order)
    steps: np.ndarray  # int (snapshot,): the step coordinate of every snapshot
    analysis: xr.Dataset | None = None  # _RUN_VARS, loaded; on the analysed snapshots
    analysis_source: str = "missing"  # stored | computed | missing
    analysis_note: str = ""

    @property
    def n_recorded(self) -> int:
        return int(self.recorded.sum())


@dataclass
class _Section:
    """One block of the page: a heading, figures (or a reason they are missing) and captions."""

    anchor: str
    title: str
    figures: list[tuple[str, str]] = field(default_factory=list)  # (relative png path, caption)
    missing: list[str] = field(default_factory=list)  # "Not available: ..." sentences
    html: str = ""  # extra markup (the slider block)


@dataclass
class _Ctx:
    """Everything the sections share; the chosen run's analysis is computed once, on demand."""

    path: Any
    runs: list[_Run]
    chosen: str | None
    axes: list[str]
    out: Path
    compute_missing: bool
    _chosen: tuple | None = None
    _derived: list[str] | None = None

    def chosen_analysis(self) -> tuple[xr.Dataset | None, str]:
        if self._chosen is None:
            run = next((r for r in self.runs if r.run_id == self.chosen), None)
            self._chosen = (None, "the store holds no runs") if run is None else _chosen_analysis(
                self.path, run, self.compute_missing)
        return self._chosen

    def derived(self) -> list[str]:
        if self._derived is None:
            self._derived = _derived_names(self.path)
        return self._derived


# --------------------------------------------------------------------------- public API


def write_report(
    store_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    run_id: str | None = None,
    *,
    compute_missing: bool = True,
) -> Path:
    """Write the HTML report of a store: ``out_dir/index.html`` plus ``out_dir/figures/``.

    Parameters
    ----------
    store_path : str or PathLike
        A dynamics store (local path or fsspec URL); only read.
    out_dir : str or PathLike
        Local directory, created if missing. ``index.html`` and ``figures/`` in it are
        replaced; nothing else in it is touched.
    run_id : str, optional
        The run whose attention maps, dendrogram and JS matrix are shown. Default: the
        completed run with the median final loss (a typical run, not the luckiest seed);
        without completed runs, the one with the most recorded snapshots.
    compute_missing : bool
        Analyse runs that have no stored analysis in memory, on their recorded snapshots
        (True), or name them as missing (False).

    Returns
    -------
    Path
        ``out_dir/index.html``; open it in a browser (``file://`` works).

    Raises
    ------
    StoreError
        If `store_path` is not a store, or `run_id` is not one of its runs.

    Example
    -------
    >>> page = write_report("runs/quickstart.zarr", "runs/quickstart-report")  # doctest: +SKIP
    >>> print(page.as_uri())  # doctest: +SKIP
    """
    if not store.is_store(store_path):
        raise store.StoreError(f"not a dynamics store: {store_path}")
    ids = store.list_runs(store_path)
    if run_id is not None and run_id not in ids:
        raise store.StoreError(f"no run {run_id!r} in {store_path}; runs: {', '.join(ids) or '(none)'}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise store.StoreError(f"report directory {out} exists and is not a directory")
    figdir = out / "figures"
    (figdir / "attention").mkdir(parents=True, exist_ok=True)
    for old in [*figdir.glob("*.png"), *(figdir / "attention").glob("*.png")]:
        old.unlink()  # frames of an earlier report of a longer run would otherwise linger

    index = store.read_sweep_index(store_path)
    runs = [_collect_or_note(store_path, rid, index, compute_missing) for rid in ids]
    chosen = run_id or _choose_run(runs)
    axes = _colour_axes(runs, index)

    ctx = _Ctx(store_path, runs, chosen, axes, out, compute_missing)
    sections = [_safe(make, ctx) for make in (_attention_section, _emergence_section, _bifurcation_section,
                                               _redundancy_section, _chg_section, _predict_section)]

    page = out / "index.html"
    table_axes = list((index or {}).get("axes", []))  # every swept axis, varied among these runs or not
    page.write_text(_page(store_path, runs, chosen, table_axes, sections, compute_missing), encoding="utf-8")
    return page


def _choose_run(runs: list[_Run]) -> str | None:
    """Default run of the per-run figures: the completed run with the median final loss.

    The median (lower median for an even count) shows a typical run rather than the luckiest
    seed. Without completed runs, the run with the most recorded snapshots; None for no runs.
    """
    done = [r for r in runs if r.status == "completed" and r.last_loss is not None and math.isfinite(r.last_loss)]
    if done:
        done.sort(key=lambda r: (r.last_loss, r.run_id))
        return done[(len(done) - 1) // 2].run_id
    if not runs:
        return None
    return max(runs, key=lambda r: (r.n_recorded, r.run_id)).run_id


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


# --------------------------------------------------------------------------- collecting


def _float_or_none(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _recorded_mask(ds: xr.Dataset) -> np.ndarray:
    """Snapshots that hold data. Unwritten snapshots read as the NaN fill value."""
    if "importance" in ds:  # tiny (snapshot, layer, head): cheaper than touching attention
        return ds["importance"].notnull().any([d for d in ds["importance"].dims if d != "snapshot"]).values
    probe = ds["attention"].isel(layer=0, head=0, probe=0, query=-1, key=0)  # key 0 is always visible
    return probe.notnull().values


def _collect_or_note(path, run_id: str, index: dict | None, compute_missing: bool) -> _Run:
    """`_collect_run`, or a placeholder naming why the run could not be read.

    A live store can hold a group whose arrays are still being created; the page lists
    such a run instead of failing.
    """
    try:
        return _collect_run(path, run_id, index, compute_missing)
    except Exception as e:  # noqa: BLE001 - one unreadable run must not sink the page
        try:
            status = str(store.run_attrs(path, run_id).get("status", "unknown"))
        except Exception:  # noqa: BLE001
            status = "unknown"
        point = (index or {}).get("runs", {}).get(run_id, {})
        return _Run(run_id, status, dict(point), None, 0, np.zeros(0, bool), np.zeros(0, np.int64),
                    analysis_note=f"could not be read ({type(e).__name__}: {e})")


def _collect_run(path, run_id: str, index: dict | None, compute_missing: bool) -> _Run:
    attrs = store.run_attrs(path, run_id)
    ds = store.open_run(path, run_id)
    point = (index or {}).get("runs", {}).get(run_id)
    if point is None:  # no sweep index entry: the swept axes' values from the run's own config
        cfg = attrs.get("config", {})
        point = {a: cfg.get(a.split(".")[0], {}).get(a.split(".")[-1]) for a in (index or {}).get("axes", [])}
    run = _Run(
        run_id=run_id,
        status=str(attrs.get("status", "unknown")),
        params=dict(point),
        last_loss=_float_or_none(attrs.get("last_loss")),
        n_snapshots=int(ds.sizes.get("snapshot", 0)),
        recorded=_recorded_mask(ds) if "snapshot" in ds.dims else np.zeros(0, bool),
        steps=np.asarray(ds["step"].values) if "step" in ds.coords else np.arange(ds.sizes.get("snapshot", 0)),
    )
    try:
        stored = store.open_analysis(path, run_id)
        have = [v for v in _RUN_VARS if v in stored] if stored is not None else []
        run.analysis = stored[have].load() if stored is not None else None
    except Exception:  # noqa: BLE001 - e.g. being rewritten by `dynamics analyse` right now: analyse here
        stored = run.analysis = None
    if stored is not None:
        run.analysis_source = "stored"
        lacking = sorted(set(_RUN_VARS) - set(have))
        run.analysis_note = "stored by `dynamics analyse`" + (f" (lacks {', '.join(lacking)})" if lacking else "")
        return run
    if not compute_missing:
        run.analysis_note = "no stored analysis (run `dynamics analyse`)"
        return run
    if run.n_recorded < _MIN_SNAPSHOTS:
        run.analysis_note = f"only {run.n_recorded} snapshot(s) recorded; analysis needs {_MIN_SNAPSHOTS}"
        return run
    # js_distance too (small: no query/key dims), so the chosen run is not analysed twice.
    try:
        run.analysis = _analyse_recorded(ds, run.recorded, [*_RUN_VARS, "js_distance"])
    except Exception as e:  # noqa: BLE001 - one odd run (e.g. diverged to NaN) must not sink the page
        run.analysis_note = f"analysing it here failed ({type(e).__name__}: {e})"
        return run
    run.analysis_source = "computed"
    partial = "" if run.n_recorded == run.n_snapshots else f" on {run.n_recorded} of {run.n_snapshots} snapshots"
    run.analysis_note = f"computed for this report{partial} (not stored)"
    return run


def _analyse_recorded(ds: xr.Dataset, recorded: np.ndarray, names: list[str]) -> xr.Dataset:
    """`analyse_run` on the recorded snapshots of a run, in memory; returns `names`.

    The inputs are loaded first, so the analysers run eagerly on numpy: on a tiny run that
    measured 4x faster than building and running their dask graph, even on one chunk, and
    a report needs these runs whole anyway.
    """
    keep = [v for v in ("attention", "probe_tokens", "importance") if v in ds]
    sub = ds[keep].isel(snapshot=np.flatnonzero(recorded)).load()
    result = analyse_run(sub)
    return result[[n for n in names if n in result]].compute()


def _chosen_analysis(path, run: _Run, compute_missing: bool) -> tuple[xr.Dataset | None, str]:
    """Roles per snapshot and the last snapshot's JS distances of the chosen run."""
    stored = store.open_analysis(path, run.run_id)
    if stored is not None and "js_distance" in stored:
        out = stored[[v for v in ("role",) if v in stored]].load()
        out.attrs = dict(stored.attrs)
        return _with_last_js(out, stored["js_distance"].isel(snapshot=-1).load()), "stored"
    if not compute_missing:
        return None, "the run has no stored analysis (run `dynamics analyse`)"
    if run.n_recorded < _MIN_SNAPSHOTS:
        return None, f"the run has only {run.n_recorded} recorded snapshot(s)"
    out = run.analysis if run.analysis_source == "computed" else None
    if out is None or "js_distance" not in out:
        out = _analyse_recorded(store.open_run(path, run.run_id), run.recorded, ["role", "js_distance"])
    out = out[[v for v in ("role", "js_distance") if v in out]]
    out.attrs.setdefault("cluster_threshold", AnalysisOptions().cluster_threshold)
    return _with_last_js(out.drop_vars("js_distance"), out["js_distance"].isel(snapshot=-1)), "computed"


def _with_last_js(ds: xr.Dataset, js: xr.DataArray) -> xr.Dataset:
    # The scalar step of the last snapshot would clash with ds's step coordinate: keep it in attrs.
    if "step" in js.coords:
        ds.attrs["js_step"] = int(js["step"].values)
    return ds.assign(js_last=js.drop_vars([c for c in js.coords if c not in js.dims]))


def _colour_axes(runs: list[_Run], index: dict | None) -> list[str]:
    """Swept axes with more than one value, seeds last (they are what the spread is over)."""
    axes = list((index or {}).get("axes", []))
    varied = [a for a in axes if len({json.dumps(r.params.get(a), sort_keys=True) for r in runs}) > 1]
    return [a for a in varied if not _is_seed(a)] + [a for a in varied if _is_seed(a)]


def _is_seed(axis: str) -> bool:
    return axis.split(".")[-1] == "seed"


def _safe(make: Callable, *args) -> _Section:
    """Build one section; an unexpected error becomes a "Not available" line, not a crash."""
    try:
        return make(*args)
    except Exception as e:  # noqa: BLE001 - a report of a partial store must still be written
        anchor = make.__name__.strip("_").removesuffix("_section")
        section = _Section(anchor, anchor.replace("_", " ").capitalize())
        section.missing.append(f"Not available: the {anchor} figures because building them failed ({type(e).__name__}: {e}).")
        return section


# --------------------------------------------------------------------------- drawing helpers


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself to the figure: savefig needs a canvas, not pyplot
    return fig


def _save(fig: Figure, out: Path, rel: str) -> str:
    fig.savefig(out / rel, dpi=_DPI)
    return rel


def _short(axis: str) -> str:
    return axis.split(".")[-1]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass
class _Groups:
    """Runs grouped by their non-seed swept values, each group with one colour."""

    colour_axis: str | None
    keys: list[tuple]
    members: dict[tuple, list[_Run]]
    colours: dict[tuple, Any]
    labels: dict[tuple, str]


def _groups(runs: list[_Run], axes: list[str]) -> _Groups:
    """Group by every non-seed swept axis; colour by rank of the first one (viridis).

    Rank, not value, sets the colour so a geometric grid (0.5, 1, 2, 4) spreads evenly.
    Without a sweep index every run is its own group.
    """
    from matplotlib import colormaps

    group_axes = [a for a in axes if not _is_seed(a)]
    members: dict[tuple, list[_Run]] = {}
    for r in runs:
        key = tuple(json.dumps(r.params.get(a)) for a in group_axes) if group_axes else (r.run_id,)
        members.setdefault(key, []).append(r)

    def sort_key(key):
        return tuple((0, float(v), "") if _is_number(v) else (1, 0.0, v) for v in key)

    keys = sorted(members, key=sort_key)
    cmap = colormaps["viridis"] if group_axes else colormaps["tab10"]
    colour_axis = group_axes[0] if group_axes else None
    if colour_axis:
        firsts = sorted({k[0] for k in keys}, key=lambda v: sort_key((v,)))
        pos = {v: (i / max(1, len(firsts) - 1)) * 0.9 for i, v in enumerate(firsts)}  # 0.9: skip pale yellow
        colours = {k: cmap(pos[k[0]]) for k in keys}
        labels = {k: ", ".join(f"{_short(a)}={_fmt(json.loads(v))}" for a, v in zip(group_axes, k, strict=True)) for k in keys}
    else:
        colours = {k: cmap(i % 10) for i, k in enumerate(keys)}
        labels = {k: k[0] for k in keys}
    return _Groups(colour_axis, keys, members, colours, labels)


def _is_number(text: str) -> bool:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _step_axis(ax, steps: np.ndarray) -> None:
    """Symlog x axis when snapshots are geometric early on, so the dense phase is visible."""
    steps = np.asarray(steps, dtype=float)
    steps = steps[np.isfinite(steps)]
    if steps.size > 2 and steps.max() > 20 * max(1.0, np.sort(steps)[1]):
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("symlog", linthresh=1.0, linscale=0.3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 100, not 10^2: steps are counts
        ax.set_xlabel("training step (steps, symmetric-log axis)")
    else:
        ax.set_xlabel("training step (steps)")
    ax.set_xlim(left=0)


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
        for r in members:
            s, v = series[r.run_id]
            ax.plot(s, v, color=colour, lw=0.8, alpha=0.45 if len(members) > 1 else 1.0,
                    label=None if len(members) > 1 else groups.labels[key])
        if len(members) > 1:
            grid = np.unique(np.concatenate([series[r.run_id][0] for r in members]))
            table = np.full((len(members), grid.size), np.nan)
            for i, r in enumerate(members):
                s, v = series[r.run_id]
                table[i, np.searchsorted(grid, s)] = v
            with np.errstate(all="ignore"), _quiet():
                mean, lo, hi = np.nanmean(table, 0), np.nanmin(table, 0), np.nanmax(table, 0)
            ax.fill_between(grid, lo, hi, color=colour, alpha=0.15, lw=0)
            ax.plot(grid, mean, color=colour, lw=2.2, label=f"{groups.labels[key]} (mean of {len(members)})")
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


def _legend(ax, groups: _Groups) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        title = _short(groups.colour_axis) if groups.colour_axis else "run"
        ax.legend(handles, labels, title=title, fontsize=7, title_fontsize=8, loc="best", frameon=False)


def _analysed(runs: list[_Run]) -> list[_Run]:
    return [r for r in runs if r.analysis is not None]


def _missing_runs_sentence(runs: list[_Run], what: str) -> str | None:
    lacking = [r for r in runs if r.analysis is None]
    if not lacking:
        return None
    names = "; ".join(f"{r.run_id} ({r.status}: {r.analysis_note})" for r in lacking)
    return f"Not available: {what} for {len(lacking)} run(s) because they have no analysis: {names}."


# --------------------------------------------------------------------------- sections


def _attention_frames(fig, images, titles, suptitle, attn, run, roles_by_step, layers, heads, out: Path):
    """Write one PNG per recorded snapshot; yields (relative path, step).

    Layout, axes and tick labels are identical in every frame, so they are drawn once and
    the frames blit only the images and titles onto a copy of that background (a full
    ``savefig`` per frame measured about 20x slower: tick and layout work dominates).
    """
    from PIL import Image

    canvas = fig.canvas
    canvas.draw()  # runs the constrained layout once, with the widest titles
    fig.set_layout_engine("none")
    moving = [*images, *titles, suptitle]
    for artist in moving:
        artist.set_animated(True)  # left out of canvas.draw(): the background has no data
    canvas.draw()
    background = canvas.copy_from_bbox(fig.bbox)
    L, H = len(layers), len(heads)
    indices = np.flatnonzero(run.recorded)
    # One read of every recorded snapshot (S, L, H, T, T): per-snapshot reads each pay dask's overhead.
    probe0 = np.asarray(attn.isel(probe=0, snapshot=indices).values, dtype=float)
    T = probe0.shape[-1]
    probe0[..., np.triu(np.ones((T, T), dtype=bool), k=1)] = np.nan  # future keys: masked, drawn grey
    for n, s in enumerate(indices):
        step = int(run.steps[s])
        block = probe0[n]  # (L, H, T, T)
        labels = roles_by_step.get(step)
        for li in range(L):
            for hi in range(H):
                images[li * H + hi].set_data(np.ma.masked_invalid(block[li, hi]))
                role = f" · {labels[li, hi]}" if labels is not None else ""
                titles[li * H + hi].set_text(f"L{layers[li]} H{heads[hi]}{role}")
        suptitle.set_text(f"run {run.run_id} · step {step} · probe 0")
        canvas.restore_region(background)
        for artist in moving:
            fig.draw_artist(artist)
        rel = f"figures/attention/snapshot_{n:04d}.png"
        Image.fromarray(np.asarray(canvas.buffer_rgba())).convert("RGB").save(out / rel, optimize=False)
        yield rel, step


def _attention_section(ctx: _Ctx) -> _Section:
    path, runs, chosen, out = ctx.path, ctx.runs, ctx.chosen, ctx.out
    sec = _Section("attention", "Attention maps of every head, snapshot by snapshot")
    run = next((r for r in runs if r.run_id == chosen), None)
    if run is None:
        sec.missing.append("Not available: attention maps because the store holds no runs.")
        return sec
    if run.n_recorded == 0:
        sec.missing.append(f"Not available: attention maps because run {run.run_id} ({run.status}) has no recorded snapshot yet.")
        return sec
    ds = store.open_run(path, run.run_id)
    analysis, source = ctx.chosen_analysis()
    roles_by_step: dict[int, np.ndarray] = {}
    if analysis is not None and "role" in analysis:
        codes = analysis["role"].values
        for i, step in enumerate(analysis["step"].values):
            roles_by_step[int(step)] = np.asarray(ROLES)[np.clip(codes[i], 0, len(ROLES) - 1)]
    attn = ds["attention"]
    L, H, P, T = (attn.sizes[d] for d in ("layer", "head", "probe", "query"))
    layers = ds["layer"].values if "layer" in ds.coords else np.arange(L)
    heads = ds["head"].values if "head" in ds.coords else np.arange(H)

    fig = _figure(2.0 * H + 1.3, 2.0 * L + 0.9)
    grid = fig.subplots(L, H, squeeze=False, sharex=True, sharey=True)
    images, titles = [], []
    widest = max(ROLES, key=len) if roles_by_step else ""
    from matplotlib import colormaps
    from matplotlib.colors import PowerNorm
    from matplotlib.ticker import MaxNLocator

    # Square-root colour scale: diffuse early attention (~1/query) stays visible next to peaks of 1.
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    cmap = colormaps["magma"].with_extremes(bad="#d9d9d9")  # grey: keys a query cannot see (causal mask)
    for li in range(L):
        for hi in range(H):
            ax = grid[li, hi]
            im = ax.imshow(np.zeros((T, T)), norm=norm, cmap=cmap, interpolation="nearest")
            images.append(im)
            # The widest title a frame can get, so the layout computed once below fits all frames.
            titles.append(ax.set_title(f"L{layers[li]} H{heads[hi]} · {widest}", fontsize=8))
            ax.tick_params(labelsize=6)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # positions are whole tokens
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
            if li == L - 1:
                ax.set_xlabel("key position (tokens)", fontsize=7)
            if hi == 0:
                ax.set_ylabel("query position (tokens)", fontsize=7)
    fig.colorbar(images[0], ax=grid, shrink=0.8, label="attention weight (fraction of row, sqrt scale)")
    suptitle = fig.suptitle(f"run {run.run_id} · step {int(run.steps.max())} · probe 0", fontsize=9)
    frames = [
        {"src": src, "step": step, "label": f"step {step} (snapshot {n + 1} of {run.n_recorded})"}
        for n, (src, step) in enumerate(_attention_frames(
            fig, images, titles, suptitle, attn, run, roles_by_step, layers, heads, out))
    ]

    role_note = {
        "stored": "Panel titles: layer, head and the role assigned at that snapshot (stored analysis).",
        "computed": "Panel titles: layer, head and the role assigned at that snapshot (analysed for this report).",
    }.get(source, f"Panel titles: layer and head only; role labels not available because {source}.")
    partial = "" if run.n_recorded == run.n_snapshots else f" Only {run.n_recorded} of {run.n_snapshots} snapshots are recorded so far ({run.status})."
    caption = (f"Attention of every head (rows: layers, columns: heads) of run {run.run_id} on probe sequence 0 "
               f"(one fixed sequence of {P}; not a mean, which would blur content-dependent heads such as induction), "
               f"at the step chosen with the slider. Axes: query and key position (tokens); colour: attention weight (fraction "
               f"of the query's attention, 0-1, square-root scale; grey: future keys, masked). "
               f"{role_note}{partial}")
    first = frames[0]
    data = json.dumps(frames).replace("</", "<\\/")
    sec.html = f"""
<figure class="frames">
  <div class="controls">
    <button type="button" id="play">Play</button>
    <input type="range" id="step-slider" min="0" max="{len(frames) - 1}" value="0" step="1" aria-label="snapshot">
    <span id="step-label">{html.escape(first["label"])}</span>
  </div>
  <img id="frame" src="{html.escape(first["src"])}" alt="attention maps of every head at the selected snapshot">
  <figcaption>{html.escape(caption)}</figcaption>
  <script type="application/json" id="frames-data">{data}</script>
</figure>"""
    return sec


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


def _dendrogram_coords(Z: np.ndarray) -> dict:
    from scipy.cluster.hierarchy import dendrogram

    return dendrogram(Z, no_plot=True)  # coordinates only: we draw on our own Figure


def _redundancy_section(ctx: _Ctx) -> _Section:
    runs, chosen, out = ctx.runs, ctx.chosen, ctx.out
    sec = _Section("redundancy", "Redundancy: dendrogram and JS distance matrix at the last snapshot")
    run = next((r for r in runs if r.run_id == chosen), None)
    if run is None:
        sec.missing.append("Not available: the dendrogram because the store holds no runs.")
        return sec
    analysis, source = ctx.chosen_analysis()
    if analysis is None:
        sec.missing.append(f"Not available: the dendrogram and JS matrix of run {run.run_id} because {source}.")
        return sec
    js = analysis["js_last"]
    L, H = js.sizes["layer"], js.sizes["head"]
    d = np.asarray(js.transpose("layer", "head", "layer_b", "head_b").values, dtype=float).reshape(L * H, L * H)
    valid = ~np.isnan(np.diagonal(d))
    names = np.array([f"L{li}H{hi}" for li in range(L) for hi in range(H)])
    if "role" in analysis:
        last_roles = np.asarray(ROLES)[np.clip(analysis["role"].isel(snapshot=-1).values.ravel(), 0, len(ROLES) - 1)]
        names = np.array([f"{n} {r}" for n, r in zip(names, last_roles, strict=True)])
    names = names[valid]
    if valid.sum() < 2:
        sec.missing.append(f"Not available: the dendrogram because run {run.run_id} has fewer than 2 heads.")
        return sec
    step = analysis.attrs.get("js_step")
    threshold = float(analysis.attrs.get("cluster_threshold", AnalysisOptions().cluster_threshold))
    Z = linkage_matrix(js)
    dn = _dendrogram_coords(Z)
    n = len(names)
    fig = _figure(max(9.0, 0.32 * n + 6), max(4.2, 0.16 * n + 2.5))
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1.1, 1])
    for xs, ys in zip(dn["icoord"], dn["dcoord"], strict=True):
        ax1.plot(xs, ys, color="#345", lw=1.2)
    ax1.axhline(threshold, color="crimson", ls="--", lw=1, label=f"cluster cut = {threshold:g}")
    ax1.set_xticks(5 + 10 * np.arange(n), names[dn["leaves"]], rotation=90, fontsize=7)
    ax1.set_xlim(0, 10 * n)
    ax1.set_ylim(0, max(float(Z[:, 2].max()) * 1.08, threshold * 1.5))
    ax1.set_ylabel("merge distance: mean JS distance (sqrt(nats))")
    ax1.set_xlabel("head (layer, head, role at this snapshot)")
    ax1.legend(fontsize=7, frameon=False)
    order = np.flatnonzero(valid)[dn["leaves"]]
    im = ax2.imshow(d[np.ix_(order, order)], cmap="viridis", vmin=0, vmax=math.sqrt(math.log(2)), interpolation="nearest")
    ax2.set_xticks(np.arange(n), names[dn["leaves"]], rotation=90, fontsize=7)
    ax2.set_yticks(np.arange(n), names[dn["leaves"]], fontsize=7)
    ax2.set_xlabel("head (dendrogram order)")
    ax2.set_ylabel("head (dendrogram order)")
    fig.colorbar(im, ax=ax2, shrink=0.85, label="JS distance (sqrt(nats), max sqrt(ln 2))")
    at = f"step {step}" if step is not None else "the last snapshot"
    how = "stored analysis" if source == "stored" else "analysed for this report"
    partial = "" if run.n_recorded == run.n_snapshots else " (the last snapshot recorded so far)"
    sec.figures.append((_save(fig, out, "figures/redundancy.png"),
                        f"Run {run.run_id} at {at}{partial}, {how}. Left: average-linkage dendrogram of the heads on their "
                        f"JS distances (Clark et al. 2019); heads merged below the dashed cut ({threshold:g}) count as redundant. "
                        f"Right: the JS distance matrix between every pair of heads, in dendrogram order (0 = identical attention)."))
    return sec


# --------------------------------------------------------------------------- CHG


def _derived_names(path) -> list[str]:
    """Names of the derived datasets: ``<name>``, or ``<name>/<sub>`` for a folder of groups.

    Read from the store's directory listing (through fsspec, so URLs work too): the store
    module has no listing for derived groups, and nested names are legal on disk.
    """
    import fsspec

    url = os.fspath(path)
    fs, root = fsspec.core.url_to_fs(url)
    base = f"{root.rstrip('/')}/derived"

    def kind(p: str) -> str | None:
        try:
            meta = json.loads(fs.cat_file(f"{p}/zarr.json"))
        except (FileNotFoundError, OSError, ValueError):
            return None
        return meta.get("node_type")

    def children(p: str) -> list[str]:
        try:
            return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False))
        except (FileNotFoundError, OSError):
            return []

    names = []
    for name in children(base):
        p = f"{base}/{name}"
        if kind(p) != "group":
            continue
        subs = [c for c in children(p) if kind(f"{p}/{c}") is not None]
        sub_groups = [c for c in subs if kind(f"{p}/{c}") == "group"]
        if sub_groups and len(sub_groups) == len(subs):  # a folder of datasets (no arrays of its own)
            names.extend(f"{name}/{c}" for c in sub_groups)
        else:
            names.append(name)
    return names


def _open_derived(path, name: str) -> xr.Dataset | None:
    try:
        return store.open_derived(path, name)
    except store.StoreError:
        # Nested names (folder/<name>) are not single group names for store.open_derived.
        url = os.fspath(path)
        url = url[len("file://"):] if url.startswith("file://") else url
        return xr.open_zarr(url, group=f"derived/{name}", consolidated=False)


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


# --------------------------------------------------------------------------- predictor


_MODEL_DIMS = ("model", "predictor", "method", "estimator")
_FOLD_DIMS = ("fold", "folds", "split", "cv_fold")
# dynamics.predict.MODELS that are baselines (named here so the report needs no sklearn import).
_BASELINES = ("chance", "layer", "init_linear", "init_boosting")
_METRICS = {  # attrs["metric"] -> (axis name, unit)
    "auroc": ("AUROC", "0.5 = chance, 1 = perfect"),
    "balanced_accuracy": ("balanced accuracy", "fraction"),
    "spearman": ("Spearman correlation", "-1 to 1"),
}


def _predict_section(ctx: _Ctx) -> _Section:
    path, out = ctx.path, ctx.out
    sec = _Section("predict", "Predicting final roles from early training")
    names = [n for n in ctx.derived() if re.match(r"^predict[/._-]", n)]
    if not names:
        sec.missing.append("Not available: the predictor curves because the store has no derived predict.<target> "
                           "dataset (run the predictor on the finished sweep first).")
        return sec
    for name in names:
        ds = _open_derived(path, name)
        target = str(ds.attrs.get("target") or re.split(r"[/._-]", name, maxsplit=1)[1]) if ds is not None else name
        if ds is None or "horizon" not in ds.dims:
            sec.missing.append(f"Not available: predictor curves for {target} because derived/{name} has no horizon dim.")
            continue
        lines, fold = _predict_lines(ds)
        if not lines:
            sec.missing.append(f"Not available: predictor curves for {target} because derived/{name} holds no numeric "
                               f"variable over horizon.")
            continue
        fig = _figure(8.6, 4.2)
        ax = fig.subplots()
        for label, x, mean, sd, baseline in lines:
            (line,) = ax.plot(x, mean, marker="o", ms=3.5, ls="--" if baseline else "-", lw=1.1 if baseline else 1.8,
                              label=label + (" (baseline)" if baseline else ""))
            if sd is not None:
                ax.fill_between(x, mean - sd, mean + sd, color=line.get_color(), alpha=0.12, lw=0)
        chance = _float_or_none(ds.attrs.get("chance"))
        if chance is not None:
            ax.axhline(chance, color="grey", ls=":", lw=1, label=f"chance level ({chance:.2f})")
        metric_key = str(ds.attrs.get("metric", ""))
        metric, unit = _METRICS.get(metric_key, (metric_key or "score", "score"))
        horizon_unit = str(ds.attrs.get("horizon_unit") or ds["horizon"].attrs.get("units") or "step")
        ax.set_xlabel("horizon: fraction of each run's training seen by the features (fraction)"
                      if horizon_unit == "fraction" else f"horizon: training seen by the features ({horizon_unit}s)")
        ax.set_ylabel(f"{metric} ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
        spread = (f"band: +-1 s.d. over {ds.sizes[fold]} cross-validation folds"
                  f"{' holding out whole ' + str(ds.attrs['group_by']) + 's' if ds.attrs.get('group_by') else ''}"
                  if fold else "no fold dimension, so no spread")
        ceiling = " h = 1 sees the final snapshot that defines the target: a ceiling, not a prediction." \
            if horizon_unit == "fraction" and float(ds["horizon"].max()) >= 1 else ""
        description = ds.attrs.get("description") or target
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", target)
        sec.figures.append((_save(fig, out, f"figures/predict_{safe}.png"),
                            f"Predicting, for every head, the target {target!r} ({description}; derived/{name}) from "
                            f"features of the training seen up to each horizon: {metric} against horizon, one line per model; dashed: "
                            f"baselines (chance, layer prior, initialisation-only features); {spread}.{ceiling}"))
    return sec


def _predict_lines(ds: xr.Dataset) -> tuple[list[tuple], str | None]:
    """(label, horizon, mean, sd or None, is_baseline) per model, and the fold dim used.

    Reads the per-fold ``score`` of `dynamics.predict` (horizon, model, fold) when present
    (mean and s.d. over the folds where defined); otherwise every numeric variable over
    horizon, split by a model-like dim and summarised over a fold-like dim.
    """
    fold = next((d for d in _FOLD_DIMS if d in ds.dims), None)
    model = next((d for d in _MODEL_DIMS if d in ds.dims), None)
    if "score" in ds and "horizon" in ds["score"].dims:
        metrics = ["score"]
    else:
        metrics = [v for v in ds.data_vars if "horizon" in ds[v].dims and ds[v].dtype.kind in "fiu"
                   and not str(v).endswith(("_std", "_sd"))]
    lines = []
    for var in metrics:
        da = ds[var].load().astype(float)
        use_fold = fold if fold in da.dims else None
        extra = [d for d in da.dims if d not in ("horizon", use_fold, model)]
        if extra:  # e.g. per-class scores: summarise by their mean so one line stays one model
            da = da.mean(extra)
        labels = [None] if model is None or model not in da.dims else [str(m) for m in da[model].values]
        for lab in labels:
            sub = (da if lab is None else da.sel({model: lab})).transpose("horizon", ...)
            with np.errstate(all="ignore"), _quiet():
                values = sub.values.reshape(sub.sizes["horizon"], -1)
                mean = np.nanmean(values, 1) if use_fold else values[:, 0]
                sd = np.nanstd(values, 1, ddof=1) if use_fold and values.shape[1] > 1 else None
            if not np.isfinite(mean).any():
                continue
            name = (var if lab is None else lab) if len(metrics) == 1 else f"{var}: {lab}"
            baseline = lab in _BASELINES or "baseline" in f"{var} {lab}".lower()
            lines.append((name, ds["horizon"].values.astype(float), mean, sd, baseline))
    return lines, fold


# --------------------------------------------------------------------------- page


_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 0 auto; max-width: 1180px; padding: 0 18px 48px; color: #222; }
h1 { font-size: 1.5em; margin: 20px 0 4px; } h2 { font-size: 1.2em; margin-top: 34px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
nav a { margin-right: 14px; } .meta { color: #555; font-size: 0.9em; }
figure { margin: 14px 0 22px; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.88em; color: #444; max-width: 980px; }
table { border-collapse: collapse; font-size: 0.85em; } th, td { border-bottom: 1px solid #e4e4e4; padding: 3px 9px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.missing { background: #fff6e5; border-left: 4px solid #e0a030; padding: 6px 10px; font-size: 0.9em; }
.controls { display: flex; align-items: center; gap: 12px; margin-bottom: 6px; }
#step-slider { flex: 1; max-width: 640px; } #step-label { font-variant-numeric: tabular-nums; min-width: 15em; }
pre#selftest { display: none; }
"""

# Plain inline script (no modules, no network): the slider, a play button, and a self-test
# that runs only when the page is opened with #selftest (the browser test reads its verdict).
_JS = r"""
(function () {
  "use strict";
  var data = document.getElementById("frames-data");
  var frames = data ? JSON.parse(data.textContent) : [];
  var slider = document.getElementById("step-slider");
  var img = document.getElementById("frame");
  var label = document.getElementById("step-label");
  var play = document.getElementById("play");
  var timer = null;
  function show(i) {
    var f = frames[i];
    if (!f) { return; }
    img.src = f.src;
    label.textContent = f.label;
  }
  if (slider && img && label) {
    slider.addEventListener("input", function () { show(parseInt(slider.value, 10)); });
    // Warm the browser cache so scrubbing does not flicker.
    frames.forEach(function (f) { var pre = new Image(); pre.src = f.src; });
  }
  if (play && slider) {
    play.addEventListener("click", function () {
      if (timer) { clearInterval(timer); timer = null; play.textContent = "Play"; return; }
      play.textContent = "Pause";
      timer = setInterval(function () {
        var next = (parseInt(slider.value, 10) + 1) % frames.length;
        slider.value = String(next);
        show(next);
        if (next === frames.length - 1) { clearInterval(timer); timer = null; play.textContent = "Play"; }
      }, 400);
    });
  }
  window.reportFrames = frames;
})();
"""

_SELFTEST_JS = r"""
(function () {
  "use strict";
  if (location.hash !== "#selftest") { return; }
  function loadImage(src) {
    return new Promise(function (resolve) {
      var im = new Image();
      im.onload = function () { resolve({src: src, ok: im.naturalWidth > 0}); };
      im.onerror = function () { resolve({src: src, ok: false}); };
      im.src = src;
    });
  }
  function settle(im) {
    return new Promise(function (resolve) {
      if (im.complete) { resolve(); return; }
      im.addEventListener("load", function () { resolve(); });
      im.addEventListener("error", function () { resolve(); });
    });
  }
  function run() {
    var verdict = {errors: window.reportErrors.slice(), images: {}, frames: {}, slider: {}};
    var imgs = Array.prototype.slice.call(document.images);
    var broken = imgs.filter(function (im) { return !(im.complete && im.naturalWidth > 0); })
                     .map(function (im) { return im.getAttribute("src"); });
    verdict.images = {total: imgs.length, broken: broken};
    var frames = window.reportFrames || [];
    Promise.all(frames.map(function (f) { return loadImage(f.src); })).then(function (results) {
      verdict.frames = {total: frames.length,
                        broken: results.filter(function (r) { return !r.ok; }).map(function (r) { return r.src; })};
      var slider = document.getElementById("step-slider");
      var img = document.getElementById("frame");
      var label = document.getElementById("step-label");
      if (!slider || !img || !label || frames.length < 2) {
        verdict.slider = {present: !!slider, changed: false, reason: "no slider or fewer than 2 snapshots"};
        return verdict;
      }
      var before = {src: img.getAttribute("src"), label: label.textContent, value: slider.value};
      slider.value = slider.max;
      slider.dispatchEvent(new Event("input", {bubbles: true}));
      var after = {src: img.getAttribute("src"), label: label.textContent, value: slider.value};
      return settle(img).then(function () {
        after.loaded = img.naturalWidth > 0;
        verdict.slider = {present: true, before: before, after: after,
                          changed: before.src !== after.src && before.label !== after.label && after.loaded};
        return verdict;
      });
    }).then(function (v) {
      v.errors = window.reportErrors.slice();
      v.ok = v.errors.length === 0 && v.images.broken.length === 0 && v.frames.broken.length === 0 && v.slider.changed === true;
      document.getElementById("selftest").textContent = JSON.stringify(v);
      document.title = "selftest " + (v.ok ? "pass" : "fail");
    }).catch(function (e) {
      document.getElementById("selftest").textContent = JSON.stringify({ok: false, errors: ["self-test crashed: " + e]});
    });
  }
  if (document.readyState === "complete") { run(); } else { window.addEventListener("load", run); }
})();
"""

# Installed first, in <head>, so errors of every later script are caught for the self-test.
_ERRORS_JS = r"""
window.reportErrors = [];
window.addEventListener("error", function (e) {
  if (e.target && e.target !== window && e.target.tagName) { return; }  // resource errors: the image checks report those
  window.reportErrors.push("error: " + e.message + " at " + e.filename + ":" + e.lineno);
}, true);
window.addEventListener("unhandledrejection", function (e) { window.reportErrors.push("unhandled rejection: " + e.reason); });
(function () {
  var original = console.error;
  console.error = function () {
    window.reportErrors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
})();
"""


def _runs_table(runs: list[_Run], axes: list[str], chosen: str | None) -> str:
    head = "".join(f"<th>{html.escape(_short(a))}</th>" for a in axes)
    rows = []
    for r in runs:
        cells = "".join(f"<td>{html.escape(_fmt(r.params.get(a, '')))}</td>" for a in axes)
        loss = "-" if r.last_loss is None else f"{r.last_loss:.4f}"
        mark = " (shown)" if r.run_id == chosen else ""
        rows.append(f"<tr><td><code>{html.escape(r.run_id)}</code>{mark}</td>{cells}<td>{html.escape(r.status)}</td>"
                    f"<td class=num>{r.n_recorded}/{r.n_snapshots}</td><td class=num>{loss}</td>"
                    f"<td>{html.escape(r.analysis_note)}</td></tr>")
    return (f"<table><thead><tr><th>run</th>{head}<th>status</th><th>snapshots recorded</th>"
            f"<th>last training loss (nats)</th><th>analysis</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _page(path, runs, chosen, axes, sections: list[_Section], compute_missing: bool) -> str:
    title = f"dynamics report: {Path(os.fspath(path)).name}"
    when = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs"
    policy = ("Runs without stored analysis are analysed here, in memory, on the snapshots recorded so far "
              "(nothing is written to the store)." if compute_missing else
              "Runs without stored analysis are left out of the analysis figures (--no-compute).")
    nav = " ".join(f'<a href="#{s.anchor}">{html.escape(s.title.split(":")[0])}</a>' for s in sections)
    body = []
    for s in sections:
        parts = [f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>', s.html]
        for rel, caption in s.figures:
            parts.append(f'<figure><img src="{html.escape(rel)}" alt="{html.escape(caption[:120])}">'
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        parts.extend(f'<p class="missing">{html.escape(m)}</p>' for m in s.missing)
        parts.append("</section>")
        body.append("\n".join(parts))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<script>{_ERRORS_JS}</script>
<style>{_CSS}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">Store <code>{html.escape(os.fspath(path))}</code> · {html.escape(status)} · written {when}.
Per-run figures show run <code>{html.escape(str(chosen))}</code>. {html.escape(policy)}</p>
<nav>{nav}</nav>
<h2>Runs</h2>
{_runs_table(runs, axes, chosen)}
{"".join(body)}
<pre id="selftest">pending</pre>
<script>{_JS}</script>
<script>{_SELFTEST_JS}</script>
</body>
</html>
"""
