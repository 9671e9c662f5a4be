"""Slash scores, token dominance and emergence on constructed attention with known answers."""

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

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

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

DIMS = ("snapshot", "layer", "head", "probe", "query", "key")
SLASH = 47


def as_attention(a, steps=None):
    """Wrap (snapshot, layer, head, probe, query, key) values, with a step coordinate."""
    steps = np.arange(a.shape[0]) * 100 if steps is None else steps
    return xr.DataArray(a, dims=DIMS, coords={"step": ("snapshot", steps)})


def uniform(t):
    return np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]


def diagonal(t, delta):
    """A pure diagonal: A[i, i - delta] = 1, rows i < delta empty."""
    return np.eye(t, k=-delta)


def random_causal(rng, shape, t):
    logits = rng.normal(size=(*shape, t, t)) * 2
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def raise_on_compute(*args, **kwargs):
    raise RuntimeError("computed a dask graph while building it")


# --- slash_score -------------------------------------------------------------------------


def test_pure_offset_diagonal_scores_one_at_its_offset_only():
    t = 10
    attn = as_attention(np.broadcast_to(diagonal(t, 3), (2, 1, 1, 4, t, t)).copy())
    s = slash_score(attn)
    assert s.dims == ("snapshot", "layer", "head", "offset")
    assert s["offset"].values.tolist() == list(range(t))
    expected = np.zeros(t)
    expected[3] = 1
    np.testing.assert_allclose(s.values[0, 0, 0], expected)
    offset, score = best_offset(s)
    assert offset.dims == score.dims == ("snapshot", "layer", "head")
    assert (offset == 3).all() and np.allclose(score, 1)
    assert "step" in s.coords


def test_uniform_causal_attention_matches_closed_form():
    t = 12
    attn = as_attention(uniform(t)[None, None, None, None])
    s = slash_score(attn).values.ravel()
    expected = [np.mean(1 / (np.arange(d, t) + 1)) for d in range(t)]
    np.testing.assert_allclose(s, expected, rtol=1e-6)
    # float16 storage: same within float16 rounding.
    s16 = slash_score(attn.astype(np.float16)).values.ravel()
    np.testing.assert_allclose(s16, expected, atol=1e-3)


def test_slash_score_is_mean_over_probes_and_queries_against_a_loop():
    rng = np.random.default_rng(0)
    t = 7
    a = random_causal(rng, (1, 2, 3, 5), t)
    s = slash_score(as_attention(a), max_offset=4)
    ref = np.zeros((1, 2, 3, 5))
    for d in range(5):
        ref[..., d] = np.mean([[a[..., p, i, i - d] for i in range(d, t)] for p in range(5)], axis=(0, 1))
    np.testing.assert_allclose(s.values, ref, rtol=1e-6)
    assert ((s >= 0) & (s <= 1)).all()


def test_max_offset_validation():
    attn = as_attention(uniform(5)[None, None, None, None])
    assert slash_score(attn, max_offset=0).sizes["offset"] == 1
    with pytest.raises(ValueError, match="max_offset"):
        slash_score(attn, max_offset=5)
    with pytest.raises(ValueError, match="key"):
        slash_score(attn.isel(key=slice(0, 4)))


def test_best_offset_window_and_ties():
    s = xr.DataArray([0.9, 0.1, 0.6, 0.6, 0.2], dims="offset", coords={"offset": range(5)})
    assert best_offset(s)[0].item() == 2  # from offset 1 by default: 0 is the self diagonal
    assert best_offset(s, min_offset=0)[0].item() == 0
    offset, score = best_offset(s, min_offset=2)
    assert offset.item() == 2 and score.item() == 0.6  # tie -> smaller offset
    assert best_offset(s, min_offset=3, max_offset=4)[0].item() == 3
    with pytest.raises(ValueError, match="no offsets"):
        best_offset(s, min_offset=7)


def test_slash_dominant():
    t = 10
    sink = np.zeros((t, t))
    sink[:, 0] = 1
    a = np.stack([diagonal(t, 3), uniform(t), sink, np.full((t, t), np.nan)])[None, None, :, None]
    s = slash_score(as_attention(a))
    assert DEFAULT_KAPPA == 0.5
    def flags(x):  # the padded (all-NaN) head has no score: undefined, not "not dominant"
        return ["nan" if np.isnan(v) else bool(v) for v in x.values.ravel()]

    assert flags(slash_dominant(s, delta=3)) == [True, False, False, "nan"]
    assert flags(slash_dominant(s, delta=2)) == [False, False, False, "nan"]
    # A sink head scores 1 at offset T - 1 (a single row): why a window cap matters. The default
    # is `dynamics analyse`'s window, 1..T // 2 from the T the scores record; the public
    # defaults had been 0..T - 1, which counted this sink head (and any self head) dominant.
    assert s.attrs["n_query"] == t
    assert flags(slash_dominant(s, max_offset=t - 1)) == [True, False, True, "nan"]
    assert flags(slash_dominant(s)) == flags(slash_dominant(s, min_offset=1, max_offset=t // 2)) == [True, False, False, "nan"]
    # The window starts at 1, the previous-token head: one 1 back scores 1 at offset 1 and 0 at
    # every other, so it is dominant under the defaults, and not in a window from 2.
    prev = slash_score(as_attention(diagonal(t, 1)[None, None, None, None]))
    assert flags(slash_dominant(prev)) == [True] and flags(slash_dominant(prev, min_offset=2)) == [False]
    with pytest.raises(ValueError, match=r"no offsets in \[7, 5\] \(max_offset: by default T // 2 of the scores' n_query 10"):
        best_offset(s, min_offset=7)
    assert best_offset(s)[1].attrs == {"long_name": "largest slash score in the offset window", "units": "1"}
    bare = s.copy()
    bare.attrs = {}  # scores that do not say their T: every scored offset from 1
    assert flags(slash_dominant(bare)) == [True, False, True, "nan"]
    self_head = slash_score(as_attention(np.eye(t)[None, None, None, None]))
    assert flags(slash_dominant(self_head)) == [False] and flags(slash_dominant(self_head, min_offset=0)) == [True]
    assert flags(slash_dominant(s, kappa=1.0, delta=3)) == [True, False, False, "nan"]
    # offsets left unscored (NaN) for every head: undefined, and left out of a share of heads
    unscored = slash_dominant(s.where(s["offset"] > 5), max_offset=5)
    assert np.isnan(unscored.values).all()
    assert np.isnan(dominant_share(unscored).values).all()
    with pytest.raises(ValueError, match="kappa"):
        slash_dominant(s, kappa=1.5)
    with pytest.raises(ValueError, match="delta"):
        slash_dominant(s, delta=t)


# --- token dominance ---------------------------------------------------------------------


def token_attention(tokens, token_id=SLASH):
    """All mass on the visible occurrences of token_id (uniform among them); self otherwise."""
    p, t = tokens.shape
    a = np.zeros((p, t, t))
    for q in range(p):
        for i in range(t):
            seen = [j for j in range(i + 1) if tokens[q, j] == token_id]
            if seen:
                a[q, i, seen] = 1 / len(seen)
            else:
                a[q, i, i] = 1
    return a


def probe_tokens(rng, p, t, token_every=4):
    tokens = rng.integers(50, 100, size=(p, t))
    tokens[:, 2::token_every] = SLASH
    return tokens


def test_token_share_is_one_for_a_head_on_the_token_and_ratio_one_for_uniform():
    rng = np.random.default_rng(1)
    t = 12
    tokens = probe_tokens(rng, 4, t)
    tokens[3] = rng.integers(50, 100, size=t)  # probe 3 has no '/'
    tok = xr.DataArray(tokens, dims=("probe", "position"))
    a = np.stack([token_attention(tokens), np.broadcast_to(uniform(t), (4, t, t))])[None, None]
    attn = as_attention(a)
    share = token_share(attn, tok)
    assert share.dims == ("snapshot", "layer", "head", "probe")
    np.testing.assert_allclose(share.values[0, 0, 0], [1, 1, 1, np.nan])
    ratio = token_ratio(attn, tok)
    np.testing.assert_allclose(ratio.values[0, 0, 1], [1, 1, 1, np.nan], rtol=1e-6)
    assert (ratio.values[0, 0, 0, :3] > 1).all()


def test_token_share_hand_computed():
    tok = xr.DataArray([[5, SLASH, 6, SLASH]], dims=("probe", "position"))
    attn = as_attention(uniform(4)[None, None, None, None])
    # queries 1..3 see a '/': shares 1/2, 1/3, 2/4
    np.testing.assert_allclose(token_share(attn, tok).item(), (1 / 2 + 1 / 3 + 2 / 4) / 3)
    np.testing.assert_allclose(token_share(attn, tok, token_id=5).item(), np.mean([1, 1 / 2, 1 / 3, 1 / 4]))
    assert np.isnan(token_share(attn, tok, token_id=999).item())


def test_token_share_and_ratio_name_tokens_with_other_probe_rows():
    # 3 probe rows of tokens against attention on 2: the line names both counts, not xarray's
    # AlignmentError on the dim alone
    tok = xr.DataArray(np.full((3, 4), SLASH), dims=("probe", "position"))
    attn = as_attention(np.broadcast_to(uniform(4), (1, 1, 1, 2, 4, 4)))
    for f in (token_share, token_ratio):
        with pytest.raises(ValueError, match="tokens have 3 probe rows but attention has 2"):
            f(attn, tok)


def test_token_share_against_a_loop_on_random_attention():
    rng = np.random.default_rng(2)
    t, p = 9, 5
    tokens = rng.integers(45, 50, size=(p, t))
    a = random_causal(rng, (1, 2, 2, p), t)
    share = token_share(as_attention(a), xr.DataArray(tokens, dims=("probe", "position"))).values
    ratio = token_ratio(as_attention(a), xr.DataArray(tokens, dims=("probe", "position"))).values
    for q in range(p):
        shares, ratios = [], []
        for i in range(t):
            seen = [j for j in range(i + 1) if tokens[q, j] == SLASH]
            if seen:
                shares.append(a[..., q, i, seen].sum(-1))
                ratios.append(a[..., q, i, seen].sum(-1) / (len(seen) / (i + 1)))
        if shares:
            np.testing.assert_allclose(share[..., q], np.mean(shares, axis=0), rtol=1e-5)
            np.testing.assert_allclose(ratio[..., q], np.mean(ratios, axis=0), rtol=1e-5)
        else:
            assert np.isnan(share[..., q]).all()


def test_token_dominant_needs_three_consecutive_probes():
    nan = np.nan
    rows = {
        "three in a row": [0.9, 0.1, 0.6, 0.7, 0.8],
        "two then a miss": [0.9, 0.9, 0.1, 0.9, 0.9],
        "absent probes are skipped": [0.9, nan, 0.9, nan, 0.9],
        "threshold is inclusive": [0.5, 0.5, 0.5, 0.1, 0.1],
        "just below": [0.49, 0.9, 0.9, 0.1, 0.9],
        "never visible": [nan] * 5,
    }
    share = xr.DataArray(list(rows.values()), dims=("head", "probe"))

    def flags(x):  # fewer probes hold the token than a run needs: undefined, not "not dominant"
        return ["nan" if np.isnan(v) else bool(v) for v in x.values.ravel()]

    assert flags(token_dominant(share)) == [True, False, True, True, False, "nan"]
    assert flags(token_dominant(share, run_length=2)) == [True, True, True, True, True, "nan"]
    assert flags(token_dominant(share, threshold=0.95)) == [False] * 5 + ["nan"]
    # three probes hold the token: enough for a run of 3, not of 4
    assert flags(token_dominant(share, run_length=4)) == [False, False, "nan", False, False, "nan"]
    with pytest.raises(ValueError, match="run_length"):
        token_dominant(share, run_length=0)
    # Two probes recorded (record.n_probe = 2), every head wholly on the token: a run of 3 can
    # never be seen, so no head is "not dominant", and the layer's share is undefined, not 0.
    two = xr.DataArray(np.ones((1, 1, 4, 2)), dims=("snapshot", "layer", "head", "probe"))
    assert np.isnan(token_dominant(two).values).all()
    assert np.isnan(dominant_share(token_dominant(two)).values).all()
    # a share leaves the undefined heads out: 1 of the 2 heads defined is dominant
    mixed = xr.DataArray([[[1.0, 0.0, np.nan, np.nan]]], dims=("snapshot", "layer", "head"))
    assert dominant_share(mixed).values.tolist() == [[0.5]]


def test_token_dominant_from_attention():
    rng = np.random.default_rng(3)
    t, p = 12, 5
    tokens = probe_tokens(rng, p, t)
    on_token = token_attention(tokens)
    flat = np.broadcast_to(uniform(t), (p, t, t))
    two = np.concatenate([on_token[:2], flat[2:3], on_token[3:]])  # runs of 2 and 2
    three = np.concatenate([flat[:2], on_token[2:]])  # run of 3
    attn = as_attention(np.stack([two, three])[None, None])
    share = token_share(attn, xr.DataArray(tokens, dims=("probe", "position")))
    dominant = token_dominant(share)
    assert dominant.dims == ("snapshot", "layer", "head")
    assert dominant.values.ravel().tolist() == [False, True]


# --- emergence ---------------------------------------------------------------------------


def test_emergence_step_on_planted_sequences():
    T, F = True, False
    heads = [
        [F, F, T, T, T],  # emerges at step 20
        [T, F, T, T, T],  # drops out, back at 20
        [T, T, T, T, F],  # lost at the end -> NaN
        [T, T, T, T, T],  # from the start
        [F, F, F, F, F],  # never
        [F, F, F, F, T],  # at the last snapshot
    ]
    d = xr.DataArray(
        np.array(heads).T[:, None, :],
        dims=("snapshot", "layer", "head"),
        coords={"step": ("snapshot", [0, 10, 20, 30, 40])},
    )
    e = emergence_step(d)
    assert e.dims == ("layer", "head")
    np.testing.assert_array_equal(e.values[0], [20, 20, np.nan, 0, np.nan, 40])
    # No step coordinate: snapshot index.
    np.testing.assert_array_equal(emergence_step(d.drop_vars("step")).values[0], [2, 2, np.nan, 0, np.nan, 4])
    # Extra run dim and float input with NaN (padded head) pass through.
    runs = xr.concat([d.astype(float), d.astype(float).where(d["head"] < 5)], dim="run")
    e2 = emergence_step(runs)
    assert e2.dims == ("run", "layer", "head")
    np.testing.assert_array_equal(e2.values[1, 0], [20, 20, np.nan, 0, np.nan, np.nan])


def test_dominant_share():
    d = xr.DataArray(
        np.array([[[1, 0, 0, 0], [1, 1, 0, 0]], [[1, 1, 1, 0], [1, 1, 1, 1]]], bool),
        dims=("snapshot", "layer", "head"),
    )
    share = dominant_share(d)
    assert share.dims == ("snapshot", "layer")
    np.testing.assert_allclose(share.values, [[0.25, 0.5], [0.75, 1.0]])
    present = xr.DataArray([True, True, True, False], dims="head")
    np.testing.assert_allclose(dominant_share(d, present).values, [[1 / 3, 2 / 3], [1, 1]])
    np.testing.assert_allclose(dominant_share(d.astype(float).where(present)).values, [[1 / 3, 2 / 3], [1, 1]])


# --- laziness, extra dims, padding -------------------------------------------------------


def test_dask_input_stays_lazy_and_equals_numpy():
    rng = np.random.default_rng(4)
    t, p = 10, 4
    a = random_causal(rng, (3, 2, 2, p), t).astype(np.float16)
    tokens = xr.DataArray(probe_tokens(rng, p, t), dims=("probe", "position"))
    eager = as_attention(a)
    lazy = eager.copy(data=da.from_array(a, chunks=(1, 1, 2, p, t, t)))
    lazy_tokens = tokens.chunk()

    def pipeline(attn, tok):
        scores = slash_score(attn)
        share = token_share(attn, tok)
        dominant = token_dominant(share, threshold=0.2)
        return {
            "scores": scores,
            "best": best_offset(scores)[0],
            "slash_dominant": slash_dominant(scores, kappa=0.2),
            "share": share,
            "ratio": token_ratio(attn, tok),
            "dominant": dominant,
            "emergence": emergence_step(dominant),
            "dominant_share": dominant_share(dominant),
        }

    with dask.config.set(scheduler=raise_on_compute):
        lazy_out = pipeline(lazy, lazy_tokens)
    eager_out = pipeline(eager, tokens)
    for name, value in lazy_out.items():
        assert value.chunks is not None, name
        xr.testing.assert_allclose(value.compute(), eager_out[name])


def test_extra_run_dim_and_nan_padded_heads():
    rng = np.random.default_rng(5)
    t, p = 10, 4
    tokens = xr.DataArray(probe_tokens(rng, p, t), dims=("probe", "position"))
    a = random_causal(rng, (2, 1, 3, p), t)
    padded = a.copy()
    padded[:, :, 2] = np.nan  # run 1 has only two heads
    attn = xr.concat([as_attention(a), as_attention(padded)], dim="run")
    s = slash_score(attn)
    assert s.dims == ("run", "snapshot", "layer", "head", "offset")
    xr.testing.assert_allclose(s.isel(run=1, head=slice(0, 2)), s.isel(run=0, head=slice(0, 2)))
    assert s.isel(run=1, head=2).isnull().all()
    assert best_offset(s)[0].isel(run=1, head=2).isnull().all()
    assert slash_dominant(s, kappa=0.0).isel(run=1, head=2).isnull().all()  # undefined, not False
    share = token_share(attn, tokens)
    assert share.dims == ("run", "snapshot", "layer", "head", "probe")
    assert share.isel(run=1, head=2).isnull().all()
    dominant = token_dominant(share, threshold=0.0)
    assert (dominant.isel(run=0) == 1).all() and dominant.isel(run=1, head=2).isnull().all()
    present = share.notnull().any("probe").isel(snapshot=0, drop=True)
    np.testing.assert_allclose(dominant_share(dominant, present).values, [[[1], [1]], [[1], [1]]])


def test_float16_rows_that_sum_past_1_share_at_most_1():
    # every visible token is the one counted: the share is the row's sum, 1.000366 in float16
    row = np.array([0.3027, 0.547, 0.1508], dtype=np.float16)
    a = np.zeros((1, 3, 3), dtype=np.float16)
    a[0, 0, 0], a[0, 1, :2], a[0, 2] = 1, [0.5, 0.5], row
    attn = xr.DataArray(a, dims=("probe", "query", "key"))
    tokens = xr.DataArray([[SLASH, SLASH, SLASH]], dims=("probe", "position"))
    assert token_share(attn, tokens).values.tolist() == [1.0]
    assert token_ratio(attn, tokens).max().item() <= 3.0


# Known answers that mutants of this module passed: each computed on paper or by a small numpy or
# scipy reference, never by the function under test.
CORE = ("probe", "query", "key")


def test_confounded_offsets_on_paper():
    # T = 4, threshold 0.5. Uniform: mean_{i>=d} 1/(i+1) = .52, .36, .29, .25; sink:
    # 1/(T-d) = .25, .33, .5, 1. Offsets 0 (uniform), 2 and 3 (sink, 2 exactly at 0.5).
    assert confounded_offsets(4, range(4), 0.5) == [0, 2, 3]
    assert confounded_offsets(4, [1], 0.36) == [1]  # uniform .361 >= .36


def test_token_share_of_float16_attention_accumulates_past_float16():
    # A float16 contraction rounded each query's mass to about 2**-11.
    rng = np.random.default_rng(2)
    t = 64
    a = np.tril(rng.random((2, t, t)))
    a = (a / a.sum(-1, keepdims=True)).astype(np.float16)
    tokens = np.where(np.arange(t) % 2 == 0, 47, 5)[None].repeat(2, 0)
    want = (a.astype(np.float64) * (tokens[:, None, :] == 47)).sum(-1).clip(0, 1).mean(-1)
    out = token_share(xr.DataArray(a, dims=CORE), xr.DataArray(tokens, dims=("probe", "position")))
    np.testing.assert_allclose(out.values, want, rtol=0, atol=1e-6)


def test_emergence_step_of_a_padded_run():
    # Padding past the last recorded snapshot neither breaks nor starts the final stretch.
    d = xr.DataArray([[0.0, 1.0, 1.0, np.nan]], dims=("head", "snapshot"),
                     coords={"step": ("snapshot", [0.0, 10.0, 20.0, np.nan])})
    assert emergence_step(d).values.tolist() == [10.0]


def test_slash_score_of_attention_chunked_along_probe_and_query():
    a = np.zeros((2, 4, 4))
    a[:, 0, 0] = 1.0
    a[:, np.arange(1, 4), np.arange(0, 3)] = 1.0  # offset 1 on every row that has it
    attn = xr.DataArray(a, dims=CORE).chunk({"probe": 1, "query": 2})
    out = slash_score(attn)
    assert out.chunks is not None
    # offset 0: only row 0 on it, 1/4; offset 1: 3/3; offsets 2, 3: 0.
    np.testing.assert_allclose(out.compute().values, [0.25, 1.0, 0.0, 0.0])


def test_token_dominant_of_shares_chunked_along_probe():
    share = xr.DataArray([[0.9, 0.8, 0.1, 0.7, 0.6, 0.9]], dims=("head", "probe")).chunk({"probe": 2})
    assert token_dominant(share).compute().values.tolist() == [1.0]


def test_token_dominant_rejects_a_fractional_run_length():
    share = xr.DataArray([[0.9, 0.8, 0.7]], dims=("head", "probe"))
    with pytest.raises(TypeError, match="run_length"):
        token_dominant(share, run_length=2.5)


def test_best_offset_is_labelled_as_an_offset_not_a_score():
    s = xr.DataArray([0.1, 0.9], dims="offset", coords={"offset": [0, 1]},
                     attrs={"long_name": "mean attention on diagonal key = query - offset", "units": "1"})
    offset, _ = best_offset(s)
    assert offset.attrs["units"] == "positions"

