"""Sweeps: grid expansion, run ids, submission to Dask, a store lock, a summary.

A run config's ``[sweep]`` table names dotted config keys with lists of values. The
points are the full grid over those axes, except that the axes of a ``zip`` group are
paired element-wise and then crossed with the rest::

    [sweep]
    "model.init_scale" = [0.5, 1.0, 2.0]
    "train.seed" = [0, 1, 2]          # 3 x 3 = 9 points

Each point is the base config with its values put in (``config.with_values``), validated
before anything is written, and its run id is ``RunConfig.run_id()`` of that resolved
config: the same point always lands in the same run group, so launching a sweep again
skips finished runs and resumes interrupted ones from their checkpoints.

Engine: dask.distributed. By default an embedded ``LocalCluster`` with one
single-threaded worker process per core; ``scheduler="tcp://host:port"`` (or the path of
a scheduler file) sends the same tasks to an existing cluster instead. Each task trains
one run with torch limited to ``train.threads`` threads (1 by default) and writes only its own run group; the sweep
index (axes and each run's values) is written by the launching process alone, before
anything is submitted.

Storage on a cluster: the workers open the store by the same path as the launcher, so
it must be a filesystem they all see (NFS, Lustre, ...) or an fsspec URL
(``s3://bucket/sweep.zarr``, ``gcs://...``) that each worker can reach; relative local
paths are made absolute before they are sent, and a distillation teacher's relative path is
resolved in the task against the launcher's working directory (the task gets it). Checkpoints go through fsspec too
(``store.write_checkpoint``), so a run resumes on whichever worker picks it up. On a URL
store the tasks write only their own run group and leave the root index to the launcher,
which rebuilds it when the runs are done (``store.deferred_index``): there is no
cross-process lock on a URL. The sweep lock works on URLs, best-effort (object stores have
no exclusive create).

Workers of an existing cluster need this package importable (installed, or on
``PYTHONPATH``); each task sets torch's threads to its run's ``train.threads`` (1 by default),
so start them with ``--nthreads 1`` (or as many threads as runs you want per process, at
``train.threads`` cores each).

Progress: each task sends ``(run, step, total, loss)`` as scheduler events
(``Worker.log_event``) at most twice a second; the launcher draws an overall tqdm bar (runs
finished, completed or diverged, of total, with ETA) and one step bar per running run on a
terminal, and writes plain log lines otherwise (one per run that ends, with the same count).

Faults:

- a run that diverges is recorded ``diverged`` and the sweep goes on;
- a run that raises is recorded ``failed`` with its traceback in its attributes (by
  ``train_run``); the task returns that result instead of raising, so the sweep goes on
  and ends with a summary and a non-zero exit code;
- a worker that dies mid-run: the scheduler reschedules its task (up to the scheduler's
  ``allowed-failures``, 3 by default; after that the launcher resubmits it itself,
  ``MAX_RESUBMITS`` more times) and the run resumes from its last checkpoint; when the worker of
  its last submission dies too, the launcher records the run ``failed`` with that reason (under
  the run's lock, so never a run a live process trains), and the next launch resumes it;
- a run another process is training (``dynamics run`` of the point, an orphaned task of a killed
  launcher; it holds the run's lock): the task waits for it, tells the launcher so, then takes the
  run up (skipped if that process finished it, resumed if not); the summary lists it under
  ``waited``, counted by its final status, not failed;
- a task cancelled on the cluster (the launcher lost its scheduler, or another client cancelled
  it): Dask cannot stop a task already running, so the launcher waits while a process still holds
  the run's lock (local stores: a URL store has none, and is read at once), then reports the run
  by its store (:mod:`~dynamics.sweep.cancel`): completed or diverged there counts so
  (``SweepSummary.after_cancel`` says how), failed as failed, anything else is ``cancelled`` with
  the reason, the sweep ends with a non-zero exit code, and the next launch resumes the run;
- a cluster left with no worker: said once, and again when workers are back (the tasks wait);
- Ctrl-C (or SIGTERM): the launcher sets a cluster-wide stop event; running tasks notice it within a
  second or so, and ``train_run`` records them ``interrupted`` (their checkpoints stay);
  queued tasks are cancelled. Runs that could not be stopped in time keep their
  checkpoints and resume on the next launch either way;
- two launchers on one store: the first holds ``STORE/sweep.lock`` (pid, host, start
  time, heartbeat), the second is refused with a message naming the holder. A lock whose
  pid is dead on this host, or whose heartbeat is older than ``LOCK_STALE_AFTER``
  seconds, is stale and taken over.

Modules
-------
- :mod:`~dynamics.sweep.grid`: :class:`Point` and :func:`expand_grid`.
- :mod:`~dynamics.sweep.twins`: a run the store holds that trains what a config trains under another
  run id (:class:`Twin`, :func:`twins_in_store`, :func:`recorded_twins`), refused by ``dynamics run``
  and by :func:`run_sweep` for its new points (:func:`refuse_sweep_twins`).
- :mod:`~dynamics.sweep.lock`: the store lock (``LOCK_NAME``, ``LOCK_STALE_AFTER``, ``LOCK_HEARTBEAT_EVERY``,
  :class:`SweepLockError`, :class:`SweepLock`, :func:`acquire_lock`, :func:`read_lock`, :func:`lock_path`,
  :func:`lock_stale_reason`).
- :mod:`~dynamics.sweep.task`: the Dask task :func:`run_point` and its worker-side helpers (progress
  events, the stop event, the Ctrl-C plugin of the embedded cluster).
- :mod:`~dynamics.sweep.launcher`: :func:`run_sweep`, :func:`local_cluster`, :func:`default_workers`,
  submission and resubmission (``MAX_RESUBMITS``).
- :mod:`~dynamics.sweep.cancel`: what the launcher makes of tasks cancelled on the cluster, and
  of a cluster without workers; stopping on Ctrl-C (``STOP_GRACE``), a second one aborting at once.
- :mod:`~dynamics.sweep.progress`: the launcher's display (tqdm bars, log lines, or nothing).
- :mod:`~dynamics.sweep.summary`: :class:`SweepSummary` and ``FINISHED``.
"""

# `name as name`: module-level names kept reachable as sweep.<name>, outside __all__.
from dynamics.sweep.cancel import STOP_GRACE as STOP_GRACE
from dynamics.sweep.grid import Point, expand_grid
from dynamics.sweep.launcher import MAX_RESUBMITS as MAX_RESUBMITS
from dynamics.sweep.launcher import check_points as check_points
from dynamics.sweep.launcher import default_workers, local_cluster, run_sweep
from dynamics.sweep.lock import LOCK_HEARTBEAT_EVERY as LOCK_HEARTBEAT_EVERY
from dynamics.sweep.lock import LOCK_NAME as LOCK_NAME
from dynamics.sweep.lock import LOCK_STALE_AFTER as LOCK_STALE_AFTER
from dynamics.sweep.lock import (
    SweepLock,
    SweepLockError,
    acquire_lock,
    lock_path,
    lock_stale_reason,
    read_lock,
)
from dynamics.sweep.lock import read_lock_file as read_lock_file
from dynamics.sweep.summary import FINISHED as FINISHED
from dynamics.sweep.summary import SweepSummary
from dynamics.sweep.task import run_point

__all__ = [
    "Point",
    "expand_grid",
    "run_sweep",
    "local_cluster",
    "default_workers",
    "SweepSummary",
    "SweepLock",
    "SweepLockError",
    "acquire_lock",
    "read_lock",
    "lock_path",
    "lock_stale_reason",
    "run_point",
]
