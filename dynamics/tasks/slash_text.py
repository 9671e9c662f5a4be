"""``slash_text``: bytes of paths, URLs, dates and fractions drawn from a fixed record pool."""

from __future__ import annotations

import datetime
import functools

import numpy as np

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
