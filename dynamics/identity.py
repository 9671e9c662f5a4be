"""What makes two runs the same experiment, or seeds of one config, and what names configs apart.

Pure functions of config dicts (``RunConfig.to_dict()`` or a run's stored ``config`` attr), so
readers of a store need no RunConfig to group its runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

# Where and how fast a run executes, not what it computes: the same run on another device or
# thread count is the same experiment, with the same id and the same store entry.
EXECUTION_KEYS = ("device", "threads")


def experiment_identity(config: dict, *, without_seed: bool = False) -> dict:
    """A config dict (``RunConfig.to_dict()`` or a run's stored ``config`` attr) without the
    sweep table and :data:`EXECUTION_KEYS`: two runs are the same experiment iff these are equal.
    With ``without_seed``, ``train.seed`` is dropped too: runs are seeds of one config iff equal."""
    drop = (*EXECUTION_KEYS, "seed") if without_seed else EXECUTION_KEYS
    d = {k: v for k, v in config.items() if k != "sweep"}
    d["train"] = {k: v for k, v in d.get("train", {}).items() if k not in drop}
    return d


def seed_settings(config: dict) -> dict[str, Any]:
    """A run's config (``RunConfig.to_dict()`` or its stored ``config`` attr) as flat
    ``{"section.key": value}`` settings, less the sweep table, :data:`EXECUTION_KEYS` and the seed:
    runs are seeds of one config iff these are equal."""
    identity = experiment_identity(config, without_seed=True)
    return {f"{sec}.{k}": v for sec, table in identity.items() if isinstance(table, dict) for k, v in table.items()}


def differing_settings(settings: Iterable[dict[str, Any]]) -> list[str]:
    """The keys, sorted, whose values are not the same in all of ``settings`` (a missing key counts
    as a value): what names each of several configs apart from the others."""
    settings = list(settings)
    keys = sorted({k for s in settings for k in s})
    return [k for k in keys if len({json.dumps(s.get(k), sort_keys=True) for s in settings}) > 1]


LEARNED_GATE_KEYS = ("gate_init", "gate_l1")
"""Model keys that only learned gates read: under ``model.gates = "fixed"`` no gate is learned."""


def unread_model_keys(config: dict) -> dict[str, Any]:
    """``{"model.<key>": value}`` of the :data:`LEARNED_GATE_KEYS` a config dict
    (``RunConfig.to_dict()``) sets away from their defaults under fixed gates: they change the
    run id and nothing the run trains."""
    from dynamics.config import ModelConfig

    model = config.get("model", {})
    if model.get("gates", ModelConfig.gates) != "fixed":
        return {}
    return {f"model.{k}": model[k] for k in LEARNED_GATE_KEYS if k in model and model[k] != getattr(ModelConfig, k)}


def unread_model_problem(config: dict) -> str | None:
    """One line for `dynamics run` on the first of :func:`unread_model_keys`, or None."""
    unread = unread_model_keys(config)
    if not unread:
        return None
    key, value = next(iter(unread.items()))
    return (f"{key} = {value!r}: fixed gates (model.gates = \"fixed\") do not read it, so the run would train what "
            f"the config without it trains, under another run id; drop the setting, or set model.gates = \"learned\"")
