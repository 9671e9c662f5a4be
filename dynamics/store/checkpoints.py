"""Checkpoint files: plain files under ``STORE/checkpoints/``, written atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from dynamics.store._loc import StoreError, _check_name, _Loc

# --------------------------------------------------------------------------- checkpoints


def checkpoint_path(path: str | os.PathLike, run_id: str) -> Path:
    """Local file for a run's checkpoint, ``STORE/checkpoints/<run_id>/ckpt.pt`` (parent created).

    Checkpoints are plain files, so they need a local store (a path or ``file://`` URL).

    Raises
    ------
    StoreError
        For a remote (fsspec) store.
    """
    loc = _Loc(path)
    if loc.local is None:
        raise StoreError(f"checkpoints need a local store, not {loc}")
    target = loc.local / "checkpoints" / _check_name("run id", run_id) / "ckpt.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `target` so that readers see the old file or the new one, never a mix.

    A temporary file in the same directory is written, fsynced and ``os.replace``d over
    the target; the directory is then fsynced (best effort) so the rename survives a crash.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
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
