"""The grid: :class:`Point` and :func:`expand_grid` (axes crossed, ``zip`` groups paired, every
point validated and given its run id)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dynamics import tasks
from dynamics.budget import n_snapshots, snapshot_steps
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
            # as text: [1, 3] == [1.0, 3.0] in Python, and the message named no axis at all
            differ = [k for k in axes if json.dumps(other.values[k]) != json.dumps(values[k])]
            raise ConfigError(
                f"sweep points {other.label} and {_label(values)} train the same data and model: they differ "
                f"only in {', '.join(differ)}, {_why_alike(point_cfg, other.cfg, differ)}")
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


def _why_alike(a: RunConfig, b: RunConfig, differ: list[str]) -> str:
    """Why two configs that differ in the settings ``differ`` (dotted keys) train alike: the
    close of the refusal that names them."""
    names = a.task.component_names
    unread = {"task." + k for c in (a, b) for k in tasks.unread_keys(c)}
    settings = {k: c for c in (a, b) for k in unread_settings(c.to_dict())}
    if all(k in unread for k in differ):
        return f"which {' and '.join(names)} {'does' if len(names) == 1 else 'do'} not read"
    if all(k in unread or k in settings for k in differ):
        whos = dict.fromkeys(not_read_by(k, settings[k].to_dict()) for k in differ if k in settings)
        return "which " + ", nor which ".join(whos) + (
            f", nor {' and '.join(names)}" if any(k in unread for k in differ) else "")
    # normalised mixture weights, a mixture of one component, or a setting resolved alike
    said = dict.fromkeys(_RESOLVED.get(k, _RESOLVED["task"]) for k in differ if k not in unread)
    return "which come to the same training (" + "; ".join(said) + ")"


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


_RESOLVED = {
    "task": "mixture weights count as the probabilities they give, and a mixture of one component is that task",
    "model.d_head": "d_head 0 is d_model / n_heads",
    "record.head_weights": 'head_weights "auto" is "on" up to d_model 256 and "off" above',
    "record.every": "record.every and record.dense_until count as the snapshot steps they give",
    "record.dense_until": "record.every and record.dense_until count as the snapshot steps they give",
    "record.chg_every": "a chg_every at or past the last snapshot's index fits CHG at the first and the last "
                        "snapshots alone",
    "train.min_lr_frac": "the cosine decay to min_lr_frac starts after the last update when warmup_steps >= steps - 1",
}
"""Why two settings train alike, for the axes :func:`_read_identity` resolves (task keys: "task")."""

_SCHEDULE_LISTED = 200_000
"""Snapshot steps up to which a schedule is compared step by step."""


def _read_identity(cfg: RunConfig) -> str:
    """The run id of the config written one way for one training: every task key its tasks do
    not read at its default, and so each :data:`~dynamics.identity.CONDITIONAL_KEYS` setting it
    does not read (learned-gate keys under fixed gates, d_mlp without MLPs, ...); mixture weights
    as the probabilities they give (none when equal: ``[]``, ``[1, 1]`` and ``[2, 2]`` draw the
    same rows); a mixture of one component as that task (it makes the task's very batches).

    Settings that resolve to one training are resolved too (:data:`_RESOLVED`): ``d_head``
    written as d_model / n_heads, ``head_weights`` as the on or off it comes to,
    ``min_lr_frac`` where no update reaches the decay, the snapshot cadence as its steps, and
    ``chg_every`` as the snapshots it fits CHG at.
    Points that differ only there recorded bitwise the same arrays under two run ids."""
    from dynamics.tasks.batch import _mixture_weights

    cfg = _unread_at_defaults(cfg)
    task = cfg.task
    if task.name == "mixture":
        p = _mixture_weights(cfg)  # what the generator draws with, so equal here means equal rows
        weights = () if np.all(p == p[0]) else tuple(float(x) for x in p)
        task = replace(task, weights=weights)
        if len(task.components) == 1:
            task = replace(task, name=task.components[0], components=(), weights=())
    m, r, tr = cfg.model, cfg.record, cfg.train
    model = replace(m, d_head=0) if m.d_head and m.d_head * m.n_heads == m.d_model else m
    weights_on = r.head_weights == "on" or (r.head_weights == "auto" and m.d_model <= 256)  # record.store_head_weights
    # CHG is fitted at every chg_every-th snapshot and the last (record.chg_fitted): past the
    # last index, every chg_every fits the first and the last alone
    chg_every = min(r.chg_every, n_snapshots(tr.steps, r.dense_until, r.every) - 1)
    record = replace(r, head_weights="on" if weights_on else "off", every=SECTIONS["record"].every,
                     dense_until=SECTIONS["record"].dense_until, chg_every=chg_every)
    train = replace(tr, min_lr_frac=SECTIONS["train"].min_lr_frac) if tr.warmup_steps >= tr.steps - 1 else tr
    same = replace(cfg, task=task, model=model, record=record, train=train).run_id()
    return f"{same} {_schedule(tr.steps, r.dense_until, r.every)}"


def _schedule(steps: int, dense_until: int, every: int) -> str:
    """The snapshot steps (:func:`~dynamics.budget.snapshot_steps`) as a digest; past
    :data:`_SCHEDULE_LISTED` of them, the dense phase's last power of two and the cadence."""
    if n_snapshots(steps, dense_until, every) > _SCHEDULE_LISTED:
        return f"{min(dense_until, steps).bit_length()} {every}"
    return hashlib.sha256(snapshot_steps(steps, dense_until, every).tobytes()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """Tuples to lists, so values round-trip through JSON attributes unchanged."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
