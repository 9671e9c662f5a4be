"""The launcher: :func:`run_sweep`, the embedded :func:`local_cluster` or a client of an existing
one, submission and resubmission of the tasks, and stopping them on Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import signal
import sys
import threading
import time
import uuid
from collections import Counter

from dynamics import provenance, store
from dynamics.budget import DoesNotFit, check_fits, workers_that_fit
from dynamics.config import RunConfig
from dynamics.identity import experiment_identity, identity_difference
from dynamics.limits import usable_cores
from dynamics.schema import config_value
from dynamics.signals import deferred_signals, sigterm_as_interrupt
from dynamics.sweep import cancel
from dynamics.sweep.grid import Point, _plain, expand_grid
from dynamics.sweep.lock import acquire_lock
from dynamics.sweep.progress import _Display, _display
from dynamics.sweep.scheduler import check_scheduler, scheduler_file_address
from dynamics.sweep.summary import FINISHED, SweepSummary
from dynamics.sweep.task import _ignore_sigint_plugin, _progress_topic, _stop_name
from dynamics.sweep.twins import refuse_sweep_twins, unindex_refused, unresumed_note
from dynamics.tasks import data_hash
from dynamics.tasks.hashing import other_data

MAX_RESUBMITS = 2
"""Extra submissions of a run whose task the scheduler gave up on (KilledWorker)."""


def local_cluster(n_workers: int):
    """The embedded cluster: ``n_workers`` single-threaded worker processes (with nannies).

    Started without Dask's ``MALLOC_TRIM_THRESHOLD_`` (see :mod:`dynamics.allocator`), and without a
    memory limit per worker: Dask's default gives each an equal share of the machine and restarts one
    past 95% of it, which would stop a run that fits; `budget.workers_that_fit` sizes the workers
    to the runs instead.
    """
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        # No dashboard; the scheduler's HTTP server (health routes) takes any free port, not 8787.
        return LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1", memory_limit=0,
            dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
            silence_logs=logging.ERROR, env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        )


def _client(scheduler: str | None, n_workers: int):
    """(client, cluster or None): an existing cluster's client, or an embedded LocalCluster."""
    from distributed import Client

    if scheduler:
        if "://" not in scheduler and os.path.isfile(scheduler):
            # its address read here: a Client given the file calls no security loader, so a TLS
            # cluster check_scheduler had reached failed the sweep after its store was made
            return Client(scheduler_file_address(scheduler), timeout=30), None
        return Client(scheduler, timeout=30), None
    cluster = None
    try:
        with deferred_signals(), _sigint_blocked_here():
            cluster = local_cluster(n_workers)
        client = Client(cluster)  # a signal held while the cluster started was raised above
        client.register_plugin(_ignore_sigint_plugin())
    except BaseException:  # Ctrl-C included: a cluster left open fails its own close at exit
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
        raise
    return client, cluster


@contextlib.contextmanager
def _sigint_blocked_here():
    """SIGINT blocked in this (the main) thread while the embedded cluster starts.

    Ctrl-C in a terminal reaches the whole process group. Workers still importing printed a
    KeyboardInterrupt traceback each, and a cluster interrupted half-started failed its own close
    at exit (distributed's ``AssertionError: Status.init``). The cluster's IO-loop thread, made
    here, inherits the mask, and so do the threads it makes to spawn and respawn workers, and the
    worker processes, which keep a blocked mask across exec: they never see it. The launcher's own
    Ctrl-C, pending meanwhile (or taken by another of its threads, for ``deferred_signals`` around
    this), is delivered once the cluster is whole, a second or two, and stops it as any Ctrl-C does.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield  # Windows has no signal masks (nor process groups a Ctrl-C reaches whole)
        return
    from multiprocessing import resource_tracker

    # Its first start unblocks SIGINT in the thread that starts it, afterwards (CPython's
    # ensure_running): started now, before the mask, not later by the IO-loop thread.
    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def default_workers() -> int:
    """One worker per usable core (`dynamics.limits.usable_cores`)."""
    return usable_cores()


def _write_index(path: str, points: list[Point]) -> None:
    """Merge this sweep's axes and points into the store's sweep index (launcher only).

    A run keeps the values an earlier sweep recorded for it on axes this one does not set (on
    those it does, this sweep's values, from the same config, replace them), and every run gets a value for
    every axis of the merged index: where no sweep gave one (an axis added by a later sweep, or
    not swept by this one), the value in the run's config (a run of an earlier sweep that never
    started has no stored config, and stays without it). ``steps`` holds each point's
    ``train.steps``.
    """
    index = store.read_sweep_index(path) or {}
    axes = list(index.get("axes", []))
    for p in points:
        for k in p.values:
            if k not in axes:
                axes.append(k)
    runs = {rid: dict(values or {}) for rid, values in index.get("runs", {}).items()}
    new = {p.run_id: p for p in points}
    for p in points:
        runs[p.run_id] = {**runs.get(p.run_id, {}), **p.values}
    present = None
    for rid, values in runs.items():
        missing = [a for a in axes if a not in values]
        if not missing:
            continue
        if rid in new:
            config = new[rid].cfg.to_dict()
        else:  # a run of an earlier sweep: its stored config, if it ever started
            present = set(store.list_runs(path)) if present is None else present
            config = store.run_attrs(path, rid).get("config") if rid in present else None
        if isinstance(config, dict):
            values.update({a: _plain(config_value(config, a)) for a in missing})
        runs[rid] = {a: values[a] for a in axes if a in values}
    # Each point's train.steps: `dynamics status` shows a pending point's total (0/N, not 0/?).
    steps = {**index.get("steps", {}), **{p.run_id: int(p.cfg.train.steps) for p in points}}
    store.write_sweep_index(path, {"axes": axes, "runs": runs, "steps": {r: steps[r] for r in runs if r in steps}})


def _note_bad_entries(path: str) -> None:
    """A line on stderr for each sweep-index entry that is no run id (a hand edit, '../evil'):
    kept, as a store's contents are, but no point any sweep trains, which the sweep said nothing of
    (`dynamics status` names it too)."""
    from dynamics.status import bad_index_entries

    index = store.read_sweep_index(path) or {}
    for line in bad_index_entries(path, index, set(store.list_runs(path, damaged="include"))).values():
        print(f"dynamics: note: {line}", file=sys.stderr, flush=True)


def check_points(cfg: RunConfig, path: str, scheduler: str | None = None) -> list[Point]:
    """The grid's points, each checked as `run_sweep` checks it before anything is written
    (valid, and fits in this machine's memory unless finished in ``path``, or a ``scheduler``
    that answers), for a caller to refuse bad input before saying it starts (`dynamics demo`)."""
    points = expand_grid(cfg)
    if scheduler:
        check_scheduler(scheduler)
    else:  # an existing cluster's workers have their own memory: each run's train_run checks it there
        for p in points:
            try:  # a point finished in the store is skipped below, needing no memory
                check_fits(p.cfg, functools.partial(store.is_finished, path, p.run_id))
            except DoesNotFit as e:  # not a bad DYNAMICS_MEMORY_GB, which is no point's fault
                raise DoesNotFit(f"sweep point {p.label}: {e}") from None
    return points


def run_sweep(
    cfg: RunConfig,
    path: str,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool | None = None,
) -> SweepSummary:
    """Train every point of ``cfg``'s sweep grid into the store at ``path``.

    Finished runs (completed or diverged) are skipped; with nothing left to train no cluster
    is started or contacted (a ``scheduler`` is still checked once, before anything is
    written). Interrupted ones resume from their checkpoints. The store is locked for the
    duration.

    Parameters
    ----------
    cfg : RunConfig
        Config with a ``[sweep]`` table (without one, the base point is the only run).
    path : str
        Store path, or an fsspec URL the workers can reach (see the module docstring).
    workers : int, optional
        Worker processes of the embedded LocalCluster; default one per core. Ignored
        with ``scheduler``.
    scheduler : str, optional
        Address (``tcp://host:8786``) or scheduler-file path of an existing cluster.
    progress : bool, optional
        True: tqdm bars; False: silent; None: bars on a terminal, else plain log lines.

    Returns
    -------
    SweepSummary
        Counts by status, failed run ids with one-line errors.

    Raises
    ------
    ConfigError
        An invalid point, an unfinished one that cannot fit in this machine's memory, each point
        checked alone (without ``scheduler``; see dynamics.budget), or a ``scheduler`` that does
        not answer (before anything is written).
    StoreError
        Before any point trains: a point whose run id the store holds with another config
        (``dynamics run --run-id``), or unfinished with its checkpoint lost.
    SweepLockError
        Another sweep is writing this store.
    KeyboardInterrupt
        After Ctrl-C, once running runs were asked to stop (they stay resumable).

    Example
    -------
    >>> cfg = load_config("experiments/quickstart.toml")  # doctest: +SKIP
    >>> run_sweep(cfg, "runs/quickstart.zarr", workers=2).counts  # doctest: +SKIP
    {'completed': 12}
    """
    t0 = time.perf_counter()
    cwd = os.getcwd()  # relative paths in the config (a teacher) are to it, where the tasks run too
    points = check_points(cfg, path, scheduler)
    if (local := store.local_path(path)) is not None:  # a file:// URL decoded, as the store reads it
        path = local  # absolute: workers may run elsewhere
    for p in points:
        if p.cfg.intervene:  # a student into its teacher's store: refused here, not in every worker
            from dynamics import interventions

            interventions.check_output(p.cfg, path)
    store.init_store(path)
    summary = SweepSummary(total=len(points), labels={p.run_id: p.label for p in points})
    with sigterm_as_interrupt(), acquire_lock(path):
        existing = set(store.list_runs(path))
        for run_id in sorted(existing - {p.run_id for p in points}):  # damaged attrs: named, as a point's are
            store.run_attrs(path, run_id)
        todo = []
        starts: dict[str, int | None] = {}  # each point's starts before this launch (None: no run group)
        hashes: dict[str, str] = {}  # the data this machine makes for each point: its workers must make the same
        elsewhere: dict[str, tuple[Point, str]] = {}  # data here -> a finished point recorded on other data
        for p in points:
            attrs = store.run_attrs(path, p.run_id) if p.run_id in existing else {}
            hashes[p.run_id] = data_hash(p.cfg)
            _refuse_point(p, attrs, path, hashes[p.run_id])  # before anything trains: the others waited for nothing
            if attrs.get("status") in FINISHED:
                summary.skipped.append(p.run_id)
                summary.counts[attrs["status"]] = summary.counts.get(attrs["status"], 0) + 1
                if attrs.get("data_hash", hashes[p.run_id]) != hashes[p.run_id]:
                    elsewhere.setdefault(hashes[p.run_id], (p, attrs["data_hash"]))
            else:
                todo.append(p)
                starts[p.run_id] = int(attrs.get("starts", 0)) if p.run_id in existing else None
        _refuse_other_data_than_finished(todo, hashes, elsewhere, path)
        refuse_sweep_twins([p for p in todo if p.run_id not in existing], path)
        if note := unresumed_note(todo, path):  # read before this grid's points join the index
            print(f"dynamics: note: {note}", file=sys.stderr, flush=True)
        _write_index(path, points)
        _note_bad_entries(path)
        if not store.is_remote(path):  # a remote store's is rebuilt whole below
            store.refresh_index(path, summary.skipped)  # as train_run's skip: an entry a kill left stale
        try:
            if todo:
                n = min(workers or default_workers(), len(todo))
                if not scheduler:  # an existing cluster's workers have memory of their own
                    n, note = workers_that_fit([p.cfg for p in todo], n)
                    if note:
                        print(f"dynamics: note: {note}", file=sys.stderr, flush=True)
                display = _display(progress, len(points), len(summary.skipped))
                display.starting(len(todo), scheduler or n)  # a given cluster's size is its own
                results = _launch(todo, path, scheduler, n, display, cwd, hashes, starts)
                if refused := [r["run_id"] for r in results if r.get("twin")]:
                    unindex_refused(path, refused)
                for r in results:
                    summary.counts[r["status"]] = summary.counts.get(r["status"], 0) + 1
                    if r["status"] in ("failed", "cancelled"):
                        getattr(summary, r["status"]).append(r["run_id"])
                        summary.errors[r["run_id"]] = r["error"] or "?"
                    if r.get("waited"):
                        summary.waited[r["run_id"]] = _waited_note(r)
                    elif r.get("skipped"):  # finished by another process before its task reached it
                        summary.skipped.append(r["run_id"])
                    if r.get("after_cancel"):
                        summary.after_cancel[r["run_id"]] = r["after_cancel"]
                    if r.get("resumed_from") and not r.get("skipped"):
                        summary.resumed[r["run_id"]] = int(r["resumed_from"])
        finally:
            if store.is_remote(path):  # its tasks left the root index alone (store.deferred_index)
                store.reindex(path)
    summary.wall_time = time.perf_counter() - t0
    return summary


def _refuse_other_data_than_finished(todo: list[Point], hashes: dict[str, str],
                                     elsewhere: dict[str, tuple[Point, str]], path: str) -> None:
    """StoreError for a point left to train on the data this machine makes where a finished
    point of the same data here was recorded on other data: a sweep finished on another Python
    (its standard library is the corpus) mixed the two in one grid's seeds and swept values."""
    for p in todo:
        if hashes[p.run_id] in elsewhere:
            done, recorded = elsewhere[hashes[p.run_id]]
            raise store.StoreError(
                f"sweep point {p.label}: this machine makes data with hash {hashes[p.run_id]} for task "
                f"{p.cfg.task.name!r}, but point {done.label} (run {done.run_id}) finished in {path} on data with "
                f"hash {recorded} (another Python's standard library, for the corpus?); the sweep's runs would not "
                f"all train on the same data: finish it where that data is made, or sweep into another store")


def _refuse_point(p: Point, attrs: dict, path: str, data: str | None = None) -> None:
    """StoreError for a point whose task would refuse it (as `train_run` does), found before any
    point trains: the sweep ended in exit 1 after training every other point. ``data``: the
    point's data hash on this machine."""
    if attrs and "config" not in attrs:  # not "a different config": there is none to compare
        raise store.StoreError(f"sweep point {p.label}: run {p.run_id} in {path} records no config, so it cannot be "
                               "told to be this point's run; refusing to train into it")
    if attrs and experiment_identity(attrs.get("config", {})) != experiment_identity(p.cfg.to_dict()):
        # a run of this id recorded with another config (`dynamics run --run-id`): counted
        # finished, it stood in status and open_sweep with this point's values
        raise store.StoreError(f"sweep point {p.label}: run {p.run_id} in {path} was recorded with a different "
                               f"config ({identity_difference(attrs.get('config', {}), p.cfg.to_dict())}; "
                               "dynamics run --run-id?); refusing to mix them")
    try:
        if attrs.get("status") not in FINISHED:  # a finished one is skipped: its checkpoint is not needed
            store.check_checkpoint_kept(path, p.run_id, attrs)
            if data is not None and attrs.get("data_hash", data) != data:
                raise store.StoreError(other_data(p.run_id, path, attrs["data_hash"], data, p.cfg.task.name))
        elif p.cfg.intervene.get("distill"):  # skipped here, never reaching train_run's check
            from dynamics.interventions import distill

            distill.refuse_other_teacher(attrs, p.cfg, path, p.run_id)
    except store.StoreError as e:
        raise store.StoreError(f"sweep point {p.label}: {e}") from None


def _launch(todo: list[Point], path: str, scheduler: str | None, n_workers: int, display: _Display,
            cwd: str, hashes: dict[str, str] | None = None, starts: dict[str, int | None] | None = None) -> list[dict]:
    """Submit the points, follow them to the end, return one result dict per point (``cwd``: the
    directory relative paths in their configs are to; ``hashes``: each point's data hash here,
    which its worker must make too; ``starts``: each point's ``starts`` attr before this launch,
    None for no run group, by which a run the scheduler gave up on is told begun or not)."""
    import queue

    from distributed import Event, KilledWorker

    token = uuid.uuid4().hex[:12]
    code = provenance.process_code_hash()  # the launcher's: every point is trained by this code, or refused
    events: queue.SimpleQueue = queue.SimpleQueue()
    results: dict[str, dict] = {}
    environ = _spawn_environ()
    try:
        client, cluster = _client(scheduler, n_workers)
    except BaseException:  # a cluster that failed half-started had its nannies set them already
        _restore_environ(environ)
        raise
    stop = None  # made in the try below, so that a Ctrl-C this early still closes the cluster
    by_run = {p.run_id: p for p in todo}
    order = {p.run_id: i for i, p in enumerate(todo)}
    tries: Counter = Counter()
    deaths: Counter = Counter()  # run id -> deaths of the workers that ran it, all tries together

    def submit(p: Point):
        tries[p.run_id] += 1
        key = f"dynamics-train-{p.run_id}-{token}-{tries[p.run_id]}"
        # the worker's code is checked before it unpickles a config or imports run_point
        payload = provenance.task(code, p.run_id, "dynamics.sweep.task:run_point", p.cfg, path, p.run_id, p.values,
                                  token, cwd, (hashes or {}).get(p.run_id))
        return client.submit(pickle.loads, payload, key=key, pure=False,
                             priority=len(todo) - order[p.run_id])  # grid order

    def drain() -> None:
        while True:
            try:
                _, msg = events.get_nowait()
            except queue.Empty:
                return
            if msg["run"] in results:
                continue
            if "waiting" in msg:  # another process trains the run: its task waits for it
                display.waiting(msg["run"], msg["waiting"])
            else:
                display.step(msg["run"], msg["step"], msg["total"], msg["loss"])

    def collect(f, run_id: str, wait: bool = True) -> None:
        if f.status == "finished":
            r = f.result()
            if r.get("refused") == "code":  # refused unread: the run may have been finished meanwhile
                r = cancel.finished_elsewhere(path, run_id) or r
        elif f.status == "cancelled":  # on the cluster, not by Ctrl-C here: see cancel's docstring
            why = cancelled.get(f.key, "reason unknown")
            still = cancel.still_trained(path, run_id)
            if still and wait:
                orphans[run_id] = why
                display.waiting(run_id, f"its task was cancelled on the cluster ({why}), but the run is still being "
                                        f"trained (by its worker, or by a process its task waited for); the sweep "
                                        f"waits for that to end (Ctrl-C leaves it to that process)")
                return
            r = cancel.outcome(path, run_id, why, trained_on=False, still=still)
        else:
            exc = f.exception()
            if isinstance(exc, KilledWorker):
                deaths[run_id] += exc.allowed_failures + 1  # the scheduler gave up after that many
                if tries[run_id] <= MAX_RESUBMITS:
                    pending[submit(by_run[run_id])] = run_id
                    return
                r = cancel.given_up(path, run_id, (starts or {}).get(run_id), deaths[run_id],
                                    getattr(exc.last_worker, "address", "?"))
            else:
                error = provenance.missing_code(exc, code) or f"{type(exc).__name__}: {exc}".splitlines()[0]
                r = {"run_id": run_id, "status": "failed", "steps_done": 0, "skipped": False, "error": error,
                     "traceback": None}
        ended(r)

    def ended(r: dict) -> None:
        run_id = r["run_id"]
        results[run_id] = r
        note = f": {r['error']}" if r["status"] in ("failed", "cancelled") and r["error"] else ""
        if r.get("after_cancel"):
            note = f": {r['after_cancel']}"
        if r.get("skipped"):
            note = " (finished by another process)" if r.get("waited") else " (already finished)"
        elif r.get("resumed_from"):  # as `dynamics run` says it: the steps before were trained by an earlier launch
            note = f" (resumed at step {r['resumed_from']})" + note
        display.finished(run_id, r["status"], note)

    pending: dict = {}
    cancelled: dict = {}  # key -> why, for tasks cancelled on the cluster
    orphans: dict = {}  # run id -> why, for those whose worker trains on
    watch = cancel.WorkerWatch(client)
    aborted = False  # a second Ctrl-C while stopping
    try:
        stop = Event(_stop_name(token), client=client)
        client.subscribe_topic(_progress_topic(token), events.put)
        for p in todo:
            pending[submit(p)] = p.run_id
        while pending or orphans:
            done = cancel.settled(pending, cancelled)
            drain()
            if done and not watch.had:
                # A task ended, so a worker came back: said before its line, even when the run
                # ended sooner than the next regular look.
                watch.check(time.monotonic(), display, force=True)
            for f in done:
                collect(f, pending.pop(f))
            for run_id in [r for r in orphans if not cancel.still_trained(path, r)]:
                ended(cancel.outcome(path, run_id, orphans.pop(run_id), trained_on=True))
            if pending:
                watch.check(time.monotonic(), display)
            display.tick()
    except KeyboardInterrupt:  # stopping: a run still trained elsewhere is not waited for
        aborted = cancel.stop_running(client, stop, pending, functools.partial(collect, wait=False), cancelled,
                                      display.say)
        raise
    finally:
        display.close()
        with contextlib.suppress(Exception), _quiet("distributed.client"):
            client.close()  # after a lost scheduler, Dask logs the cancelled reconnection as an error traceback
        if cluster is not None:
            if aborted:
                cancel.kill_workers(cluster)
            with contextlib.suppress(Exception):
                cluster.close()
            cancel.mark_interrupted(path, [r for r in by_run
                                           if results.get(r, {}).get("status", "cancelled") == "cancelled"])
        _restore_environ(environ)
    return [results[p.run_id] for p in todo if p.run_id in results]


def _spawn_environ() -> dict[str, str | None]:
    """This process's values (None: unset) of the variables Dask's nannies set in it, not only in
    their workers, before each worker starts (``distributed.nanny.pre-spawn-environ``, and
    PYTHONHASHSEED): left behind, OMP_NUM_THREADS=1 ran a notebook's later torch work, and every
    process it started, on one thread after a sweep (other rounding, too)."""
    import dask

    keys = {*(dask.config.get("distributed.nanny.pre-spawn-environ", None) or {}), "PYTHONHASHSEED"}
    return {k: os.environ.get(k) for k in keys}


def _restore_environ(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _waited_note(r: dict) -> str:
    """What came of a run whose task waited for another process training it (``r["waited"]``)."""
    if r.get("skipped"):
        then = f"that process ended it {r['status']}; nothing retrained"
    elif r["status"] == "cancelled":  # the sweep stopped while it waited: that process may train on
        then = "the sweep was stopped while it waited, and left the run to that process"
    else:
        then = f"it stopped before the end, and this sweep took the run up: {r['status']}"
    return f"another process ({r['waited']}) was training it; {then}"


@contextlib.contextmanager
def _quiet(name: str):
    """Mute the logger ``name`` for the duration."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        log.setLevel(level)
