"""Known-answer tests for dynamics.analysis.redundancy."""

import dask
import numpy as np
import pytest
import xarray as xr
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from dynamics.analysis.divergence import js_distance
from dynamics.analysis.redundancy import (
    attention_correlation,
    cluster_heads,
    cross_seed_consistency,
    linkage_matrix,
    redundancy_fraction,
)


def _refuse(*args, **kwargs):
    raise AssertionError("computed eagerly: the analysers must only build a dask graph")


def no_compute():
    """Any dask computation inside this context fails the test."""
    return dask.config.set(scheduler=_refuse)


ATTN_DIMS = ("snapshot", "layer", "head", "probe", "query", "key")
Q = 8


def prototypes():
    """Four far-apart causal patterns (Q, K): sink, previous token, self, uniform."""
    sink = np.zeros((Q, Q))
    sink[:, 0] = 1
    prev = np.eye(Q, k=-1)
    prev[0, 0] = 1
    uniform = np.tril(np.ones((Q, Q)))
    return np.stack([sink, prev, np.eye(Q), uniform / uniform.sum(-1, keepdims=True)])


# 2 layers x 4 heads; planted groups: sink x3, prev x2, self x2, uniform x1.
PLANTED = np.array([[0, 0, 1, 2], [1, 0, 3, 2]])
PLANTED_SHARE = 7 / 8


def planted_attention(seed=0, n_probe=2, noise=0.005):
    rng = np.random.default_rng(seed)
    base = prototypes()[PLANTED]  # (L, H, Q, K)
    jitter = np.tril(rng.random((2, 4, n_probe, Q, Q)))
    jitter /= jitter.sum(-1, keepdims=True)
    return (1 - noise) * base[:, :, None] + noise * jitter  # near-identical copies


def same_partition(labels, planted):
    a, b = labels.ravel(), planted.ravel()
    return np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :])


def attn_da(a):
    return xr.DataArray(a, dims=ATTN_DIMS, coords={"step": ("snapshot", 100 * np.arange(a.shape[0]))})


def two_snapshots():
    """Snapshot 0: every head uniform (one cluster); snapshot 1: the planted groups."""
    early = np.broadcast_to(prototypes()[3], (2, 4, 2, Q, Q))
    return attn_da(np.stack([early, planted_attention()]))


def _heads(d):
    """A (3, 3) distance matrix as the (layer, head, layer_b, head_b) of one layer of 3 heads."""
    d = np.asarray(d, float)[None, :, None, :]
    return xr.DataArray(d, dims=("layer", "head", "layer_b", "head_b"))


def test_clusters_are_cut_by_average_linkage_at_the_threshold():
    # 0-1 and 1-2 at 0.08: single linkage chains all three; average linkage puts 2 at
    # (0.2 + 0.08) / 2 = 0.14 from {0, 1}, past the 0.1 cut (README: "average-linkage").
    chain = _heads([[0, 0.08, 0.2], [0.08, 0, 0.08], [0.2, 0.08, 0]])
    assert cluster_heads(chain).values.ravel().tolist() == [0, 0, 1]
    # so the fraction counts heads in a cluster of 2 or more, not heads with another within 0.1
    # (README's example): head 2, 0.08 from head 1, is alone
    assert float(redundancy_fraction(cluster_heads(chain))) == pytest.approx(2 / 3)
    assert cluster_heads(chain, method="single").values.ravel().tolist() == [0, 0, 0]
    # the cut is at 0.1 exactly: a pair at 0.12 is two heads, at 0.09 one
    for pair, want in ((0.12, [0, 1, 2]), (0.09, [0, 0, 1])):
        d = _heads([[0, pair, 0.8], [pair, 0, 0.8], [0.8, 0.8, 0]])
        assert cluster_heads(d).values.ravel().tolist() == want, pair


def test_snapshots_whose_heads_are_all_apart_take_no_linkage_and_give_its_labels(monkeypatch):
    # cluster_heads answers "every head its own cluster" without scipy where every pair of
    # present heads is farther apart than the cut; each snapshot must get what the per-snapshot
    # linkage gives, at the cut, near it, with ties and missing heads.
    from dynamics.analysis import redundancy
    from dynamics.analysis.redundancy import _cluster_all, _cluster_one

    # A spy on the per-snapshot linkage (our own function, still run): which snapshots took it
    linked: list[np.ndarray] = []

    def counted(x, threshold, method):
        linked.append(x.copy())
        return _cluster_one(x, threshold, method)

    monkeypatch.setattr(redundancy, "_cluster_one", counted)

    def needs_linkage(x, threshold):
        # by the definition, head by head: some pair of present heads not farther apart than the
        # cut (a NaN distance between them included)
        x = x.reshape(L * H, L * H)
        present = [i for i in range(L * H) if not np.isnan(x[i, i])]
        return any(not 0.5 * (x[i, j] + x[j, i]) > threshold for i in present for j in present if i != j)

    rng = np.random.default_rng(7)
    B, L, H = 400, 2, 3
    d = rng.uniform(0.0, 0.3, size=(B, L, H, L, H))
    d = 0.5 * (d + d.transpose(0, 3, 4, 1, 2))
    d[:, np.arange(L)[:, None], np.arange(H), np.arange(L)[:, None], np.arange(H)] = 0.0
    d[::7] = np.round(d[::7], 1)  # ties, and distances exactly at the cut 0.1
    d[1::9] += 0.1  # most pairs apart
    d[2::11, 0, 1] = np.nan  # a missing head
    d[2::11, :, :, 0, 1] = np.nan
    for method in ("average", "single", "complete", "weighted"):
        for threshold in (0.0, 0.1, 0.15):
            linked.clear()
            got = _cluster_all(d, threshold, method)
            want = np.stack([_cluster_one(x, threshold, method) for x in d])
            assert np.array_equal(got, want), (method, threshold)
            # the linkage ran for exactly the snapshots with a pair within the cut, in order
            close = [b for b in range(B) if needs_linkage(d[b], threshold)]
            assert 0 < len(close) < B, threshold  # both kinds are here
            assert len(linked) == len(close), (method, threshold)
            assert all(np.array_equal(x, d[b], equal_nan=True) for x, b in zip(linked, close, strict=True)), (method, threshold)
    far = np.full((2, L, H, L, H), 0.5)  # every pair apart: each head alone, in head order
    far[1, 0, 1] = far[1, :, :, 0, 1] = np.nan  # head (0, 1) missing: -1, and the others close up
    linked.clear()
    assert _cluster_all(far, 0.1, "average").tolist() == [[[0, 1, 2], [3, 4, 5]], [[0, -1, 1], [2, 3, 4]]]
    assert linked == []  # both snapshots all apart: no linkage
    near = far.copy()
    near[0, 0, 0, 0, 1] = near[0, 0, 1, 0, 0] = 0.05  # heads (0, 0) and (0, 1) within the cut
    assert _cluster_all(near, 0.1, "average").tolist() == [[[0, 0, 1], [2, 3, 4]], [[0, -1, 1], [2, 3, 4]]]
    assert len(linked) == 1 and np.array_equal(linked[0], near[0])  # snapshot 0 alone
    # a NaN distance between two present heads is never "apart": scipy refuses it, as before
    bad = far[:1].copy()
    bad[0, 1, 2, 0, 0] = np.nan
    with pytest.raises(ValueError, match="must contain only finite values"):
        _cluster_all(bad, 0.1, "average")


def test_planted_clusters_are_recovered():
    jsd = js_distance(two_snapshots())
    planted = jsd.isel(snapshot=1).values.reshape(8, 8)
    same = PLANTED.ravel()[:, None] == PLANTED.ravel()[None, :]
    assert planted[same].max() < 0.1 < planted[~same].min()  # the construction is as intended
    labels = cluster_heads(jsd)
    assert labels.dims == ("snapshot", "layer", "head")
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels.isel(snapshot=0).values, 0)
    lab1 = labels.isel(snapshot=1).values
    assert same_partition(lab1, PLANTED)
    np.testing.assert_array_equal(lab1, [[0, 0, 1, 2], [1, 0, 3, 2]])  # first-appearance numbering
    frac = redundancy_fraction(labels)
    assert frac.dims == ("snapshot",)
    np.testing.assert_allclose(frac.values, [1.0, PLANTED_SHARE])
    np.testing.assert_array_equal(frac["step"].values, [0, 100])


def test_threshold_and_method():
    jsd = js_distance(two_snapshots()).isel(snapshot=1)
    np.testing.assert_array_equal(cluster_heads(jsd, threshold=0.0).values.ravel(), np.arange(8))
    assert float(redundancy_fraction(cluster_heads(jsd, threshold=0.0))) == 0.0
    assert (cluster_heads(jsd, threshold=1.0).values == 0).all()
    assert same_partition(cluster_heads(jsd, method="complete").values, PLANTED)
    with pytest.raises(ValueError, match="method"):
        cluster_heads(jsd, method="ward")
    for bad in (-1.0, float("nan")):  # a negative cut merged nothing, without a word
        with pytest.raises(ValueError, match="threshold must be >= 0"):
            cluster_heads(jsd, threshold=bad)
    with pytest.raises(ValueError, match=r"cluster_heads: jsd needs dims .* 'layer_b', 'head_b' missing"):
        cluster_heads(jsd.isel(layer_b=0, head_b=0))


def test_redundancy_fraction_known_values_and_missing_heads():
    lab = xr.DataArray([[[0, 0, 1, 2]], [[0, 1, 2, 3]], [[5, 5, 5, -1]]], dims=("snapshot", "layer", "head"))
    np.testing.assert_allclose(redundancy_fraction(lab).values, [0.5, 0.0, 1.0])


def test_redundancy_fraction_is_undefined_without_a_pair_of_heads():
    # One head (a one-layer, one-head model, or a sweep's run with one head left) has no other
    # head to be redundant with: it read 0.00, "every head unique", in the analyse table.
    lab = xr.DataArray([[[0, -1]], [[-1, -1]], [[0, 0]]], dims=("snapshot", "layer", "head"))
    np.testing.assert_allclose(redundancy_fraction(lab).values, [np.nan, np.nan, 1.0])
    one = js_distance(two_snapshots().isel(layer=[0], head=[0]))
    assert np.isnan(redundancy_fraction(cluster_heads(one))).all()


def test_clustering_lazy_run_dim_and_missing_heads():
    attn = two_snapshots()
    padded = attn.where(~((attn["layer"] == 1) & (attn["head"] == 2)))  # run 1 lacks head (1, 2)
    sweep = xr.concat([attn, padded], dim="run")
    with no_compute():
        jsd = js_distance(sweep.chunk({"snapshot": 1}))
        labels = cluster_heads(jsd)
        frac = redundancy_fraction(labels)
    assert labels.chunks is not None
    assert frac.dims == ("run", "snapshot") and frac.chunks is not None
    lab = labels.compute().values
    eager = cluster_heads(js_distance(sweep)).values
    np.testing.assert_array_equal(lab, eager)
    assert lab[1, 1, 1, 2] == -1
    keep = np.ones((2, 4), bool)
    keep[1, 2] = False
    assert same_partition(lab[1, 1][keep], PLANTED[keep])
    # Run 1: the lone uniform head is gone, so all 7 remaining heads are redundant.
    np.testing.assert_allclose(frac.compute().values, [[1.0, PLANTED_SHARE], [1.0, 1.0]])


def test_linkage_matrix_matches_cluster_heads():
    jsd = js_distance(two_snapshots()).isel(snapshot=1)
    z = linkage_matrix(jsd)
    assert z.shape == (7, 4)
    assert np.all(np.diff(z[:, 2]) >= 0)
    assert same_partition(fcluster(z, t=0.1, criterion="distance"), PLANTED)
    np.testing.assert_allclose(linkage_matrix(jsd.values.reshape(8, 8)), z)
    with_missing = jsd.where(
        ~((jsd["layer"] == 1) & (jsd["head"] == 2)) & ~((jsd["layer_b"] == 1) & (jsd["head_b"] == 2))
    )
    assert linkage_matrix(with_missing).shape == (6, 4)
    with pytest.raises(ValueError, match="one snapshot"):
        linkage_matrix(js_distance(two_snapshots()))


def test_attention_correlation_identical_heads_and_reference():
    rng = np.random.default_rng(0)
    a = np.tril(rng.random((1, 2, 3, 2, 5, 5)))
    a /= a.sum(-1, keepdims=True)
    a[:, 1, 0] = a[:, 0, 2]  # identical heads across layers
    r = attention_correlation(attn_da(a))
    assert r.dims == ("snapshot", "layer", "head", "layer_b", "head_b")
    v = r.values[0]
    assert v[0, 2, 1, 0] == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(np.diagonal(v.reshape(6, 6)), 1.0, rtol=1e-12)
    np.testing.assert_allclose(v, v.transpose(2, 3, 0, 1), rtol=1e-12)
    causal = np.tril(np.ones((5, 5), bool))
    flat = a[0][..., causal].reshape(6, -1)  # (heads, probe * causal entries)
    np.testing.assert_allclose(v.reshape(6, 6), np.corrcoef(flat), rtol=1e-10, atol=1e-12)


def test_attention_correlation_lazy_and_run_dim():
    attn = two_snapshots()
    sweep = xr.concat([attn, attn.where(attn["head"] < 3)], dim="run")
    eager = attention_correlation(sweep)
    with no_compute():
        lazy = attention_correlation(sweep.chunk({"snapshot": 1, "query": 4}))
    assert lazy.chunks is not None
    assert eager.dims == ("run", "snapshot", "layer", "head", "layer_b", "head_b")
    np.testing.assert_allclose(lazy.compute().values, eager.values, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(eager.isel(run=0).values, attention_correlation(attn).values)
    assert np.isnan(eager.isel(run=1, head=3).values).all()
    assert np.isfinite(eager.isel(run=1, snapshot=1, head=[0, 1, 2], head_b=[0, 1, 2]).values).all()


# ----------------------------------------------------------------------------- seeds


def planted_profiles(seed=0, n_layer=2, n_head=4, n_feature=5):
    """Run 0 random; run 1 = run 0 with each layer's heads permuted (same config 'a');
    run 2 unrelated (config 'b', alone)."""
    rng = np.random.default_rng(seed)
    base = rng.random((n_layer, n_head, n_feature))
    perms = np.stack([rng.permutation(n_head) for _ in range(n_layer)])
    permuted = np.take_along_axis(base, perms[:, :, None], axis=1)  # run1[l, h] = run0[l, perm[l, h]]
    other = rng.random((n_layer, n_head, n_feature))
    prof = xr.DataArray(
        np.stack([base, 2.0 * permuted, other]),  # a scale change must not matter
        dims=("run", "layer", "head", "feature"),
        coords={"run": ["r0", "r1", "r2"], "config": ("run", ["a", "a", "b"])},
    )
    return prof, perms


def test_cross_seed_consistency_recovers_planted_permutation():
    prof, perms = planted_profiles()
    out = cross_seed_consistency(prof, prof["config"])
    assert out.similarity.dims == ("group",)
    np.testing.assert_allclose(out.similarity.sel(group="a"), 1.0, rtol=1e-12)
    assert np.isnan(out.similarity.sel(group="b"))  # one run: no pair
    assert out.match.dims == ("pair", "layer", "head")
    assert out.run_a.values.tolist() == ["r0"] and out.run_b.values.tolist() == ["r1"]
    # run0 head h is run1 head inv[h], where run1[l, k] = run0[l, perms[l, k]].
    inverse = np.argsort(perms, axis=1)
    np.testing.assert_array_equal(out.match.isel(pair=0).values, inverse)
    np.testing.assert_allclose(out.matched_similarity.values, 1.0, rtol=1e-12)
    by_name = cross_seed_consistency(prof, "config")
    xr.testing.assert_identical(by_name, out)


def test_unmatched_similarity_is_the_all_pairs_reference():
    # One-hot profiles: a head's cosine is 1 with its match and 0 with the other two heads, so
    # the unmatched mean over the 3 x 3 pairs is 1/3 while the matched figure is 1.
    f = np.eye(3)[None, None]  # (run, layer, head, feature)
    prof = xr.DataArray(np.concatenate([f, f[:, :, [2, 0, 1]]]), dims=("run", "layer", "head", "feature"))
    out = cross_seed_consistency(prof, ["cfg", "cfg"])
    assert out.similarity.item() == pytest.approx(1.0)
    assert out.unmatched_similarity.item() == pytest.approx(1 / 3)
    # Identical non-negative profiles in every head: matching cannot tell the seeds' heads apart,
    # and the reference says so by reaching the matched figure.
    flat = xr.DataArray(np.ones((2, 2, 3, 4)), dims=("run", "layer", "head", "feature"))
    same = cross_seed_consistency(flat, ["cfg", "cfg"])
    assert same.similarity.item() == pytest.approx(1.0) and same.unmatched_similarity.item() == pytest.approx(1.0)
    # Random non-negative profiles of unrelated seeds: matching lifts the figure above the reference.
    rng = np.random.default_rng(0)
    noise = xr.DataArray(rng.random((3, 2, 6, 8)), dims=("run", "layer", "head", "feature"))
    rand = cross_seed_consistency(noise, ["cfg"] * 3)
    assert 0.5 < rand.unmatched_similarity.item() < rand.similarity.item() < 1.0


def test_cross_seed_consistency_three_seeds_partial_similarity_and_missing_heads():
    rng = np.random.default_rng(1)
    base = rng.random((2, 4, 5))
    base[0, 3] = np.nan  # a padded head: the same slot in every run of the config
    perms = [np.array([[2, 0, 1, 3], [3, 1, 0, 2]]), np.array([[1, 2, 0, 3], [0, 3, 2, 1]])]
    runs = [base] + [np.take_along_axis(base, p[:, :, None], axis=1) for p in perms]
    three = xr.DataArray(np.stack(runs), dims=("run", "layer", "head", "feature"), coords={"run": ["s0", "s1", "s2"]})
    out = cross_seed_consistency(three, ["a", "a", "a"])
    assert out.sizes["pair"] == 3
    np.testing.assert_allclose(out.similarity.values, [1.0], rtol=1e-12)
    np.testing.assert_allclose(out.pair_similarity.values, 1.0, rtol=1e-12)
    np.testing.assert_array_equal(out.match.sel(layer=0, head=3).values, -1)
    assert (out.match.sel(layer=0).values[:, :3] >= 0).all()
    assert np.isnan(out.matched_similarity.sel(layer=0, head=3).values).all()
    np.testing.assert_array_equal(out.match.values[0], np.where(base[:, :, 0] >= 0, np.argsort(perms[0], axis=1), -1))

    prof, _ = planted_profiles(seed=1)
    other = prof.copy(data=np.random.default_rng(2).random(prof.shape))  # unrelated seeds
    s = cross_seed_consistency(other, ["a", "a", "a"]).similarity.item()
    assert 0.0 < s < 1.0


def test_cross_seed_consistency_averages_over_heads_and_over_pairs():
    # Seeds s0 and s2 grow heads (1, 0) and (0, 1); s1 grows (1, 0) and (1, 1). Matching s0 (or s2)
    # with s1 pairs (1, 0) with (1, 0), cosine 1, and (0, 1) with (1, 1), cosine 1/sqrt(2) (the
    # swap would sum to 1/sqrt(2) + 0): S = (1 + 1/sqrt(2)) / 2 = 0.854 for those pairs, 1 for
    # (s0, s2), and the config's consistency is the mean over its three pairs, (2 + 1/sqrt(2)) / 3.
    a = np.array([[[1.0, 0.0], [0.0, 1.0]]])  # (layer, head, feature)
    b = np.array([[[1.0, 0.0], [1.0, 1.0]]])
    prof = xr.DataArray(np.stack([a, b, a]), dims=("run", "layer", "head", "feature"),
                        coords={"run": ["s0", "s1", "s2"]})
    out = cross_seed_consistency(prof, ["cfg"] * 3)
    r = 1 / np.sqrt(2)
    assert list(zip(out.run_a.values, out.run_b.values, strict=True)) == [("s0", "s1"), ("s0", "s2"), ("s1", "s2")]
    np.testing.assert_allclose(out.matched_similarity.values[:, 0], [[1, r], [1, 1], [1, r]], rtol=1e-12)
    np.testing.assert_allclose(out.pair_similarity.values, [(1 + r) / 2, 1, (1 + r) / 2], rtol=1e-12)
    np.testing.assert_allclose(out.similarity.item(), (2 + r) / 3, rtol=1e-12)
    # the unmatched reference: s0 against s1's heads, cosines 1, r, 0, r; s0 against s2, 1, 0, 0, 1
    np.testing.assert_allclose(out.unmatched_similarity.item(), ((1 + 2 * r) / 4 * 2 + 1 / 2) / 3, rtol=1e-12)


def test_cross_seed_consistency_counts_a_nan_feature_of_a_present_head_as_zero():
    # Feature 2 is NaN for every head (a score the probes could not give, as the token share on
    # a task without the token); the heads exist, so they are matched on the other features.
    f = np.array([[[1.0, 0.0, np.nan], [0.0, 1.0, np.nan]]])  # (layer, head, feature)
    prof = xr.DataArray(np.stack([f, f[:, ::-1]]), dims=("run", "layer", "head", "feature"))
    out = cross_seed_consistency(prof, ["cfg", "cfg"])
    assert out.similarity.item() == 1.0
    assert out.unmatched_similarity.item() == 0.5
    assert out.match.values.ravel().tolist() == [1, 0]


def test_cross_seed_consistency_lazy_and_validates():
    prof, _ = planted_profiles(seed=3)
    snaps = xr.concat([prof, prof], dim="snapshot")  # an extra leading dim
    eager = cross_seed_consistency(snaps, "config")
    with no_compute():
        # Group labels are metadata, passed in memory; the profiles stay lazy.
        lazy = cross_seed_consistency(snaps.chunk({"snapshot": 1}), ["a", "a", "b"])
    assert lazy.similarity.chunks is not None
    xr.testing.assert_allclose(lazy.compute(), eager)
    np.testing.assert_allclose(eager.similarity.sel(group="a").values, [1.0, 1.0], rtol=1e-12)
    with pytest.raises(ValueError, match="run_group"):
        cross_seed_consistency(prof, ["a", "a"])


def test_cross_seed_consistency_matches_a_labelled_run_group_by_run_not_by_position():
    # Read by position, labels in another run order paired r0 with r2 (0.577) instead of r1 (1.0).
    e = np.eye(3)
    runs = ["r0", "r1", "r2"]
    prof = xr.DataArray(np.stack([e, e[[2, 0, 1]], np.ones((3, 3))])[:, None],
                        dims=("run", "layer", "head", "feature"), coords={"run": runs})
    in_order = xr.DataArray(["A", "A", "B"], dims="run", coords={"run": runs})
    shuffled = in_order.isel(run=[1, 2, 0])
    for group in (in_order, shuffled, ["A", "A", "B"]):
        out = cross_seed_consistency(prof, group)
        assert list(zip(out.run_a.values, out.run_b.values, strict=True)) == [("r0", "r1")]
        assert float(out.similarity.sel(group="A")) == pytest.approx(1.0, abs=1e-12)
    for other in (in_order.assign_coords(run=["r0", "r1", "x"]), in_order.isel(run=[0, 1])):
        with pytest.raises(ValueError, match=r"^run_group's run labels \['r0', 'r1'"):
            cross_seed_consistency(prof, other)


# Known answers that mutants of this module passed: each computed on paper or by a small numpy or
# scipy reference, never by the function under test.
CORE = ("probe", "query", "key")


def _profiles(a, b):
    return xr.DataArray(np.array([a, b], float)[:, None], dims=("run", "layer", "head", "feature"))


def test_a_present_head_is_never_matched_to_a_missing_one():
    # Run b has one head (head 1 padded). a1 = b0 (cos 1); a0 is left over and must be -1,
    # not b's padding.
    out = cross_seed_consistency(_profiles([[1, 0], [0, 1]], [[0, 1], [np.nan, np.nan]]), ["g", "g"])
    assert out.match.values.ravel().tolist() == [-1, 0]
    sim = out.matched_similarity.values.ravel()
    assert np.isnan(sim[0]) and sim[1] == pytest.approx(1.0)


def test_a_missing_head_of_run_a_is_matched_to_nothing():
    out = cross_seed_consistency(_profiles([[1, 0], [np.nan, np.nan]], [[0, 1], [1, 0]]), ["g", "g"])
    assert out.match.values.ravel().tolist() == [1, -1]


def test_an_all_zero_profile_has_cosine_zero_not_missing():
    # Docstring: an all-zero profile has cosine 0 with everything; it is a present head.
    out = cross_seed_consistency(_profiles([[1, 0], [0, 0]], [[1, 0], [0, 0]]), ["g", "g"])
    assert out.matched_similarity.values.ravel().tolist() == pytest.approx([1.0, 0.0])
    assert float(out.similarity.sel(group="g")) == pytest.approx(0.5)


def test_group_similarity_leaves_out_pairs_with_no_present_head():
    # Run c is all padding: pairs (a, c), (b, c) have no similarity and must not count as 0.
    f = [[1, 0], [0, 1]]
    prof = xr.DataArray(np.array([f, f, np.full((2, 2), np.nan)])[:, None], dims=("run", "layer", "head", "feature"))
    out = cross_seed_consistency(prof, ["g", "g", "g"])
    assert float(out.similarity.sel(group="g")) == pytest.approx(1.0)
    assert float(out.unmatched_similarity.sel(group="g")) == pytest.approx(0.5)


def test_unmatched_similarity_leaves_out_missing_heads():
    # cos(a_h, b_h') over present pairs: a0.b0 = 1, a1.b0 = 0 -> 0.5 (b1 padded).
    out = cross_seed_consistency(_profiles([[1, 0], [0, 1]], [[1, 0], [np.nan, np.nan]]), ["g", "g"])
    assert float(out.unmatched_similarity.sel(group="g")) == pytest.approx(0.5)


def test_cross_seed_consistency_with_heads_in_several_dask_chunks():
    # The per-layer (head, head_b) cosine matrix must be one chunk for apply_ufunc.
    prof = _profiles([[1, 0], [0, 1]], [[0, 1], [1, 0]]).chunk({"head": 1})
    out = cross_seed_consistency(prof, ["g", "g"]).compute()
    assert out.match.values.ravel().tolist() == [1, 0]


def test_cluster_heads_with_heads_in_several_dask_chunks():
    d = np.array([[0, 0.01, 0.8], [0.01, 0, 0.8], [0.8, 0.8, 0]]).reshape(1, 3, 1, 3)
    jsd = xr.DataArray(d, dims=("layer", "head", "layer_b", "head_b")).chunk({"head": 1, "head_b": 1})
    assert cluster_heads(jsd).compute().values.tolist() == [[0, 0, 1]]


def test_attention_correlation_can_be_negative():
    # r lies in [-1, 1]; a clip to [0, 1] survived. Causal entries (0,0), (1,0), (1,1).
    a = np.zeros((1, 2, 1, 2, 2))
    a[0, :, 0, 0, 0] = 1.0
    a[0, 0, 0, 1] = [0.9, 0.1]
    a[0, 1, 0, 1] = [0.1, 0.9]
    want = np.corrcoef([1.0, 0.9, 0.1], [1.0, 0.1, 0.9])[0, 1]
    out = attention_correlation(xr.DataArray(a, dims=("layer", "head", *CORE)))
    assert want < 0
    np.testing.assert_allclose(float(out[0, 0, 0, 1]), want, rtol=1e-12)


def test_attention_correlation_of_float16_attention_is_float64():
    # Attention is stored as float16; the sums must not run (or come back) in float16.
    rng = np.random.default_rng(1)
    a = np.tril(rng.random((1, 2, 3, 16, 16))).astype(np.float16)
    out = attention_correlation(xr.DataArray(a, dims=("layer", "head", *CORE)))
    mask = np.tril(np.ones((16, 16), bool))
    x0, x1 = (a[0, h][:, mask].astype(np.float64).ravel() for h in (0, 1))
    assert out.dtype == np.float64
    np.testing.assert_allclose(float(out[0, 0, 0, 1]), np.corrcoef(x0, x1)[0, 1], rtol=1e-10)


def _four_head_distances():
    d = np.array([[0, .2, .9, .8], [.2, 0, .7, .9], [.9, .7, 0, .3], [.8, .9, .3, 0]])
    return d, d.reshape(2, 2, 2, 2)  # (L, H, L, H), layer-major


def test_linkage_matrix_reads_a_dataarray_in_any_dim_order():
    d, d4 = _four_head_distances()
    da = xr.DataArray(d4, dims=("layer", "head", "layer_b", "head_b")).transpose("layer", "layer_b", "head", "head_b")
    np.testing.assert_allclose(linkage_matrix(da), linkage(squareform(d), method="average"))


def test_linkage_matrix_squeezes_a_snapshot_dim_of_one():
    d, d4 = _four_head_distances()
    da = xr.DataArray(d4[None], dims=("snapshot", "layer", "head", "layer_b", "head_b"))
    np.testing.assert_allclose(linkage_matrix(da), linkage(squareform(d), method="average"))


def test_linkage_matrix_with_one_present_head_names_the_problem():
    d = np.array([[0.0, np.nan], [np.nan, np.nan]])
    with pytest.raises(ValueError, match="at least 2 non-missing heads"):
        linkage_matrix(d)
