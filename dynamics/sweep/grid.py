"""The grid: :class:`Point` and :func:`expand_grid` (axes crossed, ``zip`` groups paired, every
point validated and given its run id)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dynamics import tasks
from dynamics.config import ConfigError, ModelConfig, RunConfig, TaskConfig, with_values
from dynamics.identity import EXECUTION_KEYS, unread_model_keys


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
    points: list[Point] = []
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
            other = same_as[same]
            differ = [k for k in axes if other.values[k] != values[k]]
            names = point_cfg.task.component_names
            unread = {"task." + k for c in (point_cfg, other.cfg) for k in tasks.unread_keys(c)}
            unread_model = {k for c in (point_cfg, other.cfg) for k in unread_model_keys(c.to_dict())}
            if all(k in unread for k in differ):
                why = f"which {' and '.join(names)} {'does' if len(names) == 1 else 'do'} not read"
            elif all(k in unread | unread_model for k in differ):
                why = "which fixed gates (model.gates = \"fixed\") do not read" + (
                    f", nor {' and '.join(names)}" if any(k in unread for k in differ) else "")
            else:  # normalised mixture weights, or a mixture of one component
                why = ("which come to the same task (mixture weights count as the probabilities they give, and a "
                       "mixture of one component is that task)")
            raise ConfigError(
                f"sweep points {other.label} and {_label(values)} train the same data and model: they differ "
                f"only in {', '.join(differ)}, {why}")
        point = Point(run_id, values, point_cfg)
        same_as[same] = point
        points.append(point)
    # A key that no point's task reads changes every run id and nothing any point trains on, as
    # under `dynamics run` (tasks.check_read); one that some point reads is the grid's business.
    unread = set.intersection(*(set(tasks.unread_keys(p.cfg)) for p in points))
    if unread:
        key = sorted(unread)[0]
        readers = " and ".join(name for name, keys in tasks.TASK_KEYS.items() if key in keys)
        raise ConfigError(
            f"task.{key} = {getattr(points[0].cfg.task, key)!r}: no point of the sweep trains a task that reads it "
            f"(only {readers} {'does' if ' and ' not in readers else 'do'}), so every run would train what it trains "
            f"without it, under another run id; drop the setting, or sweep task.name")
    unread_model = set.intersection(*(set(unread_model_keys(p.cfg.to_dict())) for p in points))
    if unread_model:
        key = sorted(unread_model)[0]
        raise ConfigError(f"{key} = {unread_model_keys(points[0].cfg.to_dict())[key]!r}: no point of the sweep has "
                          f"learned gates (model.gates = \"learned\"), which alone read it, so every run would train "
                          f"what it trains without it, under another run id; drop the setting, or sweep model.gates")
    return points


def _read_identity(cfg: RunConfig) -> str:
    """The run id of the config written one way for one training: every task key its tasks do
    not read at its default, and the learned-gate keys under fixed gates; mixture weights as the
    probabilities they give (none when equal: ``[]``, ``[1, 1]`` and ``[2, 2]`` draw the same
    rows); a mixture of one component as that task (it makes the task's very batches)."""
    from dynamics.tasks.batch import _mixture_weights

    default = TaskConfig()
    task = replace(cfg.task, **{k: getattr(default, k) for k in tasks.unread_keys(cfg)})
    model = replace(cfg.model, **{k[len("model."):]: getattr(ModelConfig, k[len("model."):])
                                  for k in unread_model_keys(cfg.to_dict())})
    if task.name == "mixture":
        p = _mixture_weights(cfg)  # what the generator draws with, so equal here means equal rows
        weights = () if np.all(p == p[0]) else tuple(float(x) for x in p)
        task = replace(task, weights=weights)
        if len(task.components) == 1:
            task = replace(task, name=task.components[0], components=(), weights=())
    return replace(cfg, task=task, model=model).run_id()


def _plain(value: Any) -> Any:
    """Tuples to lists, so values round-trip through JSON attributes unchanged."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
