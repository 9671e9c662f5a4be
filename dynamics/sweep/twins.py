"""Twins: a run the store holds that trains bitwise what a config trains, under another run id.

Within a grid :func:`~dynamics.sweep.grid.expand_grid` refuses points that train alike. Across
commands (a ``dynamics run`` of a config written another way, ``d_head`` given as d_model /
n_heads, into a store whose sweep trained it) the store held the same training twice, which read
as two configs alike: ``dynamics run`` and a sweep's new points are refused such a twin
(:func:`recorded_twins`, :func:`refuse_sweep_twins`), and checked again under the store's lock
as the run's group is made (:func:`twin_guard`), where another process's twin made meanwhile shows.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynamics import store
from dynamics.config import ConfigError, RunConfig, recorded_config
from dynamics.identity import differing_settings, identity_difference, seed_settings
from dynamics.schema import FINISHED_STATUSES, config_value
from dynamics.sweep.grid import _label, _read_identity, _why_alike

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
        if other is not None:
            twins[own] = _twin(cfg, run_id, other)
    return twins


def _twin(cfg: RunConfig, run_id: str, other: RunConfig) -> Twin:
    """Run ``run_id``, recorded with ``other``, as ``cfg``'s twin: the settings they differ in."""
    theirs, ours = other.to_dict(), cfg.to_dict()
    differ = differing_settings([seed_settings(theirs), seed_settings(ours)])
    settings = {k: (config_value(theirs, k), config_value(ours, k)) for k in differ}
    return Twin(run_id, settings, _why_alike(cfg, other, differ))


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
            raise point_refusal(p.values, path, twin)


class TwinRefused(store.StoreError):
    """A sweep point refused for a twin the store holds (:func:`point_refusal`)."""


def point_refusal(values: dict[str, Any], path: str, twin: Twin) -> TwinRefused:
    """The refusal of the sweep point at ``values`` whose training ``path`` holds as ``twin``."""
    fix = "sweep the setting as that run has it, or give" if twin.settings else "give"
    return TwinRefused(f"sweep point {_label(values)}: {path} holds this training already: {twin}; {fix} "
                            "another --out")


def run_refusal(path: str, twin: Twin) -> ConfigError:
    """`dynamics run`'s refusal of a config whose training ``path`` holds as ``twin``: the
    ``--set``s (or the ``--run-id``) that reach that run."""
    sets = " ".join(f"--set {k}={json.dumps(theirs)}" for k, (theirs, _) in twin.settings.items())
    sets = sets or f"--run-id {twin.run_id}"  # the same config: only its id reaches that run
    return ConfigError(f"{path} holds this training already: {twin}; give {sets} to resume or skip that run, "
                       f"or another --out")


def refuse_run_twin(path: str, cfg: RunConfig) -> Callable[[], None]:
    """`dynamics run`'s twin check: ConfigError now if the store holds ``cfg``'s training under
    another run id, and the :func:`twin_guard` that checks the runs made since, under the lock."""
    checked = store.list_runs(path, damaged="include") if store.is_store(path) else []
    if twin := recorded_twins(path, [cfg]).get(cfg.run_id()):
        raise run_refusal(path, twin)
    return twin_guard(path, cfg, lambda twin: run_refusal(path, twin), checked=checked)


def twin_guard(path: str, cfg: RunConfig, refusal: Callable[[Twin], Exception], *, checked: Collection[str] = (),
               seen: dict[str, tuple[str, RunConfig] | None] | None = None) -> Callable[[], None]:
    r"""A check for ``train_run(before_create=...)``: ``refusal(twin)`` for a run the store holds
    that trains ``cfg`` under another id.

    A command checks the store for twins before it trains (:func:`recorded_twins`), but another
    process can make one between that check and the run's group: two ``dynamics run``\ s of one
    training written two ways both trained in 1 of 5 tries, a sweep and such a run in 3 of 3.
    Under the store's lock, where groups are made one at a time, the later of the two sees the
    earlier's group. Each run's config is read once, under a lock every writer of the store
    waits on: ``checked`` are runs already compared, not read; ``seen`` (run id -> what it
    trains, or None: a config this version cannot read) carries what was read from one guard
    to the next, as a sweep's worker does for the points of one launch.
    """
    checked, seen = frozenset(checked), {} if seen is None else seen
    own, training = cfg.run_id(), _read_identity(cfg)

    def before_create() -> None:
        for run_id in store.list_runs(path, damaged="skip"):
            if run_id in checked or run_id == own:
                continue
            if run_id not in seen:
                try:
                    raw = store.run_attrs(path, run_id).get("config")
                except store.StoreError:  # damaged since it was listed: named by the commands that read it
                    continue
                try:
                    other = recorded_config(raw, f"run {run_id}")
                    seen[run_id] = (_read_identity(other), other)
                except ConfigError:
                    seen[run_id] = None
            if (known := seen[run_id]) is not None and known[0] == training:
                raise refusal(_twin(cfg, run_id, known[1]))

    return before_create


def unindex_refused(path: str, run_ids: list[str]) -> None:
    """Take sweep points refused as twins under the store's lock (``run_point``'s ``twin``) out of
    the sweep index, where the launcher listed them before they trained: never made, they showed
    "pending" for ever beside the run that trains what they would."""
    index = store.read_sweep_index(path)
    have = set(store.list_runs(path, damaged="include"))
    gone = {r for r in run_ids if r not in have}
    if not index or not gone:
        return
    store.write_sweep_index(path, {**index, "runs": {k: v for k, v in index["runs"].items() if k not in gone},
                                   "steps": {k: v for k, v in index.get("steps", {}).items() if k not in gone}})


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def unresumed_note(points: list[Point], path: str) -> str | None:
    """A note on the unfinished runs of the store's sweep index at this grid's points (the same
    swept values) under other run ids: recorded with other settings (a base config edited since,
    or a default of an older version that has changed), they are not this grid's runs, so the
    sweep trains its points anew beside them and they stay unfinished. The sweep had said nothing
    of it, where the store's last line had been "runs are resumable with the same command"."""
    index = store.read_sweep_index(path) or {}
    ours = {p.run_id for p in points}
    swept = [p for p in points if p.values]  # a grid of one point has no values to match
    present = set(store.list_runs(path, damaged="skip"))
    left: list[str] = []
    first = ""
    for rid, values in index.get("runs", {}).items():
        if rid in ours or not isinstance(values, dict):
            continue
        # every axis the entry records, as this point has it: a point of another sweep over other
        # axes in the same store (lr 0.01 there, 0.003 here) is that sweep's to resume
        p = next((q for q in swept if all(k in values for k in q.values) and all(
            _same(values[k], config_value(q.cfg.to_dict(), k)) for k in values)), None)
        if p is None:
            continue
        attrs = {}
        if rid in present:
            with contextlib.suppress(store.StoreError):
                attrs = store.run_attrs(path, rid)
        if attrs.get("status") in FINISHED_STATUSES:
            continue
        left.append(rid)
        if not first and isinstance(attrs.get("config"), dict):
            first = f" (run {rid}: {identity_difference(attrs['config'], p.cfg.to_dict())})"
    if not left:
        return None
    return (f"{len(left)} unfinished run(s) of {path}'s sweep index sit at this grid's points under other run ids, "
            f"recorded with other settings{first}: this sweep does not resume them, and trains its points under "
            "their own ids; a --set of those settings resumes them instead")
