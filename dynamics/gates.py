"""Causal head gating (CHG), contrastive CHG, and head ablations on the project's transformer.

Causal head gating (Nam, Conklin, Yang, Griffiths, Cohen, Leslie, NeurIPS 2025,
arXiv 2505.13737; the authors' code is github.com/andrewnam/causal_head_gating):

- The model is frozen. One gate per (layer, head), ``G = sigmoid(logit)``, multiplies the
  head's output before W_O (``Transformer.forward(..., head_gates=G)``).
- Loss: ``L(G) = NLL - lambda * mean(clamp(logit, -4, 4))``. lambda > 0 rewards open gates,
  lambda < 0 rewards shut ones; the clamp stops the reward at |logit| = 4 (G ~ 0.018 or 0.982),
  so only the NLL moves a gate past it.
- Fits: first lambda = 0 from random logits; from that result, G+ with +lambda (toward open)
  and G- with -lambda (toward shut). G- stays high only where shutting the head costs more
  NLL than the regulariser pays; G+ stays low only where opening it costs NLL.
- Labels (threshold 0.5): facilitating = G+ high and G- high; irrelevant = G+ high and G- low;
  interfering = G+ low and G- low; G+ low with G- high contradicts both fits: inconsistent.
  A third-party repackaging swaps the G+/G- signs and so mislabels interfering heads; the
  signs here are the paper's (pinned by ``tests/test_gates.py``).
- Contrastive CHG retains one component while forgetting another:
  ``-logp_retain + clamp(logp_forget - stopgrad(logp_retain), min=-max_diff)
  - lambda * mean(clamp(logit, -4, 4))`` (logp = mean per-token log-probability).

Defaults follow the authors' trainer (``l1_weight=0.1, l1_clamp=4, lr=1.0, grad_norm=1.0``,
init gates U(0, 1)) except where measured otherwise on this project's models:

- lambda defaults to the authors' 0.1, but note: gating *all* heads by a common factor is nearly free in a
  pre-LayerNorm model whose residual stream is mostly head output (LayerNorm removes the
  common scale), and along that direction the regulariser pushes with lambda in total. At 0.1
  the G- fit of two 2-layer attention-only models settled in such a uniform shrink (every G-
  0.2-0.5) whose ranking of heads was mostly noise: Spearman rho with single-head ablation
  0.29-0.67, against 0.83-0.86 at 0.3 (a 2-layer model with MLPs: 0.86-0.91 at either), so
  ``lam=0.3`` is the better choice for attention-only models. At 0.3, G- shuts the heads whose ablation costs little and keeps the rest partly open
  (G- 0.15-0.45), so the agreement is mostly that split: within the kept group, redundant
  heads share the shrink and their order need not follow single-head ablation.
- G+ and G- start from the lambda = 0 logits clamped to [-4, 4] (``clamp_start``). The
  regulariser has no gradient outside the clamp, so a head the unregularised fit had pushed
  past +4 stayed open in G- whatever its role (measured: on one model rho was 0.71 after 10
  lambda = 0 updates and 0.19 after 20, through one head frozen open; on another a head whose
  ablation costs 0.03 nats got G- = 1.0); clamping moves no gate by more than 0.018.
- Restarts are independent so that k of them run as one batch (``head_gates`` of shape
  (k * B, L, H)): per-set losses are summed, not averaged, and the gradient is clipped per
  gate set. Adam is elementwise, so a batched fit equals k sequential fits from the same inits.

Ablations (Michel, Levy, Neubig 2019 for single heads) replace a head's z (the attention-
weighted values, before W_O): zero-ablation multiplies it by 0 through ``head_gates``;
mean-ablation substitutes its mean over a reference batch at each position, through the
``blocks.{l}.attn.hook_z`` hook. Gates are fitted on eval-split batches 0, 1, ...; ablations,
pruning curves and contrastive scores use eval-split batches from step ``HELDOUT_STEP`` on,
so nothing is scored on the data the gates were fitted to.

Nothing here touches the global torch RNG or the model's ``.grad``s (gradients are taken
with ``torch.autograd.grad`` on the gate logits only), so :func:`chg_snapshot` can run
inside a training step without changing it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr
from torch import Tensor

from dynamics.config import ConfigError, RunConfig
from dynamics.model import Transformer
from dynamics.schema import COMPONENT, FIT, FITS, HEAD, LAYER
from dynamics.tasks import make_batch

CHG_ROLES = ("facilitating", "irrelevant", "interfering", "inconsistent", "unfitted")
"""Role names by int8 code; code -1 (no fit) indexes the last entry, "unfitted"."""
FACILITATING, IRRELEVANT, INTERFERING, INCONSISTENT, UNFITTED = 0, 1, 2, 3, -1

RESTART = "restart"
STAGES = ("init", "plus", "minus")  # lambda = 0, then +lambda and -lambda
PRUNE_ORDERS = ("chg", "importance", "random")
HELDOUT_STEP = 1_000_000
"""First eval-split step of the batches that score ablations (fits use steps 0, 1, ...)."""
_MAX_ELEMENTS = 1 << 24  # logits elements per no-grad forward when scoring many gate sets

__all__ = [
    "CHG_ROLES", "GateOptions", "fit_chg", "chg_snapshot", "chg_roles", "label_agreement", "chg_loss",
    "contrastive_loss", "fit_contrastive", "parse_contrast", "ablation_losses", "head_ablation",
    "set_ablation", "component_weights", "pruning_order", "pruning_curves", "rank_agreement",
    "gate_report", "report_table", "report_lines",
]


@dataclass(frozen=True)
class GateOptions:
    """How gates are fitted and scored; the authors' defaults except clamp_start (module docstring)."""

    steps: int = 200
    """Adam updates of the G+ / G- stage (fitted together) and of a contrastive fit."""
    init_steps: int | None = None
    """Adam updates of the lambda = 0 stage; None = steps (the authors' num_updates / num_reg_updates)."""
    lam: float = 0.1
    """|lambda|, weight of mean(clamp(logit)); G+ uses +lam (toward open), G- uses -lam (toward shut).

    The authors' 0.1. On small attention-only pre-LN models a uniform down-scaling of every
    head costs little (LayerNorm undoes it), so G- separates heads more clearly at 0.3
    (``--lam 0.3``; see the module docstring).
    """
    lr: float = 1.0
    """Adam learning rate on the gate logits."""
    grad_clip: float = 1.0
    """Gradient-norm clip per gate set; 0 disables."""
    clamp: float = 4.0
    """The regulariser sees clamp(logit, -clamp, clamp)."""
    restarts: int = 4
    """Gate sets fitted in parallel from independent random inits (one batch of restarts * B rows)."""
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
        positive = ("steps", "restarts", "batch_size", "fit_batches", "eval_batches", "lr", "clamp", "max_diff")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"gates.{name}: must be positive, got {getattr(self, name)}")
        if self.init_steps is not None and self.init_steps < 0:
            raise ConfigError(f"gates.init_steps: must be >= 0, got {self.init_steps}")
        if self.lam < 0:
            raise ConfigError(f"gates.lam: give |lambda| (>= 0); G- uses -lam, got {self.lam}")
        if self.grad_clip < 0:
            raise ConfigError(f"gates.grad_clip: must be >= 0, got {self.grad_clip}")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"gates.threshold: must be in (0, 1), got {self.threshold}")
        if not 0.0 < self.init_low < self.init_high < 1.0:
            raise ConfigError(f"gates.init_low/init_high: need 0 < low < high < 1, got {self.init_low}, {self.init_high}")
        if self.seed < 0:
            raise ConfigError(f"gates.seed: must be >= 0, got {self.seed}")


# ----------------------------------------------------------------------------- pure maths


def chg_loss(nll: Tensor, logits: Tensor, lam: Tensor | float, clamp: float = 4.0) -> Tensor:
    """CHG objective per gate set: ``NLL - lambda * mean(clamp(logit, -c, c))``.

    Nam et al. 2025 (arXiv 2505.13737), eq. for L(G). lambda > 0 lowers the loss for open gates
    (G+), lambda < 0 for shut ones (G-); the regulariser's gradient is ``-lambda / (L * H)`` per
    logit inside (-c, c) and 0 outside.

    Parameters
    ----------
    nll : Tensor, shape (S,)
        Mean next-token NLL of each gate set.
    logits : Tensor, shape (S, L, H)
        Gate logits.
    lam : float or Tensor of shape (S,)
        Signed lambda per set.
    clamp : float
        c.

    Returns
    -------
    Tensor, shape (S,)

    Example
    -------
    >>> chg_loss(torch.tensor([1.0]), torch.tensor([[[-9.0, 0.0, 2.0, 9.0]]]), 0.1)
    tensor([0.9500])
    """
    reg = logits.clamp(-clamp, clamp).flatten(1).mean(1)  # (S,)
    return nll - torch.as_tensor(lam, dtype=nll.dtype, device=nll.device) * reg


def contrastive_loss(
    logp_retain: Tensor, logp_forget: Tensor, logits: Tensor, lam: float, max_diff: float = 5.0, clamp: float = 4.0
) -> Tensor:
    """Contrastive CHG objective per gate set.

    ``-logp_r + clamp(logp_f - stopgrad(logp_r), min=-max_diff) - lambda * mean(clamp(logit, -c, c))``
    (Nam et al. 2025, arXiv 2505.13737, contrastive CHG). The stop-gradient makes the forget term
    push logp_f down without pulling logp_r up; the clamp stops it once logp_f is max_diff nats
    per token below logp_r.

    Parameters
    ----------
    logp_retain, logp_forget : Tensor, shape (S,)
        Mean per-token log-probability on retain and forget data.
    logits : Tensor, shape (S, L, H)
    lam, max_diff, clamp : float

    Returns
    -------
    Tensor, shape (S,)

    Example
    -------
    >>> z = torch.zeros(1, 1, 2)
    >>> contrastive_loss(torch.tensor([-1.0]), torch.tensor([-9.0]), z, 0.1)
    tensor([-4.])
    """
    forget = (logp_forget - logp_retain.detach()).clamp(min=-max_diff)  # (S,)
    return -logp_retain + forget - lam * logits.clamp(-clamp, clamp).flatten(1).mean(1)


def chg_roles(plus: np.ndarray, minus: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Role codes into :data:`CHG_ROLES` from G+ and G- (any matching shapes).

    facilitating (0): G+ >= t and G- >= t; irrelevant (1): G+ >= t, G- < t;
    interfering (2): both < t; inconsistent (3): G+ < t, G- >= t; unfitted (-1): either is NaN
    (Nam et al. 2025, arXiv 2505.13737, the causal taxonomy).

    Example
    -------
    >>> chg_roles(np.array([0.9, 0.9, 0.1, 0.1]), np.array([0.9, 0.1, 0.1, 0.9])).tolist()
    [0, 1, 2, 3]
    """
    plus, minus = np.asarray(plus, dtype=np.float64), np.asarray(minus, dtype=np.float64)
    hp, hm = plus >= threshold, minus >= threshold
    role = np.select([hp & hm, hp & ~hm, ~hp & ~hm], [FACILITATING, IRRELEVANT, INTERFERING], INCONSISTENT)
    role[np.isnan(plus) | np.isnan(minus)] = UNFITTED
    return role.astype(np.int8)


def label_agreement(roles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Majority role across restarts (axis 0) and the fraction of restarts that give it.

    Ties go to the lower code; unfitted restarts (-1) do not vote, and a head no restart
    fitted gets role -1 and agreement NaN.

    Example
    -------
    >>> maj, agree = label_agreement(np.array([[0, 1], [0, 2], [1, 2]]))
    >>> maj.tolist(), agree.round(2).tolist()
    ([0, 2], [0.67, 0.67])
    """
    roles = np.asarray(roles)
    counts = np.stack([(roles == code).sum(0) for code in range(len(CHG_ROLES) - 1)])  # (4, ...)
    fitted = counts.sum(0)
    majority = np.where(fitted > 0, counts.argmax(0), UNFITTED).astype(np.int8)
    with np.errstate(invalid="ignore", divide="ignore"):
        agreement = np.where(fitted > 0, counts.max(0) / fitted, np.nan)
    return majority, agreement.astype(np.float32)


def component_weights(cfg: RunConfig) -> np.ndarray:
    """Mixture weights of ``cfg.task.component_names`` (normalised; 1.0 for a single task)."""
    names = cfg.task.component_names
    w = np.asarray(cfg.task.weights if cfg.task.name == "mixture" and cfg.task.weights else [1.0] * len(names))
    return w / w.sum()


def rank_agreement(minus: np.ndarray, delta: np.ndarray) -> float:
    """Spearman's rho between G- and the single-head ablation delta-loss over all heads.

    Both say how much the model needs a head; CHG's validation is that they rank heads alike
    (Nam et al. 2025, arXiv 2505.13737). NaN when either is constant.
    """
    from scipy.stats import spearmanr

    a, b = np.asarray(minus, dtype=np.float64).ravel(), np.asarray(delta, dtype=np.float64).ravel()
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def pruning_order(plus: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """Flat head indices, least-needed first, by CHG: G- ascending, ties by G+ ascending.

    A head that stays shut under -lambda (low G-) is one the model does without; among
    those, a low G+ (interfering) is removed before a high one (irrelevant). The most
    facilitating heads (highest G-) go last.
    """
    return np.lexsort((np.asarray(plus).ravel(), np.asarray(minus).ravel()))


# ----------------------------------------------------------------------------- data


def _device(model: Transformer) -> torch.device:
    return next(model.parameters()).device


def _batches(cfg: RunConfig, start: int, n: int, batch_size: int, device, component: str | None = None) -> Tensor:
    """Eval-split token batches ``start .. start + n - 1`` -> (n, B, T + 1) int64."""
    toks = [make_batch(cfg, "eval", start + i, batch_size, component=component).tokens for i in range(n)]
    return torch.from_numpy(np.stack(toks)).to(device)


def _init_logits(cfg: RunConfig, opts: GateOptions, k: int) -> Tensor:
    # numpy, not torch: the global torch RNG is the trainer's and must not move.
    rng = np.random.default_rng(np.random.SeedSequence([cfg.train.seed, opts.seed, 0x4348]))
    u = rng.uniform(opts.init_low, opts.init_high, size=(k, cfg.model.n_layers, cfg.model.n_heads))
    return torch.from_numpy(np.log(u / (1 - u))).float()  # (k, L, H)


def _nll_per_set(model: Transformer, tokens: Tensor, gates: Tensor, groups: int = 1) -> Tensor:
    """Mean next-token NLL of each gate set on each of ``groups`` equal row groups.

    tokens (groups * B, T + 1) are shared by all S gate sets (S = gates.shape[0]); returns (S, groups).
    """
    S, R = gates.shape[0], tokens.shape[0]
    rows = tokens.repeat(S, 1)  # (S * R, T + 1), set-major
    g = gates.repeat_interleave(R, dim=0)  # (S * R, L, H)
    logits = model(rows[:, :-1], head_gates=g)  # (S * R, T, V)
    nll = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="none")  # (S * R * T,)
    return nll.view(S, groups, -1).mean(-1)  # (S, groups)


def _optimise(logits0: Tensor, steps: int, opts: GateOptions, objective: Callable[[Tensor, int], Tensor]) -> Tensor:
    """Adam on gate logits (S, L, H) minimising ``objective(logits, step).sum()``; returns the logits.

    Summing keeps each set's gradient its own and clipping is per set, so restarts stay
    independent. Adam is written out (torch.optim.Adam's defaults: betas 0.9, 0.999, eps 1e-8)
    to show it is elementwise, and because constructing torch.optim.Adam imports
    torch._dynamo (seconds) in a process that has not trained anything.
    """
    b1, b2, eps = 0.9, 0.999, 1e-8
    logits = logits0.detach().clone().requires_grad_(True)  # (S, L, H)
    m, v = torch.zeros_like(logits), torch.zeros_like(logits)  # (S, L, H) Adam moments
    with torch.enable_grad():  # the recorder calls in under no_grad
        for step in range(steps):
            loss = objective(logits, step).sum()
            (grad,) = torch.autograd.grad(loss, [logits])  # model .grads untouched
            if opts.grad_clip:
                norm = grad.flatten(1).norm(dim=1)  # (S,)
                grad = grad * (opts.grad_clip / (norm + 1e-6)).clamp(max=1.0)[:, None, None]  # as clip_grad_norm_
            m.mul_(b1).add_(grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            denom = (v / (1 - b2 ** (step + 1))).sqrt_().add_(eps)  # (S, L, H)
            with torch.no_grad():
                logits.addcdiv_(m, denom, value=-opts.lr / (1 - b1 ** (step + 1)))
    return logits.detach()


@torch.no_grad()
def _score(model: Transformer, tokens: Tensor, gates: Tensor, hooks: Callable | None = None) -> Tensor:
    """Mean NLL per gate set over all batches, (S,); gates (S, L, H), tokens (n, B, T + 1)."""
    n, B, T1 = tokens.shape
    chunk = max(1, _MAX_ELEMENTS // (B * (T1 - 1) * model.cfg.vocab_size))
    out = torch.zeros(gates.shape[0], device=gates.device)
    for s in range(0, gates.shape[0], chunk):
        g = gates[s : s + chunk]  # (s', L, H)
        for batch in tokens:  # (B, T + 1)
            if hooks is None:
                out[s : s + chunk] += _nll_per_set(model, batch, g)[:, 0]
            else:
                with model.hooks(hooks(g, B)):  # the hooks ablate; gates of 1 only lay out the sets
                    out[s : s + chunk] += _nll_per_set(model, batch, torch.ones_like(g))[:, 0]
    return out / n


# ----------------------------------------------------------------------------- fits


def _coords(cfg: RunConfig, k: int) -> dict:
    return {RESTART: np.arange(k), LAYER: np.arange(cfg.model.n_layers), HEAD: np.arange(cfg.model.n_heads)}


def fit_chg(
    model: Transformer, cfg: RunConfig, options: GateOptions | None = None, *, init_logits: Tensor | None = None
) -> xr.Dataset:
    """Fit causal head gating: lambda = 0, then G+ (+lambda) and G- (-lambda) from its result.

    ``L(G) = NLL - lambda * mean(clamp(logit, -4, 4))`` on the run's task data (eval split,
    batches 0 .. fit_batches - 1, mixture rows as in training), model frozen (Nam et al. 2025,
    arXiv 2505.13737). ``restarts`` gate sets are fitted as one batch; G+ and G- of all of
    them form one batch of 2 * restarts sets, started from the lambda = 0 logits (clamped to
    [-clamp, clamp] when ``clamp_start``).

    Parameters
    ----------
    model : Transformer
        Frozen; its weights and ``.grad``s are left as they are.
    cfg : RunConfig
        The run's config (task data, seed).
    options : GateOptions, optional
    init_logits : Tensor, shape (k, L, H), optional
        Initial logits instead of the seeded U(init_low, init_high) draw (k overrides restarts).

    Returns
    -------
    xarray.Dataset
        ``chg`` (restart, layer, head, fit) G+ / G-; ``chg_init`` (restart, layer, head) the
        lambda = 0 gates; ``chg_role`` (restart, layer, head) int8 codes into CHG_ROLES;
        ``role`` (layer, head) majority code and ``agreement`` (layer, head) the fraction of
        restarts giving it; ``nll`` (restart, stage) mean NLL on the fit batches with each
        stage's gates. Attrs: ``nll_full`` (all gates 1), ``roles``, ``options``.

    Example
    -------
    >>> ds = fit_chg(model, cfg, GateOptions(steps=200, restarts=4))  # doctest: +SKIP
    >>> ds.chg.sel(fit="minus").mean("restart")  # doctest: +SKIP
    """
    opts = options or GateOptions()
    device = _device(model)
    logits0 = (_init_logits(cfg, opts, opts.restarts) if init_logits is None else init_logits.float()).to(device)
    k = logits0.shape[0]
    data = _batches(cfg, 0, opts.fit_batches, opts.batch_size, device)  # (n, B, T + 1)

    def objective(lam: Tensor) -> Callable[[Tensor, int], Tensor]:
        def f(logits: Tensor, step: int) -> Tensor:
            nll = _nll_per_set(model, data[step % len(data)], logits.sigmoid())[:, 0]  # (S,)
            return chg_loss(nll, logits, lam, opts.clamp)

        return f

    zero = torch.zeros(k, device=device)
    init_steps = opts.steps if opts.init_steps is None else opts.init_steps
    init = _optimise(logits0, init_steps, opts, objective(zero))  # (k, L, H)
    signs = torch.cat([torch.full((k,), opts.lam), torch.full((k,), -opts.lam)]).to(device)  # (2k,)
    start = init.clamp(-opts.clamp, opts.clamp) if opts.clamp_start else init  # (k, L, H)
    pm = _optimise(torch.cat([start, start]), opts.steps, opts, objective(signs))  # (2k, L, H)
    gates = torch.cat([init, pm]).sigmoid()  # (3k, L, H): init, plus, minus
    nll = _score(model, data, gates).view(3, k).T  # (k, stage)
    nll_full = _score(model, data, torch.ones_like(gates[:1]))[0]

    g = gates.view(3, k, *gates.shape[1:]).cpu().numpy().astype(np.float32)  # (stage, k, L, H)
    roles = chg_roles(g[1], g[2], opts.threshold)  # (k, L, H)
    majority, agreement = label_agreement(roles)
    dims3 = (RESTART, LAYER, HEAD)
    ds = xr.Dataset(
        {
            "chg": ((*dims3, FIT), np.stack([g[1], g[2]], axis=-1)),
            "chg_init": (dims3, g[0]),
            "chg_role": (dims3, roles),
            "role": ((LAYER, HEAD), majority),
            "agreement": ((LAYER, HEAD), agreement),
            "nll": ((RESTART, "stage"), nll.cpu().numpy().astype(np.float32)),
        },
        coords={**_coords(cfg, k), FIT: list(FITS), "stage": list(STAGES)},
        attrs={
            "method": "causal head gating (Nam et al. 2025, arXiv 2505.13737)",
            "roles": list(CHG_ROLES),
            "nll_full": float(nll_full),
            "mean_agreement": float(np.nanmean(agreement)),
            "options": asdict(opts),
        },
    )
    return ds


def chg_snapshot(
    model: Transformer, cfg: RunConfig, steps: int | None = None, options: GateOptions | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """CHG of the model as it is now, for the recorder: ``(chg (L, H, 2) float32, chg_role (L, H) int8)``.

    ``chg[..., 0]`` is G+ and ``chg[..., 1]`` G- (schema.FITS order); roles are codes into
    :data:`CHG_ROLES`. Deterministic given (cfg, options): the initial gates come from a
    numpy generator seeded by train.seed, the data are eval-split batches, and neither the
    torch RNG, the model's weights nor their ``.grad``s change, so training goes on exactly
    as without it. Safe to call under ``torch.no_grad``. With several restarts, G+/G- are
    their means and the role their majority.

    Parameters
    ----------
    model : Transformer
    cfg : RunConfig
    steps : int, optional
        Updates per stage; default ``cfg.record.chg_steps``.
    options : GateOptions, optional
        Default: one restart.

    Example
    -------
    >>> chg, role = chg_snapshot(model, cfg)  # doctest: +SKIP
    >>> chg.shape, role.dtype  # doctest: +SKIP
    ((2, 4, 2), dtype('int8'))
    """
    opts = replace(options or GateOptions(restarts=1), steps=steps or cfg.record.chg_steps)
    ds = fit_chg(model, cfg, opts)
    chg = ds.chg.mean(RESTART).transpose(LAYER, HEAD, FIT).values.astype(np.float32)
    role = ds.chg_role.values[0] if opts.restarts == 1 else ds.role.values
    return chg, role.astype(np.int8)


def parse_contrast(text: str, cfg: RunConfig) -> tuple[str, str]:
    """``"retain=induction,forget=offset_copy"`` -> ("induction", "offset_copy"), checked against the run.

    Raises
    ------
    ConfigError
        Bad syntax, a missing side, an unknown component, or retain == forget (one line).
    """
    names = cfg.task.component_names
    sides: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in ("retain", "forget") or not value or key in sides:
            raise ConfigError(f"--contrast {text!r}: expected retain=COMPONENT,forget=COMPONENT")
        sides[key] = value
    if set(sides) != {"retain", "forget"}:
        raise ConfigError(f"--contrast {text!r}: expected retain=COMPONENT,forget=COMPONENT")
    for key in ("retain", "forget"):
        if sides[key] not in names:
            raise ConfigError(f"--contrast: unknown component {sides[key]!r} for {key} "
                              f"(this run's components: {', '.join(names)})")
    if sides["retain"] == sides["forget"]:
        raise ConfigError(f"--contrast: retain and forget are both {sides['retain']!r}")
    return sides["retain"], sides["forget"]


def fit_contrastive(
    model: Transformer,
    cfg: RunConfig,
    retain: str,
    forget: str,
    options: GateOptions | None = None,
    *,
    init_logits: Tensor | None = None,
) -> xr.Dataset:
    """Contrastive CHG: gates that keep component ``retain`` and lose component ``forget``.

    Minimises ``-logp_r + clamp(logp_f - stopgrad(logp_r), min=-max_diff) - lambda *
    mean(clamp(logit, -4, 4))`` with lambda = +options.lam (Nam et al. 2025, arXiv
    2505.13737), each update on one retain and one forget batch (eval split). The heads left
    open (gate >= threshold) are the sub-circuit serving ``retain`` and not ``forget``.

    Returns
    -------
    xarray.Dataset
        ``contrast_gate`` (restart, layer, head); ``contrast_loss`` (restart, side, state):
        held-out NLL on retain / forget data with all gates 1 ("full"), the fitted gates
        ("gated"), and the binarised sub-circuit ("circuit"). Attrs ``retain``, ``forget``.
    """
    opts = options or GateOptions()
    names = cfg.task.component_names
    for name in (retain, forget):
        if name not in names:
            raise ConfigError(f"unknown component {name!r} (components: {', '.join(names)})")
    device = _device(model)
    logits0 = (_init_logits(cfg, opts, opts.restarts) if init_logits is None else init_logits.float()).to(device)
    k = logits0.shape[0]
    data_r = _batches(cfg, 0, opts.fit_batches, opts.batch_size, device, retain)  # (n, B, T + 1)
    data_f = _batches(cfg, 0, opts.fit_batches, opts.batch_size, device, forget)  # (n, B, T + 1)

    def objective(logits: Tensor, step: int) -> Tensor:
        i = step % len(data_r)
        nll = _nll_per_set(model, torch.cat([data_r[i], data_f[i]]), logits.sigmoid(), groups=2)  # (S, 2)
        return contrastive_loss(-nll[:, 0], -nll[:, 1], logits, opts.lam, opts.max_diff, opts.clamp)

    gates = _optimise(logits0, opts.steps, opts, objective).sigmoid()  # (k, L, H)
    circuit = (gates >= opts.threshold).float()  # (k, L, H)
    sets = torch.cat([torch.ones_like(gates[:1]), gates, circuit])  # (1 + 2k, L, H)
    held = {n: _batches(cfg, HELDOUT_STEP, opts.eval_batches, opts.batch_size, device, n) for n in (retain, forget)}
    losses = []
    for name in (retain, forget):
        s = _score(model, held[name], sets)  # (1 + 2k,)
        losses.append(torch.stack([s[0].expand(k), s[1 : 1 + k], s[1 + k :]], dim=-1))  # (k, state)
    loss = torch.stack(losses, dim=1).cpu().numpy().astype(np.float32)  # (k, side, state)
    return xr.Dataset(
        {
            "contrast_gate": ((RESTART, LAYER, HEAD), gates.cpu().numpy().astype(np.float32)),
            "contrast_loss": ((RESTART, "side", "state"), loss),
        },
        coords={**_coords(cfg, k), "side": ["retain", "forget"], "state": ["full", "gated", "circuit"]},
        attrs={"method": "contrastive causal head gating (Nam et al. 2025, arXiv 2505.13737)",
               "retain": retain, "forget": forget, "options": asdict(opts)},
    )


# ----------------------------------------------------------------------------- ablations


@torch.no_grad()
def _mean_z(model: Transformer, tokens: Tensor) -> list[Tensor]:
    """Per layer, each head's z averaged over the reference rows at each position: (T, H, dh)."""
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]
    sums = [None] * len(names)
    for batch in tokens:  # (B, T + 1)
        _, cache = model.run_with_cache(batch[:, :-1], names)
        for i, name in enumerate(names):
            z = cache[name].sum(0)  # (T, H, dh)
            sums[i] = z if sums[i] is None else sums[i] + z
    rows = tokens.shape[0] * tokens.shape[1]
    return [s / rows for s in sums]


def ablation_losses(
    model: Transformer, cfg: RunConfig, ablate: np.ndarray, method: str = "zero", options: GateOptions | None = None
) -> xr.DataArray:
    """Held-out NLL per task component with head sets removed.

    Parameters
    ----------
    model : Transformer
    cfg : RunConfig
    ablate : bool array, shape (N, L, H) or (L, H)
        True where a head is removed; one set per leading index.
    method : {"zero", "mean"}
        zero: the head's z times 0 (``head_gates``); mean: z replaced by its mean over the
        reference rows (all components' held-out batches pooled) at each position, through
        ``blocks.{l}.attn.hook_z``. Mean-ablation keeps what a head writes regardless of the
        input (e.g. a sink's constant output) and removes only the input-dependent part.
    options : GateOptions, optional
        ``eval_batches`` x ``batch_size`` held-out rows per component.

    Returns
    -------
    xarray.DataArray, dims (set, component)
        Mean next-token NLL.

    Example
    -------
    >>> ablation_losses(model, cfg, np.zeros((1, 2, 4), bool)).sel(set=0)  # doctest: +SKIP
    """
    if method not in ("zero", "mean"):
        raise ConfigError(f"ablation method: expected zero or mean, got {method!r}")
    opts = options or GateOptions()
    device = _device(model)
    masks = np.asarray(ablate, dtype=bool)
    masks = masks[None] if masks.ndim == 2 else masks  # (N, L, H)
    keep = torch.from_numpy(~masks).float().to(device)  # (N, L, H)
    names = cfg.task.component_names
    data = [_batches(cfg, HELDOUT_STEP, opts.eval_batches, opts.batch_size, device, n) for n in names]
    hooks = None
    if method == "mean":
        means = _mean_z(model, torch.cat(data))  # per layer (T, H, dh)

        def hooks(g: Tensor, rows: int):
            def substitute(layer: int):
                m = g[:, layer].repeat_interleave(rows, dim=0)[:, None, :, None]  # (S * B, 1, H, 1)
                return lambda z, name: z * m + means[layer] * (1 - m)  # (S * B, T, H, dh)

            return [(f"blocks.{layer}.attn.hook_z", substitute(layer)) for layer in range(model.cfg.n_layers)]

    loss = torch.stack([_score(model, d, keep, hooks) for d in data], dim=-1)  # (N, C)
    return xr.DataArray(loss.cpu().numpy().astype(np.float32), dims=("set", COMPONENT),
                        coords={COMPONENT: list(names)}, name="loss", attrs={"method": method})


def head_ablation(
    model: Transformer, cfg: RunConfig, method: str = "zero", options: GateOptions | None = None
) -> xr.DataArray:
    """Delta held-out NLL when each single head is removed, per task component.

    ``delta[l, h, c] = NLL_c(model without head (l, h)) - NLL_c(model)`` (Michel, Levy, Neubig
    2019, single-head ablation). Zero for a head that writes nothing (W_O = 0) under either method.

    Returns
    -------
    xarray.DataArray, dims (layer, head, component)
        Named ``delta_loss``; attrs ``method`` and ``loss_full`` (per component).

    Example
    -------
    >>> head_ablation(model, cfg, "mean").sel(component="induction")  # doctest: +SKIP
    """
    L, H = cfg.model.n_layers, cfg.model.n_heads
    masks = np.zeros((1 + L * H, L, H), dtype=bool)
    i = np.arange(L * H)
    masks[1 + i, i // H, i % H] = True  # set 0 keeps every head; set 1 + i removes head i (flat order)
    loss = ablation_losses(model, cfg, masks, method, options).values  # (1 + L*H, C)
    delta = (loss[1:] - loss[0]).reshape(L, H, -1)
    return xr.DataArray(delta, dims=(LAYER, HEAD, COMPONENT), name="delta_loss",
                        coords={LAYER: np.arange(L), HEAD: np.arange(H), COMPONENT: list(cfg.task.component_names)},
                        attrs={"method": method, "loss_full": loss[0].tolist()})


def set_ablation(
    model: Transformer, cfg: RunConfig, ablate: np.ndarray, method: str = "zero", options: GateOptions | None = None
) -> xr.DataArray:
    """Delta held-out NLL per component for head sets (bool (N, L, H) or (L, H)); dims (set, component)."""
    masks = np.asarray(ablate, dtype=bool)
    masks = masks[None] if masks.ndim == 2 else masks
    loss = ablation_losses(model, cfg, np.concatenate([np.zeros_like(masks[:1]), masks]), method, options)
    return (loss[1:] - loss[0].values).rename("delta_loss").assign_attrs(method=method)


def pruning_curves(
    model: Transformer,
    cfg: RunConfig,
    plus: np.ndarray,
    minus: np.ndarray,
    delta: np.ndarray,
    *,
    n_random: int = 8,
    method: str = "zero",
    options: GateOptions | None = None,
) -> xr.Dataset:
    """Held-out loss against the number of heads removed, in three orders.

    - ``chg``: :func:`pruning_order` (G- ascending, then G+): least needed first.
    - ``importance``: single-head ablation delta ascending (least important first).
    - ``random``: the mean over ``n_random`` seeded random orders.

    The loss is the mixture-weighted mean of the per-component held-out NLL. Heads are removed
    cumulatively: point j removes the first j heads of the order.

    Parameters
    ----------
    plus, minus : array (L, H)
        G+ and G- (e.g. means over restarts).
    delta : array (L, H)
        Single-head ablation delta (e.g. mixture-weighted over components).

    Returns
    -------
    xarray.Dataset
        ``loss`` (order, removed), ``random_loss`` (draw, removed), ``order_heads`` (order, rank)
        flat head indices (-1 for random); coordinate ``fraction`` = removed / (L * H).
    """
    opts = options or GateOptions()
    L, H = cfg.model.n_layers, cfg.model.n_heads
    n = L * H
    rng = np.random.default_rng(np.random.SeedSequence([cfg.train.seed, opts.seed, 0x5052]))
    orders = [pruning_order(plus, minus), np.argsort(np.asarray(delta).ravel(), kind="stable")]
    orders += [rng.permutation(n) for _ in range(n_random)]
    masks = np.zeros((len(orders), n + 1, n), dtype=bool)
    for i, order in enumerate(orders):
        for j in range(1, n + 1):
            masks[i, j, order[:j]] = True
    loss = ablation_losses(model, cfg, masks.reshape(-1, L, H), method, opts).values  # (orders * (n+1), C)
    total = (loss @ component_weights(cfg)).reshape(len(orders), n + 1)
    curves = np.stack([total[0], total[1], total[2:].mean(0)])
    heads = np.full((3, n), -1)
    heads[0], heads[1] = orders[0], orders[1]
    removed = np.arange(n + 1)
    return xr.Dataset(
        {"loss": (("order", "removed"), curves.astype(np.float32)),
         "random_loss": (("draw", "removed"), total[2:].astype(np.float32)),
         "order_heads": (("order", "rank"), heads)},
        coords={"order": list(PRUNE_ORDERS), "removed": removed, "fraction": ("removed", removed / n)},
        attrs={"method": method, "n_random": n_random},
    )


# ----------------------------------------------------------------------------- report


def gate_report(
    model: Transformer,
    cfg: RunConfig,
    options: GateOptions | None = None,
    *,
    contrast: tuple[str, str] | None = None,
    method: str = "zero",
) -> xr.Dataset:
    """CHG fit, single-head ablation and (optionally) a contrastive fit, in one dataset.

    Returns the :func:`fit_chg` variables plus ``delta_loss`` (layer, head, component) and, with
    ``contrast=(retain, forget)``, the :func:`fit_contrastive` variables. Attr ``rho``:
    Spearman's rho between mean G- and the mixture-weighted delta (:func:`rank_agreement`).
    """
    opts = options or GateOptions()
    ds = fit_chg(model, cfg, opts)
    delta = head_ablation(model, cfg, method, opts)
    ds["delta_loss"] = delta
    weighted = (delta.values * component_weights(cfg)).sum(-1)  # (L, H)
    ds.attrs.update(ablation=method, loss_full=delta.attrs["loss_full"], weights=component_weights(cfg).tolist(),
                    rho=rank_agreement(ds.chg.sel(fit="minus").mean(RESTART).values, weighted))
    if contrast is not None:
        c = fit_contrastive(model, cfg, *contrast, opts)
        ds = ds.merge(c, combine_attrs="override")
        ds.attrs.update(retain=c.attrs["retain"], forget=c.attrs["forget"])
    return ds


def report_table(ds: xr.Dataset) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a :func:`gate_report`: one row per head.

    Columns: layer, head, G+ and G- (means over restarts), the majority label, the fraction
    of restarts agreeing with it, the ablation delta (mixture-weighted, then per component),
    and with a contrastive fit the mean contrastive gate ("keep").
    """
    comps = [str(c) for c in ds[COMPONENT].values]
    weights = np.asarray(ds.attrs.get("weights", None) or [1.0 / len(comps)] * len(comps))
    plus = ds.chg.sel(fit="plus").mean(RESTART).values
    minus = ds.chg.sel(fit="minus").mean(RESTART).values
    delta = ds.delta_loss.values  # (L, H, C)
    header = ["layer", "head", "G+", "G-", "label", "agree", "dloss", *[f"d:{c}" for c in comps]]
    keep = None
    if "contrast_gate" in ds:
        keep = ds.contrast_gate.mean(RESTART).values
        header.append("keep")
    rows = []
    for layer in range(plus.shape[0]):
        for head in range(plus.shape[1]):
            row = [str(layer), str(head), f"{plus[layer, head]:.3f}", f"{minus[layer, head]:.3f}",
                   CHG_ROLES[int(ds.role.values[layer, head])], f"{ds.agreement.values[layer, head]:.2f}",
                   f"{float(delta[layer, head] @ weights):+.4f}", *[f"{d:+.4f}" for d in delta[layer, head]]]
            if keep is not None:
                row.append(f"{keep[layer, head]:.3f}")
            rows.append(row)
    return header, rows


def report_lines(ds: xr.Dataset) -> list[str]:
    """Summary lines of a :func:`gate_report`: NLLs, label stability, rho, and the contrastive losses."""
    nll = ds.nll.mean(RESTART)
    lines = [
        f"NLL on the fit data: all gates open {ds.attrs['nll_full']:.4f}, lambda=0 {float(nll.sel(stage='init')):.4f}, "
        f"G+ {float(nll.sel(stage='plus')):.4f}, G- {float(nll.sel(stage='minus')):.4f}",
        f"labels: {ds.sizes[RESTART]} restarts, mean agreement with the majority {ds.attrs['mean_agreement']:.2f}",
        f"Spearman rho(G-, {ds.attrs['ablation']}-ablation delta) = {ds.attrs['rho']:.3f}",
    ]
    if "contrast_loss" in ds:
        loss = ds.contrast_loss.mean(RESTART)
        for side in ("retain", "forget"):
            full, gated, circuit = (float(loss.sel(side=side, state=s)) for s in ("full", "gated", "circuit"))
            lines.append(f"contrast {side} {ds.attrs[side]}: held-out NLL {full:.4f} -> {gated:.4f} gated, "
                         f"{circuit:.4f} with only the kept heads (gate >= threshold)")
    return lines

