"""Twins: a run the store holds that trains bitwise what a config trains, under another run id.

Within a grid :func:`~dynamics.sweep.grid.expand_grid` refuses points that train alike. Across
commands (a ``dynamics run`` of a config written another way, ``d_head`` given as d_model /
n_heads, into a store whose sweep trained it) the store held the same training twice, which read
as two configs alike: ``dynamics run`` and a sweep's new points are refused such a twin
(:func:`recorded_twins`, :func:`refuse_sweep_twins`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynamics import store
from dynamics.config import ConfigError, RunConfig, recorded_config
from dynamics.identity import differing_settings, seed_settings
from dynamics.schema import config_value
from dynamics.sweep.grid import _read_identity, _why_alike

if TYPE_CHECKING:
    from dynamics.sweep.grid import Point


@dataclass(frozen=True)
class Twin:
    """A recorded run that trains bitwise what a config trains, under another run id."""

    run_id: str
    """The recorded run's id."""
    settings: dict[str, tuple[Any, Any]]
    """Dotted key -> (the recorded run's value, the config's value), for each setting they differ in."""
    why: str
    """Why those settings come to the same training: ``"which come to the same training (...)"``."""

    def __str__(self) -> str:
        if not self.settings:  # "differs only in , which ..." (a --run-id run of this very config)
            return f"run {self.run_id} there trains this very config, under a run id of its own (given with --run-id)"
        shown = ", ".join(f"{k} = {json.dumps(theirs)} against {json.dumps(ours)}"
                          for k, (theirs, ours) in self.settings.items())
        return f"run {self.run_id} there trains the same data and model: its config differs only in {shown}, {self.why}"


def twins_in_store(cfgs: list[RunConfig], recorded: dict[str, dict]) -> dict[str, Twin]:
    """For each of ``cfgs`` that a run of ``recorded`` (run id -> its recorded ``config`` attr)
    trains bitwise under another run id, that run: ``{cfg.run_id(): Twin}``.

    The recorded runs are indexed once by what they train, so a grid's points cost one lookup
    each (a grid of N points over M runs compared N x M times, about 2 ms each).
    """
    by_training: dict[str, list[tuple[str, RunConfig]]] = {}
    for run_id, raw in recorded.items():
        try:
            other = recorded_config(raw, f"run {run_id}")
        except ConfigError:  # a config this version cannot read is compared with nothing
            continue
        by_training.setdefault(_read_identity(other), []).append((run_id, other))
    twins = {}
    for cfg in cfgs:
        own = cfg.run_id()
        run_id, other = next(((r, c) for r, c in by_training.get(_read_identity(cfg), []) if r != own), (None, None))
        if other is None:
            continue
        theirs, ours = other.to_dict(), cfg.to_dict()
        differ = differing_settings([seed_settings(theirs), seed_settings(ours)])
        settings = {k: (config_value(theirs, k), config_value(ours, k)) for k in differ}
        twins[own] = Twin(run_id, settings, _why_alike(cfg, other, differ))
    return twins


def recorded_twins(path: str, cfgs: list[RunConfig]) -> dict[str, Twin]:
    """:func:`twins_in_store` against the runs the store at ``path`` holds (none if it is no
    store yet; a damaged run is named by the commands that read it, and compared with nothing)."""
    if not store.is_store(path):
        return {}
    recorded = {}
    for run_id in store.list_runs(path, damaged="skip"):
        with contextlib.suppress(store.StoreError):
            recorded[run_id] = store.run_attrs(path, run_id).get("config")
    return twins_in_store(cfgs, recorded) if recorded else {}


def refuse_sweep_twins(points: list[Point], path: str) -> None:
    """StoreError, before any point trains, for a point whose training a run the store holds under
    another id trains already (a `dynamics run` of the config written another way, or an
    earlier grid's point)."""
    twins = recorded_twins(path, [p.cfg for p in points]) if points else {}
    for p in points:
        if (twin := twins.get(p.run_id)) is not None:
            fix = "sweep the setting as that run has it, or give" if twin.settings else "give"
            raise store.StoreError(f"sweep point {p.label}: {path} holds this training already: {twin}; {fix} "
                                   "another --out")
