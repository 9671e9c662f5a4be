"""A small decoder-only transformer, written to be inspected.

The layout follows nanoGPT (karpathy/nanoGPT, model.py): one config passed whole, pre-LayerNorm
blocks, shapes written at the tensor line. Weights and hook names follow TransformerLens
(TransformerLensOrg/TransformerLens): per-head ``W_Q, W_K, W_V`` of shape (H, d_model, d_head) and
``W_O`` of shape (H, d_head, d_model), and identity :class:`HookPoint` modules whose names come
from the module tree (``blocks.0.attn.hook_pattern``), so no registry is kept by hand.

Per-head gates multiply each head's output z before W_O (Michel, Levy, Neubig 2019, "Are Sixteen
Heads Really Better than One?"; Nam et al. 2025, causal head gating, arXiv 2505.13737):
``Z_{l,h} = g_{l,h} * softmax(Q K^T / sqrt(d_head)) V``. With ``gates = "fixed"`` g is a parameter
of ones kept out of the optimiser, so each backward yields dL/dg (head importance). With
``gates = "learned"`` g = sigmoid(gate_logit) is trained. RoPE uses the rotate-half convention
(Su et al. 2021, "RoFormer", arXiv 2104.09864; as in GPT-NeoX and Llama); when no hook sees q or
k, the same rotation is computed on reordered channels by one complex multiply (``_pairs_last``).

Init: every matrix uses ``cfg.init``; W_Q/W_K/W_V/W_O use the fans of the full matrix
(d_model x H*d_head) and are then multiplied by ``cfg.init_scale``. The embeddings W_E and W_pos
are lookup tables, for which fans mean nothing, so they always get normal(0, 0.02) (GPT-2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dynamics.config import ModelConfig

HookFn = Callable[[Tensor, str], Tensor | None]


def require_float32() -> None:
    """RuntimeError unless torch's default dtype is float32, the dtype runs train in.

    The parameters, and every tensor made without a dtype, follow the default: a run trained in a
    process that set float64 (for an analysis, say) recorded other arrays under the same run id,
    and a resume there mixed the two.
    """
    if (dtype := torch.get_default_dtype()) != torch.float32:
        raise RuntimeError(f"torch's default dtype is {dtype} in this process, but runs train in float32 (one run id, "
                           f"one set of arrays): call torch.set_default_dtype(torch.float32) before training")


class HookPoint(nn.Module):
    """Identity module marking an activation; hooks may read or replace the tensor.

    ``name`` is set by :class:`Transformer` from the module tree. Hooks are plain functions
    ``fn(tensor, name) -> tensor | None`` (None keeps the tensor), run in the order added; they
    see the tensor with its autograd graph, so an intervention can be trained through.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name = ""
        self.fns: list[HookFn] = []

    @property
    def active(self) -> bool:
        return bool(self.fns)

    def forward(self, x: Tensor) -> Tensor:
        for fn in self.fns:
            out = fn(x, self.name)
            if out is not None:
                x = out
        return x


def apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding, rotate-half convention.

    Channel i of the first half pairs with channel i of the second half, and the pair is rotated
    by the angle ``position * base ** (-2 i / d_head)``. Rotations preserve norms, and since
    ``R(m)^T R(n) = R(n - m)``, the dot product ``<rope(q, m), rope(k, n)>`` depends on m - n
    only.

    Parameters
    ----------
    x : Tensor, shape (..., T, H, d_head)
        Queries or keys, d_head even.
    positions : Tensor, shape (T,) or (B, T)
        Position of each token (integers or floats).
    base : float
        Frequency base theta.

    Returns
    -------
    Tensor, same shape and dtype as x.

    Example
    -------
    >>> q = torch.randn(2, 5, 4, 8)
    >>> apply_rope(q, torch.arange(5)).shape
    torch.Size([2, 5, 4, 8])
    """
    dtype = torch.promote_types(x.dtype, torch.float32)  # angles need more than half precision
    cos, sin = _rope_angles(positions, x.shape[-1], base, x.device, dtype)  # (..., T, d) each
    return _rotate(x, cos[..., None, :], sin[..., None, :])


def _rope_angles(positions: Tensor, d: int, base: float, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and signed sin of the rotate-half angles, (..., T, d) each: (cos, cos) and (-sin, sin)."""
    inv_freq = base ** (-torch.arange(0, d, 2, device=device, dtype=dtype) / d)  # (d/2,)
    angle = positions.to(device=device, dtype=dtype)[..., None] * inv_freq  # (..., T, d/2)
    cos, sin = angle.cos(), angle.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


_ROPE_CACHE: dict[tuple, tuple[Tensor, Tensor]] = {}


def _rope_table(T: int, d: int, base: float, device: torch.device, dtype: torch.dtype,
                reps: int = 1) -> tuple[Tensor, Tensor]:
    """:func:`_rope_angles` at positions 0..T-1, tiled ``reps`` times along the last dim,
    (T, reps * d) each; computed once per (T, d, base, device, dtype, reps).

    Tiled over heads, the tables broadcast over the batch only, so the elementwise kernels run
    over long contiguous rows instead of d_head-wide pieces.
    """
    key = (T, d, base, device, dtype, reps)
    table = _ROPE_CACHE.get(key)
    if table is None:
        # Plain tensors (not inference-mode ones) so they can be saved for a later backward.
        with torch.inference_mode(False), torch.no_grad():
            cos, sin = _rope_angles(torch.arange(T, device=device), d, base, device, dtype)
            table = cos.repeat(1, reps), sin.repeat(1, reps)
        if len(_ROPE_CACHE) > 64:
            _ROPE_CACHE.clear()
        _ROPE_CACHE[key] = table
    return table


def _rope_pairs_table(T: int, d: int, base: float, device: torch.device, dtype: torch.dtype,
                      reps: int) -> Tensor:
    """e^{i angle} at positions 0..T-1 for the d/2 rotate-half frequencies, tiled ``reps`` times,
    (T, reps, d/2) complex of ``dtype``'s precision; computed once per argument set.

    The angles are :func:`_rope_angles`' own cos and sin, so both paths rotate by the same
    rounded values.
    """
    key = ("pairs", T, d, base, device, dtype, reps)
    table = _ROPE_CACHE.get(key)
    if table is None:
        cos, sin = _rope_table(T, d, base, device, dtype)  # (T, d) each: (cos, cos), (-sin, sin)
        with torch.inference_mode(False), torch.no_grad():
            table = torch.complex(cos[:, : d // 2], sin[:, d // 2:])[:, None, :].repeat(1, reps, 1)
        if len(_ROPE_CACHE) > 64:
            _ROPE_CACHE.clear()
        _ROPE_CACHE[key] = table
    return table


def _pairs_last(w: Tensor) -> Tensor:
    """(..., dh) -> (..., dh/2, 2): channel i beside channel i + dh/2, the pair RoPE rotates.

    Reordering W_Q's and W_K's head channels the same way leaves every q . k unchanged, and
    puts each rotated pair side by side, where one complex multiply turns it.
    """
    return w.unflatten(-1, (2, w.shape[-1] // 2)).transpose(-1, -2)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin, computed in cos's dtype; returns x's dtype.

    With sin signed as (-sin, sin) this is, half by half, ``x1 cos - x2 sin`` and
    ``x2 cos + x1 sin`` rounded exactly as those expressions are (negation is exact).
    """
    xf = x.to(cos.dtype)
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat([x2, x1], dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    """Multi-head causal self-attention with per-head weights and gates."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        H, d, dh = cfg.n_heads, cfg.d_model, cfg.head_dim
        # No q/k/v biases: each head is then exactly its slice of W_Q, W_K, W_V, W_O.
        self.W_Q = nn.Parameter(torch.empty(H, d, dh))
        self.W_K = nn.Parameter(torch.empty(H, d, dh))
        self.W_V = nn.Parameter(torch.empty(H, d, dh))
        self.W_O = nn.Parameter(torch.empty(H, dh, d))
        self.b_O = nn.Parameter(torch.zeros(d))
        if cfg.gates == "fixed":
            self.gate = nn.Parameter(torch.ones(H))  # in the graph, out of the optimiser
        else:
            self.gate_logit = nn.Parameter(torch.full((H,), cfg.gate_init))
            # Added to sigmoid(gate_logit) so that its .grad is dL/dg itself: exact where the
            # sigmoid saturates (chain rule would divide by g(1 - g) ~ 0) and it accumulates
            # like any leaf's grad. Stays 0: out of the optimiser.
            self.gate_probe = nn.Parameter(torch.zeros(H))
        for name in ("q", "k", "v", "rot_q", "rot_k", "attn_scores", "pattern", "z"):
            if cfg.pos == "rope" or not name.startswith("rot"):
                setattr(self, f"hook_{name}", HookPoint())

    def gate_value(self) -> Tensor:
        """g for this layer, shape (H,), in the graph."""
        return self.gate if self.cfg.gates == "fixed" else torch.sigmoid(self.gate_logit) + self.gate_probe

    def forward(self, x: Tensor, head_gates: Tensor | None = None) -> Tensor:
        B, T, d = x.shape
        H, dh = self.cfg.n_heads, self.cfg.head_dim
        rope = self.cfg.pos == "rope"
        if rope:
            dtype = torch.promote_types(x.dtype, torch.float32)  # angles need more than half precision
        w_q, w_k, w_v = self.W_Q, self.W_K, self.W_V  # (H, d, dh) each
        paired = rope and not any(h.active for h in (self.hook_q, self.hook_k, self.hook_rot_q, self.hook_rot_k))
        if paired:  # nobody sees q or k, so their channels may be reordered (see _pairs_last)
            w_q, w_k, w_v = _pairs_last(w_q), _pairs_last(w_k), w_v.unflatten(-1, (dh // 2, 2))  # (H, d, dh/2, 2)
        # One (d, 3*H*dh) matmul instead of three per-head einsums (batched matmuls over H).
        w_qkv = torch.stack((w_q, w_k, w_v), dim=1).transpose(0, 2).reshape(d, 3 * H * dh)
        qkv = x @ w_qkv  # (B, T, 3*H*dh): q | k | v, head-major within each
        if paired:
            # One complex multiply rotates q and k, forward and backward, where rotate-half
            # takes a copy, two products and a sum each way.
            q, k, v = qkv.split(H * dh, dim=-1)  # (B, T, H*dh) each
            turn = _rope_pairs_table(T, dh, self.cfg.rope_base, x.device, dtype, H)  # (T, H, dh/2)
            q, k = (torch.view_as_real(torch.view_as_complex(t.to(dtype).view(B, T, H, dh // 2, 2)) * turn)
                    .to(x.dtype).view(B, T, H, dh) for t in (q, k))  # (B, T, H, dh) each
            v = self.hook_v(v.view(B, T, H, dh))  # (B, T, H, dh)
        else:
            q, k, v = (t.view(B, T, H, dh) for t in qkv.split(H * dh, dim=-1))  # (B, T, H, dh) each
            q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
            if rope:
                cos, sin = _rope_table(T, dh, self.cfg.rope_base, x.device, dtype, H)  # (T, H*dh)
                q = _rotate(q, cos.view(T, H, dh), sin.view(T, H, dh))  # (B, T, H, dh)
                k = _rotate(k, cos.view(T, H, dh), sin.view(T, H, dh))  # (B, T, H, dh)
                q, k = self.hook_rot_q(q), self.hook_rot_k(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, dh)
        if self.hook_attn_scores.active or self.hook_pattern.active:
            # Eager path: someone wants to see (or change) the scores or the pattern.
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (Tq, Tk)
            scores = self.hook_attn_scores(scores.masked_fill(~causal, float("-inf")))
            pattern = self.hook_pattern(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
            z = pattern @ v  # (B, H, T, dh)
        else:
            # Fused kernel: same maths, no (T, T) matrix kept when nobody asks for it.
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, dh)
        z = self.hook_z(z.transpose(1, 2))  # (B, T, H, dh), before the gate
        if head_gates is not None:
            # (H,) -> (H, 1); (B, H) -> (B, 1, H, 1): broadcast over positions and d_head.
            g = head_gates[:, None, :, None] if head_gates.ndim == 2 else head_gates[:, None]
            z = z * g  # (B, T, H, dh)
        # The model's own gate scales W_O's head slices: g_h * (z_h W_O,h) = (g_h z_h) W_O,h, and
        # scaling (H, dh, d) weights costs less than scaling (B, T, H, dh) activations.
        w_o = (self.W_O * self.gate_value()[:, None, None]).reshape(H * dh, d)  # (H*dh, d)
        return torch.addmm(self.b_O, z.reshape(B * T, H * dh), w_o).view(B, T, d)  # (B, T, d)


class MLP(nn.Module):
    """Two-layer GELU MLP (TransformerLens names W_in, W_out)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        B, T, d = x.shape
        # addmm: the bias is added inside the matmul rather than in a separate pass
        pre = self.hook_pre(torch.addmm(self.b_in, x.reshape(B * T, d), self.W_in).view(B, T, -1))  # (B, T, d_mlp)
        post = self.hook_post(F.gelu(pre))  # (B, T, d_mlp)
        return torch.addmm(self.b_out, post.reshape(B * T, -1), self.W_out).view(B, T, d)  # (B, T, d)


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(ln1(x)), then x + mlp(ln2(x)) unless attn_only."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()
        if not cfg.attn_only:
            self.ln2 = nn.LayerNorm(cfg.d_model)
            self.mlp = MLP(cfg)
            self.hook_resid_mid, self.hook_mlp_out = HookPoint(), HookPoint()

    def forward(self, x: Tensor, head_gates: Tensor | None = None) -> Tensor:
        x = self.hook_resid_pre(x)  # (B, T, d)
        x = x + self.hook_attn_out(self.attn(self.ln1(x), head_gates))  # (B, T, d)
        if hasattr(self, "mlp"):
            x = self.hook_resid_mid(x)
            x = x + self.hook_mlp_out(self.mlp(self.ln2(x)))  # (B, T, d)
        return self.hook_resid_post(x)


class Transformer(nn.Module):
    """Decoder-only transformer with per-head gates and TransformerLens hook names.

    Parameters
    ----------
    cfg : ModelConfig
        Architecture; construction is deterministic given ``torch.manual_seed`` beforehand.
    generator : torch.Generator, optional
        Draw the initial weights from this (CPU) generator instead of torch's global one; seeded
        with ``manual_seed(s)`` it gives the same weights as ``torch.manual_seed(s)`` does.

    Notes
    -----
    Gate parameters (fixed ``gate``, learned ``gate_probe``) are not in :meth:`optim_parameters`,
    so ``optimizer.zero_grad()`` does not clear their grads: call ``model.zero_grad()`` each step,
    or :meth:`gate_grads` accumulates over steps.

    Example
    -------
    >>> model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, context=8))
    >>> model(torch.zeros(3, 8, dtype=torch.long)).shape
    torch.Size([3, 8, 64])
    """

    def __init__(self, cfg: ModelConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.empty(cfg.vocab_size, cfg.d_model))
        self.hook_embed = HookPoint()
        if cfg.pos == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.context, cfg.d_model))
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.vocab_size))
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
        self._init_weights(generator)

    @torch.no_grad()
    def _init_weights(self, gen: torch.Generator | None) -> None:
        cfg = self.cfg
        H, d, dh = cfg.n_heads, cfg.d_model, cfg.head_dim

        def init(w: Tensor, fan_in: int, fan_out: int, scale: float = 1.0) -> None:
            if cfg.init == "xavier_uniform":
                bound = math.sqrt(6.0 / (fan_in + fan_out))
                w.uniform_(-bound, bound, generator=gen)
            elif cfg.init == "xavier_normal":
                w.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)), generator=gen)
            else:
                w.normal_(0.0, 0.02, generator=gen)
            w.mul_(scale)

        self.W_E.normal_(0.0, 0.02, generator=gen)
        if cfg.pos == "learned":
            self.W_pos.normal_(0.0, 0.02, generator=gen)
        for block in self.blocks:
            for w in (block.attn.W_Q, block.attn.W_K, block.attn.W_V, block.attn.W_O):
                init(w, d, H * dh, cfg.init_scale)  # the full d_model x H*d_head matrix
            if not cfg.attn_only:
                init(block.mlp.W_in, d, cfg.d_mlp)
                init(block.mlp.W_out, cfg.d_mlp, d)
        init(self.W_U, d, cfg.vocab_size)

    def forward(self, tokens: Tensor, *, head_gates: Tensor | None = None) -> Tensor:
        """Next-token logits.

        Parameters
        ----------
        tokens : Tensor, shape (B, T), int64
            Token ids; T <= cfg.context when pos == "learned".
        head_gates : Tensor, shape (L, H) or (B, L, H), optional
            External gates multiplying each head's z before W_O, on top of the model's own gate
            (several gate sets can be batched along B; (1, L, H) is one set for every row).

        Returns
        -------
        Tensor, shape (B, T, vocab_size)
        """
        if tokens.ndim != 2:
            raise ValueError(f"tokens: expected shape (B, T), got {tuple(tokens.shape)}")
        B, T = tokens.shape
        L, H = self.cfg.n_layers, self.cfg.n_heads
        if head_gates is not None and head_gates.shape not in ((L, H), (B, L, H), (1, L, H)):
            raise ValueError(f"head_gates: expected shape ({L}, {H}) or ({B}, {L}, {H}), got {tuple(head_gates.shape)}")
        if head_gates is not None and head_gates.dtype != self.W_E.dtype:
            # a gate tensor made from a numpy array is float64; refused here by name rather than by
            # torch.addmm's "mat1 and mat2 must have the same dtype" deep in the first block
            raise ValueError(f"head_gates: expected dtype {self.W_E.dtype} (the model's), got {head_gates.dtype}")
        # F.embedding, not W_E[tokens]: indexing's backward (index_put_ with accumulate) adds with
        # atomics on more than one thread, so at train.threads > 1 the same run's W_E gradient changed
        # from one run to the next; the embedding's sums each row in token order on any thread count
        # (bitwise what indexing gives on one thread)
        x = self.hook_embed(F.embedding(tokens, self.W_E))  # (B, T, d)
        if self.cfg.pos == "learned":
            if T > self.cfg.context:
                raise ValueError(f"tokens: length {T} exceeds model.context {self.cfg.context}")
            x = x + self.hook_pos_embed(self.W_pos[:T].expand(B, T, -1))  # (B, T, d)
        for l, block in enumerate(self.blocks):
            x = block(x, None if head_gates is None else head_gates[..., l, :])  # (B, T, d)
        return self.ln_final(x) @ self.W_U  # (B, T, vocab)

    def hook_points(self) -> dict[str, HookPoint]:
        """All hook points by name (module-tree order)."""
        return {n: m for n, m in self.named_modules() if isinstance(m, HookPoint)}

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[str, HookFn]]) -> Iterator[Transformer]:
        """Run forward passes with hooks attached; they are removed on exit, even on error.

        Parameters
        ----------
        fwd_hooks : list of (name, fn)
            ``fn(tensor, name)`` returns a replacement tensor or None (keep). The tensor carries
            its autograd graph.

        Example
        -------
        >>> with model.hooks([("blocks.0.hook_attn_out", lambda t, n: t * 0)]):  # doctest: +SKIP
        ...     logits = model(tokens)
        """
        points = self.hook_points()
        fwd_hooks = list(fwd_hooks)
        unknown = [name for name, _ in fwd_hooks if name not in points]
        if unknown:
            raise KeyError(f"unknown hook names: {unknown}")
        for name, fn in fwd_hooks:
            points[name].fns.append(fn)
        try:
            yield self
        finally:
            for name, fn in fwd_hooks:
                points[name].fns.remove(fn)

    def run_with_cache(
        self,
        tokens: Tensor,
        names: Iterable[str] | Callable[[str], bool] | None = None,
        *,
        head_gates: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Forward pass that also returns detached activations by hook name.

        Parameters
        ----------
        tokens : Tensor, shape (B, T)
        names : None, list of str, or callable str -> bool
            Which hook points to cache; None caches all. Caching ``hook_pattern`` or
            ``hook_attn_scores`` switches that layer to the eager attention path.
        head_gates : Tensor, optional
            As in :meth:`forward`.

        Returns
        -------
        logits : Tensor, shape (B, T, vocab_size)
        cache : dict of str -> Tensor

        Example
        -------
        >>> logits, cache = model.run_with_cache(tokens, ["blocks.0.attn.hook_pattern"])  # doctest: +SKIP
        >>> cache["blocks.0.attn.hook_pattern"].shape  # (B, H, Tq, Tk)  # doctest: +SKIP
        """
        points = self.hook_points()
        wanted = list(points) if names is None else [n for n in points if names(n)] if callable(names) else list(names)
        cache: dict[str, Tensor] = {}

        def save(t: Tensor, name: str) -> None:
            cache[name] = t.detach()

        with self.hooks([(n, save) for n in wanted]):
            return self(tokens, head_gates=head_gates), cache

    def optim_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimiser trains: all but the fixed gates and the gate probes."""
        skip = {id(getattr(b.attn, n)) for b in self.blocks for n in ("gate", "gate_probe") if hasattr(b.attn, n)}
        return [p for p in self.parameters() if id(p) not in skip]

    def n_params(self) -> int:
        """Number of trained parameters (those in :meth:`optim_parameters`)."""
        return sum(p.numel() for p in self.optim_parameters())

    def gate_values(self) -> Tensor:
        """Current gates g, shape (L, H), detached."""
        return torch.stack([b.attn.gate_value().detach() for b in self.blocks])

    def gate_grads(self) -> Tensor:
        """dL/dg from the backward passes since the last ``zero_grad``, shape (L, H).

        Only what was backpropagated through the forward pass counts: the L1 term of
        :meth:`gate_l1` computes its own g and adds nothing here. Zeros where there is no grad.
        """
        name = "gate" if self.cfg.gates == "fixed" else "gate_probe"
        params = [getattr(b.attn, name) for b in self.blocks]
        return torch.stack([torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in params])

    def gate_l1(self) -> Tensor:
        """Mean of g over all heads (scalar, in the graph); a zero tensor for fixed gates."""
        if self.cfg.gates == "fixed":
            return torch.zeros((), device=self.W_E.device)
        return torch.stack([torch.sigmoid(b.attn.gate_logit) for b in self.blocks]).mean()

    def _per_head(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
        # W_O is (H, dh, d): transpose it so all four read (H, d_model, d_head).
        return torch.stack([torch.stack([fn(a.W_Q), fn(a.W_K), fn(a.W_V), fn(a.W_O).transpose(-1, -2)], dim=1)
                            for a in (b.attn for b in self.blocks)])  # (L, H, 4, d_model, d_head)

    def head_weights(self) -> Tensor:
        """Per-head W_Q, W_K, W_V, W_O^T slices, shape (L, H, 4, d_model, d_head), detached."""
        return self._per_head(lambda w: w.detach())

    def head_grads(self) -> Tensor:
        """The .grad of the :meth:`head_weights` slices, same shape; zeros where None."""
        return self._per_head(lambda w: torch.zeros_like(w) if w.grad is None else w.grad.detach())

    def head_grad_norms(self) -> Tensor:
        """Frobenius norm of each head's gradient slice, shape (L, H, 4) (order q, k, v, o), taken in
        float64 (float32 squares of entries below ~1e-19 underflow to a norm of 0)."""
        grads = self.head_grads()  # (L, H, 4, d_model, d_head)
        return grads.flatten(-2).double().norm(dim=-1).to(grads.dtype)
