"""Attention templates: pin chosen heads toward a fixed attention pattern while training.

The specialisation essay's "forced template" experiment: instead of letting a head find its
role, tell it the role. Soft mode adds ``w(step) * mean_heads KL(template || A_head)`` to the
training objective, where A is the head's causal attention on the training batch; hard mode
replaces the head's attention by the template outright (the ``hook_pattern`` hook returns
it), so the head's output is exactly ``template @ V``. Running the same config with weight 0
records the same ``template_kl`` for a free model, which is the comparison the essay makes
(templates train slower and end worse than free specialisation).

The KL runs from the template to the head, ``KL(T || A)``: templates are mostly one-hot, and
the other direction would be infinite wherever A puts mass outside the template's support.

Templates (``T[i, k]``, causal, rows sum to 1):

- ``previous_token``: ``T[i, i-1] = 1`` (Voita et al. 2019's positional head; the delta = 1
  slash of Cheng et al. 2026, arXiv 2601.08297);
- ``offset``: ``T[i, i-delta] = 1``, a slash head at offset delta;
- ``local``: uniform over the last ``width`` keys ``max(0, i-width+1) .. i`` (the band the
  "local" role of ``dynamics.analysis.roles`` scores);
- ``uniform``: uniform over keys ``0 .. i``;
- ``first_token``: ``T[i, 0] = 1`` (an attention sink at position 0, Gu et al. 2025).

Queries with no key at the template's offset (``i < delta``) attend to the first token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from dynamics.config import RunConfig
from dynamics.interventions.common import check_schedule, fail, kl_rows, parse_heads, parse_table, schedule_factor

PATTERNS = ("previous_token", "offset", "local", "uniform", "first_token")
"""Template names."""


def template_pattern(kind: str, n: int, *, delta: int = 1, width: int = 3) -> np.ndarray:
    """The template attention matrix of one head.

    Parameters
    ----------
    kind : str
        One of :data:`PATTERNS`.
    n : int
        Sequence length T (queries = keys = T).
    delta : int
        ``offset``: how far back each query attends (``previous_token`` is delta = 1).
    width : int
        ``local``: number of most recent keys (offsets 0 .. width-1) shared uniformly.

    Returns
    -------
    numpy.ndarray, shape (n, n), float64
        Lower-triangular (causal), every row sums to 1.

    Example
    -------
    >>> template_pattern("previous_token", 3)
    array([[1., 0., 0.],
           [1., 0., 0.],
           [0., 1., 0.]])
    """
    # as a config's [intervene.templates] is checked: width 0 gave NaN rows, delta 0 a self
    # pattern, a negative delta an IndexError
    if not n >= 1:
        raise ValueError(f"template_pattern: n must be >= 1, got {n}")
    if kind == "offset" and not delta >= 1:  # queries before the offset attend to token 0, so any n works
        raise ValueError(f"template_pattern: delta must be >= 1, got {delta}")
    if kind == "local" and not width >= 1:
        raise ValueError(f"template_pattern: width must be >= 1, got {width}")
    rows = np.arange(n)
    out = np.zeros((n, n))
    if kind in ("previous_token", "offset"):
        d = 1 if kind == "previous_token" else delta
        out[rows, np.maximum(rows - d, 0)] = 1.0  # queries before the offset fall back to token 0
    elif kind == "local":
        keys = np.arange(n)
        band = (keys[None, :] <= rows[:, None]) & (keys[None, :] > rows[:, None] - width)  # (n, n)
        out = band / band.sum(1, keepdims=True)
    elif kind == "uniform":
        causal = np.tril(np.ones((n, n)))
        out = causal / causal.sum(1, keepdims=True)
    elif kind == "first_token":
        out[:, 0] = 1.0
    else:
        raise ValueError(f"unknown template {kind!r} ({' | '.join(PATTERNS)})")
    return out


@dataclass(frozen=True)
class TemplateHead:
    """One pinned head: ``{ layer = 0, head = 1, pattern = "offset", delta = 3 }``."""

    layer: int
    """Layer of the head."""
    head: int
    """Head index within the layer."""
    pattern: str
    """Template: previous_token | offset | local | uniform | first_token."""
    delta: int = 1
    """offset: attend this many positions back (>= 1, < model.context)."""
    width: int = 3
    """local: band of the last `width` keys (>= 1)."""
    hard: bool | None = None
    """Clamp this head to its template; unset means the table's `hard`."""


@dataclass(frozen=True)
class TemplateOptions:
    """``[intervene.templates]``."""

    heads: tuple[TemplateHead, ...]
    """The pinned heads (an array of inline tables)."""
    weight: float = 1.0
    """Weight of the mean per-head KL(template || attention) at full strength; 0 records only."""
    schedule: str = "constant"
    """How the weight changes: constant | warmup | linear_decay | cosine_decay."""
    ramp_steps: int = 0
    """Length of the warm-up or decay in steps; 0 means train.steps."""
    hard: bool = False
    """Clamp every pinned head's attention to its template (heads may override)."""


def parse(cfg: RunConfig, raw: object) -> TemplateOptions:
    """Validated :class:`TemplateOptions` from the ``[intervene.templates]`` table."""
    prefix = "intervene.templates"
    kw = parse_table(prefix, raw, TemplateOptions, nested=("heads",))
    entries = kw["heads"]
    if not isinstance(entries, list) or not entries:
        fail(f"{prefix}.heads: expected a non-empty list of {{ layer, head, pattern }} tables")

    def check(key: str, h: TemplateHead) -> None:
        if h.pattern not in PATTERNS:
            fail(f"{key}.pattern: unknown template {h.pattern!r} ({' | '.join(PATTERNS)})")
        if not 1 <= h.delta < cfg.model.context:
            fail(f"{key}.delta: must be in [1, model.context), got {h.delta}")
        if not 1 <= h.width <= cfg.model.context:
            # past the context the band is every causal key, as at the context: another run id
            # for the same training
            fail(f"{key}.width: must be in [1, model.context = {cfg.model.context}], got {h.width}")

    heads = parse_heads(prefix, entries, TemplateHead, cfg, check=check, duplicate="head ({layer}, {head}) is pinned twice")
    opts = TemplateOptions(**{**kw, "heads": heads})
    if opts.weight < 0:
        fail(f"{prefix}.weight: must be >= 0, got {opts.weight}")
    check_schedule(prefix, opts.schedule, opts.ramp_steps)
    return opts


class Templates:
    """Soft (KL penalty) and hard (clamped) attention templates on chosen heads."""

    name = "templates"

    def __init__(self, opts: TemplateOptions, cfg: RunConfig, device: torch.device):
        self.opts, self.cfg, self.device = opts, cfg, device
        self.layers = sorted({h.layer for h in opts.heads})
        self._templates: dict[tuple[int, int], Tensor] = {}  # (layer, T) -> (H, T, T), zeros off-template
        self.last_step = 0

    def parameters(self) -> list:
        return []  # the templates are fixed

    def _hard(self, h: TemplateHead) -> bool:
        return self.opts.hard if h.hard is None else h.hard

    def _layer(self, layer: int, n: int) -> Tensor:
        """Templates of one layer at length n, (H, n, n); heads without a template hold zeros."""
        key = (layer, n)
        if key not in self._templates:
            out = np.zeros((self.cfg.model.n_heads, n, n))
            for h in self.opts.heads:
                if h.layer == layer:
                    out[h.head] = template_pattern(h.pattern, n, delta=h.delta, width=h.width)
            self._templates[key] = torch.tensor(out, dtype=torch.float32, device=self.device)
        return self._templates[key]

    def _heads(self, layer: int, hard: bool | None = None) -> list[int]:
        return [h.head for h in self.opts.heads if h.layer == layer and (hard is None or self._hard(h) == hard)]

    def weight(self, step: int) -> float:
        o = self.opts
        return o.weight * schedule_factor(o.schedule, step, o.ramp_steps or self.cfg.train.steps)

    def hooks(self, cap: dict, capture: bool = True) -> list:
        """Capture the scores of templated layers; clamp hard heads' patterns to their templates."""
        out = []
        for layer in self.layers:
            if capture:
                def keep(scores: Tensor, name: str, layer=layer) -> None:
                    cap[layer] = scores  # (B, H, Tq, Tk), causal entries -inf, in the graph
                out.append((f"blocks.{layer}.attn.hook_attn_scores", keep))
            hard = self._heads(layer, hard=True)
            if hard:
                mask = torch.zeros(self.cfg.model.n_heads, dtype=torch.bool, device=self.device)
                mask[hard] = True

                def clamp(pattern: Tensor, name: str, layer=layer, mask=mask) -> Tensor:
                    tmpl = self._layer(layer, pattern.shape[-1]).to(pattern.dtype)  # (H, T, T)
                    return torch.where(mask[:, None, None], tmpl, pattern)  # (B, H, T, T): exact template
                out.append((f"blocks.{layer}.attn.hook_pattern", clamp))
        return out

    def _kl(self, cap: dict) -> list[tuple[int, int, Tensor]]:
        """(layer, head, KL per query averaged over batch and queries) for every pinned head."""
        out = []
        for layer in self.layers:
            scores = cap[layer]  # (B, H, T, T)
            heads = self._heads(layer)
            log_a = scores[:, heads].float().log_softmax(-1)  # (B, nh, T, T)
            tmpl = self._layer(layer, scores.shape[-1])[heads]  # (nh, T, T)
            kl = kl_rows(tmpl, log_a).mean(dim=(0, 2))  # (nh,)
            out.extend((layer, h, kl[i]) for i, h in enumerate(heads))
        return out

    def begin_step(self) -> None:
        pass  # no state carried between steps

    def loss(self, step: int, tokens: Tensor, logits: Tensor, cap: dict) -> Tensor:
        self.last_step = step
        w = self.weight(step)
        if w == 0.0:
            return logits.new_zeros(())
        return w * torch.stack([kl for _, _, kl in self._kl(cap)]).mean()

    def variables(self, n_snapshots: int) -> dict:
        L, H = self.cfg.model.n_layers, self.cfg.model.n_heads
        return {
            "template_kl": (("snapshot", "layer", "head"), (n_snapshots, L, H), "float32"),
            "template_weight": (("snapshot",), (n_snapshots,), "float32"),
        }

    def blocks(self, tokens: Tensor, logits: Tensor, cap: dict) -> dict[str, np.ndarray]:
        L, H = self.cfg.model.n_layers, self.cfg.model.n_heads
        kl = np.full((L, H), np.nan, dtype=np.float32)
        for layer, head, value in self._kl(cap):
            kl[layer, head] = value.item()
        return {"template_kl": kl, "template_weight": np.float32(self.weight(self.last_step))}

    def describe(self) -> dict:
        heads = [asdict(h) | {"hard": self._hard(h)} for h in self.opts.heads]
        return asdict(self.opts) | {"heads": heads, "ramp_steps": self.opts.ramp_steps or self.cfg.train.steps}

    def state_dict(self) -> dict:
        return {}  # the weight is a pure function of the step

    def load_state_dict(self, state: dict) -> None:
        pass
