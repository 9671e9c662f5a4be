"""CHG role codes, fit stages, pruning orders, the held-out step, and :class:`GateOptions`."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from numbers import Integral, Real

import numpy as np

from dynamics.analysis.chg import CHG_ROLES as CHG_ROLES  # role names by int8 code; -1 is "unfitted"
from dynamics.analysis.chg import FACILITATING as FACILITATING
from dynamics.analysis.chg import INCONSISTENT as INCONSISTENT
from dynamics.analysis.chg import INTERFERING as INTERFERING
from dynamics.analysis.chg import IRRELEVANT as IRRELEVANT
from dynamics.analysis.chg import UNFITTED as UNFITTED
from dynamics.config import ConfigError
from dynamics.limits import FLOAT32_MAX, MAX_STEPS

RESTART = "restart"
STAGES = ("init", "plus", "minus")  # lambda = 0, then +lambda and -lambda
PRUNE_ORDERS = ("chg", "importance", "ablation", "random")
HELDOUT_STEP = 1_000_000
"""First eval-split step of the batches that score ablations (fits use steps 0, 1, ...)."""
_MAX_ELEMENTS = 1 << 24  # logits elements per no-grad forward when scoring many gate sets
MAX_RESTARTS = 256
"""Upper bound on restarts: they are fitted as one batch (G+ and G- together: 2 x restarts x
batch_size rows per update, 16,384 at the bound with the default batch), so a mistyped count
(--restarts 1000000) failed allocating the batch with a traceback after the model was loaded."""


def gate_options(options) -> GateOptions:
    """``options``, or the defaults for None; ConfigError for anything else (a dict of options
    failed deep inside the fit with an AttributeError naming no argument)."""
    if options is None:
        return GateOptions()
    if not isinstance(options, GateOptions):
        raise ConfigError(f"options must be a GateOptions (or None for the defaults), got {type(options).__name__}")
    return options


@dataclass(frozen=True)
class GateOptions:
    """How gates are fitted and scored; the authors' defaults except clamp_start (package docstring, dynamics/gates/__init__.py)."""

    steps: int = 200
    """Adam updates of the G+ / G- stage (fitted together) and of a contrastive fit."""
    init_steps: int | None = None
    """Adam updates of the lambda = 0 stage; None = steps (the authors' num_updates / num_reg_updates)."""
    lam: float = 0.1
    """|lambda| > 0, weight of mean(clamp(logit)); G+ uses +lam (toward open), G- uses -lam (toward shut).

    The authors' 0.1. On small attention-only pre-LN models a uniform down-scaling of every
    head costs little (LayerNorm undoes it), so G- separates heads more clearly at 0.3
    (``--lam 0.3``; see the package docstring).
    """
    lr: float = 1.0
    """Adam learning rate on the gate logits."""
    grad_clip: float = 1.0
    """Gradient-norm clip per gate set; 0 disables."""
    clamp: float = 4.0
    """The regulariser sees clamp(logit, -clamp, clamp)."""
    restarts: int = 4
    """Gate sets fitted in parallel from independent random inits (one batch of restarts * B rows);
    at most MAX_RESTARTS."""
    batch_size: int = 32
    """Sequences per update (per component in contrastive fits) and per scoring batch."""
    fit_batches: int = 8
    """Eval-split batches (steps 0 .. fit_batches - 1) cycled through by the fits."""
    eval_batches: int = 4
    """Held-out eval-split batches (from HELDOUT_STEP) per component that score ablations."""
    threshold: float = 0.5
    """A gate is high when >= threshold (role labels, contrastive sub-circuit)."""
    max_diff: float = 5.0
    """Contrastive: the forget term stops pushing once logp_forget < logp_retain - max_diff (nats/token)."""
    clamp_start: bool = True
    """Start G+ / G- from the lambda = 0 logits clamped to [-clamp, clamp] (gates move by < 0.018).

    False is the authors' code: a logit the unregularised fit pushed past the clamp gets no
    regulariser gradient, so it stays put and G+/G- there record how far stage 0 wandered.
    """
    init_low: float = 0.01
    """Initial gates are U(init_low, init_high): the authors' U(0, 1), pulled in so no logit is infinite."""
    init_high: float = 0.99
    """Upper end of the initial gate draw."""
    seed: int = 0
    """Seed of the initial gates (combined with train.seed) and of random pruning orders."""

    def __post_init__(self) -> None:
        # Types first, as a config file's are: steps=2.5 was accepted and failed inside the fit,
        # steps="5" with a bare TypeError from the comparisons below.
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("steps", "init_steps", "restarts", "batch_size", "fit_batches", "eval_batches", "seed"):
                ok = (isinstance(value, Integral) and not isinstance(value, bool)) or (value is None and f.name == "init_steps")
                kind = "an integer"
            elif f.name == "clamp_start":
                ok, kind = isinstance(value, bool), "true or false"
            else:
                ok, kind = isinstance(value, Real) and not isinstance(value, bool), "a number"
            if not ok:
                raise ConfigError(f"gates.{f.name}: expected {kind}, got {value!r}")
        positive = ("steps", "restarts", "batch_size", "fit_batches", "eval_batches", "lr", "clamp", "max_diff")
        for name in positive:
            if not getattr(self, name) > 0 or not math.isfinite(getattr(self, name)):
                raise ConfigError(f"gates.{name}: must be positive, got {getattr(self, name)}")
        if self.restarts > MAX_RESTARTS:
            raise ConfigError(f"gates.restarts: must be at most {MAX_RESTARTS} (fitted as one batch), got {self.restarts}")
        # As train.steps: a mistyped count (--steps 10000000000000) ran until killed.
        if self.steps > MAX_STEPS:
            raise ConfigError(f"gates.steps: must be at most {MAX_STEPS:,}, got {self.steps}")
        if self.init_steps is not None and not 0 <= self.init_steps <= MAX_STEPS:
            raise ConfigError(f"gates.init_steps: must be in [0, {MAX_STEPS:,}], got {self.init_steps}")
        if not self.lam > 0 or not math.isfinite(self.lam):
            # lambda 0 is the first stage's fit: G+ and G- then repeat it, the same gates, and every
            # head read "facilitating" with agreement 1
            raise ConfigError(f"gates.lam: give |lambda| (> 0; G+ uses +lam, G- uses -lam), got {self.lam}")
        if self.lam > FLOAT32_MAX:  # the fit holds it in a float32 tensor: a traceback after fitting began
            raise ConfigError(f"gates.lam: must be at most {FLOAT32_MAX:.4g} (float32), got {self.lam}")
        if not self.grad_clip >= 0 or not math.isfinite(self.grad_clip):
            raise ConfigError(f"gates.grad_clip: must be >= 0, got {self.grad_clip}")
        # The fits hold these in float32, where a value below half its least subnormal is 0: --lam
        # 1e-50 fitted G+ and G- as the lambda = 0 stage, the same gates, and stored them under 1e-50
        for name in ("lam", "lr", "clamp", "max_diff", *(("grad_clip",) if self.grad_clip > 0 else ())):
            if not np.float32(getattr(self, name)) > 0:
                raise ConfigError(f"gates.{name}: must be > 0 in float32 (it rounds to 0 there), got {getattr(self, name)}")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"gates.threshold: must be in (0, 1), got {self.threshold}")
        if not 0.0 < self.init_low < self.init_high < 1.0:
            raise ConfigError(f"gates.init_low/init_high: need 0 < low < high < 1, got {self.init_low}, {self.init_high}")
        if self.seed < 0:
            raise ConfigError(f"gates.seed: must be >= 0, got {self.seed}")
