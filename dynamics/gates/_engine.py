"""What every fit and score shares: eval-split batches, seeded initial logits, the NLL of many
gate sets in one forward, Adam on the gate logits, and no-grad scoring of gate sets."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from dynamics.config import ConfigError, RunConfig
from dynamics.gates.options import _MAX_ELEMENTS, GateOptions
from dynamics.model import Transformer, require_float32
from dynamics.tasks import make_batch

# ----------------------------------------------------------------------------- data


def _device(model: Transformer) -> torch.device:
    return next(model.parameters()).device


def entry(fn: Callable) -> Callable:
    """For the public fits and scores ``fn(model, cfg, ...)``: refuse a model built from another
    config than ``cfg.model`` (its data would be cfg's: plausible numbers from the wrong task, or
    an IndexError deep in the embedding) and a float64 default dtype (the gates would be float64
    against float32 weights), and run outside a caller's inference_mode, whose tensors cannot
    take part in the gradients every fit needs."""

    @functools.wraps(fn)
    def checked(model: Transformer, cfg: RunConfig, *args, **kwargs):
        require_float32()
        if (built := getattr(model, "cfg", None)) != cfg.model:
            fields = [f.name for f in dataclasses.fields(cfg.model)]
            differ = [f"{k} {getattr(built, k, None)!r} in the model, {getattr(cfg.model, k)!r} in cfg"
                      for k in fields if getattr(built, k, None) != getattr(cfg.model, k)]
            raise ConfigError(f"{fn.__name__}: the model was built from another config than cfg.model ("
                              f"{'; '.join(differ[:3]) or 'not a dynamics Transformer'}): pass the run's own config, "
                              f"as load_run_model returns it")
        if (dtype := next(model.parameters()).dtype) != torch.float32:
            raise ConfigError(f"{fn.__name__}: the model's parameters are {dtype}, but gates are fitted and scored in "
                              f"float32, the dtype runs train in: pass model.float()")
        with torch.inference_mode(False):
            return fn(model, cfg, *args, **kwargs)

    return checked


def _batches(cfg: RunConfig, start: int, n: int, batch_size: int, device, component: str | None = None) -> Tensor:
    """Eval-split token batches ``start .. start + n - 1`` -> (n, B, T + 1) int64."""
    toks = [make_batch(cfg, "eval", start + i, batch_size, component=component).tokens for i in range(n)]
    return torch.from_numpy(np.stack(toks)).to(device)


def _init_logits(cfg: RunConfig, opts: GateOptions, k: int) -> Tensor:
    # numpy, not torch: the global torch RNG is the trainer's and must not move.
    rng = np.random.default_rng(np.random.SeedSequence([cfg.train.seed, opts.seed, 0x4348]))
    u = rng.uniform(opts.init_low, opts.init_high, size=(k, cfg.model.n_layers, cfg.model.n_heads))
    return torch.from_numpy(np.log(u / (1 - u))).float()  # (k, L, H)


def start_logits(fn: str, cfg: RunConfig, opts: GateOptions, init_logits) -> Tensor:
    """The initial logits of a fit, (k, L, H) float32: the seeded draw, or ``init_logits`` (a
    Tensor or an array) checked here, since a wrong shape otherwise failed inside the model's
    forward, naming its ``head_gates`` rather than this argument."""
    if init_logits is None:
        return _init_logits(cfg, opts, opts.restarts)
    try:
        logits = torch.as_tensor(np.asarray(init_logits, dtype=np.float32) if not isinstance(init_logits, Tensor)
                                 else init_logits.detach().cpu()).float()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{fn}: init_logits must be numbers of shape (restart, layer, head), got "
                          f"{type(init_logits).__name__} ({e})") from None
    L, H = cfg.model.n_layers, cfg.model.n_heads
    if logits.ndim != 3 or logits.shape[1:] != (L, H) or logits.shape[0] < 1:
        hint = " (one set of restarts: init_logits[None])" if tuple(logits.shape) == (L, H) else ""
        raise ConfigError(f"{fn}: init_logits must have shape (restart, layer, head) = (k, {L}, {H}) for this model, "
                          f"got {tuple(logits.shape)}{hint}")
    if not torch.isfinite(logits).all():
        raise ConfigError(f"{fn}: init_logits holds values that are not finite in float32 (NaN, inf, or past 3.4e38)")
    return logits  # (k, L, H)


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


Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called after each update of a fit (and at a stage's start, done 0)."""


def settle_window(steps: int) -> int:
    """Updates over which a fit's last movement is measured: the final tenth, at least one."""
    return max(1, steps // 10)


def _optimise(logits0: Tensor, steps: int, opts: GateOptions, objective: Callable[[Tensor, int], Tensor],
              progress: Callable[[int, int], None] | None = None) -> tuple[Tensor, Tensor]:
    """Adam on gate logits (S, L, H) minimising ``objective(logits, step).sum()``.

    Returns the logits and, (S, L, H), each gate's (sigmoid of its logit) absolute change over
    the last :func:`settle_window` updates: how far the fit was from settled when it stopped
    (0 for a fit of no updates). The loss alone cannot say it, since the
    regulariser keeps pulling while the NLL is flat.

    Summing keeps each set's gradient its own and clipping is per set, so restarts stay
    independent. Adam is written out (torch.optim.Adam's defaults: betas 0.9, 0.999, eps 1e-8)
    to show it is elementwise, and because constructing torch.optim.Adam imports
    torch._dynamo (seconds) in a process that has not trained anything.
    """
    b1, b2, eps = 0.9, 0.999, 1e-8
    logits = logits0.detach().clone().requires_grad_(True)  # (S, L, H)
    m, v = torch.zeros_like(logits), torch.zeros_like(logits)  # (S, L, H) Adam moments
    if progress is not None:
        progress(0, steps)
    window = settle_window(steps)
    before = logits.detach().sigmoid()  # (S, L, H), replaced when the last window starts
    with torch.enable_grad():  # the recorder calls in under no_grad
        for step in range(steps):
            if step == steps - window:
                before = logits.detach().sigmoid()
            loss = objective(logits, step).sum()
            (grad,) = torch.autograd.grad(loss, [logits])  # model .grads untouched
            if opts.grad_clip:
                norm = grad.flatten(1).norm(dim=1)  # (S,)
                factor = (opts.grad_clip / (norm + 1e-6)).clamp(max=1.0)  # (S,) as clip_grad_norm_
                # Finite gradients whose squares overflow float32 (--lam 1e30): an inf norm made the
                # factor 0, and those gates never moved. In float64 it is their norm; chosen per set,
                # without a branch, so every other set (and restart) is clipped bitwise as alone.
                wide = (opts.grad_clip / (grad.flatten(1).double().norm(dim=1) + 1e-6)).clamp(max=1.0)  # (S,)
                factor = torch.where(torch.isfinite(norm), factor, wide.to(factor.dtype))
                grad = grad * factor[:, None, None]
            m.mul_(b1).add_(grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            denom = (v / (1 - b2 ** (step + 1))).sqrt_().add_(eps)  # (S, L, H)
            with torch.no_grad():
                logits.addcdiv_(m, denom, value=-opts.lr / (1 - b1 ** (step + 1)))
            if progress is not None:
                progress(step + 1, steps)
    settle = (logits.detach().sigmoid() - before).abs()  # (S, L, H)
    return logits.detach(), settle


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
