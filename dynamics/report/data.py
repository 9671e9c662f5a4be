"""What the report reads: each run's status and analysis (stored, or computed here in memory),
the chosen run's roles and JS distances, and the derived datasets of the store."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from dynamics import store
from dynamics.analyse import unfinished_reason
from dynamics.analysis import analyse_run
from dynamics.analysis.pipeline import AnalysisOptions, is_current
from dynamics.caveats import notes, of_run
from dynamics.identity import differing_settings, read_settings
from dynamics.provenance import (
    importance_form,
    mixed_code,
    mixed_data,
    mixed_execution,
    mixed_importance,
    trained_by,
    trained_on,
    trained_on_data,
)
from dynamics.schema import FINISHED_STATUSES, config_value

# Analysis variables the sweep-wide figures read for every run (small: no query/key dims).
# token_share: all NaN where no probe holds the token the token role looks for (summary_row's token_unseen)
# layer_bifurcation_step: a run drawn "never" whose layers left their own bands is named;
# previous_token_peak: heads meeting Voita et al.'s rule with another label are, as analyse notes them
# divergence_from_init: a completed run whose heads never moved is named (dynamics.caveats)
# bifurcation_resampled: the bar of each run's bifurcation step over resampled probes
# role_resampled: heads whose final label few probe resamples give are named, as analyse names them
_RUN_VARS = ("best_slash", "slash_dominant", "role", "mean_divergence", "bifurcation_step", "slash_emergence_step",
             "token_share", "layer_bifurcation_step", "previous_token_peak", "divergence_from_init",
             "bifurcation_resampled", "role_resampled")


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
    settings: dict[str, Any] = field(default_factory=dict)  # config less seed and execution, "section.key" -> value
    code: tuple[str | None, ...] = ()  # provenance.trained_by: the code hashes of its kept steps; () unread
    execution: tuple[tuple[str | None, ...], ...] = ()  # provenance.trained_on: torch, device, CPU kernels; () unread
    data: tuple[str, str | None] | None = None  # provenance.trained_on_data: task setting, data hash; None unread
    importance_form: tuple[str] | None = None  # provenance.importance_form; None unread
    # its stored analysis, or the recordings analysed here, found damaged (a lost chunk, a failed
    # checksum): a line each, for stderr and the command's exit code
    damage: list[str] = field(default_factory=list)
    unfinished: str = "unfinished"  # analyse.unfinished_reason: a failed run's with its error
    seed: Any = None  # train.seed, as the run's attrs record it; None unread
    caveats: dict = field(default_factory=dict)  # dynamics.caveats.of_run: a completed run's loss rose, or heads never moved

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
    pending: list[_Run] = field(default_factory=list)  # in the sweep index, not started yet
    href: str = ""  # `out` as the page links to it ("figures/<generation>/"); figures are saved under `out`
    _chosen: tuple | None = None
    _derived: list[str] | None = None
    _groups: Any = None
    damaged: list[str] = field(default_factory=list)  # stored data the sections found damaged, one line each
    derived_problem: str = ""  # why derived/ cannot be listed (not a folder): said, not read as "none yet"

    def groups(self, runs: list[_Run]):
        """`runs` grouped with the colours and styles of the whole sweep (recorded and pending runs).

        Built once, so a swept value keeps its colour in every figure, whichever runs the
        figure shows.
        """
        from dynamics.report.draw import _groups  # draw imports this module

        if self._groups is None:
            self._groups = _groups([*self.runs, *self.pending], self.axes)
        return self._groups.subset(runs)

    def chosen_analysis(self) -> tuple[xr.Dataset | None, str]:
        if self._chosen is None:
            run = next((r for r in self.runs if r.run_id == self.chosen), None)
            self._chosen = (None, "the store holds no runs") if run is None else _chosen_analysis(
                self.path, run, self.compute_missing, self.damaged)
        return self._chosen

    def derived(self) -> list[str]:
        if self._derived is None:
            try:
                store.check_folders(self.path, ("derived",))
                self._derived = _derived_names(self.path)
            except store.StoreError as e:  # a file where derived/ goes: listed as empty, it read "run predict first"
                self.derived_problem = str(e)
                self.damaged.append(self.derived_problem)
                self._derived = []
        return self._derived


def _choose_run(runs: list[_Run]) -> str | None:
    """Default run of the per-run figures: the completed run with the median final loss, of those
    with an analysis (stored or computed for the report) where any has one.

    The median (lower median for an even count) shows a typical run rather than the luckiest
    seed. Without completed runs, the run with the most recorded snapshots, a damaged one last;
    None for no runs.
    """
    done = [r for r in runs if r.status == "completed" and r.last_loss is not None and math.isfinite(r.last_loss)]
    # a run too short to analyse (3 snapshots) was shown by default, with no roles or redundancy
    # figure, beside runs that had them
    done = [r for r in done if r.analysis is not None] or done
    if done:
        done.sort(key=lambda r: (r.last_loss, r.run_id))
        return done[(len(done) - 1) // 2].run_id
    if not runs:
        return None
    return max(runs, key=lambda r: (r.status != "damaged", r.n_recorded, r.run_id)).run_id


def chosen_why(runs: list[_Run], chosen: str | None) -> str:
    """Why the per-run figures show ``chosen``, as :func:`_choose_run` picks it (or ``--run``).

    Example
    -------
    >>> chosen_why([], None)
    ''
    """
    if chosen is None:
        return ""
    if chosen != _choose_run(runs):
        return " (chosen with --run)"
    done = [r for r in runs if r.status == "completed" and r.last_loss is not None and math.isfinite(r.last_loss)]
    if not done:
        # "completed with a finite loss" read as a contradiction beside a diverged run's finite last loss
        return " (no completed run has a finite final loss: the run with the most snapshots recorded)"
    # as _choose_run picks: among the analysed ones where any is (a run too short to analyse is not)
    analysed = [r for r in done if r.analysis is not None]
    which = f"{len(analysed)} analysed completed run(s)" if analysed and len(analysed) < len(done) else \
        f"{len(done)} completed run(s)"
    n = len(analysed) or len(done)
    return (f" (of the {which}, the one with the median final loss"
            f"{', the lower for an even count' if n % 2 == 0 else ''}; --run ID shows another)")


# --------------------------------------------------------------------------- collecting


def is_damage(error: BaseException) -> bool:
    """Whether a failed read of stored data means the data is damaged: a chunk failing its
    checksum, or a StoreError (a lost chunk, unreadable metadata), not, say, a group being
    rewritten by `dynamics analyse` right now."""
    return store.failed_checksum(error) or isinstance(error, store.StoreError)


def _why(error: BaseException) -> str:
    """One line on a damaged read, without zarr's bytes of both checksums."""
    if store.failed_checksum(error):
        return "a chunk failed its checksum"
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _float_or_none(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _collect_or_note(path, run_id: str, index: dict | None, compute_missing: bool,
                     on_damaged: Callable[[str, str], None] | None = None) -> _Run:
    """`_collect_run`, or a placeholder naming why the run could not be read.

    A live store can hold a group whose arrays are still being created; the page lists
    such a run instead of failing. A run whose group metadata cannot be read is "damaged"
    (as `dynamics status` says), and `on_damaged` gets its id and the store's reason.
    """
    point = (index or {}).get("runs", {}).get(run_id, {})
    try:
        attrs = store.run_attrs(path, run_id)  # read once: the damage check and the run's data
        # A chunk file gone from a run reads as NaN (or 0) without a word: it would be drawn, and
        # analysed here, as if recorded. Named as damage instead, as `dynamics analyse` does; an
        # unfinished run (drawn and analysed here too) on the snapshots up to its last checkpoint.
        store.check_recorded(path, run_id, attrs=attrs, so_far=True)
    except store.StoreError as e:
        if on_damaged is not None:
            on_damaged(run_id, str(e))
        return _Run(run_id, "damaged", dict(point), None, 0, np.zeros(0, bool), np.zeros(0, np.int64),
                    analysis_note=f"could not be read ({type(e).__name__}: {e})")
    try:
        return _collect_run(path, run_id, index, compute_missing, attrs)
    except Exception as e:  # noqa: BLE001 - one unreadable run must not sink the page
        if (damage := store.unreadable_chunk(path, run_id)) is not None:  # a chunk failing its checksum
            if on_damaged is not None:
                on_damaged(run_id, str(damage))
            return _Run(run_id, "damaged", dict(point), None, 0, np.zeros(0, bool), np.zeros(0, np.int64),
                        analysis_note=f"could not be read ({damage})")
        try:
            status = store.run_status(path, run_id, attrs)
        except Exception:  # noqa: BLE001
            status = "unknown"
        return _Run(run_id, status, dict(point), None, 0, np.zeros(0, bool), np.zeros(0, np.int64),
                    analysis_note=f"could not be read ({type(e).__name__}: {e})")


def _pending_runs(index: dict | None, recorded: list[str]) -> list[_Run]:
    """Runs of the sweep index that the store does not hold yet (status "pending")."""
    have = set(recorded)
    return [_Run(rid, "pending", dict(point or {}), None, 0, np.zeros(0, bool), np.zeros(0, np.int64),
                 analysis_note="not started yet")
            for rid, point in (index or {}).get("runs", {}).items() if rid not in have]


def _recorded(run: _Run) -> str:
    """Its recorded snapshots, counted as the analysers take them: a diverged run's before its
    divergence (one diverged at step 0 wrote a snapshot 0 of NaN, and "only 0 recorded" puzzled)."""
    return f"{run.n_recorded} snapshot(s) recorded" + (" before it diverged" if run.status == "diverged" else "")


def _to_analyse(run: _Run) -> str:
    """What gives a run a stored analysis: `dynamics analyse` skips an unfinished one, so telling
    it to a stopped or interrupted run's reader changed nothing."""
    if run.status == "failed":  # not "once it has finished": a failed run finishes only if resumed
        return (f"{run.unfinished}; `dynamics analyse` analyses it once it has finished; without --no-compute the "
                f"report analyses what it has recorded")
    if _finished(run):
        if run.n_recorded < _MIN_SNAPSHOTS:  # analyse refuses it: telling a reader to run it was no help
            return (f"`dynamics analyse` cannot analyse it: only {_recorded(run)}, and an "
                    f"analysis needs {_MIN_SNAPSHOTS}")
        return "run `dynamics analyse`"
    return "`dynamics analyse` analyses it once it has finished; without --no-compute the report analyses what it has recorded"


def training_notes(runs: list[_Run]) -> list[str]:
    """The report's notes on how its runs were trained: by other dynamics code, with another torch
    build, device or CPU kernels, or on other data for one task setting (`dynamics.provenance`); and
    completed runs that training made worse, or whose heads it never moved (`dynamics.caveats`), which
    the figures draw like any other."""
    return [n for n in [mixed_code({r.run_id: r.code for r in runs if r.code}),
                        mixed_execution({r.run_id: r.execution for r in runs if r.execution}),
                        mixed_data({r.run_id: r.data for r in runs if r.data}),
                        mixed_importance({r.run_id: r.importance_form for r in runs if r.importance_form})] if n] + notes(
        {r.run_id: r.caveats for r in runs})


def _finished(run: _Run) -> bool:
    """Training ended on its own (completed or diverged): its analysis will not change any more."""
    return run.status in FINISHED_STATUSES


def _with_caveats(run: _Run, ds: xr.Dataset) -> _Run:
    """``run`` with its caveats (`dynamics.caveats`), read from its analysis where it has one."""
    with contextlib.suppress(Exception):  # a damaged recording is named by its analysis, as before
        run.caveats = of_run(ds, run.status, run.analysis)
    return run


def _collect_run(path, run_id: str, index: dict | None, compute_missing: bool, attrs: dict) -> _Run:
    # "stopped": killed, resumable with the same command; one that ended since `attrs` were read,
    # its last loss and recorded snapshots as it ended, not "completed" beside the "-" of a loss
    # it had not written yet
    status, attrs = store.run_now(path, run_id, attrs)
    ds = store.open_run(path, run_id, dask=False)  # plain zarr reads: a dask task per chunk cost 3x on long runs
    point = (index or {}).get("runs", {}).get(run_id)
    if point is None:  # no sweep index entry: the swept axes' values from the run's own config
        point = {a: config_value(attrs.get("config", {}), a) for a in (index or {}).get("axes", [])}
    last_loss = _float_or_none(attrs.get("last_loss"))
    if attrs.get("status") not in FINISHED_STATUSES:
        # as `dynamics status` says it: the last loss its store records, not the attrs' (its
        # session's last, past the checkpoint; after a kill, an earlier session's or none)
        from dynamics.status import resumes_at

        last_loss = resumes_at(path, run_id, attrs, status)[1]
    run = _Run(
        run_id=run_id,
        status=status,
        params=dict(point),
        last_loss=last_loss,
        n_snapshots=int(ds.sizes.get("snapshot", 0)),
        recorded=store.recorded_mask(ds, attrs) if "snapshot" in ds.dims else np.zeros(0, bool),
        steps=np.asarray(ds["step"].values) if "step" in ds.coords else np.arange(ds.sizes.get("snapshot", 0)),
        settings=read_settings(attrs.get("config", {})),
        unfinished=unfinished_reason(status, attrs),
        code=trained_by(attrs),
        execution=trained_on(attrs),
        data=trained_on_data(attrs),
        importance_form=importance_form(attrs),
        seed=attrs.get("seed"),
    )
    stale, unread = False, ""
    try:
        # loaded in the open: values and attributes of one version, were `analyse` to swap one in
        stored = store.open_analysis(path, run_id, stale="allow", dask=False, load=_RUN_VARS)
        if stored is not None and not is_current(stored):
            stored, stale = None, True  # older analysers' results: not mixed with this version's
        run.analysis = stored
    except Exception as e:  # noqa: BLE001 - e.g. being rewritten by `dynamics analyse` right now: analyse here
        stored = run.analysis = None
        # or damaged (a chunk failing its checksum): said, so that the page does not hide it
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        why = "a chunk failed its checksum" if store.failed_checksum(e) else f"{type(e).__name__}: {why}"
        # a StoreError may say it, or say what to do first (analysis/ a file, which analyse refuses)
        again = "" if "writes it again" in why or "move it aside" in why else "; `dynamics analyse` writes it again"
        unread = f"its stored analysis could not be read ({why}{again})"
        if is_damage(e):
            run.damage.append(f"run {run_id}: {unread}")
    if stored is not None:
        run.analysis_source = "stored"
        lacking = set(_RUN_VARS) - set(stored.data_vars)
        if stored.attrs.get("probe_resamples") == 0:  # one probe: nothing to resample, left out on purpose
            lacking -= {"bifurcation_resampled", "role_resampled"}
        lacking = sorted(lacking)
        run.analysis_note = "stored by `dynamics analyse`" + (f" (lacks {', '.join(lacking)})" if lacking else "")
        return _with_caveats(run, ds)
    if not compute_missing:
        run.analysis_note = (f"stored analysis is from an older version of the analysers ({_to_analyse(run)})"
                             if stale else unread or f"no stored analysis ({_to_analyse(run)})")
        return _with_caveats(run, ds)
    if run.n_recorded < _MIN_SNAPSHOTS:
        run.analysis_note = f"only {_recorded(run)}; analysis needs {_MIN_SNAPSHOTS}"
        return _with_caveats(run, ds)
    # js_distance too (small: no query/key dims), so the chosen run is not analysed twice.
    try:
        run.analysis = _analyse_recorded(ds, run.recorded, [*_RUN_VARS, "js_distance"])
    except Exception as e:  # noqa: BLE001 - one odd run (e.g. diverged to NaN) must not sink the page
        if is_damage(e):  # a recording failing its checksum: named (run, array, snapshot), and exit 1
            damage = store.unreadable_chunk(path, run_id) if store.failed_checksum(e) else None
            run.damage.append(str(damage) if damage is not None else f"run {run_id}: its recordings could not be read ({_why(e)})")
            run.analysis_note = f"analysing it here failed: {run.damage[-1]}" + (f"; {unread}" if unread else "")
        else:
            run.analysis_note = f"analysing it here failed ({type(e).__name__}: {e})"
        return _with_caveats(run, ds)
    run.analysis_source = "computed"
    partial = "" if run.n_recorded == run.n_snapshots else f" on {run.n_recorded} of {run.n_snapshots} snapshots"
    run.analysis_note = f"computed for this report{partial} (not stored)" + (
        "; the stored one is from an older version of the analysers (run `dynamics analyse`)" if stale else "") + (
        f"; {unread}" if unread else "")
    return _with_caveats(run, ds)


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


def _chosen_analysis(path, run: _Run, compute_missing: bool, damaged: list[str] | None = None
                     ) -> tuple[xr.Dataset | None, str]:
    """Roles per snapshot and the last snapshot's JS distances of the chosen run; a stored analysis
    found damaged here and not by the run's row (its JS distances) is added to `damaged`."""
    unread = False
    try:
        # read in the open, as the runs' rows are: one version's attributes, roles and distances
        stored = store.open_analysis(path, run.run_id, stale="allow", dask=False, load=("role", "js_distance"))
        if stored is not None and "js_distance" in stored and is_current(stored):
            out = stored[[v for v in ("role",) if v in stored]]  # with the analysis's attributes
            return _with_last_js(out, stored["js_distance"].isel(snapshot=-1)), "stored"
    except Exception as e:  # noqa: BLE001 - damaged (a lost chunk, a failed checksum): as the runs table says
        stored, unread = None, True
        if damaged is not None and is_damage(e) and not run.damage:
            damaged.append(f"run {run.run_id}: its stored analysis could not be read ({_why(e)})")
        if not compute_missing:
            return None, f"the run's stored analysis could not be read (see the runs table; {_to_analyse(run)})"
    if not compute_missing:  # said as the runs table says it: a stale analysis is no missing one
        if stored is None:
            return None, f"the run has no stored analysis ({_to_analyse(run)})"
        if not is_current(stored):
            return None, f"the run's stored analysis is from an older version of the analysers ({_to_analyse(run)})"
        return None, f"the run's stored analysis lacks its JS distances ({_to_analyse(run)})"
    if run.n_recorded < _MIN_SNAPSHOTS:
        return None, f"the run has only {_recorded(run)}"
    out = run.analysis if run.analysis_source == "computed" else None
    if out is None or "js_distance" not in out:
        out = _analyse_recorded(store.open_run(path, run.run_id, dask=False), run.recorded, ["role", "js_distance"])
    out = out[[v for v in ("role", "js_distance") if v in out]]
    out.attrs.setdefault("cluster_threshold", AnalysisOptions().cluster_threshold)
    # its JS distances may be what failed, which the runs table (whose figures need none) did not read
    return (_with_last_js(out.drop_vars("js_distance"), out["js_distance"].isel(snapshot=-1)),
            "computed: stored unreadable" if unread else "computed")


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


def _setting_axes(runs: list[_Run], axes: list[str]) -> list[str]:
    """Settings that tell apart runs with the same non-seed swept values, added to their params.

    Sweeps of other base configs into one store (``--set train.lr=...``) give such runs; grouped
    by the swept values alone, their curves would be averaged as if they were seeds of one config.
    """
    group_axes = [a for a in axes if not _is_seed(a)]
    if not group_axes:
        return []  # every run is its own group: nothing is averaged
    points: dict[str, list[_Run]] = {}
    for r in runs:
        if r.settings:
            points.setdefault(json.dumps([r.params.get(a) for a in group_axes], sort_keys=True), []).append(r)
    extra: list[str] = []
    for peers in points.values():
        extra += [k for k in differing_settings(r.settings for r in peers) if k not in axes and k not in extra]
    for r in runs:
        if r.settings:
            r.params.update({k: r.settings.get(k) for k in extra})
    return extra


def _table_settings(runs: list[_Run], swept: list[str], axes: list[str]) -> list[str]:
    """Settings the runs table shows past the swept axes: those the figures group by (`axes`), and
    any that tell apart runs at one swept point, seed included. Without them the table showed such
    runs as identical rows: two sweeps of one grid from other base configs, or a seed-only sweep of
    conditioned gates beside its free runs (README, Configs), which the figures draw run by run.
    The same columns, in the same order, as ``dynamics status`` (:func:`dynamics.status.setting_columns`)."""
    from dynamics.status import setting_columns  # one grouping, so both tables name them alike

    extra = [a for a in axes if a not in swept]
    differ = setting_columns({r.run_id: r.settings for r in runs if r.settings},
                             {r.run_id: [r.params.get(a) for a in swept] for r in runs})
    return extra + [k for k in differ if k not in swept and k not in extra]


def _is_seed(axis: str) -> bool:
    return axis.split(".")[-1] == "seed"


# --------------------------------------------------------------------------- derived datasets


def _derived_names(path) -> list[str]:
    """Names of the derived datasets: ``<name>``, or ``<name>/<sub>`` for a folder of groups.

    Read from the store's directory listing (through fsspec, so URLs work too): the store
    module has no listing for derived groups, and nested names are legal on disk.
    """
    import fsspec

    url = store.local_path(path) or os.fspath(path)  # a local one as the store reads it
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


def _open_derived(path, name: str, load: bool | tuple[str, ...] = False) -> xr.Dataset | None:
    if "/" not in name:  # a damaged group's StoreError goes to the caller, not to a read of fill values
        return store.open_derived(path, name, load=load)
    # Nested names (folder/<name>, an older layout) are not single group names for store.open_derived.
    # the local folder as the store reads it (`lnk/..` past the link: xarray would drop it as text)
    ds = xr.open_zarr(store.local_path(path) or os.fspath(path), group=f"derived/{name}", consolidated=False)
    return ds if load is False else ds.load() if load is True else ds[[v for v in load if v in ds]].load()
