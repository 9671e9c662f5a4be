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
one run with torch limited to one thread and writes only its own run group; the sweep
index (axes and each run's values) is written by the launching process alone, before
anything is submitted.

Storage on a cluster: the workers open the store by the same path as the launcher, so
it must be a filesystem they all see (NFS, Lustre, ...) or an fsspec URL
(``s3://bucket/sweep.zarr``, ``gcs://...``) that each worker can reach; relative local
paths are made absolute before they are sent. Checkpoints go through fsspec too
(``store.write_checkpoint``), so a run resumes on whichever worker picks it up. On a URL
store the tasks write only their own run group and leave the root index to the launcher,
which rebuilds it when the runs are done (``store.deferred_index``): there is no
cross-process lock on a URL. The sweep lock works on URLs, best-effort (object stores have
no exclusive create).

Workers of an existing cluster need this package importable (installed, or on
``PYTHONPATH``); each task limits torch to one thread, so start them with
``--nthreads 1`` (or as many threads as runs you want per process, at one core each).

Progress: each task sends ``(run, step, total, loss)`` as scheduler events
(``Worker.log_event``) at most twice a second; the launcher draws an overall tqdm bar (runs
done of total, with ETA) and one step bar per running run on a terminal, and writes plain
log lines otherwise.

Faults:

- a run that diverges is recorded ``diverged`` and the sweep goes on;
- a run that raises is recorded ``failed`` with its traceback in its attributes (by
  ``train_run``); the task returns that result instead of raising, so the sweep goes on
  and ends with a summary and a non-zero exit code;
- a worker that dies mid-run: the scheduler reschedules its task (up to the scheduler's
  ``allowed-failures``, 3 by default; after that the launcher resubmits it itself,
  ``MAX_RESUBMITS`` more times) and the run resumes from its last checkpoint;
- Ctrl-C (or SIGTERM): the launcher sets a cluster-wide stop event; running tasks notice it within a
  second or so, and ``train_run`` records them ``interrupted`` (their checkpoints stay);
  queued tasks are cancelled. Runs that could not be stopped in time keep their
  checkpoints and resume on the next launch either way;
- two launchers on one store: the first holds ``STORE/sweep.lock`` (pid, host, start
  time, heartbeat), the second is refused with a message naming the holder. A lock whose
  pid is dead on this host, or whose heartbeat is older than ``LOCK_STALE_AFTER``
  seconds, is stale and taken over.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dynamics import store
from dynamics.config import ConfigError, RunConfig, with_values

LOCK_NAME = "sweep.lock"
LOCK_STALE_AFTER = 120.0
"""Seconds without a heartbeat after which a lock held from another host is stale."""
LOCK_HEARTBEAT_EVERY = 10.0
"""Seconds between heartbeats of a held lock."""
MAX_RESUBMITS = 2
"""Extra submissions of a run whose task the scheduler gave up on (KilledWorker)."""
STOP_GRACE = 30.0
"""Seconds the launcher waits, after Ctrl-C, for running tasks to record `interrupted`."""
FINISHED = ("completed", "diverged")

log = logging.getLogger(__name__)


class SweepLockError(store.StoreError):
    """The store is being written by another sweep."""


# --------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Point:
    """One point of a sweep grid."""

    run_id: str
    """Run group name: ``cfg.run_id()``."""
    values: dict[str, Any] = field(hash=False)
    """Dotted config key -> this point's value, in axis order (JSON-able)."""
    cfg: RunConfig = field(hash=False, repr=False)
    """The resolved, validated config of this point (its sweep table is empty)."""

    @property
    def label(self) -> str:
        """``model.n_heads=4, train.seed=0`` (``base`` for a config without axes)."""
        return _label(self.values)


def _label(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items()) or "base"


def expand_grid(cfg: RunConfig) -> list[Point]:
    """Expand a config's ``[sweep]`` table into validated points.

    Axes are crossed in the order they appear (the first varies slowest); the axes of a
    ``zip`` group are paired element-wise and take the place of the group's first axis.
    Every point is validated before this returns, so a sweep can be refused before any
    work.

    Parameters
    ----------
    cfg : RunConfig
        Config whose ``sweep`` holds ``axes`` and ``zip`` (see ``config.SweepConfig``).

    Returns
    -------
    list of Point
        One point per grid cell; a config without axes gives one point, the base config.

    Raises
    ------
    ConfigError
        ``sweep point model.n_heads=5, train.seed=0: <why>`` for the first invalid point,
        or when two points resolve to the same run (e.g. they differ only in train.device).

    Example
    -------
    >>> pts = expand_grid(load_config("experiments/quickstart.toml"))  # doctest: +SKIP
    >>> pts[0].label, pts[0].run_id  # doctest: +SKIP
    ('model.init_scale=0.5, train.seed=0', 'r3f9c2a61d0')
    """
    axes = {k: list(v) for k, v in cfg.sweep.axes.items()}
    group_of = {key: group for group in cfg.sweep.zip for key in group}
    units: list[list[dict[str, Any]]] = []  # each unit: the list of its partial assignments
    placed: set[str] = set()
    for key in axes:
        if key in placed:
            continue
        group = group_of.get(key, (key,))
        placed.update(group)
        units.append([dict(zip(group, combo, strict=True))
                      for combo in zip(*(axes[k] for k in group), strict=True)])
    points: list[Point] = []
    seen: dict[str, str] = {}
    for parts in itertools.product(*units):
        merged: dict[str, Any] = {}
        for part in parts:
            merged.update(part)
        values = {k: _plain(merged[k]) for k in axes}  # axis order, JSON-able
        try:
            point_cfg = with_values(cfg, values)
        except ConfigError as e:
            raise ConfigError(f"sweep point {_label(values)}: {e}") from None
        run_id = point_cfg.run_id()
        if run_id in seen:
            raise ConfigError(f"sweep points {seen[run_id]} and {_label(values)} are the same run "
                              f"({run_id}); the run id ignores train.device and train.threads")
        seen[run_id] = _label(values)
        points.append(Point(run_id, values, point_cfg))
    return points


def _plain(value: Any) -> Any:
    """Tuples to lists, so values round-trip through JSON attributes unchanged."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- the lock


def _is_url(path: str) -> bool:
    return "://" in str(path)


def lock_path(path: str) -> str:
    """Where the sweep lock of the store at ``path`` lives."""
    return f"{str(path).rstrip('/')}/{LOCK_NAME}"


def _fs(path: str):
    import fsspec.core

    return fsspec.core.url_to_fs(path)


def read_lock(path: str) -> dict | None:
    """The lock held on the store at ``path`` (pid, host, started, heartbeat, ...), or None."""
    target = lock_path(path)
    try:
        if _is_url(target):
            fs, p = _fs(target)
            blob = fs.cat_file(p)
        else:
            with open(target, "rb") as f:
                blob = f.read()
    except (FileNotFoundError, OSError):
        return None
    try:
        info = json.loads(blob)
    except ValueError:
        return {"corrupt": True, "heartbeat": 0.0}  # a torn write: judged by age alone below
    return info if isinstance(info, dict) else {"corrupt": True, "heartbeat": 0.0}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def lock_stale_reason(info: dict, *, stale_after: float = LOCK_STALE_AFTER, now: float | None = None) -> str | None:
    """Why the lock ``info`` is stale (its holder is gone), or None while it is live.

    A lock is stale when its pid is not running on this host (same host name), or when
    its heartbeat is older than ``stale_after`` seconds (any host; heartbeats come every
    ``LOCK_HEARTBEAT_EVERY`` seconds while the holder lives).
    """
    now = time.time() if now is None else now
    if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int) \
            and not _pid_alive(info["pid"]):
        return f"pid {info['pid']} is not running on {info['host']}"
    age = now - float(info.get("heartbeat", 0.0))
    if age > stale_after:
        return f"last heartbeat {age:.0f} s ago (> {stale_after:.0f} s)"
    return None


def _describe(info: dict, now: float | None = None) -> str:
    now = time.time() if now is None else now
    if info.get("corrupt"):
        return "an unreadable lock"
    age = now - float(info.get("heartbeat", now))
    return (f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started', '?')}, "
            f"last heartbeat {age:.0f} s ago")


class SweepLock:
    """A held sweep lock; a background thread refreshes its heartbeat until released.

    Use :func:`acquire_lock` to get one; it is a context manager that releases on exit.
    """

    def __init__(self, path: str, info: dict, heartbeat_every: float = LOCK_HEARTBEAT_EVERY):
        self.path = str(path)
        self.info = info
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_every,),
                                        name="dynamics-sweep-lock", daemon=True)
        self._thread.start()

    @property
    def token(self) -> str:
        return self.info["token"]

    def owned(self) -> bool:
        """True while the lock file on disk is still this one."""
        current = read_lock(self.path)
        return bool(current) and current.get("token") == self.token

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                if not self.owned():
                    log.warning("sweep lock on %s was taken over by another launcher", self.path)
                    return
                self.info["heartbeat"] = time.time()
                _write_lock(self.path, self.info, exclusive=False)
            except OSError as e:  # a flaky shared filesystem must not kill the sweep
                log.warning("sweep lock heartbeat failed: %s", e)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file if it is still ours."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            if self.owned():
                _remove(lock_path(self.path))

    def __enter__(self) -> SweepLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _write_lock(path: str, info: dict, *, exclusive: bool) -> None:
    """Write the lock file; ``exclusive`` fails with FileExistsError if one is there."""
    target = lock_path(path)
    blob = json.dumps(info, indent=1).encode()
    if _is_url(target):
        fs, p = _fs(target)
        if exclusive and fs.exists(p):  # object stores have no O_EXCL: best effort
            raise FileExistsError(target)
        fs.pipe_file(p, blob)
        return
    if exclusive:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        return
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, target)


def _remove(target: str) -> None:
    if _is_url(target):
        fs, p = _fs(target)
        fs.rm_file(p)
    else:
        os.remove(target)


def _take_over(path: str, stale: dict) -> bool:
    """Remove the stale lock ``stale``; False if the file changed meanwhile (someone else won)."""
    target = lock_path(path)
    if _is_url(target):
        if read_lock(path) != stale:
            return False
        with contextlib.suppress(FileNotFoundError):
            _remove(target)
        return True
    aside = f"{target}.stale-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(target, aside)  # atomic: of two launchers taking over, one wins
    except FileNotFoundError:
        return False
    moved = read_lock_file(aside)
    if moved != stale:  # a fresh lock appeared between our read and the rename: put it back
        with contextlib.suppress(OSError):
            os.link(aside, target)
        os.remove(aside)
        return False
    os.remove(aside)
    return True


def read_lock_file(file: str) -> dict | None:
    try:
        with open(file, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return {"corrupt": True, "heartbeat": 0.0}


def acquire_lock(
    path: str,
    *,
    stale_after: float = LOCK_STALE_AFTER,
    heartbeat_every: float = LOCK_HEARTBEAT_EVERY,
) -> SweepLock:
    """Take the sweep lock of the store at ``path`` (a directory that exists).

    Parameters
    ----------
    path : str
        Store path or fsspec URL.
    stale_after : float
        A lock whose heartbeat is older than this many seconds is taken over.
    heartbeat_every : float
        Seconds between heartbeats while held.

    Returns
    -------
    SweepLock
        Held until ``release()`` (or the end of a ``with`` block).

    Raises
    ------
    SweepLockError
        Another live launcher holds the lock; the message names it.

    Example
    -------
    >>> with acquire_lock("runs/quickstart.zarr"):  # doctest: +SKIP
    ...     pass
    """
    now = time.time()
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
        "heartbeat": now,
        "token": uuid.uuid4().hex,
        "command": " ".join(sys.argv)[:500],
    }
    for _ in range(5):
        try:
            _write_lock(path, info, exclusive=True)
            return SweepLock(path, info, heartbeat_every)
        except FileExistsError:
            pass
        held = read_lock(path)
        if held is None:
            continue  # released between our attempt and the read
        reason = lock_stale_reason(held, stale_after=stale_after)
        if reason is None:
            raise SweepLockError(
                f"{path} is being written by another sweep ({_describe(held)}); wait for it to finish, "
                f"or delete {lock_path(path)} if that process is gone")
        log.warning("taking over a stale sweep lock on %s: %s", path, reason)
        _take_over(path, held)
    raise SweepLockError(f"could not take the sweep lock {lock_path(path)}: it keeps changing")


# --------------------------------------------------------------------------- the task


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


def run_point(cfg: RunConfig, path: str, run_id: str, values: dict, token: str = "") -> dict:
    """Train one sweep point (the Dask task); never raises for a run's own failure.

    Returns a dict: run_id, status (completed | diverged | failed | interrupted |
    cancelled), steps_done, skipped, error (one line) and traceback (failed only).
    """
    from dynamics.train import set_threads, train_run

    set_threads(1)
    _keep_freed_memory()
    reporter = _TaskReporter(run_id, token)
    out = {"run_id": run_id, "status": "cancelled", "steps_done": 0, "skipped": False, "error": None,
           "traceback": None}
    if reporter.stopped():
        return out  # queued behind a Ctrl-C: never started, nothing written
    with store.deferred_index(path):  # a URL store's root index is the launcher's to rebuild
        try:
            result = train_run(cfg, path, run_id, progress=reporter, extra_attrs={"sweep_values": values})
            out.update(status=result.status, steps_done=result.steps_done, skipped=result.skipped)
        except KeyboardInterrupt:
            out.update(status="interrupted")
        except Exception as e:  # noqa: BLE001 - recorded in the run (train_run) and in the summary
            tb = traceback.format_exc()
            out.update(status="failed", error=f"{type(e).__name__}: {e}".splitlines()[0], traceback=tb)
            _record_failure(path, run_id, tb)
    return out


def _keep_freed_memory() -> None:
    """Undo Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` in this worker process (glibc only).

    Dask's nannies set that variable so freed memory goes back to the OS at once. Setting it
    also turns off glibc's adaptive mmap threshold, so every tensor above 128 KiB is mmapped
    and unmapped again: torch, which frees and reallocates its activations every step, then
    spends more time in page faults than in arithmetic (measured: a run took 2.3x the wall
    time, sys time 5 s per 300 steps against 0). ``mallopt`` restores heap reuse.
    """
    if not os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD: the largest glibc allows on 64-bit
        libc.mallopt(-1, 64 * 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError, TypeError):  # not glibc: nothing to undo
        pass


def _record_failure(path: str, run_id: str, tb: str) -> None:
    """If train_run failed before it could record the failure itself, record it in the run."""
    try:
        if run_id in store.list_runs(path) and store.run_attrs(path, run_id).get("status") != "failed":
            store.update_run_attrs(path, run_id, status="failed", traceback=tb)
    except Exception:  # noqa: BLE001 - best effort; the summary carries the error anyway
        pass


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


# --------------------------------------------------------------------------- the launcher


@dataclass
class SweepSummary:
    """What a sweep did."""

    total: int = 0
    """Points in the grid."""
    counts: dict[str, int] = field(default_factory=dict)
    """Final status -> number of runs (completed, diverged, failed, interrupted, cancelled)."""
    skipped: list[str] = field(default_factory=list)
    """Runs already finished before this launch (nothing retrained)."""
    failed: list[str] = field(default_factory=list)
    """Run ids that failed."""
    errors: dict[str, str] = field(default_factory=dict)
    """run id -> one-line error, for failed runs."""
    labels: dict[str, str] = field(default_factory=dict)
    """run id -> point label (``model.n_heads=4, train.seed=0``)."""
    wall_time: float = 0.0
    """Seconds the launch took."""

    @property
    def ok(self) -> bool:
        """True when every run ended completed or diverged."""
        return sum(n for s, n in self.counts.items() if s not in FINISHED) == 0

    def lines(self) -> list[str]:
        """Human-readable summary, one line per fact."""
        parts = [f"{n} {s}" for s, n in sorted(self.counts.items(), key=lambda kv: -kv[1])]
        head = f"sweep: {self.total} runs: " + (", ".join(parts) or "nothing to do")
        if self.skipped:
            head += f" ({len(self.skipped)} already finished, not retrained)"
        out = [head + f" in {self.wall_time:.1f} s"]
        for run_id in self.failed:
            out.append(f"  failed {run_id} [{self.labels.get(run_id, '?')}]: {self.errors.get(run_id, '?')}")
        return out


class _Display:
    """Plain log lines (not a terminal): one line per finished run, running runs every 10 s."""

    def __init__(self, total: int, done: int, stream=sys.stderr, every: float = 10.0):
        self.total, self.done, self.stream, self.every = total, done, stream, every
        self.steps: dict[str, tuple[int, int]] = {}
        self.last = time.monotonic()

    def step(self, run_id: str, step: int, total: int, loss: float) -> None:
        self.steps[run_id] = (step, total)

    def finished(self, run_id: str, status: str, note: str = "") -> None:
        self.done += 1
        self.steps.pop(run_id, None)
        print(f"[sweep] {self.done}/{self.total} {run_id} {status}{note}", file=self.stream, flush=True)

    def tick(self) -> None:
        now = time.monotonic()
        if self.steps and now - self.last >= self.every:
            self.last = now
            running = ", ".join(f"{r} {s}/{t}" for r, (s, t) in sorted(self.steps.items()))
            print(f"[sweep] {self.done}/{self.total} done; running: {running}", file=self.stream, flush=True)

    def close(self) -> None:
        pass


class _Bars(_Display):
    """tqdm: an overall bar (runs done of total, ETA) and one step bar per running run."""

    def __init__(self, total: int, done: int, stream=sys.stderr):
        from tqdm import tqdm

        super().__init__(total, done, stream)
        self.tqdm = tqdm
        self.overall = tqdm(total=total, initial=done, desc="sweep", unit="run", position=0,
                            dynamic_ncols=True, file=stream)
        self.bars: dict[str, Any] = {}
        self.slot: dict[str, int] = {}

    def step(self, run_id: str, step: int, total: int, loss: float) -> None:
        bar = self.bars.get(run_id)
        if bar is None:
            taken = set(self.slot.values())
            self.slot[run_id] = next(i for i in itertools.count(1) if i not in taken)
            bar = self.tqdm(total=total, desc=run_id, unit="step", position=self.slot[run_id], leave=False,
                            dynamic_ncols=True, file=self.stream)
            self.bars[run_id] = bar
        bar.n = step
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        bar.refresh()

    def finished(self, run_id: str, status: str, note: str = "") -> None:
        self.done += 1
        bar = self.bars.pop(run_id, None)
        self.slot.pop(run_id, None)
        if bar is not None:
            bar.close()
        if status not in FINISHED or note:
            self.overall.write(f"{run_id} {status}{note}")
        self.overall.update(1)

    def tick(self) -> None:
        pass

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.overall.close()


class _Quiet(_Display):
    def finished(self, run_id: str, status: str, note: str = "") -> None:
        self.done += 1

    def tick(self) -> None:
        pass


def _display(progress: bool | None, total: int, done: int) -> _Display:
    if progress is False:
        return _Quiet(total, done)
    if progress is None:
        progress = sys.stderr.isatty()
    return _Bars(total, done) if progress else _Display(total, done)


def local_cluster(n_workers: int):
    """The embedded cluster: ``n_workers`` single-threaded worker processes (with nannies).

    Started without Dask's ``MALLOC_TRIM_THRESHOLD_`` (see ``_keep_freed_memory``).
    """
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        # No dashboard; the scheduler's HTTP server (health routes) takes any free port, not 8787.
        return LocalCluster(
            n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
            silence_logs=logging.ERROR, env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        )


def _client(scheduler: str | None, n_workers: int):
    """(client, cluster or None): an existing cluster's client, or an embedded LocalCluster."""
    from distributed import Client

    if scheduler:
        if "://" not in scheduler and os.path.isfile(scheduler):
            return Client(scheduler_file=scheduler, timeout=30), None
        return Client(scheduler, timeout=30), None
    cluster = local_cluster(n_workers)
    client = Client(cluster)
    client.register_plugin(_ignore_sigint_plugin())
    return client, cluster


def default_workers() -> int:
    """One worker per usable core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _write_index(path: str, points: list[Point]) -> None:
    """Merge this sweep's axes and points into the store's sweep index (launcher only)."""
    index = store.read_sweep_index(path) or {}
    axes = list(index.get("axes", []))
    for p in points:
        for k in p.values:
            if k not in axes:
                axes.append(k)
    runs = dict(index.get("runs", {}))
    runs.update({p.run_id: p.values for p in points})
    store.write_sweep_index(path, {"axes": axes, "runs": runs})


def run_sweep(
    cfg: RunConfig,
    path: str,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool | None = None,
) -> SweepSummary:
    """Train every point of ``cfg``'s sweep grid into the store at ``path``.

    Finished runs (completed or diverged) are skipped without contacting any cluster;
    interrupted ones resume from their checkpoints. The store is locked for the duration.

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
        An invalid point (before anything is written).
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
    points = expand_grid(cfg)
    if not _is_url(path):
        path = os.path.abspath(path)  # workers may run elsewhere
    store.init_store(path)
    summary = SweepSummary(total=len(points), labels={p.run_id: p.label for p in points})
    with _sigterm_as_interrupt(), acquire_lock(path):
        existing = set(store.list_runs(path))
        todo = []
        for p in points:
            status = store.run_attrs(path, p.run_id).get("status") if p.run_id in existing else None
            if status in FINISHED:
                summary.skipped.append(p.run_id)
                summary.counts[status] = summary.counts.get(status, 0) + 1
            else:
                todo.append(p)
        _write_index(path, points)
        try:
            if todo:
                n = min(workers or default_workers(), len(todo))
                results = _launch(todo, path, scheduler, n, _display(progress, len(points), len(summary.skipped)))
                for r in results:
                    summary.counts[r["status"]] = summary.counts.get(r["status"], 0) + 1
                    if r["status"] == "failed":
                        summary.failed.append(r["run_id"])
                        summary.errors[r["run_id"]] = r["error"] or "?"
        finally:
            if _is_url(path):  # its tasks left the root index alone (store.deferred_index)
                store.reindex(path)
    summary.wall_time = time.perf_counter() - t0
    return summary


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (``kill``, a batch system's time limit) stops the sweep as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _launch(todo: list[Point], path: str, scheduler: str | None, n_workers: int, display: _Display) -> list[dict]:
    """Submit the points, follow them to the end, return one result dict per point."""
    import queue

    from distributed import Event, KilledWorker, wait

    token = uuid.uuid4().hex[:12]
    events: queue.SimpleQueue = queue.SimpleQueue()
    results: dict[str, dict] = {}
    client, cluster = _client(scheduler, n_workers)
    stop = Event(_stop_name(token), client=client)
    by_run = {p.run_id: p for p in todo}
    order = {p.run_id: i for i, p in enumerate(todo)}
    tries: Counter = Counter()

    def submit(p: Point):
        tries[p.run_id] += 1
        key = f"dynamics-train-{p.run_id}-{token}-{tries[p.run_id]}"
        return client.submit(run_point, p.cfg, path, p.run_id, p.values, token, key=key, pure=False,
                             priority=len(todo) - order[p.run_id])  # grid order

    def drain() -> None:
        while True:
            try:
                _, msg = events.get_nowait()
            except queue.Empty:
                return
            if msg["run"] not in results:
                display.step(msg["run"], msg["step"], msg["total"], msg["loss"])

    def collect(f, run_id: str) -> None:
        if f.status == "finished":
            r = f.result()
        else:
            exc = f.exception()
            if isinstance(exc, KilledWorker) and tries[run_id] <= MAX_RESUBMITS:
                pending[submit(by_run[run_id])] = run_id
                return
            r = {"run_id": run_id, "status": "failed", "steps_done": 0, "skipped": False,
                 "error": f"{type(exc).__name__}: {exc}".splitlines()[0], "traceback": None}
        results[run_id] = r
        note = f": {r['error']}" if r["status"] == "failed" else ""
        if r.get("skipped"):
            note = " (already finished)"
        display.finished(run_id, r["status"], note)

    pending: dict = {}
    try:
        client.subscribe_topic(_progress_topic(token), events.put)
        for p in todo:
            pending[submit(p)] = p.run_id
        while pending:
            try:
                done, _ = wait(list(pending), timeout=0.5, return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = ()
            drain()
            for f in done:
                collect(f, pending.pop(f))
            display.tick()
    except KeyboardInterrupt:
        _stop_running(client, stop, pending, collect)
        raise
    finally:
        display.close()
        with contextlib.suppress(Exception):
            client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
            _mark_interrupted(path, [r for r in by_run if r not in results])
    return [results[p.run_id] for p in todo if p.run_id in results]


def _stop_running(client, stop, pending: dict, collect) -> None:
    """After Ctrl-C: ask running tasks to stop, cancel queued ones, wait a little."""
    from distributed import wait

    print("dynamics: stopping the sweep (Ctrl-C again to abort at once); runs stay resumable",
          file=sys.stderr, flush=True)
    try:
        stop.set()
        deadline = time.monotonic() + STOP_GRACE
        while pending and time.monotonic() < deadline:
            try:
                done, _ = wait(list(pending), timeout=0.5, return_when="FIRST_COMPLETED")
            except TimeoutError:
                continue
            for f in done:
                collect(f, pending.pop(f))
        client.cancel(list(pending), force=True)
    except KeyboardInterrupt:
        pass


def _mark_interrupted(path: str, run_ids: list[str]) -> None:
    """After the embedded cluster is gone, runs still marked running were cut short."""
    for run_id in run_ids:
        with contextlib.suppress(Exception):
            if run_id in store.list_runs(path) and store.run_attrs(path, run_id).get("status") == "running":
                store.update_run_attrs(path, run_id, status="interrupted")
