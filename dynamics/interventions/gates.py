"""Input-conditioned head gates: one gate per head and per sequence (or prefix), trained with the model.

The causal-head-gating blog seed asks what changes when a head's gate may depend on the input
instead of being one static number per head (Michel et al. 2019; Nam et al. 2025, arXiv
2505.13737, fit static gates). For every gated layer l and head h,

``g_{t,h} = sigmoid(W_{l,h} . [LN(zbar_{t,h}); LN(cbar_t)] + b_{l,h})``

where ``zbar_{t,h}`` pools the head's own output z (before W_O) and ``cbar_t`` pools the
layer's input ``resid_pre`` over positions, and ``z_{t,h} <- g_{t,h} z_{t,h}`` (a ``hook_z``
hook, so it stacks with the model's own gate). ``LN`` is a layer norm without parameters: the
residual stream's scale grows during training, and the gate should see directions, not that.

Pooling (``pool``):

- ``causal`` (default): prefix means ``zbar_t = mean_{s <= t} z_s``, so the gate at position t
  sees only tokens 0..t and next-token prediction stays honest. The gate then varies along
  the sequence; the recorded per-sequence value is its mean over positions.
- ``mean``: one gate per sequence from the mean over all positions. This lets position t's
  output depend (through one scalar per head) on later tokens, a leak of the targets; use it
  for analysis of what a sequence-level gate would do, not to compare losses.

W starts at 0, so training starts from a static gate ``sigmoid(init)`` and input dependence
has to be learned; ``conditioned = false`` keeps W at 0 (one static gate per head, the
baseline). The seed's two extras:

- the regulariser ``variance_weight * mean_{l,h} Var_b(gbar_{b,l,h})``, the variance of the
  per-sequence gates over the batch: positive weights pull toward static gates, negative
  weights reward input dependence;
- EMA smoothing ``m <- ema_decay m + (1 - ema_decay) mean_b gbar_b`` of each head's gate over
  training steps; the applied gate is ``(1 - ema_mix) g + ema_mix m`` (m held constant in
  the backward pass), and m is recorded whatever ema_mix is.

Here ``gbar_b`` is the mean over positions of sequence b's own gate g, before any EMA is
mixed in: were m fed the applied gate, it would partly track itself (its decay would be
``1 - (1 - ema_decay)(1 - ema_mix)``, not ema_decay). Step s's forward uses the EMA of steps
0 .. s-1; the update with step s's gates lands when step s + 1 begins (:meth:`begin_step`),
so a snapshot at step s, like the model it is taken of, has seen s updates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dynamics.config import RunConfig
from dynamics.interventions.common import fail, parse_table

POOLS = ("causal", "mean")


@dataclass(frozen=True)
class GateOptions:
    """``[intervene.conditioned_gates]``."""

    layers: tuple[int, ...] = ()
    """Layers whose heads are gated; empty means all."""
    pool: str = "causal"
    """How z and resid_pre are pooled over positions: causal (prefix mean) | mean (leaks the future)."""
    conditioned: bool = True
    """False holds W at 0: one static learned gate per head, the baseline to compare with."""
    init: float = 3.0
    """Initial gate logit b (sigmoid(3) ~ 0.95, as model.gate_init)."""
    variance_weight: float = 0.0
    """Weight of the batch variance of per-sequence gates (> 0 penalises, < 0 rewards variation)."""
    ema_decay: float = 0.99
    """Decay of the per-head EMA of the batch-mean gate over training steps, in [0, 1)."""
    ema_mix: float = 0.0
    """Share of the applied gate taken from the EMA, in [0, 1); 0 applies the raw gate."""


def parse(cfg: RunConfig, raw: object) -> GateOptions:
    """Validated :class:`GateOptions` from ``[intervene.conditioned_gates]``."""
    prefix = "intervene.conditioned_gates"
    opts = GateOptions(**parse_table(prefix, raw, GateOptions))
    for i, layer in enumerate(opts.layers):
        if not 0 <= layer < cfg.model.n_layers:
            fail(f"{prefix}.layers[{i}]: layer {layer} does not exist (model.n_layers = {cfg.model.n_layers})")
    if len(set(opts.layers)) != len(opts.layers):
        fail(f"{prefix}.layers: duplicate layer")
    if opts.pool not in POOLS:
        fail(f"{prefix}.pool: unknown pooling {opts.pool!r} ({' | '.join(POOLS)})")
    if not abs(opts.init) <= 100:  # as model.gate_init: a float32 logit, saturated long before
        fail(f"{prefix}.init: must be within +-100 (sigmoid is 0 or 1 in float32 past +-17), got {opts.init}")
    if not 0.0 <= opts.ema_decay < 1.0:
        fail(f"{prefix}.ema_decay: must be in [0, 1), got {opts.ema_decay}")
    if not 0.0 <= opts.ema_mix < 1.0:  # at 1 the applied gate is the EMA alone, which no gradient reaches
        fail(f"{prefix}.ema_mix: must be in [0, 1) (at 1 the gates could never learn), got {opts.ema_mix}")
    return opts


def _pool(x: Tensor, causal: bool) -> Tensor:
    """Mean over positions (dim 1): prefix means if causal, else one mean broadcast to every position."""
    if causal:
        counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)
        return x.cumsum(1) / counts.view(1, -1, *([1] * (x.ndim - 2)))  # same shape as x
    return x.mean(1, keepdim=True).expand_as(x)


class ConditionedGates:
    """Input-conditioned gates on the heads of chosen layers."""

    name = "conditioned_gates"

    def __init__(self, opts: GateOptions, cfg: RunConfig, device: torch.device):
        m = cfg.model
        self.opts, self.cfg, self.device = opts, cfg, device
        self.layers = list(opts.layers or range(m.n_layers))
        n, H, width = len(self.layers), m.n_heads, m.head_dim + m.d_model
        W = torch.zeros(n, H, width, device=device)  # (Lg, H, d_head + d_model): starts static
        self.W = nn.Parameter(W) if opts.conditioned else W
        self.b = nn.Parameter(torch.full((n, H), opts.init, device=device))  # (Lg, H)
        self.ema = torch.sigmoid(self.b.detach()).clone()  # (Lg, H)
        self._pending: Tensor | None = None  # last step's batch-mean gates, folded in by begin_step

    def parameters(self) -> list[nn.Parameter]:
        return [self.W, self.b] if self.opts.conditioned else [self.b]

    def hooks(self, cap: dict, capture: bool = True) -> list:
        """resid_pre is kept per layer; the hook_z hook gates z and keeps the per-sequence gates."""
        causal = self.opts.pool == "causal"
        resid: dict[int, Tensor] = {}
        out = []
        for i, layer in enumerate(self.layers):
            def keep(x: Tensor, name: str, layer=layer) -> None:
                resid[layer] = x  # (B, T, d)

            def gate(z: Tensor, name: str, i=i, layer=layer) -> Tensor:
                B, T, H, dh = z.shape
                zbar = F.layer_norm(_pool(z, causal), (dh,))  # (B, T, H, dh)
                x = resid.pop(layer)
                cbar = F.layer_norm(_pool(x, causal), (x.shape[-1],))  # (B, T, d)
                inp = torch.cat([zbar, cbar[:, :, None, :].expand(B, T, H, -1)], dim=-1)  # (B, T, H, dh + d)
                g = torch.sigmoid(torch.einsum("bthi,hi->bth", inp, self.W[i]) + self.b[i])  # (B, T, H)
                cap[("own", layer)] = g.mean(1)  # (B, H): gbar, what the EMA and the variance term see
                if self.opts.ema_mix:
                    g = (1 - self.opts.ema_mix) * g + self.opts.ema_mix * self.ema[i]  # (B, T, H)
                cap[layer] = g.mean(1)  # (B, H): the gate each sequence got, averaged over positions
                return z * g[..., None]  # (B, T, H, dh)

            out += [(f"blocks.{layer}.hook_resid_pre", keep), (f"blocks.{layer}.attn.hook_z", gate)]
        return out

    def begin_step(self) -> None:
        """Fold the previous training step's gates into the EMA (called as each training step begins)."""
        if self._pending is not None:
            d = self.opts.ema_decay
            self.ema = d * self.ema + (1 - d) * self._pending  # (Lg, H)
            self._pending = None

    def loss(self, step: int, tokens: Tensor, logits: Tensor, cap: dict) -> Tensor:
        gbar = torch.stack([cap[("own", layer)] for layer in self.layers])  # (Lg, B, H)
        self._pending = gbar.detach().mean(1)  # (Lg, H); the EMA moves when the next step begins
        if not self.opts.variance_weight:
            return logits.new_zeros(())
        return self.opts.variance_weight * gbar.var(dim=1, unbiased=False).mean()

    def variables(self, n_snapshots: int) -> dict:
        L, H, P = self.cfg.model.n_layers, self.cfg.model.n_heads, self.cfg.record.n_probe
        return {
            "conditioned_gate": (("snapshot", "layer", "head", "probe"), (n_snapshots, L, H, P), "float32"),
            "conditioned_gate_ema": (("snapshot", "layer", "head"), (n_snapshots, L, H), "float32"),
        }

    def blocks(self, tokens: Tensor, logits: Tensor, cap: dict) -> dict[str, np.ndarray]:
        L, H, P = self.cfg.model.n_layers, self.cfg.model.n_heads, tokens.shape[0]
        gates = np.full((L, H, P), np.nan, dtype=np.float32)
        ema = np.full((L, H), np.nan, dtype=np.float32)
        for i, layer in enumerate(self.layers):
            gates[layer] = cap[layer].T.float().cpu().numpy()  # (H, P)
            ema[layer] = self.ema[i].float().cpu().numpy()
        return {"conditioned_gate": gates, "conditioned_gate_ema": ema}

    def describe(self) -> dict:
        return asdict(self.opts) | {"layers": self.layers}

    def state_dict(self) -> dict:
        """Weights and the EMA as the forward of the last step given to :meth:`loss` saw them.

        train.py checkpoints after ``loss(step)`` and before the optimiser update, and resumes
        by running that step again, which recomputes the pending EMA update.
        """
        return {"W": self.W.detach().clone(), "b": self.b.detach().clone(), "ema": self.ema.clone()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.W.copy_(state["W"])  # in place: the optimiser holds these tensors
            self.b.copy_(state["b"])
        self.ema = state["ema"].to(self.device).clone()
        self._pending = None
