"""What the launcher makes of tasks the cluster cancelled or gave up on, or a worker refused, and
of a cluster left without workers; and stopping a sweep on Ctrl-C (:func:`stop_running`, a second
one aborting at once: :func:`kill_workers`; then :func:`mark_interrupted`).

Dask cancels every future of a client that loses its scheduler, and ``Future.cancel`` from
another client cancels one task; neither can stop a task already running, whose thread trains
on in its worker. Reporting such a run ``cancelled`` when the sweep ended was wrong as often as
not: killing a cluster's scheduler mid-sweep, two of the four runs the summary called cancelled
were completed in the store a few seconds later. So the launcher looks at the run itself: a run
whose lock a worker still holds is waited for, and every cancelled run is reported by what its
store says once nobody trains it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import Callable

from dynamics import store
from dynamics.schema import FINISHED_STATUSES
from dynamics.sweep.task import _record_failure

SCHEDULER_LOST = "scheduler-connection-lost"
"""Dask's reason for the futures of a client that lost its scheduler."""
WORKER_CHECK_EVERY = 5.0
"""Seconds between the launcher's looks at how many workers the scheduler has."""
STOP_GRACE = 30.0
"""Seconds the launcher waits, after Ctrl-C, for running tasks to record `interrupted`."""


def settled(pending: dict, cancelled: dict, timeout: float = 0.5) -> list:
    """The futures of ``pending`` done within ``timeout`` (maybe none), cancelled ones included.

    Dask's ``wait`` raises for a future cancelled on the cluster (the scheduler lost, a task
    cancelled from another client) instead of returning it: that was a traceback from the sweep,
    with no summary. Their reasons go into ``cancelled`` (key -> why, in the sweep's words). With
    nothing pending (only runs trained on elsewhere are waited for), it just waits ``timeout``.
    """
    from distributed import wait
    from distributed.client import FuturesCancelledError

    if not pending:
        time.sleep(timeout)
        return []

    try:
        done, _ = wait(list(pending), timeout=timeout, return_when="FIRST_COMPLETED")
        return list(done)
    except TimeoutError:
        return []
    except FuturesCancelledError as e:
        for group in e.error_groups:
            for error in group.errors:
                cancelled[error.key] = reason(group.reason, error.msg)
        return [f for f in pending if f.status != "pending"]


def reason(dask_reason: str, msg: str | None = None) -> str:
    """Dask's reason for a cancelled task, said once and plainly: Dask's message for a lost
    scheduler ("Please check your connection and re-run your work.") was repeated on every line."""
    if dask_reason == SCHEDULER_LOST:
        return "the launcher lost its scheduler"
    return dask_reason + (f": {msg}" if msg else "")


def still_trained(path: str, run_id: str) -> bool:
    """Whether a process holds the run's lock now: the worker of its cancelled task, or the process
    that task was waiting for (a `dynamics run` of the point). A URL store has no lock to look at:
    its cancelled runs are reported by their attributes at once."""
    return bool(store.run_lock_held(path, run_id))


def outcome(path: str, run_id: str, why: str, trained_on: bool, still: bool = False) -> dict:
    """The result of a run whose task was cancelled on the cluster (``why``), read from the store
    once nobody trains it; ``trained_on``: it was trained on after the cancellation; ``still``:
    it is being trained now, and the launcher does not wait (it is stopping).

    Finished there (completed or diverged): that status, and ``r["after_cancel"]`` says how; failed
    there (recorded by its worker): failed. Any other state is ``cancelled``, resumable by the same
    command.
    """
    try:
        attrs = store.run_attrs(path, run_id) if store.has_run(path, run_id) else {}
    except store.StoreError:
        attrs = {}
    status = attrs.get("status")
    r = {"run_id": run_id, "status": "cancelled", "steps_done": 0, "skipped": False, "traceback": None,
         "error": f"its task was cancelled on the cluster ({why}); the same command resumes it"}
    if status in FINISHED_STATUSES:
        then = (f"it was trained on after its task was cancelled on the cluster ({why}), and finished"
                if trained_on else f"it had finished before its task was cancelled on the cluster ({why})")
        r.update(status=status, error=None, after_cancel=then)
    elif status == "failed":  # recorded by train_run in the worker: its traceback is in the run
        r.update(status="failed", error=f"its task was cancelled on the cluster ({why}), and then recorded "
                                        f"failed (its traceback: dynamics status / run_attrs)")
    elif still:
        r["error"] = (f"its task was cancelled on the cluster ({why}); a process still trains it (its worker, or "
                      f"one its task waited for): `dynamics status` shows how it ends")
    elif trained_on:
        r["error"] = (f"its task was cancelled on the cluster ({why}); it was trained on and stopped before "
                      f"the end; the same command resumes it")
    return r


def finished_elsewhere(path: str, run_id: str) -> dict | None:
    """A skipped result for a run its task was refused for (a worker on other code) that the
    store holds finished: trained to the end by another process (a killed launcher's orphaned task,
    which the refused one had queued behind), not failed as the refusal alone said."""
    try:
        status = store.run_attrs(path, run_id).get("status") if store.has_run(path, run_id) else None
    except store.StoreError:
        return None
    if status not in FINISHED_STATUSES:
        return None
    return {"run_id": run_id, "status": status, "steps_done": 0, "skipped": True, "error": None,
            "traceback": None, "waited": None}


def given_up(path: str, run_id: str, starts_before: int | None, deaths: int, last_worker: str) -> dict:
    """The result of a run whose task the scheduler gave up on for good (KilledWorker).

    Dask counts a worker's death against every task the worker held, the ones queued behind the
    running one too: a run that never began this launch (its ``starts`` no higher than
    ``starts_before``, or still no group) only waited on workers another run crashed, and is
    summarised cancelled, untouched. One that began is recorded failed: its task never returned, so
    nothing recorded the run's end, and it would stay "running" (`dynamics status`: stopped) while
    the summary said failed.
    """
    trained = None  # of the deaths, those while it trained: one session begun this launch each
    try:
        attrs = store.run_attrs(path, run_id) if store.run_listed(path, run_id) else None
        began = attrs is not None and (starts_before is None or int(attrs.get("starts", 0)) > starts_before)
        if began:
            trained = min(deaths, int(attrs.get("starts", 0)) - (starts_before or 0)) or None
    except Exception:  # noqa: BLE001 - cannot tell: as a run that began (its failure recorded if it can be)
        began = True
    out = {"run_id": run_id, "steps_done": 0, "skipped": False, "traceback": None}
    if not began:
        return out | {"status": "cancelled", "error": (
            f"not trained: the workers its task waited on died {_times(deaths)} before it began (last {last_worker}; "
            f"a run beside it on the same worker may have crashed them); the same command "
            f"{'trains' if attrs is None else 'resumes'} it")}
    error = killed_reason(deaths, last_worker, trained)
    _record_failure(path, run_id, error)
    return out | {"status": "failed", "error": error}


def killed_reason(deaths: int, last_worker: str, trained: int | None = None) -> str:
    """The one-line error of a run whose task the scheduler gave up on (KilledWorker) for good:
    Dask's own message counts the workers of the last submission only.

    ``trained``: how many of the ``deaths`` came while the run trained (its sessions begun this
    launch, each ended by one), the rest with its task queued behind another run, whose crash
    they may be. "The worker training it died 3 times" of a run trained once sent a researcher
    looking for a crash in the wrong run. None: not known, and the line says either may be.
    """
    if trained is None:
        return (f"KilledWorker: the workers holding its task died {_times(deaths)} (with it training or queued; last "
                f"{last_worker}); the same command resumes it")
    queued = f", and {_times(deaths - trained)} more with it queued behind another run" if deaths > trained else ""
    return (f"KilledWorker: the worker training it died {_times(trained)}{queued} (last {last_worker}); the same "
            f"command resumes it")


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


class WorkerWatch:
    """Says once when the scheduler has no worker left and the sweep's runs wait for one, and
    again when workers are back: Dask holds the tasks of a cluster without workers for ever,
    while the progress line went on showing the runs the dead workers had been training."""

    def __init__(self, client, every: float = WORKER_CHECK_EVERY):
        self.client, self.every = client, every
        self.last = 0.0
        self.had = True

    def check(self, now: float, display, force: bool = False) -> None:
        """Look at the worker count every ``every`` seconds, or now if ``force``."""
        if not force and now - self.last < self.every:
            return
        self.last = now
        try:
            n = len(self.client.nthreads())
        except Exception:  # noqa: BLE001 - a scheduler lost meanwhile cancels the futures: said there
            return
        if n == 0 and self.had:
            display.notice("no worker is connected to the scheduler: the runs wait for one "
                           "(Ctrl-C stops the sweep; its runs stay resumable)")
            display.steps.clear()  # nothing is training now, whatever the last reports said
        elif n and not self.had:
            display.notice(f"{n} worker(s) connected again")
        self.had = n > 0


def stop_running(client, stop, pending: dict, collect, cancelled: dict,
                 say: Callable[[str], None] | None = None) -> bool:
    """After Ctrl-C: ask running tasks to stop, cancel queued ones, wait a little (``say``: how
    the line saying so is written, above the progress bars). True where a second Ctrl-C cut the
    wait short: the caller then aborts (:func:`kill_workers`)."""
    (say or functools.partial(print, file=sys.stderr, flush=True))(
        "dynamics: stopping the sweep (Ctrl-C again to abort at once); runs stay resumable")
    if client.status != "running":  # the scheduler is gone (Ctrl-C while an orphaned run was waited for):
        return False  # nothing to stop through it, and its calls raised from a closed client: a traceback, not exit 130
    try:
        if stop is not None:
            stop.set()
        deadline = time.monotonic() + STOP_GRACE
        while pending and time.monotonic() < deadline:
            for f in settled(pending, cancelled):
                collect(f, pending.pop(f))
            if pending and not client.nthreads():
                # no worker: no run is training to stop, and no queued task can start to see the
                # stop; waiting out the grace only held Ctrl-C for 30 s
                break
        client.cancel(list(pending), force=True)
    except KeyboardInterrupt:  # a second Ctrl-C: the runs stay resumable all the same
        return True
    except Exception:  # noqa: BLE001 - the scheduler lost meanwhile: as above
        pass
    return False


def kill_workers(cluster) -> None:
    """SIGKILL the embedded cluster's worker processes: a second Ctrl-C aborts at once.

    Closing the cluster with a run still training waited out the nanny's timeout, and the run
    trained on meanwhile, its stop event unreadable once the scheduler closed: a second Ctrl-C
    ended the sweep in about 4 s, where one took 1.3 s (measured). A killed run is as a
    ``dynamics run`` killed outright, resumed from its last checkpoint; :func:`mark_interrupted`
    marks it once the cluster is gone.
    """
    if not hasattr(signal, "SIGKILL"):  # Windows: closing the cluster stops them, in its own time
        return
    for nanny in list(getattr(cluster, "workers", {}).values()):
        with contextlib.suppress(Exception):  # a worker already gone (or one never started)
            if nanny.pid:
                os.kill(nanny.pid, signal.SIGKILL)


def mark_interrupted(path: str, run_ids: list[str]) -> None:
    """After the embedded cluster is gone, runs still marked running were cut short.

    Under each run's lock, as `task._record_failure`: a run still marked running may be one that
    another process (`dynamics run`, another launcher) is training right now, which holds the
    lock, and is left alone (run_lock refuses).
    """
    try:
        present = set(store.list_runs(path))  # one listing; run_lock would make a lock file for a run not there
    except Exception:  # noqa: BLE001 - best effort: the runs stay "running", which status shows as stopped
        return
    for run_id in (r for r in run_ids if r in present):
        with contextlib.suppress(Exception), store.run_lock(path, run_id):
            if store.run_attrs(path, run_id).get("status") == "running":
                store.update_run_attrs(path, run_id, status="interrupted")
