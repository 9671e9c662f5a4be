"""Which dynamics code trains a run: a hash of the package's source, recorded with each run and
compared by a sweep's workers before they train a point.

``version`` says only the release: two checkouts of one release that differ (a fix pulled on
the launcher's machine and not on a worker's) record the same ``0.1.0``, and their runs can
differ in anything. The hash covers every ``.py`` file of the installed package, so runs of one
code hash were trained by the same source.

A sweep's launcher sends each point as a :func:`task` payload: the worker compares its code with
the launcher's before it unpickles a config of its own dynamics or imports the training code.

What compares runs (analyse, predict, the report) says when they were not all trained by the
same code (:func:`mixed_code`), or with the same torch build, device and CPU kernels
(:func:`mixed_execution`): the same config and seed give other numbers there.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import pickle


def code_hash(package: str = "dynamics") -> str | None:
    """SHA-256 hex digest of the package's ``.py`` files, by their relative paths and bytes, or
    None where no such package is installed.

    Only files Python could import as modules: an editor's lock file beside one being edited
    (Emacs's ``.#model.py``, a link to a file that does not exist) is not code the package runs,
    and opening it failed every run and sweep after its store was made.

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
        files += [path for n in names if n.endswith(".py") and n[:-3].isidentifier()
                  and os.path.isfile(path := os.path.join(folder, n))]
    h = hashlib.sha256()
    for name in sorted(os.path.relpath(f, root).replace(os.sep, "/") for f in files):
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()
        # the name and the length before the bytes: no two file sets hash alike by a boundary moved
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


@functools.cache
def process_code_hash() -> str | None:
    """:func:`code_hash` as at this process's first call, kept for the process's life.

    What a long-running process trains with is the code it imported, not files edited on disk
    since: a researcher who edits an editable install while a sweep runs must not see its later
    points refused, nor a notebook's runs take the hash of code it never loaded. So
    :mod:`dynamics.train` makes the first call as it is imported, with the model, task and store
    code it trains with; a module it imports only when first needed (the CHG fits', the analysers
    a distillation reads) and edited in between is read as edited, and hashed as it was."""
    return code_hash()


def missing_code(error: BaseException, expected: str) -> str | None:
    """The one line for a point whose :func:`task` payload could not be loaded on its worker
    (``error``: what unpickling it raised), or None for any other error."""
    if isinstance(error, ModuleNotFoundError) and error.name == __name__:  # a dynamics older than this check
        return other_code(None, expected)
    if isinstance(error, ModuleNotFoundError) and error.name == __name__.split(".")[0]:
        return "this worker has no dynamics installed; not trained here: install the launcher's on every worker"
    return None


def other_code(here: str | None, expected: str) -> str:
    """The one line for a worker whose code hash is not the launcher's (None: a dynamics older
    than this module, which records no hash)."""
    if here is None:
        return ("this worker runs an older dynamics than the launcher (one without a code check); not trained "
                "here, so that the sweep's runs are all trained by the same code: install the launcher's on every "
                "worker")
    # A worker keeps the hash of the code it imported; one restarted (a worker killed and replaced)
    # hashes the source as it is then, so an edit or a pull since the launch is refused here too.
    # A worker of a long-lived cluster that imported the code before a pull was refused at every
    # launch, told to launch again: restarting it is what reads the code as it is now.
    return (f"this worker runs other dynamics code than the launcher (code hash {here[:16]}... against "
            f"{expected[:16]}...: another checkout or an older install, a worker that imported the code before "
            f"an edit or a pull and keeps what it imported, or one started after an edit made while the sweep "
            f"ran?); not trained here, so that the sweep's runs are all trained by the same code: give every "
            f"worker the launcher's code and restart the workers, or launch the sweep again to go on with the "
            f"code as it is now")


def same_code_or_refuse(expected: str, run_id: str, function: str, args: bytes):
    """Call ``function`` (``module:name``, a sweep point's task) with the pickled tuple ``args``
    where this process's dynamics code hash is ``expected``; otherwise return run ``run_id``'s
    failed result, having unpickled and imported nothing of dynamics: an older one may lack a
    class the arguments name, or take fewer of them."""
    if (here := process_code_hash()) != expected:
        return {"run_id": run_id, "status": "failed", "steps_done": 0, "skipped": False,
                "error": other_code(here, expected), "traceback": None, "waited": None, "refused": "code"}
    module, name = function.split(":")
    return getattr(importlib.import_module(module), name)(*pickle.loads(args))


def task(expected: str, run_id: str, function: str, *args) -> bytes:
    """A sweep point for a worker to run as ``pickle.loads(task(...))``: there it calls
    :func:`same_code_or_refuse` (the task's result is that call's).

    Dask unpickles a task's function as it receives the task, outside the task: a worker whose
    dynamics lacks it (an older one, or none) failed on the message itself, and the sweep waited,
    silent, until it was killed. ``pickle.loads`` every Python has; the lookup of this module's
    function happens inside the task, whose error the launcher reads (:func:`missing_code`).
    Pickled by reference, not by value, so a worker on another Python still loads it."""
    return pickle.dumps(_Call(same_code_or_refuse, expected, run_id, function, pickle.dumps(args)))


class _Call:
    """Unpickled, this is ``function(*args)``: pickle rebuilds an object by calling what its
    ``__reduce__`` names, so the object loaded is the call's result. Only ``function`` and
    ``args`` are in the pickle, not this class."""

    def __init__(self, function, *args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def trained_by(attrs: dict) -> tuple[str | None, ...]:
    """The code hashes that trained a run's recorded steps, in order, from its attributes: the
    first session's ``code_hash`` and each resume's (in ``resumes``). A session whose steps a
    later one redid from an earlier checkpoint (or from step 0) trained none of what is kept,
    so it is not counted. None for a session of a dynamics that recorded no hash.

    Example
    -------
    >>> trained_by({"code_hash": "a", "resumes": [{"step": 40, "code_hash": "b"}]})
    ('a', 'b')
    >>> trained_by({"code_hash": "a", "resumes": [{"step": 0, "code_hash": "b"}]})
    ('b',)
    """
    return _kept_sessions(attrs, lambda a: a.get("code_hash"))


MACHINE_KEYS = ("torch_version", "device", "cpu_capability")
"""What else, beside the code, makes the same config and seed train to other numbers: reductions
round differently in another torch build, on another device, or in CPU kernels of another vector
width (README: the quickstart sweep's 96 final roles, trained with AVX2 kernels and again with
AVX512 ones, differed in 3). ``train.threads`` changes the rounding too, but is left out: a
resume rewrites the run's config, so its first session's count is not kept (it defaults to 1).
A GPU's model is not recorded either: two GPUs of other models read the same here."""


def trained_on(attrs: dict) -> tuple[tuple[str | None, ...], ...]:
    """The (torch_version, device, cpu_capability) of each session whose steps a run kept, in
    order, as :func:`trained_by` counts sessions; None for what a session did not record.

    A device is its kind (``cuda:1`` is ``cuda``: one GPU's index says nothing of its
    arithmetic), and a GPU session's CPU kernels are "-": they do not do its arithmetic.

    Example
    -------
    >>> trained_on({"torch_version": "2.13.0+cpu", "device": "cpu", "cpu_capability": "AVX2",
    ...             "resumes": [{"step": 40, "torch_version": "2.13.0", "device": "cuda:0", "cpu_capability": "AVX2"}]})
    (('2.13.0+cpu', 'cpu', 'AVX2'), ('2.13.0', 'cuda', '-'))
    """
    def machine(a: dict) -> tuple[str | None, ...]:
        device = a.get("device")
        kind = device.split(":")[0] if isinstance(device, str) else None
        return a.get("torch_version"), kind, a.get("cpu_capability") if kind in ("cpu", None) else "-"

    return _kept_sessions(attrs, machine)


def _kept_sessions(attrs: dict, value) -> tuple:
    """``value`` of the first session's attrs and of each resume entry whose steps are kept, runs
    of one value told once: a session that a later one resumed at or before its start kept none."""
    sessions = [(0, value(attrs))]
    sessions += [(r.get("step", 0), value(r)) for r in attrs.get("resumes", []) if isinstance(r, dict)]
    kept = [v for i, (start, v) in enumerate(sessions)
            if all(later > start for later, _ in sessions[i + 1:])]
    return tuple(v for i, v in enumerate(kept) if i == 0 or v != kept[i - 1])


def mixed_code(codes: dict[str, tuple[str | None, ...]]) -> str | None:
    """One line saying that the runs of ``codes`` (run id -> :func:`trained_by` of its attributes)
    were not all trained by the same dynamics code, naming each code's runs; None when they were
    (or there are none).

    Analysers and the predictor compare runs: a difference between two runs trained by different
    code may be the code's, not the experiment's, and ``version`` (one release) does not show it.

    Example
    -------
    >>> print(mixed_code({"r1": ("a" * 64,), "r2": ("b" * 64,)}))
    these 2 runs were not all trained by the same dynamics code (code hash aaaaaaaaaaaa: r1; bbbbbbbbbbbb: r2): a difference between them may be the code's, not the experiment's (each run's code_hash and resumes attributes say which)
    """
    groups = _grouped(codes, lambda c: "not recorded" if c is None else c[:12])
    if groups is None:
        return None
    return (f"these {len(codes)} runs were not all trained by the same dynamics code (code hash {groups}): "
            f"a difference between them may be the code's, not the experiment's (each run's code_hash and resumes "
            f"attributes say which)")


def mixed_execution(executions: dict[str, tuple[tuple[str | None, ...], ...]]) -> str | None:
    """One line saying that the runs of ``executions`` (run id -> :func:`trained_on` of its
    attributes) were not all trained with the same torch build, device and CPU kernels, naming
    each one's runs; None when they were (or there are none).

    Only what every run recorded is compared: a run that recorded none of them (an older
    dynamics) is left out, and a key one of the others lacks is left out for all of them, so
    an unknown never reads as a difference.

    Example
    -------
    >>> print(mixed_execution({"r1": (("2.13.0+cpu", "cpu", "AVX2"),), "r2": (("2.13.0+cpu", "cpu", "AVX512"),)}))
    these 2 runs were not all trained with the same torch build, device and CPU kernels (torch 2.13.0+cpu, cpu, AVX2: r1; torch 2.13.0+cpu, cpu, AVX512: r2): they may round differently, so a difference between them may be the machine's, not the experiment's (each run's torch_version, device, cpu_capability and resumes attributes say which)
    """
    known = {r: sessions for r, sessions in executions.items() if any(v is not None for s in sessions for v in s)}
    compared = [i for i in range(len(MACHINE_KEYS))
                if all(s[i] is not None for sessions in known.values() for s in sessions)]
    if not compared:
        return None
    reduced = {}
    for run_id, sessions in known.items():
        values = [tuple(s[i] for i in compared) for s in sessions]
        reduced[run_id] = tuple(v for j, v in enumerate(values) if j == 0 or v != values[j - 1])

    def name(values: tuple) -> str:
        got = dict(zip((MACHINE_KEYS[i] for i in compared), values, strict=True))
        parts = [f"torch {got['torch_version']}" if "torch_version" in got else None, got.get("device"),
                 None if got.get("cpu_capability") in (None, "-") else got["cpu_capability"]]
        return ", ".join(p for p in parts if p)

    groups = _grouped(reduced, name)
    if groups is None:
        return None
    return (f"these {len(reduced)} runs were not all trained with the same torch build, device and CPU kernels "
            f"({groups}): they may round differently, so a difference between them may be the machine's, not the "
            f"experiment's (each run's {', '.join(MACHINE_KEYS)} and resumes attributes say which)")


def trained_on_data(attrs: dict) -> tuple[str, str | None]:
    """(what should give a run the same data as another's, the ``data_hash`` it recorded) from its
    attributes: runs of one task setting (the config's task section and vocabulary, and the seed
    where a low-data pool is drawn per seed) are made the same data by the same machine."""
    config = attrs.get("config") or {}
    task = config.get("task") or {}
    key = {"task": task, "vocab_size": (config.get("model") or {}).get("vocab_size"),
           "seed": (config.get("train") or {}).get("seed") if task.get("pool_size") else None}
    return json.dumps(key, sort_keys=True, default=str), attrs.get("data_hash")


def mixed_data(data: dict[str, tuple[str, str | None]]) -> str | None:
    """One line naming the runs of ``data`` (run id -> :func:`trained_on_data`) that share a task
    setting but recorded other data hashes; None where none do.

    A run refuses to resume on other data, but a new run into a store holding others did not: on
    another Python (a patch upgrade too) the corpus task reads another standard library, and two
    such runs of two seeds were compared as seeds, cross-seed consistency 0.956, with no word.
    A synthetic task's data differ so only across versions of its generator. Runs drawing a
    low-data pool are compared only with runs of their own seed (their recorded hash mixes in the
    seed), so a pool's two Pythons across seeds go unseen.

    Example
    -------
    >>> key = trained_on_data({"config": {"task": {"name": "corpus"}}})[0]
    >>> print(mixed_data({"r1": (key, "a" * 64), "r2": (key, "b" * 64)}))
    these 2 runs have the same task settings but were trained on other data (data hash aaaaaaaaaaaa: r1; bbbbbbbbbbbb: r2): another Python's standard library, for the corpus task; a difference between them may be the data's, not the experiment's (each run's data_hash attribute says which)
    """
    settings: dict[str, dict[str, tuple]] = {}
    for run_id, (key, data_hash) in data.items():
        if data_hash is not None:  # not recorded (an older dynamics): no difference claimed
            settings.setdefault(key, {})[run_id] = (data_hash,)
    split = {key: text for key, runs in settings.items() if (text := _grouped(runs, lambda h: h[:12]))}
    if not split:
        return None
    n = sum(len(settings[key]) for key in split)
    flat = {key: _flat(json.loads(key)) for key in split}
    differ = sorted({k for f in flat.values() for k in f if len({json.dumps(g.get(k)) for g in flat.values()}) > 1})
    if len(split) == 1:
        what, groups = "have the same task settings but were trained on other data", next(iter(split.values()))
    else:  # each setting named by what tells it from the others: "; and" alone read as one setting
        what = f"(in {len(split)} task settings) were trained on other data within each setting"
        groups = " | ".join(", ".join(f"{k}={flat[key].get(k)}" for k in differ) + f": {text}"
                            for key, text in split.items())
    tasks = {str(flat[key].get("task.name")) for key in split} | {
        str(c) for key in split for c in (flat[key].get("task.components") or [])}
    generator = "another version of the data generator (dynamics.tasks.GENERATOR_VERSIONS)"
    causes = (["another Python's standard library, for the corpus task"] if "corpus" in tasks else []) + (
        [generator] if tasks - {"corpus", "mixture"} else [])
    return (f"these {n} runs {what} (data hash {groups}): "
            f"{', or '.join(causes) or generator}; a difference between them may be the data's, not the "
            f"experiment's (each run's data_hash attribute says which)")


def _flat(key: dict) -> dict:
    """A task setting's key (:func:`trained_on_data`) as ``section.key`` -> value."""
    out = {f"task.{k}": v for k, v in (key.get("task") or {}).items()}
    out["model.vocab_size"] = key.get("vocab_size")
    if key.get("seed") is not None:
        out["train.seed"] = key["seed"]
    return out


def importance_form(attrs: dict) -> tuple[str]:
    """A run's ``importance_form`` attr as a one-session tuple for :func:`mixed_importance`:
    ``per_sequence``, or ``batch`` where a run begun before it records none (a resume keeps a
    run's form, so one value holds for the whole run)."""
    return (attrs.get("importance_form") or "batch",)


def mixed_importance(forms: dict[str, tuple[str]]) -> str | None:
    """One line naming the runs of ``forms`` (run id -> :func:`importance_form`) whose recorded
    ``importance`` is of the other form; None where every run's is of one.

    The code-hash note names such runs too, as trained by other code, but not that what they
    call importance differs: |dL/dg| of the batch's mean loss, where the sequences' gradients
    cancel (mostly noise by the end of training), against the mean over sequences of |dL(x)/dg|.

    Example
    -------
    >>> print(mixed_importance({"r1": ("per_sequence",), "r2": ("batch",)}))
    these 2 runs' importance is not all of one form (per_sequence: r1; batch: r2): a run begun before the per-sequence form (no importance_form attribute) holds |dL/dg| of the batch's mean loss, so importance, winner_take_all and the importance target compare two measures
    """
    groups = _grouped(forms, str)
    if groups is None:
        return None
    return (f"these {len(forms)} runs' importance is not all of one form ({groups}): a run begun before the "
            f"per-sequence form (no importance_form attribute) holds |dL/dg| of the batch's mean loss, so "
            f"importance, winner_take_all and the importance target compare two measures")


def _grouped(sessions: dict[str, tuple], name) -> str | None:
    """The runs grouped by their sessions' values, each group named (``name`` of each session's
    value, joined by "then") with its runs, the largest group first; None for fewer than two groups."""
    groups: dict[tuple, list[str]] = {}
    for run_id in sorted(sessions):
        groups.setdefault(sessions[run_id], []).append(run_id)
    if len(groups) < 2:
        return None

    def runs(ids: list[str]) -> str:
        return ", ".join(ids) if len(ids) <= 3 else f"{ids[0]}, {ids[1]} and {len(ids) - 2} others"

    return "; ".join(f"{' then '.join(name(v) for v in values)}: {runs(ids)}"
                     for values, ids in sorted(groups.items(), key=lambda g: (-len(g[1]), g[1])))
