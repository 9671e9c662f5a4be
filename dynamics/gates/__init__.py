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
  signs here are the paper's (pinned by ``tests/test_gates_maths.py`` and ``tests/test_gates_fit.py``).
- Contrastive CHG retains one component while forgetting another:
  ``-logp_retain + clamp(logp_forget - stopgrad(logp_retain), min=-max_diff)
  - lambda * mean(clamp(logit, -4, 4))`` (logp = mean per-token log-probability).

Defaults follow the authors' trainer (``l1_weight=0.1, l1_clamp=4, lr=1.0, grad_norm=1.0``,
init gates U(0, 1), here U(0.01, 0.99) so that no logit is infinite) except where measured otherwise on
this project's models:

- lambda defaults to the authors' 0.1, but note: gating *all* heads by a common factor is nearly free in a
  pre-LayerNorm model whose residual stream is mostly head output (LayerNorm removes the
  common scale), and along that direction the regulariser pushes with lambda in total. At 0.1
  the G- fit of two 2-layer attention-only models settled in such a uniform shrink (every G-
  0.2-0.5) whose ranking of heads was mostly noise: Spearman rho with single-head ablation
  0.29-0.67, against 0.83-0.86 at 0.3 (a 2-layer model with MLPs: 0.86-0.91 at either, once
  trained; the mixture task's at 400 steps gave -0.95 at 0.1 and 0.74 at 0.3, every head then
  "irrelevant", and at 3000 steps 0.64: `dynamics gates` says so below rho 0.3), so
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

Modules
-------
- :mod:`~dynamics.gates.options`: role codes (``CHG_ROLES``, ``FACILITATING`` ...), stages,
  ``HELDOUT_STEP`` and :class:`GateOptions`.
- :mod:`~dynamics.gates.maths`: the objectives (``chg_loss``, ``contrastive_loss``), role labels and
  their agreement, ``component_weights``, ``layer_normalised``, ``rank_agreement`` (and why it is undefined).
- :mod:`~dynamics.gates._engine`: eval batches, initial logits, NLL per gate set, Adam, scoring.
- :mod:`~dynamics.gates.fit`: ``fit_chg`` and the recorder's ``chg_snapshot``.
- :mod:`~dynamics.gates.contrastive`: ``parse_contrast`` and ``fit_contrastive``.
- :mod:`~dynamics.gates.ablation`: ``ablation_losses``, ``head_ablation``, ``set_ablation``,
  ``head_importance`` (Michel et al. 2019's gradient importance, an order of the pruning curves).
- :mod:`~dynamics.gates.pruning`: ``pruning_order`` and ``pruning_curves``.
- :mod:`~dynamics.gates.report`: ``check_fittable``, ``gate_report``, ``report_table``, ``report_lines``,
  ``save_fit`` (``dynamics gates``; it names the fit a save replaces, which ``store.write_derived`` does not).
"""

# `name as name`: module-level names kept reachable as gates.<name>, outside __all__.
from dynamics.gates.ablation import ablation_losses, head_ablation, head_importance, set_ablation
from dynamics.gates.contrastive import fit_contrastive, parse_contrast
from dynamics.gates.fit import chg_snapshot, fit_chg
from dynamics.gates.maths import (
    chg_loss,
    chg_roles,
    component_weights,
    contrastive_loss,
    label_agreement,
    rank_agreement,
    rank_agreement_undefined,
    tied_majority,
)
from dynamics.gates.options import CHG_ROLES, GateOptions
from dynamics.gates.options import FACILITATING as FACILITATING
from dynamics.gates.options import HELDOUT_STEP as HELDOUT_STEP
from dynamics.gates.options import INCONSISTENT as INCONSISTENT
from dynamics.gates.options import INTERFERING as INTERFERING
from dynamics.gates.options import IRRELEVANT as IRRELEVANT
from dynamics.gates.options import PRUNE_ORDERS as PRUNE_ORDERS
from dynamics.gates.options import RESTART as RESTART
from dynamics.gates.options import STAGES as STAGES
from dynamics.gates.options import UNFITTED as UNFITTED
from dynamics.gates.pruning import pruning_curves, pruning_order
from dynamics.gates.report import check_fittable, gate_report, report_lines, report_table

__all__ = [
    "CHG_ROLES", "GateOptions", "fit_chg", "chg_snapshot", "chg_roles", "label_agreement", "chg_loss",
    "contrastive_loss", "fit_contrastive", "parse_contrast", "ablation_losses", "head_ablation",
    "set_ablation", "head_importance", "component_weights", "pruning_order", "pruning_curves", "rank_agreement",
    "rank_agreement_undefined", "tied_majority",
    "check_fittable", "gate_report", "report_table", "report_lines",
]
