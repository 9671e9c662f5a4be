"""The Dask task :func:`run_point` and its worker-side helpers: progress events, the stop event,
glibc's heap settings, failure records, and the worker plugin that ignores Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import time
import traceback

from dynamics import allocator, store
from dynamics.config import ConfigError, RunConfig
from dynamics.schema import FINISHED_STATUSES
from dynamics.sweep.twins import TwinRefused, point_refusal, twin_guard


def _progress_topic(token: str) -> str:
    return f"dynamics-sweep-progress-{token}"


def _stop_name(token: str) -> str:
    return f"dynamics-sweep-stop-{token}"


class _TaskReporter:
    """train_run's progress callback inside a task: reports steps, obeys the stop event.

    Progress goes to the launcher as scheduler events (``Worker.log_event``), at most a
    couple per second per run. The stop event is polled at most once a second; when it is
    set, raising KeyboardInterrupt here makes train_run record the run ``interrupted``.
    """

    def __init__(self, run_id: str, token: str):
        from distributed import Event, get_worker

        self.run_id = run_id
        self.topic = _progress_topic(token)
        try:
            self.worker = get_worker()
        except ValueError:  # called outside a worker (tests): report nothing
            self.worker = None
        self.stop = Event(_stop_name(token)) if self.worker is not None else None
        self.last_report = self.last_check = 0.0

    def waiting(self, text: str) -> None:
        """Tell the launcher this run waits for another process (shown as it happens)."""
        if self.worker is not None:
            self.worker.log_event(self.topic, {"run": self.run_id, "waiting": text})

    def stopped(self) -> bool:
        if self.stop is None:
            return False
        try:
            return bool(self.stop.is_set())
        except Exception:  # noqa: BLE001 - a lost scheduler connection is not a reason to stop
            return False

    def __call__(self, step: int, total: int, loss: float) -> None:
        now = time.monotonic()
        if self.worker is not None and (now - self.last_report >= 0.5 or step >= total):
            self.last_report = now
            self.worker.log_event(self.topic, {"run": self.run_id, "step": int(step), "total": int(total),
                                               "loss": float(loss)})
        if step < total and now - self.last_check >= 1.0:
            self.last_check = now
            if self.stopped():
                raise KeyboardInterrupt("sweep stopped by its launcher")


_SEEN: dict[tuple[str, str], dict] = {}
"""(launch token, store) -> the runs' trainings this worker read for :func:`twin_guard`, kept for
one launch only: a store rewritten between launches is read again."""


def run_point(cfg: RunConfig, path: str, run_id: str, values: dict, token: str = "",
              cwd: str | None = None, data: str | None = None) -> dict:
    """Train one sweep point (the Dask task); never raises for a run's own failure.

    ``cwd`` is the launcher's working directory: relative paths in ``cfg`` (a distillation
    teacher) are to it, not to this worker's, which on an external cluster may be another.
    ``data`` is the point's data hash on the launcher's machine: a worker that makes other data
    (the corpus of another Python's standard library) refuses the point, untouched, so that the
    runs of one sweep never train on different data.

    A run that another process is training (``dynamics run`` of the point, or an orphaned task of
    a killed launcher: it holds the run's lock) is waited for, not failed: the launcher is told
    once, and when that process ends the run is taken up as any other, skipped if it finished
    (its status is then that process's outcome), resumed if not. Stopping the sweep while waiting
    returns it cancelled, untouched.

    Returns a dict: run_id, status (completed | diverged | failed | interrupted |
    cancelled), steps_done, skipped, error (one line), traceback (failed only) and waited (the
    process it waited for, as its lock names it, or None).
    """
    from dynamics.interventions.distill import relative_to
    from dynamics.train import train_run  # it sets torch's threads from train.threads (1 by default)

    # Before the run (train_run does it for cpu runs only): undoes the MALLOC_TRIM_THRESHOLD_
    # Dask's nannies set on a cluster of --scheduler, whose every >128 KiB block was mmap'd
    allocator.keep_freed_memory()
    reporter = _TaskReporter(run_id, token)
    out = {"run_id": run_id, "status": "cancelled", "steps_done": 0, "skipped": False, "error": None,
           "traceback": None, "waited": None}
    if reporter.stopped():
        return out  # queued behind a Ctrl-C: never started, nothing written
    if data is not None:
        from dynamics.tasks import data_hash

        if (here := data_hash(cfg)) != data:
            out.update(status="failed", error=(
                f"this worker makes other data for task {cfg.task.name!r} than the launcher's machine (data hash "
                f"{here[:16]}... against {data[:16]}...: another Python's standard library, for the corpus?); not "
                f"trained here, so that the sweep's runs all train on the same data"))
            return out
    # The launcher refused the twins the store held; one another process (`dynamics run`) made
    # since is refused as the point's group is made, as train_run's StoreError below
    for key in list(_SEEN):  # list() is atomic under the GIL; tasks of two launches may share a worker
        if key[0] != token:
            _SEEN.pop(key, None)
    guard = twin_guard(path, cfg, lambda twin: point_refusal(values, path, twin), seen=_SEEN.setdefault((token, path), {}))
    # A URL store's root index is the launcher's to rebuild
    with store.deferred_index(path), relative_to(cwd or os.getcwd()):
        while True:
            try:
                result = train_run(cfg, path, run_id, progress=reporter, extra_attrs={"sweep_values": values},
                                   before_create=guard)
                out.update(status=result.status, steps_done=result.steps_done, skipped=result.skipped,
                           resumed_from=result.resumed_from)
            except store.RunLocked as e:
                # Refused before anything was written: the holder's outcome is the run's, so the
                # sweep waits for it rather than report a failure of a run that goes on training.
                if out["waited"] is None:
                    reporter.waiting(f"{str(e).rsplit('; ', 1)[0]}; the sweep takes it up when that process ends")
                out["waited"] = e.holder
                if not _wait_for_holder(path, run_id, reporter):
                    out["error"] = f"stopped while another process ({e.holder}) was training it"
                    return out
                continue  # taken up now: skipped if the holder finished it, resumed if not
            except KeyboardInterrupt:
                out.update(status="interrupted")
            except Exception as e:  # noqa: BLE001 - recorded in the run (train_run) and in the summary
                tb = traceback.format_exc()
                out.update(status="failed", error=f"{type(e).__name__}: {e}".splitlines()[0], traceback=tb)
                if isinstance(e, TwinRefused):  # its group never made: the launcher takes it out of the index
                    out["twin"] = True
                # Another StoreError, or a ConfigError (its teacher gone or remade since the launcher's
                # checks), is train_run refusing the run, as `dynamics run` refuses it: the run is not
                # this task's to mark failed. One raised by a write while training was recorded by
                # train_run itself.
                if not isinstance(e, (store.StoreError, ConfigError)):
                    _record_failure(path, run_id, tb)
                    if not _failure_recorded(path, run_id, e):  # a full disk: the run stays marked running
                        out["error"] += " (its traceback could not be recorded in the store)"
            return out


WAIT_POLL = 0.5
"""Seconds between looks at a run lock another process holds (the flock is dropped when it ends)."""


def _wait_for_holder(path: str, run_id: str, reporter: _TaskReporter) -> bool:
    """Wait while another process holds run `run_id`'s lock; False if the sweep was stopped meanwhile."""
    while store.run_lock_held(path, run_id):
        if reporter.stopped():
            return False
        time.sleep(WAIT_POLL)
    return True


def _record_failure(path: str, run_id: str, tb: str) -> None:
    """If train_run failed before it could record the failure itself, record it in the run.

    ``tb`` is the traceback, or the launcher's one-line reason for a task that never returned
    (its workers died)."""
    try:
        if run_id not in store.list_runs(path):
            return
        # Under the run's lock: a task refused because another process is training this run
        # (an orphaned task of a killed launcher, a `dynamics run`) must not mark that run
        # failed, nor a run that process has finished meanwhile.
        with store.run_lock(path, run_id):
            if store.run_attrs(path, run_id).get("status") not in ("failed", *FINISHED_STATUSES):
                store.update_run_attrs(path, run_id, status="failed", traceback=tb)
    except Exception:  # noqa: BLE001 - best effort; the summary carries the error anyway
        pass


def _failure_recorded(path: str, run_id: str, e: BaseException) -> bool:
    """Whether the run's attributes hold the traceback of ``e``, as `dynamics run` says of its own
    failures: on a disk that filled up neither train_run nor `_record_failure` could write it, and
    the summary's "failed" stood beside a run `dynamics status` showed stopped, or as an earlier
    failure."""
    from dynamics.train import traceback_recorded

    try:
        return traceback_recorded(store.run_attrs(path, run_id), e)
    except Exception:  # noqa: BLE001 - no run (or store) to read: nothing recorded it
        return False


def _ignore_sigint_plugin():
    from distributed import WorkerPlugin

    class IgnoreSigint(WorkerPlugin):
        """Embedded cluster only: Ctrl-C in the terminal reaches the worker processes too;
        they ignore it and let the launcher stop runs cleanly (the stop event)."""

        name = "dynamics-ignore-sigint"
        idempotent = True

        def setup(self, worker) -> None:
            import signal

            with contextlib.suppress(ValueError):  # not the main thread: nothing to do
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    return IgnoreSigint()
