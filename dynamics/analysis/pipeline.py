"""All analysers over one run: the dataset `dynamics analyse` writes next to the recordings.

Each piece is a pure function of the run's recorded arrays (see the modules for the
formulas and citations); this module only wires them together and names the results, so
the report and the predictor read one schema. Nothing here computes: the result is lazy
until the caller writes or loads it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import xarray as xr

from dynamics.analysis.bifurcation import (
    STEP,
    bifurcation_step,
    commitment_step,
    head_importance,
    last_recorded,
    recorded,
    winner_take_all,
)
from dynamics.analysis.divergence import (
    js_distance,
    mean_within_layer_divergence,
    principal_angles,
    qk_cosine,
    within_layer_divergence,
)
from dynamics.analysis.positional import missed_previous_token, peak_share
from dynamics.analysis.probe_resample import (
    N_RESAMPLES,
    RESAMPLE,
    SEED,
    bifurcation_of_resamples,
    probe_counts,
    probe_range,
    resampled_layer_divergence,
)
from dynamics.analysis.redundancy import attention_correlation, cluster_heads, redundancy_fraction
from dynamics.analysis.role_thresholds import ROLES, RoleThresholds, check_kinds
from dynamics.analysis.roles import assign_roles, probe_sensitive_heads, role_scores
from dynamics.analysis.slash import (
    DEFAULT_KAPPA,
    best_offset,
    confounded_offsets,
    dominant_share,
    emergence_step,
    slash_dominant,
    slash_score,
    token_dominant,
    token_ratio,
    token_share,
)
from dynamics.analysis.variable_attrs import VARIABLE_ATTRS
from dynamics.schema import ANALYSIS_VERSION as ANALYSIS_VERSION  # re-exported: its home before it moved to schema
from dynamics.schema import BASELINE_SNAPSHOTS, HEAD, KEY, LAYER, PROBE, QUERY, RUN, SNAPSHOT, require_dims

SCORE_ROLES = ROLES[:-1]  # every role but "none" has a score
READS = ("attention", "probe_tokens", "importance", "gate", "head_weights")
"""The run variables `analyse_run` reads (``gate`` and ``head_weights`` when recorded), besides coordinates:
a caller loading a run for it need not read the rest (gradients, losses)."""


def is_current(analysis: xr.Dataset) -> bool:
    """Whether a stored analysis was computed by these analysers (its ``analysis_version``)."""
    return analysis.attrs.get("analysis_version") == ANALYSIS_VERSION


@dataclass(frozen=True)
class AnalysisOptions:
    """Thresholds of every analyser, stored in the analysis attrs for provenance."""

    roles: RoleThresholds = field(default_factory=RoleThresholds)
    """Role score thresholds and the settings the scores need (token id, band width...)."""
    kappa: float = DEFAULT_KAPPA
    """Slash-dominance threshold on slash_score (Cheng et al. 2026)."""
    slash_min_offset: int = 1
    """Smallest offset that counts for slash-dominance emergence (0 would count 'self' heads)."""
    max_offset: int = 16
    """Offsets stored in slash_score: 0..max(max_offset, the slash window), within T - 1. It does
    not narrow the slash window (`slash_window`), so a head the slash role finds at a long
    offset is scored for slash-dominance too."""
    cluster_threshold: float = 0.1
    """JS-distance cut of the redundancy dendrogram (see redundancy.cluster_heads)."""
    token_run_length: int = 3
    """Consecutive probe samples a token-dominant head must hold >= ``roles.token`` (the post's
    50%) of its attention on the token: one share threshold for the token role and for
    token dominance."""
    baseline_snapshots: int = BASELINE_SNAPSHOTS
    """Snapshots that define the initial noise band of the divergence curve."""

    def __post_init__(self):
        check_kinds(self, ints=("slash_min_offset", "max_offset", "token_run_length", "baseline_snapshots"),
                    nested={"roles": RoleThresholds})
        if not 0.0 < self.kappa <= 1.0:
            raise ValueError(f"AnalysisOptions.kappa must be in (0, 1]; got {self.kappa!r}")
        if self.slash_min_offset < 0:
            raise ValueError(f"AnalysisOptions.slash_min_offset must be >= 0; got {self.slash_min_offset!r}")
        window = self.roles.slash_max_offset
        if window is not None and window < self.slash_min_offset:
            # analyse_run raised "no offsets in [1, 0]" on the first run instead
            raise ValueError(f"AnalysisOptions: roles.slash_max_offset {window} leaves slash-dominance no offsets "
                             f"(it starts at slash_min_offset {self.slash_min_offset})")
        for name in ("max_offset", "token_run_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"AnalysisOptions.{name} must be >= 1; got {getattr(self, name)!r}")
        if self.baseline_snapshots < 2:  # a noise band needs a spread: analyse_run failed on the first run
            raise ValueError(f"AnalysisOptions.baseline_snapshots must be >= 2; got {self.baseline_snapshots!r}")
        if not self.cluster_threshold > 0:
            raise ValueError(f"AnalysisOptions.cluster_threshold must be > 0; got {self.cluster_threshold!r}")

    def slash_window(self, n_query: int) -> int:
        """Largest offset that counts for slash-dominance over `n_query` positions.

        The slash role's window (T // 2 unless ``roles.slash_max_offset``), within T - 1: past
        T // 2 a score rests on few rows, and slash_score(T - 1) = A[T-1, 0] is 1 for any sink
        head. Every slash-dominance reader uses this one window, and it is the role's, so a head
        labelled "slash" at offset delta is scored for (kappa, delta)-dominance at that delta.
        """
        role_window = n_query // 2 if self.roles.slash_max_offset is None else self.roles.slash_max_offset
        return min(n_query - 1, role_window)


def analyse_run(ds: xr.Dataset, options: AnalysisOptions | None = None) -> xr.Dataset:
    """Every analyser over one recorded run (or a sweep with a leading ``run`` dim).

    Parameters
    ----------
    ds : Dataset
        A run as returned by ``dynamics.open_run``: ``attention`` (snapshot, layer, head,
        probe, query, key), ``probe_tokens`` (probe, position), ``importance``, optionally
        ``head_weights``, with the ``step`` coordinate on snapshot. A sweep from
        ``open_sweep`` may pad heads and snapshots, but not context or probes: runs that
        differ in those are refused (ValueError) and must be analysed one at a time.
    options : AnalysisOptions, optional

    Returns
    -------
    Dataset (lazy) with, per snapshot, layer and head unless stated:
    ``role_score`` (+ role_name), ``slash_offset`` (the offset the slash role score was read
    at), ``role`` (int8 codes into ROLES), ``slash_score`` (+ offset), ``previous_token_peak``
    (Voita et al.'s rule: the share of rows peaking one step back), ``best_offset``,
    ``best_slash``, ``slash_dominant``, ``token_share``, ``token_ratio`` (the
    share's ratio to uniform causal attention; both are means over the probes that hold the
    token), ``token_dominant``,
    ``commitment_step`` / ``slash_emergence_step`` / ``token_emergence_step`` (layer, head),
    ``slash_dominant_share`` / ``token_dominant_share`` / ``winner_take_all``
    (snapshot, layer), ``js_distance`` (snapshot, layer, head, layer_b, head_b),
    ``within_layer_divergence`` (snapshot, layer), ``mean_divergence`` (snapshot),
    ``divergence_from_init``, ``bifurcation_step`` (scalar; of ``mean_divergence``),
    ``layer_bifurcation_step`` (layer; of ``within_layer_divergence``), with two or more
    probes ``bifurcation_resampled`` (resample; ``bifurcation_step`` on bootstrap resamples of
    the probe sequences, `probe_resample`) and ``role_resampled`` (resample, layer, head; the
    last snapshot's ``role`` on those resamples), ``cluster``,
    ``redundancy_fraction`` (snapshot), ``attention_correlation`` (last snapshot), and when
    head weights were recorded ``qk_cosine`` and ``q_subspace_cos`` (snapshot, layer, head, head_b).
    ``slash_dominant`` and ``token_dominant`` are float 1 / 0, NaN where undefined (no offset
    scored; fewer probes holding the token than ``token_run_length``), and the shares leave
    such heads out (NaN where no head's flag is defined).
    On data from ``open_sweep`` (a ``run`` coordinate, also after ``.sel(run=...)``), ``role``
    is float, and these flags too are NaN, where a run has no such head or
    snapshot (the sweep's padding), so that
    ``result.role.isel(snapshot=-1)`` does not read a shorter run's padding as "none";
    `role_names` gives "" there.

    Raises
    ------
    TypeError
        ``ds`` not a Dataset, or ``options`` not an AnalysisOptions.
    ValueError
        A variable or dim the analysers read is missing; runs whose ``probe_tokens`` are
        NaN-padded (they differ in context or probe count); fewer than ``options.baseline_snapshots + 1`` snapshots; or a run whose last snapshot
        was never written (running, interrupted, failed or diverged: what training never
        reached reads as NaN), naming the selection of what it recorded.

    A snapshot in the middle whose chunk file was lost also reads as NaN (zarr's fill value), and
    is analysed as what it reads: its heads "none", inside the bifurcation's band. This function
    does not look for lost chunks; ``dynamics.check_recorded(STORE, RUN_ID)`` names them, and
    ``dynamics analyse`` calls it before it analyses a run.

    Example
    -------
    >>> result = analyse_run(dynamics.open_run("runs/induction.zarr"))  # doctest: +SKIP
    >>> result.role.isel(snapshot=-1).values  # doctest: +SKIP
    """
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"analyse_run takes a run's Dataset (dynamics.open_run or open_sweep), not a "
                        f"{type(ds).__name__}: pass the dataset, not one of its variables")
    if options is not None and not isinstance(options, AnalysisOptions):
        raise TypeError(f"options must be an AnalysisOptions, e.g. AnalysisOptions(cluster_threshold=0.2); "
                        f"got {type(options).__name__}")
    missing = [v for v in READS[:3] if v not in ds]
    if missing:
        raise ValueError(f"analyse_run needs the run's variables attention, probe_tokens and importance; "
                         f"{', '.join(missing)} missing from this dataset")
    opt = options or AnalysisOptions()
    attn = ds["attention"]
    require_dims(attn, (SNAPSHOT, LAYER, HEAD, PROBE, QUERY, KEY), "analyse_run: attention")
    tokens = ds["probe_tokens"]
    if tokens.dtype.kind == "f":
        # open_sweep pads ragged dims with NaN, so int token ids turn float when runs differ in
        # context or probe count: every score sums over probes, queries and keys with NaN kept,
        # so the shorter runs would come out all NaN, labelled "none", without a word. Float ids
        # without NaN come from a selection (sweep.where(..., drop=True) casts ints to float).
        if bool(tokens.isnull().any()):
            raise ValueError("these runs differ in context or n_probe (their probe_tokens are NaN-padded); "
                             "analyse them one run at a time, as `dynamics analyse` does")
        tokens = tokens.astype(np.int64)
    _refuse_unwritten(ds)
    need = opt.baseline_snapshots + 1
    have, short = _fewest_recorded(ds)
    if have < need:  # bifurcation_step said only "n_baseline=3 must be ... < the 1 snapshots"
        # A sweep's shorter run is padded to the longest one's snapshots: counted by the padding,
        # it passed, and its bifurcation came out NaN, which reads as "never left its band".
        raise ValueError(f"{short}{have} snapshot(s) given; the analysis needs >= {need} "
                         f"(options.baseline_snapshots + 1: the divergence curve's noise band and one more)")
    T = attn.sizes["query"]
    # Gathered, then made one Dataset: each `out[name] = ...` merged and aligned the growing
    # dataset again, about a tenth of this function's time on the demo's runs.
    parts: dict[str, xr.DataArray] = {}

    window = opt.slash_window(T)
    max_stored = max(min(opt.max_offset, T - 1), window)
    stage = _attention_stage_by_blocks(attn, tokens, opt, max_offset=max_stored)
    scores = xr.Dataset({name.removeprefix("score_"): v for name, v in stage.data_vars.items() if name.startswith("score_")},
                        attrs=stage.attrs)
    parts["role_score"] = scores[list(SCORE_ROLES)].to_dataarray("role_name")
    parts["slash_offset"] = scores["slash_offset"]
    present = stage["present"]
    codes = assign_roles(scores, opt.roles)
    # A sweep's padding (a head or snapshot its run does not have) would read as the int code
    # "none", and flags as False: a shorter run's heads all "none" at snapshot=-1. Masked, they
    # are NaN (float codes), as open_sweep pads everything else. Data from open_sweep carries a
    # run coordinate, also when one run is picked with .sel(run=...), which keeps the padded
    # heads; open_run's has none and no padding, so its codes stay int8.
    def unpadded(x: xr.DataArray) -> xr.DataArray:
        return x.where(present) if RUN in ds.coords else x

    parts["role"] = unpadded(codes)
    parts["commitment_step"] = commitment_step(codes.where(present))
    if attn.sizes[PROBE] > 1:
        # How far each final label rests on the probe sample: labelled again on the resamples
        # the bifurcation step's range takes (session 67 found 6% of the quickstart's heads
        # labelled otherwise on 512 probes than on 4)
        again = role_scores(last_recorded(attn), tokens, opt.roles, weights=probe_counts(attn.sizes[PROBE]))
        resampled = assign_roles(again, opt.roles).transpose(RESAMPLE, ...)
        parts["role_resampled"] = resampled.where(last_recorded(present)) if RUN in ds.coords else resampled

    slash = stage["slash"]
    parts["slash_score"] = slash
    # Voita et al.'s rule for the positional head, which the previous_token role (a mean weight of
    # 0.5 one step back) does not ask: heads peaking there in every row with less read local or none
    parts["previous_token_peak"] = stage["peak"]
    offset, best, dominant = slash_dominance(slash, opt, T)
    parts["best_offset"], parts["best_slash"] = offset, best
    parts["slash_dominant"] = unpadded(dominant)
    parts["slash_emergence_step"] = emergence_step(dominant)
    parts["slash_dominant_share"] = dominant_share(dominant, present=present)

    share = stage["share"]
    parts["token_share"] = share.mean("probe", skipna=True)
    parts["token_ratio"] = stage["ratio"].mean("probe", skipna=True)
    tdom = token_dominant(share, threshold=opt.roles.token, run_length=opt.token_run_length)
    parts["token_dominant"] = unpadded(tdom)
    parts["token_emergence_step"] = emergence_step(tdom)
    parts["token_dominant_share"] = dominant_share(tdom, present=present)

    jsd = stage["jsd"]
    parts["js_distance"] = jsd
    parts["within_layer_divergence"] = within_layer_divergence(jsd)
    curve = mean_within_layer_divergence(jsd)
    parts["mean_divergence"] = curve
    parts["divergence_from_init"] = stage["from_init"]
    parts["bifurcation_step"] = bifurcation_step(curve, n_baseline=opt.baseline_snapshots)
    # Per layer too: layers whose heads move apart while another's move together can leave the
    # mean in its band (a run with four induction heads read "never"; its layers left theirs at
    # steps 32 and 100)
    parts["layer_bifurcation_step"] = bifurcation_step(parts["within_layer_divergence"], n_baseline=opt.baseline_snapshots)
    # How far the step would move on another sample of probes: its band is set on these same
    # probes, so it holds none of their noise (4 probes dated a run 250 where 8 dated it 100)
    if attn.sizes[PROBE] > 1:
        parts["bifurcation_resampled"] = bifurcation_of_resamples(stage["layers_resampled"], n_baseline=opt.baseline_snapshots)
    # Michel et al.'s importance: the recorded |dL/dg| times g (the same where g = 1)
    importance = head_importance(ds["importance"], ds["gate"] if "gate" in ds else None)
    parts["winner_take_all"] = winner_take_all(_in_blocks(importance))

    clusters = cluster_heads(jsd, threshold=opt.cluster_threshold)
    parts["cluster"] = clusters
    parts["redundancy_fraction"] = redundancy_fraction(clusters)
    parts["attention_correlation"] = attention_correlation(last_recorded(attn))  # each run's own last

    if "head_weights" in ds:
        weights = _in_blocks(ds["head_weights"])
        parts["qk_cosine"] = qk_cosine(weights)  # each run on its own width (open_sweep pads narrower ones)
        parts["q_subspace_cos"] = principal_angles(weights, weight="q")

    out = xr.Dataset(parts, coords={"step": ds["step"]})
    for name, (long_name, units, description) in VARIABLE_ATTRS.items():
        if name in out:
            out[name].attrs.update(long_name=long_name, description=description,
                                   **({} if units is None else {"units": units}))
    out.attrs.update(
        analysis_version=ANALYSIS_VERSION,
        roles=list(ROLES),
        kappa=opt.kappa,
        slash_offsets=[opt.slash_min_offset, int(window)],
        slash_offsets_unscored=uninformative_offsets(T, opt),
        cluster_threshold=opt.cluster_threshold,
        token_id=opt.roles.token_id,
        token_threshold=opt.roles.token,
        role_thresholds=asdict(opt.roles),  # predict reads stored roles only under the same ones
        token_run_length=opt.token_run_length,
        baseline_snapshots=opt.baseline_snapshots,
        probe_resamples=N_RESAMPLES if "bifurcation_resampled" in out else 0,
        probe_resample_seed=SEED,
    )
    return out


def _fewest_recorded(ds: xr.Dataset) -> tuple[int, str]:
    """The fewest snapshots any run of `ds` recorded (padding, NaN steps, not counted), and
    ``"run <id>: "`` naming that run when `ds` holds several, else ``""``."""
    n = ds.sizes.get(SNAPSHOT, 0)
    if n == 0 or STEP not in ds.coords or SNAPSHOT not in ds[STEP].dims:
        return n, ""
    counts = recorded(ds[STEP]).sum(SNAPSHOT).compute()  # step is small: (snapshot,) or (run, snapshot)
    fewest = int(counts.min())
    if RUN not in counts.dims:
        return fewest, ""
    return fewest, f"run {ds[RUN].values[int(np.argmin(counts.values))]}: "


def _refuse_unwritten(ds: xr.Dataset) -> None:
    """ValueError when a run's last snapshot was never written (the run is unfinished or diverged).

    Arrays are created at full size, so what training never reached reads as NaN: analysed, those
    snapshots made every head's final role "none" and its commitment step NaN, without a word
    (``dynamics analyse`` skips such runs and cuts a diverged one to what it recorded). Unwritten
    snapshots are the trailing ones, so only each run's last snapshot with a step is read (one
    chunk); a sweep's padding past a shorter run's end has no step and is not looked at.
    """
    step = ds["step"]
    probe = ds["attention"].isel(probe=0, query=0, key=0)  # key 0 is visible to every query
    last = step.notnull().cumsum(SNAPSHOT).argmax(SNAPSHOT).compute()  # last snapshot with a step, per run
    unwritten = probe.isel({SNAPSHOT: last}).isnull().all([LAYER, HEAD]).compute()
    if not unwritten.any():
        return
    first = {d: int(i) for d, i in zip(unwritten.dims, np.argwhere(unwritten.values)[0], strict=True)}
    at = float(step.isel({SNAPSHOT: last}).broadcast_like(unwritten).isel(first).values)
    if "run" in first:
        run = str(ds["run"].values[first["run"]])
        status = ds.attrs.get("runs", {}).get(run, {}).get("status", "?")
        raise ValueError(f"run {run} ({status}): its snapshot at step {at:g} was never written (NaN); analyse "
                         f"finished runs, e.g. sweep.sel(run=sweep.status == 'completed'), and a diverged or "
                         f"unfinished one alone, cut to what it recorded")
    status = ds.attrs.get("status", "?")
    if status == "diverged" and "diverged_step" in ds.attrs:
        fix = (f"cut it as `dynamics analyse` does: dynamics.analyse.recorded_before_divergence(ds, "
               f"{ds.attrs['diverged_step']})")
    else:
        written = int(probe.notnull().any([LAYER, HEAD]).sum())
        fix = f"analyse what it recorded: ds.isel(snapshot=slice(0, {written}))"
    raise ValueError(f"run {ds.attrs.get('run_id', '?')} ({status}): its snapshot at step {at:g} was never written "
                     f"(NaN); {fix}")


def uninformative_offsets(n_query: int, opt: AnalysisOptions) -> list[int]:
    """Offsets of the slash-dominance window at which no pattern, or a sink, already reaches kappa
    (`dynamics.analysis.slash.confounded_offsets`): at kappa = 0.5 every uniform head was
    slash-dominant at T = 2, and every sink head at T = 3 and 4. The slash role leaves out the
    same offsets of the same window (`roles.role_scores`), so only contexts of 4 or less lose
    offsets at the defaults.
    """
    return confounded_offsets(n_query, range(opt.slash_min_offset, opt.slash_window(n_query) + 1), opt.kappa)


def slash_dominance(slash: xr.DataArray, opt: AnalysisOptions, n_query: int):
    """Best offset, its score and (kappa, delta)-slash-dominance over the window of `opt`.

    The window is ``opt.slash_min_offset .. opt.slash_window(n_query)`` less the
    `uninformative_offsets`, whose scores are left out (no best offset, and an undefined flag,
    where none is left). `analyse_run` and the predictor's targets both read it here.

    Returns
    -------
    offset, score, dominant : DataArray
        ``(..., snapshot, layer, head)``: float offset (NaN where no offset is scored), its
        slash score, and the flag (1 / 0, NaN where no offset is scored).
    """
    window = opt.slash_window(n_query)
    skipped = uninformative_offsets(n_query, opt)
    scored = slash.where(~slash["offset"].isin(skipped)) if skipped else slash
    offset, best = best_offset(scored, min_offset=opt.slash_min_offset, max_offset=window)
    dominant = slash_dominant(scored, kappa=opt.kappa, min_offset=opt.slash_min_offset, max_offset=window)
    return offset, best, dominant


def summary_row(result: xr.Dataset) -> dict:
    """One line of numbers per run for the `dynamics analyse` table (computes small arrays).

    ``bifurcation_step`` is the step (int), None when the divergence curve never leaves its
    noise band, or "undefined" when there is no curve at all (no layer has two heads to
    compare), which is not the same as never bifurcating. ``final_divergence`` is then
    "undefined" too: NaN there means no pair of heads, not a distance. ``redundancy`` is
    "undefined" when the model has fewer than two heads (no pair to be redundant), when
    ``redundant_heads`` is None (else redundancy x ``heads``, the heads in a cluster of two or
    more), and
    ``slash_dominant`` (a count of heads) when no head has a slash offset scored.
    ``layer_bifurcation_steps`` is ``bifurcation_step`` per layer (a list, in layer order), or
    None for an analysis stored before it was computed. ``bifurcation_probe_range``: the low and
    high `probe_range` of ``bifurcation_resampled`` (each a step, or None: never), or None where
    it was not computed (one probe, or an analysis stored before it). ``token_unseen`` is the token id the token
    roles look for where no probe sequence holds it, else None. ``peak_not_previous_token``: heads
    meeting Voita et al.'s rule (``previous_token_peak`` >= 0.9) at the last snapshot but not
    labelled previous_token (None for an analysis stored without ``previous_token_peak``).
    ``roles_at_start``: the specific roles' head counts at the first snapshot, at step
    ``start_step``. ``probe_sensitive_roles``: `roles.probe_sensitive_heads` of the last
    labels, or None where ``role_resampled`` was not computed.
    """
    if RUN in result.dims:  # a sweep's analysis: every number below would be an array
        raise ValueError("summary_row takes one run's analysis; select one with .sel(run=...) or .isel(run=...)")
    from dynamics.analysis.roles import role_names

    last = last_recorded(result)  # a run picked from a sweep ends before the sweep's padding
    labels = role_names(last["role"].values).ravel()
    counts = {r: int((labels == r).sum()) for r in ROLES if (labels == r).any()}
    no_pairs = not bool(result["mean_divergence"].notnull().any())
    redundancy = float(last["redundancy_fraction"].values)
    n_heads = int((last["cluster"] >= 0).sum())  # the fraction's denominator: a sweep's padded heads are -1
    flags = np.asarray(last["slash_dominant"].values, dtype=np.float64)
    return {
        "bifurcation_step": _step_or_why(result["bifurcation_step"], result["mean_divergence"]),
        "layer_bifurcation_steps": None if "layer_bifurcation_step" not in result else [
            _step_or_why(step, curve) for step, curve in zip(result["layer_bifurcation_step"].transpose(LAYER),
                                                             result["within_layer_divergence"].transpose(LAYER, ...),
                                                             strict=True)],
        "bifurcation_probe_range": None if no_pairs or "bifurcation_resampled" not in result else [
            None if np.isnan(v) else int(v) for v in probe_range(result["bifurcation_resampled"]).values],
        "final_divergence": "undefined" if no_pairs else float(last["mean_divergence"].values),
        "redundancy": "undefined" if np.isnan(redundancy) else redundancy,
        # The fraction as a count of heads: k / n with n a few heads is exact that way, where two
        # decimals rounded 5/8 to 0.62 and 3/8 to 0.38 (half to even, on exact binary halves)
        "redundant_heads": None if np.isnan(redundancy) else round(redundancy * n_heads),
        "heads": n_heads,
        # NaN: a sweep's padded head, or undefined (no offset scored): "undefined" if every head is
        "slash_dominant": int(np.nansum(flags)) if np.isfinite(flags).any() else "undefined",
        "roles": counts,
        # the token the token roles look for, where no probe holds it (the quickstart's vocabulary of
        # 32 has no '/', 47): none of its heads can be a token head, which a count of 0 does not say
        "token_unseen": int(result.attrs.get("token_id", ord("/")))
        if "token_share" in last and bool(last["token_share"].isnull().all()) else None,
        # Voita et al.'s positional heads (peak one step back in >= 90% of rows) that the role
        # label, asking for a mean weight of 0.5 there, does not call previous_token
        "peak_not_previous_token": None if "previous_token_peak" not in last else missed_previous_token(
            last["previous_token_peak"].values, last["role"].values),
        # specific roles (not local or diffuse) at the first snapshot, before any update where it is step 0
        "roles_at_start": _specific_counts(result.isel({SNAPSHOT: 0})),
        "start_step": int(result["step"].values[0]) if "step" in result.coords else None,
        "probe_sensitive_roles": probe_sensitive_heads(last["role"], last["role_resampled"])
        if "role_resampled" in last else None,
    }


def _specific_counts(snapshot: xr.Dataset) -> dict[str, int]:
    from dynamics.analysis.roles import SPECIFIC_ROLES, role_names

    labels = role_names(snapshot["role"].values).ravel()
    return {r: int((labels == r).sum()) for r in SPECIFIC_ROLES if (labels == r).any()}


def _step_or_why(step: xr.DataArray, curve: xr.DataArray) -> int | str | None:
    """A bifurcation step as the table says it: the step, None (never), or "undefined" where
    there is no curve (no two heads to compare), which is not the same as never bifurcating."""
    value = float(step.values)
    if np.isnan(value):
        return None if bool(curve.notnull().any()) else "undefined"
    return int(value)


STAGE_BYTES = 8 * 2**20
"""Attention bytes per task of the per-snapshot stage (dask input). A task's peak memory is a
few times this (43 MiB on bench/analysis.py's blocks of 4 snapshots: the float64 temporaries
of the head-by-head JS kernel, `js_kernels`), per thread, whatever the run's length."""


def read_in_blocks(ds: xr.Dataset) -> xr.Dataset:
    """A run opened without dask (``open_run(path, dask=False)``), as dask arrays in blocks of
    about STAGE_BYTES along snapshot: each block is one zarr read of its snapshots, whose chunks
    zarr fetches together. Opened with dask, a run comes one snapshot per task, and on a run of
    3,997 snapshots those tasks' overhead was 28 s of its 34 s analysis. Variables without a
    snapshot dim (probe_tokens) are read whole: they are small."""
    return ds.assign({name: da.chunk(_snapshot_blocks(da)) if SNAPSHOT in da.dims else da.load()
                      for name, da in ds.data_vars.items()})


def _snapshot_blocks(da: xr.DataArray) -> dict[str, int]:
    """Chunks of about STAGE_BYTES along snapshot, whole along every dim but snapshot and run."""
    per_snapshot = max(1, da.nbytes // max(1, da.sizes[SNAPSHOT]))
    whole = {d: -1 for d in da.dims if d not in (SNAPSHOT, RUN)}
    return {**whole, SNAPSHOT: int(max(1, STAGE_BYTES // per_snapshot))}


def _in_blocks(da: xr.DataArray) -> xr.DataArray:
    """Dask input in chunks of about STAGE_BYTES along snapshot, whole along the rest.

    A store is chunked one snapshot per chunk, and an analyser of these small per-snapshot
    arrays (importance, head weights) added a dozen tasks per snapshot: most of the graph of a
    long run, held in memory while it runs. The values are the same: each analyser is per
    snapshot. In-memory input is returned as it is.
    """
    if da.chunks is None or SNAPSHOT not in da.dims:
        return da
    return da.chunk(_snapshot_blocks(da))


def _attention_stage(attn: xr.DataArray, tokens: xr.DataArray, attn0: xr.DataArray, opt: AnalysisOptions,
                     max_offset: int) -> xr.Dataset:
    """Every analyser that reads the attention maps; each is per snapshot."""
    scores = role_scores(attn, tokens, opt.roles)
    out = {f"score_{name}": v for name, v in scores.data_vars.items()}
    out["slash"] = slash_score(attn, max_offset=max_offset)
    out["peak"] = peak_share(attn, delta=1)
    out["present"] = attn.isel(probe=0, query=0, key=0).notnull()
    out["share"] = token_share(attn, tokens, opt.roles.token_id)
    out["ratio"] = token_ratio(attn, tokens, opt.roles.token_id)
    if attn.sizes[PROBE] > 1:  # per snapshot, so a block keeps resample x layer past it, not every probe's pairs
        out["jsd"], by_probe = js_distance(attn, by_probe=True)
        out["layers_resampled"] = resampled_layer_divergence(by_probe)
    else:  # one probe: nothing to resample
        out["jsd"] = js_distance(attn)
    # divergence_from_init, with the run's snapshot 0. Its values do not depend on the blocking;
    # blocks of STAGE_BYTES keep its three float64 temporaries within the head-by-head
    # kernel's peak, which sets the stage's (the default block made it the largest, 1.5x that).
    out["from_init"] = js_distance(attn, attn0, block_bytes=STAGE_BYTES)
    return xr.Dataset(out, attrs=scores.attrs)  # made once, as analyse_run's result is


def _attention_stage_by_blocks(attn: xr.DataArray, tokens: xr.DataArray, opt: AnalysisOptions,
                               max_offset: int) -> xr.Dataset:
    """:func:`_attention_stage`, for dask input as one task per block of snapshots.

    Built analyser by analyser, the graph holds a dozen consumers of every attention chunk,
    and dask's ordering keeps most chunks (and their float32 copies) alive at once: peak
    memory grew by 2-4 bytes per byte of attention (bench/analysis.py). One task per block
    computes everything a block feeds and frees it. The values are the same: each analyser
    is per snapshot and sees the same arrays.
    """
    attn0 = attn.isel({SNAPSHOT: 0}, drop=True)
    if attn.chunks is None:
        return _attention_stage(attn, tokens, attn0, opt, max_offset)
    # Non-index coords (step) are chunked unlike the data; map_blocks needs one chunking.
    extra = [c for c in attn.coords if c not in attn.dims]
    bare = attn.drop_vars(extra)
    per_snapshot = max(1, attn.nbytes // max(1, attn.sizes[SNAPSHOT]))
    # A block is whole along every dim but snapshot and run: each analyser reads all heads and
    # probes of a snapshot, and open_sweep's outer join leaves a run padded to more heads in two
    # head chunks, which map_blocks refused (inconsistent chunks along head).
    whole = {d: -1 for d in (LAYER, HEAD, PROBE, QUERY, KEY) if d in bare.dims}
    bare = bare.chunk({**whole, SNAPSHOT: int(max(1, STAGE_BYTES // per_snapshot))})
    # The other inputs are chunked alike along the dims they share (a sweep's run dim).
    tokens, attn0 = (x.chunk({d: bare.chunksizes[d] for d in x.dims if d in bare.chunksizes})
                     for x in (tokens, attn0.drop_vars([c for c in extra if c in attn0.coords])))
    template = _attention_stage(bare, tokens, attn0, opt, max_offset)  # lazy: names, dims, dtypes
    stage = xr.map_blocks(_attention_stage, bare, args=[tokens, attn0],
                          kwargs={"opt": opt, "max_offset": max_offset}, template=template)
    # The stage's results are small (no query or key dims: 0.7% of the attention at T = 64,
    # 2.5% at the quickstart's T = 32, half of that `layers_resampled`, 200 x layers float64 a
    # snapshot whatever the heads, probes and T: most of it on tiny probes), so they are
    # gathered into one chunk along snapshot. Left in the blocks, every
    # later analyser added tasks per block and, with the per-snapshot tasks of importance and
    # head weights (`_in_blocks`), the graph, held while it runs, grew with the run: 27k
    # tasks, 76 MiB, for 432 snapshots (0.09 bytes per byte of attention; now 3.9k tasks).
    stage = stage.chunk({SNAPSHOT: -1})
    return stage.assign_coords({c: attn[c].load() for c in extra})
