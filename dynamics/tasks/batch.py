"""The batch: :class:`Batch`, :func:`make_batch` (pure in config, seed, step and split), the
low-data training pool, and the dispatch of mixture rows to the task generators."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from dynamics.config import TASKS, ConfigError, RunConfig, TaskConfig
from dynamics.tasks.corpus import _corpus, check_corpus
from dynamics.tasks.induction import _induction
from dynamics.tasks.markov import _markov
from dynamics.tasks.offset_copy import _offset_copy
from dynamics.tasks.slash_text import _slash_text

TASK_KEYS = {
    "induction": ("min_period", "max_period"),
    "offset_copy": ("delta", "p"),
    "markov": ("markov_order", "markov_branching"),
    "slash_text": (),
    "corpus": ("holdout",),
}
"""The ``task`` keys each generator reads, besides model.context and model.vocab_size: a sweep
axis over a key no task of a point reads would train the same run twice (``sweep.grid``)."""

SPLITS = ("train", "eval", "probe")

_MIXTURE_KEY = 0  # seed-stream key for the per-row component draw; tasks use TASKS index + 1


@dataclass(frozen=True)
class Batch:
    """One batch of next-token sequences.

    Attributes
    ----------
    tokens : np.ndarray
        ``(B, T + 1)`` int64; inputs are ``tokens[:, :-1]``, targets ``tokens[:, 1:]``.
    component : np.ndarray
        ``(B,)`` int64 index into ``cfg.task.component_names``.
    repeat_mask : np.ndarray
        ``(B, T)`` bool; True where the target ``tokens[:, t + 1]`` repeats an earlier token
        in context (induction: from the second period on, ``t + 1 >= P``; offset_copy: where
        the token was copied). All False for tasks without such structure. The first of
        induction's, the second period's first token, is not yet predictable: no token has
        repeated, so the period is unknown (its best loss is ln of the number of periods still possible).
    """

    tokens: np.ndarray
    component: np.ndarray
    repeat_mask: np.ndarray


# ----------------------------------------------------------------------------- public API


def make_batch(cfg: RunConfig, split: str, step: int, batch_size: int, component: str | None = None) -> Batch:
    """Generate the batch for ``(cfg, cfg.train.seed, step, split)``.

    Parameters
    ----------
    cfg : RunConfig
        Validated run config; ``cfg.model.context`` is T, ``cfg.train.seed`` the seed.
    split : {"train", "eval", "probe"}
        Independent random streams; for ``corpus``, "eval" and "probe" read held-out files.
    step : int
        Non-negative step (or batch index); each value gives an independent batch.
    batch_size : int
        Number of sequences B (>= 1).
    component : str, optional
        Force every row to come from this component (for per-component eval loss). Rows
        forced to component c equal those of a plain run of task c with the same config.

    Returns
    -------
    Batch
        ``tokens`` (B, T + 1) int64, ``component`` (B,) int64, ``repeat_mask`` (B, T) bool.

    Raises
    ------
    ValueError
        Unknown split or component, negative step, batch_size < 1.

    Example
    -------
    >>> from dynamics.config import from_dict
    >>> cfg = from_dict({"task": {"name": "induction"}, "model": {"context": 32}})
    >>> make_batch(cfg, "train", 0, 4).tokens.shape
    (4, 33)
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    if isinstance(step, bool) or int(step) != step or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    step, batch_size = int(step), int(batch_size)
    names = cfg.task.component_names
    if component is not None and component not in names:
        raise ValueError(f"unknown component {component!r} for task {cfg.task.name!r} (components: {', '.join(names)})")
    if split == "train" and cfg.task.pool_size and component is None:
        # Low-data regime: every training row is drawn from one fixed pool of sequences.
        pool = _pool(cfg)
        rng = np.random.default_rng(np.random.SeedSequence([cfg.train.seed, step, _POOL_KEY]))
        rows = rng.integers(cfg.task.pool_size, size=batch_size)
        return Batch(pool.tokens[rows], pool.component[rows], pool.repeat_mask[rows])
    T = cfg.model.context
    key = (cfg.train.seed, step, SPLITS.index(split))

    if component is not None or len(names) == 1:
        name = component if component is not None else names[0]
        tokens, mask = _generate(cfg, name, split, key, batch_size)
        comp = np.full(batch_size, names.index(name), dtype=np.int64)
        return Batch(tokens, comp, mask)

    rng = np.random.default_rng(np.random.SeedSequence([*key, _MIXTURE_KEY]))
    comp = rng.choice(len(names), size=batch_size, p=_mixture_weights(cfg)).astype(np.int64)
    tokens = np.empty((batch_size, T + 1), dtype=np.int64)
    mask = np.zeros((batch_size, T), dtype=bool)
    for i, name in enumerate(names):
        rows = np.flatnonzero(comp == i)
        if rows.size:
            tokens[rows], mask[rows] = _generate(cfg, name, split, key, rows.size)
    return Batch(tokens, comp, mask)


def check(cfg: RunConfig) -> None:
    """Raise ConfigError (one line naming the key) if the task cannot make this config's batches
    on this machine: what :func:`dynamics.config.validate` cannot know (the corpus's files).

    Example
    -------
    >>> from dynamics.config import from_dict
    >>> check(from_dict({"task": {"name": "induction"}}))
    """
    if "corpus" in cfg.task.component_names:
        problem = check_corpus(cfg.task.holdout, cfg.model.context + 1)
        if problem:
            raise ConfigError(problem)


def unread_keys(cfg: RunConfig) -> dict[str, object]:
    """Task keys (:data:`TASK_KEYS`) set away from their defaults that none of the config's
    tasks reads, ``{key: value}``: they change the run id and nothing the run trains on.

    Example
    -------
    >>> from dynamics.config import from_dict
    >>> unread_keys(from_dict({"task": {"name": "induction", "delta": 5, "min_period": 6}}))
    {'delta': 5}
    """
    read = {k for name in cfg.task.component_names for k in TASK_KEYS[name]}
    default = TaskConfig()
    return {k: getattr(cfg.task, k) for keys in TASK_KEYS.values() for k in keys
            if k not in read and getattr(cfg.task, k) != getattr(default, k)}


def check_read(cfg: RunConfig) -> None:
    """Raise ConfigError (one line) if the config sets a task key its tasks do not read: a single
    run with ``task.delta = 5`` under induction would train the data and model of the config without it, under
    another run id, as if delta had been studied. Sweeps allow such keys on points whose task
    does not read them (a grid over task.name shares one base config); ``sweep.grid`` refuses
    points that then train the same run, and a key that no point reads."""
    unread = unread_keys(cfg)
    if unread:
        key, value = next(iter(unread.items()))
        readers = [name for name, keys in TASK_KEYS.items() if key in keys]
        tasks = " and ".join(cfg.task.component_names)
        raise ConfigError(
            f"task.{key} = {value!r}: the {tasks} task{'s do' if len(cfg.task.component_names) > 1 else ' does'} "
            f"not read it (only {' and '.join(readers)} {'does' if len(readers) == 1 else 'do'}), so the run would "
            f"train what the config without it trains, under another run id; drop the setting, or set task.name")


_POOL_KEY = 7919  # distinct SeedSequence entropy for drawing rows from the low-data pool
_POOLS = threading.local()
"""Per thread, the last pool made: ``key`` and ``batch``."""


def _pool(cfg: RunConfig) -> Batch:
    """The fixed training pool of a low-data config: the first ``pool_size`` train rows."""
    import json
    from dataclasses import asdict, replace

    key = json.dumps([asdict(cfg.task), cfg.model.context, cfg.model.vocab_size, cfg.train.seed], sort_keys=True)
    if getattr(_POOLS, "key", None) != key:
        # One pool per thread: a sweep worker's thread trains its runs one after another, each
        # seed its own pool, and a cache of every pool made kept them all (the memory check counts
        # one run's). Per thread, so that threads training pooled runs side by side do not evict
        # each other's pool at every step.
        _POOLS.key = _POOLS.batch = None  # the old pool freed before the new one is made
        unpooled = replace(cfg, task=replace(cfg.task, pool_size=0))
        _POOLS.batch = make_batch(unpooled, "train", 0, cfg.task.pool_size)
        _POOLS.key = key
    return _POOLS.batch


# ----------------------------------------------------------------------------- dispatch


def _generate(cfg: RunConfig, name: str, split: str, key: tuple, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one component: (tokens (n, T+1) int64, repeat_mask (n, T) bool)."""
    rng = np.random.default_rng(np.random.SeedSequence([*key, TASKS.index(name) + 1]))
    T, t = cfg.model.context, cfg.task
    if name == "induction":
        return _induction(rng, n, T, cfg.model.vocab_size, t.min_period, t.max_period)
    if name == "offset_copy":
        return _offset_copy(rng, n, T, cfg.model.vocab_size, t.delta, t.p)
    if name == "markov":
        tokens = _markov(rng, n, T + 1, cfg.model.vocab_size, t.markov_order, t.markov_branching)
        return tokens, np.zeros((n, T), dtype=bool)
    if name == "slash_text":
        return _slash_text(rng, n, T + 1), np.zeros((n, T), dtype=bool)
    if name == "corpus":
        return _corpus(rng, n, T + 1, t.holdout, split), np.zeros((n, T), dtype=bool)
    raise ValueError(f"unknown task {name!r}")  # config validation makes this unreachable


def _mixture_weights(cfg: RunConfig) -> np.ndarray:
    names = cfg.task.component_names
    w = np.asarray(cfg.task.weights if cfg.task.weights else [1.0] * len(names), dtype=np.float64)
    return w / w.sum()
