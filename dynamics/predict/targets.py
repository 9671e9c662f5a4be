"""Targets: each head's final specialisation, read from its run's final snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace

import numpy as np
import xarray as xr

from dynamics.analysis.bifurcation import head_importance, last_recorded
from dynamics.analysis.divergence import js_distance
from dynamics.analysis.pipeline import AnalysisOptions, is_current, slash_dominance
from dynamics.analysis.probe_resample import LABEL_AGREEMENT, N_RESAMPLES, RESAMPLE, label_agreement, probe_counts
from dynamics.analysis.redundancy import cluster_heads
from dynamics.analysis.roles import ROLES, assign_roles, role_scores
from dynamics.analysis.slash import slash_score
from dynamics.predict.features import _rank_in_layer
from dynamics.predict.options import CHG_CLASSES, TARGETS, PredictError, PredictOptions, Run, check_arguments
from dynamics.schema import ANALYSIS_VERSION, HEAD, LAYER, SNAPSHOT

# --------------------------------------------------------------------------- targets


def class_name(target: str, code: float) -> str:
    """Name of a code of the ``role`` or ``chg`` target; the number itself otherwise."""
    names = {"role": ROLES, "chg": CHG_CLASSES}.get(target)
    return names[int(code)] if names is not None and 0 <= code < len(names) else f"{code:g}"


def _settings(target: str, opt: AnalysisOptions, n_query: int) -> dict:
    # The analysis attrs (as `analyse_run` writes them) that define each stored target.
    if target == "slash":
        return {"kappa": opt.kappa, "slash_offsets": [opt.slash_min_offset, opt.slash_window(n_query)]}
    if target == "role":
        return {"role_thresholds": asdict(opt.roles)}  # every role's threshold, the token role's included
    return {"cluster_threshold": opt.cluster_threshold}


def _same(stored, wanted) -> bool:
    # Attrs compared by value: a store round trip turns tuples into lists and may give numpy scalars.
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and set(stored) == set(wanted) and all(_same(stored[k], wanted[k]) for k in wanted)
    if stored is None or wanted is None:
        return stored is None and wanted is None
    return np.array_equal(np.asarray(stored, dtype=np.float64), np.asarray(wanted, dtype=np.float64))


def _final_stored(run: xr.Dataset, analysis: xr.Dataset | None, needed: tuple[str, ...], target: str,
                  opt: AnalysisOptions) -> xr.Dataset | None:
    # The stored analysis's final snapshot, if it has what is needed, covers the run's end and
    # was computed with these thresholds: a target read under other thresholds than the ones
    # the curve records (its analysis_options attrs) would be a different target. Else None,
    # to be recomputed from the final snapshot, or, for a run without attention, a refusal
    # naming why (recomputing it there was a KeyError).
    why = _not_usable(run, analysis, needed, target, opt)
    if why and "attention" not in run:
        raise no_attention_refusal(target, run.attrs.get("run_id", "?"), why)
    if why:
        return None
    try:
        return analysis[list(needed)].isel({SNAPSHOT: -1}).load()
    except Exception as e:  # noqa: BLE001 - any codec's error: a damaged chunk
        raise _Unreadable(f"{type(e).__name__}: {e}") from e


def no_attention_refusal(target: str, run_id: str, why: str) -> PredictError:
    """The refusal of a run whose stored analysis cannot give `target` (`why` ends the sentence)
    and which has no attention to recompute it from (final_targets and check_runs say it alike)."""
    return PredictError(f"target {target!r}: run {run_id!r}'s stored analysis {why}, and the run has no attention "
                        f"to recompute it from")


def _not_usable(run: xr.Dataset, analysis: xr.Dataset | None, needed: tuple[str, ...], target: str,
                opt: AnalysisOptions) -> str:
    """Why the stored analysis cannot give `target` (as the end of a sentence), "" where it can."""
    if analysis is None:
        return "is not there"
    lacking = [v for v in (*needed, "step") if v not in analysis.variables]
    if lacking and (damage := analysis.attrs.get(UNREADABLE_LABELS, {}).get(lacking[0])):
        raise _Unreadable(damage)  # left out as it was opened (`load_store`): damaged, not absent
    if lacking:
        return f"has no {lacking[0]}"
    if not is_current(analysis):
        return (f"was written by analysers version {analysis.attrs.get('analysis_version', '(none)')}, "
                f"these are version {ANALYSIS_VERSION}")
    shape, wanted = [analysis.sizes.get(d) for d in (LAYER, HEAD)], [run.sizes.get(d) for d in (LAYER, HEAD)]
    if shape != wanted:  # a run picked from a sweep of wider models, padded with NaN heads: a broadcast error
        return f"has {shape[0]} layer(s) of {shape[1]} head(s), where the run has {wanted[0]} of {wanted[1]}"
    try:
        last_step = float(analysis["step"].values[-1])
    except Exception as e:  # noqa: BLE001 - any codec's error: a damaged chunk
        raise _Unreadable(f"{type(e).__name__}: {e}") from e
    final = float(np.nanmax(run["step"].values))  # NaN steps: a sweep's padding
    if last_step != final:
        return f"ends at step {last_step:g}, not at the run's final step {final:g} (analysed before the run ended)"
    a = analysis.attrs
    n_query = run["attention"].sizes["query"] if "attention" in run else run["probe_tokens"].shape[-1]
    for key, value in _settings(target, opt, n_query).items():
        if key not in a or not _same(a[key], value):
            return f"has {key} = {a.get(key)!r}, not {value!r}"
    return ""


def _role_resampled(analysis: xr.Dataset | None, last: xr.Dataset, opt: AnalysisOptions) -> xr.DataArray | None:
    """The final labels on the analysis's probe resamples ``(resample, layer, head)``: stored with the
    targets read from ``analysis`` (the same analysers, thresholds and final step), else computed
    as `analyse_run` does; None for a run of one probe (or without attention)."""
    if analysis is not None and "role_resampled" not in analysis:
        return None
    if analysis is not None:
        try:
            return analysis["role_resampled"].load()
        except Exception:  # noqa: BLE001 - a damaged chunk (the labels read): computed below, as from no analysis
            pass
    if "attention" not in last or last.sizes["probe"] < 2:
        return None
    attn = last["attention"].transpose(LAYER, HEAD, ...).load()
    weights = probe_counts(attn.sizes["probe"])
    return assign_roles(role_scores(attn, last["probe_tokens"].load(), opt.roles, weights=weights), opt.roles)


STORED_TARGETS = {"slash": ("slash_dominant", "best_offset"), "role": ("role",), "redundant": ("cluster",)}
"""The variables of a stored analysis that give each target at its final snapshot."""


def stored_reads(target: str) -> tuple[str, ...]:
    """The variables `final_targets` reads of a stored analysis for `target`.

    >>> stored_reads("role"), stored_reads("importance")
    (('role', 'role_resampled'), ())
    """
    return STORED_TARGETS.get(target, ()) + (("role_resampled",) if target == "role" else ())


STORED_READS = tuple(dict.fromkeys(v for target in STORED_TARGETS for v in stored_reads(target)))
"""Every variable `final_targets` reads of a stored analysis, for any target, so that a caller can
read them all at once, as of one version of the analysis (`dynamics.store.open_analysis`'s
``load``): read later, an `analyse` swapping in another version between the open and the read
gave the old version's attributes (thresholds, final step) with the new one's labels. Each is a
number or label per head (and snapshot): small, whatever the target, so runs loaded for one target
serve another (`predict_runs` with other options)."""


UNREADABLE_LABELS = "unreadable_labels"
"""Attr of an analysis `load_store` opened in part, a bad chunk elsewhere: {variable: the error}
of the labels left out, damaged rather than absent."""


class _Unreadable(Exception):
    """A stored analysis chunk that cannot be read: gone, cut short, or failing its checksum."""


UNREADABLE_SOURCE = "computed from the final snapshot (the stored analysis could not be read)"
"""Target source of a run whose stored analysis is damaged: recomputed, as if it had none, and
counted apart in the curve's ``target_sources`` so that the damage is not silent."""


def final_targets(
    run: xr.Dataset,
    target: str,
    analysis: xr.Dataset | None = None,
    options: AnalysisOptions | None = None,
) -> xr.Dataset:
    """One target per head, read from the run's final snapshot.

    From the stored analysis when it is given, was made by these analysers, covers the final
    step and records the thresholds of `options` (kappa and slash offsets, cluster threshold,
    every role threshold), else computed from the final snapshot with the analysers (the same
    calls as `analyse_run`).

    Parameters
    ----------
    run : Dataset
        The whole run.
    target : str
        One of `TARGETS`.
    analysis : Dataset, optional
        ``analysis/<run_id>`` as stored.
    options : AnalysisOptions, optional
        Thresholds used when the targets are computed here.

    Returns
    -------
    Dataset
        ``(layer, head)``: ``target`` float64, NaN where a head has no label (no CHG fit,
        missing head, a lone head for the importance rank and
        for redundancy); for ``slash`` also ``offset``, the
        best slash offset; for ``role`` of a run of two or more probes also ``agreement``, the
        share of the probe resamples giving each head its label (``role_resampled``).
        ``attrs["source"]`` says where the targets came from.

    Examples
    --------
    >>> final_targets(open_run("runs.zarr"), "slash")["target"].values  # doctest: +SKIP
    """
    check_arguments("final_targets", options, AnalysisOptions, run)
    if target not in TARGETS:
        raise PredictError(f"unknown target {target!r}; one of: {', '.join(TARGETS)}")
    opt = options or AnalysisOptions()
    # A run picked from a sweep (.sel(run=...)) keeps the sweep's padding: a shorter run's last
    # snapshot is its last recorded one (isel(-1) read its NaN padding: every role 'none').
    last = last_recorded(run)
    # and a head it lacks (a sweep of head counts) is padding too: no label
    present = (last["attention"].isel(probe=0, query=0, key=0).transpose(LAYER, HEAD).notnull().values
               if "attention" in last else None)
    out = xr.Dataset()
    source = "recorded"

    if target == "importance":
        imp = head_importance(last["importance"], last["gate"] if "gate" in last else None)  # Michel et al.'s
        imp = np.asarray(imp.transpose(LAYER, HEAD).values, dtype=np.float64)
        # a head with no peer in its layer (a layer of one, or one importance left) has no rank
        peers = (~np.isnan(imp)).sum(axis=1, keepdims=True) > 1  # (L, 1)
        out["target"] = ((LAYER, HEAD), np.where(peers, _rank_in_layer(imp), np.nan))
    elif target == "chg":
        codes = np.asarray(last["chg_role"].transpose(LAYER, HEAD).values, dtype=np.float64)
        out["target"] = ((LAYER, HEAD), np.where(codes >= 0, codes, np.nan))  # -1: not fitted
    else:
        needed = STORED_TARGETS[target]
        try:
            stored = _final_stored(run, analysis, needed, target, opt)
            source = "stored analysis" if stored is not None else "computed from the final snapshot"
        except _Unreadable as e:
            if "attention" not in run:
                raise no_attention_refusal(target, run.attrs.get("run_id", "?"), f"cannot be read ({e})") from None
            stored, source = None, UNREADABLE_SOURCE
        if stored is None:
            attn = last["attention"].transpose(LAYER, HEAD, ...).load()
            if target == "slash":
                scores = slash_score(attn, max_offset=opt.slash_window(attn.sizes["query"]))
                offset, _, dominant = slash_dominance(scores, opt, attn.sizes["query"])
                stored = xr.Dataset({"slash_dominant": dominant, "best_offset": offset})
            elif target == "role":
                stored = xr.Dataset({"role": assign_roles(role_scores(attn, last["probe_tokens"].load(), opt.roles), opt.roles)})
            else:
                stored = xr.Dataset({"cluster": cluster_heads(js_distance(attn), threshold=opt.cluster_threshold)})
        stored = stored.transpose(LAYER, HEAD, ...)
        if target == "slash":
            flag = np.asarray(stored["slash_dominant"].values, dtype=np.float64)
            out["target"] = ((LAYER, HEAD), flag if present is None else np.where(present, flag, np.nan))
            out["offset"] = ((LAYER, HEAD), np.asarray(stored["best_offset"].values, dtype=np.float64))
        elif target == "role":
            codes = np.asarray(stored["role"].values, dtype=np.float64)  # a missing head's scores: NaN, so 'none'
            out["target"] = ((LAYER, HEAD), codes if present is None else np.where(present, codes, np.nan))
            again = _role_resampled(analysis if source == "stored analysis" else None, last, opt)
            if again is not None:  # how far each label rests on the run's probe sample
                agreement = label_agreement(out["target"], again.transpose(RESAMPLE, LAYER, HEAD).drop_vars(
                    [c for c in again.coords if c in (LAYER, HEAD)]))
                out["agreement"] = agreement.transpose(LAYER, HEAD)
        else:
            labels = np.asarray(stored["cluster"].values, dtype=np.int64)
            valid = labels >= 0
            counts = np.bincount(labels[valid].ravel(), minlength=1) if valid.any() else np.zeros(1, int)
            shared = counts[np.where(valid, labels, 0)] >= 2
            # A lone head has nothing to be redundant with: no label, as for the importance rank.
            label = valid if valid.sum() >= 2 else np.zeros_like(valid)
            out["target"] = ((LAYER, HEAD), np.where(label, shared.astype(np.float64), np.nan))
    out = out.assign_coords({d: last[d].values for d in (LAYER, HEAD) if d in last.coords})
    out.attrs["source"] = source
    return out


def _varies(runs: Sequence[Run], target: str, options: PredictOptions) -> bool:
    """Whether `target`'s labels take two values or more over `runs` (a run that cannot give it,
    for want of a recording or a readable analysis, left out), and `predict` takes it on them (a
    run without importance refuses that target): read only to refuse a constant one."""
    from dynamics.predict.load import check_runs  # load imports this module

    try:
        check_runs(runs, replace(options, target=target))
    except PredictError:
        return False
    seen: set[float] = set()
    for r in runs:
        try:
            ft = final_targets(r.data, target, r.analysis if options.use_stored_analysis else None, options.analysis)
        except Exception:  # noqa: BLE001 - importance not recorded, chg not fitted, a damaged chunk: no labels here
            continue
        values = ft["target"].values
        seen.update(np.unique(values[np.isfinite(values)]).tolist())
        if len(seen) > 1:
            return True
    return False


def probe_sensitive_note(agreement) -> list[str]:
    """The line under a role curve on the heads whose final label fewer than 90% of the probe
    resamples give (``target_agreement``; None or all NaN: no line), as analyse names them."""
    agreement = np.asarray([] if agreement is None else agreement, dtype=np.float64)
    if not (few := int((agreement < LABEL_AGREEMENT).sum())):
        return []
    return [f"probe-sensitive targets: {few} of the {int(np.isfinite(agreement).sum())} heads measured get their final "
            f"label on fewer than {LABEL_AGREEMENT:.0%} of {N_RESAMPLES} bootstrap resamples of their run's probes, so "
            f"other probes like these may label them otherwise: some misses there may be the label's, not the model's "
            f"(target_agreement)"]


# --------------------------------------------------------------------------- tables


def target_table(runs: Sequence[Run], options: PredictOptions) -> xr.Dataset:
    """Targets of every labelled head, one row per head (``head_row``).

    Returns
    -------
    Dataset
        ``target`` (head_row) and, for slash, ``offset``; coords ``row_run``, ``row_layer``,
        ``row_head``, ``row_group``; ``attrs["sources"]`` counts runs by target source, and
        ``attrs["analysis_unreadable"]`` names the runs whose stored analysis was damaged, and
        ``attrs["unlabelled"]`` the runs with no head labelled, as "<run_id> (<why>)".

    Raises
    ------
    PredictError
        Fewer than ``options.min_heads`` labelled heads, or a target with one value only.
    """
    pieces, sources, unreadable, unlabelled = [], {}, [], []
    for r in runs:
        if options.target == "chg" and "chg_role" not in r.data:
            # CHG not fitted in this run: its heads have no label, and the curve says so
            unlabelled.append(f"{r.run_id} (no CHG fit recorded: record.chg_every = 0)")
            continue
        # A Run built in memory may carry its analysis whatever the options say; the curve records
        # use_stored_analysis, so honour it here, not only where load_store opens the analysis.
        analysis = r.analysis if options.use_stored_analysis else None
        ft = final_targets(r.data, options.target, analysis, options.analysis)
        if options.use_stored_analysis and r.analysis_unreadable and ft.attrs["source"] != "recorded":
            ft.attrs["source"] = UNREADABLE_SOURCE  # opening it failed: computed, as for an unreadable chunk
        sources[ft.attrs["source"]] = sources.get(ft.attrs["source"], 0) + 1
        unreadable += [r.run_id] if ft.attrs["source"] == UNREADABLE_SOURCE else []
        L, H = ft.sizes[LAYER], ft.sizes[HEAD]
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        keep = np.isfinite(ft["target"].values).ravel()
        if not keep.any():
            # a run given from Python may be one that never finished, which "completed" misnamed
            status = r.data.attrs.get("status", "completed")
            why = ("one head per layer: a rank within its layer is undefined" if options.target == "importance"
                   and H == 1 else "no head labelled at its final snapshot")
            unlabelled.append(f"{r.run_id} ({why}" + (f"; {status}, not completed)" if status != "completed" else ")"))
        row = {
            "target": ft["target"].values.ravel()[keep],
            "row_run": np.full(keep.sum(), r.run_id, dtype=object),
            "row_layer": layer.ravel()[keep],
            "row_head": head.ravel()[keep],
            "row_group": np.full(keep.sum(), r.group(options.group_by), dtype=object),
        }
        if "offset" in ft:
            row["offset"] = ft["offset"].values.ravel()[keep]
        if options.target == "role":
            row["agreement"] = (ft["agreement"].values.ravel()[keep] if "agreement" in ft
                                else np.full(keep.sum(), np.nan))
        pieces.append(row)
    cat = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]} if pieces else {}
    n = len(cat.get("target", ()))
    spec = TARGETS[options.target]
    if n < options.min_heads:
        # the runs that gave none say why, or the refusal reads as a store too small
        why = (f"; {len(unlabelled)} run(s) gave none: {', '.join(unlabelled[:3])}"
               + (f", and {len(unlabelled) - 3} more" if len(unlabelled) > 3 else "")) if unlabelled else ""
        raise PredictError(f"target {options.target!r}: {n} labelled head(s), need at least {options.min_heads}{why}")
    values = np.unique(cat["target"])
    if values.size < 2:
        # The default target (slash) is constant on a store of a task without slash heads, the
        # demo's included: the other targets are the next thing to try
        # (chg only where a run fitted gates: named on a store without, it was refused next)
        fitted = any("chg_role" in r.data for r in runs)
        others = [t for t in TARGETS if t != options.target and (t != "chg" or fitted)]
        varying = [t for t in others if _varies(runs, t, options)]
        # only those that vary: on a store without slash heads whose heads are all redundant, slash
        # and redundant each named the other, and the second was refused the same way
        then = (f"--target {' or '.join(varying)} varies here" if varying
                else f"no other target ({', '.join(others)}) varies on these runs either")
        raise PredictError(f"target {options.target!r} is constant: every one of {n} heads has the value "
                           f"{class_name(options.target, values[0])}; {then}")
    if len(set(cat["row_group"])) < 2:
        raise PredictError(f"target {options.target!r}: labelled heads fall in one group, so cross-validation is impossible")
    ds = xr.Dataset(
        {"target": ("head_row", cat["target"])},
        coords={k: ("head_row", cat[k].astype(str) if cat[k].dtype == object else cat[k])
                for k in ("row_run", "row_layer", "row_head", "row_group")},
    )
    if "offset" in cat:
        ds["offset"] = ("head_row", cat["offset"])
    if "agreement" in cat:
        ds["agreement"] = ("head_row", cat["agreement"])
    ds.attrs.update(target=options.target, task=spec.task, sources=sources, analysis_unreadable=unreadable,
                    unlabelled=unlabelled)
    return ds
