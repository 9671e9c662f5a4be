"""Names shared by the recorder, the store, the analysers and the report.

One place for dimension and variable names, so that writers and readers agree without
importing each other (the analysis side must not import torch-bearing modules).

Store layout (a Zarr v3 group; see dynamics/store/)::

    STORE/                      attrs: dynamics_store = STORE_VERSION
      runs/<run_id>/            one group per run, written only by that run
      analysis/<run_id>/        derived arrays written by `dynamics analyse`
      derived/<name>/           sweep-level results (predictor curves, ...)
      sweep                     attrs of the root: sweep index, written by the launcher only
      checkpoints/<run_id>/     training checkpoint ckpt.pt (torch, not zarr) and train.lock
"""

STORE_VERSION = 1

MKDIR_PROBE = ".dynamics-probe-"
"""The prefix of the folder `dynamics.usage.cannot_make_in` makes and removes at once, to learn that
mkdir works in a folder (access() says yes to root everywhere): another command seeing it in an
empty folder, for those microseconds, must still take that folder as empty."""

BASELINE_SNAPSHOTS = 3
"""The default of ``AnalysisOptions.baseline_snapshots``: the snapshots that set the divergence
curve's early band, so a run is analysed from ``BASELINE_SNAPSHOTS + 1`` on. Here, not in the
analysers, so that `dynamics run` and `dynamics sweep` can say a schedule gives fewer as they start
without importing them (xarray and scipy: a second or two)."""

ANALYSIS_VERSION = 14
"""Stamped on every analysis (attr ``analysis_version``) and raised whenever what the analysers
compute changes; readers recompute a stored analysis of another version rather than mix it with
this one's, and `dynamics.store.open_analysis` warns on one (version 2: slash window up to T // 2,
induction keys k < i, ragged runs; version 3: no positional role score on probes so short that
uniform attention passes it; version 4: the same rule for slash-dominance,
`uninformative_offsets`; ``token_ratio`` stored; version 5: ``redundancy_fraction`` NaN with
fewer than two heads, ``winner_take_all`` NaN for a layer of one head, where both read 0;
version 6: the slash role leaves out only the offsets a sink or uniform attention passes, where
a window reaching them blanked it for every head; version 7: ``slash_dominant`` and
``token_dominant`` float, NaN where undefined, and left out of the dominant shares, where they
read False and counted as 0; version 8: ``layer_bifurcation_step``, the rule on each layer's own
divergence; version 9: ``winner_take_all`` of Michel et al.'s importance, gate x the recorded
|dL/dg|, where it took |dL/dg| alone: the same with fixed gates, not with learned ones; and
induction unscored on probes where uniform attention reaches its threshold; version 10:
``previous_token_peak``, Voita et al.'s rule for the positional head; version 11: a bifurcation
the band misses, inside the baseline snapshots, dated where the curve left its first value, where it read "never";
version 12: so too where the band dates it later, which version 11 (in commits 22a7a3e..) did not;
version 13: ``bifurcation_resampled``, the step on bootstrap resamples of the probes;
version 14: ``role_resampled``, the last snapshot's roles on those resamples).
Defined here, not in the analysers, so the store can tell a stale analysis without importing
them."""

# Dimension names (TransformerLens spelling where one exists).
SNAPSHOT = "snapshot"
LAYER = "layer"
HEAD = "head"
PROBE = "probe"
QUERY = "query"
KEY = "key"
POSITION = "position"
WEIGHT = "weight"
D_MODEL = "d_model"
D_HEAD = "d_head"
COMPONENT = "component"
TRAIN_STEP = "train_step"  # per-step loss axis; "step" is the snapshot coordinate
RUN = "run"
OFFSET = "offset"
FIT = "fit"

WEIGHTS = ("q", "k", "v", "o")
FITS = ("plus", "minus")

# Recorded variables -> dims. Coordinates: step (snapshot), layer, head, weight, component,
# train_step.
RUN_VARIABLES = {
    "attention": (SNAPSHOT, LAYER, HEAD, PROBE, QUERY, KEY),
    "probe_tokens": (PROBE, POSITION),
    "grad_norm": (SNAPSHOT, LAYER, HEAD, WEIGHT),
    "grad_cosine": (SNAPSHOT, LAYER, HEAD, WEIGHT),
    "importance": (SNAPSHOT, LAYER, HEAD),
    "gate": (SNAPSHOT, LAYER, HEAD),
    "head_weights": (SNAPSHOT, LAYER, HEAD, WEIGHT, D_MODEL, D_HEAD),
    "loss": (TRAIN_STEP,),
    "eval_loss": (SNAPSHOT, COMPONENT),
    "chg": (SNAPSHOT, LAYER, HEAD, FIT),
    "chg_role": (SNAPSHOT, LAYER, HEAD),
}

# What each recorded variable holds, as attrs that `open_run` and `open_sweep` attach (plots label
# their axes from long_name and units, so a long_name stays short: xarray wraps it at 30 characters,
# and a default figure cut the first lines of a longer one off; the rest is in description. CF readers
# decode chg_role's codes); README's table has the full text. Attached when read, so runs recorded
# before these existed get them too.
STEP_ATTRS = {"long_name": "training step", "units": "steps"}
"""The ``step`` and ``train_step`` coordinates' attrs: a plot over ``snapshot`` reads snapshot numbers,
over ``step`` (``.plot(x="step")``) training steps, labelled so."""
CHG_ROLE_FLAGS = {"flag_values": [0, 1, 2, 3, -1],
                  "flag_meanings": "facilitating irrelevant interfering inconsistent unfitted"}
RUN_VARIABLE_ATTRS = {
    "attention": {"long_name": "post-softmax attention on the probe batch", "units": "1"},
    "probe_tokens": {"long_name": "probe batch token ids"},
    "grad_norm": {"long_name": "head gradient norm",
                  "description": "norm of the training-batch gradient of the head's W_Q, W_K, W_V, W_O slice"},
    "grad_cosine": {"long_name": "head gradient cosine to the last", "units": "1",
                    "description": "cosine between the head's gradient and the previous snapshot's"},
    # |dL/dg| alone: times the gate it is Michel et al.'s importance (the label said "times gate" first)
    "importance": {"long_name": "head importance |dloss/dgate|", "units": "nat",
                   "description": "mean over the batch's sequences of |dloss/dgate| of the head (where the run's "
                                  "importance_form attr is per_sequence; else of the batch's mean loss); times "
                                  "the gate, Michel et al.'s importance"},
    "gate": {"long_name": "head gate value", "units": "1"},
    "head_weights": {"long_name": "head weight slices",
                     "description": "the head's slices of W_Q, W_K, W_V, W_O (W_O transposed)"},
    "loss": {"long_name": "training loss", "units": "nat",
             "description": "training loss (next-token NLL of the step's batch)"},
    "eval_loss": {"long_name": "held-out loss per task component", "units": "nat"},
    "chg": {"long_name": "causal head gating gate", "units": "1",
            "description": "causal head gating gate (G+ at fit plus, G- at fit minus)"},
    "chg_role": {"long_name": "causal head gating role", **CHG_ROLE_FLAGS},
}

HEAD_WEIGHTS_AUTO_MAX_D_MODEL = 256
"""``record.head_weights = "auto"`` records head weight slices up to this d_model."""


def head_weights_recorded(mode: str, d_model: int) -> bool:
    """Whether a run records ``head_weights``, from its ``record.head_weights`` and ``model.d_model``."""
    return mode == "on" or (mode == "auto" and d_model <= HEAD_WEIGHTS_AUTO_MAX_D_MODEL)


def recorded_arrays(config) -> frozenset[str] | None:
    """The variables and coordinates a training run with this stored ``config`` attr (the nested
    dict of ``RunConfig.to_dict``) creates, the interventions' arrays aside; None where the
    config lacks what decides them.

    Zarr lists a group's arrays from the folders there: an array whose folder is gone is not
    listed at all, so checking the chunks of the arrays listed never names it (a run's lost
    ``grad_norm`` then dropped that feature from every run a predictor fitted, without a word).
    """
    model = config.get("model") if isinstance(config, dict) else None
    record = config.get("record") if isinstance(config, dict) else None
    if not isinstance(model, dict) or not isinstance(record, dict):
        return None
    mode, d_model, chg_every = record.get("head_weights"), model.get("d_model"), record.get("chg_every")
    if not isinstance(mode, str) or not isinstance(d_model, int) or not isinstance(chg_every, int):
        return None
    names = {"attention", "probe_tokens", "grad_norm", "grad_cosine", "importance", "gate", "loss", "eval_loss",
             "step", LAYER, HEAD, WEIGHT, COMPONENT, TRAIN_STEP}
    if head_weights_recorded(mode, d_model):
        names.add("head_weights")
    if chg_every:
        names |= {"chg", "chg_role", FIT}
    return frozenset(names)


RUN_STATUSES = ("running", "completed", "diverged", "failed", "interrupted")
FINISHED_STATUSES = ("completed", "diverged")
"""Statuses of a run whose training ended on its own: never retrained, analysed as final."""


def config_value(config: dict, key: str):
    """The value at dotted `key` of a run's stored ``config`` attr, at any depth
    (``intervene.templates.weight``), or None where the path is missing.

    Sweep axes are dotted keys; readers fall back to a run's config for an axis its sweep
    index entry lacks, and must follow the whole path, not its first and last parts.
    """
    node = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def require_dims(data, dims, what: str) -> None:
    """ValueError naming ``what``, the dims it lacks and the dims it has, unless ``data`` (a
    DataArray or anything with ``.dims``) has every dim in ``dims``.

    The analysers read dims by name; without this check a missing one failed deep inside
    xarray or dask ("chunks keys ('layer',) not found") with no word of which input lacked it.
    """
    have = tuple(getattr(data, "dims", ()))
    if not hasattr(data, "dims"):
        raise ValueError(f"{what} must be an xarray DataArray with dims {tuple(dims)}; got {type(data).__name__}")
    if hasattr(data, "data_vars"):  # a Dataset has dims too, and failed deep in xarray ("inconsistent chunks")
        raise ValueError(f"{what} must be an xarray DataArray with dims {tuple(dims)}, one variable of the "
                         f"Dataset given (its variables: {', '.join(map(str, data.data_vars))})")
    missing = [d for d in dims if d not in have]
    if missing:
        hint = " (a .sel or .isel with an int drops the dim it picks: select with a list to keep it)"
        raise ValueError(f"{what} needs dims {tuple(dims)}; {', '.join(map(repr, missing))} missing from its dims "
                         f"{have}" + hint)
