"""The redundancy dendrogram and JS distance matrix of the chosen run at its last snapshot."""

from __future__ import annotations

import math

import numpy as np

from dynamics.analysis import ROLES, linkage_matrix
from dynamics.analysis.pipeline import AnalysisOptions
from dynamics.report.data import _Ctx, _Section
from dynamics.report.draw import _figure, _save, _token_unseen_sentence
from dynamics.schema import FINISHED_STATUSES


def _dendrogram_coords(Z: np.ndarray) -> dict:
    from scipy.cluster.hierarchy import dendrogram

    return dendrogram(Z, no_plot=True)  # coordinates only: we draw on our own Figure


def _redundancy_section(ctx: _Ctx) -> _Section:
    runs, chosen, out = ctx.runs, ctx.chosen, ctx.out
    sec = _Section("redundancy", "Redundancy: dendrogram and JS distance matrix at the last snapshot")
    run = next((r for r in runs if r.run_id == chosen), None)
    if run is None:
        sec.missing.append("Not available: the dendrogram because the store holds no runs.")
        return sec
    analysis, source = ctx.chosen_analysis()
    if analysis is None:
        sec.missing.append(f"Not available: the dendrogram and JS matrix of run {run.run_id} because {source}.")
        return sec
    js = analysis["js_last"]
    L, H = js.sizes["layer"], js.sizes["head"]
    d = np.asarray(js.transpose("layer", "head", "layer_b", "head_b").values, dtype=float).reshape(L * H, L * H)
    valid = ~np.isnan(np.diagonal(d))
    names = np.array([f"L{li}H{hi}" for li in range(L) for hi in range(H)])
    if "role" in analysis:
        last_roles = np.asarray(ROLES)[np.clip(analysis["role"].isel(snapshot=-1).values.ravel(), 0, len(ROLES) - 1)]
        names = np.array([f"{n} {r}" for n, r in zip(names, last_roles, strict=True)])
    names = names[valid]
    if valid.sum() < 2:
        sec.missing.append(f"Not available: the dendrogram because run {run.run_id} has fewer than 2 heads.")
        return sec
    step = analysis.attrs.get("js_step")
    threshold = float(analysis.attrs.get("cluster_threshold", AnalysisOptions().cluster_threshold))
    Z = linkage_matrix(js)
    dn = _dendrogram_coords(Z)
    n = len(names)
    # taller by the rotated tick names ("L0H0 previous_token": 1.1 in at 7 pt), which squeezed the
    # axes until their labels were cut at the top
    longest = max(len(str(x)) for x in names)
    fig = _figure(max(9.0, 0.32 * n + 6), max(4.2, 0.16 * n + 2.5) + 0.06 * longest)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1.1, 1])
    for xs, ys in zip(dn["icoord"], dn["dcoord"], strict=True):
        ax1.plot(xs, ys, color="#345", lw=1.2)
    ax1.axhline(threshold, color="crimson", ls="--", lw=1, label=f"cluster cut = {threshold:g}")
    ax1.set_xticks(5 + 10 * np.arange(n), names[dn["leaves"]], rotation=90, fontsize=7)
    ax1.set_xlim(0, 10 * n)
    ax1.set_ylim(0, max(float(Z[:, 2].max()) * 1.08, threshold * 1.5))
    ax1.set_ylabel("merge distance:\nmean JS distance (sqrt(nats))")
    ax1.set_xlabel("head (layer, head, role at this snapshot)")
    ax1.legend(fontsize=7, frameon=False)
    order = np.flatnonzero(valid)[dn["leaves"]]
    im = ax2.imshow(d[np.ix_(order, order)], cmap="viridis", vmin=0, vmax=math.sqrt(math.log(2)), interpolation="nearest")
    ax2.set_xticks(np.arange(n), names[dn["leaves"]], rotation=90, fontsize=7)
    ax2.set_yticks(np.arange(n), names[dn["leaves"]], fontsize=7)
    ax2.set_xlabel("head (dendrogram order)")
    ax2.set_ylabel("head (dendrogram order)")
    fig.colorbar(im, ax=ax2, shrink=0.85, label="JS distance\n(sqrt(nats), max sqrt(ln 2))")
    at = f"step {step}" if step is not None else "the last snapshot"
    how = "stored analysis" if source == "stored" else "analysed for this report" + (
        ", its stored analysis could not be read" if source == "computed: stored unreadable" else "")
    partial = ("" if run.n_recorded == run.n_snapshots else
               f" (the last snapshot recorded before it {run.status})" if run.status in FINISHED_STATUSES else
               " (the last snapshot recorded so far)")
    sec.figures.append((_save(fig, out, "redundancy.png"),
                        f"Run {run.run_id} at {at}{partial}, {how}. Left: average-linkage dendrogram of the heads on their "
                        f"JS distances (Clark et al. 2019); heads merged below the dashed cut ({threshold:g}) count as redundant. "
                        f"Right: the JS distance matrix between every pair of heads, in dendrogram order (0 = identical attention)."
                        f"{_token_unseen_sentence([run], chosen=True) if 'role' in analysis else ''}"))
    return sec
