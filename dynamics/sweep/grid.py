"""The grid: :class:`Point` and :func:`expand_grid` (axes crossed, ``zip`` groups paired, every
point validated and given its run id)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dynamics import tasks
from dynamics.config import SECTIONS, ConfigError, RunConfig, TaskConfig, with_values
from dynamics.identity import EXECUTION_KEYS, condition_key, not_read_by, unread_settings
from dynamics.limits import MAX_POINTS
from dynamics.schema import config_value


@dataclass(frozen=True)
class Point:
    """One point of a sweep grid."""

    run_id: str
    """Run group name: ``cfg.run_id()``."""
    values: dict[str, Any] = field(hash=False)
    """Dotted config key -> this point's value, in axis order (JSON-able)."""
    cfg: RunConfig = field(hash=False, repr=False)
    """The resolved, validated config of this point (its sweep table is empty)."""

    @property
    def label(self) -> str:
        """``model.n_heads=4, train.seed=0`` (``base`` for a config without axes)."""
        return _label(self.values)


def _label(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items()) or "base"


def expand_grid(cfg: RunConfig) -> list[Point]:
    """Expand a config's ``[sweep]`` table into validated points.

    Axes are crossed in the order they appear (the first varies slowest); the axes of a
    ``zip`` group are paired element-wise and take the place of the group's first axis.
    Every point is validated before this returns, so a sweep can be refused before any
    work.

    Parameters
    ----------
    cfg : RunConfig
        Config whose ``sweep`` holds ``axes`` and ``zip`` (see ``config.SweepConfig``).

    Returns
    -------
    list of Point
        One point per grid cell; a config without axes gives one point, the base config.

    Raises
    ------
    ConfigError
        ``sweep point model.n_heads=5, train.seed=0: <why>`` for the first invalid point,
        or when two points resolve to the same run (e.g. they differ only in train.device).

    Example
    -------
    >>> pts = expand_grid(load_config("experiments/quickstart.toml"))  # doctest: +SKIP
    >>> pts[0].label, pts[0].run_id  # doctest: +SKIP
    ('model.init_scale=0.5, train.seed=0', 'r79f120039c')
    """
    axes = {k: list(v) for k, v in cfg.sweep.axes.items()}
    group_of = {key: group for group in cfg.sweep.zip for key in group}
    units: list[list[dict[str, Any]]] = []  # each unit: the list of its partial assignments
    placed: set[str] = set()
    for key in axes:
        if key in placed:
            continue
        group = group_of.get(key, (key,))
        placed.update(group)
        units.append([dict(zip(group, combo, strict=True))
                      for combo in zip(*(axes[k] for k in group), strict=True)])
    if (n := math.prod(len(u) for u in units)) > MAX_POINTS:  # before a point is checked: minutes, for nothing
        raise ConfigError(f"sweep: {n:,} points ({' x '.join(str(len(u)) for u in units)}) is more than the "
                          f"{MAX_POINTS:,} a sweep may have")
    points: list[Point] = []
    raws: list[RunConfig] = []  # each point's config as the grid wrote it
    seen: dict[str, str] = {}
    same_as: dict[str, Point] = {}  # by _read_identity
    for parts in itertools.product(*units):
        merged: dict[str, Any] = {}
        for part in parts:
            merged.update(part)
        values = {k: _plain(merged[k]) for k in axes}  # axis order, JSON-able
        try:
            point_cfg = with_values(cfg, values)
            tasks.check(point_cfg)
            if point_cfg.intervene:  # as `dynamics run` does, so a bad point fails here, not in a worker
                from dynamics import interventions

                interventions.check(point_cfg)
        except ConfigError as e:
            raise ConfigError(f"sweep point {_label(values)}: {e}") from None
        run_id = point_cfg.run_id()
        if run_id in seen:
            raise ConfigError(
                f"sweep points {seen[run_id]} and {_label(values)} are the same experiment (run {run_id}): a value "
                f"repeats, or they differ only in {' or '.join('train.' + k for k in EXECUTION_KEYS)}, "
                f"which say where a run trains, not what it is")
        seen[run_id] = _label(values)
        # A task key that none of the point's tasks reads (task.delta under induction) left
        # points that trained bitwise the same data and model under different run ids, which
        # read as "this axis has no effect".
        same = _read_identity(point_cfg)
        if same in same_as:
            other = same_as[same]  # as written, as this one is here
            differ = [k for k in axes if other.values[k] != values[k]]
            names = point_cfg.task.component_names
            unread = {"task." + k for c in (point_cfg, other.cfg) for k in tasks.unread_keys(c)}
            settings = {k: c for c in (point_cfg, other.cfg) for k in unread_settings(c.to_dict())}
            if all(k in unread for k in differ):
                why = f"which {' and '.join(names)} {'does' if len(names) == 1 else 'do'} not read"
            elif all(k in unread or k in settings for k in differ):
                whos = dict.fromkeys(not_read_by(k, settings[k].to_dict()) for k in differ if k in settings)
                why = "which " + ", nor which ".join(whos) + (
                    f", nor {' and '.join(names)}" if any(k in unread for k in differ) else "")
            else:  # normalised mixture weights, or a mixture of one component
                why = ("which come to the same task (mixture weights count as the probabilities they give, and a "
                       "mixture of one component is that task)")
            raise ConfigError(
                f"sweep points {other.label} and {_label(values)} train the same data and model: they differ "
                f"only in {', '.join(differ)}, {why}")
        raws.append(point_cfg)
        same_as[same] = Point(run_id, values, point_cfg)
        # A setting this point does not read, at its default: kept, it gave the point another
        # run id than the same training has in a sweep without it (pos = "learned" under a
        # --set model.rope_base), and both trained, bitwise alike, read as "rope_base matters".
        # Values as the run's config then holds them (an init_scale written 1 is 1.0 there, and
        # in its run id): as written, one point read as two, "1" and "1.0", wherever values are
        # compared as text (status's grid order and columns, the report, predict's groups).
        point_cfg = _unread_at_defaults(point_cfg)
        resolved = point_cfg.to_dict()
        points.append(Point(point_cfg.run_id(), {k: _plain(config_value(resolved, k)) for k in axes}, point_cfg))
    # A key that no point's task reads changes every run id and nothing any point trains on, as
    # under `dynamics run` (tasks.check_read); one that some point reads is the grid's business.
    unread = set.intersection(*(set(tasks.unread_keys(c)) for c in raws))
    if unread:
        key = sorted(unread)[0]
        readers = " and ".join(name for name, keys in tasks.TASK_KEYS.items() if key in keys)
        raise ConfigError(
            f"task.{key} = {getattr(raws[0].task, key)!r}: no point of the sweep trains a task that reads it "
            f"(only {readers} {'does' if ' and ' not in readers else 'do'}), so every run would train what it trains "
            f"without it, under another run id; drop the setting, or sweep task.name")
    unread_everywhere = set.intersection(*(set(unread_settings(c.to_dict())) for c in raws))
    if unread_everywhere:
        key = sorted(unread_everywhere)[0]
        first = raws[0].to_dict()
        raise ConfigError(f"{key} = {unread_settings(first)[key]!r}: no point of the sweep reads it ("
                          f"{not_read_by(key, first)} it), so every run would train what it trains without it, "
                          f"under another run id; drop the setting, or sweep {condition_key(key)}")
    return points


def _unread_at_defaults(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every task key its tasks do not read, and every
    :data:`~dynamics.identity.CONDITIONAL_KEYS` setting it does not read, at its default."""
    default = TaskConfig()
    task = replace(cfg.task, **{k: getattr(default, k) for k in tasks.unread_keys(cfg)})
    defaults: dict[str, dict[str, Any]] = {}  # section -> {key: its default}
    for dotted in unread_settings(cfg.to_dict()):
        section, key = dotted.split(".")
        defaults.setdefault(section, {})[key] = getattr(SECTIONS[section], key)
    sections = {name: replace(getattr(cfg, name), **changes) for name, changes in defaults.items()}
    return replace(cfg, **{**sections, "task": task})


def _read_identity(cfg: RunConfig) -> str:
    """The run id of the config written one way for one training: every task key its tasks do
    not read at its default, and so each :data:`~dynamics.identity.CONDITIONAL_KEYS` setting it
    does not read (learned-gate keys under fixed gates, d_mlp without MLPs, ...); mixture weights
    as the probabilities they give (none when equal: ``[]``, ``[1, 1]`` and ``[2, 2]`` draw the
    same rows); a mixture of one component as that task (it makes the task's very batches)."""
    from dynamics.tasks.batch import _mixture_weights

    cfg = _unread_at_defaults(cfg)
    task = cfg.task
    if task.name == "mixture":
        p = _mixture_weights(cfg)  # what the generator draws with, so equal here means equal rows
        weights = () if np.all(p == p[0]) else tuple(float(x) for x in p)
        task = replace(task, weights=weights)
        if len(task.components) == 1:
            task = replace(task, name=task.components[0], components=(), weights=())
    return replace(cfg, task=task).run_id()


def _plain(value: Any) -> Any:
    """Tuples to lists, so values round-trip through JSON attributes unchanged."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
