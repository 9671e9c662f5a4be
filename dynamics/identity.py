"""What makes two runs the same experiment, or seeds of one config, and what names configs apart.

Pure functions of config dicts (``RunConfig.to_dict()`` or a run's stored ``config`` attr), so
readers of a store need no RunConfig to group its runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


def identity_difference(recorded: dict, config: dict, most: int = 3) -> str:
    """Where the experiment a run recorded (its stored ``config`` attr) and ``config`` differ,
    as ``key: recorded A, here B`` for up to `most` settings: a refusal to mix two configs under one
    run id said only "a different config", so a resume refused after a default changed named no
    setting to ``--set`` back.

    >>> identity_difference({"train": {"lr": 0.1, "steps": 5}}, {"train": {"lr": 0.2, "steps": 5, "seed": 1}})
    'train.lr: recorded 0.1, here 0.2; train.seed: recorded none, here 1'
    """
    def flat(d: dict, head: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            # an empty table is a value of its own: {} against none differs (a store from before [intervene])
            out.update(flat(v, f"{head}{k}.") if isinstance(v, dict) and v else {f"{head}{k}": v})
        return out

    a, b = flat(experiment_identity(recorded)), flat(experiment_identity(config))
    keys = sorted(k for k in {*a, *b} if json.dumps(a.get(k), sort_keys=True) != json.dumps(b.get(k), sort_keys=True))
    text = "; ".join(f"{k}: recorded {_shown(a, k)}, here {_shown(b, k)}" for k in keys[:most])
    return text + (f"; {len(keys) - most} more" if len(keys) > most else "")


def _shown(settings: dict[str, Any], key: str) -> str:
    return json.dumps(settings[key]) if key in settings else "none"


def seed_group(config: dict) -> str:
    """A key equal for exactly the runs that are seeds of one config (JSON of its identity
    without the seed): cross-seed consistency's groups."""
    return json.dumps(experiment_identity(config, without_seed=True), sort_keys=True)


def seed_settings(config: dict) -> dict[str, Any]:
    """A run's config (``RunConfig.to_dict()`` or its stored ``config`` attr) as flat
    ``{"section.key": value}`` settings, less the sweep table, :data:`EXECUTION_KEYS` and the seed:
    runs are seeds of one config iff these are equal."""
    identity = experiment_identity(config, without_seed=True)
    return {f"{sec}.{k}": v for sec, table in identity.items() if isinstance(table, dict) for k, v in table.items()}


class _Unread(str):
    """The value :func:`read_settings` gives a setting a run does not read: prints as ``none``."""


UNREAD = _Unread("none")
"""A setting the run does not read (:func:`read_settings`); :func:`differing_settings` sees no
difference in it, and it prints as ``none`` (a str, so that tables and JSON take it as they are)."""


def read_settings(config: dict) -> dict[str, Any]:
    """:func:`seed_settings` with :data:`UNREAD` for the settings the config does not read: task
    keys none of its tasks reads, and each :data:`CONDITIONAL_KEYS` setting whose condition does
    not hold. What tables and labels show: a markov run's ``task.max_period`` (read by induction
    alone) and an attention-only model's ``model.d_mlp`` read as differences from the runs beside them.

    Examples
    --------
    >>> s = read_settings({"task": {"name": "markov", "max_period": 16, "markov_order": 2, "components": []},
    ...                    "model": {"attn_only": True, "d_mlp": 256}})
    >>> s["task.max_period"] is UNREAD, s["task.markov_order"], s["model.d_mlp"], s["task.components"]
    (True, 2, 'none', 'none')
    """
    from dynamics.tasks.batch import TASK_KEYS  # here: the tasks import numpy, which grouping needs not

    settings = seed_settings(config)
    name = _get(config, "task.name")
    names = _get(config, "task.components") if name == "mixture" else [name]
    read = {k for name in names for k in TASK_KEYS.get(name, ())}
    unread = {f"task.{k}" for keys in TASK_KEYS.values() for k in keys if k not in read}
    if name != "mixture":  # read by a mixture alone (and refused under any other task): an induction run's [] read as a value
        unread |= {"task.components", "task.weights"}
    unread |= {dotted for dotted, reader in CONDITIONAL_KEYS.items() if not reader.reads(_get(config, reader.condition))}
    return {k: UNREAD if k in unread else v for k, v in settings.items()}


def differing_settings(settings: Iterable[dict[str, Any]]) -> list[str]:
    """The keys, sorted, whose values are not the same in all of ``settings`` that read them (a
    missing key counts as a value; :data:`UNREAD` does not): what names each of several configs
    apart from the others.

    >>> differing_settings([{"a": 1, "b": 2}, {"a": 1, "b": UNREAD}, {"a": 2}])
    ['a', 'b']
    >>> differing_settings([{"a": 1, "b": 2}, {"a": 1, "b": UNREAD}])
    []
    """
    settings = list(settings)
    keys = sorted({k for s in settings for k in s})
    # by type, not identity: a copy (copy, pickle) of UNREAD is no longer UNREAD itself
    return [k for k in keys
            if len({json.dumps(s.get(k), sort_keys=True) for s in settings if not isinstance(s.get(k), _Unread)}) > 1]


def setting_text(settings: dict[str, Any], key: str) -> str:
    """A setting as labels quote it (cross-seed consistency's groups, predict's config groups): as
    the runs tables show it (`setting_cell`), ``none`` where the run lacks it (an ``[intervene]``
    section) or does not read it (:data:`UNREAD`), as `dynamics status` shows both.

    >>> setting_text({"task.name": "markov", "task.max_period": UNREAD}, "task.name"), setting_text({}, "intervene.x")
    ('markov', 'none')
    """
    value = settings.get(key, UNREAD)
    return "none" if isinstance(value, _Unread) else setting_cell(value)


def setting_cell(value) -> str:
    """A swept value or setting as the runs tables show it, `dynamics status`'s, `analyse`'s and the
    report's alike, and as labels quote it (`setting_text`): compact JSON for a list or table (no
    spaces, so the columns stay aligned), the value as Python prints it otherwise, ``none`` for
    None (a setting a run lacks).

    >>> setting_cell(["induction", "offset_copy"]), setting_cell(1.0), setting_cell(None)
    ('["induction","offset_copy"]', '1.0', 'none')
    """
    if value is None:
        return "none"
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


@dataclass(frozen=True)
class _Reader:
    """When a setting is read: under ``condition`` (a dotted key) at a value ``reads`` accepts."""

    condition: str
    reads: Callable[[Any], bool]
    who: str
    """Who does not read it, with the condition's value as ``{}``: 'fixed gates (model.gates = {})'."""
    plural: bool
    remedy: str
    """What else to do than drop the setting."""


# Under model.gates = "fixed" no gate is learned: gate_init and gate_l1 go unread.
_LEARNED = _Reader("model.gates", lambda v: v == "learned", "fixed gates (model.gates = {})", True,
                   'set model.gates = "learned"')
CONDITIONAL_KEYS: dict[str, _Reader] = {
    "model.gate_init": _LEARNED,
    "model.gate_l1": _LEARNED,
    "model.d_mlp": _Reader("model.attn_only", lambda v: not v, "an attention-only model (model.attn_only = {})",
                           False, "set model.attn_only = false"),
    "model.rope_base": _Reader("model.pos", lambda v: v == "rope", "a model without RoPE (model.pos = {})", False,
                               'set model.pos = "rope"'),
    "train.beta2": _Reader("train.optimizer", lambda v: v != "sgd", "SGD (train.optimizer = {})", False,
                           'set train.optimizer = "adamw"'),
    "record.chg_steps": _Reader("record.chg_every", lambda v: v > 0,
                                "a run that fits no gates while it trains (record.chg_every = {})", False,
                                "set record.chg_every"),
}
"""Settings read only under a condition on another (task keys are :func:`dynamics.tasks.unread_keys`'):
set away from their defaults where it does not hold, they change the run id and nothing the run
trains or records."""


def _get(config: dict, dotted: str) -> Any:
    from dynamics.config import SECTIONS

    section, key = dotted.split(".")
    return config.get(section, {}).get(key, getattr(SECTIONS[section], key))


def unread_settings(config: dict) -> dict[str, Any]:
    """``{"section.key": value}`` of the :data:`CONDITIONAL_KEYS` a config dict
    (``RunConfig.to_dict()``) sets away from their defaults where it does not read them."""
    from dynamics.config import SECTIONS

    out = {}
    for dotted, reader in CONDITIONAL_KEYS.items():
        section, key = dotted.split(".")
        table = config.get(section, {})
        if key in table and table[key] != getattr(SECTIONS[section], key) and not reader.reads(_get(config, reader.condition)):
            out[dotted] = table[key]
    return out


def not_read_by(dotted: str, config: dict) -> str:
    """Who, in ``config``, does not read the setting: 'fixed gates (model.gates = "fixed") do not read'."""
    reader = CONDITIONAL_KEYS[dotted]
    value = json.dumps(_get(config, reader.condition))
    return f"{reader.who.format(value)} {'do' if reader.plural else 'does'} not read"


def remedy(dotted: str) -> str:
    """The other way out than dropping the setting, and the key a sweep would vary to read it."""
    return CONDITIONAL_KEYS[dotted].remedy


def condition_key(dotted: str) -> str:
    return CONDITIONAL_KEYS[dotted].condition


def unread_setting_problem(config: dict) -> str | None:
    """One line for `dynamics run` on the first of :func:`unread_settings`, or None."""
    unread = unread_settings(config)
    if not unread:
        return None
    key, value = next(iter(unread.items()))
    return (f"{key} = {value!r}: {not_read_by(key, config)} it, so the run would train what the config without it "
            f"trains, under another run id; drop the setting, or {remedy(key)}")
