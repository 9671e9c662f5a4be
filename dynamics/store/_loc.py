"""Where a store lives, the lock on its shared metadata, and helpers every store module uses."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np
from zarr.buffer import default_buffer_prototype
from zarr.storage import FsspecStore, LocalStore

from dynamics.paths import absolute
from dynamics.signals import deferred_signals
from dynamics.store._zarr_private import sync as _sync

if TYPE_CHECKING:  # imported where a group is opened: a training process only writes (0.9 s with pandas)
    import xarray as xr

try:  # POSIX only; without it, index updates are guarded within this process only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


SECTIONS = ("runs", "analysis", "derived")
_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # \Z: "$" also matches before a final newline


class StoreError(Exception):
    """A store problem; the message is one line naming the path and what is wrong."""


# Named where users import it (dynamics.store, and dynamics, re-export it): a traceback said
# "dynamics.store._loc.StoreError", a private module. Pickle finds it there as well.
StoreError.__module__ = "dynamics.store"


# --------------------------------------------------------------------------- locations


class _Loc:
    """Where a store lives: ``url`` for zarr/xarray, ``local`` directory when on local disk."""

    def __init__(self, path: str | os.PathLike) -> None:
        if not isinstance(path, (str, os.PathLike)):  # os.fspath's TypeError named no store
            raise TypeError(f"a store path must be a str or path-like (e.g. 'runs/quickstart.zarr'); "
                            f"got {type(path).__name__} {path!r}")
        text = os.fspath(path)
        if text.startswith("file://"):
            text = unquote(text[len("file://") :])
        if "://" in text:
            self.url, self.local = text.rstrip("/"), None
        else:
            self.local = absolute(text)  # `lnk/..` as the kernel reads it, not as text (xarray abspaths it)
            self.url = str(self.local)
        self._store: Any = None

    def __str__(self) -> str:
        return self.url

    @property
    def store(self) -> Any:
        if self._store is None:
            start_io()  # every zarr read and write of this package goes through here first
            self._store = _SettledStore(self.local) if self.local is not None else FsspecStore.from_url(self.url)
        return self._store

    def get(self, key: str) -> bytes | None:
        if self.local is not None:  # plain file read: also safe when the path is a file
            try:
                return (self.local / key).read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
        buf = _sync(self.store.get(key, prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def get_json(self, key: str) -> dict | None:
        return _json_dict(self.get(key))

    def set(self, key: str, data: bytes) -> None:
        _sync(self.store.set(key, default_buffer_prototype().buffer.from_bytes(data)))

    def list_dir(self, prefix: str) -> list[str]:
        if self.local is not None:
            d = self.local / prefix
            return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

        async def collect() -> list[str]:
            return [k async for k in self.store.list_dir(prefix)]

        try:
            return sorted(_sync(collect()))
        except FileNotFoundError:
            return []


class _SettledStore(LocalStore):
    """A LocalStore whose listings leave out what a live writer has not finished.

    zarr lists a group's folder and then reads each entry's zarr.json, and warns "Object at ... is
    not recognized as a component of a Zarr hierarchy" for each that is not one: its own
    ``zarr.<uuid>.partial``, there while a run's attributes are rewritten (every checkpoint), and
    an array's folder made before its zarr.json lands (a run's arrays being created). A reader
    during training printed those warnings, and raised them under ``-W error``. Without the
    filter zarr skipped both too; a folder with chunks and no zarr.json is named damaged before
    zarr lists it (`_unreadable_member`).
    """

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        async for key in super().list_dir(prefix):
            if is_partial(key):
                continue
            folder = self.root / prefix / key
            if folder.is_dir() and not (folder / "zarr.json").exists() and not (folder / "c").exists():
                continue
            yield key


_IO_STARTED = False


def start_io() -> None:
    """Start zarr's I/O event loop and its thread now, SIGINT and SIGTERM held back meanwhile.

    Zarr makes them at its first read or write. A Ctrl-C (or SIGTERM) landing inside asyncio's
    loop constructor left a half-made loop, whose ``__del__`` printed "Exception ignored ...
    AttributeError: ... '_debug'" and its traceback under the command's "interrupted" line
    (`dynamics analyse` stopped as its first run opened, once in CI)."""
    global _IO_STARTED
    if _IO_STARTED:
        return

    async def nothing() -> None:
        return None

    with deferred_signals():
        _sync(nothing())
    _IO_STARTED = True


def _forget_io() -> None:
    global _IO_STARTED
    _IO_STARTED = False  # zarr makes a forked child its own loop (reset_resources_after_fork)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_io)


def _there_but_not_a_folder(d: Path) -> bool:
    """Whether `d` is a file, or a link to nothing or to a file, read in one look.

    Two looks (is_dir, then exists) called a section damaged when another process made it in
    between: a sweep's first run creates `runs` while a reader polls the store."""
    try:
        return not stat.S_ISDIR(os.stat(d).st_mode)
    except OSError as e:  # as Path.is_dir: none there, a file on the way, or a link loop
        if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise
    try:  # a link to nothing, or to itself, fails stat: it is there, and is no folder
        return stat.S_ISLNK(os.lstat(d).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def check_sections(loc: _Loc, sections: tuple[str, ...] = SECTIONS) -> None:
    """StoreError if one of `sections` of a local store is there but is not a folder.

    Listed as a folder that is gone is, its groups read as none: the store looked empty, and a
    run's creation failed on it with a bare FileExistsError."""
    for section in sections if loc.local is not None else ():
        d = loc.local / section
        if _there_but_not_a_folder(d):
            fix = ("restore it from a backup" if section in ("runs", "checkpoints") else
                   "move it aside: results are written there before they are swapped in" if section == ".staging"
                   else "move it aside: what it holds is computed from the runs, and can be computed again")
            raise StoreError(f"{loc}: {section} is not a folder (the store is damaged); {fix}")


def is_remote(path: str | os.PathLike) -> bool:
    """Whether a store path is an fsspec URL other than ``file://`` (no cross-process lock there)."""
    return _Loc(path).local is None


def local_path(path: str | os.PathLike) -> str | None:
    """The folder on this machine that a store path names, absolute (a ``file://`` URL's
    %-escapes undone, as every store function reads it); None for a remote store."""
    local = _Loc(path).local
    return None if local is None else str(local)


_THREAD_LOCK = threading.RLock()
_HELD = threading.local()


@contextlib.contextmanager
def _locked(loc: _Loc) -> Iterator[None]:
    """Exclusive lock on the store's shared metadata (root zarr.json, run attrs).

    A thread lock for this process plus, for local stores, ``flock`` on the store directory
    (flock is per open file, so re-entry within a thread must not take it twice).
    """
    with _THREAD_LOCK:
        depth = getattr(_HELD, "depth", 0)
        fd = None
        if depth == 0 and loc.local is not None and fcntl is not None and loc.local.is_dir():
            fd = os.open(loc.local, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _HELD.depth = depth + 1
        try:
            yield
        finally:
            _HELD.depth = depth
            if fd is not None:
                os.close(fd)  # releases the flock


_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")
"""zarr's LocalStore writes ``<name>.<uuid hex>.partial`` and renames it into place: a process
killed in between leaves it behind."""


def is_partial(name: str) -> bool:
    """Whether a file name is one of zarr's half-written temporaries."""
    return bool(_PARTIAL.search(name))


def clear_partials(*folders: Path, min_age: float = 0.0) -> None:
    """Delete zarr's half-written temporaries directly in ``folders``: what a killed writer left.

    Left there, zarr warned about them on every read of the hierarchy ("not recognized as a
    component"), for ever, and one in a new store's folder made it "not a dynamics store". A
    live writer's temporary must not be taken: callers either hold the locks every writer of
    those folders holds, or pass ``min_age`` (seconds since the file was last written), longer
    than any write takes. The root's and the sections' metadata need the latter: zarr rewrites
    them, outside any lock of ours, whenever a run's arrays are created (``ensure_parents``).
    """
    now = time.time()
    for folder in folders:
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                if is_partial(entry.name) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        if now - entry.stat(follow_symlinks=False).st_mtime >= min_age:
                            os.unlink(entry.path)


# --------------------------------------------------------------------------- small helpers


def check_run_id(run_id: str, new: bool = True) -> str:
    """``run_id`` if it can name a run group, else StoreError saying why. A ``new`` one (not in
    the store yet) is also at most `MAX_RUN_ID` bytes, so that names built from it fit."""
    _check_name("run id", run_id)
    if new and len(run_id.encode()) > MAX_RUN_ID:
        raise StoreError(f"invalid run id {run_id[:20]}...: {len(run_id.encode())} bytes long, at most {MAX_RUN_ID} "
                         f"for a new run (derived/gates.<run id> is named after it)")
    return run_id


MAX_RUN_ID = 128
"""Longest new run id. A run id names folders (``runs/<id>``, ``checkpoints/<id>``) and is part of
others (``derived/gates.<id>``), which the filesystem stops at `MAX_NAME` bytes."""
MAX_NAME = 255
"""Longest name of any folder the store holds (NAME_MAX): checked on reads too, so that a run
made by an earlier version with any id this long stays readable."""


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise StoreError(f"invalid {kind} {name!r}: use ASCII letters, digits, '.', '_' or '-', not starting with a symbol")
    if name == "zarr.json":  # the group's own metadata key in zarr v3
        raise StoreError(f"invalid {kind} {name!r}: reserved by zarr")
    if len(name.encode()) > MAX_NAME:  # no folder can be named so: the lock failed once the store was made
        raise StoreError(f"invalid {kind} {name[:20]}...: {len(name.encode())} bytes long, at most {MAX_NAME}")
    return name


def _jsonable(value: Any, key: str) -> Any:
    """Plain-JSON copy of an attribute value (numpy scalars and arrays, tuples become lists)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.generic):
        return _jsonable(value.item(), key)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist(), key)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, key) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise StoreError(f"attribute {key!r}: dict keys must be strings")
        return {k: _jsonable(v, f"{key}.{k}") for k, v in value.items()}
    raise StoreError(f"attribute {key!r}: {type(value).__name__} is not JSON-serialisable")


def _json_dict(raw: bytes | None) -> dict | None:
    """`raw` parsed as a JSON object; None where it is absent or is not one.

    A caller that must tell absent from unreadable reads the key once and parses those bytes:
    two reads may find two different files, a writer having swapped or removed it in between.
    """
    if raw is None:
        return None
    try:
        out = json.loads(raw)
    except ValueError:
        return None
    return out if isinstance(out, dict) else None


def _group_json(raw: bytes | None) -> dict | None:
    """`raw` parsed as a group's ``zarr.json``; None where it is absent, not JSON or not a group."""
    meta = _json_dict(raw)
    return meta if meta is not None and meta.get("node_type") == "group" else None


def _group_exists(loc: _Loc, gpath: str) -> bool:
    return _group_meta(loc, gpath) is not None


def _group_meta(loc: _Loc, gpath: str) -> dict | None:
    """The metadata of group `gpath`, or None where there is none.

    A run group whose ``zarr.json`` is unreadable (cut short, not a group), or gone from
    beside its arrays, is recorded data, not an absence: taken as missing, every reader would hide the run and
    ``dynamics run`` would create the group again over its arrays. So it raises StoreError,
    and every reader and writer that looks the run up refuses; a listing of the runs raises it
    too, or, asked to (``damaged=``), leaves the run out or lists it for its reads to name it. (``analysis/`` and ``derived/``
    groups are recomputed whole, so an unreadable one is simply replaced.)
    """
    key = f"{gpath}/zarr.json"
    try:
        raw = loc.get(key)
    except PermissionError as e:
        if not gpath.startswith("runs/"):
            raise
        # named as a damaged run is, so that listings go on with the others: as an OSError it
        # stopped `status`, `report`, `predict` and `analyse` of every run
        raise StoreError(f"{loc}: run group {gpath}'s metadata {key} cannot be read: "
                         f"{e.strerror or 'permission denied'}; check its permissions") from None
    meta = _group_json(raw)
    if meta is not None or not gpath.startswith("runs/"):
        return meta
    if raw is not None:
        problem = "cannot be read (damaged)"
    elif any(loc.get(f"{gpath}/{name}/zarr.json") is not None for name in loc.list_dir(gpath)):
        problem = "is missing"  # RunWriter writes it before any array: these arrays lost it afterwards
    else:
        return None
    # A writer may have created the group since the read above (zarr writes zarr.json whole, by a
    # rename, and before any array): a reader polling a run being made must not call it damaged.
    meta = _group_json(loc.get(key))
    if meta is not None:
        return meta
    raise StoreError(
        f"{loc}: run group {gpath} exists but its metadata {key} {problem}; restore that file from a backup, "
        f"or move {gpath} and checkpoints/{gpath[5:]} out of the store to go on without that run"
    )


DAMAGED = ("raise", "skip", "include")
"""What a listing of runs does with a damaged run group (see :func:`_group_meta`): raise the
StoreError naming it, leave it out, or list it (every read of that run then raises it)."""


def _children(loc: _Loc, section: str, damaged: str = "raise") -> list[str]:
    if damaged not in DAMAGED:
        raise StoreError(f"damaged: expected one of {', '.join(DAMAGED)}, got {damaged!r}")
    out = []
    for n in loc.list_dir(section):
        if not _NAME.match(n):
            continue
        try:
            if _group_exists(loc, f"{section}/{n}"):
                out.append(n)
        except StoreError:
            if damaged == "raise":
                raise
            if damaged == "include":
                out.append(n)
    return out


def _default_run(loc: _Loc, run_id: str | None) -> str:
    if run_id is None:
        runs = _children(loc, "runs")  # a damaged run may be the one meant: named, not passed over
        if len(runs) == 1:
            return runs[0]
        if not runs:
            raise StoreError(f"no runs in {loc}")
        raise StoreError(f"{loc} holds {len(runs)} runs; pass run_id, one of: {', '.join(runs)}")
    if not isinstance(run_id, str):  # "no run ['r1'] in S; runs: r1" named the run it then listed
        raise TypeError(f"run_id: expected a run id (a str), got {type(run_id).__name__} {run_id!r}")
    # Only this run's own group is looked at: another run's damage is no reason to refuse this one.
    named = isinstance(run_id, str) and bool(_NAME.match(run_id)) and run_id != "zarr.json"
    if not (named and _group_exists(loc, f"runs/{run_id}")):
        runs = _children(loc, "runs", damaged="include")
        raise StoreError(f"no run {run_id!r} in {loc}; runs: {', '.join(runs) or '(none)'}")
    return run_id


def _unreadable_member(loc: _Loc, gpath: str) -> StoreError | None:
    """StoreError naming an array of group `gpath` whose ``zarr.json`` cannot be read, or is gone
    while the array's chunks are there; None if there is none.

    Zarr fails on an unreadable file with a bare JSON error that names neither the run nor the
    file, and lists an array whose file is gone as no array at all: that array was then missing
    without a word (`dynamics analyse` exited 0 without the analyses that need it, and a run
    whose attention had lost it was "missing attention", not damaged).
    """
    for name in loc.list_dir(gpath):
        key = f"{gpath}/{name}/zarr.json"
        raw = loc.get(key)  # once: an analysis rewritten meanwhile may lack this member
        if raw is not None and _json_dict(raw) is None:
            return StoreError(f"{loc}: the metadata {key} of {gpath} cannot be read (damaged); restore that file "
                              f"from a backup")
        if raw is None and name != "zarr.json" and "c" in loc.list_dir(f"{gpath}/{name}"):
            return StoreError(f"{loc}: the metadata {key} of {gpath} is missing, though the array's chunks are "
                              f"there (damaged): zarr would not see the array {name}; restore that file from a backup")
    return None


_OPEN_TRIES = 5
"""Opens of a local group that a writer keeps swapping, before the reader gives up."""


def _open_group_ds(loc: _Loc, gpath: str, dask: bool = True,
                   verify: Callable[[xr.Dataset], xr.Dataset] | None = None) -> xr.Dataset:
    """Open group `gpath` lazily; on a local store, from one version of it.

    ``analyse`` swaps a whole new analysis (or derived) group in while readers take no lock,
    and zarr reads the group's metadata, then its members' one by one: a swap in between
    opened a mix of both, whose old members read the new chunks or, gone, NaN. So the group's
    directory is the same one before and after the open, or it is opened again. (Chunks are
    read later, when used: a dataset opened before a swap and read after it still mixes, unless
    `verify` reads them.)

    ``verify(ds)``, if given, runs inside the same identity check and returns what is kept: a
    check of the group against its files (`integrity._whole` counts chunk files by path; after the
    check, that was a look at another version, and a healthy group swapped in was called
    damaged), or a load of its values (``open_analysis(load=...)``).
    """
    if loc.local is None:
        ds = _open_group_once(loc, gpath, dask)
        return ds if verify is None else verify(ds)
    for _ in range(_OPEN_TRIES):
        before = _identity(loc, gpath)
        try:
            ds = _open_group_once(loc, gpath, dask)
            if verify is not None:
                ds = verify(ds)
        except Exception:
            # a mix can also fail to open ("conflicting sizes for dimension"): the error of a
            # swap, not of the group, when another directory (or none) is there now; the same
            # one, or none before and after (no such group), is the group's own error
            if _identity(loc, gpath) == before:
                raise
            continue
        if before is not None and _identity(loc, gpath) == before:
            return ds
    raise StoreError(f"{loc}: {gpath} was rewritten {_OPEN_TRIES} times while being opened; open it once the "
                     f"command rewriting it has finished")


def _identity(loc: _Loc, gpath: str) -> tuple[int, int] | None:
    """Which directory is at `gpath` now: a swap puts another one there (None: none is)."""
    try:
        st = os.stat(loc.local / gpath)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _open_group_once(loc: _Loc, gpath: str, dask: bool) -> xr.Dataset:
    # consolidated=False: read the group's own metadata, never the (possibly stale) root index.
    if loc.local is not None:
        # Checked first where it is cheap: zarr reads the members concurrently, and the reads still
        # pending when one fails print "Task was destroyed but it is pending!" at exit.
        damaged = _unreadable_member(loc, gpath)
        if damaged is not None:
            raise damaged
    import xarray as xr

    source = loc.store if loc.local is not None else loc.url  # local: listed without a writer's unfinished entries
    try:
        if dask:
            return xr.open_zarr(source, group=gpath, consolidated=False)
        return xr.open_zarr(source, group=gpath, consolidated=False, chunks=None)  # lazily indexed, no dask
    except ValueError as e:  # json.JSONDecodeError among them
        damaged = _unreadable_member(loc, gpath)
        if damaged is None:
            raise
        raise damaged from e


def _unique(folder: Path, prefix: str, suffix: str, make: Any) -> Path:
    """``make(path)`` at the first free ``folder / (prefix + random hex + suffix)``."""
    import secrets

    for _ in range(1000):
        path = folder / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            make(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name {prefix}*{suffix} in {folder}")


def new_dir(folder: Path, prefix: str) -> Path:
    """A new empty folder, like tempfile.mkdtemp but with the umask's mode: mkdtemp's 0700 left
    every analysis and derived group readable by their writer alone once renamed into place, so a
    colleague with read access to the store got PermissionError from predict and report. The
    random part is hex, with no "." (stale staging folders are told by their dotted suffixes)."""
    return _unique(folder, prefix, "", lambda p: os.mkdir(p, 0o777))


def new_file(folder: Path, prefix: str, suffix: str) -> tuple[int, Path]:
    """(fd open for writing, path) of a new empty file, like tempfile.mkstemp but with the
    umask's mode (mkstemp's 0600 left checkpoints readable by their writer alone)."""
    fd: list[int] = []
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    path = _unique(folder, prefix, suffix, lambda p: fd.append(os.open(p, flags, 0o666)))
    return fd[0], path
