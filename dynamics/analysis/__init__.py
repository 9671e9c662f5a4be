"""Analysers: pure xarray -> xarray functions over recorded runs and sweeps.

Never imports torch or zarr: analysing a sweep needs no model code. Each function takes
named-dim DataArrays and passes leading dims (``run``, ``snapshot``) through, lazily.
"""

from dynamics.analysis import _code  # noqa: F401 - first: the code's hash before any analyser is imported
from dynamics.analysis.bifurcation import bifurcation_step, commitment_step, gini, winner_take_all
from dynamics.analysis.divergence import (
    divergence_from_init,
    js_distance,
    mean_within_layer_divergence,
    principal_angles,
    qk_cosine,
    within_layer_divergence,
)
from dynamics.analysis.pipeline import AnalysisOptions, analyse_run, summary_row
from dynamics.analysis.positional import VOITA_PEAK, peak_share
from dynamics.analysis.probe_resample import label_agreement, probe_range, resampled_bifurcation
from dynamics.analysis.redundancy import (
    attention_correlation,
    cluster_heads,
    cross_seed_consistency,
    linkage_matrix,
    redundancy_fraction,
)
from dynamics.analysis.roles import ROLES, RoleThresholds, assign_roles, probe_sensitive_heads, role_names, role_scores
from dynamics.analysis.slash import (
    best_offset,
    dominant_share,
    emergence_step,
    slash_dominant,
    slash_score,
    token_dominant,
    token_ratio,
    token_share,
)

__all__ = [
    "ROLES", "VOITA_PEAK", "AnalysisOptions", "RoleThresholds", "analyse_run", "assign_roles", "attention_correlation",
    "best_offset", "bifurcation_step", "cluster_heads", "commitment_step", "cross_seed_consistency",
    "divergence_from_init", "dominant_share", "emergence_step", "gini", "js_distance", "label_agreement", "linkage_matrix",
    "mean_within_layer_divergence", "peak_share", "principal_angles", "probe_range", "probe_sensitive_heads", "qk_cosine", "redundancy_fraction",
    "resampled_bifurcation", "role_names", "role_scores", "slash_dominant", "slash_score", "summary_row", "token_dominant", "token_ratio",
    "token_share", "winner_take_all", "within_layer_divergence",
]
