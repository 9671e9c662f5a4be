"""Known answers, computed on paper, for the numbers `dynamics analyse` prints.

Each test pins a definition of README's "Analysis definitions" (smoothing constant, which
queries count, inclusive thresholds, which snapshot is reported) that the module tests leave
free: a change to any of them changes a printed number.
"""

import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from dynamics.analysis import (
    AnalysisOptions,
    analyse_run,
    bifurcation_step,
    cluster_heads,
    commitment_step,
    divergence_from_init,
    emergence_step,
    gini,
    js_distance,
    redundancy_fraction,
    role_scores,
    slash_dominant,
    slash_score,
    summary_row,
    token_dominant,
    token_ratio,
    token_share,
    within_layer_divergence,
)
from dynamics.analysis.roles import ROLES, RoleThresholds, assign_roles, local_score, role_names, sink_score

ATTN_DIMS = ("snapshot", "layer", "head", "probe", "query", "key")


def xlogx(x):
    x = np.asarray(x, float)
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def js_nats(p, q):
    """JS divergence in nats, written out: H(m) - (H(p) + H(q)) / 2."""
    m = (p + q) / 2
    return xlogx(p).sum() / 2 + xlogx(q).sum() / 2 - xlogx(m).sum()


def uniform(t):
    a = np.tril(np.ones((t, t)))
    return a / a.sum(-1, keepdims=True)


# ----------------------------------------------------------------------------- JS distance


def test_js_distance_of_two_one_hot_heads_on_two_positions_on_paper():
    # Query 0 sees one key: both heads agree there (JS 0), and it is in the mean (README).
    # Query 1: rows [1, 0] and [0, 1], smoothed with 0.001 / 2: [0.9995, 0.0005] and its mirror.
    a = np.zeros((1, 2, 1, 2, 2))
    a[..., 0, 0] = 1
    a[0, 0, 0, 1] = [1, 0]
    a[0, 1, 0, 1] = [0, 1]
    attn = xr.DataArray(a, dims=ATTN_DIMS[1:])
    p = np.array([0.9995, 0.0005])
    expected = np.sqrt(js_nats(p, p[::-1]) / 2)  # mean over the 2 queries, then the root
    d = js_distance(attn)
    assert d.values[0, 0, 0, 1] == pytest.approx(expected, rel=1e-12)
    assert d.values[0, 1, 0, 0] == pytest.approx(expected, rel=1e-12)
    assert d.values[0, 0, 0, 0] == 0.0
    # the aligned path (divergence_from_init's) gives the same number
    aligned = js_distance(attn.isel(head=0), attn.isel(head=1))
    assert float(aligned[0]) == pytest.approx(expected, rel=1e-12)
    # unsmoothed it would be sqrt(ln 2 / 2): the 0.001 is what makes the difference
    assert expected < np.sqrt(np.log(2) / 2) - 1e-3


def test_js_distance_averages_over_probes_and_queries_not_sums():
    # Two probes: identical in the first, the T = 2 disagreement above in the second.
    a = np.zeros((1, 2, 2, 2, 2))
    a[..., 0, 0] = 1
    a[0, :, :, 1] = [0.5, 0.5]
    a[0, 0, 1, 1] = [1, 0]
    a[0, 1, 1, 1] = [0, 1]
    attn = xr.DataArray(a, dims=ATTN_DIMS[1:])
    p = np.array([0.9995, 0.0005])
    expected = np.sqrt(js_nats(p, p[::-1]) / 4)  # one nonzero row out of 2 probes x 2 queries
    assert js_distance(attn).values[0, 0, 0, 1] == pytest.approx(expected, rel=1e-12)


def test_js_smoothing_spreads_over_the_visible_keys_only():
    # T = 3, query 2 sees 3 keys: eps / 3 each. Heads: one-hot on key 0 vs one-hot on key 2.
    a = np.zeros((1, 2, 1, 3, 3))
    a[..., 0, 0] = 1
    a[..., 1, :2] = 0.5
    a[0, 0, 0, 2] = [1, 0, 0]
    a[0, 1, 0, 2] = [0, 0, 1]
    attn = xr.DataArray(a, dims=ATTN_DIMS[1:])
    e = 0.001 / 3
    p = np.array([0.999 + e, e, e])
    expected = np.sqrt(js_nats(p, p[::-1]) / 3)
    assert js_distance(attn).values[0, 0, 0, 1] == pytest.approx(expected, rel=1e-12)


def test_divergence_from_init_compares_each_snapshot_with_the_first():
    u, s = uniform(2), np.array([[1.0, 0.0], [1.0, 0.0]])  # uniform, then a sink
    a = np.stack([u, s, u])[:, None, None, None]  # (snapshot, layer, head, probe, Q, K)
    attn = xr.DataArray(a, dims=ATTN_DIMS)
    p, q = np.array([0.5, 0.5]), np.array([0.9995, 0.0005])
    expected = np.sqrt(js_nats(p, q) / 2)
    out = divergence_from_init(attn).values.ravel()
    np.testing.assert_allclose(out, [0.0, expected, 0.0], rtol=1e-12, atol=0)


def test_within_layer_divergence_is_the_mean_over_ordered_distinct_pairs():
    d = np.array([[0.0, 0.1, 0.4], [0.1, 0.0, 0.7], [0.4, 0.7, 0.0]])
    jsd = xr.DataArray(d[None, :, None, :], dims=("layer", "head", "layer_b", "head_b"))
    assert float(within_layer_divergence(jsd)[0]) == pytest.approx(0.4)


# ----------------------------------------------------------------------------- bifurcation


def test_bifurcation_band_edges_on_paper():
    # Baseline [2, 0, 1]: mean 1, sample sd 1 -> band 1 +- 3 (the floor, rel_tol x |mean| = 1, is
    # narrower). rel_tol = 1 also makes the first value's own band 2 +- 2, which holds the baseline
    # and the 4s: no split inside the baseline here. A point at exactly 4 is on the edge: inside
    # (outside means strictly beyond).
    steps = ("snapshot", [0, 10, 20, 30, 40])
    on_edge = xr.DataArray([2.0, 0.0, 1.0, 4.0, 4.0], dims="snapshot", coords={"step": steps})
    assert np.isnan(float(bifurcation_step(on_edge, rel_tol=1.0)))
    beyond = on_edge.copy(data=[2.0, 0.0, 1.0, 4.0, 4.25])
    assert float(bifurcation_step(beyond, rel_tol=1.0)) == 40.0
    below = on_edge.copy(data=[2.0, 0.0, 1.0, -2.25, -2.25])  # two-sided
    assert float(bifurcation_step(below, rel_tol=1.0)) == 30.0
    # With the default 5% the first value's band is 2 +- 0.1: the curve left it at step 10 and
    # never came back, a split inside the baseline, which the band (1 +- 3, holding the 4s) missed.
    assert float(bifurcation_step(on_edge)) == 10.0
    # Baseline [0, 1, 2]: its first value's band is 0 +- 1e-6 (the absolute floor), left at step 10.
    assert float(bifurcation_step(on_edge.copy(data=[0.0, 1.0, 2.0, 4.0, 4.0]))) == 10.0
    # rel floor: flat baseline 8 -> band 8 +- 0.4; 8.375 inside, 8.5 outside
    flat = on_edge.copy(data=[8.0, 8.0, 8.0, 8.375, 8.5])
    assert float(bifurcation_step(flat)) == 40.0
    flat4 = on_edge.copy(data=[8.0, 8.0, 8.0, 8.5, 8.375])
    assert np.isnan(float(bifurcation_step(flat4)))


def test_bifurcation_baseline_is_the_first_three_snapshots():
    # Baseline [1, 1, 1] (band 1 +- 0.05); snapshot 3 at 1.5 is outside it. A baseline of four
    # snapshots (mean 1.125, sd 0.25, band +-0.75) would hold everything.
    x = xr.DataArray([1.0, 1.0, 1.0, 1.5, 1.5, 1.5], dims="snapshot",
                     coords={"step": ("snapshot", [0, 1, 2, 3, 4, 5])})
    assert float(bifurcation_step(x)) == 3.0


# ----------------------------------------------------------------------------- gini, commitment


def test_gini_on_paper():
    assert float(gini(xr.DataArray([1.0, 2.0, 3.0], dims="head"))) == pytest.approx(8 / 36)
    assert float(gini(xr.DataArray([1.0, 0.0], dims="head"))) == pytest.approx(0.5)


def test_commitment_step_is_the_first_snapshot_of_the_final_label():
    lab = xr.DataArray([[[3, 3]], [[1, 3]], [[1, 2]], [[1, 2]]], dims=("snapshot", "layer", "head"),
                       coords={"step": ("snapshot", [0, 7, 11, 13])})
    assert commitment_step(lab).values.tolist() == [[7.0, 11.0]]


# ----------------------------------------------------------------------------- redundancy


def test_redundancy_cut_at_the_threshold_is_inclusive_and_fraction_counts_heads():
    # heads 0, 1 at distance exactly 0.0625 (a binary fraction), cut there: merged.
    d = np.array([[0, 0.0625, 0.8, 0.8], [0.0625, 0, 0.8, 0.8], [0.8, 0.8, 0, 0.7], [0.8, 0.8, 0.7, 0]])
    jsd = xr.DataArray(d[None, :, None, :], dims=("layer", "head", "layer_b", "head_b"))
    labels = cluster_heads(jsd, threshold=0.0625)
    assert labels.values.tolist() == [[0, 0, 1, 2]]
    assert float(redundancy_fraction(labels)) == 0.5
    assert cluster_heads(jsd, threshold=0.0624).values.tolist() == [[0, 1, 2, 3]]


def test_redundancy_uses_average_linkage():
    # 0-1 at 0.05; 2 is 0.08 from 0 and 0.14 from 1: average 0.11 > 0.1 (single linkage would
    # merge it at 0.08, complete linkage would not either way).
    d = np.array([[0, 0.05, 0.08], [0.05, 0, 0.14], [0.08, 0.14, 0]])
    jsd = xr.DataArray(d[None, :, None, :], dims=("layer", "head", "layer_b", "head_b"))
    assert cluster_heads(jsd).values.tolist() == [[0, 0, 1]]
    d2 = np.array([[0, 0.05, 0.08], [0.05, 0, 0.11], [0.08, 0.11, 0]])  # average 0.095: merged
    jsd2 = xr.DataArray(d2[None, :, None, :], dims=("layer", "head", "layer_b", "head_b"))
    assert cluster_heads(jsd2).values.tolist() == [[0, 0, 0]]


# ----------------------------------------------------------------------------- slash


def band(t, delta):
    """key = query - delta where visible; earlier rows uniform."""
    a = np.zeros((t, t))
    for i in range(t):
        if i >= delta:
            a[i, i - delta] = 1
        else:
            a[i, : i + 1] = 1 / (i + 1)
    return a


def test_slash_score_of_a_band_matrix_on_paper():
    s = slash_score(xr.DataArray(band(8, 2)[None], dims=("probe", "query", "key"))).values
    # offset 0: rows 0 and 1 (1 and 1/2) over 8 queries; offset 1: row 1 (1/2) over 7; offset 2: 1
    np.testing.assert_allclose(s, [1.5 / 8, 0.5 / 7, 1, 0, 0, 0, 0, 0], rtol=1e-12, atol=0)


def test_slash_score_averages_probes():
    a = np.stack([band(6, 3), uniform(6)])
    s = slash_score(xr.DataArray(a, dims=("probe", "query", "key"))).sel(offset=3).item()
    assert s == pytest.approx((1 + np.mean([1 / 4, 1 / 5, 1 / 6])) / 2)


def test_slash_dominance_at_exactly_kappa():
    s = xr.DataArray([0.0, 0.5, 0.25], dims="offset", coords={"offset": [0, 1, 2]})
    assert float(slash_dominant(s, kappa=0.5, delta=1)) == 1.0
    assert float(slash_dominant(s, kappa=0.5, min_offset=2)) == 0.0
    assert float(slash_dominant(s, kappa=0.5, min_offset=1, max_offset=1)) == 1.0


# ----------------------------------------------------------------------------- token dominance


def test_token_share_and_ratio_on_paper():
    # '/' at positions 1 and 3 of T = 4; queries 1, 2, 3 see one.
    tokens = xr.DataArray([[5, 47, 6, 47]], dims=("probe", "position"))
    a = np.zeros((4, 4))
    a[0, 0] = 1
    a[1] = [0.5, 0.5, 0, 0]  # 0.5 on the '/', uniform there (1 of 2 visible keys)
    a[2] = [0, 1, 0, 0]  # 1.0 on it; uniform would give 1/3
    a[3] = [0.25, 0.25, 0.25, 0.25]  # 0.5 on the two '/'; uniform gives 2/4
    attn = xr.DataArray(a[None], dims=("probe", "query", "key"))
    assert token_share(attn, tokens).item() == pytest.approx((0.5 + 1 + 0.5) / 3)
    assert token_ratio(attn, tokens).item() == pytest.approx((1 + 3 + 1) / 3)


def test_token_dominance_run_of_three_at_exactly_half():
    s = xr.DataArray([[0.5, 0.5, np.nan, 0.5, 0.1]], dims=("head", "probe"))
    assert token_dominant(s).values.tolist() == [1.0]  # 0.5 >= 0.5, NaN skipped
    s2 = xr.DataArray([[0.5, 0.49, 0.5, 0.5, 0.1]], dims=("head", "probe"))
    assert token_dominant(s2).values.tolist() == [0.0]
    assert np.isnan(token_dominant(s.isel(probe=[0, 1, 2])).item())  # two probes hold the token


def test_emergence_is_the_start_of_the_final_dominant_stretch():
    d = xr.DataArray([[1.0, 0.0, 1.0, 1.0]], dims=("head", "snapshot"),
                     coords={"step": ("snapshot", [0, 3, 6, 9])})
    assert emergence_step(d).values.tolist() == [6.0]


# ----------------------------------------------------------------------------- roles


def test_role_scores_of_planted_heads_at_t16_on_paper():
    t = 16
    prev = np.eye(t, k=-1)
    prev[0, 0] = 1
    sink = np.zeros((t, t))
    sink[:, 0] = 1
    heads = np.stack([uniform(t), prev, sink, np.eye(t)])
    attn = xr.DataArray(heads[None, None, :, None], dims=ATTN_DIMS)
    tokens = xr.DataArray(np.arange(t)[None], dims=("probe", "position"))
    sc = role_scores(attn, tokens).isel(snapshot=0, layer=0)
    h_t = np.sum(1 / np.arange(1, t + 1))
    np.testing.assert_allclose(sc["sink"].values, [h_t / t, 2 / t, 1, 1 / t], rtol=1e-6)
    np.testing.assert_allclose(sc["self"].values, [h_t / t, 1 / t, 1 / t, 1], rtol=1e-6)
    np.testing.assert_allclose(sc["previous_token"].values, [np.mean(1 / np.arange(2, t + 1)), 1, 1 / 15, 0],
                               rtol=1e-6)
    np.testing.assert_allclose(sc["local"].values, [np.mean(3 / np.arange(4, t + 1)), 1, 0, 1], rtol=1e-6)
    np.testing.assert_allclose(sc["diffuse"].values, [1, 0, 0, 0], atol=1e-6)
    # slash: window 2..8; the sink's best is its one row at offset 8 (1/8), the uniform head's offset 2
    np.testing.assert_allclose(sc["slash"].values, [np.mean(1 / np.arange(3, t + 1)), 0, 1 / 8, 0], rtol=1e-6)
    assert sc["slash_offset"].values.tolist() == [2.0, 2.0, 8.0, 2.0]


@pytest.mark.parametrize(("t", "scored"), [(9, False), (10, True)])
def test_sink_role_is_unscored_up_to_t9(t, scored):
    sink = np.zeros((t, t))
    sink[:, 0] = 1
    attn = xr.DataArray(sink[None, None, None, None], dims=ATTN_DIMS)
    tokens = xr.DataArray(np.arange(t)[None], dims=("probe", "position"))
    assert np.isfinite(role_scores(attn, tokens)["sink"].item()) == scored


# ----------------------------------------------------------------------------- the printed row


def run_dataset(attn, steps):
    s, n_layer, n_head, n_probe, t, _ = attn.shape
    tokens = np.tile(np.arange(t), (n_probe, 1))
    return xr.Dataset(
        {
            "attention": (ATTN_DIMS, attn),
            "probe_tokens": (("probe", "position"), tokens),
            "importance": (("snapshot", "layer", "head"), np.ones((s, n_layer, n_head))),
        },
        coords={"step": ("snapshot", np.asarray(steps))},
    )


def test_summary_row_reports_the_last_snapshot_on_paper():
    # 1 layer x 2 heads, T = 8. Snapshots 0-2: both uniform. Snapshot 3: head 0 previous-token,
    # head 1 uniform. Snapshot 4: head 0 slash at offset 2, head 1 the same (identical heads).
    t = 8
    u, prev = uniform(t), band(t, 1)
    slash = band(t, 2)
    frames = [[u, u], [u, u], [u, u], [prev, u], [slash, slash]]
    attn = np.array(frames)[:, None, :, None]  # (snapshot, layer, head, probe, Q, K)
    result = analyse_run(run_dataset(attn, [0, 10, 20, 30, 40]))
    row = summary_row(result)
    assert row["final_divergence"] == 0.0  # identical heads at the last snapshot
    assert row["redundancy"] == 1.0
    assert row["slash_dominant"] == 2
    assert row["roles"] == {"slash": 2}
    assert row["bifurcation_step"] is None  # back to 0 divergence: inside the band at the end
    assert result["commitment_step"].values.tolist() == [[40.0, 40.0]]
    assert result["slash_emergence_step"].values.tolist() == [[30.0, 40.0]]  # prev at 30 is (1, delta)-dominant


def test_analysis_package_does_not_load_torch_or_zarr_at_runtime():
    # The AST test reads each file's own imports; this one follows them (dynamics.schema, ...).
    code = ("import sys, pkgutil, importlib, dynamics.analysis as a\n"
            "for m in pkgutil.iter_modules(a.__path__): importlib.import_module('dynamics.analysis.' + m.name)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'zarr'))\n"
            "assert not bad, bad[:3]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_default_options_match_readme():
    opt = AnalysisOptions()
    assert (opt.kappa, opt.cluster_threshold, opt.token_run_length, opt.baseline_snapshots) == (0.5, 0.1, 3, 3)
    assert (opt.roles.token, opt.roles.sink, opt.roles.slash, opt.roles.token_id) == (0.5, 0.3, 0.5, 47)
    assert opt.slash_min_offset == 1 and opt.slash_window(16) == 8 and opt.slash_window(17) == 8


def test_bifurcation_absolute_floor_is_1e_minus_6():
    # Heads identical at init: divergence exactly 0, sd 0, 5% of 0 is 0. README's band would be
    # 0 +- 0; the code's floor is 1e-6 (float rounding is no bifurcation), and no wider.
    steps = ("snapshot", [0, 10, 20, 30, 40])
    jitter = xr.DataArray([0.0, 0.0, 0.0, 5e-7, 5e-7], dims="snapshot", coords={"step": steps})
    assert np.isnan(float(bifurcation_step(jitter)))
    real = jitter.copy(data=[0.0, 0.0, 0.0, 1e-4, 2e-6])
    assert float(bifurcation_step(real)) == 30.0


def test_token_probes_without_the_token_neither_extend_nor_break_a_run():
    # hits, (no token), hit, miss: a run of 2 probes that hold the token, not 3
    s = xr.DataArray([[0.9, np.nan, 0.9, 0.1]], dims=("head", "probe"))
    assert token_dominant(s).values.tolist() == [0.0]
    s2 = xr.DataArray([[0.9, np.nan, 0.9, 0.9, 0.1]], dims=("head", "probe"))
    assert token_dominant(s2).values.tolist() == [1.0]


ROLE_DEFAULTS = {"previous_token": 0.5, "self": 0.5, "slash": 0.5, "induction": 0.4, "sink": 0.3,
                 "token": 0.5, "local": 0.8, "diffuse": 0.8}


@pytest.mark.parametrize("role", list(ROLE_DEFAULTS))
def test_each_role_passes_at_its_default_threshold_and_not_below(role):
    from dynamics.analysis import assign_roles, role_names

    limit = ROLE_DEFAULTS[role]
    scores = xr.Dataset({r: ("head", [0.0, 0.0]) for r in ROLE_DEFAULTS})
    scores[role].values[:] = [limit, limit - 0.01]
    assert role_names(assign_roles(scores)).tolist() == [role, "none"]


def test_analyse_run_reports_steps_not_snapshot_indices():
    # 1 layer x 2 heads, T = 8: identical (divergence 0) for 3 snapshots, then apart for good;
    # steps are not the indices, so an index read as a step would show.
    t = 8
    u, prev = uniform(t), band(t, 1)
    attn = np.array([[u, u], [u, u], [u, u], [prev, u], [prev, u]])[:, None, :, None]
    ds = run_dataset(attn, [0, 7, 19, 23, 31])
    ds["importance"][:] = np.array([1.0, 0.0])  # one head holds all: Gini 1/2
    result = analyse_run(ds)
    row = summary_row(result)
    assert row["bifurcation_step"] == 23
    assert row["layer_bifurcation_steps"] == [23]
    assert float(result["divergence_from_init"].isel(layer=0, head=1, snapshot=-1)) == 0.0
    assert result["winner_take_all"].values.ravel().tolist() == [0.5] * 5
    assert result["commitment_step"].values.tolist() == [[23.0, 0.0]]
    assert row["slash_dominant"] == 1 and row["roles"] == {"previous_token": 1, "diffuse": 1}
    assert row["redundancy"] == 0.0


def test_analyse_run_cuts_redundancy_at_0_1_and_correlates_the_last_snapshot():
    # Head 1 = 0.75 uniform + 0.25 previous-token: JS distance 0.141 from the uniform head 0
    # (over 0.1: not redundant); 0.85 / 0.15 gives 0.089 (under: both redundant).
    t = 8
    u, prev = uniform(t), band(t, 1)
    far, near = 0.75 * u + 0.25 * prev, 0.85 * u + 0.15 * prev
    attn = np.array([[u, u], [u, u], [u, u], [u, near], [u, far]])[:, None, :, None]
    result = analyse_run(run_dataset(attn, [0, 1, 2, 3, 4]))
    assert result["js_distance"].values[-1, 0, 0, 0, 1] == pytest.approx(0.14127, abs=1e-4)
    assert result["redundancy_fraction"].values.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert summary_row(result)["redundancy"] == 0.0
    # attention_correlation is of the last snapshot (the first has identical heads: r = 1)
    mask = np.tril(np.ones((t, t), bool))
    r = np.corrcoef(u[mask], far[mask])[0, 1]
    assert result["attention_correlation"].values[0, 0, 0, 1] == pytest.approx(r, rel=1e-9)
    assert r < 0.99


def test_analyse_table_prints_the_row_as_summary_row_gives_it(capsys):
    from dynamics.tables import print_analysis

    row = {"run": "r1", "status": "completed", "bifurcation_step": None, "layer_bifurcation_steps": [32, 100],
           "final_divergence": 0.12345, "redundancy": 0.375, "redundant_heads": 3, "heads": 8, "slash_dominant": 2,
           "roles": {"diffuse": 1, "slash": 3, "sink": 2}}
    print_analysis([row])
    line = capsys.readouterr().out.splitlines()[1].split("  ")
    cells = [c.strip() for c in line if c.strip()]
    assert cells == ["r1", "completed", "never (by layer: 32, 100)", "0.123", "3/8", "2", "slash:3 sink:2 diffuse:1"]
    row.update(bifurcation_step=40, layer_bifurcation_steps=[40, 40])
    print_analysis([row])
    assert "  40  " in capsys.readouterr().out.splitlines()[1]
    row.update(layer_bifurcation_steps=[40, 100])  # one layer differs: every layer's step is shown
    print_analysis([row])
    assert "40 (by layer: 40, 100)" in capsys.readouterr().out
    row.update(bifurcation_probe_range=[32, None])  # the probes' range where it differs from the step, first
    print_analysis([row])
    out = capsys.readouterr().out
    assert "40 (probes: 32-never; by layer: 40, 100)" in out and "5% to 95% range of the step over 200 bootstrap" in out
    row.update(bifurcation_probe_range=[40, 40], layer_bifurcation_steps=[40, 40])  # the same: not repeated
    print_analysis([row])
    assert "  40  " in capsys.readouterr().out.splitlines()[1]
    row.update(bifurcation_step=None, bifurcation_probe_range=[250, None], layer_bifurcation_steps=None)
    print_analysis([row])
    assert "never (probes: 250-never)" in capsys.readouterr().out


def test_the_slash_window_stays_within_t_minus_1():
    from dynamics.analysis.pipeline import AnalysisOptions
    from dynamics.analysis.roles import RoleThresholds

    assert AnalysisOptions().slash_window(10) == 5
    assert AnalysisOptions(roles=RoleThresholds(slash_max_offset=50)).slash_window(10) == 9

# Known answers that mutants of roles, the pipeline and the JS kernels passed (a mutation audit's),
# each worked out by hand or by a plain numpy loop, never by the function under test.


def _heads(*mats):
    """(snapshot=1, layer=1, head=len(mats), probe=1, T, T) from (T, T) patterns."""
    a = np.stack([np.asarray(m, dtype=np.float64) for m in mats])
    return xr.DataArray(a[None, None, :, None], dims=ATTN_DIMS)


def _offset_head(t, delta):
    """Every query i >= delta on key i - delta; earlier queries on key 0."""
    a = np.zeros((t, t))
    for i in range(t):
        a[i, i - delta if i >= delta else 0] = 1.0
    return a


def _uniform(t):
    keep = np.tril(np.ones((t, t)))
    return keep / keep.sum(1, keepdims=True)


def _tokens(t, probes=1):
    return xr.DataArray(np.arange(probes * t).reshape(probes, t) % 251, dims=("probe", "position"))


# sink_score

def test_sink_position_past_the_last_key_is_refused_in_words():
    # Pins the range check `0 <= position < n`: with `<= n`, position T passed the check and
    # failed later as a bare IndexError from isel, naming no argument.
    a = xr.DataArray(_uniform(4)[None], dims=("probe", "query", "key"))
    with pytest.raises(ValueError, match="position must be in"):
        sink_score(a, position=4)


# local_score

def test_local_band_as_wide_as_the_probe_is_refused():
    # The docstring says the width must be less than T: at width == T no query i >= w is left,
    # and the score was the mean of nothing (NaN with a RuntimeWarning), not an error.
    a = xr.DataArray(np.eye(3)[None], dims=("probe", "query", "key"))
    with pytest.raises(ValueError, match="width must be in"):
        local_score(a, width=3)


def test_local_score_default_band_is_three_offsets():
    # The default width is RoleThresholds.local_width's 3. A head 2 back is in a band of 3
    # (offsets 0..2) at every query i >= 3: score 1; in a band of 2 it would score 0.
    a = xr.DataArray(_offset_head(8, 2)[None], dims=("probe", "query", "key"))
    assert local_score(a).item() == 1.0
    assert local_score(a, width=2).item() == 0.0
    # And the band stops at 3: a head 3 back puts all its mass on offset 3 at every query i >= 3,
    # outside offsets 0..2: score 0 (a band of 4 would take it in, score 1).
    b = xr.DataArray(_offset_head(8, 3)[None], dims=("probe", "query", "key"))
    assert local_score(b).item() == 0.0
    assert local_score(b, width=4).item() == 1.0


# role_scores: the slash window

def test_a_slash_window_of_one_offset_is_still_scored():
    # At T = 5 the default window is 2..T // 2 = 2..2, one offset. It must be scored
    # (`slash_min_offset <= max_offset`), not left NaN as an empty window: a head 2 back scores
    # A[i, i - 2] = 1 at queries 2, 3, 4, so slash = 1 at offset 2 and the label is "slash".
    # Offset 2 is not confounded at T = 5: uniform gives (1/3 + 1/4 + 1/5) / 3 = 0.26, a sink 1/3.
    scores = role_scores(_heads(_offset_head(5, 2)), _tokens(5))
    assert scores["slash"].item() == 1.0
    assert scores["slash_offset"].item() == 2
    assert role_names(assign_roles(scores)).item() == "slash"


def test_the_slash_window_attr_is_the_window_used():
    # ds.attrs["slash_max_offset"] records the window the scores were read over: the configured
    # 5 at T = 16, not T // 2 = 8. A head 7 back is outside 2..5: its best offset there is 5,
    # where only query 5 (on key 0 = 5 - 5) scores, 1 / (16 - 5), not offset 7's 1.
    th = RoleThresholds(slash_max_offset=5)
    scores = role_scores(_heads(_offset_head(16, 7)), _tokens(16), th)
    assert scores.attrs["slash_max_offset"] == 5
    assert scores.attrs["slash_min_offset"] == 2
    assert scores["slash"].item() == pytest.approx(1 / 11)
    assert scores["slash_offset"].item() == 5


def test_induction_is_unscored_where_uniform_attention_reaches_its_threshold_exactly():
    # Tokens a a b a: only query 3 has an earlier occurrence (keys k < 3 with tok[k-1] = a:
    # k = 1, 2), so uniform attention scores 2/4 = 0.5 exactly. At an induction threshold of
    # 0.5, chance already reaches it, so induction is NaN (the blank is inclusive, `<`), even
    # for a head that puts all of query 3 on key 2.
    a = _uniform(4)
    a[3] = [0, 0, 1, 0]
    tokens = xr.DataArray([[5, 5, 6, 5]], dims=("probe", "position"))
    th = RoleThresholds(induction=0.5)
    assert np.isnan(role_scores(_heads(a), tokens, th)["induction"].item())
    # just above chance's 0.5 the same head is scored 1
    assert role_scores(_heads(a), tokens, RoleThresholds(induction=0.55))["induction"].item() == 1.0


# assign_roles

def test_an_exact_tie_between_generic_roles_goes_to_local():
    # "Exact ties go to the role that comes first in ROLES": local (index 6) before diffuse (7),
    # among the generic roles too, not only the specific ones.
    s = xr.Dataset({r: ("head", [0.0]) for r in ROLES[:-1]})
    s["local"][:] = 0.9
    s["diffuse"][:] = 0.9
    assert role_names(assign_roles(s)).tolist() == ["local"]


# analyse_run / summary_row

def _run(patterns, tokens=None):
    """One run as open_run gives it: (snapshot, layer=1, head, probe=1, T, T) float16 from
    `patterns` [snapshot][head] of (T, T) arrays, step 0, 10, 20, ..."""
    a = np.array(patterns, dtype=np.float64)[:, None, :, None]
    n_snap, t = a.shape[0], a.shape[-1]
    snap = ("snapshot", "layer", "head")
    tokens = np.arange(t)[None] if tokens is None else np.asarray(tokens)
    return xr.Dataset(
        {"attention": (snap + ("probe", "query", "key"), a.astype(np.float16)),
         "probe_tokens": (("probe", "position"), tokens),
         "importance": (snap, np.ones(a.shape[:3], np.float32))},
        coords={"step": ("snapshot", 10 * np.arange(n_snap))},
    )


def _two_run_sweep(t=6, n_snap=5, b_snaps=4):
    """Two runs as open_sweep pads them: 1 layer, 3 heads (previous-token, uniform, self, at
    every snapshot), 1 probe; run b lacks head 2 and its snapshots from `b_snaps` on (NaN,
    step included)."""
    one = _run([[_offset_head(t, 1), _uniform(t), np.eye(t)]] * n_snap)
    ds = xr.concat([one, one], "run").assign_coords(run=["a", "b"])
    attn = ds.attention.values.copy()
    attn[1, :, :, 2] = np.nan
    attn[1, b_snaps:] = np.nan
    importance = ds.importance.values.copy()
    importance[1, :, :, 2] = np.nan
    importance[1, b_snaps:] = np.nan
    step = np.tile(ds.step.values.astype(np.float64), (2, 1))
    step[1, b_snaps:] = np.nan
    return ds.assign(attention=(ds.attention.dims, attn), importance=(ds.importance.dims, importance),
                     probe_tokens=ds.probe_tokens.isel(run=0, drop=True)).assign_coords(
                         step=(("run", "snapshot"), step))


def test_summary_of_a_run_with_a_padded_head_counts_its_real_heads_flags():
    # summary_row says "undefined" for slash_dominant only when EVERY head's flag is NaN. Run b
    # picked from the sweep has a padded head (NaN flag) beside a previous-token head, which is
    # (0.5, 1)-slash-dominant (slash_score(1) = 1): the count is 1, not "undefined".
    from dynamics.analysis.pipeline import analyse_run, summary_row

    row = summary_row(analyse_run(_two_run_sweep().sel(run="b")).load())
    assert row["slash_dominant"] == 1
    assert row["heads"] == 2


def test_a_curve_with_padding_that_never_leaves_its_band_is_never_not_undefined():
    # Run b picked from the sweep: its two real heads keep one distance at every snapshot, so
    # the divergence curve never leaves its band (bifurcation None, "never"), though the curve
    # is NaN at the padded snapshot 4. "undefined" is only for a curve with no value at all.
    from dynamics.analysis.pipeline import analyse_run, summary_row

    row = summary_row(analyse_run(_two_run_sweep().sel(run="b")).load())
    assert row["bifurcation_step"] is None
    assert row["layer_bifurcation_steps"] == [None]


def test_layer_bifurcation_uses_the_options_baseline():
    # Two heads identical at snapshots 0 and 1 (distance 0), apart from snapshot 2 on (x > 0).
    # With baseline_snapshots = 2 the band is 0 +- 1e-6 and the layer leaves it at snapshot 2,
    # step 20, as the model's curve does. With a baseline of 3 (0, 0, x): mean x/3, sd x/sqrt(3),
    # so x stays within 3 sd: never. The per-layer step must use the options' baseline too.
    from dynamics.analysis.pipeline import AnalysisOptions, analyse_run

    t = 6
    same = [_offset_head(t, 1), _offset_head(t, 1)]
    apart = [_offset_head(t, 1), np.eye(t)]
    out = analyse_run(_run([same, same, apart, apart, apart]), AnalysisOptions(baseline_snapshots=2)).load()
    assert out["bifurcation_step"].item() == 20
    assert out["layer_bifurcation_step"].values.tolist() == [20]


def test_analysis_stores_slash_scores_to_max_offset_and_records_the_dominance_window():
    # AnalysisOptions.max_offset = 16: slash_score holds offsets 0..16 on T = 20 probes (the
    # window T // 2 = 10 is smaller), and attrs["slash_offsets"] is the dominance window
    # [slash_min_offset, T // 2] = [1, 10], not the stored offsets.
    from dynamics.analysis.pipeline import analyse_run

    t = 20
    out = analyse_run(_run([[_offset_head(t, 1)]] * 4))
    assert out["slash_score"]["offset"].values.tolist() == list(range(17))
    assert out.attrs["slash_offsets"] == [1, 10]


def test_token_share_is_nan_not_zero_where_the_token_never_appears():
    # token_share is the mean over the probes that hold the token: with no '/' (47) in the
    # probe tokens (0..5) there is no such probe, so it is undefined (NaN), not a share of 0.
    from dynamics.analysis.pipeline import analyse_run

    out = analyse_run(_run([[_offset_head(6, 1)]] * 4)).load()
    assert out["token_share"].isnull().all()
    assert out["token_ratio"].isnull().all()


# js kernels: blocking

def _js_reference(pa, pb, eps=1e-3):
    """sqrt(mean over (probe, query) of JS) for (P, T, T) patterns, row by row in plain numpy."""
    terms = []
    n_probe, t, _ = pa.shape
    for k in range(n_probe):
        for i in range(t):
            p = pa[k, i, : i + 1] / pa[k, i, : i + 1].sum()
            q = pb[k, i, : i + 1] / pb[k, i, : i + 1].sum()
            p = eps / (i + 1) + (1 - eps) * p
            q = eps / (i + 1) + (1 - eps) * q
            m = (p + q) / 2
            terms.append(0.5 * (p * np.log(p / m)).sum() + 0.5 * (q * np.log(q / m)).sum())
    return np.sqrt(np.mean(terms))


def _random_causal(rng, shape, t):
    logits = rng.normal(size=(*shape, t, t)) * 2
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_divergence_from_init_in_blocks_fills_the_last_partial_block():
    # 5 snapshots against snapshot 0, with block_bytes two snapshots' worth: blocks 0-1, 2-3 and
    # a last partial block of snapshot 4. Every snapshot, the last included, must be its
    # reference distance (the output starts as np.empty: a skipped block is garbage, not NaN).
    from dynamics.analysis.divergence import js_distance

    rng = np.random.default_rng(3)
    p, t = 2, 5
    a = _random_causal(rng, (5, 1, 1, p), t)
    attn = xr.DataArray(a, dims=ATTN_DIMS)
    per_item = p * t * t * 8
    got = js_distance(attn, attn.isel(snapshot=0, drop=True), block_bytes=2 * per_item)
    want = [_js_reference(a[s, 0, 0], a[0, 0, 0]) for s in range(5)]
    np.testing.assert_allclose(got.values.reshape(5), want, rtol=1e-9, atol=1e-12)


def test_head_by_head_distance_in_query_blocks_counts_the_last_partial_block():
    # 2 heads over T = 5 queries, block_bytes sized for 2 queries a block: blocks 0-1, 2-3 and a
    # last partial block of query 4, which sees all 5 keys. The distance is the row-by-row
    # reference, so no query block (nor the last key of a block) may be dropped.
    from dynamics.analysis.divergence import js_distance

    rng = np.random.default_rng(4)
    p, t, n = 2, 5, 2
    a = _random_causal(rng, (1, 1, n, p), t)
    attn = xr.DataArray(a, dims=ATTN_DIMS)
    per_query = n * n * p * t * 8
    got = js_distance(attn, block_bytes=2 * per_query).values.reshape(n, n)
    want = _js_reference(a[0, 0, 0], a[0, 0, 1])
    np.testing.assert_allclose(got, [[0.0, want], [want, 0.0]], rtol=1e-9, atol=1e-12)


# argument checks (batch 2)

def test_diffuse_score_of_one_position_is_refused_in_words():
    # One query sees one key: ln(1) = 0 normalises nothing. The score is refused by name
    # (n < 2), not returned as the NaN mean of an empty set of queries.
    from dynamics.analysis.roles import diffuse_score

    with pytest.raises(ValueError, match="diffuse_score needs at least 2 positions"):
        diffuse_score(xr.DataArray(np.ones((1, 1, 1)), dims=("probe", "query", "key")))


def test_local_band_of_width_0_is_refused():
    # A band of no offsets holds no mass: every head would score 0. Width must be >= 1.
    a = xr.DataArray(np.eye(4)[None], dims=("probe", "query", "key"))
    with pytest.raises(ValueError, match="width must be in"):
        local_score(a, width=0)


def test_sink_position_must_not_be_negative():
    # A negative position would silently read from the end (isel(key=-1) is the last key).
    a = xr.DataArray(_uniform(4)[None], dims=("probe", "query", "key"))
    with pytest.raises(ValueError, match="position must be in"):
        sink_score(a, position=-1)


def test_a_diffuse_threshold_of_0_is_refused():
    # "Every threshold lies in (0, 1]", the last role's too: diffuse = 0 passed every head
    # (entropy >= 0), so no head was ever "none".
    with pytest.raises(ValueError, match="RoleThresholds.diffuse must be in"):
        RoleThresholds(diffuse=0.0)


def test_role_threshold_settings_below_their_range_are_refused():
    with pytest.raises(ValueError, match="local_width must be >= 1"):
        RoleThresholds(local_width=0)
    with pytest.raises(ValueError, match="slash_min_offset must be >= 0"):
        RoleThresholds(slash_min_offset=-1)


def test_near_identical_heads_are_at_distance_0_not_nan():
    # Each JS term is >= 0 in exact arithmetic, but heads one ulp apart sum to about -3e-18 in
    # float64 about one time in five: the root of that is NaN unless the sum is clipped at 0.
    # A distance is in [0, sqrt(ln 2)], never NaN for two real heads.
    from dynamics.analysis.divergence import js_distance

    rng = np.random.default_rng(0)
    t = 8
    a = _random_causal(rng, (1, 1, 20, 1), t)  # 20 heads
    b = a.copy()
    b[..., -1, 0] = np.nextafter(b[..., -1, 0], 1)  # one ulp on one entry
    pair = _heads(*a[0, 0, :, 0], *b[0, 0, :, 0])  # heads 0..19 and their one-ulp twins
    aligned = js_distance(pair.isel(head=slice(0, 20)), pair.isel(head=slice(20, 40)).assign_coords(head=range(20)))
    assert np.isfinite(aligned.values).all() and (aligned.values >= 0).all()
    assert aligned.values.max() < 1e-6
    pairwise = js_distance(pair).values.reshape(40, 40)
    assert np.isfinite(pairwise).all() and (pairwise >= 0).all()
    twins = pairwise[np.arange(20), np.arange(20) + 20]
    assert twins.max() < 1e-6


def test_a_cluster_threshold_of_0_is_refused():
    # A cut at distance 0 joins only identical heads: redundancy would read "none redundant"
    # for any trained model. The options refuse it (> 0), naming the field.
    from dynamics.analysis.pipeline import AnalysisOptions

    with pytest.raises(ValueError, match="cluster_threshold must be > 0"):
        AnalysisOptions(cluster_threshold=0.0)
