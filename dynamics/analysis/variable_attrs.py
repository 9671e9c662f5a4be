"""The CF attributes of the variables `pipeline.analyse_run` returns.

Apart from the pipeline so that its steps read as steps: a plot's axis labels come from here.
"""

_JS = "sqrt(nat)"  # js_distance is the square root of a mean JS divergence in nats (bound sqrt(ln 2))
VARIABLE_ATTRS = {
    "role_score": ("role pattern score", "1",
        "score of each role's pattern (see RoleThresholds)"),
    "commitment_step": ("role commitment step", "steps",
        "step from which the head's role never changes again"),
    "best_slash": ("largest slash score", "1",
        "largest slash score over the offsets slash_offsets (1..T // 2, less slash_offsets_unscored)"),
    "best_offset": ("offset of the largest slash score", "positions",
        "offset of best_slash (the offsets slash_offsets; the slash role's are slash_offset's)"),
    "slash_offset": ("offset of the slash role's score", "positions",
        "offset of the slash role's score (from role_thresholds' slash_min_offset, 2: offset 1 is previous_token's)"),
    "slash_dominant": ("slash-dominant head (1, else 0)", "1",
        "slash-dominant head: 1, else 0 (NaN where undefined)"),
    "previous_token_peak": ("share of rows peaking one back", "1",
        "share of rows whose largest weight is one step back (Voita et al.'s positional head: >= 0.9)"),
    "slash_emergence_step": ("slash-dominance emergence step", "steps",
        "first step from which the head stays slash-dominant (NaN: not at the end)"),
    "slash_dominant_share": ("slash-dominant share of the layer", "1",
        "share of the layer's heads that are slash-dominant"),
    "token_ratio": ("token attention against uniform", "1",
        "attention on the token relative to uniform causal attention"),
    "token_dominant": ("token-dominant head (1, else 0)", "1",
        "token-dominant head: 1, else 0 (NaN where undefined)"),
    "token_emergence_step": ("token-dominance emergence step", "steps",
        "first step from which the head stays token-dominant (NaN: not at the end)"),
    "token_dominant_share": ("token-dominant share of the layer", "1",
        "share of the layer's heads that are token-dominant"),
    "js_distance": ("JS distance between two heads", _JS,
        "Jensen-Shannon distance between two heads' attention"),
    "within_layer_divergence": ("within-layer divergence", _JS,
        "mean Jensen-Shannon distance between the layer's heads"),
    "mean_divergence": ("mean within-layer divergence", _JS,
        "within-layer divergence, mean over layers"),
    "divergence_from_init": ("JS distance from the first snapshot", _JS,
        "Jensen-Shannon distance of the head's attention from its first snapshot's"),
    "bifurcation_step": ("bifurcation step", "steps",
        "step the mean within-layer divergence leaves its initial band for good, or its first value where it "
        "does so within the band's baseline (NaN: never, or undefined where no layer has two heads)"),
    "layer_bifurcation_step": ("layer bifurcation step", "steps",
        "step the layer's divergence leaves its initial band for good, or its first value where it does so "
        "within the band's baseline (NaN: never, or undefined in a layer of one head)"),
    "bifurcation_resampled": ("bifurcation step, probes resampled", "steps",
        "bifurcation_step of the divergence rebuilt on a bootstrap resample of the probe sequences "
        "(dynamics.analysis.probe_resample; NaN: never, or undefined where no layer has two heads)"),
    "role_resampled": ("head role, probes resampled", None,
        "the last snapshot's role (int8 codes into roles) on each bootstrap resample of the probe sequences "
        "that bifurcation_resampled takes (dynamics.analysis.roles.role_scores with probe weights)"),
    "winner_take_all": ("Gini of the layer's importances", "1",
        "Gini coefficient of the layer's head importances"),
    "cluster": ("redundancy cluster", None,
        "redundancy cluster of the head among all heads of the model (heads of other layers may share it)"),
    "redundancy_fraction": ("share of heads in a shared cluster", "1",
        "share of heads that share their cluster with another head"),
    "attention_correlation": ("attention correlation of two heads", "1",
        "Pearson correlation of two heads' causal attention, last snapshot"),
    "qk_cosine": ("cosine of two heads' QK circuits", "1",
        "cosine between two heads' QK circuits W_Q W_K^T"),
    "q_subspace_cos": ("W_Q subspace cosine of two heads", "1",
        "mean cosine of the principal angles between two heads' W_Q subspaces"),
}
"""``long_name``, ``units`` (None: none, a label) and ``description`` of the variables :func:`analyse_run`
returns (the others keep the ones their analyser gives): a plot's axis labels, and two shares told apart. A
long_name stays short, as xarray wraps a label at 30 characters and a default figure cut the first lines
of a longer one off; what qualifies it (where it is NaN, whose definition) is in the description."""
