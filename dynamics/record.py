"""The recorder: when to take snapshots, and what a snapshot holds.

A snapshot turns the live model into named numpy blocks (see ``schema.RUN_VARIABLES``):
attention on a fixed probe batch (one batched eager forward), per-head gradient norms
and gate gradients taken from the gradients the training step already computed (no extra
backward pass), and held-out loss per task component. The importance is E_x |dL(x)/dg| over
the sequences x of the step's batch, L(x) a sequence's training objective (its mean loss, with
any intervention's terms; not learned gates' L1). A term that is not a mean over sequences, the
conditioned gates' batch variance (``variance_weight``), couples them: there B dL/dxi_x, x's
share of the batch objective's gradient, stands for dL(x)/dxi, and holds the other sequences'
part of that term too. Where a learned gate is exactly 0 (its logit below about -88) no
sequence's gradient reaches it through xi, and the batch's |dL/dg| stands in (g times either is
0). Times the gate g it is Michel et al. 2019's E_x |dL(x)/dxi|, xi a gate held at 1 on the
head's output (`dynamics.analysis.bifurcation.head_importance`; the same where g = 1). Each
sequence's dL(x)/dxi comes from the training backward too: at a snapshot's step the forward
takes a gate of ones per sequence and head (`Recorder.sequence_gates`), which changes no value.
Runs begun before that (no ``importance_form`` attr) hold |dL/dg| of the batch's mean loss:
there the sequences' gradients cancel, and at the end of training what is left is mostly the
batch's noise (README, Recorded arrays).
The trainer hands the blocks to the store; nothing here touches zarr.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dynamics import schema
from dynamics.budget import snapshot_steps as snapshot_steps  # torch-free, for the sweep grid too
from dynamics.config import RunConfig
from dynamics.model import Transformer
from dynamics.tasks import make_batch

PER_SEQUENCE = "per_sequence"
"""A run's ``importance_form`` attr where ``importance`` is the mean over the batch's sequences of
|dL(x)/dg|; absent where it is |dL/dg| of the batch's mean loss (runs begun before it)."""


def importance_attrs(start: int, prior: dict) -> dict:
    """The run attrs a run trained from step ``start`` takes for its importance: ``importance_form``
    `PER_SEQUENCE`, unless it resumes from a checkpoint of a run begun before that form (``prior``,
    its attrs, name none), which keeps the batch form it began with, so that one run is one form."""
    return {"importance_form": PER_SEQUENCE} if start == 0 or prior.get("importance_form") == PER_SEQUENCE else {}


def chg_fitted(cfg: RunConfig, steps_at: np.ndarray) -> np.ndarray:
    """Per snapshot of ``steps_at``: is CHG fitted there (``record.chg_every``: every k-th
    snapshot and the last; none when 0)."""
    k = cfg.record.chg_every
    if not k:
        return np.zeros(steps_at.size, dtype=bool)
    return (np.arange(steps_at.size) % k == 0) | (steps_at == cfg.train.steps)


def store_head_weights(cfg: RunConfig) -> bool:
    """Whether head weight slices are recorded (auto: up to d_model 256)."""
    return schema.head_weights_recorded(cfg.record.head_weights, cfg.model.d_model)


def variables(cfg: RunConfig, n_snapshots: int) -> dict[str, tuple]:
    """Name -> (dims, shape, dtype[, fill]) of every recorded array of a run (see store.RunWriter)."""
    m, r = cfg.model, cfg.record
    L, H, P, T = m.n_layers, m.n_heads, r.n_probe, m.context
    S, C = n_snapshots, len(cfg.task.component_names)
    shapes = {
        "attention": ((S, L, H, P, T, T), r.attention_dtype),
        "probe_tokens": ((P, T), "int64"),
        "grad_norm": ((S, L, H, 4), "float32"),
        "grad_cosine": ((S, L, H, 4), "float32"),
        "importance": ((S, L, H), "float32"),
        "gate": ((S, L, H), "float32"),
        "loss": ((cfg.train.steps,), "float32"),
        "eval_loss": ((S, C), "float32"),
    }
    if store_head_weights(cfg):
        shapes["head_weights"] = ((S, L, H, 4, m.d_model, m.head_dim), "float32")
    if r.chg_every:
        from dynamics.gates import UNFITTED

        shapes["chg"] = ((S, L, H, 2), "float32")
        shapes["chg_role"] = ((S, L, H), "int8", UNFITTED)  # 0 is "facilitating": unwritten must not read as it
    return {name: (schema.RUN_VARIABLES[name], *spec) for name, spec in shapes.items()}


def coords(cfg: RunConfig, steps_at: np.ndarray) -> dict[str, tuple[str, np.ndarray]]:
    """Coordinate arrays of a run."""
    m = cfg.model
    out = {
        "step": (schema.SNAPSHOT, steps_at.astype(np.int64)),
        "layer": (schema.LAYER, np.arange(m.n_layers)),
        "head": (schema.HEAD, np.arange(m.n_heads)),
        "weight": (schema.WEIGHT, np.array(schema.WEIGHTS)),
        "component": (schema.COMPONENT, np.array(cfg.task.component_names)),
        "train_step": (schema.TRAIN_STEP, np.arange(cfg.train.steps)),
    }
    if cfg.record.chg_every:
        out["fit"] = (schema.FIT, np.array(schema.FITS))
    return out


class Recorder:
    """Builds snapshot blocks for one run; holds the probe and eval batches drawn once.

    The previous snapshot's per-head gradients are kept so gradient-direction agreement
    between snapshots (``grad_cosine``) costs one cosine, and they travel in checkpoints
    so a resumed run records exactly what an uninterrupted one would.
    """

    def __init__(self, cfg: RunConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        r = cfg.record
        probe = make_batch(cfg, "probe", 0, r.n_probe)
        self.probe_tokens = probe.tokens[:, :-1]  # (P, T)
        self._probe = torch.from_numpy(self.probe_tokens).to(device)
        self._eval = []  # per component: list of (B, T+1) token tensors
        for name in cfg.task.component_names:
            batches = [make_batch(cfg, "eval", i, r.eval_batch_size, component=name).tokens
                       for i in range(cfg.train.eval_batches)]
            self._eval.append(torch.from_numpy(np.concatenate(batches)).to(device))
        self.prev_grads: torch.Tensor | None = None
        self.with_weights = store_head_weights(cfg)

    @torch.no_grad()
    def attention(self, model: Transformer) -> np.ndarray:
        """Post-softmax attention on the probe batch, one eager forward -> (L, H, P, T, T)."""
        _, cache = model.run_with_cache(self._probe, names=lambda n: n.endswith("hook_pattern"))
        pattern = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"]
                               for layer in range(self.cfg.model.n_layers)])  # (L, P, H, T, T)
        # torch's conversion is vectorised (numpy's float16 cast took ~10x as long, on the
        # training thread) and, on a GPU, halves the copy out; both round to nearest even.
        dtype = getattr(torch, self.cfg.record.attention_dtype)
        return pattern.transpose(1, 2).to(dtype).cpu().numpy()  # (L, H, P, T, T)

    @torch.no_grad()
    def eval_loss(self, model: Transformer) -> np.ndarray:
        """Held-out next-token loss per task component -> (C,)."""
        out = []
        for tokens in self._eval:
            logits = model(tokens[:, :-1])  # (B, T, V)
            out.append(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item())
        return np.array(out, dtype=np.float32)

    def chg(self, model: Transformer, fit: bool, progress=None) -> dict[str, np.ndarray]:
        """Causal head gating at this snapshot (Nam et al. 2025), or the unfitted markers;
        ``progress(stage, done, total)`` after each update of the fit (see ``chg_snapshot``)."""
        from dynamics.gates import UNFITTED, chg_snapshot

        L, H = self.cfg.model.n_layers, self.cfg.model.n_heads
        if not fit:
            return {"chg": np.full((L, H, 2), np.nan, dtype=np.float32),
                    "chg_role": np.full((L, H), UNFITTED, dtype=np.int8)}
        chg, role = chg_snapshot(model, self.cfg, progress=progress)
        return {"chg": chg, "chg_role": role}

    @staticmethod
    def sequence_gates(model: Transformer, batch_size: int) -> torch.Tensor:
        """Gates of ones, (B, L, H), for the training forward at a snapshot's step (its
        ``head_gates``): after the backward their .grad holds each sequence's share of the
        objective's gradient, ``(1 / B) dL(x)/dxi``, which :meth:`gradient_stats` reads."""
        L, H = model.cfg.n_layers, model.cfg.n_heads
        return torch.ones(batch_size, L, H, device=model.W_E.device, dtype=model.W_E.dtype, requires_grad=True)

    @torch.no_grad()
    def snapshot(self, model: Transformer, sequence_grads: torch.Tensor | None = None) -> dict[str, np.ndarray]:
        """All per-snapshot blocks; call after backward on this step's training batch (see
        :meth:`gradient_stats` for ``sequence_grads``)."""
        return {"attention": self.attention(model), **self.gradient_stats(model, sequence_grads),
                "eval_loss": self.eval_loss(model)}

    @staticmethod
    def _importance(model: Transformer, sequence_grads: torch.Tensor | None) -> torch.Tensor:
        """(L, H): E_x |dL(x)/dg| from the sequence gates' grads, else |dL/dg| of the batch."""
        batch = model.gate_grads().abs()  # (L, H)
        if sequence_grads is None:
            return batch
        B = sequence_grads.shape[0]
        # The objective is the mean over sequences, so a gate's grad is (1/B) dL(x)/dxi; and the
        # head's output is g xi z, so dL(x)/dxi = g dL(x)/dg. Float64: a gate shut to 1e-26 (a
        # learned one) scales the grads with it. Where g is 0 no sequence's dL(x)/dg is left in
        # them, and g times either form is 0: the batch's, exact there, stands in.
        per = (sequence_grads.double() * B).abs().mean(0)  # (L, H): E_x |dL(x)/dxi|
        g = model.gate_values().double()  # (L, H)
        return torch.where(g > 0, per / torch.where(g > 0, g, 1.0), batch.double())

    @torch.no_grad()
    def gradient_stats(self, model: Transformer, sequence_grads: torch.Tensor | None = None) -> dict[str, np.ndarray]:
        """The blocks a snapshot takes from the gradients already computed and the parameters:
        per-head gradient norms and cosines to the last snapshot's, gate importance and values,
        and head weights when recorded. Keeps this snapshot's gradients for the next cosine.
        (Its own method so that bench/record.py times what a snapshot runs.)

        ``sequence_grads``: the .grad of :meth:`sequence_gates` (B, L, H), from which the
        importance is the mean over sequences of |dL(x)/dg|; None gives |dL/dg| of the batch's
        mean loss (`PER_SEQUENCE`)."""
        grads = model.head_grads()  # (L, H, 4, d_model, d_head)
        # Norms and cosines in float64: float32 squares of entries below ~1e-19 (init_scale 1e-8,
        # a gate shut to 1e-26) underflowed, so grad_norm read 0 and grad_cosine 1e6 for real gradients.
        flat = grads.flatten(3).double()  # (L, H, 4, d_model*d_head)
        if self.prev_grads is None:
            cosine = torch.full(flat.shape[:3], float("nan"))
        else:
            prev = self.prev_grads.flatten(3).double()  # (L, H, 4, d_model*d_head)
            # eps below any float32 gradient's norm (its least subnormal, 1.4e-45): it never stands in for one
            cosine = F.cosine_similarity(flat, prev, dim=-1, eps=1e-300)  # (L, H, 4)
            # No direction to compare where either gradient is zero (a hard-templated head's W_Q,
            # W_K at template weight 0): undefined, NaN, rather than torch's 0, read as orthogonal.
            zero = (flat == 0).all(dim=-1) | (prev == 0).all(dim=-1)  # (L, H, 4)
            cosine = cosine.masked_fill(zero, float("nan"))
        self.prev_grads = grads  # a fresh stack, not a view of the live .grad tensors
        blocks = {
            # = model.head_grad_norms(), from the slices already stacked above
            "grad_norm": flat.norm(dim=-1).float().cpu().numpy(),
            "grad_cosine": cosine.float().cpu().numpy(),
            "importance": self._importance(model, sequence_grads).float().cpu().numpy(),
            "gate": model.gate_values().float().cpu().numpy(),
        }
        if self.with_weights:
            blocks["head_weights"] = model.head_weights().float().cpu().numpy()
        return blocks
