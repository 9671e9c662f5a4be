"""Predict each head's final specialisation from what it recorded early in training.

The question: how early is a head's fate decided? For every head (run, layer, head) a
target is read from the run's FINAL snapshot, features are computed from the snapshots up
to a horizon step h only, and grouped cross-validation scores how well the features predict
the target, next to baselines that know only the head's layer or only its initialisation.
Sweeping h gives the "how early can we know" curve, and `dynamics.predict.readable` its answer:
the first horizon where an early-training model's gain over the best init-only baseline in
each test fold (its score minus the best of theirs there) passes a one-sided paired t-test,
corrected for the training rows the folds share (Nadeau and Bengio 2003).

Targets (``TARGETS``), all at the final snapshot:

- ``slash``: slash-dominant or not (Cheng et al. 2026, kappa of `AnalysisOptions`), AUROC;
  the offset of each head's best slash score is kept next to it.
- ``role``: the role label of `dynamics.analysis.roles.assign_roles`, balanced accuracy.
- ``importance``: rank of the head's importance within its layer, scaled to [0, 1]
  (Michel et al. 2019's, E_x |dL(x)/dxi| over the final step's batch: the gate times the
  recorded importance, `dynamics.analysis.bifurcation.head_importance`; in runs begun before
  ``importance_form``, |dL/dg| of the batch's mean loss, mostly noise by the end of training),
  Spearman correlation.
- ``chg``: the causal-head-gating class recorded in ``chg_role`` (Nam et al. 2025), where
  fitted (code >= 0), balanced accuracy.
- ``redundant``: the head shares its JS-distance cluster with another head
  (`dynamics.analysis.redundancy.cluster_heads`), AUROC.

Leakage discipline (the evaluation must be beyond reproach)
------------------------------------------------------------
1. Features for horizon h come from `head_features` applied to `early_snapshots` (run, h):
   the run is cut to the snapshots with ``step <= h`` (and losses with ``train_step <= h``)
   *before* anything is computed. Analysis-derived features (role scores, slash scores, JS
   distances) are recomputed from that cut; the stored analysis, computed on the full run,
   is read only for targets, and only at the final snapshot.
2. Cross-validation is grouped, so a run's heads are never split between train and test.
   By default whole seeds are held out: runs of different configs with one seed can share
   their initial weights and data order, so a held-out run's "twin" in training would make
   the init features look predictive for the wrong reason.
3. Imputation and scaling are fitted inside each training fold (scikit-learn pipelines).
4. Baselines (chance, layer-only prior, step-0 features) use the very same folds.
5. Nothing is tuned: every model has the fixed settings of `PredictOptions`, so no fold
   is ever used to choose among models or hyperparameters.

Features (per head; ``g`` is a weight in q, k, v, o; "rel" is relative to the mean over the
head's layer; "slope" is the least-squares slope against log(1 + step) over the snapshots
seen, since snapshots are geometric early on): log10 grad_norm of g at init, at h, mean,
slope, rel at init and at h; grad_cosine of g (gradient-direction agreement between
consecutive snapshots) mean and at h; log10 importance likewise, plus its rank and l2 share
within the layer; every role score (entropy is ``diffuse``) at init, at h and its change;
best slash score at init and at h, and its offset at h; mean JS distance to the other heads of the
layer and to the nearest other head at init and at h, and divergence from init; log10
weight norms at init and their change when head weights were recorded; layer index and
relative depth. Only features every run can provide are used.

Sources
-------
- Michel, Levy, Neubig 2019, "Are Sixteen Heads Really Better than One?" (importance).
- Cheng et al. 2026, arXiv 2601.08297 (slash scores, (kappa, delta)-slash-dominance).
- Clark, Khandelwal, Levy, Manning 2019 (JS distance between heads).
- Nam et al. 2025, arXiv 2505.13737 (causal head gating classes).
- Mann & Whitney 1947 (AUROC as a rank statistic; its null variance sets the tests' bands).
- Nadeau & Bengio 2003, "Inference for the Generalization Error", Machine Learning 52 (the
  corrected resampled t-test of the "how early" criterion; Bouckaert & Frank 2004 on its use).

This module never imports torch: it reads the store and the analysers only.
"""

# `name as name`: module-level names kept reachable as predict.<name>, outside __all__.
from dynamics.predict.curve import (
    format_curve,
    predict_runs,
    predict_store,
)
from dynamics.predict.features import early_snapshots, feature_table, head_features, horizon_steps
from dynamics.predict.load import (
    check_runs,
    derived_name,
    load_runs,
    load_store,
    replaced_note,
    save_curve,
    write_curve,
)
from dynamics.predict.models import cross_validate, group_splits, score
from dynamics.predict.null import same_head_blocks
from dynamics.predict.options import (
    CHG_CLASSES,
    GROUPINGS,
    MODELS,
    TARGETS,
    UNITS,
    PredictError,
    PredictOptions,
    Run,
    TargetSpec,
)
from dynamics.predict.options import SEED_AXIS as SEED_AXIS
from dynamics.predict.readable import BASELINES, EARLY, Readable, judge, readable_of, score_band
from dynamics.predict.targets import final_targets, target_table

__all__ = [
    "BASELINES",
    "CHG_CLASSES",
    "EARLY",
    "GROUPINGS",
    "MODELS",
    "TARGETS",
    "UNITS",
    "PredictError",
    "PredictOptions",
    "Readable",
    "Run",
    "TargetSpec",
    "check_runs",
    "cross_validate",
    "derived_name",
    "early_snapshots",
    "feature_table",
    "final_targets",
    "format_curve",
    "group_splits",
    "head_features",
    "horizon_steps",
    "judge",
    "load_runs",
    "load_store",
    "predict_runs",
    "predict_store",
    "readable_of",
    "replaced_note",
    "same_head_blocks",
    "save_curve",
    "score",
    "score_band",
    "target_table",
    "write_curve",
]
