"""Checkpoint files under ``STORE/checkpoints/<run_id>/ckpt.pt``, written atomically, and the
lock ``train.lock`` beside them that keeps two processes from training one run at once.

They live beside the zarr groups, not inside them (plain xarray never sees them), on
whatever holds the store: a local directory, or the filesystem of an fsspec URL
(``s3://``, ``gcs://``, ``memory://`` ...), so a run on a cluster with shared object
storage resumes on whichever worker picks it up.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import socket
import time
import uuid
import zipfile
from pathlib import Path

from dynamics.store._loc import StoreError, _check_name, _group_meta, _Loc, _locked, clear_partials, new_file

try:
    import fcntl
except ImportError:  # not POSIX: no run lock
    fcntl = None

CHECKPOINT_FILE = "ckpt.pt"
RUN_LOCK_FILE = "train.lock"


def _key(run_id: str, name: str = CHECKPOINT_FILE) -> str:
    return f"checkpoints/{_check_name('run id', run_id)}/{name}"


def _remote_target(loc: _Loc, run_id: str):
    """(sync fsspec filesystem, path of the run's checkpoint in it) for a URL store."""
    import fsspec.core

    fs, root = fsspec.core.url_to_fs(loc.url)
    return fs, f"{root.rstrip('/')}/{_key(run_id)}"


def checkpoint_path(path: str | os.PathLike, run_id: str) -> Path:
    """Local file for a run's checkpoint, ``STORE/checkpoints/<run_id>/ckpt.pt`` (parent created).

    Only for a local store (a path or ``file://`` URL); :func:`write_checkpoint`,
    :func:`read_checkpoint` and :func:`has_checkpoint` work on any store.

    Raises
    ------
    StoreError
        For a remote (fsspec) store.
    """
    loc = _Loc(path)
    if loc.local is None:
        raise StoreError(f"{loc} is not on a local filesystem; use read_checkpoint/write_checkpoint")
    target = loc.local / _key(run_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def write_checkpoint(path: str | os.PathLike, run_id: str, data: bytes) -> None:
    """Store a run's checkpoint so that readers see the old one or the new one, never a mix.

    Local: :func:`atomic_write_bytes`. URL: the bytes go to a uniquely named temporary key
    beside the target, then are moved over it; on object stores the final copy is one PUT,
    which is atomic, and the temporary key is removed even when the move fails.
    """
    loc = _Loc(path)
    if loc.local is not None:
        atomic_write_bytes(loc.local / _key(run_id), data)  # makes the parent directory
        return
    fs, target = _remote_target(loc, run_id)
    tmp = f"{target}.{uuid.uuid4().hex}.tmp"
    fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
    try:
        fs.pipe_file(tmp, data)
        fs.mv(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError, OSError):
            if fs.exists(tmp):
                fs.rm(tmp)


def read_checkpoint(path: str | os.PathLike, run_id: str) -> bytes | None:
    """A run's checkpoint bytes, or None when it has none."""
    loc = _Loc(path)
    if loc.local is not None:
        try:
            return (loc.local / _key(run_id)).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError:  # nothing this package writes: damage from outside, named as such
            raise StoreError(f"run {run_id}'s checkpoint in {path} is damaged (a folder, not a file); its "
                             f"recorded arrays are untouched") from None
    fs, target = _remote_target(loc, run_id)
    try:
        return fs.cat_file(target)
    except FileNotFoundError:
        return None


class _StepOnly(pickle.Unpickler):
    """Reads a torch checkpoint's pickle without torch and without running any of its code:
    torch's classes and tensor rebuilders become stubs giving None, its storages None, and
    anything else refuses, so a store from elsewhere cannot run code through it."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module.split(".")[0] == "torch":
            return lambda *args, **kwargs: None
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid):
        return None


def checkpoint_step(path: str | os.PathLike, run_id: str) -> int | None:
    """The step of a run's checkpoint, read from the checkpoint itself, torch-free (for
    `dynamics status`); None where it has none, or holds what :class:`_StepOnly` cannot read.

    Its attrs name it only after it is written, so a kill in between leaves them naming the one before.
    """
    loc = _Loc(path)
    try:
        # Opened, not read whole: only the zip's directory and its small pickle are fetched, not
        # the tensors (all of a 400 MB checkpoint was read, or downloaded, for one integer).
        if loc.local is not None:
            f = open(loc.local / _key(run_id), "rb")  # noqa: SIM115 - closed by the with below
        else:
            fs, target = _remote_target(loc, run_id)
            f = fs.open(target, "rb")
        with f, zipfile.ZipFile(f) as z:
            [pkl] = [n for n in z.namelist() if n.endswith("/data.pkl")]
            state = _StepOnly(io.BytesIO(z.read(pkl))).load()
    except Exception:  # noqa: BLE001 - none, damaged, or more than plain weights: the resume says which
        return None
    step = state.get("step") if isinstance(state, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def has_checkpoint(path: str | os.PathLike, run_id: str) -> bool:
    """Whether a run has a checkpoint (reads no checkpoint bytes)."""
    loc = _Loc(path)
    if loc.local is not None:
        return (loc.local / _key(run_id)).is_file()
    fs, target = _remote_target(loc, run_id)
    return bool(fs.exists(target))


def check_checkpoint_kept(path: str | os.PathLike, run_id: str, attrs: dict, present: bool | None = None) -> None:
    """StoreError when a run that trained past step 0 (its attrs' ``checkpoint_step``) has no
    checkpoint: deleted to save space, or left out of a copy. Resumed, it would start again at
    step 0 and write over the snapshots it recorded. ``present``: whether it has one, if known.

    Empty ``attrs`` say the run has no group: then a checkpoint is what is left of a run whose
    group went (deleted, or left out of a copy), and the StoreError names it. Trained again
    from step 0, the run wrote over that checkpoint, its last state."""
    if not attrs:
        if has_checkpoint(path, run_id):
            raise StoreError(
                f"run {run_id} in {path} has a checkpoint (checkpoints/{run_id}/ckpt.pt) but no run group "
                f"(runs/{run_id} is gone, and what it recorded with it); refusing to train it again over that "
                f"checkpoint: restore runs/{run_id}, or move checkpoints/{run_id} out of the store to start afresh")
        return
    step = int(attrs.get("checkpoint_step") or 0)
    if step > 0 and not (has_checkpoint(path, run_id) if present is None else present):
        raise StoreError(
            f"run {run_id} in {path} recorded training up to step {step}, but its checkpoint "
            f"(checkpoints/{run_id}/ckpt.pt) is missing; refusing to train it again from step 0 over its "
            f"recorded snapshots (train it into another store to start it afresh)")


def checkpoints_without_runs(path: str | os.PathLike, runs: set[str]) -> list[str]:
    """Sorted ids of the runs with a checkpoint in the store but not in ``runs`` (its run groups,
    damaged ones included): runs whose group is gone (:func:`check_checkpoint_kept`)."""
    loc = _Loc(path)
    if loc.local is not None:
        folder = loc.local / "checkpoints"
        names = [p.name for p in folder.iterdir() if (p / CHECKPOINT_FILE).is_file()] if folder.is_dir() else []
    else:
        import fsspec.core

        fs, root = fsspec.core.url_to_fs(loc.url)
        base = f"{root.rstrip('/')}/checkpoints"
        entries = [e.rstrip("/") for e in fs.ls(base, detail=False)] if fs.isdir(base) else []
        names = [e.rsplit("/", 1)[-1] for e in entries if fs.isfile(f"{e}/{CHECKPOINT_FILE}")]
    out = []
    for name in sorted(set(names) - set(runs)):
        try:
            out.append(_check_name("run id", name))
        except StoreError:  # no run's folder (a stray name): no run id to name
            continue
    return out


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `target` so that readers see the old file or the new one, never a mix.

    A temporary file in the same directory is written, fsynced and ``os.replace``d over
    the target; the directory is then fsynced (best effort) so the rename survives a crash.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_file(target.parent, f".{target.name}.", ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class RunLocked(StoreError):
    """Another process holds the run's :func:`run_lock`: it is training the run now.

    ``holder``: who, as its lock file names it ("pid 123 on host, since 2026-01-01 10:00:00").
    """

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


@contextlib.contextmanager
def run_lock(path: str | os.PathLike, run_id: str):
    """Hold the right to train run ``run_id`` of the store at ``path``, or refuse (within 2 s).

    Two processes training one run would both append to it and race on its loss chunks, so
    ``dynamics run`` and sweep tasks take this lock before they look at the run. It is an
    ``flock`` on ``STORE/checkpoints/<run_id>/train.lock``: the operating system drops it when
    its holder dies however it dies, so a killed run never leaves a stale lock behind. The file
    names its holder (pid, host, start time) for the error message. Stores behind an fsspec URL
    have no flock, and are not locked.

    Raises
    ------
    RunLocked
        Another process holds the lock; the message names it.
    """
    loc = _Loc(path)
    if loc.local is None or fcntl is None:
        yield
        return
    target = loc.local / _key(run_id, RUN_LOCK_FILE)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StoreError(f"run {run_id} in {loc}: cannot write its training lock {target}: {e.strerror}") from None
    try:
        locked = _flock_exclusive(fd)
        if locked is False:
            try:
                held = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                held = {}
            holder = f"pid {held.get('pid', '?')} on {held.get('host', '?')}, since {held.get('started', '?')}"
            raise RunLocked(f"run {run_id} in {loc} is being trained by another process ({holder}); "
                            f"wait for it to finish or stop it", holder) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        # Only the holder of this lock writes the run's checkpoint, so a temporary checkpoint
        # here now is a killed holder's (SIGKILL mid-write): a checkpoint's size, left for ever.
        # Without flock (None) another trainer may be writing it.
        for stale in target.parent.glob(f".{CHECKPOINT_FILE}.*.tmp") if locked else ():
            with contextlib.suppress(OSError):
                stale.unlink()
        group = loc.local / "runs" / _check_name("run id", run_id)
        if locked and group.is_dir():
            # Likewise zarr's temporaries of the run's metadata (its attrs, rewritten at every
            # checkpoint, and its arrays'): their other writers hold the store lock taken here.
            with _locked(loc):
                clear_partials(group, *(d for d in group.iterdir() if d.is_dir()))
            # And its chunks' (under <array>/c/), written by the holder of this lock alone: a kill
            # mid-snapshot left up to a chunk of attention each, never read and never removed
            clear_partials(*(Path(d) for a in group.iterdir() if (a / "c").is_dir() for d, _, _ in os.walk(a / "c")))
        yield
    finally:
        os.close(fd)  # releases the flock


def _flock_exclusive(fd: int, patience: float = 2.0) -> bool | None:
    """Take the exclusive flock within ``patience`` seconds; False if someone holds it.

    :func:`run_lock_held` probes with a brief shared lock, so a free run can look taken for a
    moment; a trainer waits that out instead of refusing. A filesystem without flock (some
    network mounts: ENOLCK) gives no lock (None), and training goes on unlocked.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                return None
            raise


def run_lock_held(path: str | os.PathLike, run_id: str) -> bool | None:
    """Whether some process holds run ``run_id``'s :func:`run_lock` now (None: cannot tell, for a
    URL store). A run whose status says "running" while nobody holds its lock was killed."""
    loc = _Loc(path)
    if loc.local is None or fcntl is None:
        return None
    target = loc.local / _key(run_id, RUN_LOCK_FILE)
    try:
        fd = os.open(target, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock on this filesystem: cannot tell
        return None
    finally:
        os.close(fd)
    return False


def run_status(path: str | os.PathLike, run_id: str, attrs: dict) -> str:
    """The run's ``status`` attr, except "stopped" for a "running" run whose lock nobody holds:
    a killed run had no chance to rewrite its status (``dynamics status`` and the report)."""
    return run_now(path, run_id, attrs)[0]


def run_now(path: str | os.PathLike, run_id: str, attrs: dict) -> tuple[str, dict]:
    """(:func:`run_status`, the run's attributes): `attrs`, or those the run ended with where it
    ended since `attrs` were read. Its status alone, as it ended, beside the rest as read gave a
    "completed" run with no last loss and the steps done of the session's start."""
    status = str(attrs.get("status", "unknown"))
    if status == "running" and run_lock_held(path, run_id) is False:
        # The run may have ended since `attrs` were read: a trainer writes its last status and
        # only then lets go of the lock, so the status read now is the one it ended with.
        try:
            now = (_group_meta(_Loc(path), f"runs/{_check_name('run id', run_id)}") or {}).get("attributes", {})
        except StoreError:  # gone or damaged since: as read, with nobody training it
            now = {}
        status = str(now.get("status", "running"))
        return ("stopped", attrs) if status == "running" else (status, now)
    return status, attrs
