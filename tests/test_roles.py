"""Role scores and labels on planted heads, with references computed by plain loops."""

import dataclasses

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

from dynamics.analysis.roles import (
    ROLES,
    RoleThresholds,
    assign_roles,
    diffuse_score,
    induction_score,
    local_score,
    role_names,
    role_scores,
    sink_score,
)

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

DIMS = ("snapshot", "layer", "head", "probe", "query", "key")
SLASH = 47
T, P = 24, 6
PLANTED = ("previous_token", "self", "slash", "induction", "sink", "diffuse", "token", "local")


def uniform(t):
    return np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]


def random_causal(rng, shape, t):
    logits = rng.normal(size=(*shape, t, t)) * 2
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def repeated_segments(rng):
    """Each probe repeats a random segment of distinct tokens, with one '/', at its own period (5..10)."""
    rows = []
    for p in range(P):
        segment = rng.permutation(np.arange(50, 150))[: 5 + p]
        segment[rng.integers(len(segment))] = SLASH
        rows.append(np.resize(segment, T))
    return np.array(rows)


def planted_heads(tokens):
    """(head, probe, query, key) attention, one planted pattern per head, in PLANTED order."""
    i = np.arange(T)
    heads = {name: np.zeros((P, T, T)) for name in PLANTED}
    heads["previous_token"][:, i, np.maximum(i - 1, 0)] = 1
    heads["self"][:, i, i] = 1
    heads["slash"][:, i, np.where(i >= 4, i - 4, 0)] = 1
    heads["sink"][:, :, 0] = 1
    heads["diffuse"][:] = uniform(T)
    for w in range(3):  # even over offsets 0..2
        heads["local"][:, i, np.maximum(i - w, 0)] += 1 / 3
    for p in range(P):
        period = len(set(tokens[p]))
        for q in range(T):
            if q >= period:  # the token after the previous occurrence of tokens[p, q]
                heads["induction"][p, q, q - period + 1] = 1
            else:
                heads["induction"][p, q, : q + 1] = 1 / (q + 1)
            seen = np.flatnonzero(tokens[p, : q + 1] == SLASH)
            if len(seen):
                heads["token"][p, q, seen] = 1 / len(seen)
            else:
                heads["token"][p, q, q] = 1
    return np.stack([heads[name] for name in PLANTED])


@pytest.fixture(scope="module")
def planted():
    """Snapshot 0: every head uniform. Snapshot 1: the planted heads as (layer 2, head 4)."""
    rng = np.random.default_rng(0)
    tokens = repeated_segments(rng)
    heads = planted_heads(tokens).reshape(2, 4, P, T, T)
    a = np.stack([np.broadcast_to(uniform(T), heads.shape), heads])
    attn = xr.DataArray(a, dims=DIMS, coords={"step": ("snapshot", [0, 500])})
    return attn, xr.DataArray(tokens, dims=("probe", "position"))


def test_planted_heads_get_their_labels(planted):
    attn, tokens = planted
    scores = role_scores(attn, tokens)
    codes = assign_roles(scores)
    assert codes.dims == ("snapshot", "layer", "head") and codes.dtype == np.int8
    assert role_names(codes.isel(snapshot=1)).ravel().tolist() == list(PLANTED)
    assert (role_names(codes.isel(snapshot=0)) == "diffuse").all()


def test_planted_heads_score_one_on_their_role(planted):
    attn, tokens = planted
    scores = role_scores(attn, tokens).isel(snapshot=1).stack(h=("layer", "head"))
    for k, name in enumerate(PLANTED):
        np.testing.assert_allclose(scores[name].values[k], 1.0, err_msg=name)
    assert scores["slash_offset"].values[PLANTED.index("slash")] == 4
    for name in ROLES[:-1]:
        assert scores[name].dims == ("h",)
        finite = scores[name].values[np.isfinite(scores[name].values)]
        assert ((finite >= 0) & (finite <= 1 + 1e-9)).all(), name


def test_scores_known_values_for_uniform_attention():
    attn = xr.DataArray(uniform(T)[None, None, None, None], dims=DIMS)
    tokens = xr.DataArray(np.arange(T)[None], dims=("probe", "position"))
    s = role_scores(attn, tokens)
    harmonic = (1 / np.arange(1, T + 1)).sum()
    np.testing.assert_allclose(s["self"].item(), harmonic / T)
    np.testing.assert_allclose(s["previous_token"].item(), (harmonic - 1) / (T - 1))
    np.testing.assert_allclose(s["sink"].item(), harmonic / T)
    np.testing.assert_allclose(s["local"].item(), np.mean(3 / (np.arange(3, T) + 1)), rtol=1e-6)
    np.testing.assert_allclose(s["diffuse"].item(), 1.0, rtol=1e-6)
    assert np.isnan(s["induction"].item())  # no token repeats
    assert np.isnan(s["token"].item())  # no '/'
    assert s.attrs["slash_max_offset"] == T // 2


@pytest.mark.parametrize("t", [2, 3])
def test_probes_too_short_for_a_role_leave_it_unscored(t):
    # a context of 2 or 3 is valid (markov, offset_copy with delta 1): its runs are analysed,
    # with no slash window (offsets 2..T // 2) and no local band (offsets 0..2) to score, and no
    # self score either: uniform attention passes it (H_T / T = 0.75, 0.61)
    attn = xr.DataArray(np.eye(t)[None, None, None, None], dims=DIMS)  # a self head
    tokens = xr.DataArray(np.arange(t)[None], dims=("probe", "position"))
    s = role_scores(attn, tokens)
    assert np.isnan(s["slash"].item()) and np.isnan(s["slash_offset"].item()) and np.isnan(s["local"].item())
    assert np.isnan(s["self"].item()) and np.isnan(s["sink"].item())
    assert role_names(assign_roles(s)).item() == "none"


def test_probes_of_one_position_are_refused_in_words_not_a_key_error():
    # model.context >= 2 is required; through the Python API one position raised
    # KeyError "not all values found in index 'offset'"
    attn = xr.DataArray(np.ones((1, 1, 1, 1, 1, 1)), dims=DIMS)
    tokens = xr.DataArray(np.zeros((1, 1), np.int64), dims=("probe", "position"))
    with pytest.raises(ValueError, match=r"^role_scores needs probes of at least 2 positions .*; got query=1$"):
        role_scores(attn, tokens)


def test_a_self_head_on_adjacent_repeats_is_not_induction():
    # In 5 5 5 5 the key after the previous 5 is, for the query at i, any k in 1..i; k = i is
    # the query itself, so a pure self head would score 1 if the query's own position counted.
    # (T = 5: at T = 4 uniform attention passes self, H_4 / 4 = 0.52, and self is not scored)
    tokens = xr.DataArray([[5, 5, 5, 5, 5]], dims=("probe", "position"))
    self_head = xr.DataArray(np.eye(5)[None], dims=("probe", "query", "key"))
    assert induction_score(self_head, tokens).item() == 0.0
    back_one = xr.DataArray(np.eye(5, k=-1)[None] + np.diag([1.0, 0, 0, 0, 0])[None], dims=("probe", "query", "key"))
    assert induction_score(back_one, tokens).item() == 1.0  # queries 2, 3, 4 look at keys 1, 2, 3
    scores = role_scores(self_head.expand_dims(snapshot=1, layer=1, head=1).transpose(*DIMS), tokens)
    assert assign_roles(scores).item() == ROLES.index("self")


@pytest.mark.parametrize("dtype", [np.int64, np.int8, np.uint8, np.uint16, np.uint64])
def test_key_0_never_matches_whatever_the_token_dtype(dtype):
    # Key 0 has no preceding token. A -1 fill before it wrapped to 255 in uint8 ids, so a sink
    # head scored 1 on bytes whenever a query held the byte 255 (or -1 in signed ids, never real).
    top = np.iinfo(dtype).max
    tokens = xr.DataArray(np.array([[top, 1, 2, 3, 4, top]], dtype=dtype), dims=("probe", "position"))
    sink = np.zeros((1, 6, 6))
    sink[..., 0] = 1.0
    # query 5 (a repeat of the id at 0) is the one query with a previous occurrence: its match is key 1
    assert induction_score(xr.DataArray(sink, dims=("probe", "query", "key")), tokens).item() == 0.0
    to_key_1 = np.zeros((1, 6, 6))
    to_key_1[..., 0, 0] = 1.0
    to_key_1[..., 1:, 1] = 1.0
    assert induction_score(xr.DataArray(to_key_1, dims=("probe", "query", "key")), tokens).item() == 1.0


def test_scores_match_loop_references_on_random_attention():
    rng = np.random.default_rng(1)
    t, p = 9, 4
    a = random_causal(rng, (2, 3, p), t)  # (layer, head, probe, query, key)
    tokens = rng.integers(0, 4, size=(p, t))
    attn = xr.DataArray(a, dims=DIMS[1:])
    tok = xr.DataArray(tokens, dims=("probe", "position"))

    mass, count = np.zeros((2, 3)), 0
    for q in range(p):
        for i in range(t):
            keys = [j + 1 for j in range(i - 1) if tokens[q, j] == tokens[q, i]]  # key j + 1 < i
            if keys:
                mass += a[:, :, q, i, keys].sum(-1)
                count += 1
    np.testing.assert_allclose(induction_score(attn, tok).values, mass / count, rtol=1e-5)

    np.testing.assert_allclose(sink_score(attn).values, a[..., 0].mean((-1, -2)))
    np.testing.assert_allclose(sink_score(attn, position=2).values, a[..., 2:, 2].mean((-1, -2)))

    band = np.mean([[a[..., q, i, i - 2 : i + 1].sum(-1) for i in range(2 + 1, t)] for q in range(p)], axis=(0, 1))
    np.testing.assert_allclose(local_score(attn, width=3).values, band, rtol=1e-5)

    ent = np.mean(
        [
            [-(a[..., q, i, : i + 1] * np.log(a[..., q, i, : i + 1])).sum(-1) / np.log(i + 1) for i in range(1, t)]
            for q in range(p)
        ],
        axis=(0, 1),
    )
    np.testing.assert_allclose(diffuse_score(attn).values, ent, rtol=1e-5)


def test_label_rule_margin_specific_before_generic_and_none():
    cases = {
        # name: ({role: score}, expected label)
        "margin decides between specific roles": ({"sink": 0.45, "self": 0.6}, "sink"),
        "specific beats a larger generic margin": ({"slash": 0.5, "diffuse": 1.0}, "slash"),
        "generic when no specific passes": ({"local": 0.85, "diffuse": 0.95, "self": 0.49}, "diffuse"),
        "threshold is inclusive": ({"induction": 0.4}, "induction"),
        "nothing passes": ({"self": 0.3, "local": 0.5}, "none"),
        "all NaN (padded head)": ({r: np.nan for r in ROLES[:-1]}, "none"),
        "exact tie goes to the earlier role": ({"previous_token": 0.6, "self": 0.6}, "previous_token"),
    }
    values = {r: np.zeros(len(cases)) for r in ROLES[:-1]}
    for k, (given, _) in enumerate(cases.values()):
        for r, v in given.items():
            values[r][k] = v
    scores = xr.Dataset({r: ("head", v) for r, v in values.items()})
    codes = assign_roles(scores)
    assert role_names(codes).tolist() == [label for _, label in cases.values()]
    assert codes.attrs["flag_values"] == list(range(len(ROLES)))
    assert codes.attrs["flag_meanings"].split() == list(ROLES)
    # Thresholds are configurable: a stricter sink threshold hands case 0 to self.
    stricter = RoleThresholds(sink=0.5)
    assert role_names(assign_roles(scores, stricter))[0] == "self"


def test_thresholds_are_validated_and_frozen():
    with pytest.raises(ValueError, match="RoleThresholds.sink"):
        RoleThresholds(sink=0.0)
    with pytest.raises(ValueError, match="RoleThresholds.local_width"):
        RoleThresholds(local_width=0)
    with pytest.raises(ValueError, match="slash_max_offset"):
        RoleThresholds(slash_min_offset=5, slash_max_offset=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        RoleThresholds().sink = 0.2
    assert RoleThresholds().token_id == ord("/") == 47


def test_configurable_token_id_and_offsets(planted):
    attn, tokens = planted
    scores = role_scores(attn.isel(snapshot=[1]), tokens, RoleThresholds(token_id=999, slash_max_offset=3))
    assert scores["token"].isnull().all()  # token never appears
    assert scores["slash"].sel(layer=0, head=2).item() < 0.5  # offset 4 is outside [2, 3]
    # a window past the probes' length scores no head as slash (a sweep may mix contexts)
    assert role_scores(attn, tokens, RoleThresholds(slash_min_offset=T))["slash"].isnull().all()


def test_token_score_is_the_mean_over_the_probes_that_hold_the_token():
    # A sink head (all attention on key 0) over three probes: probe 0 has its '/' at key 0
    # (share 1), probe 1 at key 2, where the head never looks (share 0), probe 2 has none
    # (undefined, left out). The token score is the mean over probes 0 and 1: 1/2.
    t = 10
    sink = np.zeros((3, t, t))
    sink[..., 0] = 1
    tokens = np.arange(100, 100 + 3 * t).reshape(3, t)
    tokens[0, 0] = tokens[1, 2] = SLASH
    attn = xr.DataArray(sink[None, None, None], dims=DIMS)
    scores = role_scores(attn, xr.DataArray(tokens, dims=("probe", "position")))
    assert scores["token"].item() == 0.5
    assert role_names(assign_roles(scores)).item() == "sink"  # token passes at 0.5, but sink by margin


def test_role_names():
    assert role_names(np.array([[0, 8], [3, 5]])).tolist() == [["previous_token", "none"], ["induction", "token"]]
    with pytest.raises(ValueError, match="role codes"):
        role_names([9])


def raise_on_compute(*args, **kwargs):
    raise RuntimeError("computed a dask graph while building it")


def test_dask_input_stays_lazy_and_equals_numpy(planted):
    attn, tokens = planted
    attn = attn.astype(np.float16)  # stored dtype
    lazy = attn.copy(data=da.from_array(attn.values, chunks=(1, 1, 2, P, T, T)))
    with dask.config.set(scheduler=raise_on_compute):
        lazy_scores = role_scores(lazy, tokens.chunk())
        lazy_codes = assign_roles(lazy_scores)
    assert all(v.chunks is not None for v in lazy_scores.data_vars.values())
    assert lazy_codes.chunks is not None
    eager_scores = role_scores(attn, tokens)
    xr.testing.assert_allclose(lazy_scores.compute(), eager_scores)
    xr.testing.assert_equal(lazy_codes.compute(), assign_roles(eager_scores))
    # float16 storage still gives the planted labels.
    assert role_names(lazy_codes.isel(snapshot=1)).ravel().tolist() == list(PLANTED)


def test_extra_run_dim_and_nan_padded_heads(planted):
    attn, tokens = planted
    padded = attn.where(attn["head"] < 3)  # run 1: three heads per layer, the fourth is padding
    both = xr.concat([attn, padded], dim="run")
    scores = role_scores(both, tokens)
    for name, var in scores.data_vars.items():
        assert var.dims == ("run", "snapshot", "layer", "head"), name
        assert var.isel(run=1, head=3).isnull().all(), name
    xr.testing.assert_allclose(scores.isel(run=1, head=slice(0, 3)), scores.isel(run=0, head=slice(0, 3)))
    labels = role_names(assign_roles(scores).isel(snapshot=1))
    assert labels[0].ravel().tolist() == list(PLANTED)
    assert (labels[1, :, 3] == "none").all()
    assert labels[1, :, :3].ravel().tolist() == [r for k, r in enumerate(PLANTED) if k % 4 != 3]


@pytest.mark.parametrize("T", [3, 4, 8, 9])
def test_short_probes_label_no_role_that_uniform_attention_or_a_sink_passes(T):
    # alpha_0 of uniform causal attention is H_T / T: 0.34 at T = 8, over the sink threshold, so
    # every diffuse head read "sink"; at T = 4 a sink head scored slash(2) = 0.5. At T = 3 a sink
    # head scores previous_token = (A[1, 0] + A[2, 1]) / 2 = (1 + 0) / 2 = 0.5, the threshold: the
    # role cannot tell a previous-token head from a sink there, so even the true one reads "none".
    keep = np.tril(np.ones((T, T)))
    uniform = keep / keep.sum(1, keepdims=True)
    sink = np.zeros((T, T))
    sink[:, 0] = 1
    prev = np.eye(T, k=-1)
    prev[0, 0] = 1
    dims = ("snapshot", "layer", "head", "probe", "query", "key")
    attn = xr.DataArray(np.stack([uniform, sink, prev])[None, None, :, None], dims=dims)
    scores = role_scores(attn, xr.DataArray(np.arange(T)[None], dims=("probe", "position")))
    assert np.isnan(scores["sink"]).all()
    assert bool(np.isnan(scores["previous_token"]).all()) is (T == 3)
    labels = ["diffuse", "none", "none" if T == 3 else "previous_token"]
    assert role_names(assign_roles(scores)).ravel().tolist() == labels


def test_a_threshold_uniform_attention_reaches_exactly_blanks_the_role():
    # "Reaches" is >=: at T = 2 uniform attention scores local (width 1) exactly 0.5, so at a
    # threshold of 0.5 the score cannot tell a local head from no pattern; just above it, it can.
    keep = np.tril(np.ones((2, 2)))
    attn = xr.DataArray((keep / keep.sum(1, keepdims=True))[None, None, None, None], dims=DIMS)
    tokens = xr.DataArray(np.arange(2)[None], dims=("probe", "position"))
    assert np.isnan(role_scores(attn, tokens, RoleThresholds(local=0.5, local_width=1))["local"].item())
    assert role_scores(attn, tokens, RoleThresholds(local=0.5 + 1e-6, local_width=1))["local"].item() == 0.5


def test_probes_long_enough_keep_every_positional_role():
    T = 10  # H_10 / 10 = 0.293 < 0.3: the first length at which uniform attention is no sink
    sink = np.zeros((T, T))
    sink[:, 0] = 1
    attn = xr.DataArray(sink[None, None, None, None], dims=("snapshot", "layer", "head", "probe", "query", "key"))
    scores = role_scores(attn, xr.DataArray(np.arange(T)[None], dims=("probe", "position")))
    assert scores["sink"].item() == 1.0 and role_names(assign_roles(scores)).item() == "sink"
    assert not any(np.isnan(scores[r]).any() for r in ("previous_token", "self", "slash", "local"))


@pytest.mark.parametrize("window", [14, 15, None])
def test_a_wide_slash_window_drops_only_the_offsets_a_sink_passes(window):
    # Over 16 positions a sink scores slash(14) = 1/2 and slash(15) = 1: a window reaching them
    # once blanked the slash role of every head, so a clean offset-3 slash head read "none".
    T = 16
    slash = np.zeros((T, T))
    slash[np.arange(3, T), np.arange(T - 3)] = 1
    slash[:3, 0] = 1
    sink = np.zeros((T, T))
    sink[:, 0] = 1
    attn = xr.DataArray(np.stack([slash, sink])[None, None, :, None], dims=DIMS)
    scores = role_scores(attn, xr.DataArray(np.arange(T)[None], dims=("probe", "position")),
                         RoleThresholds(slash_max_offset=window))
    assert scores["slash_offset"].values.ravel().tolist()[0] == 3.0
    assert scores["slash"].values.ravel()[0] == 1.0
    # the sink's best slash offset is then the widest one it cannot pass: 13, where it scores 1/3
    np.testing.assert_allclose(scores["slash"].values.ravel()[1], 1 / 3 if window else 1 / (T - 8))
    assert role_names(assign_roles(scores)).ravel().tolist() == ["slash", "sink"]


def test_float16_rows_that_sum_past_1_score_at_most_1():
    # A real softmax row stored as float16 sums to up to 1 + 2**-11: summed without a clip, a
    # local head read 1.000366 and an induction head 1.0002, past the documented bound of 1
    row = np.array([0.3027, 0.547, 0.1508], dtype=np.float16)
    assert row.astype(np.float64).sum() > 1.0003
    a = np.zeros((1, 4, 4), dtype=np.float16)
    a[0, 0, 0] = 1
    a[0, 1, :2] = [0.5, 0.5]
    a[0, 2, :3] = row
    a[0, 3, 1:4] = row  # query 3's window of 3: all of its mass, as float16 rounds it
    attn = xr.DataArray(a, dims=("probe", "query", "key"))
    assert local_score(attn, width=3).item() == 1.0
    # all 5s: query 2's match is key 1, query 3's keys 1 and 2, where a float16 pair puts all its
    # mass (softmax 0.81327 and 0.18673 round to 0.8135 and 0.1868, 1.000244 together)
    pair = np.array([0.8132702392002724, 1 - 0.8132702392002724]).astype(np.float16)
    assert pair.astype(np.float64).sum() > 1.0002
    a[0, 2, :] = [0, 1, 0, 0]
    a[0, 3, :] = [0, *pair, 0]
    tokens = xr.DataArray([[5, 5, 5, 5]], dims=("probe", "position"))
    assert induction_score(xr.DataArray(a, dims=("probe", "query", "key")), tokens).item() == 1.0


def induction_head(tokens):
    """(probe, query, key): each query with an earlier occurrence of its token on the key after
    the last one, the others uniform."""
    p, t = tokens.shape
    a = np.zeros((p, t, t))
    for b in range(p):
        for q in range(t):
            keys = [j + 1 for j in range(q) if tokens[b, j] == tokens[b, q] and j + 1 < q]
            if keys:
                a[b, q, keys[-1]] = 1.0
            else:
                a[b, q, : q + 1] = 1.0 / (q + 1)
    return a


def test_probes_on_which_uniform_attention_passes_induction_leave_it_unscored():
    # On few or repetitive tokens a head with no pattern reaches the induction threshold (0.45 for
    # uniform attention on random bits at T = 64), and read "induction"; lost probe tokens (all 0)
    # made every head of a distillation teacher induction. Unscored (NaN) there, as the
    # positional roles are on probes too short for them; random tokens of a larger vocabulary keep it.
    rng = np.random.default_rng(3)
    for vocab, blanked in ((2, True), (1, True), (64, False)):
        tok = rng.integers(0, vocab, size=(4, 64))
        tokens = xr.DataArray(tok, dims=("probe", "position"))
        flat = np.broadcast_to(uniform(64), (4, 64, 64))
        # the chance level by a plain loop: uniform mass on the matching keys, over queries that have one
        by_chance = np.mean([sum(tok[b, j] == tok[b, q] for j in range(q - 1)) / (q + 1)
                             for b in range(4) for q in range(64) if any(tok[b, j] == tok[b, q] for j in range(q - 1))])
        assert (by_chance >= 0.4) == blanked
        heads = np.stack([flat, induction_head(tok)])[None, None]  # (snapshot, layer, head, probe, query, key)
        scores = role_scores(xr.DataArray(heads, dims=DIMS), tokens)
        raw = induction_score(xr.DataArray(heads, dims=DIMS), tokens)
        assert raw.values[0, 0, 0] == pytest.approx(by_chance, abs=1e-6)  # what uniform attention scores
        assert raw.values[0, 0, 1] == 1.0  # the induction head
        names = role_names(assign_roles(scores)).ravel().tolist()
        if blanked:
            assert scores["induction"].isnull().all()
            assert names[0] == "diffuse" and names[1] != "induction"
        else:
            np.testing.assert_array_equal(scores["induction"].values, raw.values)
            assert names == ["diffuse", "induction"]


def test_labels_take_the_thresholds_the_scores_were_made_with():
    # A uniform head at T = 10: alpha_0 = H_10 / 10 = 0.293 is kept when scored at sink 0.3 and
    # blanked at 0.25, which it passes. Labelled at 0.25 from scores made at 0.3 it read "sink";
    # now that is refused, and without thresholds the labels follow the scores' own.
    attn = xr.DataArray(uniform(10)[None, None, None, None], dims=DIMS)
    tokens = xr.DataArray(np.arange(10)[None], dims=("probe", "position"))
    low = RoleThresholds(sink=0.25)
    made_default = role_scores(attn, tokens)
    assert made_default["sink"].item() == pytest.approx(sum(1 / k for k in range(1, 11)) / 10)
    assert role_names(assign_roles(made_default)).item() == "diffuse"
    with pytest.raises(ValueError, match=r"^assign_roles: the sink score was made with threshold 0.3, not 0.25; "):
        assign_roles(made_default, low)
    made_low = role_scores(attn, tokens, low)
    assert np.isnan(made_low["sink"].item())
    assert role_names(assign_roles(made_low)).item() == role_names(assign_roles(made_low, low)).item() == "diffuse"
    with pytest.raises(ValueError, match=r"^assign_roles: the sink score was made with threshold 0.25, not 0.3; "):
        assign_roles(made_low, RoleThresholds())
    # a head just above uniform passes sink at 0.295, not at the default 0.3: labelled by the scores' own thresholds
    tilted = uniform(10).copy()
    tilted[:, 0] += 0.01
    tilted /= tilted.sum(-1, keepdims=True)
    made = role_scores(xr.DataArray(tilted[None, None, None, None], dims=DIMS), tokens, RoleThresholds(sink=0.295))
    assert 0.295 <= made["sink"].item() < 0.3 and role_names(assign_roles(made)).item() == "sink"  # not at the default 0.3


def test_a_slash_window_of_offset_0_alone_is_refused():
    # previous_token's offset 1 is scored whatever the window, and a window [0, 0] was read at it:
    # a head with 0.45 of its mass one step back labelled "slash" at offset 1
    with pytest.raises(ValueError, match=r"slash_max_offset must be >= 1 \(offset 0 alone is the self role\); got 0"):
        RoleThresholds(slash_min_offset=0, slash_max_offset=0)
    RoleThresholds(slash_min_offset=0, slash_max_offset=1)


def test_tokens_of_other_probe_rows_are_named_not_an_alignment_error():
    attn = xr.DataArray(np.broadcast_to(np.eye(6), (1, 1, 1, 2, 6, 6)), dims=DIMS)
    tokens = xr.DataArray(np.arange(18).reshape(3, 6), dims=("probe", "position"))
    with pytest.raises(ValueError, match=r"^role_scores: tokens have 3 probe rows but attention has 2; "):
        role_scores(attn, tokens)


def test_a_head_passing_two_roles_takes_the_one_it_passes_by_the_larger_ratio_not_difference():
    # Known answers (a mutation audit's): thresholds differ (sink 0.3, slash 0.5, induction 0.4,
    # previous_token 0.5), so "furthest past its threshold" by ratio and by difference disagree.
    # sink 0.45 / 0.3 = 1.5 beats slash 0.70 / 0.5 = 1.4 (by difference slash, 0.20 > 0.15);
    # induction 0.5 / 0.4 = 1.25 beats previous_token 0.6 / 0.5 = 1.2 (a tie by difference, 0.1).
    scores = xr.Dataset({r: ("head", [0.0, 0.0]) for r in ROLES[:-1]})
    scores["sink"][0], scores["slash"][0] = 0.45, 0.70
    scores["induction"][1], scores["previous_token"][1] = 0.5, 0.6
    assert role_names(assign_roles(scores)).tolist() == ["sink", "induction"]


# --------------------------------------------------------------------------- probe weights
def _two_probe_head():
    # one head, 2 probes of T = 8: previous-token on probe 0, self on probe 1
    prev, own = np.eye(8, k=-1), np.eye(8)
    prev[0, 0] = 1.0
    attn = xr.DataArray(np.stack([prev, own])[None, None, None], dims=DIMS)  # (1, 1, 1, 2, 8, 8)
    tokens = xr.DataArray(np.tile(np.arange(8), (2, 1)), dims=("probe", "position"))
    return attn, tokens


def test_probe_weights_read_each_score_on_the_probes_they_weigh():
    attn, tokens = _two_probe_head()
    w = xr.DataArray([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]], dims=("resample", "probe"))
    scores = role_scores(attn, tokens, weights=w).isel(snapshot=0, layer=0, head=0)
    assert scores["previous_token"].dims == ("resample",)
    np.testing.assert_allclose(scores["previous_token"], [1.0, 0.0, 0.5], rtol=1e-12)
    np.testing.assert_allclose(scores["self"], [1 / 8, 1.0, 9 / 16], rtol=1e-12)  # probe 0's query 0 sits on key 0
    # each probe alone, then both at once: both pass, and self by the larger margin (9/8 against 1)
    labels = role_names(assign_roles(role_scores(attn, tokens, weights=w))).ravel().tolist()
    assert labels == ["previous_token", "self", "self"]
    assert role_names(assign_roles(role_scores(attn, tokens))).item() == "self"


def test_every_bootstrap_resample_scores_as_its_probes_repeated():
    # unequal counts of induction queries per probe, a probe without the token, an untrained
    # head: a resample of probe counts c is the recorded multiset of probes, c_p copies of each
    from dynamics.analysis.probe_resample import probe_weights

    rng = np.random.default_rng(5)
    attn = xr.DataArray(random_causal(rng, (1, 2, 3, P), T), dims=DIMS)
    tokens = rng.integers(0, 8, size=(P, T))
    tokens[0, 5] = tokens[3, 9] = SLASH
    tokens = xr.DataArray(tokens, dims=("probe", "position"))
    w = probe_weights(P, 12, seed=4)
    resampled = role_scores(attn, tokens, weights=w)
    for r in range(12):
        take = np.repeat(np.arange(P), np.rint(w.values[r] * P).astype(int))
        alone = role_scores(attn.isel(probe=take), tokens.isel(probe=take))
        for name in alone.data_vars:
            np.testing.assert_allclose(resampled[name].isel(resample=r), alone[name], rtol=1e-12, err_msg=name)
        assert np.array_equal(assign_roles(resampled).isel(resample=r), assign_roles(alone))
    # lazily the same
    lazy = role_scores(attn.chunk({"layer": 1}), tokens, weights=w)
    assert isinstance(lazy["sink"].data, da.Array)
    xr.testing.assert_allclose(lazy.compute(), resampled, rtol=1e-12)


def test_induction_is_unscored_on_the_resamples_whose_tokens_uniform_attention_passes():
    # probe 0 repeats one token, where uniform attention scores 0.554 on induction; probe 1 has two
    # repeats, 1/4 and 1/7 there: pooled, chance is (3.321 + 0.393) / 8 = 0.464, past 0.4
    attn = xr.DataArray(np.stack([uniform(8)] * 2)[None, None, None], dims=DIMS)
    tokens = xr.DataArray([[3] * 8, [0, 1, 2, 0, 3, 4, 1, 5]], dims=("probe", "position"))
    w = xr.DataArray([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]], dims=("resample", "probe"))
    induction = role_scores(attn, tokens, weights=w)["induction"].isel(snapshot=0, layer=0, head=0).values
    np.testing.assert_allclose(induction, [np.nan, (1 / 4 + 1 / 7) / 2, np.nan], rtol=1e-6)  # float32 dot
    assert np.isnan(role_scores(attn, tokens)["induction"].item())


@pytest.mark.parametrize("weights, says", [
    (xr.DataArray([1.0, -1.0], dims="probe"), "finite and >= 0"),
    (xr.DataArray([0.0, 0.0], dims="probe"), "positive sum"),
    (xr.DataArray([1.0, 1.0, 1.0], dims="probe"), "weights cover 3 probes, the values 2"),
    (xr.DataArray([1.0, 1.0], dims="draw"), "probe"),
])
def test_bad_probe_weights_are_refused(weights, says):
    attn, tokens = _two_probe_head()
    with pytest.raises(ValueError, match=says):
        role_scores(attn, tokens, weights=weights)


@pytest.mark.parametrize("n_probe", [6, 7, 12])
def test_a_head_alike_on_every_probe_keeps_its_tie_broken_label_on_every_resample(n_probe):
    # previous-token on probes of '/' only: previous_token and token both score exactly 1, and the
    # tie goes to the first role. Weighted by shares k / P, a sum read 0.9999999999999999 where P
    # is no power of two, and resamples labelled the head "token" (agreement 0.92 at P = 6)
    from dynamics.analysis.probe_resample import label_agreement, probe_counts

    prev = np.eye(16, k=-1)
    prev[0, 0] = 1.0
    attn = xr.DataArray(np.broadcast_to(prev, (1, 1, 1, n_probe, 16, 16)), dims=DIMS)
    tokens = xr.DataArray(np.full((n_probe, 16), SLASH), dims=("probe", "position"))
    label = assign_roles(role_scores(attn, tokens))
    assert role_names(label).item() == "previous_token"
    again = assign_roles(role_scores(attn, tokens, weights=probe_counts(n_probe)))
    assert label_agreement(label, again).item() == 1.0


def test_a_probe_sensitive_head_names_the_most_frequent_other_label_and_prints_one_decimal():
    from dynamics.analysis.roles import probe_sensitive_heads, probe_sensitive_text

    # head 0: its label (sink) on 179 of 200, previous_token and local 10 times each (a tie: the
    # first in ROLES), self once; head 1: 180 of 200, not named
    sink, prev, own, local = (ROLES.index(r) for r in ("sink", "previous_token", "self", "local"))
    again = np.array([[sink, sink]] * 179 + [[local, sink]] * 10 + [[prev, local]] * 10 + [[own, local]])
    labels = xr.DataArray([[sink, sink]], dims=("layer", "head"))
    (head,) = probe_sensitive_heads(labels, xr.DataArray(again[:, None], dims=("resample", "layer", "head")))
    assert head == {"layer": 0, "head": 0, "role": "sink", "agreement": 0.895, "other": "previous_token"}
    assert probe_sensitive_text(head) == "L0H0 sink 89.5% (else previous_token)"  # not "90%", under 90%
