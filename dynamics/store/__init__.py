"""Storage: write run groups into one Zarr v3 store, open runs and sweeps as xarray.

This is the only module that imports zarr (and it never imports torch). Layout, as in
:mod:`dynamics.schema`::

    STORE/zarr.json             root group: attrs {dynamics_store, sweep} + the group index
    STORE/runs/<run_id>/        one group per run, written only by that run's process
    STORE/analysis/<run_id>/    derived per-run arrays (replaced whole when recomputed)
    STORE/derived/<name>/       sweep-level datasets
    STORE/.staging/             a local analysis or derived group while it is written, then renamed into place
                                (what a killed writer left there, no live writer's, the next write clears)
    STORE/checkpoints/<run_id>/ckpt.pt   torch checkpoints (plain files, not zarr)
    STORE/checkpoints/<run_id>/train.lock  held (flock) by the process training the run

Every array names its dimensions (zarr v3 ``dimension_names``), so a run opens without this
package: ``xr.open_zarr(STORE, group="runs/<run_id>")``.

The group index
---------------
``xr.open_zarr(store, group=...)`` with its default ``consolidated=None`` opens the *root*
with consolidated metadata and looks the group up there; without it, xarray warns and
falls back. Zarr's own ``consolidate_metadata`` inlines every array of every run into the
root ``zarr.json`` (measured: 2 s to write and 0.4 s to open one run for 100 runs), and
rewriting it from every run process would race with the launcher's sweep index. So the
root carries a *shallow* index instead: the entries ``runs``, ``analysis``, ``derived`` and
one entry per ``<section>/<name>`` group (its attributes), but not the arrays below them.
Zarr then lists a run's arrays from the store itself, so they are never stale. The entry of
one group is updated (read-modify-write of the root ``zarr.json``) whenever that group is
created or its attributes change, under an exclusive ``flock`` on the store directory, the
same lock that guards writes of the sweep index. This package's own readers never use the
index (they open groups with ``consolidated=False``), so a stale index can only affect
plain-xarray users; :func:`reindex` rebuilds it from the groups on disk, and
:func:`refresh_index` mends the entries of given runs (``dynamics run`` and ``sweep`` do, for
the finished runs they skip: a kill after a run's last attributes left its entry stale).
The index is kept by `dynamics.store.index`: each update validates the entries it puts in and
writes the root by json's C encoder, since its size, and so each rewrite's cost, grows with the runs.

Locations
---------
Paths may be local paths, ``file://`` URLs, or other fsspec URLs (``memory://...``,
``s3://...``). Checkpoints are read and written through fsspec on any of them
(:func:`write_checkpoint`, :func:`read_checkpoint`). Cross-process locking of the index
needs a local filesystem: with a remote store, only one process at a time may change the
index or the sweep index (the sweep launcher is that process).

Chunks and codec
----------------
Snapshot variables are chunked one snapshot per chunk (full size in the other dims), so a
snapshot write replaces whole chunks and never reads back; ``train_step`` variables are
chunked at 4096. Numeric arrays are compressed with :data:`DEFAULT_CODEC`, chosen by
``python bench/store.py``: plain zstd at level 1 stores peaky float16 attention within a few
percent of the best ratio measured (blosc-zstd-5 with byte shuffle) for several times less
CPU, and zstd is a core Zarr v3 codec that any reader understands. Each array's pipeline ends in
Zarr v3's ``crc32c`` codec: a chunk whose bytes changed fails its read instead of decoding to
wrong numbers (analyses and derived data too: :func:`write_analysis`, :func:`write_derived`).
"""

# `name as name`: module-level names kept reachable as store.<name>, outside __all__.
from dynamics.schema import STORE_VERSION as STORE_VERSION
from dynamics.store._loc import SECTIONS as SECTIONS
from dynamics.store._loc import StoreError, check_run_id, is_partial, is_remote, local_path
from dynamics.store.checkpoints import (
    RunLocked,
    atomic_write_bytes,
    check_checkpoint_kept,
    checkpoint_path,
    checkpoint_step,
    checkpoints_without_runs,
    has_checkpoint,
    read_checkpoint,
    run_lock,
    run_lock_held,
    run_now,
    run_status,
    write_checkpoint,
)
from dynamics.store.index import deferred_index
from dynamics.store.integrity import check_recorded, failed_checksum, unreadable_chunk
from dynamics.store.readers import (
    StaleAnalysisWarning,
    open_analysis,
    open_derived,
    open_run,
    open_sweep,
    stored_analysis_version,
    write_analysis,
    write_derived,
)
from dynamics.store.recorded import recorded_mask, recorded_snapshots
from dynamics.store.root import STALE_PARTIAL_S as STALE_PARTIAL_S
from dynamics.store.root import (
    check_folders,
    check_store,
    damaged_root,
    has_run,
    init_store,
    is_finished,
    is_store,
    list_runs,
    read_sweep_index,
    refresh_index,
    reindex,
    run_attrs,
    run_listed,
    update_run_attrs,
    write_sweep_index,
)
from dynamics.store.writer import CODECS, DEFAULT_CODEC, RunWriter
from dynamics.store.writer import TRAIN_STEP_CHUNK as TRAIN_STEP_CHUNK

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "RunLocked",
    "RunWriter",
    "StaleAnalysisWarning",
    "StoreError",
    "atomic_write_bytes",
    "check_recorded",
    "check_run_id",
    "check_folders",
    "check_store",
    "check_checkpoint_kept",
    "checkpoints_without_runs",
    "checkpoint_path",
    "checkpoint_step",
    "damaged_root",
    "deferred_index",
    "has_checkpoint",
    "read_checkpoint",
    "run_lock",
    "run_lock_held",
    "run_now",
    "run_status",
    "write_checkpoint",
    "has_run",
    "init_store",
    "is_finished",
    "is_partial",
    "is_remote",
    "is_store",
    "list_runs",
    "run_listed",
    "local_path",
    "open_analysis",
    "stored_analysis_version",
    "open_derived",
    "open_run",
    "open_sweep",
    "read_sweep_index",
    "recorded_mask",
    "recorded_snapshots",
    "refresh_index",
    "reindex",
    "run_attrs",
    "failed_checksum",
    "unreadable_chunk",
    "update_run_attrs",
    "write_analysis",
    "write_derived",
    "write_sweep_index",
]
