"""Whether the chunks a finished run wrote are all there and decode: lost or damaged chunk files, named.

Zarr reads a chunk file that is gone as the array's fill value, without a word: a deleted
snapshot of ``attention`` reads as NaN (its heads then have no role, no bifurcation), a lost
``probe_tokens`` chunk as token 0 everywhere (every role score computed against the wrong
tokens), a lost ``step`` chunk as step 0 at every snapshot. And a chunk cut short fails deep in
a codec ("Zstd decompression error") naming neither the run nor the array. A chunk whose bytes
changed (a flipped bit) fails the CRC32C that every array written since the codec gained one
ends with (:data:`~dynamics.store.writer.CODECS`); before, it could decode to wrong numbers.

A run created by this version's writer (attr :data:`~dynamics.store.writer.EMPTY_CHUNKS_WRITTEN`)
stored every chunk it wrote, even one of nothing but the fill value, so every chunk it wrote is
checked, ``probe_tokens`` and single-value coordinates included. In a run from before, zarr
stored no chunk whose values all equal the fill value, so only a chunk the run cannot have left
unwritten is named as lost: not the gradient statistics of a completed run's last snapshot when
its gradient was NaN (:data:`GRADIENT_VARIABLES`), nor ``probe_tokens`` (token 0 everywhere is
also a real probe: a markov chain whose token 0 leads only to itself, n_probe 1), nor a
coordinate of one value that may be its fill value 0.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

if TYPE_CHECKING:  # imported where used, as in readers: a training process writes
    import xarray as xr

from dynamics.schema import FINISHED_STATUSES, SNAPSHOT, TRAIN_STEP, recorded_arrays
from dynamics.store._loc import StoreError, _default_run, _Loc, _unreadable_member
from dynamics.store._zarr_private import sync as _sync
from dynamics.store.root import _require_store, run_attrs
from dynamics.store.writer import EMPTY_CHUNKS_WRITTEN

WRITTEN_EVERY_SNAPSHOT = ("attention", "grad_norm", "importance", "gate", "eval_loss", "head_weights")
"""Recorded variables that hold finite values at every snapshot a run recorded before it diverged.
Zarr writes no chunk whose values all equal the fill value (NaN), so a snapshot of these never
lacks its chunk unless the file was lost (but :data:`GRADIENT_VARIABLES`). Not ``grad_cosine`` (NaN at the first snapshot, which
has no previous gradient), nor ``chg``/``chg_role`` (NaN where not fitted), nor the interventions'
arrays: these are checked only in a run marked EMPTY_CHUNKS_WRITTEN, where every array's chunk of
every snapshot was stored."""


def _recorded_extent(attrs: dict, steps: Any, so_far: bool = False) -> tuple[list[int], int | None] | None:
    """(snapshot indices, leading train steps) a finished run wrote, or None for an unfinished one
    (with `so_far`: what an unfinished one wrote before its last checkpoint; None without one)."""
    status = attrs.get("status")
    if status == "completed":
        return list(range(len(steps))), None
    if status == "diverged" and isinstance(attrs.get("diverged_step"), int):
        # the snapshot at the diverging step may hold NaN gradients, whose chunk is never written
        end = attrs["diverged_step"]
        return [i for i, s in enumerate(steps) if s < end], end
    if so_far and status not in FINISHED_STATUSES and _checkpointed(attrs):
        # a checkpoint is saved after its snapshot's arrays and the losses before it (train.py)
        end = attrs["checkpoint_step"]
        return [i for i, s in enumerate(steps) if s <= end], end
    return None


def _checkpointed(attrs: dict) -> bool:
    step = attrs.get("checkpoint_step")
    return isinstance(step, int) and not isinstance(step, bool) and step >= 0


def _open(loc: _Loc, gpath: str) -> Any:
    if loc.local is not None:
        damaged = _unreadable_member(loc, gpath)
        if damaged is not None:
            raise damaged
    return zarr.open_group(loc.store, path=gpath, mode="r", use_consolidated=False)


def _keys(group: Any, prefix: str) -> set[str]:
    async def collect() -> set[str]:
        return {k async for k in group.store.list_prefix(prefix)}

    return _sync(collect())


def _stored(loc: _Loc, group: Any, prefix: str) -> Callable[[str], bool]:
    """Whether the chunk key (from the store's root) under `prefix` is stored.

    On a local store, a file's existence: listing walks every chunk directory (a run's
    arrays keep one per snapshot and dim), 11 ms for a demo run's 389 against 0.8 ms for
    its 143 chunk files checked one by one, most of `check_recorded`'s time.
    """
    if loc.local is not None:
        root = os.fspath(loc.local)
        return lambda key: os.path.isfile(os.path.join(root, key))
    return _keys(group, prefix).__contains__


def _where(loc: _Loc, run_id: str, steps: Any, name: str, arr: Any, coords: tuple[int, ...]) -> str:
    dims = tuple(arr.metadata.dimension_names or ())
    at = ""
    if SNAPSHOT in dims and name != "step":
        i = coords[dims.index(SNAPSHOT)]
        at = f" at snapshot {i}" + (f" (step {int(steps[i])})" if steps is not None and i < len(steps) else "")
    elif TRAIN_STEP in dims:
        chunk = arr.chunks[dims.index(TRAIN_STEP)]
        lo = coords[dims.index(TRAIN_STEP)] * chunk
        at = f" at train steps {lo}..{min(lo + chunk, arr.shape[0]) - 1}"
    return f"{loc}: run {run_id}: array {name}{at}: its chunk runs/{run_id}/{name}/{arr.metadata.encode_chunk_key(coords)}"


def _go_on(run_id: str) -> str:
    return (f"restore runs/{run_id} from a backup, or move runs/{run_id} and checkpoints/{run_id} out of the "
            f"store to go on without that run")


def check_recorded(path: str | os.PathLike, run_id: str | None = None, attrs: dict | None = None, *,
                   so_far: bool = False) -> None:
    """StoreError naming the first chunk a finished run wrote that is missing from the store.

    ``attrs``: the run's attributes when the caller has just read them (not read again).
    ``so_far``: also check a run not finished (running, stopped, interrupted, failed), on what it
    wrote before its last checkpoint (attr ``checkpoint_step``): the snapshots up to that step and
    the losses before it, all written before the checkpoint was. The report, which draws and
    analyses such runs, asks for it: a lost chunk there read as NaN, drawn as a snapshot whose
    heads all had no role.

    Checked, from the file listing alone (no chunk is read): that every array a training run
    creates is there (:func:`~dynamics.schema.recorded_arrays`, in a run marked
    EMPTY_CHUNKS_WRITTEN whose ``config`` attr says which), every coordinate, the
    :data:`WRITTEN_EVERY_SNAPSHOT` variables at every snapshot the run recorded (every variable
    with a snapshot dimension, in a run marked :data:`~dynamics.store.writer.EMPTY_CHUNKS_WRITTEN`),
    ``loss`` over the steps it trained, and ``probe_tokens``. Runs not finished are not checked (their later
    snapshots are not written yet) unless `so_far`, nor variables that may legitimately lack chunks. In a run
    from before :data:`~dynamics.store.writer.EMPTY_CHUNKS_WRITTEN` (see the module docstring)
    neither ``probe_tokens`` nor a numeric coordinate of a single value (its fill value 0 had no
    chunk) is checked, nor the :data:`GRADIENT_VARIABLES` of a completed run's last snapshot
    when its gradient was NaN.

    Raises
    ------
    StoreError
        One line: the run, the array, the snapshot and its step (or the train steps), how many
        chunks are missing in all, and what to do.
    """
    loc = _Loc(path)
    _require_store(loc)
    run_id = _default_run(loc, run_id)
    if attrs is None:
        attrs = run_attrs(loc.url, run_id)
    if attrs.get("status") not in FINISHED_STATUSES and not (so_far and _checkpointed(attrs)):
        return  # before opening its arrays: a live run's may still be being created (no checkpoint yet)
    gpath = f"runs/{run_id}"
    group = _open(loc, gpath)
    arrays = dict(group.arrays())
    # read as 0s if its own chunk is gone, which is then the first thing named
    try:
        steps = arrays["step"][...] if "step" in arrays else np.zeros(0, np.int64)
    except Exception as e:
        raise (unreadable_chunk(loc.url, run_id) or e) from e
    extent = _recorded_extent(attrs, steps, so_far)
    if extent is None:
        return
    snapshots, train_steps = extent
    every = attrs.get(EMPTY_CHUNKS_WRITTEN) is True
    # an array whose folder is gone is not listed, so none of its chunks are checked below
    expected = recorded_arrays(attrs.get("config")) if every else None
    lost = sorted(expected - arrays.keys()) if expected else []
    if lost:
        more = f" (and {', '.join(lost[1:])})" if len(lost) > 1 else ""
        raise StoreError(f"{loc}: run {run_id}: array {lost[0]}{more} is missing, though the run wrote it: its "
                         f"folder runs/{run_id}/{lost[0]} is gone; {_go_on(run_id)}")
    missing: list[tuple[str, tuple[int, ...]]] = []
    for name in sorted(arrays):
        arr = arrays[name]
        dims = tuple(arr.metadata.dimension_names or ())
        is_coord = len(dims) == 1 and name in (dims[0], "step")
        if is_coord:
            if arr.shape[0] <= 1 and arr.dtype.kind in "biuf" and not every:
                continue
        elif name == "loss" and dims == (TRAIN_STEP,):
            pass
        elif name == "probe_tokens" and every:
            pass
        elif SNAPSHOT not in dims or not (every or name in WRITTEN_EVERY_SNAPSHOT):
            # in a marked run every snapshot's chunk of every array was stored, NaN ones included
            # (grad_cosine's first, CHG where not fitted, the interventions' arrays)
            continue
        ranges = [range(n) for n in arr.cdata_shape]
        if SNAPSHOT in dims and not is_coord:
            chunk = arr.chunks[dims.index(SNAPSHOT)]
            ranges[dims.index(SNAPSHOT)] = sorted({s // chunk for s in snapshots})
        if TRAIN_STEP in dims and not is_coord and train_steps is not None:
            chunk = arr.chunks[dims.index(TRAIN_STEP)]
            ranges[dims.index(TRAIN_STEP)] = range(-(-train_steps // chunk))
        stored = _stored(loc, group, f"{gpath}/{name}/")
        missing += [(name, c) for c in itertools.product(*ranges)
                    if not stored(f"{gpath}/{name}/{arr.metadata.encode_chunk_key(c)}")]
    if not every:
        missing = _unexplained(loc, group, gpath, arrays, missing, snapshots, attrs)
    if not missing:
        return
    name, coords = missing[0]
    if any(n == "step" for n, _ in missing):
        steps = None
    more = f" (and {len(missing) - 1} more chunk(s) of its arrays)" if len(missing) > 1 else ""
    raise StoreError(f"{_where(loc, run_id, steps, name, arrays[name], coords)} is missing{more}, though the run "
                     f"wrote it: zarr would read it as {_plain(arrays[name].fill_value)}; {_go_on(run_id)}")


GRADIENT_VARIABLES = ("grad_norm", "importance")
"""Recorded from the training batch's gradient. That of a completed run's last snapshot (batch
``train.steps``) is applied by no update, so no divergence check sees it: a NaN there leaves the
run completed, and these NaN at that snapshot, which zarr writes as no chunk."""


def _unexplained(loc: _Loc, group: Any, gpath: str, arrays: dict, missing: list, snapshots: list[int],
                 attrs: dict) -> list[tuple[str, tuple[int, ...]]]:
    """`missing` less the chunks a NaN gradient at a completed run's last snapshot left unwritten.

    Which it was is told by ``grad_cosine`` at that snapshot (not the first: a run has two or more):
    a NaN gradient makes every cosine NaN too, so its chunk is absent as well; while it is there,
    some head's gradient was finite, and a missing ``grad_norm`` chunk was lost. (Losing both
    files of that one snapshot would go unnamed; the values read as NaN, which they may have been.)
    """
    if attrs.get("status") != "completed" or len(snapshots) < 2 or "grad_cosine" not in arrays:
        return missing
    last = snapshots[-1]

    def at_last(name: str, coords: tuple[int, ...]) -> bool:
        dims = tuple(arrays[name].metadata.dimension_names or ())
        return name in GRADIENT_VARIABLES and coords[dims.index(SNAPSHOT)] == last

    if not any(at_last(n, c) for n, c in missing):
        return missing
    cosine = arrays["grad_cosine"]
    dims = tuple(cosine.metadata.dimension_names or ())
    stored = _stored(loc, group, f"{gpath}/grad_cosine/")
    keys = [f"{gpath}/grad_cosine/{cosine.metadata.encode_chunk_key(c)}"
            for c in itertools.product(*(range(n) if d != SNAPSHOT else [last]
                                         for d, n in zip(dims, cosine.cdata_shape, strict=True)))]
    if any(stored(k) for k in keys):
        return missing
    return [(n, c) for n, c in missing if not at_last(n, c)]


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def failed_checksum(error: BaseException) -> bool:
    """Whether ``error`` is zarr's Crc32cCodec finding a chunk's bytes changed (its message holds
    the raw bytes of both sums, which no reader should be shown)."""
    return "checksum do not match" in str(error)


def unreadable_chunk(path: str | os.PathLike, run_id: str) -> StoreError | None:
    """StoreError naming the first chunk of run `run_id` that cannot be decoded, or None.

    Reads every chunk of every array of the run: for after a read of the run has failed, to
    name what failed, which zarr's codec error does not.
    """
    loc = _Loc(path)
    gpath = f"runs/{run_id}"
    try:
        arrays = dict(_open(loc, gpath).arrays())
    except StoreError as e:
        return e
    try:
        steps = arrays["step"][...] if "step" in arrays else None
    except Exception:  # noqa: BLE001 - the step coordinate is the damaged one: found below
        steps = None
    for name in sorted(arrays):
        arr = arrays[name]
        for coords in itertools.product(*(range(n) for n in arr.cdata_shape)):
            try:
                arr.get_block_selection(coords)
            except Exception as e:  # noqa: BLE001 - any codec's error: named with its chunk
                why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                if failed_checksum(e):
                    why = "its CRC32C checksum does not match: its bytes changed, or were cut short, after they were written"
                return StoreError(f"{_where(loc, run_id, steps, name, arr, coords)} cannot be decoded "
                                  f"(damaged: {why}); {_go_on(run_id)}")
    return None


def _whole(loc: _Loc, gpath: str, ds: xr.Dataset) -> xr.Dataset:
    """`ds`, opened from group `gpath`, less its EMPTY_CHUNKS_WRITTEN mark; StoreError naming the
    first array with a chunk file missing where the mark says every chunk was stored.

    Counted from the files of a local store (one walk of the group), or by zarr elsewhere.
    A group written before the mark (no attr) is not checked: zarr then stored no chunk
    whose values all equal the fill value, so a missing one may be no loss.
    """
    if not ds.attrs.pop(EMPTY_CHUNKS_WRITTEN, False):
        return ds
    for name, var in ds.variables.items():
        chunks = var.encoding.get("chunks") or var.shape
        grid = [range(-(-n // c)) for n, c in zip(var.shape, chunks, strict=True)]
        expected = int(np.prod([len(g) for g in grid]))
        if loc.local is not None:
            # each chunk's own file, c/i/j/... (a 0-d array's one chunk is c itself): a stray file
            # in the folder must not stand in for a lost one
            base = loc.local / gpath / str(name)
            found = sum((base / "/".join(["c", *map(str, idx)])).is_file() for idx in itertools.product(*grid))
        else:
            found = zarr.open_array(loc.store, path=f"{gpath}/{name}", mode="r").nchunks_initialized
        if found < expected:
            raise StoreError(f"{loc}: {gpath}: array {name} has {expected - found} of its {expected} chunk(s) missing, "
                             f"though all were written (zarr would read them as its fill value); the command that "
                             f"wrote {gpath} writes it again")
    return ds
