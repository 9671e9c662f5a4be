"""One training run: build, step, record, checkpoint, resume, detect divergence.

The data are a pure function of (config, seed, step) and the learning rate a pure
function of step, so the only state a resume needs is (model, optimiser, step, the
recorder's previous gradients). A checkpoint holding exactly that is written atomically
at every snapshot, *after* the snapshot's arrays, so a run killed at any instant and
started again with the same command re-records the same values into the same places
and ends with arrays identical to an uninterrupted run's.

Snapshot s records the model after s updates together with the gradient of training
batch s at those weights, so per-head gradient norms and gate importances come from the
backward pass training does anyway. It is the raw gradient: update s+1 then (with learned
gates, during warm-up) drops the gates' part and clips the rest to ``train.grad_clip``.

One process trains a run at a time (``store.run_lock``); a resume checks that the config and
the data are the ones the run was recorded with, before anything is written.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import dynamics
from dynamics import allocator, budget, checkpoint, interventions, optim, provenance, store
from dynamics.checkpoint import batch_loss, load_run_model  # noqa: F401  (callers of dynamics.train.load_run_model)
from dynamics.config import ConfigError, RunConfig, check
from dynamics.model import Transformer, require_float32
from dynamics.record import Recorder, chg_fitted, coords, importance_attrs, snapshot_steps, variables
from dynamics.resume import note_execution_change, refuse_other_data, refuse_other_experiment, refuse_unrecorded
from dynamics.schema import FINISHED_STATUSES
from dynamics.signals import deferred_signals
from dynamics.store.writer import EMPTY_CHUNKS_WRITTEN
from dynamics.tasks import data_hash, make_batch

# the hash of the code this process loaded, taken now: at a run's first call, a notebook that
# imported this module and then saved an edit recorded the edited files' hash, not its own code's
provenance.process_code_hash()

Progress = Callable[[int, int, float], None]
"""progress(step, total_steps, last_loss), called every few steps, and with the same step after
each update of a gate fit at a snapshot before the last (record.chg_every). Raising
KeyboardInterrupt from it stops the run as Ctrl-C does."""

OWN_ATTRS = frozenset({
    "run_id", "config", "seed", "version", "code_hash", "torch_version", "device", "cpu_capability", "data_hash",
    "status", "steps_total", "steps_done", "checkpoint_step", "steps_trained", "wall_time", "starts", "resumes",
    "last_loss", "diverged_step", "traceback", "interventions", EMPTY_CHUNKS_WRITTEN})
"""The run attributes training writes itself, which ``train_run(extra_attrs=...)`` may not set."""


@dataclass(frozen=True)
class RunResult:
    run_id: str
    """Id of the run group in the store."""
    status: str
    """completed | diverged | failed | interrupted (or the existing status if skipped)."""
    steps_done: int
    """Optimiser updates completed."""
    skipped: bool = False
    """True when the run was already finished and nothing was trained."""
    resumed_from: int = 0
    """The checkpoint step this start resumed from; 0 for a fresh start."""


class InterruptedAfterFinish(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) held back while a finished run's final status was written: the run is
    whole and finished, as ``result`` says, and the interrupt still stops the caller (a loop
    over runs), which must not call that run resumable."""

    def __init__(self, result: RunResult):
        super().__init__()
        self.result = result


def lr_at(cfg: RunConfig, step: int) -> float:
    """The learning rate of the update made from step ``step``'s gradient (steps 0 .. steps - 1
    update).

    Linear warm-up: step s < warmup_steps gives lr * (s + 1) / warmup_steps, so the first update
    runs at lr / warmup_steps and the one from step warmup_steps - 1 at lr. Then a cosine decay
    from lr at step warmup_steps to min_lr_frac * lr at step train.steps, one past the last
    update, which therefore runs above min_lr_frac * lr. With warmup_steps >= steps every update
    is in the warm-up: the last runs at lr * steps / warmup_steps and nothing decays.

    Example
    -------
    >>> from dynamics.config import from_dict
    >>> cfg = from_dict({"train": {"steps": 10, "lr": 1.0, "warmup_steps": 5}})
    >>> [round(lr_at(cfg, s), 4) for s in range(10)]
    [0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 0.9141, 0.6891, 0.4109, 0.1859]
    """
    tr = cfg.train
    if step < tr.warmup_steps:
        return tr.lr * (step + 1) / tr.warmup_steps
    span = max(1, tr.steps - tr.warmup_steps)
    frac = min(1.0, (step - tr.warmup_steps) / span)
    return tr.lr * (tr.min_lr_frac + (1 - tr.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def gate_reg_weight(cfg: RunConfig, step: int) -> float:
    """Learned gates: fixed for the first 10% of steps, L1 ramped in over the next 60%."""
    if cfg.model.gates != "learned":
        return 0.0
    frac = step / cfg.train.steps
    return cfg.model.gate_l1 * min(1.0, max(0.0, (frac - 0.1) / 0.6))


def gates_held(cfg: RunConfig, step: int) -> bool:
    """Whether the update from step ``step``'s gradient leaves learned gates unchanged: the first
    10% of steps, the same fraction at which :func:`gate_reg_weight`'s ramp starts (an integer
    ``steps // 10`` freed the gates a step early whenever steps is not a multiple of 10)."""
    return cfg.model.gates == "learned" and 10 * step < cfg.train.steps


def make_optimizer(cfg: RunConfig, model: Transformer, extra: list | None = None) -> optim.AdamW | optim.SGD:
    """The run's optimiser over the model's trained parameters and ``extra`` (an intervention's).

    dynamics.optim's, which compute what torch.optim's do without importing torch._dynamo (2 s
    before a run's first update). AdamW is torch's fused kernel: one call over all parameters
    instead of a dozen ops per tensor, which took the optimiser from 6.2% to 1.5% of a
    default-model step on one CPU thread (bench/train.py).
    """
    tr = cfg.train
    params = model.optim_parameters() + list(extra or [])
    if tr.optimizer == "sgd":
        return optim.SGD(params, lr=tr.lr, momentum=tr.beta1, weight_decay=tr.weight_decay)
    return optim.AdamW(params, lr=tr.lr, betas=(tr.beta1, tr.beta2), weight_decay=tr.weight_decay)


def grad_holders(model: Transformer, trained: list) -> list:
    """Every tensor whose ``.grad`` a training step sets, once each: the model's parameters (its
    fixed gates, outside the optimiser, too) and ``trained`` (an intervention's own).

    A step sets their grads to None in one loop over this list, made once per run, where
    optimizer.zero_grad and model.zero_grad walked the param groups and the module tree: 0.20 ms
    a default step on one CPU thread, against 0.02 (about 0.7% of that step, 2% of one at batch 8).
    """
    return list({id(p): p for p in [*model.parameters(), *trained]}.values())


def build(cfg: RunConfig, device: torch.device) -> Transformer:
    """The model at initialisation: deterministic in train.seed (the weights torch.manual_seed gave)."""
    # A generator of its own: torch's is shared by the process's threads, two runs built at once mixed streams
    return Transformer(cfg.model, generator=torch.Generator().manual_seed(cfg.train.seed)).to(device)


class _Writer:
    """Runs store writes and checkpoint saves in order on one background thread.

    Keeps zarr compression and disk I/O off the training thread; the order (arrays, then
    losses, then checkpoint) is what makes a kill at any moment resumable. So once a job
    fails, every job queued after it is dropped: a checkpoint saved past a failed write would
    make a resume skip the data that write lost.
    """

    def __init__(self, writer: store.RunWriter):
        self.writer = writer
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dynamics-writer")
        self.pending: list[Future] = []
        self.failed = False

    def _run(self, fn, *args) -> None:
        if self.failed:
            raise RuntimeError("not run: an earlier store write failed")
        try:
            fn(*args)
        except BaseException:
            self.failed = True
            raise

    MAX_PENDING = 32
    """Jobs queued at most (a snapshot is a few): past it, training waits for the oldest. At a
    cadence the writer cannot keep up with (``record.every = 1``) the queue, and the snapshots
    it holds, grew without bound: 180 jobs and 65 kB a step on the quickstart model."""

    def submit(self, fn, *args) -> None:
        self.pending.append(self.pool.submit(self._run, fn, *args))
        while len(self.pending) > self.MAX_PENDING:
            self.pending.pop(0).result()  # in order: the oldest finishes first
        # Surface write errors promptly, oldest first and no further than the first job not done:
        # jobs finish in order, and a look over all of them could find a later job ("not run: an
        # earlier store write failed") done and the failed one not yet, naming the wrong error.
        while self.pending and self.pending[0].done():
            self.pending.pop(0).result()

    def drain(self) -> None:
        for f in self.pending:
            f.result()
        self.pending.clear()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self.pool.shutdown(wait=True)


def _save_checkpoint(path: str, run_id: str, state: dict, attrs_writer: store.RunWriter, step: int,
                     steps_trained: int, wall_time: float) -> None:
    # steps_trained and wall_time with each checkpoint, so a session killed outright (SIGKILL)
    # still counts its steps and time up to it; in the checkpoint too, since a kill between the
    # two writes left the attrs at the checkpoint before, and a resume counting from them alone
    # lost the steps between the two (180 of 200 steps trained, in CI)
    store.write_checkpoint(path, run_id, checkpoint.checkpoint_bytes(
        state | {"steps_trained": steps_trained, "wall_time": wall_time}))
    attrs_writer.set_attrs(checkpoint_step=step, steps_trained=steps_trained, wall_time=wall_time)


def traceback_recorded(attrs: dict, error: BaseException) -> bool:
    """Whether a run's attributes hold the traceback of ``error``: a full disk, or a store deleted
    mid-run, may have left none, or only an earlier session's, so a failure can say where its
    traceback is (`dynamics run`, a sweep's summary)."""
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    return str(attrs.get("traceback") or "").strip().endswith(last)


def _record_setup_failure(cfg: RunConfig, path: str, run_id: str, existing: bool, attrs: dict, tb: str) -> None:
    if existing:
        store.update_run_attrs(path, run_id, status="failed", traceback=tb)
        return
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    with store.RunWriter(path, run_id, variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                         attrs=attrs | {"status": "failed", "traceback": tb, "steps_done": 0}):
        pass


def train_run(
    cfg: RunConfig,
    path: str,
    run_id: str | None = None,
    *,
    progress: Progress | None = None,
    extra_attrs: dict | None = None,
    recording: bool = True,
    started: Callable[[int], None] | None = None,
    before_create: Callable[[], None] | None = None,
) -> RunResult:
    """Train one run into the store at ``path``, resuming it if it was interrupted.

    Parameters
    ----------
    cfg : RunConfig
        The configuration; checked first (`dynamics.config.check`), so one built in code with
        a wrong type or value is refused before anything is written.
    path : str
        Store path (created if missing; refused if it exists and is not a store).
    run_id : str, optional
        Group name under runs/; defaults to ``cfg.run_id()``.
    progress : callable, optional
        ``progress(step, steps, loss)`` (:data:`Progress`).
    extra_attrs : dict, optional
        Extra JSON-able run attributes (e.g. the swept values); not one training writes itself
        (`OWN_ATTRS`: ConfigError).
    recording : bool
        False skips every snapshot after step 0 (no attention, gradients or checkpoints are
        recorded); only bench/ uses it, to measure what recording costs. The loss curve is written
        at snapshots, so it stays NaN after step 0, and the run, marked completed, keeps only its
        step-0 checkpoint (`load_run_model` gives the initial model): a store for timing alone.
    started : callable, optional
        ``started(step)``, once, as training begins at ``step`` (0, or a resume's checkpoint):
        after every refusal and before the first snapshot, so what it says comes before the
        first step's work (a CHG fit at step 0 included) and never with a refusal.
    before_create : callable, optional
        Called under the store's lock just before a new run's group is made
        (``store.RunWriter``); what it raises propagates with nothing written. Not called on a
        resume. ``dynamics run`` and a sweep's points check there for a twin another process
        recorded meanwhile (`dynamics.sweep.twins.twin_guard`).

    Returns
    -------
    RunResult
        A completed (or diverged) run of the same config is not retrained: ``skipped`` is True
        and nothing is written but, where a kill left it stale, its root-index entry
        (``store.refresh_index``).

    Raises
    ------
    StoreError
        Before anything is trained or written: the run exists with another config or was
        recorded on other data, its checkpoint is damaged, or another process is training it now.
    ConfigError
        Before anything is written: a field of ``cfg`` of the wrong type or value; an
        ``extra_attrs`` key of `OWN_ATTRS`; the run, unless finished, cannot fit in memory
        (dynamics.budget).
    RuntimeError
        Before anything is written: torch's default dtype is not float32 (dynamics.model.require_float32).
    """
    check(cfg)
    if clash := sorted(OWN_ATTRS.intersection(extra_attrs or {})):
        # stored over the run's own, a config or seed that was not trained made the run unloadable
        raise ConfigError(f"extra_attrs: {', '.join(clash)} are attributes training writes itself; name them otherwise")
    run_id = run_id or cfg.run_id()
    require_float32()
    budget.check_fits(cfg, lambda: store.is_finished(path, run_id))  # here, where it trains; finished: skipped below
    interventions.check_output(cfg, path)  # before the store is made: a refusal leaves nothing behind
    if not store.is_finished(path, run_id):  # a finished run is skipped: its teacher is not read
        interventions.check(cfg)  # the teacher found, finished and loadable, as `dynamics run` checks it
    store.init_store(path)
    # A finished run stays finished: skipped without the lock, so read-only stores work too.
    # Refusals come before the lock too: taking it rewrites the lock file's holder, and a
    # refused command leaves the store as it found it. Both are decided again under the lock,
    # where the attrs are read again.
    # another run's damaged group is no reason to refuse this one (a damaged run_id: run_attrs names it)
    prior = store.run_attrs(path, run_id) if store.run_listed(path, run_id) else {}
    refuse_other_experiment(prior, cfg, path, run_id)
    if prior.get("status") in FINISHED_STATUSES:
        interventions.distill.refuse_other_teacher(prior, cfg, path, run_id)
        store.refresh_index(path, [run_id])  # a kill after its last attrs left plain xarray's view stale
        return _skipped(run_id, prior)
    hash_now = data_hash(cfg)
    refuse_other_data(prior, cfg, path, run_id, hash_now)
    if prior:  # damaged, lost or another model's: StoreError, here before the lock as well
        ckpt = checkpoint.load_checkpoint(path, run_id)
        store.check_checkpoint_kept(path, run_id, prior, present=ckpt is not None)
        if ckpt is not None:
            checkpoint.check_fits(ckpt, cfg, path, run_id)
            del ckpt  # loaded again under the lock, where it may have changed
    else:  # no group: a checkpoint left there is a run whose group went, not to be written over
        store.check_checkpoint_kept(path, run_id, prior)
    # a caller's no_grad or inference_mode (thread-local) would fail the run at its first backward
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode(False), torch.enable_grad(), store.run_lock(path, run_id):
            return _train_locked(cfg, path, run_id, progress, extra_attrs, recording, hash_now, started, before_create)
    finally:  # train.threads is the run's: a notebook's later torch work ran on 1 thread after it
        torch.set_num_threads(threads)


def _skipped(run_id: str, attrs: dict) -> RunResult:
    return RunResult(run_id, attrs["status"], int(attrs.get("steps_done", 0)), skipped=True)


PROVENANCE_KEYS = ("version", "code_hash", "torch_version", "device", "cpu_capability", "data_hash")
"""Run attrs that describe where and with what a run was first started; a resume keeps them
and appends its own to the ``resumes`` list. ``code_hash`` is the hash of the dynamics source
that trains (:func:`dynamics.provenance.process_code_hash`): ``version`` stays one release while the code
changes. ``cpu_capability`` is the vector instruction set
torch's CPU kernels dispatch to (AVX2, AVX512, ...): another one rounds differently, so it is
what a bitwise comparison of two machines' runs must match (bench/rounding.py measures how far
apart they end)."""


def _train_locked(cfg: RunConfig, path: str, run_id: str, progress: Progress | None, extra_attrs: dict | None,
                  recording: bool, hash_now: str, started: Callable[[int], None] | None,
                  before_create: Callable[[], None] | None = None) -> RunResult:
    existing = store.run_listed(path, run_id)
    prior = store.run_attrs(path, run_id) if existing else {}
    # another process may have started or finished the run since train_run looked
    refuse_other_experiment(prior, cfg, path, run_id)
    if prior.get("status") in FINISHED_STATUSES:
        interventions.distill.refuse_other_teacher(prior, cfg, path, run_id)
        return _skipped(run_id, prior)
    refuse_other_data(prior, cfg, path, run_id, hash_now)

    base_attrs = {
        "run_id": run_id,
        "config": cfg.to_dict(),
        "seed": cfg.train.seed,
        "version": dynamics.__version__,
        "code_hash": provenance.process_code_hash(),
        "torch_version": torch.__version__,
        "device": cfg.train.device,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "data_hash": hash_now,
        "status": "running",
        "steps_total": cfg.train.steps,
    }
    base_attrs.update(extra_attrs or {})
    # Read before anything is written: a damaged checkpoint is refused (StoreError naming it), where
    # inside the try below it was recorded as the run failing, its status rewritten
    ckpt = checkpoint.load_checkpoint(path, run_id) if existing else None
    store.check_checkpoint_kept(path, run_id, prior, present=ckpt is not None if existing else None)
    try:
        device = torch.device(cfg.train.device)
        if device.type == "cpu":
            torch.set_num_threads(cfg.train.threads)
            allocator.keep_freed_memory()  # else each step page-faults its buffers in again
        steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
        index_of = {int(s): i for i, s in enumerate(steps_at)}
        fitted = chg_fitted(cfg, steps_at)
        model = build(cfg, device)
        intervention = interventions.build(cfg, model, device)
        if intervention is not None:  # the options as resolved (the teacher run, say), beside the table as written
            base_attrs["interventions"] = intervention.describe()
        trained = model.optim_parameters() + (intervention.parameters() if intervention else [])
        holders = grad_holders(model, trained)
        optimizer = make_optimizer(cfg, model, intervention.parameters() if intervention else None)
        recorder = Recorder(cfg, device)

        start = 0
        if ckpt is not None:
            with checkpoint.fitting(path, run_id):  # a device's own error stays outside it: not the checkpoint's
                model.load_state_dict(ckpt["model"])
                optimizer.load_state_dict(ckpt["optimizer"])
                prev = ckpt["prev_grads"]  # loaded on the CPU (see checkpoint.load_checkpoint)
                if intervention is not None:
                    intervention.load_state_dict(ckpt["intervention"])
            recorder.prev_grads = None if prev is None else prev.to(device)
            start = int(ckpt["step"])
        base_attrs |= importance_attrs(start, prior)  # a run begun before the per-sequence form keeps its own
        per_sequence = "importance_form" in base_attrs
    except (ConfigError, store.StoreError):
        # a refusal, not a failure of this run: its teacher changed or was damaged since the
        # checks, or a resume names another teacher than its checkpoint's; the run stays as it was
        raise
    except Exception:  # a run that cannot even start is still recorded, as failed
        _record_setup_failure(cfg, path, run_id, existing, base_attrs, traceback.format_exc())
        raise
    if start:
        refuse_unrecorded(path, run_id, steps_at, start)
    if ckpt is not None:  # after that refusal: a note, then the error, was two lines where bad input gets one
        note_execution_change(run_id, prior, cfg, start, base_attrs["code_hash"], base_attrs["cpu_capability"])
    recorded = variables(cfg, len(steps_at)) | (intervention.variables(len(steps_at)) if intervention else {})
    if existing:  # the first start's provenance stays; each resume adds its own
        this_start = {k: base_attrs[k] for k in PROVENANCE_KEYS} | {"step": start, "threads": cfg.train.threads}
        start_attrs = {k: v for k, v in base_attrs.items() if k not in PROVENANCE_KEYS}
        # The first start's config too: it differs from this one only in execution keys (device,
        # threads; the same run id), and this start's are in its resume entry. Overwritten, the
        # threads the first session ran on were recorded nowhere.
        if isinstance(prior.get("config"), dict):
            start_attrs["config"] = prior["config"]
        if prior.get("traceback"):
            # The failure this start recovers from moves into its resume entry: a run that then
            # completes must not still show a traceback as if it had failed.
            this_start["after"] = {"status": prior.get("status"), "traceback": prior["traceback"]}
            start_attrs["traceback"] = None
        start_attrs["resumes"] = [*prior.get("resumes", []), this_start]
        # As steps_done below: the last session's loss, at a step this one redoes, would stand in
        # `dynamics status` as this session's, and stay there if it is killed
        start_attrs["last_loss"] = None
    else:
        start_attrs = base_attrs
    # steps_done restarts at the checkpoint: the last session's count would stand for this one's
    # progress in `dynamics status` until it passed it
    # By earlier sessions: the larger of the attrs' count (which holds a tail trained past the
    # checkpoint by a session that ended) and the checkpoint's own (newer than the attrs' when a
    # kill fell between writing the one and the other; absent from older versions' checkpoints)
    trained_before = max(int(prior.get("steps_trained", 0)), int((ckpt or {}).get("steps_trained", 0)))
    start_attrs |= {"starts": int(prior.get("starts", 0)) + 1, "steps_trained": trained_before, "steps_done": start}
    if ckpt is not None:  # the attrs may name an older checkpoint than the one resumed from (as above)
        start_attrs["checkpoint_step"] = start
    writer = None
    try:
        # Created whole: a Ctrl-C amid its many writes left a half-made group marked "running"
        # and zarr coroutines never awaited. Held back, the interrupt lands as the hold ends.
        with deferred_signals():
            writer = store.RunWriter(path, run_id, variables=recorded, coords=coords(cfg, steps_at),
                                     attrs=start_attrs, resume=existing, before_create=before_create)
            writer.write_region("probe_tokens", 0, recorder.probe_tokens)
    except KeyboardInterrupt:
        if writer is not None:
            with deferred_signals():
                writer.set_attrs(status="interrupted")
                writer.finalize()
        raise

    bg = _Writer(writer)
    losses = np.full(cfg.train.steps, np.nan, dtype=np.float32)
    flushed = start
    t0 = time.perf_counter()
    wall_before = max(float(prior.get("wall_time", 0.0)), float((ckpt or {}).get("wall_time", 0.0)))
    # Updates applied, counted as each lands: the loop's `step` is one short of them from the
    # optimiser step to the next iteration, where a Ctrl-C in the progress callback arrives.
    updates, last_loss = start, float("nan")

    def finish(status: str, **attrs) -> RunResult:
        raise_after: BaseException | None = None
        try:
            bg.close()
        except KeyboardInterrupt as e:  # Ctrl-C / SIGTERM while the last writes drain
            if status in FINISHED_STATUSES:  # not all landed: a resume redoes them
                status, attrs, raise_after = "interrupted", {}, e
        except BaseException as e:  # a background write failed: the run is not whole, say so
            note = traceback.format_exc()
            if status in FINISHED_STATUSES:
                status, attrs, raise_after = "failed", {"traceback": note}, e
            elif status == "interrupted":
                attrs = attrs | {"traceback": note}
            # "failed" already holds the traceback that stopped the loop, often this very error
        done = updates
        final = {"status": status, "steps_done": done,
                 "last_loss": last_loss if math.isfinite(last_loss) else None,
                 "steps_trained": trained_before + max(0, done - start),
                 "wall_time": wall_before + time.perf_counter() - t0}
        result = RunResult(run_id, status, done, resumed_from=start)
        try:
            with deferred_signals():  # an interrupt here would leave the run marked "running"
                writer.set_attrs(**(final | attrs))
                writer.finalize()
        except KeyboardInterrupt as e:  # held back, delivered once the status is on disk
            if raise_after is None and status in FINISHED_STATUSES:
                raise InterruptedAfterFinish(result) from e
            raise
        if raise_after is not None:
            raise raise_after
        return result

    outcome: tuple[str, dict] = ("completed", {})
    try:
        if started is not None:
            started(start)
        for step in range(start, cfg.train.steps + 1):
            batch = make_batch(cfg, "train", step, cfg.train.batch_size)
            tokens = torch.from_numpy(batch.tokens).to(device)  # (B, T+1)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(cfg, step)
            for p in holders:
                p.grad = None
            snapshot = step in index_of and (recording or step == 0)
            xi = Recorder.sequence_gates(model, tokens.shape[0]) if snapshot and per_sequence else None  # (B, L, H)
            with model.hooks(intervention.fwd_hooks()) if intervention is not None else contextlib.nullcontext():
                logits = model(tokens[:, :-1], head_gates=xi)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            reg = gate_reg_weight(cfg, step)
            objective = loss + reg * model.gate_l1() if reg else loss
            if intervention is not None:
                objective = objective + intervention.loss(step, tokens, logits)
            objective.backward()
            last_loss = loss.item()

            if snapshot:
                # The checkpoint is the state *before* this snapshot is recorded, so a resume
                # from it records the snapshot again exactly (prev_grads included).
                state = checkpoint.checkpoint_state(model, optimizer, step, recorder.prev_grads, intervention)
                # Record what the intervened model computes (hard templates, conditioned gates):
                # its snapshot, and CHG fitted to that network rather than to the bare weights.
                with model.hooks(intervention.eval_hooks() if intervention is not None else []):
                    blocks = recorder.snapshot(model, None if xi is None else xi.grad)
                    if cfg.record.chg_every:
                        # A fit takes seconds: a sweep's stop, read in the progress callback, went
                        # unseen until it ended (7-10 s). The last step's is left alone: at the
                        # total, a callback says the run is done (a bar closes).
                        during = (None if progress is None or step >= cfg.train.steps else
                                  lambda *_: progress(step, cfg.train.steps, last_loss))  # noqa: B023 - called now
                        blocks |= recorder.chg(model, bool(fitted[index_of[step]]), during)
                if intervention is not None:
                    blocks |= intervention.snapshot(model, recorder.probe_tokens)
                bg.submit(writer.write_snapshot, index_of[step], blocks)
                if step > flushed:
                    bg.submit(writer.write_region, "loss", flushed, losses[flushed:step].copy())
                    flushed = step
                bg.submit(_save_checkpoint, path, run_id, state, writer, step, trained_before + step - start,
                          wall_before + time.perf_counter() - t0)
            if not math.isfinite(last_loss):
                bg.submit(writer.write_region, "loss", flushed, losses[flushed:step].copy())
                outcome = ("diverged", {"diverged_step": step})
                break
            if step == cfg.train.steps:
                break
            losses[step] = last_loss
            if gates_held(cfg, step):
                for block in model.blocks:
                    block.attn.gate_logit.grad = None  # gates held fixed during warm-up
            grads = [p.grad for p in trained if p.grad is not None]
            # One fused pass gives both the divergence check and the clipping norm.
            norm = torch.nn.utils.get_total_norm(grads) if grads else None
            if norm is not None and not torch.isfinite(norm):
                # A finite loss with a non-finite gradient: applying it would make the weights NaN
                # and the next step's loss NaN, naming the step after the one that broke training.
                # A finite gradient whose norm overflows float32 lands here too: clipping would scale
                # it to zero, and unclipped it would leave AdamW's second moment inf (weights frozen).
                bg.submit(writer.write_region, "loss", flushed, losses[flushed:step + 1].copy())
                outcome = ("diverged", {"diverged_step": step})
                break
            if cfg.train.grad_clip and norm is not None:
                # what clip_grad_norm_ does, with the norm already taken
                torch.nn.utils.clip_grads_with_norm_(trained, cfg.train.grad_clip, norm)
            optimizer.step()
            updates = step + 1
            if progress is not None and (step % 10 == 0):
                progress(step, cfg.train.steps, last_loss)
        if progress is not None and outcome[0] == "completed":
            progress(cfg.train.steps, cfg.train.steps, last_loss)
    except KeyboardInterrupt:
        finish("interrupted")
        raise
    except BaseException:
        finish("failed", traceback=traceback.format_exc())
        raise
    # Outside the try: if the last writes fail here, finish records "failed" itself.
    return finish(outcome[0], **outcome[1])


def set_threads(n: int | None) -> None:
    """Limit torch's intra-op threads, and OpenMP's in processes started after it (the tests and
    bench/sweep.py use 1; a run itself sets ``train.threads`` while it trains)."""
    if n:
        torch.set_num_threads(n)
        os.environ["OMP_NUM_THREADS"] = str(n)
