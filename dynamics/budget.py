"""Will a run fit in memory? A lower bound on its peak, checked before any work.

Sizes other than the model's weights (batch, context, vocabulary, probe count, eval rows, steps,
snapshot count) have no bound of their own in :mod:`dynamics.config`: a mistyped one
(``train.batch_size = 100000000``) passed validation, made the store and a run group, and the
run failed tens of seconds later with a MemoryError (or, with overcommit, pushed the machine
into swap). :func:`check_memory` refuses such a config as one line, before anything is made.

The estimate counts only arrays a run cannot do without, at the moment of its largest phase,
so it stays *below* the real peak (tests/test_budget.py measures that): it refuses what cannot
possibly fit, never a run that would. What it counts, in bytes:

- state, held throughout: float32 weights, their gradients and the optimiser's moments (two for
  AdamW, one for SGD with momentum), the previous snapshot's per-head gradients, the loss curve
  (4 per step), the probe, eval and pooled training tokens (int64);
- a training step: its int64 tokens, and the activations autograd keeps for the backward pass
  (per layer the LayerNorm output, q/k/v, z and the MLP's two hidden layers; the logits and
  their log-softmax);
- an evaluation: the logits and log-softmax of ``eval_batches * eval_batch_size`` rows;
- an attention snapshot: the probe's L x H x n_probe x T x T maps, cached in float32, stacked
  in float32 and converted to ``record.attention_dtype``;
- the snapshot schedule, built before training (a Python int and a list slot per snapshot).

Pure functions of the config and this module's imports only: no torch, no zarr.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dynamics.config import ConfigError, RunConfig

GIB = 2**30

MEMORY_ENV = "DYNAMICS_MEMORY_GB"
"""Environment variable that replaces the memory a run is checked against (in GB of 10^9
bytes): a lower figure for a machine shared with other work, a higher one to go past the check
(swap, or a machine whose reported memory is wrong)."""


@dataclass(frozen=True)
class Estimate:
    """A lower bound on a run's peak memory, by phase, in bytes."""

    state: int
    """Held for the whole run: weights, gradients, optimiser moments, loss curve, tokens."""
    phases: dict[str, int]
    """Largest transient of each phase, on top of ``state``; the phases do not overlap."""
    schedule: int
    """The snapshot schedule, built (and dropped) before the state exists."""

    @property
    def peak(self) -> int:
        return max(self.schedule, self.state + max(self.phases.values()))

    @property
    def largest(self) -> str:
        """The phase that sets the peak."""
        if self.schedule >= self.state + max(self.phases.values()):
            return "the snapshot schedule"
        return max(self.phases, key=self.phases.__getitem__)


def n_snapshots(steps: int, dense_until: int, every: int) -> int:
    """``len(record.snapshot_steps(steps, dense_until, every))``, counted without building it."""
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
    tokens = 8 * (T + 1) * (r.n_probe + len(cfg.task.component_names) * eval_rows + cfg.task.pool_size)
    itemsize = 2 if r.attention_dtype == "float16" else 4
    maps = L * H * r.n_probe * T * T
    if part == "host":
        return Estimate(4 * tr.steps + tokens,
                        {"a training step": 8 * (T + 1) * tr.batch_size, "an attention snapshot": (4 + itemsize) * maps},
                        36 * n_snapshots(tr.steps, r.dense_until, r.every))
    state = (4 * m.weight_entries * (2 + moments)
             + 4 * 4 * L * H * d * dh  # the previous snapshot's W_Q/W_K/W_V/W_O gradients
             + tokens)
    per_position = L * (2 * d + 4 * H * dh + 2 * mlp) + 2 * V  # float32 values autograd keeps per token
    phases = {
        "a training step": tr.batch_size * (8 * (T + 1) + 4 * T * per_position),
        "an evaluation": 4 * eval_rows * T * 2 * V,
        # cached, then stacked, in float32; on the CPU the conversion to the stored dtype joins them
        "an attention snapshot": (8 + (itemsize if part == "all" else 0)) * maps,
    }
    if part == "device":
        return Estimate(state, phases, 0)
    return Estimate(state + 4 * tr.steps, phases, 36 * n_snapshots(tr.steps, r.dense_until, r.every))


def machine_memory() -> int | None:
    """Bytes of memory a run may use here: ``DYNAMICS_MEMORY_GB`` if set, else the physical
    memory (``os.sysconf``), lowered to a cgroup v2 limit (a container's); None if unknown."""
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
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:  # no cgroup v2 here, or not readable: the physical memory stands
        pass
    return total if total > 0 else None


def gpu_memory(device: str) -> int | None:
    """Total memory of a CUDA ``device`` (torch is imported only then), None for the CPU or a
    device this torch cannot see (refused elsewhere: usage.check_device, or the run's setup)."""
    if not device.startswith("cuda"):
        return None
    import torch

    index = int(device.partition(":")[2] or 0)
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    return int(torch.cuda.get_device_properties(index).total_memory)


def _size(n: int) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:,.1f} MiB"


_KEYS = {
    "a training step": "train.batch_size, model.context or model.vocab_size",
    "an evaluation": "train.eval_batches, record.eval_batch_size, model.context or model.vocab_size",
    "an attention snapshot": "record.n_probe or model.context",
    "the snapshot schedule": "train.steps or record.every",
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
    ConfigError
        Naming the estimate, its largest phase, the keys that size it, and how to go around it.

    Example
    -------
    >>> from dynamics.config import RunConfig, replace_section
    >>> check_memory(replace_section(RunConfig(), "train", batch_size=10**8), 2**34)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dynamics.config.ConfigError: config needs at least 45,824.8 GiB of memory (... for a training step), ...
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
    largest = est.largest
    parts = (f"{_size(est.schedule)} for it" if largest == "the snapshot schedule"
             else f"{_size(est.state)} held throughout + {_size(est.peak - est.state)} for {largest}")
    raise ConfigError(
        f"config needs at least {_size(est.peak)} of memory ({parts}), more than the {_size(available)} {where}: "
        f"lower {_KEYS[largest]}, or set {MEMORY_ENV} to the GB a run may use "
        f"(the estimate counts only what no run can do without: dynamics/budget.py)")


def check_fits(cfg: RunConfig) -> None:
    """:func:`check_memory` against this machine's memory, and a GPU run's also against the GPU's
    (both against ``DYNAMICS_MEMORY_GB`` where it is set)."""
    if cfg.train.device == "cpu":
        check_memory(cfg)
        return
    check_memory(cfg, part="host")
    given = os.environ.get(MEMORY_ENV, "").strip()
    gpu = machine_memory() if given else gpu_memory(cfg.train.device)
    if gpu is not None:
        check_memory(cfg, gpu, part="device", where=f"{MEMORY_ENV} allows" if given else f"{cfg.train.device} has")
