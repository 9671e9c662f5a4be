"""``corpus``: byte windows of the standard-library ``.py`` files, its held-out split of files, and
:func:`corpus_info`."""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass

import numpy as np

from dynamics.config import ConfigError

# ----------------------------------------------------------------------------- corpus

_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def _install_generated(rel: str) -> bool:
    """Whether a stdlib-relative path is written by the install, not shipped as source.

    ``_sysconfigdata_*.py`` and ``config-<version>-<platform>/`` (``python-config.py``) hold the
    install prefix and the build's temporary directory: two builds of one CPython version
    differ there, and data that moved with the install path would break "same config, same
    arrays" across machines (and refuse resumes there as another standard library).
    """
    top, _, rest = rel.partition("/")
    return (not rest and top.startswith("_sysconfigdata")) or (bool(rest) and top.startswith("config-"))


def _stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


@dataclass(frozen=True)
class _Corpus:
    """All stdlib .py files, sorted by relative posix path, held as one byte buffer."""

    names: tuple[str, ...]
    data: np.ndarray  # uint8, the files end to end
    starts: np.ndarray  # (n_files,) int64 offset of each file in data
    lengths: np.ndarray  # (n_files,) int64

    def file(self, i: int) -> bytes:
        return self.data[self.starts[i] : self.starts[i] + self.lengths[i]].tobytes()


@functools.lru_cache(maxsize=1)
def _corpus_files() -> _Corpus:
    """Read the corpus once per process (about 30 MB for CPython 3.11)."""
    root = _stdlib_root()
    found = []

    def unlisted(e: OSError) -> None:  # os.walk skipped a directory it could not list, in silence
        raise ConfigError(f"task.name: the corpus task cannot list the standard-library directory {e.filename}: "
                          f"{e.strerror or e}")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unlisted):  # does not follow directory symlinks
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
        for name in filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if name.endswith(".py") and not _install_generated(rel) and os.path.isfile(full):
                found.append((rel, full))
    # ConfigError, not a traceback: a stripped install, or a file it cannot read, is bad input
    # for the corpus task, found by tasks.check before any store is made.
    if not found:
        raise ConfigError(f"task.name: the corpus task reads this Python's standard library, but no .py file "
                          f"was found under {root}")
    found.sort()
    chunks = []
    for _, full in found:
        try:
            with open(full, "rb") as f:
                chunks.append(f.read())
        except OSError as e:
            raise ConfigError(f"task.name: the corpus task cannot read the standard-library file {full}: "
                              f"{e.strerror or e}") from None
    lengths = np.array([len(c) for c in chunks], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    data = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    return _Corpus(tuple(rel for rel, _ in found), data, starts, lengths)


@functools.lru_cache(maxsize=1)
def _corpus_hash() -> str:
    """sha256 over (len(name), name, len(bytes), bytes) for each file in order."""
    c = _corpus_files()
    h = hashlib.sha256()
    for i, rel in enumerate(c.names):
        name = rel.encode()
        h.update(len(name).to_bytes(8, "little") + name + int(c.lengths[i]).to_bytes(8, "little"))
        h.update(c.data[c.starts[i] : c.starts[i] + c.lengths[i]])
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _held_out(names: tuple[str, ...], holdout: float) -> np.ndarray:
    """Bool per file: held out when the first 8 bytes of sha256(path), as a fraction, < holdout.

    Hashing the path (not the position in the list) keeps a file on the same side when
    other files are added or removed, and a larger holdout only adds files.
    """
    u = [int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], "big") / 2.0**64 for n in names]
    return np.asarray(u) < holdout


def _corpus(rng, n, L, holdout, split):
    # Windows lie inside one file; the start is uniform over all valid starts, so files are
    # weighted by how many windows they hold.
    c = _corpus_files()
    side = _held_out(c.names, float(holdout)) == (split != "train")
    valid = np.where(side, np.maximum(c.lengths - L + 1, 0), 0)
    cum = np.cumsum(valid)
    if cum.size == 0 or cum[-1] == 0:
        raise ValueError(f"corpus: no {split} file has {L} bytes (holdout {holdout})")
    u = rng.integers(cum[-1], size=n)
    f = np.searchsorted(cum, u, side="right")
    begin = c.starts[f] + u - (cum[f] - valid[f])
    return c.data[begin[:, None] + np.arange(L)[None, :]].astype(np.int64)


def check_corpus(holdout: float, L: int) -> str | None:
    """What keeps the corpus from giving windows of L bytes on both sides of the split, or None.

    The split and the file lengths depend on this interpreter's standard library, so config
    validation cannot see them; without this a run was created in the store and then failed.
    """
    try:
        c = _corpus_files()
    except ConfigError as e:  # no standard library to read
        return str(e)
    held = _held_out(c.names, float(holdout))
    for side, name in ((~held, "training"), (held, "held-out (eval and probe)")):
        if not side.any():
            return f"task.holdout: {holdout} leaves no {name} file of this Python's standard library"
        if c.lengths[side].max() < L:
            return (f"model.context: {L - 1} is too long for the corpus: no {name} file has the {L} bytes "
                    f"a window needs (task.holdout {holdout})")
    return None


def corpus_info(holdout: float) -> dict:
    """Describe the standard-library corpus and its train / held-out split.

    Parameters
    ----------
    holdout : float
        Fraction in (0, 1) of files held out (chosen by hashing each relative path).

    Returns
    -------
    dict
        ``hash`` (content SHA-256 hex), ``n_files``, ``n_train_files``, ``n_eval_files``,
        ``n_bytes`` (all files), ``root`` (the stdlib directory).

    Example
    -------
    >>> corpus_info(0.1)["n_files"] > 100  # doctest: +SKIP
    True
    """
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"holdout must be in (0, 1), got {holdout}")
    c = _corpus_files()
    held = _held_out(c.names, float(holdout))
    return {
        "hash": _corpus_hash(),
        "n_files": len(c.names),
        "n_train_files": int((~held).sum()),
        "n_eval_files": int(held.sum()),
        "n_bytes": int(c.data.size),
        "root": _stdlib_root(),
    }
