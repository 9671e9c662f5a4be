"""What the predictor is asked: targets, models, groupings, its options and its error, and a run."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import xarray as xr

from dynamics.analysis.chg import CHG_ROLES
from dynamics.analysis.pipeline import AnalysisOptions


@dataclass(frozen=True)
class TargetSpec:
    """What a target is and how a prediction of it is scored."""

    task: str
    """"binary", "multiclass" or "regression"."""
    metric: str
    """"auroc", "balanced_accuracy" or "spearman"."""
    chance: float | None
    """Metric of an uninformed predictor (None for balanced accuracy: it is the mean over test
    folds of 1 / the number of classes the fold holds, what a constant guess of one scores)."""
    description: str
    """One line for tables and the report."""


TARGETS: dict[str, TargetSpec] = {
    "slash": TargetSpec("binary", "auroc", 0.5, "slash-dominant at the final snapshot"),
    "role": TargetSpec("multiclass", "balanced_accuracy", None, "role label at the final snapshot"),
    "importance": TargetSpec("regression", "spearman", 0.0, "importance rank within the layer at the final snapshot"),
    "chg": TargetSpec("multiclass", "balanced_accuracy", None, "causal-head-gating class at the final snapshot"),
    "redundant": TargetSpec("binary", "auroc", 0.5, "shares its cluster with another head at the final snapshot"),
}
"""Target name -> what it is; see the module docstring."""

MODELS = ("chance", "layer", "init_linear", "init_boosting", "linear", "boosting")
"""Model names, in table order: the baselines first.

- ``chance``: a constant (the training-fold prior, or its majority class).
- ``layer``: the head's layer index alone: the training fold's rate in that layer (binary;
  Laplace-smoothed, (k + 1) / (n + 2)), its mean (importance), or its majority class
  (multiclass: ``chance`` within the layer); for a layer with no head in the training fold,
  the same over the whole fold.
- ``init_linear``, ``init_boosting``: the models below on features of the first snapshot
  (initialisation) only; they do not depend on the horizon.
- ``linear``: logistic regression (ridge regression for importance) on standardised features.
- ``boosting``: histogram gradient boosting on the raw features.

Both classifiers weight each class by the inverse of its frequency in the training fold
(``class_weight="balanced"``), so a rare role counts as much as a common one, as the
balanced-accuracy score does.
"""

GROUPINGS = ("seed", "run", "config")
"""What cross-validation holds out together: a whole seed, a run, or a whole config
(the swept values other than the seed)."""

UNITS = ("fraction", "step")
"""How horizons are given: a fraction of each run's length, or a training step."""

CHG_CLASSES = CHG_ROLES[:-1]
"""Names of the ``chg_role`` codes 0..3 (``dynamics.analysis.chg``); -1 means not fitted."""

SEED_AXIS = "train.seed"


MAX_NULL = 1000
"""Most permutations of the null check (each refits every model at every horizon)."""


class PredictError(ValueError):
    """Bad input for the predictor (unknown target, too few runs, a single group...): one line."""


DEFAULT_HORIZONS = (0.1,)
"""One horizon, a tenth of each run: the default under the default unit, "fraction"."""


@dataclass(frozen=True)
class PredictOptions:
    """Everything that decides one prediction table; stored in the result's attrs."""

    target: str = "slash"
    """One of `TARGETS`."""
    horizons: tuple[float, ...] = DEFAULT_HORIZONS
    """Horizons h: features see the snapshots with step <= h (see `unit`). Kept in increasing
    order, whatever order they are given in: they are the curve's x axis."""
    unit: str = "fraction"
    """"fraction": h in [0, 1] of each run's length (its final snapshot's step; h = 1 sees
    the final snapshot, which defines the target: a ceiling, not a prediction). "step": h is a
    training step, at most the shortest run's length."""
    group_by: str = "seed"
    """What cross-validation holds out together, one of `GROUPINGS`."""
    n_splits: int = 5
    """Folds of GroupKFold; fewer when there are fewer groups (then one group per fold)."""
    use_stored_analysis: bool = True
    """Read final-snapshot targets from ``analysis/<run_id>`` when it covers the run's final
    step and was computed with the thresholds of `analysis`; otherwise (or when False) they are
    computed from the final snapshot."""
    analysis: AnalysisOptions = field(default_factory=AnalysisOptions)
    """Thresholds of the analysers, for targets computed here and for early features."""
    min_heads: int = 10
    """Fewest labelled heads a table may have."""
    logistic_c: float = 1.0
    """Inverse l2 strength of the logistic regression."""
    ridge_alpha: float = 1.0
    """l2 strength of the ridge regression (importance target)."""
    boosting_iter: int = 100
    """Boosting iterations (trees per class); no early stopping, so results are reproducible."""
    boosting_min_leaf: int | None = None
    """Fewest training heads per leaf. None: min(20, max(3, n_train // 8)), so that the small
    tables of a modest sweep can still be split (scikit-learn's fixed 20 would leave a fold of
    40 heads with at most one split)."""
    random_state: int = 0
    """Seed of the boosting models, and of the null check's permutations."""
    null: int = 0
    """Null check: also run the curve this many times on targets permuted between runs with the
    same heads (each run's final roles given whole to another run: none keeps its own, and runs
    whose heads no other run labels are left out), and count how often the "how early"
    criterion names a readable horizon: its false-alarm rate on these runs, where there is
    nothing to read; and how often it says "legible at initialisation". Each permutation costs
    about one curve's fitting time. 0: off."""

    def __post_init__(self):
        if self.target not in TARGETS:
            raise PredictError(f"unknown target {self.target!r}; one of: {', '.join(TARGETS)}")
        if not isinstance(self.analysis, AnalysisOptions):  # None or a dict failed only once targets were read
            raise PredictError(f"analysis must be an AnalysisOptions, got {self.analysis!r}")
        if self.unit not in UNITS:
            raise PredictError(f"unknown horizon unit {self.unit!r}; one of: {', '.join(UNITS)}")
        if self.group_by not in GROUPINGS:
            raise PredictError(f"unknown grouping {self.group_by!r}; one of: {', '.join(GROUPINGS)}")
        if isinstance(self.horizons, (str, bytes)) or not isinstance(self.horizons, Iterable):
            # a bare 0.1 raised "'float' object is not iterable"; "0.1" read as horizons '0', '.', '1'
            raise PredictError(f"horizons must be a sequence of numbers, e.g. (0.1,) or [0, 0.1, 0.2]; "
                               f"got {self.horizons!r}")
        object.__setattr__(self, "horizons", tuple(self.horizons))
        if not self.horizons:
            raise PredictError("no horizons given")
        if self.unit == "step" and self.horizons == DEFAULT_HORIZONS:
            # the default is a fraction: "horizon step 0.1 is not a whole step" named a horizon nobody gave
            raise PredictError(f"unit 'step' needs its horizons given in steps (the default, {DEFAULT_HORIZONS[0]}, "
                               f"is a fraction of the run)")
        for h in self.horizons:
            if not isinstance(h, Real) or isinstance(h, bool):  # True was the h = 1 ceiling
                raise PredictError(f"horizon {h!r} is not a number")
            if not math.isfinite(h):  # 1e400 reads as inf: say what it became
                raise PredictError(f"horizon {h} is not a finite number")
            if self.unit == "fraction" and not 0.0 <= h <= 1.0:
                raise PredictError(f"horizon {h} out of range: a fraction of the run must lie in [0, 1]")
            if self.unit == "step" and h < 0:
                raise PredictError(f"horizon step {h} out of range: must be >= 0")
            if self.unit == "step" and h != int(h):
                raise PredictError(f"horizon step {h} is not a whole step (a fraction of the run: --unit fraction)")
        # As the table prints them (h={h:g}): 0.1 and 0.1000000001 were two columns both headed h=0.1
        shown = {f"{h + 0:g}" if self.unit == "fraction" else h for h in self.horizons}  # -0 + 0 is 0
        if len(shown) != len(self.horizons):
            printed = ", as printed to 6 significant digits" if self.unit == "fraction" else ""
            raise PredictError(f"horizons repeat{printed}: {list(self.horizons)}")
        # The report draws the curve through the horizons in stored order: "0.5,0,0.1" drew a zigzag.
        # `+ 0` turns -0.0 into 0.0, printed "h=-0" otherwise.
        object.__setattr__(self, "horizons", tuple(sorted(int(h) if isinstance(h, Integral) else float(h) + 0.0
                                                          for h in self.horizons)))  # numpy scalars as Python's
        for name in ("n_splits", "min_heads", "null", "boosting_iter", "random_state"):
            value = getattr(self, name)
            if not isinstance(value, Integral) or isinstance(value, bool):  # 2.5 failed inside sklearn
                raise PredictError(f"{name} must be an integer; got {value!r}")
        if self.n_splits < 2:
            raise PredictError(f"n_splits must be >= 2; got {self.n_splits}")
        if self.min_heads < 2:
            raise PredictError(f"min_heads must be >= 2; got {self.min_heads}")
        if not 0 <= self.null <= MAX_NULL:
            raise PredictError(f"null: permutations must be in [0, {MAX_NULL}]; got {self.null}")
        if self.boosting_iter < 1:
            raise PredictError(f"boosting_iter must be >= 1; got {self.boosting_iter}")
        leaf = self.boosting_min_leaf
        if leaf is not None and (not isinstance(leaf, Integral) or isinstance(leaf, bool)):
            raise PredictError(f"boosting_min_leaf must be an integer or None; got {leaf!r}")
        if leaf is not None and leaf < 1:
            raise PredictError(f"boosting_min_leaf must be >= 1; got {leaf}")
        # sklearn refuses these only inside the first fit, after every run's features are built
        for name, least, strict in (("logistic_c", 0.0, True), ("ridge_alpha", 0.0, False)):
            value = getattr(self, name)
            if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value) \
                    or (value <= least if strict else value < least):
                raise PredictError(f"{name} must be a finite number {'>' if strict else '>='} 0; got {value!r}")


@dataclass(frozen=True)
class Run:
    """One run as the predictor sees it: its recordings and what groups it."""

    run_id: str
    data: xr.Dataset
    """Recorded variables as from `dynamics.store.open_run` (lazy is fine)."""
    seed: Any = None
    """The run's seed (grouping "seed")."""
    config: str = ""
    """The run's swept values other than the seed, as one label (grouping "config"); with the
    settings that set it apart where runs of another base config share those values."""
    analysis: xr.Dataset | None = None
    """Stored analysis, used for final-snapshot targets and the run's caveats only (`load_store`
    reads just their variables, as one version: `dynamics.predict.targets.STORED_READS`)."""
    analysis_unreadable: str = ""
    """Why the stored analysis could not be opened (damaged), if so: the targets are then
    recomputed from the final snapshot and the curve names the run."""

    def group(self, group_by: str) -> str:
        """The cross-validation group label of this run."""
        if group_by == "run":
            return self.run_id
        if group_by == "seed":
            if self.seed is None:
                raise PredictError(f"run {self.run_id!r} records no seed; use grouping 'run'")
            return f"seed={self.seed}"
        return self.config


def check_arguments(fn: str, options: Any = None, kind: type | None = None, data: Any = None) -> None:
    """TypeError naming `fn`'s argument for what a notebook passes in place of another: options of
    another class (a dict, AnalysisOptions for PredictOptions), or a DataArray, a path or numpy in
    place of a run's Dataset; they failed deep inside ("'dict' object has no attribute 'roles'",
    "The truth value of an Array is ambiguous")."""
    if options is not None and kind is not None and not isinstance(options, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"{fn}: options must be {article} {kind.__name__}; got {type(options).__name__}")
    if data is not None and not isinstance(data, xr.Dataset):
        raise TypeError(f"{fn}: expected a run's Dataset (open_run(STORE, RUN_ID), or a sweep's .sel(run=...)); "
                        f"got {type(data).__name__}")
