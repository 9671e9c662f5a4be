"""Will a run fit in memory? A lower bound on its peak, checked before any work.

Sizes other than the model's weights (batch, context, vocabulary, probe count, eval rows, steps,
snapshot count) have no bound of their own in :mod:`dynamics.config`: a mistyped one
(``train.batch_size = 100000000``) passed validation, made the store and a run group, and the
run failed tens of seconds later with a MemoryError (or, with overcommit, pushed the machine
into swap). :func:`check_memory` refuses such a config as one line, before anything is made.

The estimate counts only arrays a run cannot do without, at the moment of its largest phase,
so it stays *below* the real peak (1.22 times it above the baseline of importing torch, where an
evaluation's logits set an estimate of 514.9 MiB and it is nearly all there is; README's
Configs gives the command): it refuses what cannot possibly fit, never a run that would. A finished run is let through (it is skipped). What it counts, in bytes:

- state, held throughout: float32 weights, their gradients and the optimiser's moments (two for
  AdamW, one for SGD with momentum), the previous snapshot's per-head gradients, the loss curve
  (4 per step), the probe, eval and pooled training tokens (int64; on a GPU the pool stays in
  the machine's memory);
- a training step: its int64 tokens, and the activations autograd keeps for the backward pass
  (per layer the LayerNorm output, q/k/v, z and the MLP's two hidden layers; the logits and
  their log-softmax);
- an evaluation: the logits and log-softmax of ``eval_batches * eval_batch_size`` rows;
- an attention snapshot: the probe's L x H x n_probe x T x T maps, cached in float32, stacked
  in float32 and converted to ``record.attention_dtype``;
- the snapshot schedule, held as an array and a dict from step to snapshot (see
  ``SCHEDULE_HELD``). Building it before training (a set, a list and an array) takes less than
  holding it does, before anything else is held, so it never sets the peak and is not counted.

Pure functions of the config and this module's imports only: no torch, no zarr.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dynamics.config import ConfigError, RunConfig

GIB = 2**30

MEMORY_ENV = "DYNAMICS_MEMORY_GB"
"""Environment variable that replaces the memory a run is checked against (in GB of 10^9
bytes): a lower figure for a machine shared with other work, a higher one to go past the check
(swap, or a machine whose reported memory is wrong)."""


class DoesNotFit(ConfigError):
    """The run cannot fit. Apart from other ConfigErrors (a bad ``DYNAMICS_MEMORY_GB``) so that a
    caller can let a finished run through (it is skipped and needs no memory) and a sweep names
    the point only when the point is the problem."""


@dataclass(frozen=True)
class Estimate:
    """A lower bound on a run's peak memory, by part and phase, in bytes."""

    held: dict[str, int]
    """Held for the whole run, by what holds it (keys of ``_KEYS``)."""
    phases: dict[str, int]
    """Largest transient of each phase, on top of ``held``; the phases do not overlap."""

    @property
    def state(self) -> int:
        return sum(self.held.values())

    @property
    def peak(self) -> int:
        return self.state + max(self.phases.values())

    @property
    def phase(self) -> str:
        """The phase that sets the peak."""
        return max(self.phases, key=self.phases.__getitem__)

    @property
    def largest(self) -> str:
        """The largest single part of the peak: its phase, or a part held throughout (whose keys
        to lower: a huge pool is not made smaller by a smaller batch)."""
        phase = self.phase
        part = max(self.held, key=self.held.__getitem__)
        return part if self.held[part] > self.phases[phase] else phase


# Bytes per snapshot of the schedule held, measured 110 (record.snapshot_steps, train's index_of)
# at 5 million snapshots; counted here as the least CPython can take: the array entry (8) and the
# index's dict entry (24), key and value ints (56). Ints up to 256 are shared, which matters only
# for schedules too short to count. Building it was measured at 75, and is at least 60 (a set
# slot, an int, a list slot and the array entry), below this: it never sets the peak.
SCHEDULE_HELD = 88


def snapshot_steps(steps: int, dense_until: int, every: int) -> np.ndarray:
    """Steps at which snapshots are taken.

    Step 0 (initialisation), then geometrically 1, 2, 4, ... up to ``dense_until``, then
    every ``every`` steps (the multiples of ``every`` past the last power of two), and always
    the last step ``steps`` (the state after all updates).

    Parameters
    ----------
    steps : int
        Number of optimiser updates in the run.
    dense_until : int
        Last step of the geometric (dense) phase.
    every : int
        Cadence after the dense phase.

    Returns
    -------
    numpy.ndarray of int64, sorted and unique.

    Example
    -------
    >>> snapshot_steps(1000, 64, 250).tolist()
    [0, 1, 2, 4, 8, 16, 32, 64, 250, 500, 750, 1000]
    """
    out = {0, steps}
    s = 1
    while s <= min(dense_until, steps):
        out.add(s)
        s *= 2
    # The cadence starts where the powers of two stop, not at dense_until itself: with
    # dense_until 1000 and every 100, steps 600..1000 would otherwise go unrecorded.
    last_dense = s // 2  # 0 when there is no dense phase
    out.update(x for x in range(every, steps + 1, every) if x > last_dense)
    return np.array(sorted(out), dtype=np.int64)


def n_snapshots(steps: int, dense_until: int, every: int) -> int:
    """``len(snapshot_steps(steps, dense_until, every))``, counted without building it."""
    powers, s = 0, 1
    while s <= min(dense_until, steps):
        powers, s = powers + 1, s * 2
    last_dense = s // 2
    multiples = steps // every - last_dense // every  # multiples of `every` in (last_dense, steps]
    # 0 and `steps` are always taken; `steps` may already be a power or a multiple
    steps_counted = (steps & (steps - 1) == 0 and steps <= dense_until) or (steps % every == 0 and steps > last_dense)
    return 1 + powers + multiples + (0 if steps_counted else 1)


def estimate(cfg: RunConfig, part: str = "all") -> Estimate:
    """Lower bound on the memory a run of ``cfg`` needs at its peak (see the module docstring).

    Parameters
    ----------
    cfg : RunConfig
        A validated config.
    part : str
        ``all``: everything, for a run on the CPU. For a run on a GPU, ``device``: what lives
        on it (all but the loss curve and the schedule), or ``host``: what lives in the
        machine's memory (the tokens, drawn there, the loss curve, the schedule, and each
        attention snapshot copied out in float32 and converted).

    Returns
    -------
    Estimate

    Example
    -------
    >>> from dynamics.config import RunConfig
    >>> estimate(RunConfig()).peak < 100 * 2**20
    True
    """
    m, tr, r = cfg.model, cfg.train, cfg.record
    L, H, dh, d, T, V = m.n_layers, m.n_heads, m.head_dim, m.d_model, m.context, m.vocab_size
    mlp = 0 if m.attn_only else m.d_mlp
    moments = 2 if tr.optimizer == "adamw" else (1 if tr.beta1 > 0 else 0)
    eval_rows = tr.eval_batches * r.eval_batch_size
    row = 8 * (T + 1)  # one int64 token row
    itemsize = 2 if r.attention_dtype == "float16" else 4
    maps = L * H * r.n_probe * T * T
    snapshots = n_snapshots(tr.steps, r.dense_until, r.every)
    curve = {"the loss curve and snapshot schedule": 4 * tr.steps + SCHEDULE_HELD * snapshots}
    if part == "host":
        # the probe stays here (its tokens are written to the store) and the pool is drawn from here
        return Estimate(curve | {"the tokens": row * (r.n_probe + cfg.task.pool_size)},
                        {"a training step": row * tr.batch_size, "an attention snapshot": (4 + itemsize) * maps})
    model = (4 * m.weight_entries * (2 + moments)
             + 4 * 4 * L * H * d * dh)  # the previous snapshot's W_Q/W_K/W_V/W_O gradients
    # the probe and eval batches move to the run's device; the pool does not (only its batches do)
    tokens = row * (r.n_probe + len(cfg.task.component_names) * eval_rows + (cfg.task.pool_size if part == "all" else 0))
    per_position = L * (2 * d + 4 * H * dh + 2 * mlp) + 2 * V  # float32 values autograd keeps per token
    phases = {
        "a training step": tr.batch_size * (row + 4 * T * per_position),
        "an evaluation": 4 * eval_rows * T * 2 * V,
        # cached, then stacked, in float32; on the CPU the conversion to the stored dtype joins them
        "an attention snapshot": (8 + (itemsize if part == "all" else 0)) * maps,
    }
    held = {"the model": model, "the tokens": tokens}
    if part == "device":
        return Estimate(held, phases)
    return Estimate(held | curve, phases)


def machine_memory() -> int | None:
    """Bytes of memory a run may use here: ``DYNAMICS_MEMORY_GB`` if set (empty is unset), else
    the physical memory (``os.sysconf``), lowered to a cgroup limit (:func:`cgroup_limit`); None
    if unknown."""
    given = os.environ.get(MEMORY_ENV, "").strip()
    if given:
        try:
            gb = float(given)
        except ValueError:
            gb = float("nan")
        if not gb > 0 or gb == float("inf"):
            raise ConfigError(f"{MEMORY_ENV}={given!r}: expected a positive number of GB")
        return int(gb * 1e9)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform
        return None
    limit = cgroup_limit()
    total = min(total, limit) if limit else total
    return total if total > 0 else None


def cgroup_limit(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> int | None:
    """The lowest memory limit of this process's cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), read where a container shows it (the mount's root) and where a
    host shows it (the process's own group, from ``proc``); None where none is set or readable.

    v2 writes "max" for no limit, v1 a number past any memory: both leave the physical memory.
    """
    own = {}  # hierarchy ("" for v2) -> this process's group path in it
    try:
        with open(proc, encoding="ascii") as f:
            for line in f:
                _, controllers, group = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    own[c] = group.strip("/")
    except (OSError, ValueError):  # no /proc, or a line not hierarchy:controllers:path
        pass
    found = []
    for hierarchy, name in (("", "memory.max"), ("memory", "memory.limit_in_bytes")):
        base = os.path.join(root, hierarchy)
        for group in {"", own.get(hierarchy, "")}:
            try:
                with open(os.path.join(base, group, name), encoding="ascii") as f:
                    value = f.read().strip()
            except OSError:
                continue
            if value.isdigit() and int(value) > 0:
                found.append(int(value))
    return min(found, default=None)


def gpu_memory(device: str) -> int | None:
    """Total memory of a CUDA ``device`` (torch is imported only then), None for the CPU or a
    device this torch cannot see (refused elsewhere: usage.check_device, or the run's setup).

    The total, not ``torch.cuda.mem_get_info``'s free memory: what another process holds now may
    be gone when the run starts, and asking for it would make a CUDA context in this process."""
    if not device.startswith("cuda"):
        return None
    import torch

    index = int(device.partition(":")[2] or 0)
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    return int(torch.cuda.get_device_properties(index).total_memory)


def _size(n: int, digits: int = 1) -> str:
    return f"{n / GIB:,.{digits}f} GiB" if n >= GIB / 10 else f"{n / 2**20:,.{digits}f} MiB"


def _apart(need: int, have: int) -> tuple[str, str]:
    """``need`` and ``have`` as sizes that read apart: at one decimal each, a need just above
    what is there read "needs at least 16.0 GiB ..., more than the 16.0 GiB this machine has"."""
    for digits in (1, 2, 3):
        a, b = _size(need, digits), _size(have, digits)
        if a != b:
            return a, b
    return f"{need:,} bytes", f"{have:,} bytes"


_KEYS = {
    "the model": "model.d_model, model.n_layers, model.d_mlp or model.vocab_size",
    "the tokens": "task.pool_size, record.n_probe, record.eval_batch_size or train.eval_batches",
    "the loss curve and snapshot schedule": "train.steps or record.every",
    "a training step": "train.batch_size, model.context, model.vocab_size, model.d_model, model.d_mlp or model.n_layers",
    "an evaluation": "train.eval_batches, record.eval_batch_size, model.context or model.vocab_size",
    "an attention snapshot": "record.n_probe or model.context",
}


def check_memory(cfg: RunConfig, available: int | None = None, *, part: str = "all",
                 where: str = "this machine has") -> None:
    """Raise ConfigError (one line) when ``cfg`` cannot fit in ``available`` bytes.

    Parameters
    ----------
    cfg : RunConfig
        A validated config.
    available : int, optional
        Bytes the run may use; default :func:`machine_memory` (nothing is checked if unknown).
    part : str
        Which memory ``available`` is: see :func:`estimate`.
    where : str
        Says whose memory ``available`` is, in the message.

    Raises
    ------
    DoesNotFit
        Naming the estimate, the phase that sets it, the keys that size its largest part, and how
        to go around it.
    ConfigError
        A bad ``DYNAMICS_MEMORY_GB``.

    Example
    -------
    >>> from dynamics.config import RunConfig, replace_section
    >>> check_memory(replace_section(RunConfig(), "train", batch_size=10**8), 2**34)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dynamics.budget.DoesNotFit: config needs at least 45,824.8 GiB of memory (... for a training step), ...
    """
    if available is None:
        available = machine_memory()
        if available is None:
            return
        if os.environ.get(MEMORY_ENV, "").strip():
            where = f"{MEMORY_ENV} allows"
    est = estimate(cfg, part)
    if est.peak <= available:
        return
    phase, largest = est.phase, est.largest
    if est.state > available:  # what is held alone does not fit: a smaller batch or context cannot help
        largest = max(est.held, key=est.held.__getitem__)
    most = f", {_size(est.held[largest])} of it for {largest}," if largest in est.held else ""
    parts = f"{_size(est.state)} held throughout{most} + {_size(est.peak - est.state)} for {phase}"
    need, have = _apart(est.peak, available)
    raise DoesNotFit(
        f"config needs at least {need} of memory ({parts}), more than the {have} {where}: "
        f"lower {_KEYS[largest]}, or set {MEMORY_ENV} to the GB a run may use "
        f"(the estimate counts only what no run can do without: dynamics/budget.py)")


def workers_that_fit(cfgs: Sequence[RunConfig], wanted: int, available: int | None = None) -> tuple[int, str | None]:
    """How many of ``wanted`` local workers may train the runs of ``cfgs`` side by side: the most,
    k, for which k times the largest run's estimate fits in ``available`` bytes (default
    :func:`machine_memory`), and, for runs on a GPU, k times the largest one's device estimate in
    that GPU's memory (every local worker uses it); at least 1 (each run fits alone: `check_fits`).
    And a note where k is fewer than ``wanted``, else None.

    Each point was checked alone: two runs of 5 GiB each passed on a 6 GB machine, and ran at
    once. The local cluster sets no memory limit of its own (`sweep.launcher.local_cluster`): Dask's
    even share, and its restart of a worker past 95% of it, would stop a run this lets through.

    >>> from dynamics.config import RunConfig
    >>> peak = estimate(RunConfig()).peak
    >>> workers_that_fit([RunConfig()] * 4, 4, available=2 * peak + 1)[0]
    2
    """
    if wanted <= 1 or not cfgs:
        return wanted, None
    given = bool(os.environ.get(MEMORY_ENV, "").strip())
    where = f"{MEMORY_ENV} allows" if given else "this machine has"
    limits = []  # (bytes there, the largest run's need there, how many runs use it, whose memory)
    host = machine_memory() if available is None else available
    if host is not None:
        limits.append((host, max(estimate(c, "all" if c.train.device == "cpu" else "host").peak for c in cfgs),
                       len(cfgs), where if available is None else "this machine has"))
    for device in sorted({c.train.device for c in cfgs} - {"cpu"}):
        gpu = machine_memory() if given else gpu_memory(device)
        on = [c for c in cfgs if c.train.device == device]
        if gpu is not None:
            limits.append((gpu, max(estimate(c, "device").peak for c in on), len(on),
                           where if given else f"the GPU ({device}) has"))
    k, note = wanted, None
    for have, largest, users, whose in limits:
        # at most `users` of the workers run there at once: the CPU runs of a mixed grid leave the GPU alone
        fit = wanted if min(wanted, users) * largest <= have else int(max(1, min(wanted, have // max(largest, 1))))
        if fit < k:
            need, there = _apart(wanted * largest, have)
            k, note = fit, (f"{wanted} workers would need at least {need} together ({wanted} x the largest run's "
                            f"estimate, {_size(largest)}), more than the {there} {whose}: training on {fit} worker(s)")
    return k, note


def check_fits(cfg: RunConfig, finished: Callable[[], bool] | None = None) -> None:
    """:func:`check_memory` against this machine's memory, and a GPU run's also against the GPU's
    (both against ``DYNAMICS_MEMORY_GB`` where it is set).

    ``finished`` is asked only when the run does not fit: True (the run is finished in its store,
    so it is skipped and needs no memory: a store copied from a larger machine) lets it through.
    A bad ``DYNAMICS_MEMORY_GB`` is refused either way.
    """
    try:
        _check_fits(cfg)
    except DoesNotFit:
        if finished is None or not finished():
            raise


def _check_fits(cfg: RunConfig) -> None:
    if cfg.train.device == "cpu":
        check_memory(cfg)
        return
    check_memory(cfg, part="host")
    given = os.environ.get(MEMORY_ENV, "").strip()
    gpu = machine_memory() if given else gpu_memory(cfg.train.device)
    if gpu is not None:
        check_memory(cfg, gpu, part="device", where=f"{MEMORY_ENV} allows" if given else f"{cfg.train.device} has")

