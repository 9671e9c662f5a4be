"""The store lock ``STORE/sweep.lock``: pid, host, start time and a heartbeat; stale locks are
taken over, live ones refuse a second launcher with :class:`SweepLockError`."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import socket
import sys
import threading
import time
import uuid

from dynamics import store

LOCK_NAME = "sweep.lock"
LOCK_STALE_AFTER = 120.0
"""Seconds without a heartbeat after which a lock is stale, whatever host holds it (on this host a
holder whose pid is gone makes it stale at once: `lock_stale_reason`)."""
LOCK_HEARTBEAT_EVERY = 10.0
"""Seconds between heartbeats of a held lock."""

log = logging.getLogger(__name__)


class SweepLockError(store.StoreError):
    """The store is being written by another sweep."""


def _is_url(path: str) -> bool:
    return store.is_remote(path)


def _where(path: str) -> str:
    """The store as the lock addresses it: a local store's folder, a ``file://`` URL decoded as the
    store reads it (taken for a remote URL, its lock was fsspec's check-then-write, which two
    launchers passed at once, and a %-escaped name was a path that does not exist); else the URL."""
    return store.local_path(path) or str(path)


def lock_path(path: str) -> str:
    """Where the sweep lock of the store at ``path`` lives."""
    return f"{_where(path).rstrip('/')}/{LOCK_NAME}"


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
    return _parse_lock(blob, target)


def _parse_lock(blob: bytes, target: str) -> dict:
    try:
        info = json.loads(blob)
    except ValueError:
        info = None
    if isinstance(info, dict) and _plain_time(info.get("heartbeat", 0.0)):
        return info
    # A torn write (on a filesystem without hard links, a launcher between creating its lock and
    # writing it, or one that died there; see _write_lock): judged by age alone below, the file's
    # modification time standing in for the heartbeat, so a lock being written now is not taken over.
    # So is a heartbeat that is no time (a lock edited by hand): float() of it was a traceback, and
    # a NaN one was never stale.
    return {"corrupt": True, "heartbeat": _mtime(target)}


def _mtime(target: str) -> float:
    """Modification time of the file `target` (seconds since the epoch); 0.0 if unknown."""
    try:
        if _is_url(target):
            fs, p = _fs(target)
            modified = fs.modified(p)
            return float(modified.timestamp())
        return os.stat(target).st_mtime
    except Exception:  # noqa: BLE001 - no time known: as old as can be, as before
        return 0.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    # A killed launcher its parent has not reaped yet (a zombie) still answers signal 0: a rerun
    # right after `timeout -s KILL` was refused as "being written by another sweep" until the
    # heartbeat went stale, 120 s later.
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (state ``Z`` in Linux's /proc; False
    where there is no /proc to read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # the state follows the command name, which is in parentheses and may itself hold ") "
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"Z"


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
    age = now - float(info.get("heartbeat", now))
    if info.get("corrupt"):
        return f"an unreadable lock, last written {age:.0f} s ago"
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
    tmp = f"{target}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
        if exclusive:
            # Linked whole: created empty (O_EXCL) and then written, the lock was read between the
            # two by a second launcher, which was told of "an unreadable lock" instead of its holder
            _place(tmp, target)
        else:
            os.replace(tmp, target)
    finally:  # a heartbeat that fails goes on (see _beat): each left a temporary behind
        with contextlib.suppress(OSError):
            os.remove(tmp)


def _place(src: str, target: str) -> None:
    """Put the whole file ``src`` at ``target`` too, or raise FileExistsError if one is there."""
    try:
        os.link(src, target)
    except FileExistsError:
        # NFS can report a link it made, on a retried request, as already there: then it is ours
        if os.stat(src).st_nlink < 2:
            raise
    except FileNotFoundError:  # src itself gone: no filesystem's answer about hard links
        raise
    except OSError:  # a filesystem without hard links: O_EXCL, torn for a moment (see _parse_lock)
        with open(src, "rb") as f:
            blob = f.read()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)


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
        with contextlib.suppress(OSError):  # FileExistsError: yet another launcher holds it now
            _place(aside, target)  # a plain os.link, on a filesystem without hard links, lost it
        with contextlib.suppress(FileNotFoundError):  # cleared as a leftover by the launcher that won
            os.remove(aside)
        return False
    with contextlib.suppress(FileNotFoundError):  # as above: its old mtime makes it a leftover to the winner
        os.remove(aside)
    return True


def _plain_time(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_lock_file(file: str) -> dict | None:
    try:
        with open(file, "rb") as f:
            blob = f.read()
    except OSError:
        return {"corrupt": True, "heartbeat": 0.0}
    return _parse_lock(blob, file)


def _clear_leftovers(path: str, older_than: float) -> None:
    """Delete the lock's temporaries and moved-aside copies that killed launchers left beside it.

    Each lives for the moment of one write or takeover, so one older than a stale lock is no
    live launcher's (any host's: the age, not the pid, says so)."""
    if _is_url(path):
        return
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(_where(path)):
            if _LEFTOVER.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > older_than:
                        os.remove(entry.path)


_LEFTOVER = re.compile(re.escape(LOCK_NAME) + r"\.(\d+\.[0-9a-f]{8}\.tmp|stale-[0-9a-f]{8})")


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
        except FileExistsError:
            pass
        else:
            _clear_leftovers(path, stale_after)
            return SweepLock(path, info, heartbeat_every)
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
