"""Interventions during training: attention templates, attention distillation, conditioned gates.

Each is an option of any run config, in the ``[intervene]`` table, and records what it did
next to the run's other arrays, so an intervened run and a free one are compared with the
same analysers. ``check(cfg)`` validates the table (one-line :class:`ConfigError` naming the
key, before any work); ``build(cfg, model, device)`` returns None for an empty table, else an
:class:`Interventions` object that ``dynamics.train`` drives: its parameters join the
optimiser, its hooks are active during the training forward, its loss is added to the
objective, its state travels in checkpoints and its arrays are written at every snapshot.

Schema (every section optional, any combination allowed; see each module for the maths)::

    [intervene.templates]                 # dynamics.interventions.templates
    weight = 1.0                          # KL(template || attention) weight; 0 records only
    schedule = "constant"                 # constant | warmup | linear_decay | cosine_decay
    ramp_steps = 0                        # warm-up / decay length; 0 = train.steps
    hard = false                          # clamp pinned heads' attention to the template
    heads = [
      { layer = 0, head = 0, pattern = "previous_token" },
      { layer = 0, head = 1, pattern = "offset", delta = 3 },
      { layer = 1, head = 2, pattern = "local", width = 3, hard = true },
      # also: pattern = "uniform" | "first_token"
    ]

    [intervene.distill]                   # dynamics.interventions.distill
    teacher = "runs/teacher.zarr"         # store of a completed run (required)
    run = ""                              # its run id; optional when the store holds one run (and is not the student's)
    map = "layer"                         # layer (depth-proportional, head h <- h) | heads
    layers = []                           # map = layer: student layers to distil (empty: all)
    heads = [                             # map = heads
      { layer = 0, head = 1, teacher_layer = 0, teacher_head = 3 },
      { layer = 1, head = 0, role = "induction" },   # the teacher's best head with that final role
    ]
    attention_weight = 1.0                # attention KL weight; 0 records only
    logits_weight = 0.0                   # tau^2 KL on next-token distributions (logits-only: attention_weight = 0)
    temperature = 1.0
    schedule = "constant"                 # as for templates, on both weights
    ramp_steps = 0
    order = "together"                    # together | shallow_first | deep_first
    stage_steps = 0                       # steps between layer switch-ons; 0 = train.steps // (layers + 1)

    [intervene.conditioned_gates]         # dynamics.interventions.gates
    layers = []                           # gated layers (empty: all)
    pool = "causal"                       # causal (prefix means) | mean (leaks later tokens)
    conditioned = true                    # false: W held at 0, one static gate per head (baseline)
    init = 3.0                            # initial gate logit
    variance_weight = 0.0                 # weight of Var_batch(per-sequence gate); < 0 rewards variation
    ema_decay = 0.99                      # EMA of each head's batch-mean gate over steps
    ema_mix = 0.0                         # share of the applied gate taken from the EMA

Recorded (all float32 unless said; NaN where a head is not intervened on):

- templates: ``template_kl`` (snapshot, layer, head), KL(template || the head's own softmax
  attention) on the probe batch, averaged over probes and queries (in hard mode, the attention
  the head would have had); ``template_weight`` (snapshot,), the scheduled weight;
- distill: ``distill_kl`` (snapshot, layer, head), KL(teacher head || student head) on the
  probes; ``distill_logits_kl`` (snapshot,), tau^2 KL of the next-token distributions on the
  probes, recorded whichever weights are on; ``distill_weight`` (snapshot, layer, head), the
  scheduled weight (0 = off or not yet on), before the loss's mean over the mapped pairs; ``distill_source`` (snapshot, layer, head) int32,
  the teacher head as ``teacher_layer * teacher_n_heads + teacher_head``, -1 if none;
- conditioned gates: ``conditioned_gate`` (snapshot, layer, head, probe), the gate each probe
  sequence got (mean over positions); ``conditioned_gate_ema`` (snapshot, layer, head).

Snapshot values come from one no-grad forward on the probe batch with every intervention
active (so a layer after a clamped head sees what training sees).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from dynamics.config import ConfigError, RunConfig
from dynamics.interventions import distill, gates, templates
from dynamics.interventions.common import SCHEDULES, fail, kl_rows, schedule_factor
from dynamics.interventions.templates import PATTERNS, template_pattern

__all__ = [
    "PATTERNS",
    "SCHEDULES",
    "SECTIONS",
    "ConfigError",
    "Interventions",
    "Options",
    "build",
    "check",
    "check_output",
    "kl_rows",
    "parse",
    "schedule_factor",
    "template_pattern",
]

SECTIONS = ("templates", "distill", "conditioned_gates")
"""Tables allowed under [intervene]."""


@dataclass(frozen=True)
class Options:
    """The parsed ``[intervene]`` table; None for an absent section."""

    templates: templates.TemplateOptions | None = None
    """Attention templates."""
    distill: distill.DistillOptions | None = None
    """Attention / logits distillation from a teacher run."""
    conditioned_gates: gates.GateOptions | None = None
    """Input-conditioned head gates."""


def parse(cfg: RunConfig) -> Options:
    """Parse and validate ``cfg.intervene`` without reading any teacher store.

    Raises
    ------
    ConfigError
        One line naming the key at fault.
    """
    raw = cfg.intervene
    if not isinstance(raw, dict):
        fail(f"intervene: expected a table, got {raw!r}")
    for key in raw:
        if key not in SECTIONS:
            fail(f"intervene: unknown section '{key}' ({' | '.join(SECTIONS)})")
    return Options(
        templates=templates.parse(cfg, raw["templates"]) if "templates" in raw else None,
        distill=distill.parse(cfg, raw["distill"]) if "distill" in raw else None,
        conditioned_gates=gates.parse(cfg, raw["conditioned_gates"]) if "conditioned_gates" in raw else None,
    )


def check(cfg: RunConfig) -> Options:
    """Validate ``cfg.intervene`` completely, reading the teacher store if there is one.

    Parameters
    ----------
    cfg : RunConfig
        The student's resolved config.

    Returns
    -------
    Options
        The parsed table (empty Options for no interventions).

    Raises
    ------
    ConfigError
        One line naming the key: unknown section or key, wrong type, a head that does not
        exist, a teacher store that is missing, unfinished or incompatible with the student,
        a role the teacher has no head for, a head both pinned and distilled.

    Example
    -------
    >>> from dynamics.config import from_dict
    >>> check(from_dict({"intervene": {"templates": {"heads": [{"layer": 5, "head": 0, "pattern": "uniform"}]}}}))
    Traceback (most recent call last):
    ...
    dynamics.config.ConfigError: intervene.templates.heads[0].layer: layer 5 does not exist (model.n_layers = 2)
    """
    return _check(cfg)[0]


def check_output(cfg: RunConfig, out: str) -> None:
    """ConfigError for interventions that cannot be written to the store at `out`.

    A distilled run going into its teacher's own store must name the teacher run
    (``intervene.distill.run``); see :func:`dynamics.interventions.distill.check_output`.
    """
    if cfg.intervene:
        opts = parse(cfg)
        if opts.distill is not None:
            distill.check_output(opts.distill, out)


def _check(cfg: RunConfig) -> tuple[Options, tuple | None]:
    """check() plus the resolved (teacher, pairs) of a distillation, so build reads the teacher once."""
    opts = parse(cfg)
    resolved = None
    if opts.distill is not None:
        resolved = distill.resolve(opts.distill, cfg)
        pairs = resolved[1]
        if opts.templates is not None:
            pinned = {(h.layer, h.head) for h in opts.templates.heads}
            both = sorted(pinned & {(p[0], p[1]) for p in pairs})
            if both:
                fail(f"intervene.distill: head {both[0]} is also pinned by intervene.templates; give each head one target")
    return opts, resolved


class Interventions:
    """The interventions of one run, driven by ``dynamics.train.train_run``.

    Training protocol per step: ``fwd_hooks()`` (fresh captures) -> forward -> ``loss(step, ...)``
    -> backward -> at snapshot steps ``snapshot(model, probe_tokens)`` and ``state_dict()`` ->
    optimiser step.
    """

    def __init__(self, parts: list, device: torch.device):
        self.parts = parts
        self.device = device
        self._cap: dict[str, dict] = {}

    def parameters(self) -> list[nn.Parameter]:
        """Trainable tensors (conditioned-gate weights); the run's optimiser updates them."""
        return [p for part in self.parts for p in part.parameters()]

    def _hooks(self, cap: dict, capture: bool) -> list:
        out = []
        for part in self.parts:
            out += part.hooks(cap.setdefault(part.name, {}), capture)
        return out

    def fwd_hooks(self) -> list:
        """Hooks for the training forward: capture what the losses need, apply clamps and gates.

        Calling it begins a training step: state carried from the last step (the conditioned
        gates' EMA) is brought up to date first.
        """
        for part in self.parts:
            part.begin_step()
        self._cap = {}
        return self._hooks(self._cap, capture=True)

    def eval_hooks(self) -> list:
        """Hooks that change the forward (hard templates, conditioned gates) and capture nothing else.

        For forwards that should see the intervened model without feeding the losses or
        changing any state: train.py wraps the recorder's snapshot in them, so its attention
        and eval loss see clamped heads and gated outputs.
        """
        return self._hooks({}, capture=False)

    def loss(self, step: int, tokens: Tensor, logits: Tensor) -> Tensor:
        """Sum of the interventions' terms for this step's batch (scalar, in the graph).

        Parameters
        ----------
        step : int
            Training step (weights follow their schedules).
        tokens : Tensor, shape (B, T + 1)
            The batch; the model saw ``tokens[:, :-1]``.
        logits : Tensor, shape (B, T, V)
            The model's output under :meth:`fwd_hooks`.
        """
        total = logits.new_zeros((), dtype=torch.float32)
        for part in self.parts:
            total = total + part.loss(step, tokens, logits, self._cap.get(part.name, {}))
        self._cap = {}  # the loss holds the graph now; drop the captures
        return total

    def variables(self, n_snapshots: int) -> dict[str, tuple[tuple[str, ...], tuple[int, ...], str]]:
        """Name -> (dims, shape, dtype) of the recorded arrays (first dim snapshot)."""
        out: dict = {}
        for part in self.parts:
            out |= part.variables(n_snapshots)
        return out

    @torch.no_grad()
    def snapshot(self, model: nn.Module, probe_tokens: np.ndarray) -> dict[str, np.ndarray]:
        """Per-snapshot blocks (no snapshot dim) from one forward on the probe batch (P, T)."""
        tokens = torch.as_tensor(probe_tokens, device=self.device)  # (P, T)
        cap: dict = {}
        with model.hooks(self._hooks(cap, capture=True)):
            logits = model(tokens)  # (P, T, V)
        out: dict = {}
        for part in self.parts:
            out |= part.blocks(tokens, logits, cap[part.name])
        return out

    def describe(self) -> dict:
        """What each section does, as a JSON-able dict (the run attribute ``interventions``).

        The options with their defaults filled in, and what was resolved from them: each
        template head's own ``hard``, the distilled teacher's run id, checkpoint step and head
        pairs, the gated layers. The ``config`` attribute holds the table only as written.
        """
        return json.loads(json.dumps({part.name: part.describe() for part in self.parts}))

    def state_dict(self) -> dict:
        """State for checkpoints: as at the start of the last step given to :meth:`loss`."""
        return {part.name: part.state_dict() for part in self.parts}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output; ConfigError if the checkpoint's interventions differ."""
        names = sorted(part.name for part in self.parts)
        if sorted(state or {}) != names:
            fail(f"intervene: the checkpoint holds state for {sorted(state or {})}, this config has {names}")
        for part in self.parts:
            part.load_state_dict(state[part.name])


def build(cfg: RunConfig, model: nn.Module, device: torch.device) -> Interventions | None:
    """The run's interventions, or None when ``cfg.intervene`` is empty.

    Parameters
    ----------
    cfg : RunConfig
    model : Transformer
        The student (hooks are registered by name at each forward; it is not modified).
    device : torch.device

    Returns
    -------
    Interventions or None

    Raises
    ------
    ConfigError
        As :func:`check`.
    """
    if not cfg.intervene:
        return None
    opts, resolved = _check(cfg)
    device = torch.device(device)
    parts: list = []
    if opts.templates is not None:
        parts.append(templates.Templates(opts.templates, cfg, device))
    if opts.distill is not None:
        parts.append(distill.Distill(opts.distill, cfg, device, resolved))
    if opts.conditioned_gates is not None:
        parts.append(gates.ConditionedGates(opts.conditioned_gates, cfg, device))
    return Interventions(parts, device)
