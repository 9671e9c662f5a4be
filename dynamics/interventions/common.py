"""Shared pieces of the interventions: option parsing, weight schedules, row-wise KL.

Option tables are parsed into frozen dataclasses by :func:`parse_table`, which checks each
value against the field's annotation and raises :class:`~dynamics.config.ConfigError` naming
the dotted key (``intervene.templates.heads[1].layer``), as ``dynamics.config`` does for the
other sections; :func:`parse_heads` does the same for a list of per-head tables.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

import torch
from torch import Tensor

from dynamics.config import ConfigError, RunConfig, int_text
from dynamics.limits import FLOAT32_MAX, MAX_INT

SCHEDULES = ("constant", "warmup", "linear_decay", "cosine_decay")
"""Weight schedules, see :func:`schedule_factor`."""


def fail(message: str) -> typing.NoReturn:
    """Raise the one-line ConfigError every option problem becomes."""
    raise ConfigError(message)


def _coerce(key: str, value: Any, kind: Any) -> Any:
    """Check `value` against a field annotation (bool, int, float, str, tuple[int, ...], X | None)."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return None if value is None else _coerce(key, value, options[0])
    if kind is bool:
        if not isinstance(value, bool):
            fail(f"{key}: expected true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail(f"{key}: expected an integer, got {value!r}")
        if not -MAX_INT < value < MAX_INT:  # a template width of 10**20 failed in numpy, after the store was made
            fail(f"{key}: expected an integer within +-2**63, got {int_text(value)}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(f"{key}: expected a finite number, got {value!r}")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer past the float range (TOML integers have no bound)
            fail(f"{key}: expected a finite number, got an integer beyond the float range")
        if not finite:
            fail(f"{key}: expected a finite number, got {value!r}")
        if abs(value) > FLOAT32_MAX:  # every option scales float32 tensors: inf there, a run "diverged" at step 0
            fail(f"{key}: must be within +-{FLOAT32_MAX:.4g} (float32), got {value!r}")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            fail(f"{key}: expected a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            fail(f"{key}: expected a list, got {value!r}")
        item = typing.get_args(kind)[0]
        return tuple(_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value))
    raise TypeError(f"{key}: unsupported option type {kind!r}")  # a bug in an options class, not in a config


def parse_table(prefix: str, raw: Any, cls: type, *, nested: tuple[str, ...] = ()) -> dict[str, Any]:
    """Checked keyword arguments for the frozen dataclass `cls` from the TOML table `raw`.

    Parameters
    ----------
    prefix : str
        Dotted key of the table, used in error messages (``intervene.templates``).
    raw : Any
        The table as read from TOML.
    cls : type
        Options dataclass; fields without a default are required.
    nested : tuple of str
        Fields the caller parses itself (lists of tables); returned unchanged.

    Returns
    -------
    dict
        Field name -> checked value, only for keys present in `raw`.

    Raises
    ------
    ConfigError
        Not a table, an unknown key, a missing required key or a value of the wrong type.
    """
    if not isinstance(raw, dict):
        fail(f"{prefix}: expected a table, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    for key in raw:
        if key not in known:
            fail(f"unknown key '{prefix}.{key}' (known: {', '.join(known)})")
    out = {}
    for f in fields(cls):
        key = f"{prefix}.{f.name}"
        if f.name not in raw:
            if f.default is MISSING and f.default_factory is MISSING:
                fail(f"{key}: required")
            continue
        out[f.name] = raw[f.name] if f.name in nested else _coerce(key, raw[f.name], hints[f.name])
    return out


def check_head(prefix: str, cfg: RunConfig, layer: int, head: int) -> None:
    """ConfigError unless (layer, head) is a head of the configured model."""
    m = cfg.model
    if not 0 <= layer < m.n_layers:
        fail(f"{prefix}.layer: layer {layer} does not exist (model.n_layers = {m.n_layers})")
    if not 0 <= head < m.n_heads:
        fail(f"{prefix}.head: head {head} does not exist (model.n_heads = {m.n_heads})")


def parse_heads(
    prefix: str,
    entries: list,
    cls: type,
    cfg: RunConfig,
    *,
    check: typing.Callable[[str, Any], None] | None = None,
    duplicate: str,
) -> tuple:
    """Checked `cls` instances from a list of per-head tables ``{ layer, head, ... }``.

    Each entry is parsed with :func:`parse_table` under the key ``{prefix}.heads[i]``, its
    (layer, head) is checked against the model, then ``check(key, head)`` runs the caller's own
    checks, and last a (layer, head) seen before is an error.

    Parameters
    ----------
    prefix : str
        Dotted key of the table holding ``heads`` (``intervene.templates``).
    entries : list
        The ``heads`` array as read from TOML; the caller checks that it is a list.
    cls : type
        Options dataclass of one entry, with int fields ``layer`` and ``head``.
    cfg : RunConfig
        The run whose model the heads must belong to.
    check : callable, optional
        ``check(key, head)``: further checks on one parsed entry; raises through :func:`fail`.
    duplicate : str
        Message after ``{key}: `` for a repeated head, with ``{layer}`` and ``{head}`` fields.

    Returns
    -------
    tuple
        The parsed entries, in order.

    Raises
    ------
    ConfigError
        An entry that is not a valid table, names a head the model lacks, fails `check`, or
        repeats a head.
    """
    heads, seen = [], set()
    for i, entry in enumerate(entries):
        key = f"{prefix}.heads[{i}]"
        h = cls(**parse_table(key, entry, cls))
        check_head(key, cfg, h.layer, h.head)
        if check is not None:
            check(key, h)
        if (h.layer, h.head) in seen:
            fail(f"{key}: " + duplicate.format(layer=h.layer, head=h.head))
        seen.add((h.layer, h.head))
        heads.append(h)
    return tuple(heads)


def forward_changes(intervene: Any) -> list[str]:
    """The sections of a raw ``[intervene]`` table that change the trained model's forward pass.

    Hard templates replace attention patterns and conditioned gates scale head outputs, both
    through hooks that live outside the model's weights; a checkpoint loaded without them is
    another network than the one trained. (Soft templates and distillation only add losses.)

    Example
    -------
    >>> forward_changes({"templates": {"hard": True, "heads": [{"layer": 0, "head": 0, "pattern": "uniform"}]}})
    ['hard templates']
    """
    if not isinstance(intervene, dict):
        return []
    out = []
    raw = intervene.get("templates")
    if isinstance(raw, dict):
        default = raw.get("hard", False)
        if any(h.get("hard", default) for h in raw.get("heads", []) if isinstance(h, dict)):
            out.append("hard templates")
    if intervene.get("conditioned_gates") is not None:
        out.append("conditioned gates")
    return out


def check_schedule(prefix: str, name: str, ramp_steps: int) -> None:
    """ConfigError for an unknown schedule or a negative ramp."""
    if name not in SCHEDULES:
        fail(f"{prefix}.schedule: unknown schedule {name!r} ({' | '.join(SCHEDULES)})")
    if ramp_steps < 0:
        fail(f"{prefix}.ramp_steps: must be >= 0, got {ramp_steps}")


def schedule_factor(name: str, step: int, ramp_steps: int) -> float:
    """Multiplier in [0, 1] on an intervention's weight at a training step.

    With ``u = min(1, step / ramp_steps)``:

    - ``constant``: 1;
    - ``warmup``: u (0 at step 0, full strength from ``ramp_steps`` on);
    - ``linear_decay``: 1 - u (full strength at step 0, off from ``ramp_steps`` on);
    - ``cosine_decay``: (1 + cos(pi u)) / 2.

    A pure function of the step, so a resumed run needs no schedule state.

    Example
    -------
    >>> schedule_factor("warmup", 25, 100), schedule_factor("linear_decay", 25, 100)
    (0.25, 0.75)
    """
    if name == "constant":
        return 1.0
    u = min(1.0, step / max(ramp_steps, 1))
    if name == "warmup":
        return u
    if name == "linear_decay":
        return 1.0 - u
    if name == "cosine_decay":
        return 0.5 * (1.0 + math.cos(math.pi * u))
    raise ValueError(f"unknown schedule {name!r}")


def kl_rows(p: Tensor, log_q: Tensor) -> Tensor:
    """Row-wise KL(p || q) over the last dim, from probabilities p and log-probabilities log q.

    ``KL(p || q) = sum_k p_k (log p_k - log q_k)``, with ``0 log 0 = 0`` (Cover and Thomas,
    "Elements of Information Theory", 2.3). Terms where ``p_k = 0`` are dropped before the
    product, so keys that the causal mask sends to ``log q = -inf`` cost nothing and pass
    no NaN gradient. The result is >= 0, and 0 iff q = p on the support of p; it is finite
    whenever q > 0 on the support of p, which a softmax guarantees on unmasked keys.

    Parameters
    ----------
    p : Tensor, shape (..., K)
        Target distributions (a template, a teacher's attention); rows sum to 1.
    log_q : Tensor, shape (..., K)
        ``log_softmax`` of the student's scores (more accurate than ``log(softmax)``, which
        underflows to -inf for peaked rows).

    Returns
    -------
    Tensor, shape (...)

    Example
    -------
    >>> p = torch.tensor([[0.5, 0.5, 0.0]])
    >>> kl_rows(p, torch.log(p.clamp_min(1e-30))).item()
    0.0
    """
    support = p > 0
    log_q = log_q.masked_fill(~support, 0.0)  # (..., K): masked keys out of the graph
    return (torch.xlogy(p, p) - p * log_q).sum(-1)  # (...)
