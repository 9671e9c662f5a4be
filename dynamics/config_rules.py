"""The rules a config's values must meet, beyond their types: :func:`validate`, which
:func:`dynamics.config.from_dict` applies to every config it builds.

Each rule raises :class:`~dynamics.config.ConfigError` with a message naming the key, checked
before any work: a value that would fail later failed after the store was made (and some runs
were recorded failed or "diverged after 0 steps" for it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from dynamics.config import BYTE_TASKS, TASKS, ConfigError
from dynamics.limits import FLOAT32_MAX, MAX_STEPS, MAX_THREADS, MAX_WEIGHTS

if TYPE_CHECKING:
    from dynamics.config import RunConfig


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def validate(cfg: RunConfig, *, recorded: bool = False) -> None:
    """Raise ConfigError naming the first impossible value, else return None.

    ``recorded``: a run's own config (:func:`dynamics.config.recorded_config`), exempt from the
    rules added after runs were recorded under the values they refuse, values that train but
    to no use (an ``init_scale`` below the smallest normal float32: all-zero attention weights;
    a ``rope_base`` past float32: a RoPE table of inf; a ``weight_decay``, ``beta1``, ``beta2``,
    ``min_lr_frac`` or ``gate_l1`` that is 0 in float32 only). Such a run stays loadable by gates,
    resume and distillation, as before those rules.

    Not refused: an induction ``task.max_period`` above ``model.vocab_size``. Its segments cannot
    be distinct, so the current token no longer says alone where to look back, but the rows are
    still periodic and the task well defined, a harder one: ``dynamics.tasks.induction`` draws such
    segments on purpose, and keeps their data hash so that their runs resume.
    `dynamics run`, `sweep` and `demo` say so as they start (:func:`small_vocabulary_note`).
    """
    m, t, tr, r = cfg.model, cfg.task, cfg.train, cfg.record
    for key in ("n_layers", "d_model", "n_heads", "vocab_size", "context"):
        _require(getattr(m, key) > 0, f"model.{key}: must be positive, got {getattr(m, key)}")
    # One position's attention is 1 whatever a head does: there would be nothing to record or analyse.
    _require(m.context >= 2, f"model.context: must be >= 2 (attention over one position is always 1), got {m.context}")
    _require(m.d_head >= 0, f"model.d_head: must be >= 0, got {m.d_head}")
    _require(
        m.d_head > 0 or m.d_model % m.n_heads == 0,
        f"model.n_heads: {m.n_heads} does not divide model.d_model {m.d_model} (or set model.d_head)",
    )
    _require(m.pos in ("rope", "learned", "none"), f"model.pos: unknown scheme {m.pos!r} (rope | learned | none)")
    # d_head 0 takes d_model // n_heads: name the keys the user set, not one left at its default
    width = "model.d_head" if m.d_head else f"model.d_model / model.n_heads ({m.d_model} / {m.n_heads}, d_head 0)"
    _require(m.pos != "rope" or m.head_dim % 2 == 0, f"{width}: RoPE needs an even head width, got {m.head_dim}")
    _require(m.init in ("xavier_uniform", "xavier_normal", "normal"), f"model.init: unknown init {m.init!r}")
    _require(m.init_scale > 0 and math.isfinite(m.init_scale), f"model.init_scale: must be > 0, got {m.init_scale}")
    # Past float32's range the first weights, or the first update, are inf: a run was made and
    # recorded "diverged after 0 steps" for a value the model's float32 cannot hold (a rope_base
    # past it is inf in the RoPE table: 1e39 and 1e300 trained one run under two run ids).
    for key, value in (("model.init_scale", m.init_scale), ("train.lr", cfg.train.lr),
                       ("train.weight_decay", cfg.train.weight_decay), ("model.gate_l1", m.gate_l1),
                       ("train.grad_clip", cfg.train.grad_clip),  # its float32 cast below warned, two lines
                       *([] if recorded else [("model.rope_base", m.rope_base)])):
        _require(not value > FLOAT32_MAX, f"{key}: must be at most {FLOAT32_MAX:.4g} (float32), got {value}")
    # 0 in float32 (as train.lr below), or a subnormal: every attention weight was 0, where no
    # gradient moves it (1e-45, a subnormal, made them all 0 too)
    _require(recorded or m.init_scale >= np.finfo(np.float32).tiny,
             f"model.init_scale: must be at least {np.finfo(np.float32).tiny:.4g} (the smallest normal float32; "
             f"smaller scales make every attention weight 0 there), got {m.init_scale}")
    _require(m.gates in ("fixed", "learned"), f"model.gates: expected fixed or learned, got {m.gates!r}")
    _require(m.gate_l1 >= 0, f"model.gate_l1: must be >= 0, got {m.gate_l1}")
    _require(abs(m.gate_init) <= 100, f"model.gate_init: must be within +-100 (sigmoid is 0 or 1 in float32 past +-17), got {m.gate_init}")
    _require(m.rope_base > 1, f"model.rope_base: must be > 1 (the slowest RoPE frequency is 1 / rope_base), got {m.rope_base}")
    _require(m.attn_only or m.d_mlp > 0, f"model.d_mlp: must be positive, got {m.d_mlp}")
    _require(m.weight_entries <= MAX_WEIGHTS,
             f"model: {m.weight_entries:,} weights (vocab_size {m.vocab_size}, d_model {m.d_model}, n_layers "
             f"{m.n_layers}, n_heads {m.n_heads} x head width {m.head_dim}, d_mlp {m.d_mlp}) is more than the "
             f"{MAX_WEIGHTS:,} a run may have")

    _require(t.name in TASKS, f"task.name: unknown task {t.name!r} ({' | '.join(TASKS)})")
    # Only a mixture reads them: under another task they were silently ignored, and a sweep over
    # task.components then trained the same data under different run ids.
    for key in ("components", "weights"):
        _require(t.name == "mixture" or not getattr(t, key),
                 f"task.{key}: only a mixture has {key}, but task.name is {t.name!r} "
                 f"(set task.name = \"mixture\", or task.{key} = [])")
    if t.name == "mixture":
        _require(len(t.components) > 0, "task.components: a mixture needs at least one component")
        for c in t.components:
            _require(c in TASKS and c != "mixture", f"task.components: unknown component {c!r}")
        _require(len(set(t.components)) == len(t.components), "task.components: duplicate component")
        _require(
            not t.weights or len(t.weights) == len(t.components),
            f"task.weights: {len(t.weights)} weights for {len(t.components)} components",
        )
        # A sum that overflows to inf normalises every weight to 0: the first batch then failed
        # the run it had already made in the store.
        _require(all(w >= 0 for w in t.weights) and (not t.weights or 0 < sum(t.weights) < math.inf),
                 "task.weights: must be non-negative with a positive, finite sum")
    comps = t.component_names
    if "induction" in comps:
        _require(2 <= t.min_period <= t.max_period,
                 f"task.min_period/max_period: need 2 <= min_period <= max_period, got {t.min_period}, {t.max_period}")
        _require(m.context >= 2 * t.max_period,
                 f"model.context: {m.context} is too short for induction with task.max_period {t.max_period} "
                 f"(needs >= {2 * t.max_period})")
    if "offset_copy" in comps:
        _require(t.delta >= 1, f"task.delta: must be >= 1, got {t.delta}")
        _require(m.context > 2 * t.delta,
                 f"model.context: {m.context} is too short for task.delta {t.delta} (needs >= {2 * t.delta + 1})")
        _require(0.0 <= t.p <= 1.0, f"task.p: must be in [0, 1], got {t.p}")
    if "markov" in comps:
        _require(t.markov_order >= 1, f"task.markov_order: must be >= 1, got {t.markov_order}")
        _require(1 <= t.markov_branching <= m.vocab_size,
                 f"task.markov_branching: must be in [1, vocab_size], got {t.markov_branching}")
        _require(m.context > t.markov_order, f"model.context: {m.context} is too short for task.markov_order "
                                             f"{t.markov_order} (needs >= {t.markov_order + 1})")
    if any(c in BYTE_TASKS for c in comps):
        _require(m.vocab_size >= 256, f"model.vocab_size: byte-level task needs >= 256, got {m.vocab_size}")
    _require(t.pool_size >= 0, f"task.pool_size: must be >= 0, got {t.pool_size}")
    if "corpus" in comps:
        _require(0.0 < t.holdout < 1.0, f"task.holdout: must be in (0, 1), got {t.holdout}")
    if any(c in ("induction", "offset_copy", "markov") for c in comps):
        _require(m.vocab_size >= 4, f"model.vocab_size: must be >= 4, got {m.vocab_size}")

    _require(0 < tr.steps <= MAX_STEPS, f"train.steps: must be in [1, {MAX_STEPS:,}], got {tr.steps}")
    _require(tr.lr > 0 and math.isfinite(tr.lr), f"train.lr: must be > 0, got {tr.lr}")
    # 0 in float32 (below half its least positive value), so every update is 0: a run trained nothing and said it completed
    _require(np.float32(tr.lr) > 0, f"train.lr: must be > 0 in float32 (it rounds to 0 there), got {tr.lr}")
    _require(tr.batch_size > 0, f"train.batch_size: must be positive, got {tr.batch_size}")
    _require(0 <= tr.seed < 2**63, f"train.seed: must be in [0, 2**63), got {tr.seed}")
    _require(tr.optimizer in ("adamw", "sgd"), f"train.optimizer: expected adamw or sgd, got {tr.optimizer!r}")
    _require(tr.weight_decay >= 0, f"train.weight_decay: must be >= 0, got {tr.weight_decay}")
    _require(0 <= tr.beta1 < 1 and 0 <= tr.beta2 < 1, "train.beta1/beta2: must be in [0, 1)")
    _require(tr.warmup_steps >= 0, f"train.warmup_steps: must be >= 0, got {tr.warmup_steps}")
    _require(0 <= tr.min_lr_frac <= 1, f"train.min_lr_frac: must be in [0, 1], got {tr.min_lr_frac}")
    _require(tr.grad_clip >= 0, f"train.grad_clip: must be >= 0, got {tr.grad_clip}")
    # as lr: the clip's scale is taken in float32, so every gradient was scaled to 0
    _require(tr.grad_clip == 0 or np.float32(tr.grad_clip) > 0,
             f"train.grad_clip: must be 0 (off) or > 0 in float32 (it rounds to 0 there), got {tr.grad_clip}")
    # 0 in float32, where the step computes, so they train as 0 does: 1e-320 and 0 trained one
    # run under two run ids (a sweep over them trained it twice)
    for key, value in (("train.weight_decay", tr.weight_decay), ("train.beta1", tr.beta1), ("train.beta2", tr.beta2),
                       ("train.min_lr_frac", tr.min_lr_frac), ("model.gate_l1", m.gate_l1)):
        _require(recorded or value == 0 or np.float32(value) > 0,
                 f"{key}: must be 0 or > 0 in float32 (it rounds to 0 there), got {value}")
    # torch.device's own spelling: "cudaa" or "cuda:x" would pass a prefix test and fail only in training
    _require(tr.device == "cpu" or re.fullmatch(r"cuda(:(0|[1-9][0-9]*))?", tr.device) is not None,
             f"train.device: expected cpu, cuda or cuda:<index>, got {tr.device!r}")
    _require(1 <= tr.threads <= MAX_THREADS, f"train.threads: must be in [1, {MAX_THREADS}], got {tr.threads}")
    _require(tr.eval_batches >= 1, f"train.eval_batches: must be >= 1, got {tr.eval_batches}")

    _require(r.dense_until >= 0, f"record.dense_until: must be >= 0, got {r.dense_until}")
    _require(r.every >= 1, f"record.every: must be >= 1, got {r.every}")
    _require(r.n_probe >= 1, f"record.n_probe: must be >= 1, got {r.n_probe}")
    _require(r.attention_dtype in ("float16", "float32"), "record.attention_dtype: expected float16 or float32")
    _require(r.head_weights in ("auto", "on", "off"), "record.head_weights: expected auto, on or off")
    _require(r.eval_batch_size >= 1, f"record.eval_batch_size: must be >= 1, got {r.eval_batch_size}")
    # bounded as train.steps: past it, a run failed once recorded (gates' own limit) or overflowed
    _require(0 <= r.chg_every <= MAX_STEPS, f"record.chg_every: must be in [0, {MAX_STEPS:,}], got {r.chg_every}")
    _require(1 <= r.chg_steps <= MAX_STEPS, f"record.chg_steps: must be in [1, {MAX_STEPS:,}], got {r.chg_steps}")


def small_vocabulary_note(cfgs: Sequence[RunConfig]) -> str | None:
    """The note for configs (a run's, or a sweep's points) whose induction segments cannot be
    distinct: ``task.max_period`` above ``model.vocab_size``; None where none has it.

    A note, not a refusal (see :func:`validate`): the task is harder, not broken. It is said because
    the change is a cliff, not a slope: the segment is drawn ``max_period`` tokens long, all of it
    i.i.d. once it cannot be distinct, so the rows whose period fits the vocabulary hold repeats
    too (at vocab_size 8, max_period 8 none does; at max_period 9 most rows do).
    """
    small = [c for c in cfgs if "induction" in c.task.component_names and c.task.max_period > c.model.vocab_size]
    if not small:
        return None
    first = small[0]
    which = (f"task.max_period {first.task.max_period} is above model.vocab_size {first.model.vocab_size}"
             if len(cfgs) == 1 else f"{len(small)} of the {len(cfgs)} sweep points have task.max_period above "
             f"model.vocab_size (the first: {first.task.max_period} above {first.model.vocab_size})")
    return (f"{which}: induction segments are drawn with tokens that may repeat, in every row (those whose period "
            f"fits the vocabulary too), so the current token alone may no longer say where to look back; a harder task than "
            f"distinct segments give (data/README.md, induction)")
