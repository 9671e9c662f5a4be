"""`dynamics analyse`: every analyser over every finished run of a store, runs in parallel; a run
analysed before by this code, from the recording it holds now, is kept (`kept_row`).

Each run is independent (its own ``analysis/<run_id>`` group), so runs are spread over
worker processes, one per core from the command line, like the sweep that trained them: the analysers
are numpy and xarray code that holds the GIL for much of its time, so threads would not
help. The calling process analyses runs too while the workers start, so a pool costs
little even for a few runs. Results do not depend on the number of workers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import concurrent.futures.process
import contextlib
import functools
import hashlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection

IN_MEMORY_BYTES = 32 * 2**20
"""Runs smaller than this are read whole and analysed in memory: dask's per-task overhead
would dominate them. Larger runs are analysed lazily, a block of snapshots per task
(``analysis.pipeline.STAGE_BYTES``), so memory stays bounded whatever their length."""


ANALYSED_FROM = "analysed_from"
"""The analysis attr naming the recording it was computed from and the code that computed it
(`source_of`): an analysis whose run and code still match it is kept by a later `dynamics
analyse` (`kept_row`)."""


def source_of(attrs: dict, result) -> dict:
    """What identifies a finished run's recording, the code analysing it now, and the variables
    of its analysis ``result``: a finished run is never written again, and one trained again under
    the same id (its group removed by hand) has another wall time. The code's hash covers every
    module (the analysers, the store's readers, their thresholds' defaults), taken as
    `dynamics.analysis` is imported: an edit or an upgrade, even one that left ``ANALYSIS_VERSION``
    as it was, analyses every run again; so does another version of the libraries the analysers
    compute with. A stored analysis whose variable set differs from the one recorded lost a
    variable (a copy cut short): a group without consolidated metadata opens without it."""
    from dynamics.provenance import process_code_hash

    return {**{k: attrs.get(k) for k in ("status", "steps_done", "starts", "wall_time", "diverged_step")},
            "code_hash": process_code_hash(), "libraries": library_versions(),
            "variables": sorted(map(str, result.variables))}


@functools.cache
def library_versions() -> dict[str, str | None]:
    """The versions of the libraries the analysers compute and store with (from their installed
    metadata: zarr is imported by dynamics.store alone)."""
    from importlib import metadata

    versions = {}
    for name in ("numpy", "scipy", "xarray", "dask", "zarr", "numcodecs"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def analyse_one(path: str, run_id: str, again: bool = False) -> dict:
    """Analyse one run and write ``analysis/<run_id>``; its summary row (skipped if unfinished).

    Unless ``again``, a run analysed before by this very code (``ANALYSIS_VERSION``, the package's
    code hash, the libraries' versions: `source_of`), from the recording it holds now, is not analysed twice: its row is read
    from its stored analysis, with ``kept``."""
    from dynamics import store
    from dynamics.schema import ANALYSIS_VERSION, FINISHED_STATUSES

    # "stopped", not "running", for a killed run, as `dynamics status` names it; one that finished
    # since its attributes were read is analysed as it finished
    status, attrs = store.run_now(path, run_id, store.run_attrs(path, run_id))
    if status not in FINISHED_STATUSES:
        return {"run": run_id, "status": status, "skipped": True, "reason": unfinished_reason(status, attrs)}
    # A chunk file gone from the run reads as NaN (or 0) without a word: named, not analysed.
    store.check_recorded(path, run_id, attrs=attrs)
    if not again and (row := kept_row(path, run_id, attrs)) is not None:
        return row
    # its version from the group's zarr.json alone: cheap under --again, and read where arrays are damaged
    had, version = store.stored_analysis_version(path, run_id)
    try:
        result, said = _analysis_of(path, run_id, attrs)
    except Exception as e:
        # a chunk cut short fails in its codec naming neither the run nor the array: found and named
        damaged = store.unreadable_chunk(path, run_id)
        if damaged is None:
            raise
        raise damaged from e
    if isinstance(result, dict):  # too few snapshots: its row says so
        return result
    result.attrs[ANALYSED_FROM] = source_of(attrs, result)
    store.write_analysis(path, run_id, result)
    row = row_of(run_id, attrs, result, said)
    if had and version != ANALYSIS_VERSION:  # the figures a researcher read before came from it
        row["replaced"] = "unstamped" if version is None else str(version)
    return row


def row_of(run_id: str, attrs: dict, result, said: dict) -> dict:
    """The table's row of a finished run from its analysis, with its caveats (`caveats.of_run`)."""
    from dynamics.analysis import summary_row

    row = {"run": run_id, "status": attrs["status"], **summary_row(result)}
    if attrs["status"] == "diverged":  # its "final" figures are from before the divergence: the table says where
        row.update(diverged_step=int(attrs["diverged_step"]), read_at_step=int(result["step"].values.max()))
    # A loss that blew up to a huge but finite value (lr 10: 242 nats, against 4.2 at step 0) is no
    # divergence, and its heads got roles like any run's: the table says training made it worse,
    # or, where its heads never moved, that their figures are those of their initialisation.
    return {**row, **said}


def kept_row(path: str, run_id: str, attrs: dict) -> dict | None:
    """The row of a finished run's stored analysis, with ``kept``, if these analysers wrote it from
    the recording the run holds now; else None, and the run is analysed again. Analysing it again
    would give the same figures (the analysers are deterministic, and read only the run): at 150
    runs a second `dynamics analyse` redid a minute of work to add nothing."""
    from dynamics import store
    from dynamics.analysis.pipeline import is_current
    from dynamics.caveats import of_run

    try:
        # loaded in the open: the attributes checked here are those of the values kept
        stored = store.open_analysis(path, run_id, stale="allow", dask=False, load=True)
        if stored is None or not is_current(stored) or stored.attrs.get(ANALYSED_FROM) != source_of(attrs, stored):
            return None
        return {**row_of(run_id, attrs, stored, of_run(store.open_run(path, run_id, dask=False), attrs["status"], stored)),
                "kept": True}
    except Exception:  # noqa: BLE001 - a damaged or unreadable analysis is analysed again, and rewritten whole
        return None


def unfinished_reason(status: str, attrs: dict) -> str:
    """Why an unfinished run is not analysed; a failed one with its error, which no command
    showed (its traceback is in the run's attributes), and what finishes it."""
    if status != "failed":
        return "unfinished"
    last = (str(attrs.get("traceback") or "").strip().splitlines() or ["no traceback recorded"])[-1]
    return f"unfinished: it failed with {last}; the command that trained it resumes it"


def analysed_variables(path: str, run_id: str, ds=None):
    """A run's variables the analysers read (``pipeline.READS``), opened without dask: sizes
    only, nothing read yet. Under IN_MEMORY_BYTES they are loaded whole, else read in blocks
    (bench/analysis.py names the path from this size too). ``ds``: the run, opened already."""
    from dynamics import store
    from dynamics.analysis.pipeline import READS

    ds = store.open_run(path, run_id, dask=False) if ds is None else ds
    return ds[[v for v in READS if v in ds]]  # a demo run's gradients and losses read took 40 ms more


def _analysis_of(path: str, run_id: str, attrs: dict):
    """The computed analysis of a finished run, or its skipped row when it recorded too few
    snapshots; and its caveats (`caveats.of_run`)."""
    from dynamics import store
    from dynamics.analysis import AnalysisOptions, analyse_run
    from dynamics.analysis.pipeline import read_in_blocks
    from dynamics.caveats import of_run

    run = store.open_run(path, run_id, dask=False)
    ds = analysed_variables(path, run_id, run)
    ds = ds.load() if ds.nbytes < IN_MEMORY_BYTES else read_in_blocks(ds)
    need = AnalysisOptions().baseline_snapshots + 1  # the divergence curve's noise band needs them
    if attrs["status"] == "diverged":
        ds = recorded_before_divergence(ds, attrs["diverged_step"])
        if ds.sizes["snapshot"] < need:
            return {"run": run_id, "status": "diverged", "skipped": True,
                    "reason": f"diverged at step {attrs['diverged_step']} after {ds.sizes['snapshot']} "
                              f"finite snapshots; analysis needs >= {need}"}, {}
    elif ds.sizes["snapshot"] < need:  # a very short run: its schedule took fewer snapshots
        return {"run": run_id, "status": attrs["status"], "skipped": True,
                "reason": f"only {ds.sizes['snapshot']} snapshot(s) recorded; analysis needs >= {need}"}, {}
    result = analyse_run(ds).compute()
    return result, of_run(run, attrs["status"], result)  # the group opened here (a second open of it cost 90 ms)


def disk_full(e: BaseException | None) -> OSError | None:
    """The refused write (a full disk or quota, a file-size limit, a read-only filesystem:
    `dynamics.refused.WRITE_REFUSED`) that ``e`` is, or was raised from; None if none."""
    from dynamics.refused import WRITE_REFUSED

    while e is not None:
        if isinstance(e, OSError) and e.errno in WRITE_REFUSED:
            return e
        e = e.__cause__ or e.__context__
    return None


def interrupt_in(e: BaseException | None) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt that ``e`` was raised from (pybind11 turns one in an extension's
    initialisation into ``ImportError: initialization failed``); None if none."""
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return e
        e = e.__cause__ or e.__context__
    return None


def import_analysers() -> None:
    """Import what analysing a run imports, SIGINT and SIGTERM held back meanwhile (in the main thread).

    Third-party module initialisation is not safe to interrupt. A KeyboardInterrupt in scipy's
    pybind11 extension came out as ``ImportError: initialization failed``, the run's own failure
    to analyse_or_report: the interrupt was lost, every later import of it failed ("type ... is
    already registered") and seed_consistency ended in a traceback, exit 1. One in a module-level
    ``logging.StreamHandler()`` (charset_normalizer, under numpy.f2py) left a handler without a
    lock that logging's shutdown raised on at exit, after the "interrupted" line.
    """
    from dynamics.signals import deferred_signals

    with deferred_signals(second_goes_through=True):  # a cold disk can make these seconds
        try:
            import dask.array  # noqa: F401 - with dask.threaded: what a run's first compute imports
            import dask.threaded  # noqa: F401
            import xarray

            import dynamics.analysis  # noqa: F401 - xarray, scipy, numpy.f2py
            import dynamics.store  # noqa: F401

            xarray.backends.list_engines()  # the backends' entry points, read on the first open
        except Exception as e:  # a second Ctrl-C, let through, wrapped by an extension as above
            if (stop := interrupt_in(e)) is not None:
                raise stop from None
            raise


def analyse_or_report(path: str, run_id: str, again: bool = False) -> dict:
    """:func:`analyse_one`, but a run whose analysis raises (a corrupt chunk, an analyser's error on
    an unusual run) gives a skipped row with ``error`` (one line) instead of ending the analysis
    of every other run. KeyboardInterrupt, and a full disk (`disk_full`), still stop everything."""
    import traceback

    from dynamics import store

    # Not SIGTERM as an interrupt here, in the workers: a pool that breaks SIGTERMs its busy
    # workers, which then went back to wait for work that never came, and the pool's join hung.
    try:
        return analyse_one(path, run_id, again)
    except Exception as e:  # noqa: BLE001 - reported in the row; the other runs go on
        if (stop := interrupt_in(e)) is not None:
            raise stop from None  # an interrupt during an import, wrapped: it stops everything
        if (full := disk_full(e)) is not None:
            # no problem of this run: every other run would fail the same way, each named as its
            # own failure, and cross-seed consistency be rewritten from none of them
            raise full from None
        status = "?"
        try:
            status = store.run_attrs(path, run_id).get("status", "?")
        except store.StoreError:  # its group's metadata cannot be read: the row's error names it
            status = "damaged"
        except Exception:  # noqa: BLE001 - the row still says why
            pass
        # one line naming the run's problem; a StoreError's module path says nothing
        line = (f"StoreError: {e}" if isinstance(e, store.StoreError)
                else traceback.format_exception_only(type(e), e)[-1].strip().splitlines()[0])
        return {"run": run_id, "status": status, "skipped": True, "error": line, "reason": f"analysis failed: {line}"}


def lost_row(path: str, run_id: str) -> dict:
    """The row of a run whose analysis process died: not analysed, and said so in one line."""
    from dynamics import store

    try:
        status = store.run_attrs(path, run_id).get("status", "?")
    except Exception:  # noqa: BLE001 - the row still says why
        status = "?"
    line = ("its analysis process died (killed by a signal, or out of memory; a run analysed beside it dies with "
            "it): analyse it again")
    return {"run": run_id, "status": status, "skipped": True, "error": line, "reason": f"analysis failed: {line}"}


def recorded_before_divergence(ds, diverged_step: int):
    """The snapshots a diverged run really recorded, whose attention is finite.

    Training stops at the first non-finite loss or gradient, so the schedule's later snapshots
    were never written and read as the NaN fill value; analysed as they are, every "final"
    figure would come from an empty snapshot. The snapshot taken at the diverging step itself is
    kept only if its attention is finite (the weights may already be inf there; after a
    non-finite gradient under a finite loss they are not, and only its gradients are NaN).
    """
    step = ds["step"].values
    keep = step < diverged_step
    at = (step == diverged_step).nonzero()[0]
    if at.size and bool(ds["attention"].isel(snapshot=int(at[0])).notnull().all()):
        keep[at[0]] = True
    return ds.isel(snapshot=keep.nonzero()[0])


def exit_with_parent(parent: int) -> None:
    """In a worker process: exit as soon as ``parent`` is no longer its parent (it died).

    A pool's worker holds both ends of its own task pipe, so it never sees the pipe close: after
    ``dynamics analyse`` was killed outright (SIGKILL), its workers waited on it for ever.
    """
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def analyse_store(path: str, run_ids: list[str] | None = None, workers: int = 1,
                  progress: Callable[[int, int, dict], None] | None = None, again: bool = False) -> list[dict]:
    """Analyse runs of a store (default: all), ``workers`` at a time; rows in run order.

    Parameters
    ----------
    path : str
        Store path or URL.
    run_ids : list of str, optional
    workers : int
        Processes analysing at once, this one included (``dynamics analyse`` uses one per
        core). Workers are spawned, so a script that calls this with workers > 1 needs the
        usual ``if __name__ == "__main__":`` guard. A URL store is analysed by this process
        alone: its root index has no cross-process lock.
    progress : callable, optional
        ``progress(done, total, row)`` as each run's analysis is written (or kept), from any thread.
    again : bool
        Analyse every run, those analysed before by these analysers too; by default their rows
        are read from their stored analyses, with ``kept`` (see :func:`analyse_one`).

    Returns
    -------
    list of dict
        One :func:`analyse_one` row per run; a run whose analysis raised has ``skipped`` and
        ``error`` (see :func:`analyse_or_report`), and the others are analysed regardless.
    """
    from dynamics import store

    # a damaged run: its row says so; an empty selection is no run, not every run
    known = store.list_runs(path, damaged="include")
    if run_ids is None:
        from dynamics.grid import grid_key

        # in the grid's order, as `status` and the table list them: its lines came in run-id order
        ids = sorted(known, key=grid_key(store.read_sweep_index(path) or {}))
    else:
        # a run named twice is analysed once (two workers would write its analysis at once); a
        # run the store does not hold is no damaged run: refused before any is analysed
        ids = list(dict.fromkeys(run_ids))
        if missing := [r for r in ids if r not in known]:
            raise ValueError(f"no run {', '.join(map(repr, missing))} in {path}")
    n = min(max(1, workers), len(ids))
    if store.is_remote(path):
        n = 1
    lock = threading.Lock()
    rows: dict[str, dict] = {}
    quiet: list[bool] = []  # set once this call raises: no progress after it, from any thread

    def done(rid: str, row: dict) -> None:
        with lock:
            rows[rid] = row
            if progress is not None and not quiet:
                progress(len(rows), len(ids), row)

    if n <= 1:
        import_analysers()  # before any run: an interrupt while they import lands after, not inside one
        for rid in ids:
            done(rid, analyse_or_report(path, rid, again))
        return [rows[r] for r in ids]

    queue = collections.deque(ids)
    errors: list[BaseException] = []

    def take() -> str | None:
        with lock:
            return None if errors or not queue else queue.popleft()

    def interrupted() -> bool:
        # A pool broken by a signal to the whole process group (Ctrl-C, `kill -TERM -PGID`, a batch
        # system's stop): the workers die of SIGTERM at once, while this process's handler waits
        # for its main thread. Its run was then named "not analysed (its analysis process
        # died ...)", blaming memory or the data, above the "interrupted" line, though its
        # analysis may even have been written. Given a moment, the interrupt shows in `errors`.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            with lock:
                if errors:
                    return True
            time.sleep(0.02)
        return False

    def feed(pool: concurrent.futures.Executor) -> None:
        # One thread per worker process keeps it busy with one run at a time.
        if hasattr(signal, "pthread_sigmask"):
            # The workers are spawned from this thread and keep its signal mask through exec:
            # with SIGINT blocked they finish the runs in hand on a Ctrl-C to the group, as this
            # process waits for them, where each printed a KeyboardInterrupt traceback (while it
            # imported) or zarr's "Task was destroyed" lines over the one "interrupted" line.
            # The kernel gives the signal to a thread that takes it: this process's main thread.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            while (rid := take()) is not None:
                # A worker process died (killed, or out of memory): the pool is gone, and with it
                # every run in flight. Those are named; this process takes the rest, this one too
                # if the pool broke before it was sent.
                try:
                    future = pool.submit(analyse_or_report, path, rid, again)
                except concurrent.futures.process.BrokenProcessPool:
                    with lock:
                        queue.appendleft(rid)
                    return
                try:
                    row = future.result()
                except concurrent.futures.process.BrokenProcessPool:
                    if not interrupted():  # else the "interrupted" line says what was kept
                        done(rid, lost_row(path, rid))
                    return
                done(rid, row)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller below
            errors.append(e)

    def waiting(e: BaseException) -> None:
        # a first Ctrl-C waits for the workers' runs in hand: said, or a user pressed it again and again
        if isinstance(e, KeyboardInterrupt) and (busy := sum(t.is_alive() for t in feeders)):
            print(f"dynamics: stopping once the {busy} run(s) in hand in other processes are analysed "
                  f"(Ctrl-C again to abandon them)", file=sys.stderr, flush=True)

    # spawn: the caller may hold threads (a Dask client, torch's pools) that fork would copy.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(n - 1, mp_context=ctx, initializer=exit_with_parent,
                                                initargs=(os.getpid(),)) as pool:
        feeders = [threading.Thread(target=feed, args=(pool,), daemon=True) for _ in range(n - 1)]
        for t in feeders:
            t.start()  # the workers are spawned now, and import theirs while this process imports its own
        try:
            import_analysers()
            while (rid := take()) is not None:
                done(rid, analyse_or_report(path, rid, again))
        except BaseException as e:
            errors.append(e)
            waiting(e)
        # A first interrupt here (the main thread's runs done, the workers' still going) stops
        # the feeders taking more and waits for the runs in hand, whose lines are printed, as
        # after one in the loop above; left at once, a feeder printed its run's line after
        # the caller's "interrupted". A second leaves at once, its workers stopped, and nothing
        # prints after it.
        while any(t.is_alive() for t in feeders):
            try:
                for t in feeders:
                    t.join()
            except BaseException as e:
                with lock:
                    second = bool(errors)
                    errors.append(e)
                    if second:
                        quiet.append(True)
                if second:
                    # The workers ignore Ctrl-C (they finish the runs in hand), so leaving the `with`
                    # waited for them; a third Ctrl-C then cut the pool's shutdown short and the
                    # command hung for good (Python 3.11, 3.12). They are stopped here instead.
                    for proc in list((getattr(pool, "_processes", None) or {}).values()):
                        with contextlib.suppress(Exception):
                            proc.terminate()
                    raise
                waiting(e)
        # runs a feeder put back after the pool broke, once this thread had left its loop
        while (rid := take()) is not None:
            done(rid, analyse_or_report(path, rid, again))
        if not errors:
            # Every run is written: the workers' own exit (their interpreters' teardown, 0.5 s in
            # a demo) is not waited for here, only at this process's exit (concurrent.futures
            # joins its pools then), so a demo's predictor starts meanwhile. The `with` then
            # waits for nothing. After an error it still waits, as before.
            pool.shutdown(wait=False)
    if errors:
        raise errors[0]
    return [rows[r] for r in ids]


def seed_consistency(path: str, run_ids: list[str] | None = None,
                     leave_out: Collection[str] = ()) -> list[tuple[str, float, float, int, bool]]:
    """Cross-seed reproducibility of the division of labour, per config, over analysed runs.

    Runs whose configs differ only in ``train.seed`` (and in where they ran:
    ``identity.EXECUTION_KEYS``) form a group; their heads are matched by the Hungarian
    assignment on final role-score profiles (:func:`analysis.cross_seed_consistency`).
    Only completed runs whose stored analysis is of this version count: a diverged run's last
    finite snapshot is no final profile (it may be a few steps from init), and an older
    analysers' result is not mixed with this version's. Writes ``derived/consistency``, with
    each group's ``label`` and each pair's runs (``run_a``, ``run_b``).

    Parameters
    ----------
    path : str
    run_ids : list of str, optional
        Runs to consider (default: every run of the store, as they are when it is called).
    leave_out : collection of str
        Runs not to consider: ``dynamics analyse`` passes those it listed but did not analyse
        (unfinished, or whose analysis failed, which would be counted from an earlier one). It
        considers the runs that finished since it listed them too, analysed by another
        ``dynamics analyse``: passing only its own runs, a command started before another wrote
        the older result, from fewer runs, over the other's when it ended last.

    Returns
    -------
    list of (label, similarity, unmatched, runs, lone)
        One row per group of two or more runs: its matched similarity, the unmatched all-pairs
        reference it should be read against, and ``lone`` where no run has two heads in a layer
        (matching within a layer has nothing to permute: the two figures are one). The label is
        the group's values of the sweep axes other than the seed when the store has a sweep index
        (and the settings that set it apart from groups with the same values), else its values of
        the settings that differ between groups (a short hash of the config when only one group).
    """
    import numpy as np
    import pandas as pd
    import xarray as xr

    from dynamics import store
    from dynamics.analysis import cross_seed_consistency
    from dynamics.analysis.pipeline import is_current
    from dynamics.identity import differing_settings, read_settings, seed_group, setting_text

    index = store.read_sweep_index(path) or {}
    axes = [a for a in index.get("axes", []) if a != "train.seed"]
    groups, labels, profiles = [], {}, []
    flat: dict[str, dict] = {}  # group -> its config as {"section.key": value}
    ids = store.list_runs(path, damaged="skip") if run_ids is None else run_ids  # `analyse` names a damaged run
    ids = [r for r in ids if r not in set(leave_out)]
    kept = []
    for run_id in ids:
        attrs = store.run_attrs(path, run_id)
        if attrs.get("status") != "completed":
            continue
        stored = attrs.get("config")
        if not isinstance(stored, dict):  # a run written through the store API without one: no seed group
            continue
        analysis = store.open_analysis(path, run_id, stale="allow", dask=False)  # one snapshot of one variable read
        if analysis is None or not is_current(analysis):
            continue
        kept.append(run_id)
        group = "config " + hashlib.sha1(seed_group(stored).encode()).hexdigest()[:8]
        if axes and run_id in index.get("runs", {}):
            values = index["runs"][run_id]
            # keys in the sweep's axis order, as the table's columns: sort_keys had put lr before init_scale
            labels[group] = "{" + ", ".join(f"{json.dumps(a)}: {json.dumps(values.get(a), sort_keys=True)}"
                                            for a in axes) + "}"
        flat.setdefault(group, read_settings(stored))
        groups.append(group)
        profiles.append(analysis["role_score"].isel(snapshot=-1).load())
    counts = collections.Counter(groups)
    if not counts or max(counts.values()) < 2:
        # An empty result, not none: the one an earlier analysis wrote (those runs all completed and
        # analysed then) would stay behind and read as current.
        empty = xr.Dataset({v: ("group", np.zeros(0)) for v in ("similarity", "unmatched_similarity")},
                           coords={"group": np.array([], dtype=str), "label": ("group", np.array([], dtype=str))},
                           attrs={"note": "no config has two or more completed runs analysed by this version"})
        store.write_derived(path, "consistency", empty)
        return []

    def differing(among) -> list[str]:
        return differing_settings(flat[g] for g in among)

    def settings(g: str, names: list[str]) -> str:
        return ", ".join(f"{k}={setting_text(flat[g], k)}" for k in names)

    # Sweeps of different base configs into one store give groups with the same swept values:
    # they also name the settings that tell them apart, or their lines would read alike.
    sharing: dict[str, list[str]] = collections.defaultdict(list)
    for g, text in labels.items():
        sharing[text].append(g)
    for text, peers in sharing.items():
        if len(peers) > 1:
            extra = differing(peers)
            for g in peers:
                labels[g] = f"{text}, {settings(g, extra)}"
    # Without sweep labels, name each group by the settings that tell the groups apart.
    varying = differing(flat)
    for g in flat:
        if g not in labels and varying:
            labels[g] = settings(g, varying)
    stacked = xr.concat(profiles, dim=pd.Index(kept, name="run"), join="outer").transpose("run", "layer", "head", "role_name")
    result = cross_seed_consistency(stacked, groups, feature_dim="role_name")
    result = result.assign_coords(label=("group", [labels.get(g, g) for g in result.group.values.tolist()]))
    # the final snapshot's step, a scalar, is the first run's only: runs of other lengths differ
    keep = {"label", "run_a", "run_b", "pair_group"}
    store.write_derived(path, "consistency", result.drop_vars([v for v in result.coords
                                                               if v not in result.dims and v not in keep]))
    # in the grid's order, as the analyse table above them lists the runs (group names are hashes)
    from dynamics.grid import grid_key

    key = grid_key(index)
    first = {g: min(key(r) for r, gr in zip(kept, groups, strict=True) if gr == g) for g in counts}
    heads = [int(p.notnull().any("role_name").sum("head").max()) for p in profiles]  # most heads in a layer, per run
    lone = {g: max(h for h, gr in zip(heads, groups, strict=True) if gr == g) < 2 for g in counts}
    return [(labels.get(g, g), float(result.similarity.sel(group=g)), float(result.unmatched_similarity.sel(group=g)),
             counts[g], lone[g])
            for g in sorted(result.group.values.tolist(), key=first.__getitem__) if counts[g] >= 2]
