"""Next-token tasks, each chosen to elicit a known attention-head role.

A batch is a pure function of ``(config, seed, step, split)``: every call builds its own
``numpy.random.Generator`` from ``SeedSequence([seed, step, split_id, task_key])``, so a
resumed run needs no data-loader state and any batch can be regenerated for analysis.
Batches are numpy (``int64`` tokens); the trainer converts them. This module never
imports torch.

Tasks (``cfg.task.name``) and the roles they target (see data/README.md):

- ``induction``: a random segment of period P ~ U[min_period, max_period] repeated; varying
  P defeats a fixed-offset (RoPE slash) shortcut, so induction heads are needed
  (Olsson et al. 2022; Bietti et al. 2023).
- ``offset_copy``: token t copies token t - delta with probability p; slash-dominant heads
  at offset delta (Cheng et al. 2026, arXiv 2601.08297).
- ``markov``: a sparse random n-gram chain, fixed by the task config; previous-token and
  local heads, and the "global bigram" stage of Bietti et al. 2023.
- ``slash_text``: bytes of paths, URLs, dates and fractions in which "/" separates fields
  that depend on the field before; '/'-token-dominant heads (the slash-dominance post).
- ``corpus``: byte windows of the running interpreter's standard-library ``.py`` files,
  with a held-out split of files for "eval" and "probe".
- ``mixture``: each row drawn from one component by ``cfg.task.weights``.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass

import numpy as np

from dynamics.config import TASKS, RunConfig

SPLITS = ("train", "eval", "probe")

# Bump a task's version whenever the arrays it produces for a given config change; the
# version enters data_hash, so runs made with different generators are told apart.
GENERATOR_VERSIONS = {
    "induction": 1,
    "offset_copy": 1,
    "markov": 1,
    "slash_text": 1,
    "corpus": 1,
}

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
        ``(B, T)`` bool; True where the target ``tokens[:, t + 1]`` is determined by an
        earlier token in context (induction: from the second period on; offset_copy: where
        the token was copied). All False for tasks without such structure.
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


_POOL_KEY = 7919  # distinct SeedSequence entropy for drawing rows from the low-data pool
_POOLS: dict[str, Batch] = {}


def _pool(cfg: RunConfig) -> Batch:
    """The fixed training pool of a low-data config: the first ``pool_size`` train rows."""
    import json
    from dataclasses import asdict, replace

    key = json.dumps([asdict(cfg.task), cfg.model.context, cfg.model.vocab_size, cfg.train.seed], sort_keys=True)
    if key not in _POOLS:
        unpooled = replace(cfg, task=replace(cfg.task, pool_size=0))
        _POOLS[key] = make_batch(unpooled, "train", 0, cfg.task.pool_size)
    return _POOLS[key]


def data_hash(cfg: RunConfig) -> str:
    """SHA-256 hex digest identifying the data a config trains on.

    For ``corpus`` it is the corpus content hash (sorted relative file names and bytes, as
    in :func:`corpus_info`); for synthetic tasks a hash of the generator version and the
    task parameters that affect the output; for ``mixture`` a hash of the components'
    hashes and the normalised weights.

    Example
    -------
    >>> from dynamics.config import from_dict
    >>> len(data_hash(from_dict({"task": {"name": "markov"}})))
    64
    """
    names = cfg.task.component_names
    if cfg.task.pool_size:  # a low-data pool is a different dataset for every seed
        from dataclasses import replace

        base = data_hash(replace(cfg, task=replace(cfg.task, pool_size=0)))
        return _sha({"base": base, "pool_size": cfg.task.pool_size, "seed": cfg.train.seed})
    if cfg.task.name != "mixture":
        return _component_hash(cfg, names[0])
    blob = {
        "task": "mixture",
        "components": list(names),
        "weights": [round(float(w), 12) for w in _mixture_weights(cfg)],
        "hashes": [_component_hash(cfg, n) for n in names],
    }
    return _sha(blob)


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


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _component_hash(cfg: RunConfig, name: str) -> str:
    t, V = cfg.task, cfg.model.vocab_size
    if name == "corpus":
        return _corpus_hash()
    if name == "slash_text":  # the record pool (tree, dates, fractions) is the definition
        params = {"pool": hashlib.sha256(_slash_pool()[0].tobytes()).hexdigest()}
    else:
        params = {
            "induction": {"vocab_size": V, "min_period": t.min_period, "max_period": t.max_period},
            "offset_copy": {"vocab_size": V, "delta": t.delta, "p": t.p},
            "markov": {"vocab_size": V, "order": t.markov_order, "branching": t.markov_branching},
        }[name]
    return _sha({"task": name, "version": GENERATOR_VERSIONS[name], "params": params})


# ----------------------------------------------------------------------------- induction


def _distinct_rows(rng: np.random.Generator, n: int, k: int, V: int) -> np.ndarray:
    """(n, k) int64 tokens from range(V), distinct within each row when k <= V."""
    if k > V:
        return rng.integers(V, size=(n, k))
    if V <= 1024:  # exact: the first k of a random permutation of range(V)
        return np.argsort(rng.random((n, V)), axis=1)[:, :k].astype(np.int64)
    # Large vocabularies: draw i.i.d. and redraw the (rare) repeats until none remain.
    x = rng.integers(V, size=(n, k))
    while True:
        order = np.argsort(x, axis=1, kind="stable")
        s = np.take_along_axis(x, order, axis=1)
        dup = np.zeros_like(x, dtype=bool)
        np.put_along_axis(dup, order[:, 1:], s[:, 1:] == s[:, :-1], axis=1)
        if not dup.any():
            return x
        x[dup] = rng.integers(V, size=int(dup.sum()))


def _induction(rng, n, T, V, min_period, max_period):
    # Period per row, then the row is its first P tokens repeated. Tokens within a segment
    # are distinct (when the vocabulary allows), so after the first period the current
    # token alone says where to look back: exactly the induction-head lookup.
    P = rng.integers(min_period, max_period + 1, size=n)
    seg = _distinct_rows(rng, n, max_period, V)
    idx = np.arange(T + 1)[None, :] % P[:, None]  # (n, T+1)
    tokens = np.take_along_axis(seg, idx, axis=1)
    mask = (np.arange(1, T + 1)[None, :] >= P[:, None])  # target t+1 repeats token t+1-P
    return tokens.astype(np.int64), mask


# ----------------------------------------------------------------------------- offset_copy


def _offset_copy(rng, n, T, V, delta, p):
    # Each residue class mod delta is its own chain: position t copies t - delta with
    # probability p. Vectorised as a forward fill of the last fresh draw along each chain.
    L = T + 1
    fresh = rng.integers(V, size=(n, L))
    copied = rng.random((n, L)) < p
    copied[:, :delta] = False
    m = -(-L // delta)  # chain length after padding to a multiple of delta
    pad = m * delta - L
    c = np.pad(copied, ((0, 0), (0, pad))).reshape(n, m, delta)
    j = np.arange(m)[None, :, None]
    src = np.maximum.accumulate(np.where(c, 0, j), axis=1)  # index of the last fresh draw
    pos = (src * delta + np.arange(delta)[None, None, :]).reshape(n, m * delta)[:, :L]
    tokens = np.take_along_axis(fresh, pos, axis=1)
    return tokens.astype(np.int64), copied[:, 1:].copy()


# ----------------------------------------------------------------------------- markov

_U64 = np.uint64
_MARKOV_SALT = 0x6D61726B6F76  # "markov"
_MARKOV_LEVELS = 256  # transition probabilities are multiples of 1/256
_MARKOV_LUT_MAX = 1 << 21  # next-token table entries (contexts x levels)
_MARKOV_TABLE_MAX = 1 << 22  # rule-table entries (contexts x branching); beyond, evaluate by hashing


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrap-around arithmetic)."""
    z = z + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def _markov_rules(ctx: np.ndarray, V: int, order: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Successors (N, K) int64 and cumulative levels (N, K) for contexts ctx (N, order), oldest first.

    The chain is a fixed hash of (vocab_size, order, branching, context), so it is the same
    for every run seed and split: seeds are replicates of one task. Successor weights are
    -log(U) normalised (Dirichlet(1, ..., 1) probabilities), rounded to multiples of
    1/_MARKOV_LEVELS; successor j is drawn for a uniform level q in [0, levels) when
    cum[j-1] <= q < cum[j]. Repeated ids merge and rounding can zero a weight, so a context
    has at most K successors.
    """
    h = np.full(ctx.shape[0], _MARKOV_SALT ^ (V << 24) ^ (order << 16) ^ K, dtype=np.uint64)
    for i in range(order):
        h = _mix64(h ^ ctx[:, i].astype(np.uint64))
    j = np.arange(1, K + 1, dtype=np.uint64)[None, :]
    succ = (_mix64(h[:, None] + j * _U64(0xD1B54A32D192ED03)) % _U64(V)).astype(np.int64)
    bits = _mix64(h[:, None] ^ (j * _U64(0x8CB92BA72F3D8DD7))) >> _U64(11)
    w = -np.log((bits.astype(np.float64) + 1.0) * 2.0**-53)
    cum = np.rint(np.cumsum(w, axis=1) / w.sum(axis=1, keepdims=True) * _MARKOV_LEVELS).astype(np.int64)
    cum[:, -1] = _MARKOV_LEVELS
    return succ, cum


def markov_transitions(V: int, order: int, K: int, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chain's rules for given contexts: (successors (N, K), probabilities (N, K)).

    Parameters
    ----------
    V, order, K : int
        ``model.vocab_size``, ``task.markov_order``, ``task.markov_branching``.
    contexts : np.ndarray
        ``(N, order)`` int tokens, oldest first.

    Returns
    -------
    tuple of np.ndarray
        Successor ids and their probabilities (rows sum to 1; ids may repeat).

    Example
    -------
    >>> succ, prob = markov_transitions(64, 1, 3, np.array([[5]]))
    >>> succ.shape, float(prob.sum())
    ((1, 3), 1.0)
    """
    succ, cum = _markov_rules(np.asarray(contexts, dtype=np.int64).reshape(-1, order), V, order, K)
    return succ, np.diff(cum, axis=1, prepend=0) / _MARKOV_LEVELS


def _all_contexts(V: int, order: int) -> np.ndarray:
    """(V**order, order) contexts, row ctx = sum_i x_i V^(order-1-i), oldest token first."""
    idx = np.arange(V**order)
    return np.stack([(idx // V ** (order - 1 - i)) % V for i in range(order)], axis=1)


@functools.lru_cache(maxsize=8)
def _markov_lut(V: int, order: int, K: int) -> np.ndarray:
    """Flat next-token table: entry ctx * levels + q is the successor for level q."""
    succ, cum = _markov_rules(_all_contexts(V, order), V, order, K)
    counts = np.diff(cum, axis=1, prepend=0)
    return np.repeat(succ.ravel(), counts.ravel()).astype(np.int32)  # `levels` slots per context


@functools.lru_cache(maxsize=8)
def _markov_table(V: int, order: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Rules for every context, compact: successors int32 (N, K), levels int16 (N, K)."""
    succ, cum = _markov_rules(_all_contexts(V, order), V, order, K)
    return succ.astype(np.int32), cum.astype(np.int16)


def _markov(rng, n, L, V, order, K, method: str | None = None):
    """(n, L) tokens: the first `order` uniform, the rest sampled from the chain.

    Three evaluations of the same chain, fastest first, chosen by table size: "lut" (one
    gather per step), "table" (cached rules per context), "hash" (rules recomputed per step;
    no memory, any vocabulary and order).
    """
    M, N = _MARKOV_LEVELS, V**order
    if method is None:
        method = "lut" if N * M <= _MARKOV_LUT_MAX else "table" if N * K <= _MARKOV_TABLE_MAX else "hash"
    tokens = np.empty((L, n), dtype=np.int64)  # time-major: each step writes one contiguous row
    tokens[:order] = rng.integers(V, size=(order, n))
    q = rng.integers(M, size=(L, n))
    rows = np.arange(n)
    if method == "hash":
        for t in range(order, L):
            succ, cum = _markov_rules(tokens[t - order : t].T, V, order, K)
            tokens[t] = succ[rows, (cum <= q[t][:, None]).sum(axis=1)]
        return np.ascontiguousarray(tokens.T)
    ctx = np.zeros(n, dtype=np.int64)
    for i in range(order):
        ctx = ctx * V + tokens[i]
    span = V ** (order - 1)
    if method == "lut":
        lut = _markov_lut(V, order, K)
        for t in range(order, L):
            tokens[t] = lut[ctx * M + q[t]]
            ctx = (ctx % span) * V + tokens[t]
    else:
        succ_t, cum_t = _markov_table(V, order, K)
        for t in range(order, L):
            tokens[t] = succ_t[ctx, (cum_t[ctx] <= q[t][:, None]).sum(axis=1)]
            ctx = (ctx % span) * V + tokens[t]
    return np.ascontiguousarray(tokens.T)


# ----------------------------------------------------------------------------- slash_text

_SLASH_SALT = 0x736C617368  # "slash"
# Record kinds and their sampling weights.
SLASH_KINDS = ("path", "url", "date", "fraction")
_SLASH_WEIGHTS = np.array([0.3, 0.2, 0.25, 0.25])
_SLASH_YEARS = (1990, 2030)  # [start, stop)
_SLASH_MAX_DENOMINATOR = 64
_SPACE_PROB = 0.7  # record separator: " " with this probability, else "\n"


def _random_name(rng: np.random.Generator, taken: set[str]) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    while True:
        name = "".join(letters[i] for i in rng.integers(26, size=int(rng.integers(2, 8))))
        if name not in taken:
            taken.add(name)
            return name


def _grow(rng, prefix: str, depth: int, max_depth: int, tree: dict[str, tuple[str, ...]]) -> None:
    """Fill tree[prefix] with child names (recursively): a fixed random directory tree."""
    if depth == max_depth:
        tree[prefix] = ()
        return
    taken: set[str] = set()
    n_children = int(rng.integers(2, 6)) if depth else 8
    children = []
    for _ in range(n_children):
        name = _random_name(rng, taken)
        if depth == max_depth - 1:  # leaves are files
            name += (".py", ".txt", ".md", ".c")[int(rng.integers(4))]
        children.append(name)
    tree[prefix] = tuple(children)
    for name in children:
        _grow(rng, f"{prefix}/{name}", depth + 1, max_depth, tree)


@functools.lru_cache(maxsize=1)
def _slash_tree() -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """The fixed tree: ({parent path -> child names}, url hosts).

    Keys are paths ("" is the filesystem root, "https://host" a URL root); the generator
    seed is a constant, so the tree is part of the task definition, not of the run.
    """
    rng = np.random.default_rng(np.random.SeedSequence([_SLASH_SALT]))
    tree: dict[str, tuple[str, ...]] = {}
    _grow(rng, "", 0, 4, tree)
    taken: set[str] = set()
    hosts = tuple(_random_name(rng, taken) + (".com", ".org", ".net", ".io")[i % 4] for i in range(6))
    for host in hosts:
        _grow(rng, f"https://{host}", 1, 4, tree)
    return tree, hosts


def _slash_records() -> dict[str, list[str]]:
    tree, hosts = _slash_tree()
    nodes = [f"{parent}/{child}" for parent, children in tree.items() for child in children]
    paths = [p for p in nodes if p.startswith("/")]
    urls = [p for p in nodes if p.startswith("https://")]
    dates = []
    day = datetime.date(_SLASH_YEARS[0], 1, 1)
    while day.year < _SLASH_YEARS[1]:
        dates.append(f"{day.year:04d}/{day.month:02d}/{day.day:02d}")
        day += datetime.timedelta(days=1)
    fractions = [f"{a}/{b}" for b in range(2, _SLASH_MAX_DENOMINATOR + 1) for a in range(1, b)]
    return {"path": paths, "url": urls, "date": dates, "fraction": fractions}


@functools.lru_cache(maxsize=1)
def _slash_pool() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every possible record: (bytes uint8, start (N,), length (N,), kind offsets (5,))."""
    records = _slash_records()
    texts = [r.encode() for kind in SLASH_KINDS for r in records[kind]]
    lengths = np.array([len(b) for b in texts], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    offsets = np.cumsum([0] + [len(records[k]) for k in SLASH_KINDS])
    return np.frombuffer(b"".join(texts), dtype=np.uint8), starts, lengths, offsets


def _slash_text(rng, n, L):
    # Draw enough records per row to cover L bytes (the shortest record plus separator is
    # 4 bytes), lay them end to end with separators, and cut each row to L bytes.
    pool, starts, lengths, offsets = _slash_pool()
    R = -(-L // (int(lengths.min()) + 1))
    kind = rng.choice(len(SLASH_KINDS), size=(n, R), p=_SLASH_WEIGHTS)
    counts = np.diff(offsets)
    rec = offsets[kind] + (rng.random((n, R)) * counts[kind]).astype(np.int64)
    sep = np.where(rng.random((n, R)) < _SPACE_PROB, ord(" "), ord("\n"))
    span = (lengths[rec] + 1).ravel()  # record plus its separator, row-major
    ends = np.cumsum(span)
    row_start = np.concatenate([[0], ends[:-1]]).reshape(n, R)[:, 0]
    pos = row_start[:, None] + np.arange(L)[None, :]  # (n, L) offsets in the flat stream
    which = np.searchsorted(ends, pos, side="right")  # flat record index covering each byte
    within = pos - (ends[which] - span[which])
    rec_flat, sep_flat = rec.ravel()[which], sep.ravel()[which]
    is_sep = within == lengths[rec_flat]
    body = pool[np.minimum(starts[rec_flat] + within, pool.size - 1)]
    return np.where(is_sep, sep_flat, body).astype(np.int64)


# ----------------------------------------------------------------------------- corpus

_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


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
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow directory symlinks
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
        for name in filenames:
            full = os.path.join(dirpath, name)
            if name.endswith(".py") and os.path.isfile(full):
                found.append((os.path.relpath(full, root).replace(os.sep, "/"), full))
    if not found:
        raise RuntimeError(f"no .py files found under the stdlib directory {root}")
    found.sort()
    chunks = []
    for _, full in found:
        with open(full, "rb") as f:
            chunks.append(f.read())
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


__all__ = ["Batch", "SPLITS", "GENERATOR_VERSIONS", "make_batch", "data_hash", "corpus_info", "markov_transitions"]
