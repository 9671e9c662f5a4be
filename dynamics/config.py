"""Run configuration: frozen dataclasses, read from TOML, validated before any work.

A config is a tree of small frozen dataclasses (nanoGPT's "one config passed whole",
tuned-lens's "nested dataclasses with attribute docstrings"). Each field's docstring is
the string literal under it. ``load_config`` reads TOML with sections [model], [task],
[train], [record], optionally [sweep] and [intervene], applies ``--set section.key=value``
overrides and validates; every problem raises :class:`ConfigError` whose message names the
key, so the CLI can print one line and exit 2 before anything is trained or written.

This module imports nothing from the package: everything else imports it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import tomllib
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from dynamics.identity import experiment_identity
from dynamics.limits import MAX_CONFIG_BYTES, MAX_DEPTH, MAX_INT

TASKS = ("induction", "offset_copy", "markov", "slash_text", "corpus", "mixture")
BYTE_TASKS = ("slash_text", "corpus")  # byte-level: need vocab_size >= 256


class ConfigError(ValueError):
    """A configuration problem; the message is one line naming the key."""


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int = 2
    """Number of transformer blocks."""
    d_model: int = 64
    """Width of the residual stream."""
    n_heads: int = 4
    """Attention heads per layer."""
    d_head: int = 0
    """Width of each head; 0 means d_model // n_heads (then n_heads must divide d_model)."""
    d_mlp: int = 256
    """Hidden width of each MLP (not read when attn_only: setting it then is refused, identity.CONDITIONAL_KEYS)."""
    attn_only: bool = False
    """Drop the MLPs: attention-only models make head roles easier to read."""
    vocab_size: int = 64
    """Number of token ids; byte-level tasks (slash_text, corpus) need at least 256."""
    context: int = 64
    """Sequence length the model sees (tasks emit context + 1 tokens for next-token targets)."""
    pos: str = "rope"
    """Positional scheme: rope | learned | none."""
    rope_base: float = 10000.0
    """RoPE frequency base theta."""
    init: str = "xavier_uniform"
    """Weight init: xavier_uniform | xavier_normal | normal (std 0.02)."""
    init_scale: float = 1.0
    """Multiplier on the init scale of W_Q, W_K, W_V, W_O (1.0 = standard); a sweep axis."""
    gates: str = "fixed"
    """Head gates: fixed (g = 1, out of the optimiser, in the graph) | learned (g = sigmoid(logit))."""
    gate_l1: float = 0.01
    """Weight of the L1 pull toward 0 on learned gates, at full strength."""
    gate_init: float = 3.0
    """Initial logit of learned gates (sigmoid(3) ~ 0.95)."""

    @property
    def head_dim(self) -> int:
        """Resolved per-head width."""
        return self.d_head or self.d_model // self.n_heads

    @property
    def weight_entries(self) -> int:
        """Entries of the model's weight matrices (embedding, positions, W_Q/W_K/W_V/W_O, MLP,
        unembedding): its parameter count less the biases, LayerNorms and gates."""
        d, per_layer = self.d_model, 4 * self.n_heads * self.d_model * self.head_dim
        if not self.attn_only:
            per_layer += 2 * d * self.d_mlp
        return 2 * self.vocab_size * d + (self.context * d if self.pos == "learned" else 0) + self.n_layers * per_layer


@dataclass(frozen=True)
class TaskConfig:
    name: str = "induction"
    """Task: induction | offset_copy | markov | slash_text | corpus | mixture."""
    min_period: int = 4
    """induction: shortest period of the repeated random segment."""
    max_period: int = 16
    """induction: longest period; periods vary so a fixed-offset head cannot solve the task."""
    delta: int = 3
    """offset_copy: copy offset; token t equals token t - delta with probability p."""
    p: float = 0.8
    """offset_copy: copy probability."""
    markov_order: int = 1
    """markov: n-gram order of the chain (how many previous tokens the next depends on)."""
    markov_branching: int = 3
    """markov: successors allowed per context, at most (sparsity of the chain; drawn ids that repeat merge)."""
    holdout: float = 0.1
    """corpus: fraction of stdlib files held out for evaluation and probes."""
    components: tuple[str, ...] = ()
    """mixture: component task names; refused under any other task."""
    weights: tuple[float, ...] = ()
    """mixture: component weights (normalised); empty means equal; refused under any other task."""
    pool_size: int = 0
    """Low-data regime: > 0 draws every training row from one fixed pool of this many sequences."""

    @property
    def component_names(self) -> tuple[str, ...]:
        """Components a batch can come from (the task itself unless it is a mixture)."""
        return self.components if self.name == "mixture" else (self.name,)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    """Number of optimiser steps."""
    lr: float = 1e-3
    """Peak learning rate: the updates from steps warmup_steps - 1 and warmup_steps run at it
    (never reached when warmup_steps > steps; see dynamics.train.lr_at)."""
    batch_size: int = 32
    """Sequences per step."""
    seed: int = 0
    """Seed for init, data and probes; the same config and seed give the same arrays on CPU."""
    optimizer: str = "adamw"
    """adamw | sgd."""
    weight_decay: float = 0.01
    """Decoupled weight decay (AdamW) or L2 (SGD), applied to every trained parameter: matrices,
    embeddings, biases, LayerNorm gains and learned gate logits alike (nanoGPT spares the
    1-D ones; here one group keeps the sweep axis a single number)."""
    beta1: float = 0.9
    """Adam beta1, or SGD momentum."""
    beta2: float = 0.99
    """Adam beta2."""
    warmup_steps: int = 50
    """Linear warm-up length: the update from step s < warmup_steps runs at
    lr * (s + 1) / warmup_steps (the first at lr / warmup_steps, not 0); a cosine decay from lr
    to min_lr_frac * lr follows. With warmup_steps >= steps the run ends inside the warm-up:
    its last update runs at lr * steps / warmup_steps and nothing decays."""
    min_lr_frac: float = 0.1
    """Learning rate the cosine decays to, as a fraction of lr. It is reached at step
    ``steps``, one past the last update, so the last update runs above it (0.1009 lr at
    100 steps with 50 of warm-up; 0.1859 lr at 10 steps with 5; lr itself at 6 steps with 5).
    No effect when warmup_steps >= steps - 1: the one update after such a warm-up runs at lr."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables."""
    device: str = "cpu"
    """torch device: cpu | cuda | cuda:N."""
    threads: int = 1
    """torch intra-op threads on CPU. These models are small: on a 2-core machine a second
    thread gained nothing with the other core idle, and made training about 3.3x slower with
    the other core busy (README, Performance), as it is in a sweep or beside the recorder's
    writer. At most MAX_THREADS (1024); `dynamics run` notes a count above the cores it may use.
    Outside the run id: another count sums in another order, the same run to float rounding only."""
    eval_batches: int = 1
    """Held-out batches per task component at each snapshot (the recorder's largest cost: bench/record.py)."""


@dataclass(frozen=True)
class RecordConfig:
    dense_until: int = 64
    """Snapshots at 0, 1, 2, 4, ... up to this step, then at every multiple of `every` past the
    last of those powers of two (not only past this step), and at the last step."""
    every: int = 100
    """Snapshot cadence after the dense phase (dense_until 100, every 30: ..., 32, 64, 90, 120, ...)."""
    n_probe: int = 8
    """Probe sequences drawn once per run; attention is recorded on them. On the induction
    task each probe has one period, and induction differs from attention at a fixed offset only
    across probes of several periods: with one probe a fixed-offset head can read "induction"."""
    attention_dtype: str = "float16"
    """float16 | float32 for the stored attention maps."""
    head_weights: str = "auto"
    """Store each head's W_Q/W_K/W_V/W_O slices: auto (when d_model <= 256) | on | off."""
    eval_batch_size: int = 32
    """Sequences per held-out eval batch."""
    chg_every: int = 0
    """Fit causal head gating at every k-th snapshot and the last; 0 = never during training."""
    chg_steps: int = 200
    """Updates per CHG stage when fitting during training."""


def _hashable(value: Any) -> Any:
    """``value`` with its dicts as frozensets of items and its lists as tuples: what a frozen
    config holding tables hashes, so that equal configs (as ``==`` compares them: dicts in any
    order, 1 and 1.0 alike) hash alike."""
    if isinstance(value, dict):
        return frozenset((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


def _hash_fields(cfg: Any) -> int:
    return hash((type(cfg).__name__, *(_hashable(getattr(cfg, f.name)) for f in dataclasses.fields(cfg))))


@dataclass(frozen=True)
class SweepConfig:
    axes: dict[str, tuple] = field(default_factory=dict)
    """Dotted config key -> list of values; the default is the full grid over axes."""
    zip: tuple[tuple[str, ...], ...] = ()
    """Groups of axes paired element-wise instead of crossed (equal lengths)."""

    # dataclass's own hash fails on the axes dict: "unhashable type: 'dict'"
    __hash__ = _hash_fields


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """Architecture."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Training data."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation."""
    record: RecordConfig = field(default_factory=RecordConfig)
    """What is recorded and when."""
    sweep: SweepConfig = field(default_factory=SweepConfig)
    """Grid of variations; empty for a single run."""
    intervene: dict = field(default_factory=dict)
    """Interventions during training (templates, distillation, conditioned gates); see docs."""

    # frozen, so a set or dict key; dataclass's own hash failed on the intervene and axes dicts
    __hash__ = _hash_fields

    def to_dict(self) -> dict:
        """Plain, JSON-able dict of the whole config (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def run_id(self) -> str:
        """Stable id derived from the resolved config, sweep table excluded."""
        blob = json.dumps(experiment_identity(self.to_dict()), sort_keys=True).encode()
        return "r" + hashlib.sha1(blob).hexdigest()[:10]


SECTIONS = {
    "model": ModelConfig,
    "task": TaskConfig,
    "train": TrainConfig,
    "record": RecordConfig,
}


def _coerce(key: str, value: Any, default: Any, item: type | None = None) -> Any:
    """Check `value` against the type of the field's default and convert lists to tuples,
    checking each element against ``item`` (the element type of a ``tuple[item, ...]`` field)."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if not -MAX_INT < value < MAX_INT:
            raise ConfigError(f"{key}: expected an integer within +-2**63, got {int_text(value)}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer past the float range (TOML integers have no bound)
            raise ConfigError(f"{key}: expected a finite number, got an integer beyond the float range") from None
        if not math.isfinite(number):  # nan or inf: no setting means that
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        # -0.0 trains what 0.0 does, but its JSON "-0.0" gave the run another id, not seen as a twin
        return number + 0.0
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if item is not None:
            for i, v in enumerate(value):
                _coerce(f"{key}[{i}]", v, item())
        return tuple(value)  # as written: converting [1, 3] to floats would change the run id
    return value


def int_text(value: int) -> str:
    """An integer as an error line shows it: a 400-digit one as its length, not its digits."""
    digits = len(str(abs(value)))
    return str(value) if digits <= 24 else f"{'a negative' if value < 0 else 'an'} integer of {digits} digits"


def _check_values(key: str, value: Any, depth: int = 0) -> None:
    """ConfigError for what no setting takes anywhere in a config (intervene and sweep tables
    included, which are read later, point by point): a TOML date or time, which failed the run id's
    JSON with a traceback; and nesting deeper than :data:`MAX_DEPTH`, a RecursionError."""
    if depth > MAX_DEPTH:
        raise ConfigError(f"{key}: nested more than {MAX_DEPTH} tables or lists deep, which no config is")
    if isinstance(value, (datetime.date, datetime.time)):  # datetime.datetime is a date
        raise ConfigError(f"{key}: a TOML date or time ({value.isoformat()}), which no setting takes "
                          f"(quoted, \"{value.isoformat()}\" is a string)")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        _check_values(f"{key}[{k}]" if isinstance(value, list) else f"{key}.{k}" if key else str(k), v, depth + 1)


def _build_section(name: str, raw: dict) -> Any:
    cls = SECTIONS[name]
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: expected a table, got {raw!r}")
    defaults = cls()
    known = {f.name for f in fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"unknown key '{name}.{key}'")
        item = next(iter(typing.get_args(hints[key])), None)  # tuple[float, ...] -> float
        kwargs[key] = _coerce(f"{name}.{key}", value, getattr(defaults, key), item if isinstance(item, type) else None)
    return cls(**kwargs)


# one of the two may be a --set of the table beside the file's dotted key: the form that replaces it
_TWO_SPELLINGS = ("as a dotted key and in a table, in the file or one by --set; --set sweep.{key}=[...] replaces "
                  "the file's either way")


def _flatten(prefix: str, table: dict) -> dict[str, Any]:
    """Nested tables to dotted keys. TOML spells one axis two ways (``"model.init_scale"`` and a
    ``model`` table's ``init_scale``): given both, one list would silently replace the other."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and not v:  # --set 'sweep.intervene.templates={}' swept nothing, without a word
            raise ConfigError(f"sweep.{key}: an empty table holds no axis (an axis is a list of values, "
                              f"e.g. sweep.{key}.<key> = [...])")
        for dotted, value in (_flatten(key, v) if isinstance(v, dict) else {key: v}).items():
            if dotted in out:
                raise ConfigError(f"sweep.{dotted}: given twice ({_TWO_SPELLINGS.format(key=dotted)})")
            out[dotted] = value
    return out


def _replace_spelling(table: dict, dotted: str, value: Any) -> bool:
    """Put `value` where `table` already holds the dotted key `dotted`, however it is spelled
    there (``"a.b"``, or ``b`` in table ``a``), keeping its place; False if it holds none."""
    for k in table:
        if k == dotted:
            table[k] = value
            return True
        if isinstance(table[k], dict) and dotted.startswith(f"{k}.") \
                and _replace_spelling(table[k], dotted[len(k) + 1:], value):
            return True
    return False


def _build_sweep(raw: dict) -> SweepConfig:
    raw = dict(raw)
    zip_groups = raw.pop("zip", [])
    # RunConfig.to_dict() nests the axes under "axes" (the SweepConfig field); TOML lists them
    # at the top of [sweep]. "axes" is no section, so both forms read the same.
    flat: dict[str, Any] = {}  # in the grid order: the axes table's in its place
    from_axes: set[str] = set()
    for k, v in raw.items():
        in_axes = k == "axes" and isinstance(v, dict)
        for key, values in _flatten("", v if in_axes else {k: v}).items():
            if key in flat:  # one list silently replaced the other
                where = ("in [sweep] and in its axes table" if in_axes or key in from_axes
                         else _TWO_SPELLINGS.format(key=key))
                raise ConfigError(f"sweep.{key}: given twice ({where})")
            flat[key] = values
            if in_axes:
                from_axes.add(key)
    axes = {}
    for key, values in flat.items():
        section, _, leaf = key.partition(".")
        # intervene.* axes are free-form here; interventions.check validates each point
        if section == "intervene" and leaf:
            pass
        elif section not in SECTIONS or leaf not in {f.name for f in fields(SECTIONS[section])}:
            raise ConfigError(f"sweep: unknown axis '{key}'")
        if not isinstance(values, list):
            raise ConfigError(f"sweep.{key}: expected a list of values, got {values!r}")
        if not values:
            raise ConfigError(f"sweep.{key}: empty list of values")
        axes[key] = tuple(values)
    groups = []
    if not isinstance(zip_groups, list) or not all(isinstance(g, list) and all(isinstance(k, str) for k in g)
                                                   for g in zip_groups):
        raise ConfigError("sweep.zip: expected a list of lists of axis names")
    seen: set[str] = set()
    for group in zip_groups:
        if len(group) < 2:  # accepted silently, [[]] would only store a group that does nothing
            raise ConfigError(f"sweep.zip: the group {group} pairs nothing: a zip group names two or more axes")
        twice = sorted({k for k in group if group.count(k) > 1}, key=str)
        if twice:  # not "in two zip groups": this one names it twice
            raise ConfigError(f"sweep.zip: {twice[0]!r} appears twice in the group {group}")
        for key in group:
            if key not in axes:
                raise ConfigError(f"sweep.zip: '{key}' is not a sweep axis")
            if key in seen:
                raise ConfigError(f"sweep.zip: '{key}' appears in two zip groups")
            seen.add(key)
        lengths = {len(axes[k]) for k in group}
        if len(lengths) > 1:
            raise ConfigError(f"sweep.zip: axes {group} have different lengths")
        groups.append(tuple(group))
    return SweepConfig(axes=axes, zip=tuple(groups))


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``section.key=value``; the value is read as TOML, else taken as a string."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or "." not in key:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        doc = tomllib.loads(f"v = {value.strip()}")
    except tomllib.TOMLDecodeError:
        return key, value.strip()
    except RecursionError:  # tomllib reads nested lists and tables recursively
        raise ConfigError(f"--set {key}: nested more than {MAX_DEPTH} tables or lists deep, which no config is") from None
    if len(doc) > 1:  # "5\ntrain.lr=-1": the lines after the value were dropped unread
        raise ConfigError(f"--set {key}: one value per --set, got more lines: {value.strip()!r}")
    return key, doc["v"]


def _apply_override(raw: dict, key: str, value: Any) -> None:
    section, _, leaf = key.partition(".")
    if section not in (*SECTIONS, "sweep", "intervene"):
        raise ConfigError(f"unknown section '{section}' in --set {key}")
    parts = [section, *(leaf.split(".") if section in ("sweep", "intervene") else [leaf])]
    # --set sweep.model.init_scale=[...] replaces the file's axis however the file spells it (a
    # second spelling would be refused as the axis given twice), in its place in the grid order
    if section == "sweep" and isinstance(raw.get("sweep"), dict) and (
            _replace_spelling(raw["sweep"], leaf, value)  # or in the axes table, as RunConfig.to_dict() writes them
            or isinstance(raw["sweep"].get("axes"), dict) and _replace_spelling(raw["sweep"]["axes"], leaf, value)):
        return
    node = raw
    for i, part in enumerate(parts[:-1]):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):  # e.g. `model = 3` in the file: nowhere to put the key
            raise ConfigError(f"--set {key}: {'.'.join(parts[:i + 1])} is not a table, got {node!r}")
    node[parts[-1]] = value


def from_dict(raw: dict, *, recorded: bool = False) -> RunConfig:
    """Build and validate a RunConfig from a nested dict (as read from TOML or run attrs;
    ``recorded``: a run's own, see :func:`recorded_config`)."""
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a table at top level")
    _check_values("", raw)
    for section in raw:
        if section not in (*SECTIONS, "sweep", "intervene"):
            raise ConfigError(f"unknown section '{section}'")
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{section}: expected a table, got {raw[section]!r}")
    cfg = RunConfig(
        model=_build_section("model", raw.get("model", {})),
        task=_build_section("task", raw.get("task", {})),
        train=_build_section("train", raw.get("train", {})),
        record=_build_section("record", raw.get("record", {})),
        sweep=_build_sweep(raw.get("sweep", {})),
        intervene=dict(raw.get("intervene", {})),
    )
    validate(cfg, recorded=recorded)
    return cfg


def recorded_config(raw: dict, run: str = "the run") -> RunConfig:
    """The RunConfig of a recorded run, from its ``config`` attribute (``sweep`` dropped).

    Like :func:`from_dict`, except that ``task.components`` and ``task.weights`` under a task
    other than mixture are dropped, not refused: earlier versions accepted and ignored them,
    so a run recorded with them trained exactly the config without them, and it must stay
    loadable (gates, resume, a distillation teacher). For the same reason the rules that refuse
    values a run trains with, but to no use, added after runs were recorded with them, do not
    apply to it (``config_rules.validate``). ``run`` (``"run r1 in s.zarr"``) names it
    in the ConfigError when the attribute is missing or this version cannot read it."""
    if not isinstance(raw, dict):  # as if typed by the user ("unknown key") or a traceback, before
        raise ConfigError(f"{run}: its recorded config is missing or not a table")
    raw = {k: v for k, v in raw.items() if k != "sweep"}
    task = raw.get("task")
    if isinstance(task, dict) and task.get("name", TaskConfig.name) != "mixture":
        raw["task"] = {k: v for k, v in task.items() if k not in ("components", "weights")}
    try:
        return from_dict(raw, recorded=True)
    except ConfigError as e:
        raise ConfigError(f"{run}: its recorded config cannot be read by this version: {e}") from None


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a TOML config, apply ``--set`` overrides, validate.

    Parameters
    ----------
    path : str or Path
        TOML file with sections [model], [task], [train], [record] and optionally [sweep] and
        [intervene].
    overrides : list of str
        ``section.key=value`` strings; values are parsed as TOML literals.

    Returns
    -------
    RunConfig

    Raises
    ------
    ConfigError
        One line naming the file or key at fault.

    Example
    -------
    >>> cfg = load_config("experiments/induction.toml", ["train.steps=50"])  # doctest: +SKIP
    """
    # Python's own errors named neither argument ("'int' object has no attribute 'partition'"), and
    # a string was iterated character by character ("--set 't': expected section.key=value")
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"config path: expected a str or path-like, got {type(path).__name__} {path!r}")
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"overrides: expected a list of 'section.key=value' strings, got {overrides!r}")
    if isinstance(path, str) and path.startswith("file://"):  # as a store's: Path() made it "file:/x", not found
        path = unquote(path[len("file://"):])
    elif isinstance(path, str) and "://" in path and not os.path.exists(path):  # Path() made it "http:/x", not found
        raise ConfigError(f"config file not found: {path} (a URL is not fetched: download the file, give its path)")
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a config file")
    if not path.exists():  # a pipe (`dynamics run <(...)`) is no regular file, but is read
        raise ConfigError(f"config file not found: {path}")
    try:
        with path.open("rb") as fh:  # bounded: a device (/dev/zero) or a data file given by mistake
            text = fh.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: longer than {MAX_CONFIG_BYTES:,} bytes, which no config is "
                              f"(a data file or a device?)")
        # newlines as read_text translated them: a file of bare CR line ends (old Mac) loaded before;
        # a leading byte-order mark (Windows Notepad saves one) was "Invalid statement" at line 1
        raw = tomllib.loads(text.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:  # tomllib reads nested lists and tables recursively
        raise ConfigError(f"{path}: nested more than {MAX_DEPTH} tables or lists deep, which no config is") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (TOML is UTF-8): byte {e.start}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    given: set[str] = set()
    for text in overrides:
        key, value = parse_override(text)
        if key in given:  # the last would win silently: one of the two is a mistake
            raise ConfigError(f"--set {key}: given twice")
        # a table and a key in it (intervene.templates={...}, intervene.templates.weight=0.5): as above
        if inside := next((k for k in sorted(given) if k.startswith(key + ".") or key.startswith(k + ".")), None):
            where = "inside it" if inside.startswith(key + ".") else "around it"
            raise ConfigError(f"--set {key}: given twice (also --set {inside}, {where}); give it once")
        given.add(key)
        _apply_override(raw, key, value)
    return from_dict(raw)


def with_values(cfg: RunConfig, values: dict[str, Any]) -> RunConfig:
    """Return cfg with dotted keys replaced (used for sweep points), validated."""
    raw = cfg.to_dict()
    raw.pop("sweep")
    for key, value in values.items():
        section, *path = key.split(".")
        if not path:  # an IndexError below, naming nothing (the CLI's and the sweep's checks refuse it first)
            raise ConfigError(f"{key!r}: expected section.key")
        node = raw.setdefault(section, {})
        for i, part in enumerate(path[:-1]):
            node = node.setdefault(part, {})
            # intervene.* axes are free-form: one may run into a value (a list, a number) of the base
            if not isinstance(node, dict):
                raise ConfigError(f"sweep axis '{key}': {'.'.join([section, *path[:i + 1]])} is not a table, "
                                  f"got {node!r}")
        node[path[-1]] = value
    return from_dict(raw)


def validate(cfg: RunConfig, *, recorded: bool = False) -> None:
    """Raise ConfigError naming the first impossible value, else None (:mod:`dynamics.config_rules`)."""
    from dynamics.config_rules import validate as rules  # here: that module imports this one

    rules(cfg, recorded=recorded)


def check(cfg: RunConfig) -> None:
    """ConfigError naming the first field of a wrong type or value, unless `load_config` could have
    built ``cfg``: one made in code (``ModelConfig(n_heads=3)``) failed deep inside training."""
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"config: expected a RunConfig (dynamics.load_config), got {type(cfg).__name__}")
    from_dict(cfg.to_dict())


def replace_section(cfg: RunConfig, section: str, **changes: Any) -> RunConfig:
    """Convenience for tests and code: cfg with some fields of one section changed, checked
    (types and values, as `check`)."""
    new = replace(cfg, **{section: replace(getattr(cfg, section), **changes)})
    check(new)
    return new
