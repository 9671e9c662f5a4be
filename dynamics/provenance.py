"""Which dynamics code trains a run: a hash of the package's source, recorded with each run and
compared by a sweep's workers before they train a point.

``version`` says only the release: two checkouts of one release that differ (a fix pulled on
the launcher's machine and not on a worker's) record the same ``0.1.0``, and their runs can
differ in anything. The hash covers every ``.py`` file of the installed package, so runs of one
code hash were trained by the same source.

Standard library only, and no state between calls: a sweep's launcher sends
:func:`same_code_or_refuse` to its workers by value (cloudpickle), so that a worker with other
code, an older dynamics included, runs this module's copy, not its own, and refuses in one line.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pickle
import sys


def code_hash(package: str = "dynamics") -> str | None:
    """SHA-256 hex digest of the package's ``.py`` files, by their relative paths and bytes, or
    None where no such package is installed.

    Read from disk on each call (about a megabyte, a few ms); :func:`process_code_hash` keeps
    the first for the process.

    Example
    -------
    >>> len(code_hash())
    64
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        files += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    h = hashlib.sha256()
    for name in sorted(os.path.relpath(f, root).replace(os.sep, "/") for f in files):
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()
        # the name and the length before the bytes: no two file sets hash alike by a boundary moved
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def process_code_hash() -> str | None:
    """:func:`code_hash` as at this process's first call, kept for the process's life.

    What a long-running process trains with is the code it imported, not files edited on disk
    since: a researcher who edits an editable install while a sweep runs must not see its later
    points refused, nor a notebook's runs take the hash of code it never loaded. Kept on the
    ``sys`` module, not in a global here: this module travels to the workers by value, and its
    globals with it."""
    kept = getattr(sys, "_dynamics_code_hash", None)
    if kept is None:
        kept = sys._dynamics_code_hash = (code_hash(),)
    return kept[0]


def other_code(here: str | None, expected: str) -> str:
    """The one line for a worker whose code hash is not the launcher's."""
    if here is None:
        return "this worker has no dynamics installed; not trained here"
    return (f"this worker runs other dynamics code than the launcher (code hash {here[:16]}... against "
            f"{expected[:16]}...: another checkout or an older install?); not trained here, so that the "
            f"sweep's runs are all trained by the same code: install the launcher's on every worker")


def same_code_or_refuse(expected: str, run_id: str, function: str, args: bytes):
    """Call ``function`` (``module:name``, a sweep point's task) with the pickled tuple ``args``
    where this process's dynamics code hash is ``expected``; otherwise return run ``run_id``'s
    failed result, having unpickled and imported nothing of dynamics: an older one may lack a
    class the arguments name, or take fewer of them."""
    if (here := process_code_hash()) != expected:
        return {"run_id": run_id, "status": "failed", "steps_done": 0, "skipped": False,
                "error": other_code(here, expected), "traceback": None, "waited": None}
    module, name = function.split(":")
    return getattr(importlib.import_module(module), name)(*pickle.loads(args))


class _Call:
    """Unpickling this calls ``function(*args)``: pickle's own way to rebuild an object is to
    call what its ``__reduce__`` names, so the loaded "object" is the call's result."""

    def __init__(self, function, *args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def checked_task(expected: str, run_id: str, function: str, *args) -> bytes:
    """A payload for ``pickle.loads`` on a worker: it runs :func:`same_code_or_refuse` there.

    Dask pickles a task's function by reference (module and name) when it can, so a worker
    would run its own copy of the check, and an older dynamics has none. This module travels
    by value instead (cloudpickle), and the task's function is ``pickle.loads``, which every
    Python has."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(importlib.import_module(__name__))
    try:
        return cloudpickle.dumps(_Call(same_code_or_refuse, expected, run_id, function, pickle.dumps(args)))
    finally:
        cloudpickle.unregister_pickle_by_value(importlib.import_module(__name__))
