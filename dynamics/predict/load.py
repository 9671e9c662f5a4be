"""Loading the completed runs of a store with their cross-validation groups, and checking them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dynamics import store
from dynamics.identity import differing_settings, experiment_identity, read_settings, setting_cell, setting_text
from dynamics.predict.options import SEED_AXIS, PredictError, PredictOptions, Run, check_arguments
from dynamics.predict.targets import STORED_READS, UNREADABLE_LABELS, no_attention_refusal, stored_reads
from dynamics.schema import config_value
from dynamics.status import sweep_points

# --------------------------------------------------------------------------- loading


def _seed_of(point: Mapping, attrs: Mapping) -> Any:
    if SEED_AXIS in point:
        return point[SEED_AXIS]
    if "seed" in attrs:
        return attrs["seed"]
    return attrs.get("config", {}).get("train", {}).get("seed")


def _config_of(point: Mapping, axes: Sequence[str], attrs: Mapping) -> str:
    if axes:
        return ", ".join(f"{a}={setting_cell(point.get(a))}" for a in axes if a != SEED_AXIS)
    # no sweep index: the experiment (config less sweep table, device, threads) less the seed
    return json.dumps(experiment_identity(attrs.get("config", {}), without_seed=True), sort_keys=True)


def _told_apart(runs: list[Run], configs: dict[str, dict]) -> list[Run]:
    """`runs` whose config label (swept values) is shared by runs of other configs (a second sweep of
    the grid from another base config) with the settings that tell them apart: one label, one config."""
    sharing: dict[str, list[Run]] = {}
    for r in runs:
        sharing.setdefault(r.config, []).append(r)
    out = {}
    for label, peers in sharing.items():
        flat = {r.run_id: read_settings(configs[r.run_id]) for r in peers}
        extra = differing_settings(flat.values())
        for r in peers:
            text = ", ".join(f"{k}={setting_text(flat[r.run_id], k)}" for k in extra)  # none: lacks or does not read it
            out[r.run_id] = dataclasses.replace(r, config=f"{label}, {text}" if extra and label else label or text)
    return [out[r.run_id] for r in runs]


def load_runs(path: str, options: PredictOptions | None = None) -> list[Run]:
    """The completed runs of a store, opened lazily, with their groups; checks before any work.

    `load_store` without the list of runs left out.
    """
    return load_store(path, options)[0]


def load_store(path: str, options: PredictOptions | None = None) -> tuple[list[Run], list[str]]:
    """The completed runs of a store, opened lazily, with their groups, and the runs left out.

    Runs whose status is not "completed" (running, diverged, failed...) are left out: their
    last snapshot is not a final specialisation; so are the sweep index's points not started yet
    (``pending``). Reads only metadata.

    Parameters
    ----------
    path : str
        A dynamics store.
    options : PredictOptions, optional

    Returns
    -------
    runs : list of Run
        In sweep-index order, then the runs outside the index in store order.
    left_out : list of str
        ``"<run_id> (<status>)"`` for each run left out: a curve over the runs that finished
        says nothing of those that diverged, and a reader must be told they exist. A run that
        cannot be read (see ``dynamics.status.damaged_runs``) is ``"<run_id> (damaged)"``.

    Raises
    ------
    PredictError
        Fewer than two completed runs; fewer than two groups for the chosen grouping; a
        target whose inputs no run has (``chg_role``, or both attention and analysis); a
        step horizon past the end of a run.
    store.StoreError
        If `path` is not a store.
    """
    check_arguments("load_store", options, PredictOptions)  # predict_store and load_runs come through here
    opt = options or PredictOptions()
    # A damaged run (group metadata unreadable, or a chunk it wrote gone) is left out and named, as
    # analyse and report do: refusing the store made one damaged run of a hundred stop every prediction.
    present = store.list_runs(path, damaged="include")
    index = sweep_points(path, present)  # an index entry that is no run id is no point (status names it)
    # A run trained into the store by `dynamics run` is in no sweep index, but it is one of the
    # store's runs (analyse and report include it): left out, it would vanish from the counts.
    # A sweep point not started yet (a sweep still running, or stopped part-way) is a run of the
    # sweep too, as `status` and the report list it: a curve over 3 of 6 points read as 3 of 4.
    ids = list(index.get("runs", {}))
    ids += [r for r in present if r not in ids]
    axes = list(index.get("axes", []))
    runs, skipped, configs = [], [], {}
    for rid in ids:
        if rid not in present:
            skipped.append(f"{rid} (pending)")
            continue
        try:
            attrs = store.run_attrs(path, rid)
            if attrs.get("status") == "completed":
                store.check_recorded(path, rid, attrs=attrs)
        except store.StoreError:
            skipped.append(f"{rid} (damaged)")
            continue
        if attrs.get("status") != "completed":
            # "stopped" for a killed run, as status, analyse and the report name it: its attrs
            # still say "running", which it is not
            skipped.append(f"{rid} ({store.run_status(path, rid, attrs) if 'status' in attrs else 'no status'})")
            continue
        point = index.get("runs", {}).get(rid)
        if point is None:  # as the report does: the swept axes' values from the run's own config
            values = {a: config_value(attrs.get("config", {}), a) for a in axes}
            point = {a: v for a, v in values.items() if v is not None}
        try:
            data = store.open_run(path, rid)
        except Exception:  # an index coordinate, read on opening, that cannot be decoded: named
            if store.unreadable_chunk(path, rid) is None:
                raise
            skipped.append(f"{rid} (damaged)")
            continue
        analysis, unreadable = None, ""
        if opt.use_stored_analysis:
            try:
                analysis = _stored_analysis(path, rid, opt.target)
            except Exception as e:  # noqa: BLE001 - a lost chunk, or an index coordinate (read on
                # opening) failing its checksum: recomputed from the run, and named (targets)
                unreadable = f"{type(e).__name__}: {e}"
        runs.append(Run(rid, data, _seed_of(point, attrs), _config_of(point, axes, attrs), analysis,
                        unreadable))
        configs[rid] = attrs.get("config", {})
    if axes:
        runs = _told_apart(runs, configs)
    note = f" ({len(skipped)} left out: {', '.join(skipped[:3])}{'...' if len(skipped) > 3 else ''})" if skipped else ""
    if len(runs) < 2:
        raise PredictError(f"{path}: {len(runs)} completed run(s){note}; prediction needs at least 2")
    check_runs(runs, opt)
    return runs, skipped


def _stored_analysis(path: str, run_id: str, target: str):
    """A run's stored analysis, None if it has none: only what the targets and the caveats
    (``divergence_from_init``) read, and read now, inside the open's check of one version.

    Every target's labels where they can all be read (small, and a run loaded for one target
    may serve another: `predict_runs`), else only `target`'s, so that a bad chunk in labels this
    target does not read (another target's, or the caveats') leaves its own readable; raises
    where those cannot be read."""
    try:
        return store.open_analysis(path, run_id, stale="allow", dask=False, load=(*STORED_READS, "divergence_from_init"))
    except Exception as e:  # noqa: BLE001 - damaged, perhaps in what `target` does not read: tried again below
        damage = f"{type(e).__name__}: {e}"
    analysis = store.open_analysis(path, run_id, stale="allow", dask=False, load=stored_reads(target))
    if analysis is not None:  # the labels it holds and left out are named damaged, not absent, to another target
        held = store.open_analysis(path, run_id, stale="allow", dask=False).data_vars
        analysis.attrs[UNREADABLE_LABELS] = {v: damage for v in STORED_READS if v in held and v not in analysis}
    return analysis


def naming_damaged(error: PredictError, left_out: Sequence[str]) -> PredictError:
    """`error` with the runs `load_store` left out as damaged named: a refusal for another reason
    (one seed's runs, say) said nothing of them, where the curve's table would have.

    >>> str(naming_damaged(PredictError("1 group(s)"), ["r1 (damaged)", "r2 (stopped)"]))
    '1 group(s) (besides, left out as damaged: r1)'
    """
    damaged = [r.removesuffix(" (damaged)") for r in left_out if r.endswith(" (damaged)")]
    return PredictError(f"{error} (besides, left out as damaged: {', '.join(damaged)})") if damaged else error


def check_runs(runs: Sequence[Run], options: PredictOptions) -> None:
    """Checks that need no array values: groups, target inputs, horizon range."""
    groups = sorted({r.group(options.group_by) for r in runs})
    if len(groups) < 2:
        alt = "; try --group run" if options.group_by != "run" else ""
        raise PredictError(
            f"grouping by {options.group_by}: all {len(runs)} runs fall in one group ({groups[0]!r}), "
            f"so cross-validation is impossible{alt}"
        )
    t = options.target
    if t == "chg" and not any("chg_role" in r.data for r in runs):
        # "never fitted" was wrong of a store whose runs `dynamics gates` had fitted afterwards: the
        # target is the class fitted during training, which those fits do not give
        raise PredictError("target 'chg': no run records chg_role (causal head gating fitted during training, "
                           "record.chg_every > 0; fits by `dynamics gates` afterwards are not read)")
    if t == "importance":
        lacking = [r.run_id for r in runs if "importance" not in r.data]
        if lacking:
            raise PredictError(f"target 'importance': run {lacking[0]!r} records no importance")
    if t in ("slash", "role", "redundant"):
        stored = options.use_stored_analysis  # False: an analysis a Run carries is not read (target_table)
        lacking = [r for r in runs if "attention" not in r.data and (r.analysis is None or not stored)]
        if lacking and stored and lacking[0].analysis_unreadable:  # as final_targets says it of a bad chunk
            raise no_attention_refusal(t, lacking[0].run_id, f"cannot be read ({lacking[0].analysis_unreadable})")
        if lacking:
            why = "neither attention nor a stored analysis" if stored else "no attention to compute it from"
            raise PredictError(f"target {t!r}: run {lacking[0].run_id!r} has {why}")
    if not any(v in r.data for r in runs for v in ("grad_norm", "importance", "attention")):
        raise PredictError("no run records grad_norm, importance or attention: nothing to build features from")
    if options.unit == "step":
        for r in runs:
            final = float(np.max(r.data["step"].values))
            if max(options.horizons) > final:
                raise PredictError(
                    f"horizon step {max(options.horizons):g} out of range: run {r.run_id!r} ends at step {final:g}"
                )


def derived_name(target: str) -> str:
    """Name of the curve of `target` under ``STORE/derived/`` (a group name has no '/')."""
    return f"predict.{target}"


def write_curve(path: str, curve) -> str:
    """Store `curve` as ``derived/predict.<target>`` (replacing it); returns that name."""
    name = derived_name(curve.attrs["target"])
    store.write_derived(path, name, curve)
    return name


def replaced_note(path: str, curve) -> str:
    """What saving `curve` replaces, said before it does: a quick variant's curve took the place of
    the demo's five horizons without a word, and the report then showed only the new one.

    Empty where no curve of its target is saved (or the saved one cannot be read)."""
    try:
        before = store.open_derived(path, derived_name(curve.attrs["target"]))
    except Exception:  # noqa: BLE001 - damaged: replaced all the same, and its reader names it
        return ""
    if before is None or "horizon" not in before.dims:
        return ""
    old = [f"{float(h):g}" for h in before["horizon"].values]
    unit = before.attrs.get("horizon_unit", "fraction")
    return (f" (replacing the curve saved before, of horizons {','.join(old)} ({unit}); --no-save prints a "
            f"curve without replacing it)")


def save_curve(path: str, curve) -> str:
    """:func:`write_curve`, and the line that says so: the name, and the curve it replaced."""
    replacing = replaced_note(path, curve)  # read before the write replaces it
    return f"saved derived/{write_curve(path, curve)} in {path}{replacing}"
