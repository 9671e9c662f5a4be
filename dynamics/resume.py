"""What a resume checks before it writes, and what it says of a session that differs.

A run id names one experiment (config less execution keys, see :mod:`dynamics.identity`), so a
start on a store that already holds it is a resume, or a skip of a finished run. These are the
refusals made before any write (another experiment under that id, other data, recordings or
losses missing before the checkpoint) and the notes printed when a resume runs on another
device, thread count, CPU kernels or dynamics code than the session before it. Each refusal is
one StoreError line; :func:`dynamics.train.train_run` calls them, under the run's lock or
before it.
"""

from __future__ import annotations

import sys

import numpy as np

from dynamics import store
from dynamics.config import RunConfig
from dynamics.identity import experiment_identity, identity_difference
from dynamics.schema import TRAIN_STEP
from dynamics.tasks.hashing import other_data


def _same_experiment(attrs: dict, cfg: RunConfig) -> bool:
    return experiment_identity(attrs.get("config", {})) == experiment_identity(cfg.to_dict())


def refuse_other_experiment(prior: dict, cfg: RunConfig, path: str, run_id: str) -> None:
    """StoreError when the run's recorded attributes ``prior`` (empty for a new run) are of another
    experiment than ``cfg``: checked before the status, so that a finished run of another config
    is refused, not "skipped"."""
    if prior and "config" not in prior:  # not "a different config": there is none to compare
        raise store.StoreError(f"run {run_id} in {path} records no config, so it cannot be told to be this "
                               "config's run; refusing to train into it")
    if prior and not _same_experiment(prior, cfg):
        raise store.StoreError(f"run {run_id} in {path} was recorded with a different config "
                               f"({identity_difference(prior.get('config', {}), cfg.to_dict())}); refusing to mix them")


def refuse_other_data(prior: dict, cfg: RunConfig, path: str, run_id: str, hash_now: str) -> None:
    """StoreError when the run was started on other data than ``hash_now``
    (:func:`dynamics.tasks.data_hash` here: another standard library, for the corpus)."""
    if prior.get("data_hash", hash_now) != hash_now:
        raise store.StoreError(other_data(run_id, path, prior["data_hash"], hash_now, cfg.task.name))


def refuse_unrecorded(path: str, run_id: str, steps_at, start: int) -> float | None:
    """The loss recorded at the step before the checkpoint's (None where none is: start 0, no loss
    array); StoreError when snapshots or losses before the checkpoint's step hold no data, or a chunk
    the run wrote before its last checkpoint is missing (`store.check_recorded`).

    A run writes each snapshot before the checkpoint taken at its step, so in its own store
    they are all there. A store copied while the run trained (``cp -r`` of ``runs/`` before
    ``checkpoints/``) can hold a later checkpoint than recordings: a resume from it would
    never record the steps between, and the run would end "completed" with them empty.

    The loss before the checkpoint is checked too: the resume writes its losses into the chunk
    that holds the checkpoint's step, so a lost chunk file there was written again, NaN over
    every earlier step, and the run ended "completed" with no file missing for a later check to
    name; a chunk that cannot be decoded stopped the resume at its first loss write, a codec's
    error naming no chunk, the run then marked failed.

    ``steps_at``: the run's snapshot schedule; None reads the one it recorded (`dynamics status`,
    which shows the loss returned: the last one recorded, read here so the run is opened once).
    """
    ds = store.open_run(path, run_id, dask=False)
    if steps_at is None:  # read here, inside the caller's guard: a step chunk may be what is damaged
        steps_at = ds["step"].values
    before = np.flatnonzero(np.asarray(steps_at) < start)
    try:
        imp = ds["importance"].isel(snapshot=before).values if "importance" in ds and before.size else None
        loss = ds["loss"].isel({TRAIN_STEP: slice(0, start)}).values if "loss" in ds else None
    except Exception as e:
        raise (store.unreadable_chunk(path, run_id) or e) from e
    if imp is not None:
        empty = before[np.isnan(imp).reshape(len(before), -1).all(axis=1)]
        if empty.size:
            missing = ", ".join(str(int(steps_at[i])) for i in empty[:5]) + (" ..." if empty.size > 5 else "")
            raise store.StoreError(
                f"run {run_id} in {path}: its checkpoint is at step {start}, but the snapshots at steps {missing} "
                f"were never recorded (a store copied while the run trained?); a resume would leave them empty: "
                f"copy the store again once the run has stopped, or train it under another --run-id")
    if loss is not None and (lost := np.flatnonzero(np.isnan(loss))).size:
        # every step before the checkpoint was written, finite (a non-finite loss ends the run
        # diverged), before the checkpoint: NaN there is the fill value of a chunk file gone
        chunk = int((ds["loss"].encoding.get("chunks") or (start,))[0])
        first = int(lost[0]) // chunk
        raise store.StoreError(
            f"run {run_id} in {path}: its loss at train steps {first * chunk}..{min((first + 1) * chunk, start) - 1}, "
            f"before its checkpoint at step {start}, reads as NaN: its chunk runs/{run_id}/loss/c/{first} is missing; "
            f"a resume would write that chunk again without them: restore runs/{run_id} from a backup, or train "
            f"the run again under another --run-id")
    # The other arrays of those snapshots (attention, gradients, ...), from the file listing: a lost
    # chunk there was resumed over, and the run ended "completed" with a hole `analyse` named later.
    store.check_recorded(path, run_id, so_far=True)
    return float(loss[-1]) if loss is not None and loss.size else None


def note_execution_change(run_id: str, prior: dict, cfg: RunConfig, start: int, code_now: str | None,
                          cpu_now: str | None) -> None:
    """Say so when a resume runs on another device, thread count or CPU kernels than the session
    that trained the steps it keeps.

    Both are execution keys (the same experiment, the same run id), so the resume goes ahead and
    ``resumes`` records it; but reductions then sum in another order, so the remaining steps
    match an uninterrupted run only to float rounding (~1e-7 in loss on the CPU), not bitwise.
    Other dynamics code (``code_now``, its hash) is said too: the later steps are that code's.
    ``cpu_now``: this session's CPU kernels (torch's ``get_cpu_capability``), passed in so that
    this module imports no torch: `dynamics status` (and the report, through it) uses its checks.
    """
    first = {"device": prior.get("device"), "cpu_capability": prior.get("cpu_capability"),
             "threads": prior.get("config", {}).get("train", {}).get("threads"), "code_hash": prior.get("code_hash")}
    sessions = [(0, first)] + [(r.get("step", 0), r) for r in prior.get("resumes", []) if isinstance(r, dict)]
    # Compared with the session that trained the steps before `start`, the last one to begin
    # before it: one stopped before its first checkpoint kept none, and compared with it a resume
    # on the first session's threads said they changed, and one on its own said nothing.
    last = [session for began, session in sessions if began < start][-1] if start > 0 else sessions[-1][1]
    now = {"train.device": ("device", cfg.train.device), "train.threads": ("threads", cfg.train.threads),
           "CPU kernels": ("cpu_capability", cpu_now)}
    changed = [f"{name} {last.get(k)} -> {v}" for name, (k, v) in now.items()
               if last.get(k) is not None and last[k] != v]
    if changed:
        print(f"dynamics: note: {run_id} resumes at step {start} with {', '.join(changed)}; its later steps will "
              f"match an uninterrupted run only to float rounding (recorded in the run's 'resumes')",
              file=sys.stderr, flush=True)
    # a session of a dynamics that recorded no code_hash: no claim either way
    if (code_before := last.get("code_hash")) is not None and code_before != code_now:
        print(f"dynamics: note: {run_id} resumes at step {start} with other dynamics code than its last session "
              f"(code hash {code_before[:16]}... -> {(code_now or '?')[:16]}...); its later steps are that code's "
              f"(recorded in the run's 'resumes')", file=sys.stderr, flush=True)
