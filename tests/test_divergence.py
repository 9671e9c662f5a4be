"""Known-answer and property tests for dynamics.analysis.divergence."""

import ast
import tracemalloc
from pathlib import Path

import dask
import numpy as np
import pytest
import xarray as xr
from scipy.linalg import subspace_angles
from scipy.spatial.distance import jensenshannon

from dynamics.analysis.divergence import (
    divergence_from_init,
    js_distance,
    mean_within_layer_divergence,
    principal_angles,
    qk_cosine,
    within_layer_divergence,
)
from dynamics.analysis.redundancy import attention_correlation


def _refuse(*args, **kwargs):
    raise AssertionError("computed eagerly: the analysers must only build a dask graph")


def no_compute():
    """Any dask computation inside this context fails the test."""
    return dask.config.set(scheduler=_refuse)


ATTN_DIMS = ("snapshot", "layer", "head", "probe", "query", "key")
HW_DIMS = ("snapshot", "layer", "head", "weight", "d_model", "d_head")
BOUND = np.sqrt(np.log(2))


def causal_softmax(logits):
    """Causal attention rows from logits (..., Q, K)."""
    q, k = logits.shape[-2:]
    masked = np.where(np.tril(np.ones((q, k), bool)), logits, -np.inf)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attn_da(a):
    """Wrap (snapshot, layer, head, probe, query, key) with a step coord on snapshot."""
    return xr.DataArray(a, dims=ATTN_DIMS, coords={"step": ("snapshot", 10 * np.arange(a.shape[0]))})


def random_attn(seed=0, shape=(2, 2, 3, 2, 6), scale=3.0):
    s, l, h, p, q = shape
    logits = np.random.default_rng(seed).normal(scale=scale, size=(s, l, h, p, q, q))
    return attn_da(causal_softmax(logits))


def smooth(row, eps):
    n = row.size
    return eps / n + (1 - eps) * row / row.sum()


def reference_distance(pa, pb, eps):
    """sqrt of mean over (probe, query) of scipy's JS divergence (nats) on smoothed rows."""
    values = []
    for p in range(pa.shape[0]):
        for q in range(pa.shape[1]):
            r1, r2 = smooth(pa[p, q, : q + 1], eps), smooth(pb[p, q, : q + 1], eps)
            values.append(jensenshannon(r1, r2) ** 2)
    return np.sqrt(np.mean(values))


def test_identical_heads_zero_and_symmetric_and_bounded():
    attn = random_attn()
    a = attn.values.copy()
    a[:, :, 1] = a[:, :, 0]  # duplicate head
    a[:, 1, 2] = a[:, 0, 0]  # a duplicate across layers
    d = js_distance(attn_da(a))
    assert d.dims == ("snapshot", "layer", "head", "layer_b", "head_b")
    v = d.values
    assert np.all(v[:, :, 0, :, 1] == v[:, :, 1, :, 0])  # symmetric bit for bit
    np.testing.assert_array_equal(v, v.transpose(0, 3, 4, 1, 2))
    assert np.all(v[:, 0, 0, 0, 1] == 0.0)
    assert np.all(v[:, 0, 0, 1, 2] == 0.0)
    flat = v.reshape(2, 6, 6)
    np.testing.assert_array_equal(np.diagonal(flat, axis1=1, axis2=2), 0.0)
    assert np.all((v >= 0) & (v <= BOUND))
    np.testing.assert_array_equal(d["step"].values, attn["step"].values)


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_disjoint_one_hot_rows_reach_the_bound(eps):
    q = 16
    sink = np.zeros((q, q))
    sink[:, 0] = 1.0  # every query attends to key 0
    self_ = np.eye(q)  # every query attends to itself: disjoint from sink for q >= 1
    a = np.stack([sink, self_])[None, None, :, None]  # (1, 1, 2, 1, Q, K)
    d = float(js_distance(attn_da(a), eps=eps)[0, 0, 0, 0, 1])
    n = np.arange(2, q + 1)  # visible keys of queries 1..Q-1; query 0 contributes 0
    hi, lo = 1 - eps + eps / n, eps / n
    per_row = hi * np.log(2 * hi / (hi + lo)) + np.where(lo > 0, lo * np.log(2 * lo / (hi + lo) + (lo == 0)), 0.0)
    expected = np.sqrt(per_row.sum() / q)
    np.testing.assert_allclose(d, expected, rtol=1e-12)
    assert d <= BOUND
    # Nearly the bound once the forced-zero query 0 is discounted.
    assert d**2 * q / (q - 1) > 0.99 * np.log(2)
    if eps == 0.0:
        np.testing.assert_allclose(d, np.sqrt(np.log(2) * (q - 1) / q), rtol=1e-12)


def test_matches_scipy_jensenshannon_reference():
    attn = random_attn(seed=3, shape=(1, 2, 2, 2, 5))
    eps = 1e-3
    d = js_distance(attn, eps=eps).values[0]
    a = attn.values[0]
    for l1 in range(2):
        for h1 in range(2):
            for l2 in range(2):
                for h2 in range(2):
                    ref = reference_distance(a[l1, h1], a[l2, h2], eps)
                    np.testing.assert_allclose(d[l1, h1, l2, h2], ref, rtol=1e-9, atol=1e-12)


def test_float16_input_and_pairwise_equals_aligned_mode():
    attn = random_attn(seed=4).astype(np.float16)
    pair = js_distance(attn)
    # Aligned mode: head 0 of every layer against head 1 of the same layer.
    aligned = js_distance(attn.isel(head=0, drop=True), attn.isel(head=1, drop=True))
    assert aligned.dims == ("snapshot", "layer")
    expected = pair.isel(head=0, head_b=1).values.diagonal(axis1=1, axis2=2)
    np.testing.assert_allclose(aligned.values, expected, rtol=1e-12)
    assert pair.dtype == np.float64


def test_query_blocks_do_not_change_the_answer():
    attn = random_attn(seed=5, shape=(2, 2, 2, 3, 9))
    whole = js_distance(attn)
    blocked = js_distance(attn, block_bytes=1)  # one query per block
    np.testing.assert_allclose(blocked.values, whole.values, rtol=1e-12, atol=1e-15)


def out_of_place_distance(a, b, eps=1e-3):
    """The aligned distance as its formula reads, one full-size temporary per operation."""
    n_key = a.shape[-1]
    mask = np.tril(np.ones((n_key, n_key), bool))

    def smoothed(x):
        x = np.where(mask, x.astype(np.float64), 0.0)
        total = x.sum(-1, keepdims=True)
        x = x / np.where(total > 0, total, 1.0)
        return np.where(mask, eps / np.maximum(mask.sum(-1, keepdims=True), 1) + (1.0 - eps) * x, 0.0)

    def xlogx(x):
        return x * np.log(np.where(x > 0, x, 1.0))

    p, q = smoothed(a), smoothed(b)
    js = (0.5 * (xlogx(p) + xlogx(q)) - xlogx(0.5 * (p + q))).sum(-1).mean((-2, -1))
    return np.sqrt(np.clip(js, 0.0, None))


@pytest.mark.parametrize("block_bytes", [1, 3 * 2 * 8 * 8 * 8, 2 * 3 * 2 * 8 * 8 * 8 + 1, 2**30])
def test_aligned_distance_built_in_place_is_the_formula_bit_for_bit(block_bytes):
    # Blocks of one head, of three heads (across layers), of a snapshot and a bit, and all:
    # the in-place kernel, the first snapshot smoothed once or per block, gives the formula's bits.
    a = random_attn(seed=11, shape=(5, 2, 3, 2, 8)).values.astype(np.float16)
    a[:, 1, 2] = np.nan  # a missing head stays NaN
    attn = attn_da(a)
    got = js_distance(attn, attn.isel(snapshot=0, drop=True), block_bytes=block_bytes).values
    np.testing.assert_array_equal(got, out_of_place_distance(a, a[:1]))
    assert np.isnan(got[:, 1, 2]).all() and (got[0][~np.isnan(got[0])] == 0).all()


def test_aligned_distance_stays_within_its_blocks():
    # One snapshot here is 4 blocks of float64: the kernel took a whole snapshot at a time
    # (the first leading dim's items) and made ~7 temporaries of it, 32 blocks in all, so a
    # chunk of a long-context model went far past block_bytes. Now a few temporaries of at
    # most one block (p, its x ln x, and f(m); the other operand's two).
    attn = random_attn(seed=12, shape=(4, 2, 4, 4, 32)).astype(np.float16)
    first = attn.isel(snapshot=0, drop=True)
    block = 2 * 4 * 32 * 32 * 8  # two heads' maps in float64
    tracemalloc.start()
    try:
        js_distance(attn, first, block_bytes=block).load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # 5.x blocks with numpy 2.3 and later, 6.3 with numpy 2.0 to 2.2 (pyproject's floor), whose
    # ufuncs keep a temporary more: the bound is on the kernel's blocks, not numpy's internals
    assert peak <= 8 * block, f"peak {peak / block:.1f} blocks"


def test_query_key_coords_define_the_causal_mask():
    # A recorder may keep the last queries only; positions come from the coords.
    attn = random_attn(seed=6, shape=(1, 1, 2, 1, 6))
    sub = attn.isel(query=slice(3, None)).assign_coords(query=np.arange(3, 6), key=np.arange(6))
    d = float(js_distance(sub)[0, 0, 0, 0, 1])
    a = sub.values[0, 0]
    vals = [
        jensenshannon(smooth(a[0, 0, i, : q + 1], 1e-3), smooth(a[1, 0, i, : q + 1], 1e-3)) ** 2
        for i, q in enumerate(range(3, 6))
    ]
    np.testing.assert_allclose(d, np.sqrt(np.mean(vals)), rtol=1e-10)


def test_a_cut_without_positions_is_refused_not_misread():
    # isel(query=slice(4, None)) with no coords: query 4 was scored as position 0, seeing key 0
    # alone, and the distances came out plausible and wrong (0.2072 against 0.2686 in an audit)
    attn = random_attn(seed=7, shape=(1, 1, 2, 1, 8))
    cut = attn.isel(query=slice(4, None))
    for f in (js_distance, divergence_from_init, lambda a: attention_correlation(a.isel(snapshot=0))):
        with pytest.raises(ValueError, match="attention has 4 queries but 8 keys and no numeric query/key coordinates"):
            f(cut)
    js_distance(attn)  # whole, square: positions 0..n-1 are right


def test_missing_dims_are_named():
    attn = random_attn()
    with pytest.raises(ValueError, match=r"js_distance: attn_a needs dims .*'layer' missing"):
        js_distance(attn.isel(layer=0))
    with pytest.raises(ValueError, match=r"js_distance: attn_b needs dims .*'key' missing"):
        js_distance(attn, attn.isel(key=0))
    with pytest.raises(ValueError, match=r"divergence_from_init: attn needs dims .*'snapshot' missing"):
        divergence_from_init(attn.isel(snapshot=0))
    with pytest.raises(ValueError, match="must be an xarray DataArray"):
        js_distance(attn.values)


def test_eps_is_validated():
    with pytest.raises(ValueError, match="eps"):
        js_distance(random_attn(), eps=1.5)


def test_within_layer_divergence_known_values():
    # 2 layers x 3 heads; within-layer blocks chosen by hand, cross-layer entries ignored.
    d = np.full((2, 3, 2, 3), 0.7)
    d[0, :, 0, :] = [[0, 0.1, 0.2], [0.1, 0, 0.3], [0.2, 0.3, 0]]
    d[1, :, 1, :] = [[0, 0.4, 0.4], [0.4, 0, 0.4], [0.4, 0.4, 0]]
    jsd = xr.DataArray(d[None], dims=("snapshot", "layer", "head", "layer_b", "head_b"))
    w = within_layer_divergence(jsd)
    assert w.dims == ("snapshot", "layer")
    np.testing.assert_allclose(w.values, [[0.2, 0.4]])
    np.testing.assert_allclose(mean_within_layer_divergence(jsd).values, [0.3])
    # A missing head (NaN, padded sweep) drops out of its layer's mean.
    d2 = d.copy()
    d2[0, 2, :, :] = np.nan
    d2[:, :, 0, 2] = np.nan
    w2 = within_layer_divergence(xr.DataArray(d2, dims=("layer", "head", "layer_b", "head_b")))
    np.testing.assert_allclose(w2.values, [0.1, 0.4])
    # the mean of the layers' means (0.1 over 1 pair, 0.4 over 3): not of all pairs, (0.1 + 3 * 0.4) / 4
    mean2 = mean_within_layer_divergence(xr.DataArray(d2, dims=("layer", "head", "layer_b", "head_b")))
    np.testing.assert_allclose(float(mean2), 0.25)


def test_within_layer_divergence_of_identical_heads_is_zero():
    a = random_attn(seed=7).values.copy()
    a[:, 1] = a[:, 1, :1]  # every head of layer 1 identical
    w = within_layer_divergence(js_distance(attn_da(a)))
    np.testing.assert_array_equal(w.isel(layer=1).values, 0.0)
    assert np.all(w.isel(layer=0).values > 0)


def test_divergence_from_init():
    a = random_attn(seed=8, shape=(3, 1, 2, 2, 5)).values.copy()
    a[:, :, 0] = a[:1, :, 0]  # head 0 never changes
    d = divergence_from_init(attn_da(a))
    assert d.dims == ("snapshot", "layer", "head")
    np.testing.assert_array_equal(d.isel(snapshot=0).values, 0.0)
    np.testing.assert_array_equal(d.isel(head=0).values, 0.0)
    assert np.all(d.isel(snapshot=slice(1, None), head=1).values > 0)
    np.testing.assert_allclose(d.values[2, 0, 1], reference_distance(a[2, 0, 1], a[0, 0, 1], 1e-3), rtol=1e-9)
    np.testing.assert_array_equal(d["step"].values, [0, 10, 20])


def test_dask_input_is_lazy_and_matches_numpy():
    attn = random_attn(seed=9, shape=(4, 2, 2, 2, 5))
    lazy = attn.chunk({"snapshot": 1, "query": 2})
    cases = [
        (js_distance, {}),
        (divergence_from_init, {}),
        (lambda x: within_layer_divergence(js_distance(x)), {}),
        (lambda x: mean_within_layer_divergence(js_distance(x)), {}),
    ]
    for fn, kw in cases:
        with no_compute():
            out = fn(lazy, **kw)
        assert out.chunks is not None, "result should stay lazy"
        np.testing.assert_allclose(out.compute().values, fn(attn, **kw).values, rtol=1e-12, atol=1e-15)


def test_extra_run_dim_with_nan_padded_head():
    r0, r1 = random_attn(seed=10), random_attn(seed=11)
    r1 = r1.where(r1["head"] < 2)  # run 1 has one head fewer: padded with NaN
    sweep = xr.concat([r0, r1], dim="run")
    d = js_distance(sweep)
    assert d.dims == ("run", "snapshot", "layer", "head", "layer_b", "head_b")
    np.testing.assert_allclose(d.isel(run=0).values, js_distance(r0).values, rtol=1e-12)
    assert np.isnan(d.isel(run=1, head=2).values).all()
    assert np.isnan(d.isel(run=1, head_b=2).values).all()
    np.testing.assert_allclose(
        d.isel(run=1, head=[0, 1], head_b=[0, 1]).values,
        js_distance(r1.isel(head=[0, 1])).values,
        rtol=1e-12,
    )
    w = within_layer_divergence(d)
    assert w.dims == ("run", "snapshot", "layer")
    assert np.isfinite(w.values).all()  # the missing head is skipped, not propagated
    np.testing.assert_allclose(w.isel(run=1).values, within_layer_divergence(js_distance(r1.isel(head=[0, 1]))).values)
    fi = divergence_from_init(sweep)
    assert fi.dims == ("run", "snapshot", "layer", "head")
    np.testing.assert_array_equal(fi.isel(snapshot=0, run=0).values, 0.0)


def test_a_head_with_an_all_zero_row_is_nan_not_a_distance():
    # No distribution: smoothed it summed to eps and sat about 0.59 from every real pattern.
    a = random_attn(seed=12)
    values = a.values.copy()
    values[1, 0, 2, 1, 4] = 0.0  # snapshot 1, layer 0, head 2, probe 1, query 4: no mass at all
    zeroed = a.copy(data=values)
    d = js_distance(zeroed)
    bad = dict(snapshot=1, layer=0, head=2)
    assert np.isnan(d.isel(bad).values).all()
    assert np.isnan(d.isel(snapshot=1, layer_b=0, head_b=2).values).all()
    fine = d.isel(snapshot=1, head=[0, 1], head_b=[0, 1])
    np.testing.assert_array_equal(fine.values, js_distance(a).isel(snapshot=1, head=[0, 1], head_b=[0, 1]).values)
    np.testing.assert_array_equal(d.isel(snapshot=0).values, js_distance(a).isel(snapshot=0).values)
    aligned = js_distance(zeroed, a)
    assert np.isnan(float(aligned.isel(bad))) and np.isfinite(aligned.drop_isel(head=2).values).all()
    # a row that sums to 0 through its visible keys alone: mass on hidden keys does not count
    values[1, 0, 2, 1, 4, 5] = 1.0
    assert np.isnan(js_distance(a.copy(data=values)).isel(bad).values).all()


# ----------------------------------------------------------------------------- weights


def head_weights(w):
    """(snapshot, layer, head, weight, d_model, d_head) with the weight coord."""
    return xr.DataArray(w, dims=HW_DIMS, coords={"weight": ["q", "k", "v", "o"]})


def test_principal_angles_identical_and_orthogonal_subspaces():
    rng = np.random.default_rng(0)
    d_model, d_head = 8, 2
    w = rng.normal(size=(1, 1, 3, 4, d_model, d_head))
    basis = np.linalg.qr(rng.normal(size=(d_model, d_model)))[0]
    w[0, 0, 0, 0] = basis[:, :2] @ rng.normal(size=(2, 2))  # span of basis[:, :2]
    w[0, 0, 1, 0] = basis[:, :2] @ rng.normal(size=(2, 2))  # same span, other coordinates
    w[0, 0, 2, 0] = basis[:, 2:4] @ rng.normal(size=(2, 2))  # orthogonal span
    cos = principal_angles(head_weights(w))
    assert cos.dims == ("snapshot", "layer", "head", "head_b")
    c = cos.values[0, 0]
    np.testing.assert_allclose(c, [[1, 1, 0], [1, 1, 0], [0, 0, 1]], atol=1e-12)
    np.testing.assert_allclose(c, c.T, atol=1e-15)


def test_principal_angles_known_angle():
    theta = 0.3
    w = np.zeros((1, 1, 2, 4, 3, 1))
    w[0, 0, 0, 0, :, 0] = [1, 0, 0]
    w[0, 0, 1, 0, :, 0] = [np.cos(theta), np.sin(theta), 0]
    angles = principal_angles(head_weights(w), kind="angles")
    assert angles.dims == ("snapshot", "layer", "head", "head_b", "angle")
    np.testing.assert_allclose(angles.values[0, 0, 0, 1, 0], theta, rtol=1e-10)
    np.testing.assert_allclose(principal_angles(head_weights(w)).values[0, 0, 0, 1], np.cos(theta))
    with pytest.raises(ValueError, match="kind"):
        principal_angles(head_weights(w), kind="bogus")
    with pytest.raises(ValueError, match="weight"):
        principal_angles(head_weights(w), weight="x")


def test_principal_angles_mean_cos_averages_the_cosines():
    # span{e1, e2} and span{e1, e3} share e1 (angle 0) and are otherwise orthogonal (angle pi/2):
    # the mean of the cosines 1 and 0 is 1/2 (their largest would be 1, as for the same subspace).
    w = np.zeros((1, 1, 2, 4, 4, 2))
    w[0, 0, 0, 0] = np.eye(4)[:, [0, 1]]
    w[0, 0, 1, 0] = np.eye(4)[:, [0, 2]]
    np.testing.assert_allclose(principal_angles(head_weights(w)).values[0, 0, 0, 1], 0.5, atol=1e-12)
    np.testing.assert_allclose(principal_angles(head_weights(w), kind="angles").values[0, 0, 0, 1],
                               [0.0, np.pi / 2], atol=1e-7)


def test_principal_angles_match_scipy_on_random_subspaces():
    # Random 3-dim subspaces of R^8 have three distinct principal angles: scipy's
    # subspace_angles (Bjorck & Golub's method, descending) is the independent reference.
    from scipy.linalg import subspace_angles

    rng = np.random.default_rng(7)
    w = rng.normal(size=(1, 1, 3, 4, 8, 3))
    cos = principal_angles(head_weights(w), weight="k").values[0, 0]
    angles = principal_angles(head_weights(w), weight="k", kind="angles").values[0, 0]
    for a in range(3):
        for b in range(3):
            ref = subspace_angles(w[0, 0, a, 1], w[0, 0, b, 1])
            if a != b:
                assert np.ptp(np.cos(ref)) > 0.1  # the cosines differ: mean and max part ways
            np.testing.assert_allclose(cos[a, b], np.cos(ref).mean(), atol=1e-10)
            np.testing.assert_allclose(angles[a, b], np.sort(ref), atol=1e-6)


def test_principal_angles_with_heads_wider_than_the_model():
    # d_head > d_model: reduced QR keeps d_model columns, so there are d_model angles. Dask was
    # told d_head of them and failed at compute ("replacement data must match the Variable's
    # shape"). Every full-rank W spans all of R^d_model: every angle is 0.
    w = head_weights(np.random.default_rng(3).normal(size=(2, 1, 3, 4, 4, 6)))
    eager = principal_angles(w, kind="angles")
    lazy = principal_angles(w.chunk({"snapshot": 1}), kind="angles")
    assert eager.sizes["angle"] == lazy.sizes["angle"] == 4
    np.testing.assert_allclose(lazy.compute().values, eager.values, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(eager.values, 0.0, atol=1e-6)
    np.testing.assert_allclose(principal_angles(w.chunk({"snapshot": 1})).compute().values, 1.0, rtol=1e-12)


def test_qk_cosine_self_negated_scaled_and_reference():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(2, 1, 4, 4, 6, 3))
    w[:, :, 1] = w[:, :, 0]
    w[:, :, 1, 0] *= -1  # negated W_Q
    w[:, :, 2] = w[:, :, 0]
    w[:, :, 2, 1] *= 2.5  # positively scaled W_K: same circuit
    c = qk_cosine(head_weights(w))
    assert c.dims == ("snapshot", "layer", "head", "head_b")
    np.testing.assert_allclose(np.diagonal(c.values, axis1=-2, axis2=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(c.values[:, 0, 0, 1], -1.0, rtol=1e-12)
    np.testing.assert_allclose(c.values[:, 0, 0, 2], 1.0, rtol=1e-12)
    # Direct reference: flatten the d_model x d_model circuits.
    circuits = np.einsum("slhmi,slhni->slhmn", w[:, :, :, 0], w[:, :, :, 1]).reshape(2, 1, 4, -1)
    unit = circuits / np.linalg.norm(circuits, axis=-1, keepdims=True)
    np.testing.assert_allclose(c.values, np.einsum("slhx,slgx->slhg", unit, unit), rtol=1e-10, atol=1e-12)
    # Cosine is scale-free: weights shrunk 100x (squared circuit norms ~1e-6, far below any
    # floor, as a small init_scale gives) give the same cosines as the reference above. A
    # clip of the squared norms at anything above 0 would shrink these towards 0.
    small = qk_cosine(head_weights(w * 1e-2))
    assert (np.einsum("slhx,slhx->slh", circuits, circuits) * 1e-8 < 1e-3).all()
    np.testing.assert_allclose(small.values, np.einsum("slhx,slgx->slhg", unit, unit), rtol=1e-10, atol=1e-12)


def test_weight_metrics_dask_run_dim_and_missing_heads():
    rng = np.random.default_rng(2)
    w = head_weights(rng.normal(size=(3, 2, 3, 4, 6, 2)))
    sweep = xr.concat([w, w.where(w["head"] < 2)], dim="run")  # run 1: head 2 padded
    lazy = sweep.chunk({"snapshot": 1, "d_model": 2})
    for fn in (principal_angles, qk_cosine, lambda x: principal_angles(x, "v", kind="angles")):
        with no_compute():
            out = fn(lazy)
        assert out.chunks is not None
        eager = fn(sweep)
        np.testing.assert_allclose(out.compute().values, eager.values, rtol=1e-10, atol=1e-12)
        assert out.dims[:4] == ("run", "snapshot", "layer", "head")
        np.testing.assert_allclose(eager.isel(run=0).values, fn(w).values, rtol=1e-12)
        assert np.isnan(eager.isel(run=1, head=2).values).all()
        assert np.isfinite(eager.isel(run=1, head=[0, 1], head_b=[0, 1]).values).all()


@pytest.mark.parametrize("narrower", ["d_head", "d_model"])
def test_weight_metrics_of_a_run_padded_to_a_wider_one_are_its_own(narrower):
    # open_sweep pads a narrower run's d_head (a head-count sweep at a fixed d_model) or d_model
    # with NaN in every head: each of its real heads read as missing, NaN throughout
    rng = np.random.default_rng(3)
    w = head_weights(rng.normal(size=(2, 2, 3, 4, 6, 4)))  # (snapshot, layer, head, weight, d_model, d_head)
    own = w.isel({narrower: slice(0, 2)})
    sweep = xr.concat([w, own.pad({narrower: (0, w.sizes[narrower] - 2)})], dim="run")  # run 1: last columns NaN
    for fn in (qk_cosine, principal_angles, lambda x: principal_angles(x, "v", kind="angles")):
        for data in (sweep, sweep.chunk({"snapshot": 1})):
            got = fn(data).compute()
            np.testing.assert_allclose(got.isel(run=0).values, fn(w).values, rtol=1e-12)
            mine = got.isel(run=1)
            if "angle" in got.dims:  # its own min(d_model, d_head) = 2 of them, then NaN
                assert np.isnan(mine.isel(angle=slice(2, None)).values).all()
                mine = mine.isel(angle=slice(0, 2))
            np.testing.assert_allclose(mine.values, fn(own).values, rtol=1e-12)
            assert np.isfinite(mine.values).all()


def test_analysis_modules_import_neither_torch_nor_zarr():
    root = Path(__file__).resolve().parents[1] / "dynamics" / "analysis"
    modules = sorted(root.glob("*.py"))
    assert {"pipeline.py", "roles.py", "slash.py", "chg.py"} <= {m.name for m in modules}
    for module in modules:
        name = module.name
        tree = ast.parse(module.read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
        assert not imported & {"torch", "zarr"}, name


# Known answers that mutants of this module passed: each computed on paper or by a small numpy or
# scipy reference, never by the function under test.
CORE = ("probe", "query", "key")
WEIGHT_DIMS = ("layer", "head", "weight", "d_model", "d_head")


def _two_heads_one_disagreeing_row():
    # (head, probe, query, key): row 0 sees one key (always [1, 0]); row 1 is [1, 0] in head 0
    # and [0, 1] in head 1.
    a = np.zeros((2, 1, 2, 2))
    a[:, 0, 0, 0] = 1.0
    a[0, 0, 1, 0] = 1.0
    a[1, 0, 1, 1] = 1.0
    return a


def _js_two_keys_eps(eps):
    # Row 1 smoothed over n = 2 keys: p' = (1 - eps/2, eps/2), q' reversed, m = (1/2, 1/2);
    # JS = KL(p'||m) (both halves equal). Row 0 contributes 0; mean over 2 queries.
    hi, lo = 1 - eps / 2, eps / 2
    js = sum(x * np.log(x / 0.5) for x in (hi, lo) if x > 0)
    return np.sqrt(js / 2)

def test_eps_of_one_is_in_range_and_makes_every_head_uniform():
    # Pins the closed upper end of eps in [0, 1] (a mutant rejecting eps = 1 survived).
    attn = xr.DataArray(_two_heads_one_disagreeing_row()[None], dims=("layer", "head", *CORE))
    np.testing.assert_allclose(js_distance(attn, eps=1.0).values, 0.0, atol=1e-12)


@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_eps_reaches_every_mode_of_js_distance(eps):
    # eps was dropped (the default 1e-3 used) in the aligned mode and in divergence_from_init
    # without any test failing.
    a = _two_heads_one_disagreeing_row()
    want = _js_two_keys_eps(eps)
    pair = js_distance(xr.DataArray(a[None], dims=("layer", "head", *CORE)), eps=eps)
    np.testing.assert_allclose(float(pair[0, 0, 0, 1]), want, rtol=1e-12)
    h0, h1 = (xr.DataArray(a[i], dims=CORE) for i in (0, 1))
    np.testing.assert_allclose(float(js_distance(h0, h1, eps=eps)), want, rtol=1e-12)
    snaps = xr.DataArray(a[:, None, None], dims=("snapshot", "layer", "head", *CORE))
    np.testing.assert_allclose(divergence_from_init(snaps, eps=eps).values.ravel(), [0.0, want], rtol=1e-12)


def test_mean_within_layer_divergence_skips_a_layer_of_one_head():
    # Docstring: layers without a defined W_l are skipped. A skipna=False mean (NaN for the
    # whole model whenever a padded layer has one head) survived.
    d = np.full((2, 2, 2, 2), np.nan)
    d[0, :, 0, :] = [[0.0, 0.4], [0.4, 0.0]]
    d[1, 0, 1, 0] = 0.0  # layer 1: head 1 missing
    jsd = xr.DataArray(d, dims=("layer", "head", "layer_b", "head_b"))
    assert float(mean_within_layer_divergence(jsd)) == pytest.approx(0.4)


def test_weight_is_selected_by_its_label_not_its_position():
    # With the weight coord in another order, a mutant reading "q" by position compared k.
    w = np.zeros((1, 2, 4, 4, 2))
    w[0, :, 1, :2] = np.eye(2)  # q (label order k, q, v, o): both heads span e0, e1
    w[0, 0, 0, :2] = np.eye(2)  # k: head 0 spans e0, e1 ...
    w[0, 1, 0, 2:] = np.eye(2)  # ... head 1 spans e2, e3: orthogonal
    hw = xr.DataArray(w, dims=WEIGHT_DIMS, coords={"weight": ["k", "q", "v", "o"]})
    np.testing.assert_allclose(principal_angles(hw, "q").values[0], [[1.0, 1.0], [1.0, 1.0]], atol=1e-12)
    np.testing.assert_allclose(principal_angles(hw, "k").values[0], [[1.0, 0.0], [0.0, 1.0]], atol=1e-12)


def test_weight_metrics_of_one_run_picked_from_a_padded_sweep_use_its_own_columns():
    # One run .sel()-ed from a width sweep keeps its NaN d_head column in every head; a
    # mutant taking the whole array when every slice shares one mask made every head missing.
    rng = np.random.default_rng(3)
    real = rng.normal(size=(1, 2, 4, 5, 2))
    padded = np.concatenate([real, np.full((1, 2, 4, 5, 1), np.nan)], axis=-1)
    hw = xr.DataArray(padded, dims=WEIGHT_DIMS, coords={"weight": ["q", "k", "v", "o"]})
    q0, q1 = real[0, 0, 0], real[0, 1, 0]
    want_cos = np.cos(subspace_angles(q0, q1)).mean()
    np.testing.assert_allclose(float(principal_angles(hw, "q")[0, 0, 1]), want_cos, rtol=1e-10)
    c0, c1 = (real[0, h, 0] @ real[0, h, 1].T for h in (0, 1))
    want_qk = (c0 * c1).sum() / np.linalg.norm(c0) / np.linalg.norm(c1)
    np.testing.assert_allclose(float(qk_cosine(hw)[0, 0, 1]), want_qk, rtol=1e-10)


def test_pairwise_outputs_label_their_b_axes_like_the_originals():
    # .sel(head_b=...) on a labelled run needs the labels; dropping them survived.
    attn = xr.DataArray(_two_heads_one_disagreeing_row()[None], dims=("layer", "head", *CORE),
                        coords={"layer": [5], "head": [3, 7]})
    jsd = js_distance(attn)
    assert jsd["head_b"].values.tolist() == [3, 7] and jsd["layer_b"].values.tolist() == [5]
    w = np.random.default_rng(0).normal(size=(1, 2, 4, 4, 2))
    hw = xr.DataArray(w, dims=WEIGHT_DIMS, coords={"weight": ["q", "k", "v", "o"], "head": [3, 7]})
    assert principal_angles(hw)["head_b"].values.tolist() == [3, 7]
    assert qk_cosine(hw)["head_b"].values.tolist() == [3, 7]


def test_lazy_head_by_head_distance_has_its_real_sizes_before_compute():
    # The dask output sizes of layer_b and head_b were swapped without a failure (the lazy
    # test had as many layers as heads).
    a = np.tile(_two_heads_one_disagreeing_row()[:1], (3, 1, 1, 1))  # 3 identical heads
    attn = xr.DataArray(a[None], dims=("layer", "head", *CORE)).chunk({"head": 1})
    out = js_distance(attn)
    assert out.chunks is not None
    assert dict(out.sizes) == {"layer": 1, "head": 3, "layer_b": 1, "head_b": 3}
    np.testing.assert_allclose(out.compute().values, 0.0, atol=1e-12)


def test_attention_correlation_keeps_non_index_head_coords_on_both_sides():
    # _as_b renames coords along the paired dims; without that a head's name coord vanished
    # from the result.
    a = np.tril(np.random.default_rng(0).random((1, 2, 1, 3, 3)))
    attn = xr.DataArray(a, dims=("layer", "head", *CORE), coords={"name": ("head", ["x", "y"])})
    out = attention_correlation(attn)
    assert out["name"].values.tolist() == ["x", "y"] and out["name_b"].values.tolist() == ["x", "y"]
