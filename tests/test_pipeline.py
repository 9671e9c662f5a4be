"""analyse_run: the lazy, block-by-block path gives the in-memory path's values."""

import re
import warnings

import dask
import numpy as np
import pytest
import xarray as xr

from dynamics.analysis import pipeline
from dynamics.analysis.pipeline import analyse_run, summary_row
from dynamics.analysis.roles import role_names

S, L, H, P, T, D, M = 7, 2, 3, 2, 10, 4, 12


def causal_softmax(rng, shape):
    logits = rng.normal(size=(*shape, T, T)) * 3
    logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def sweep_like(seed=0):
    """Two runs as open_sweep returns them: a run dim with swept coords, the second run's last
    head missing (NaN), step per snapshot, float16 attention."""
    rng = np.random.default_rng(seed)
    attn = causal_softmax(rng, (2, S, L, H, P)).astype(np.float16)
    i = np.arange(T)
    attn[:, 2:, 0, 0] = 0
    attn[:, 2:, 0, 0, :, i, np.maximum(i - 1, 0)] = 1  # a previous-token head from snapshot 2
    attn[1, :, :, H - 1] = np.nan
    tokens = rng.integers(0, 60, size=(2, P, T))
    tokens[:, :, ::4] = ord("/")
    weights = rng.normal(size=(2, S, L, H, 4, M, D)).astype(np.float32)
    weights[1, :, :, H - 1] = np.nan
    importance = rng.random((2, S, L, H)).astype(np.float32)
    importance[1, :, :, H - 1] = np.nan
    snap = ("run", "snapshot", "layer", "head")
    return xr.Dataset(
        {
            "attention": (snap + ("probe", "query", "key"), attn),
            "probe_tokens": (("run", "probe", "position"), tokens),
            "importance": (snap, importance),
            "head_weights": (snap + ("weight", "d_model", "d_head"), weights),
        },
        coords={
            "run": ["a", "b"],
            "init_scale": ("run", [1.0, 2.0]),
            "step": ("snapshot", np.array([0, 1, 2, 4, 8, 16, 20])),
            "weight": ["q", "k", "v", "o"],
        },
    )


@pytest.mark.parametrize("stage_bytes", [1, 10**9])
def test_lazy_blocks_match_in_memory(monkeypatch, stage_bytes):
    # stage_bytes=1: one snapshot per task, so block edges fall everywhere; 1e9: one block.
    ds = sweep_like()
    expected = analyse_run(ds).load()
    monkeypatch.setattr(pipeline, "STAGE_BYTES", stage_bytes)
    lazy = analyse_run(ds.chunk({"run": 1, "snapshot": 2}))
    assert lazy["js_distance"].chunks is not None, "the lazy path should stay lazy"
    with dask.config.set(scheduler="synchronous"):
        got = lazy.load()
    assert set(got.data_vars) == set(expected.data_vars)
    for name in expected.data_vars:
        xr.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-9)
    assert got.init_scale.values.tolist() == [1.0, 2.0]


def test_known_roles_and_missing_heads():
    result = analyse_run(sweep_like()).load()
    names = role_names(result["role"].isel(snapshot=-1))  # (run, layer, head)
    assert names[0, 0, 0] == names[1, 0, 0] == "previous_token"
    # a head run b does not have is no role, not "none"
    assert (names[1, :, H - 1] == "").all() and (names[0, :, H - 1] != "").all()
    again = role_names(result["role_resampled"].transpose("resample", "run", ...))  # so too on every resample
    assert (again[:, 1, :, H - 1] == "").all() and (again[:, 0, :, H - 1] != "").all()
    assert (again[:, :, 0, 0] == "previous_token").all()
    # A missing head has no divergence and no pairing with the others.
    assert np.isnan(result["divergence_from_init"].sel(run="b", head=H - 1)).all()
    assert (result["divergence_from_init"].isel(snapshot=0).sel(run="a") == 0).all()
    row = summary_row(result.sel(run="a"))
    assert row["roles"]["previous_token"] >= 1
    # Padded heads have no role history: NaN, not the first step.
    assert np.isnan(result["commitment_step"].sel(run="b", head=H - 1)).all()
    assert result["commitment_step"].sel(run="a", layer=0, head=0).item() == 2.0


def test_every_variable_names_what_it_is_and_its_units():
    # Plots label their axes from attrs: most variables had none, best_slash carried slash_score's
    # "diagonal key = query - offset", and the two dominant shares had one long_name between them.
    result = analyse_run(sweep_like())
    for name, v in result.data_vars.items():
        assert v.attrs.get("long_name"), name
        # roles: flag_values and flag_meanings instead; cluster: a label (its "" read "[]" on an axis)
        assert "units" in v.attrs or name in ("role", "role_resampled", "cluster"), name
        if name.startswith("role") and name != "role_score":
            assert v.attrs["flag_meanings"].split() == list(result.attrs["roles"]), name
        # xarray wraps a label at 30 characters, and a default figure cut a long one's first lines off
        assert len(v.attrs["long_name"]) <= 50, name
    assert result["best_slash"].attrs["long_name"] != result["slash_score"].attrs["long_name"]
    assert result["slash_dominant_share"].attrs["long_name"] != result["token_dominant_share"].attrs["long_name"]
    assert result["js_distance"].attrs["units"] == "sqrt(nat)" and result["bifurcation_step"].attrs["units"] == "steps"
    # clusters span the model (cluster_heads links every head with every other): "within its layer"
    # was the label once, the opposite of what the numbers are
    assert result["cluster"].attrs["description"].startswith("redundancy cluster of the head among all heads of the model")
    assert "units" not in result["cluster"].attrs


def test_a_sink_head_is_not_slash_dominant():
    # slash_score(T - 1) = A[T-1, 0] = 1 for a sink head, so the dominance window must stop at
    # T // 2 like the slash role's; T = 10 here, within the stored offsets 0..min(16, T-1).
    ds = sweep_like().sel(run="a", drop=True)
    a = ds.attention.values.copy()
    a[:, 1, 0] = 0
    a[:, 1, 0, :, :, 0] = 1  # layer 1, head 0 attends only to key 0
    ds["attention"] = (ds.attention.dims, a)
    r = analyse_run(ds).load().sel(layer=1, head=0)
    assert (np.asarray(pipeline.ROLES)[r.role.values] == "sink").all()
    assert not r.slash_dominant.any()
    assert (r.best_offset <= T // 2).all()
    assert np.isnan(r.slash_emergence_step)


def shorter_b(ds, n):
    """`ds` as open_sweep pads it when run b recorded only its first n snapshots: NaN after
    them, step included (run, snapshot)."""
    padded = ds.copy(deep=True)
    for name in ("attention", "importance", "head_weights"):
        values = padded[name].values
        values[1, n:] = np.nan
        padded[name] = (padded[name].dims, values)
    step = np.tile(ds.step.values.astype(np.float64), (2, 1))
    step[1, n:] = np.nan
    return padded.drop_vars("step").assign_coords(step=(("run", "snapshot"), step))


def test_a_shorter_run_in_a_sweep_ends_at_its_own_last_snapshot():
    # open_sweep pads a run with fewer snapshots with NaN at the end, step included (run,
    # snapshot). The "from here to the end" analysers must end that run at its last recorded
    # snapshot, as when it is analysed alone, not read the padding as its final stretch.
    ds = sweep_like()
    n = 5
    alone = ds.sel(run="b").isel(snapshot=slice(0, n))
    padded = shorter_b(ds, n)
    got = analyse_run(padded).load().sel(run="b")
    want = analyse_run(alone).load()
    # run b picked from the sweep keeps the padding, with a 1-D step that is NaN there
    picked = analyse_run(padded.sel(run="b")).load()
    for name in ("bifurcation_step", "commitment_step", "slash_emergence_step", "token_emergence_step"):
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)
        np.testing.assert_array_equal(picked[name].values, want[name].values, err_msg=name)
    np.testing.assert_allclose(picked["attention_correlation"].values, want["attention_correlation"].values,
                               rtol=1e-12, atol=1e-12)
    row, want_row = summary_row(picked), summary_row(want)
    assert want_row["roles"] and row["roles"] == want_row["roles"]
    # relabelled on the probe resamples at run b's own last snapshot, not at the padding
    np.testing.assert_array_equal(got["role_resampled"].values, want["role_resampled"].values)
    np.testing.assert_array_equal(picked["role_resampled"].values, want["role_resampled"].values)
    assert (role_names(want["role_resampled"]) != "none").any()
    assert row["probe_sensitive_roles"] == want_row["probe_sensitive_roles"]
    assert row["redundancy"] == want_row["redundancy"]
    np.testing.assert_allclose(row["final_divergence"], want_row["final_divergence"], rtol=1e-12)
    # a float reduction over differently shaped blocks: another numpy (2.5.2 on the GPU machine)
    # sums it in another order, 3e-16 apart
    np.testing.assert_allclose(got["attention_correlation"].values, want["attention_correlation"].values,
                               rtol=1e-12, atol=1e-12)
    assert np.isfinite(want["commitment_step"].sel(layer=0, head=0)), "the test needs a committed head"
    # the padding is no snapshot of run b: not labelled "none", not "not dominant", but missing
    for name in ("role", "slash_dominant", "token_dominant"):
        assert got[name].isel(snapshot=slice(n, None)).isnull().all(), name
        np.testing.assert_array_equal(got[name].isel(snapshot=slice(0, n)).values, want[name].values, err_msg=name)
    assert (role_names(got.role.isel(snapshot=-1)) == "").all()
    assert (role_names(got.role.isel(snapshot=n - 1)) == role_names(want.role.isel(snapshot=-1))).all()


def test_a_selection_that_casts_probe_tokens_to_float_is_analysed():
    # sweep.where(mask, drop=True) turns every int variable float, probe_tokens included, with
    # no NaN in it: that is a selection, not runs that differ in context or probes.
    ds = sweep_like()
    picked = ds.where(ds.run == "b", drop=True)
    assert picked.probe_tokens.dtype.kind == "f"
    got = analyse_run(picked).load()
    want = analyse_run(ds.sel(run=["b"])).load()
    xr.testing.assert_allclose(got.role_score, want.role_score)


def test_token_dominance_follows_the_token_threshold():
    # Layer 1 head 1 puts 0.4 on key 0 (a '/') and 0.6 on a non-'/' key: its share of attention
    # on visible '/' tokens is (1.0 + 9 * 0.4) / 10 = 0.46 in every probe.
    from dynamics.analysis.roles import RoleThresholds

    ds = sweep_like().sel(run="a", drop=True)
    a = ds.attention.values.copy()
    head = np.zeros((T, T))
    head[0, 0] = 1.0
    for i in range(1, T):
        head[i, 0] = 0.4
        head[i, i if i % 4 else i - 1] += 0.6
    a[:, 1, 1] = head
    ds["attention"] = (ds.attention.dims, a)
    for threshold, dominant in ((0.45, True), (0.5, False)):
        opt = pipeline.AnalysisOptions(roles=RoleThresholds(token=threshold), token_run_length=2)
        r = analyse_run(ds, opt).load()
        np.testing.assert_allclose(r.token_share.sel(layer=1, head=1), 0.46, rtol=1e-3)
        # the share against uniform causal attention's, c(i) / (i + 1): query i sees 1 + i // 4 '/'
        i = np.arange(1, T)
        ratio = (1.0 + sum(0.4 * (i + 1) / (1 + i // 4))) / T
        np.testing.assert_allclose(r.token_ratio.sel(layer=1, head=1), ratio, rtol=1e-3)
        assert (r.token_dominant.sel(layer=1, head=1).values == dominant).all(), threshold
        assert r.attrs["token_threshold"] == threshold


def uniform_and_sink(n_snapshots, tokens, sink_from=0):
    """One layer of two heads over probes `tokens` (probe, position): head 0 uniform throughout,
    head 1 uniform until snapshot `sink_from`, then wholly on key 0."""
    n_probe, t = tokens.shape
    uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    attn = np.broadcast_to(uniform, (n_snapshots, 1, 2, n_probe, t, t)).copy()
    attn[sink_from:, 0, 1] = 0
    attn[sink_from:, 0, 1, ..., 0] = 1
    return xr.Dataset(
        {"attention": (("snapshot", "layer", "head", "probe", "query", "key"), attn.astype(np.float16)),
         "probe_tokens": (("probe", "position"), tokens),
         "importance": (("snapshot", "layer", "head"), np.ones((n_snapshots, 1, 2)))},
        coords={"step": ("snapshot", np.arange(n_snapshots) * 10)},
    )


def test_token_share_is_the_mean_over_the_probes_that_hold_the_token():
    # Head 1 looks only at key 0. Probe 0 has its '/' there (share 1 at every query), probe 1 at
    # key 2, where the head never looks (share 0), probe 2 has none (undefined, left out): the
    # head's share is (1 + 0) / 2. Its ratio to uniform attention is i + 1 at query i of probe 0,
    # mean 5.5 over the 10 queries, and 0 in probe 1: 2.75.
    t = 10
    tokens = np.arange(100, 100 + 3 * t).reshape(3, t)
    tokens[0, 0] = tokens[1, 2] = ord("/")
    r = analyse_run(uniform_and_sink(4, tokens)).load().sel(layer=0, head=1)
    np.testing.assert_allclose(r.token_share, 0.5)
    np.testing.assert_allclose(r.token_ratio, 2.75)
    np.testing.assert_allclose(r.role_score.sel(role_name="token"), 0.5)


def test_the_bifurcation_band_spans_the_baseline_snapshots_of_the_options():
    # The heads' mean divergence is 0 at snapshots 0 and 1 and D > 0 from snapshot 2 on (head 1
    # turns into a sink). A 2-snapshot baseline (0, 0) has no spread: the jump at step 20 leaves
    # it. A 3-snapshot baseline (0, 0, D) takes the jump in: mean D/3, sd D/sqrt(3), band
    # 3 D/sqrt(3) = 1.73 D wide on each side, and the plateau D, 2D/3 from the mean, never leaves
    # it; the split is then dated where the curve left its first value, 0 +- 1e-6: step 20 too
    # (the band alone said "never"). A 6-snapshot baseline leaves no snapshot to test.
    ds = uniform_and_sink(6, np.arange(100, 120).reshape(2, 10), sink_from=2)
    default = analyse_run(ds).load()
    d = float(default.mean_divergence[-1])
    np.testing.assert_allclose(default.mean_divergence, [0, 0, d, d, d, d], atol=1e-12)
    assert d > 0.1
    assert float(default.bifurcation_step) == 20.0 and default.attrs["baseline_snapshots"] == 3
    two = analyse_run(ds, pipeline.AnalysisOptions(baseline_snapshots=2)).load()
    assert float(two.bifurcation_step) == 20.0 and two.attrs["baseline_snapshots"] == 2
    with pytest.raises(ValueError, match="6 snapshot"):
        analyse_run(ds, pipeline.AnalysisOptions(baseline_snapshots=6))


def test_layers_that_split_and_merge_at_once_bifurcate_where_their_mean_does_not(capsys):
    # Layer 0's heads split at step 30 (head 1 turns into a sink) as layer 1's merge (its sink
    # turns uniform): the mean over layers stays at D / 2 and never leaves its band, so the run
    # read "bifurcation never" while both layers plainly left theirs at step 30.
    from dynamics.tables import print_analysis

    ds = uniform_and_sink(6, np.arange(100, 120).reshape(2, 10), sink_from=3)
    other = ds.attention.isel(layer=[0]).values.copy()
    other[:, 0, 1] = ds.attention.values[::-1][:, 0, 1]  # head 1 a sink until snapshot 3, then uniform
    ds = xr.Dataset({"attention": xr.concat([ds.attention, ds.attention.copy(data=other)], "layer"),
                     "importance": xr.concat([ds.importance] * 2, "layer"), "probe_tokens": ds.probe_tokens})
    r = analyse_run(ds).load()
    d = float(r.within_layer_divergence.isel(snapshot=-1, layer=0))
    np.testing.assert_allclose(r.within_layer_divergence.sel(layer=0), [0, 0, 0, d, d, d], atol=1e-12)
    np.testing.assert_allclose(r.within_layer_divergence.sel(layer=1), [d, d, d, 0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(r.mean_divergence, d / 2, atol=1e-12)
    assert np.isnan(r.bifurcation_step)
    np.testing.assert_array_equal(r.layer_bifurcation_step, [30.0, 30.0])
    row = summary_row(r)
    assert row["bifurcation_step"] is None and row["layer_bifurcation_steps"] == [30, 30]
    print_analysis([{"run": "ra", "status": "completed", **row}])
    table = capsys.readouterr().out.splitlines()
    assert "never (by layer: 30, 30)" in table[1]
    one = summary_row(analyse_run(ds.isel(layer=[0])).load())  # one layer: its step is the model's
    assert one["bifurcation_step"] == 30 and one["layer_bifurcation_steps"] == [30]
    print_analysis([{"run": "rb", "status": "completed", **one}])
    assert capsys.readouterr().out.splitlines()[1].split()[2] == "30"


def test_summary_bifurcation_is_undefined_not_never_with_one_head_per_layer():
    # One head per layer: no pair of heads, no divergence curve, so no bifurcation step to
    # find. The analyse table printed "never" (None) for it, as for a curve that never departs.
    one_head = analyse_run(sweep_like().sel(run="a", drop=True).isel(head=[0])).load()
    assert one_head["mean_divergence"].isnull().all()
    assert summary_row(one_head)["bifurcation_step"] == "undefined"
    assert summary_row(one_head)["layer_bifurcation_steps"] == ["undefined"] * one_head.sizes["layer"]
    # and the stored array's label says so: a sum over a head-count sweep in xarray would
    # otherwise count these runs as "never bifurcated"
    assert "undefined where no layer has two heads" in one_head["bifurcation_step"].attrs["description"]
    assert "undefined in a layer of one head" in one_head["layer_bifurcation_step"].attrs["description"]
    flat = analyse_run(sweep_like().sel(run="a", drop=True)).load()
    assert np.isnan(flat["bifurcation_step"]) and flat["mean_divergence"].notnull().all()
    assert summary_row(flat)["bifurcation_step"] is None


def test_summary_divergence_is_undefined_with_one_head_per_layer():
    # The analyse table printed the NaN as "nan" beside an "undefined" bifurcation step.
    one_head = analyse_run(sweep_like().sel(run="a", drop=True).isel(head=[0])).load()
    assert summary_row(one_head)["final_divergence"] == "undefined"
    flat = analyse_run(sweep_like().sel(run="a", drop=True)).load()
    assert summary_row(flat)["final_divergence"] == pytest.approx(float(flat.mean_divergence[-1]))


def test_a_one_head_model_has_no_redundancy_and_no_winner_take_all():
    # A one-layer, one-head model: the redundancy fraction and winner-take-all read 0.00 ("every
    # head unique", "importance evenly spread") where there is no second head to compare with.
    short = sweep_like().sel(run="a", drop=True).isel(snapshot=slice(0, 4))
    lone = analyse_run(short.isel(layer=[0], head=[0])).load()
    assert lone["redundancy_fraction"].isnull().all() and lone["winner_take_all"].isnull().all()
    assert summary_row(lone)["redundancy"] == "undefined"
    # One head per layer, two layers: two heads in the model, so redundancy is defined.
    per_layer = analyse_run(short.isel(head=[0])).load()
    assert per_layer["winner_take_all"].isnull().all() and per_layer["redundancy_fraction"].notnull().all()
    assert summary_row(per_layer)["redundancy"] == float(per_layer.redundancy_fraction[-1])


def test_the_summary_counts_redundant_heads_of_the_heads_a_run_has():
    # Run b lacks its last head in each layer (a sweep's padding): 4 heads. Three of them given
    # one pattern form a cluster, the fourth (random) stays alone: 3 of 4, not of the 6 slots.
    ds = sweep_like()
    a = ds.attention.values.copy()
    for layer, head in ((0, 1), (1, 0)):
        a[1, :, layer, head] = a[1, :, 0, 0]
    ds["attention"] = (ds.attention.dims, a)
    row = summary_row(analyse_run(ds).load().sel(run="b"))
    assert (row["redundant_heads"], row["heads"], row["redundancy"]) == (3, 4, 0.75)
    lone = summary_row(analyse_run(ds.sel(run="a", drop=True).isel(layer=[0], head=[0])).load())
    assert lone["redundancy"] == "undefined" and lone["redundant_heads"] is None and lone["heads"] == 1


def test_a_long_offset_slash_head_is_slash_dominant_where_its_role_is_slash():
    # T = 64: the slash role looks at offsets up to T // 2 = 32. A perfect offset-20 head (the
    # offset_copy task's kind) was labelled "slash" but scored for dominance only up to the
    # stored max_offset 16: not slash-dominant, best offset 16, no emergence step.
    rng = np.random.default_rng(0)
    S_, T_, d = 5, 64, 20
    uniform = np.tril(np.ones((T_, T_))) / np.arange(1, T_ + 1)[:, None]
    attn = np.broadcast_to(uniform, (S_, 1, 2, 2, T_, T_)).copy()
    i = np.arange(T_)
    attn[:, 0, 1] = 0
    attn[:, 0, 1, :, i, np.where(i >= d, i - d, 0)] = 1
    ds = xr.Dataset(
        {"attention": (("snapshot", "layer", "head", "probe", "query", "key"), attn.astype(np.float16)),
         "probe_tokens": (("probe", "position"), rng.integers(0, 40, (2, T_))),
         "importance": (("snapshot", "layer", "head"), rng.random((S_, 1, 2)))},
        coords={"step": ("snapshot", np.arange(S_) * 10)},
    )
    r = analyse_run(ds).load().sel(layer=0, head=1)
    assert (np.asarray(pipeline.ROLES)[r.role.values] == "slash").all()
    assert (r.slash_offset == d).all() and (r.best_offset == d).all()
    assert r.slash_dominant.all() and r.slash_emergence_step.item() == 0.0
    np.testing.assert_allclose(r.best_slash, 1.0)
    assert r.attrs["slash_offsets"] == [1, T_ // 2]


@pytest.mark.parametrize("T_", [2, 3, 4])
def test_short_probes_leave_uniform_and_sink_heads_not_slash_dominant(T_):
    # Over T <= 4 positions uniform attention (T = 2: slash_score(1) = 0.5) or a sink head
    # (T = 3, 4: 1 / (T - delta) = 0.5 at the window's last offset) reached kappa = 0.5, so the
    # table counted them slash-dominant while the roles already left those offsets unscored.
    rng = np.random.default_rng(0)
    uniform = np.tril(np.ones((T_, T_))) / np.arange(1, T_ + 1)[:, None]
    attn = np.broadcast_to(uniform, (4, 1, 2, 2, T_, T_)).copy()
    attn[:, 0, 1] = 0
    attn[:, 0, 1, :, :, 0] = 1  # head 1 attends only to key 0
    ds = xr.Dataset(
        {"attention": (("snapshot", "layer", "head", "probe", "query", "key"), attn.astype(np.float16)),
         "probe_tokens": (("probe", "position"), rng.integers(0, 40, (2, T_))),
         "importance": (("snapshot", "layer", "head"), rng.random((4, 1, 2)))},
        coords={"step": ("snapshot", np.arange(4) * 10)},
    )
    r = analyse_run(ds).load()
    assert not (r.slash_dominant == 1).any()
    if T_ == 4:
        assert summary_row(r)["slash_dominant"] == 0
        assert (r.slash_dominant_share == 0).all()
    else:  # no offset left to score: undefined, where the table printed 0 and the share read 0
        assert r.slash_dominant.isnull().all() and r.slash_dominant_share.isnull().all()
        assert summary_row(r)["slash_dominant"] == "undefined"
    assert r.attrs["slash_offsets_unscored"] == {2: [1], 3: [1], 4: [2]}[T_]
    if T_ == 4:  # offset 1 still tells a previous-token head from these two
        assert r.best_offset.isel(snapshot=-1).values.tolist() == [[1.0, 1.0]]


@pytest.mark.parametrize("n_probe", [2, 3])
def test_token_dominance_is_undefined_with_fewer_probes_than_a_run_needs(n_probe):
    # Every head wholly on a "/" at position 0 in every probe: with 2 probes a run of 3 cannot
    # be seen, and the heads read "not dominant" (share 0) where nothing could be told.
    T_ = 12
    rng = np.random.default_rng(0)
    attn = np.zeros((4, 1, 2, n_probe, T_, T_))
    attn[..., 0] = 1
    tokens = rng.integers(48, 60, (n_probe, T_))
    tokens[:, 0] = ord("/")
    ds = xr.Dataset(
        {"attention": (("snapshot", "layer", "head", "probe", "query", "key"), attn.astype(np.float16)),
         "probe_tokens": (("probe", "position"), tokens),
         "importance": (("snapshot", "layer", "head"), rng.random((4, 1, 2)))},
        coords={"step": ("snapshot", np.arange(4) * 10)},
    )
    r = analyse_run(ds).load()
    assert (r.token_share == 1).all()
    if n_probe == 2:
        assert r.token_dominant.isnull().all() and r.token_dominant_share.isnull().all()
        assert r.token_emergence_step.isnull().all()
    else:
        assert (r.token_dominant == 1).all() and (r.token_dominant_share == 1).all()
        assert (r.token_emergence_step == 0).all()


def test_uninformative_offsets_only_on_contexts_of_four_or_less():
    opt = pipeline.AnalysisOptions()
    assert [pipeline.uninformative_offsets(t, opt) for t in (2, 3, 4, 5, 16)] == [[1], [1], [2], [], []]


def test_a_sweep_whose_runs_differ_in_context_is_refused():
    # open_sweep pads the shorter run's query, key and position with NaN; every score then came
    # out NaN for that run and every head was labelled "none", with no error.
    ds = sweep_like()
    dims = ("query", "key", "position")
    short = ds.sel(run=["a"]).isel({d: slice(0, T - 2) for d in dims})
    # As open_sweep does it: label the ragged dims 0..n-1, outer-join, drop the labels.
    runs = [x.assign_coords({d: np.arange(x.sizes[d]) for d in dims}) for x in (short, ds.sel(run=["b"]))]
    ragged = xr.concat(runs, dim="run", join="outer").drop_vars(dims)
    assert ragged["probe_tokens"].isnull().any()
    with pytest.raises(ValueError, match="differ in context or n_probe"):
        analyse_run(ragged)


def test_a_sweep_padded_to_more_heads_is_analysed_lazily_as_in_memory():
    # open_sweep's outer join on head leaves a run padded to more heads in two head chunks
    # (here as in a store: (H - 1, 1)); the block stage refused them (inconsistent chunks).
    ds = sweep_like().isel(run=[1], snapshot=slice(0, 2))  # run b: its last head is padding
    opt = pipeline.AnalysisOptions()
    expected = pipeline._attention_stage_by_blocks(ds.attention, ds.probe_tokens, opt, max_offset=5)
    lazy = ds.chunk({"snapshot": 1, "head": (H - 1, 1), "probe": 1})
    with dask.config.set(scheduler="synchronous"):
        got = pipeline._attention_stage_by_blocks(lazy.attention, lazy.probe_tokens, opt, max_offset=5).load()
    for name in expected.data_vars:
        xr.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-9)


def unwritten_after(ds, n, run=None):
    """`ds` as a run (or one run of a sweep) stopped after snapshot n reads: NaN from there on."""
    ds = ds.copy(deep=True)
    for name in ("attention", "importance", "head_weights"):
        values = ds[name].values
        if run is None:
            values[n:] = np.nan
        else:
            values[list(ds.run.values).index(run), n:] = np.nan
        ds[name] = (ds[name].dims, values)
    return ds


def test_an_unfinished_run_is_refused_with_the_snapshots_it_recorded():
    # open_run of an interrupted (or running) run reads the snapshots training never reached as
    # NaN; analysed, every head's final role was "none" and its commitment step NaN, without a word.
    run = sweep_like().sel(run="a", drop=True)
    run.attrs = {"run_id": "r1", "status": "interrupted"}
    stopped = unwritten_after(run, 5)
    with pytest.raises(ValueError, match=r"^run r1 \(interrupted\): its snapshot at step 20 was never written "
                                         r"\(NaN\); analyse what it recorded: ds.isel\(snapshot=slice\(0, 5\)\)$"):
        analyse_run(stopped)
    with pytest.raises(ValueError, match="never written"):
        analyse_run(stopped.chunk({"snapshot": 1}))  # lazy, as open_run gives it
    assert analyse_run(stopped.isel(snapshot=slice(0, 5))).sizes["snapshot"] == 5  # the cut it names


def test_a_diverged_run_is_pointed_to_the_cut_analyse_makes():
    run = unwritten_after(sweep_like().sel(run="a", drop=True), 4)
    run.attrs = {"run_id": "r1", "status": "diverged", "diverged_step": 8}
    with pytest.raises(ValueError, match=r"recorded_before_divergence\(ds, 8\)$"):
        analyse_run(run)


def test_a_sweep_with_an_unfinished_run_names_it():
    sweep = unwritten_after(sweep_like(), 5, run="b").assign_coords(status=("run", ["completed", "running"]))
    sweep.attrs = {"runs": {"a": {"status": "completed"}, "b": {"status": "running"}}}
    with pytest.raises(ValueError, match=r"^run b \(running\): its snapshot at step 20 was never written"):
        analyse_run(sweep)
    assert analyse_run(sweep.sel(run=sweep.status == "completed")).sizes["run"] == 1  # the selection it names


def test_too_few_snapshots_are_refused_naming_how_many_are_needed():
    # bifurcation_step raised "n_baseline=3 must be >= 2 and < the 2 snapshots", an option's inner name
    with pytest.raises(ValueError, match=r"^2 snapshot\(s\) given; the analysis needs >= 4 "):
        analyse_run(sweep_like().isel(snapshot=[0, 1]))


@pytest.mark.parametrize("pick", [False, True])
def test_a_sweep_run_with_too_few_recorded_snapshots_is_refused_not_read_as_never_bifurcating(pick):
    # Counted by the sweep's padded snapshot dim (7), run b's 3 passed, and its bifurcation came
    # out NaN, which summary_row prints as "never left its noise band": alone it is refused.
    padded = shorter_b(sweep_like(), 3)
    with pytest.raises(ValueError, match=r"^3 snapshot\(s\) given; the analysis needs >= 4 "):
        analyse_run(padded.sel(run="b").isel(snapshot=slice(0, 3)))
    name = "" if pick else r"run b: "
    with pytest.raises(ValueError, match=rf"^{name}3 snapshot\(s\) given; the analysis needs >= 4 "):
        analyse_run(padded.sel(run="b") if pick else padded)
    assert analyse_run(shorter_b(sweep_like(), 4)).sizes["run"] == 2  # 4 recorded: analysed


def one_run(n_snapshots, seed=0):
    """A run of n snapshots chunked as a store reads it: one snapshot per chunk."""
    rng = np.random.default_rng(seed)
    p, t, m, d = 4, 16, 8, 4
    snap = ("snapshot", "layer", "head")
    logits = rng.normal(size=(n_snapshots, L, H, p, t, t)) * 3
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    ds = xr.Dataset(
        {
            "attention": (snap + ("probe", "query", "key"), (e / e.sum(-1, keepdims=True)).astype(np.float16)),
            "probe_tokens": (("probe", "position"), rng.integers(0, 60, size=(p, t))),
            "importance": (snap, rng.random((n_snapshots, L, H)).astype(np.float32)),
            "head_weights": (snap + ("weight", "d_model", "d_head"),
                             rng.normal(size=(n_snapshots, L, H, 4, m, d)).astype(np.float32)),
        },
        coords={"step": ("snapshot", 10 * np.arange(n_snapshots)), "weight": ["q", "k", "v", "o"]},
    )
    return ds.chunk({"snapshot": 1})


def test_the_analysers_after_the_attention_stage_add_no_tasks_per_block(monkeypatch):
    # The graph is held in memory while it runs. The analysers downstream of the attention
    # stage, and those of importance and head weights, added ~50 tasks per stage block and per
    # snapshot: 76 MiB of graph for a run of 432 snapshots, 0.09 bytes per byte of attention.
    # Now the stage's small results are gathered into one chunk and the small per-snapshot
    # arrays read in blocks, so past the stage a snapshot costs its reads of them (2) and
    # their share of the blocks' tasks.
    per_snapshot = L * H * 4 * 16 * 16 * 2  # float16 attention of one snapshot
    monkeypatch.setattr(pipeline, "STAGE_BYTES", per_snapshot)  # one snapshot per stage block

    def tasks_past_the_stage(n):
        ds = one_run(n)
        stage = pipeline._attention_stage_by_blocks(ds.attention, ds.probe_tokens, pipeline.AnalysisOptions(),
                                                    max_offset=8)
        return len(dict(analyse_run(ds).__dask_graph__())) - len(dict(stage.__dask_graph__()))

    grows = (tasks_past_the_stage(24) - tasks_past_the_stage(12)) / 12
    assert grows <= 6, f"{grows:.1f} tasks per extra snapshot past the stage"


def test_the_graph_of_a_run_in_blocks_gives_the_in_memory_values(monkeypatch):
    ds = one_run(9, seed=3)
    expected = analyse_run(ds.load()).load()
    monkeypatch.setattr(pipeline, "STAGE_BYTES", 2 * L * H * 4 * 16 * 16 * 2)  # blocks of 2 snapshots: 5 blocks
    with dask.config.set(scheduler="synchronous"):
        got = analyse_run(ds).load()
    for name in expected.data_vars:
        xr.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-9)


def test_analysis_options_refuse_what_no_analyser_can_use():
    from dynamics.analysis.roles import RoleThresholds

    # a role window below the slash-dominance start raised "no offsets in [1, 0]" from analyse_run
    with pytest.raises(ValueError, match=r"roles.slash_max_offset 2 leaves slash-dominance no offsets"):
        pipeline.AnalysisOptions(slash_min_offset=3, roles=RoleThresholds(slash_min_offset=1, slash_max_offset=2))
    with pytest.raises(ValueError, match=r"slash_max_offset must be >= 1 \(offset 0 alone is the self role\); got 0"):
        pipeline.AnalysisOptions(roles=RoleThresholds(slash_min_offset=0, slash_max_offset=0))
    for kw, needle in [({"kappa": 0.0}, "kappa must be in"), ({"kappa": 1.5}, "kappa must be in"),
                       ({"max_offset": 0}, "max_offset must be >= 1"), ({"baseline_snapshots": 1}, r"baseline_snapshots must be >= 2; got 1"),
                       ({"cluster_threshold": float("nan")}, "cluster_threshold must be > 0"),
                       ({"slash_min_offset": -1}, "slash_min_offset must be >= 0")]:
        with pytest.raises(ValueError, match=needle):
            pipeline.AnalysisOptions(**kw)
    pipeline.AnalysisOptions(roles=RoleThresholds(slash_min_offset=1, slash_max_offset=1), kappa=1.0)  # a window of one offset is one


def test_each_analyser_names_its_result_after_what_it_measures():
    # They were named after their input ("attention", "importance"), so xr.merge of two of them
    # failed on conflicting "attention" variables and plots labelled a distance "attention".
    from dynamics.analysis import (
        attention_correlation,
        best_offset,
        cluster_heads,
        divergence_from_init,
        gini,
        js_distance,
        mean_within_layer_divergence,
        principal_angles,
        qk_cosine,
        redundancy_fraction,
        slash_score,
        winner_take_all,
        within_layer_divergence,
    )

    ds = sweep_like().sel(run="a", drop=True)
    jsd = js_distance(ds.attention)
    got = {
        "js_distance": jsd,
        "divergence_from_init": divergence_from_init(ds.attention),
        "within_layer_divergence": within_layer_divergence(jsd),
        "mean_divergence": mean_within_layer_divergence(jsd),
        "cluster": cluster_heads(jsd),
        "redundancy_fraction": redundancy_fraction(cluster_heads(jsd)),
        "attention_correlation": attention_correlation(ds.attention.isel(snapshot=-1)),
        "gini": gini(ds.importance),
        "winner_take_all": winner_take_all(ds.importance),
        "qk_cosine": qk_cosine(ds.head_weights),
        "q_subspace_mean_cos": principal_angles(ds.head_weights),
    }
    assert {name: da.name for name, da in got.items()} == {name: name for name in got}
    merged = xr.merge([got["within_layer_divergence"], got["divergence_from_init"], got["gini"]])
    assert set(merged.data_vars) == {"within_layer_divergence", "divergence_from_init", "gini"}
    offset, _ = best_offset(slash_score(ds.attention))
    assert offset.attrs == {"long_name": "offset of the largest slash score", "units": "positions"}


def test_wrong_input_is_named_before_any_work():
    # Each failed deep inside xarray ("'layer' not found in array dimensions ('head',)",
    # KeyError 'attention', AttributeError on a dict of options).
    from dynamics.analysis import AnalysisOptions

    ds = sweep_like().sel(run="a", drop=True)
    with pytest.raises(TypeError, match="takes a run's Dataset .* not a DataArray"):
        analyse_run(ds.attention)
    with pytest.raises(TypeError, match="options must be an AnalysisOptions"):
        analyse_run(ds, {"cluster_threshold": 0.2})
    with pytest.raises(ValueError, match="probe_tokens, importance missing"):
        analyse_run(ds[["attention"]])
    with pytest.raises(ValueError, match=r"analyse_run: attention needs dims .*'layer' missing .* select with a list"):
        analyse_run(ds.isel(layer=0))
    assert analyse_run(ds.isel(layer=[0]), AnalysisOptions()).sizes["layer"] == 1


def test_the_public_analysers_name_a_dataset_or_a_variable_given_for_another():
    # a Dataset passed where one of its variables is wanted failed deep in xarray ("inconsistent
    # chunks", "the first argument to .rename must be a dictionary"); a variable without the dims
    # within_layer_divergence averages over was averaged all the same: its mean importance read as a
    # divergence curve
    import dynamics.analysis as A

    ds = sweep_like().sel(run="a", drop=True)
    scores = A.role_scores(ds.attention, ds.probe_tokens)
    for call, what in (
            (lambda x: A.js_distance(x), "js_distance: attn_a"),
            (lambda x: A.principal_angles(x), "head_weights"),
            (lambda x: A.qk_cosine(x), "head_weights"),
            (lambda x: A.winner_take_all(x), "winner_take_all: importance"),
            (lambda x: A.gini(x), "gini: x"),
            (lambda x: A.redundancy_fraction(x), r"redundancy_fraction: labels \(of cluster_heads\)"),
            (lambda x: A.attention_correlation(x), "attention_correlation: attn"),
            (lambda x: A.within_layer_divergence(x), r"within_layer_divergence: jsd \(of js_distance\)"),
            (lambda x: A.slash_score(x), "attention"),
            (lambda x: A.best_offset(x), r"scores \(of slash_score\)"),
            (lambda x: A.slash_dominant(x, delta=1), r"slash_dominant: scores \(of slash_score\)"),
            (lambda x: A.dominant_share(x), "dominant_share: dominant"),
            (lambda x: A.commitment_step(x), "commitment_step: labels")):
        with pytest.raises(ValueError, match=rf"^{what} must be an xarray DataArray with dims .*, one variable of "
                                             rf"the Dataset given \(its variables: attention, "):
            call(ds)
    for call, what in ((lambda: A.within_layer_divergence(ds.importance), "within_layer_divergence: jsd"),
                       (lambda: A.mean_within_layer_divergence(ds.attention), "within_layer_divergence: jsd"),
                       (lambda: A.attention_correlation(ds.importance), "attention_correlation: attn"),
                       (lambda: A.principal_angles(ds.attention), "head_weights"),
                       (lambda: A.token_share(ds.attention, ds.probe_tokens.rename(position="pos")), "tokens")):
        with pytest.raises(ValueError, match=rf"{what}.* needs dims"):
            call()
    with pytest.raises(ValueError, match=r"^role_scores: tokens must be an xarray DataArray with dims "
                                         r"\('probe', 'position'\); got ndarray$"):
        A.role_scores(ds.attention, ds.probe_tokens.values)
    with pytest.raises(ValueError, match=r"^assign_roles: scores must be the Dataset of every role score that "
                                         r"role_scores returns; got DataArray$"):
        A.assign_roles(scores["self"])


def test_options_of_the_wrong_kind_are_named_by_field():
    # roles=None: AttributeError; kappa="0.5": a bare TypeError from '<'; token_run_length=2.5
    # accepted, and token_dominant then used a run of 2
    from dynamics.analysis import AnalysisOptions, RoleThresholds

    for kw, message in ((dict(roles=None), "AnalysisOptions.roles: expected a RoleThresholds, got None"),
                        (dict(kappa="0.5"), "AnalysisOptions.kappa: expected a number, got '0.5'"),
                        (dict(token_run_length=2.5), "AnalysisOptions.token_run_length: expected an integer, got 2.5"),
                        (dict(max_offset=True), "AnalysisOptions.max_offset: expected an integer, got True")):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            AnalysisOptions(**kw)
    for kw, message in ((dict(sink="0.3"), "RoleThresholds.sink: expected a number, got '0.3'"),
                        (dict(local_width=2.0), "RoleThresholds.local_width: expected an integer, got 2.0")):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            RoleThresholds(**kw)
    # numpy scalars are numbers, and None stays the slash window's default
    assert AnalysisOptions(kappa=np.float32(0.5), max_offset=np.int64(4)).max_offset == 4
    assert RoleThresholds(slash_max_offset=None, token_id=np.int64(3)).slash_max_offset is None


def test_the_time_axis_analysers_and_summary_row_name_a_wrong_input():
    # a bare KeyError: 'snapshot' for a curve over "step", "tuple.index(x): x not in tuple" for a
    # share without "probe", and a TypeError on converting arrays for a sweep's whole analysis
    from dynamics.analysis import bifurcation_step, commitment_step, emergence_step, token_dominant

    curve = xr.DataArray(np.zeros((5, 2)), dims=("step", "layer"))
    for fn, what in ((bifurcation_step, "curve"), (commitment_step, "labels"), (emergence_step, "dominant")):
        with pytest.raises(ValueError, match=rf"{fn.__name__}: {what} needs dims \('snapshot',\); 'snapshot' missing"):
            fn(curve)
    with pytest.raises(TypeError, match=r"token_dominant: run_length must be an integer; got 1.9"):
        token_dominant(xr.DataArray([0.9, 0.1, 0.9], dims="probe"), run_length=1.9)
    with pytest.raises(ValueError, match=r"token_dominant: share needs dims \('probe',\); 'probe' missing"):
        token_dominant(xr.DataArray([[0.6, 0.7, 0.8]], dims=("head", "probes")))
    result = analyse_run(sweep_like())
    with pytest.raises(ValueError, match=r"summary_row takes one run's analysis; select one with .sel\(run=...\)"):
        summary_row(result)
    assert summary_row(result.sel(run="a")) == summary_row(analyse_run(sweep_like().sel(run="a", drop=True)))


@pytest.mark.parametrize("narrower", ["d_head", "d_model"])
def test_a_run_padded_to_wider_weights_keeps_its_qk_cosines_and_subspaces(narrower):
    # open_sweep pads a narrower run's weight columns with NaN (head-count sweeps at a fixed
    # d_model, width sweeps): every head of it came out NaN in qk_cosine and q_subspace_cos
    from dynamics.analysis.divergence import principal_angles, qk_cosine

    ds = sweep_like()
    cut = {narrower: slice(0, ds.sizes[narrower] - 2)}
    weights = ds["head_weights"].values.copy()
    axis = ds["head_weights"].dims.index(narrower)
    index = [slice(None)] * weights.ndim
    index[0], index[axis] = 1, slice(ds.sizes[narrower] - 2, None)
    weights[tuple(index)] = np.nan  # run b: the last two columns are padding
    ds["head_weights"] = (ds["head_weights"].dims, weights)
    out = analyse_run(ds)
    for run in ("a", "b"):
        own = ds["head_weights"].sel(run=run)
        own = own.isel(cut) if run == "b" else own
        xr.testing.assert_allclose(out["qk_cosine"].sel(run=run), qk_cosine(own))
        xr.testing.assert_allclose(out["q_subspace_cos"].sel(run=run), principal_angles(own, weight="q"))
        # one run picked from the sweep keeps its padding: cropped as in the sweep
        picked = analyse_run(ds.sel(run=run))
        xr.testing.assert_allclose(picked["qk_cosine"], qk_cosine(own))
        xr.testing.assert_allclose(picked["q_subspace_cos"], principal_angles(own, weight="q"))
    real = out["qk_cosine"].sel(run="b").isel(head=slice(0, H - 1), head_b=slice(0, H - 1))
    assert real.notnull().all()  # the last head of b is missing, the others are not
    assert out["qk_cosine"].sel(run="b").isel(head=H - 1).isnull().all()
    # lazily, in a store's chunks, the same
    lazy = analyse_run(ds.chunk({"run": 1, "snapshot": 2}))
    xr.testing.assert_allclose(lazy["q_subspace_cos"].load(), out["q_subspace_cos"])


def test_a_run_without_head_weights_beside_one_with_them_reads_nan_not_an_error():
    # open_sweep fills the weights of a run that recorded none (head_weights auto past d_model
    # 256) with NaN: its width read 0, and the 0-wide slice failed in dask (ZeroDivisionError)
    ds = sweep_like()
    weights = ds["head_weights"].values.copy()
    weights[1] = np.nan
    ds["head_weights"] = (ds["head_weights"].dims, weights)
    for data in (ds, ds.chunk({"run": 1, "snapshot": 2})):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = analyse_run(data).load()
        assert out["qk_cosine"].sel(run="b").isnull().all() and out["q_subspace_cos"].sel(run="b").isnull().all()
        assert out["qk_cosine"].sel(run="a").notnull().all()


def test_the_summary_counts_voita_heads_not_labelled_previous_token_and_roles_held_at_step_0():
    # Head 0 peaks one step back in every row from snapshot 2, holding 0.43 there (slash_score(1)
    # at T = 12: 0.3 + 0.7 (H_12 - 1) / 11): Voita et al.'s positional head, short of the
    # previous_token role's 0.5. Head 1 is a sink (all on key 0) from step 0: a role held before
    # any update. T = 12 keeps sink scored (uniform alpha_0 = H_12 / 12 = 0.26 < 0.3).
    t, n = 12, 4
    ds = uniform_and_sink(n, np.arange(100, 100 + 2 * t).reshape(2, t))
    weak = 0.3 * np.eye(t, k=-1) + 0.7 * np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    attn = ds["attention"].values.copy()
    attn[2:, 0, 0] = weak.astype(np.float16)
    r = analyse_run(ds.assign(attention=(ds["attention"].dims, attn))).load()
    peak = r["previous_token_peak"].sel(layer=0)
    np.testing.assert_allclose(peak.sel(head=0), [0, 0, 1, 1])  # uniform rows tie: no peak
    np.testing.assert_allclose(peak.sel(head=1), 0)  # key 0 is one step back in row 1 only, not counted
    assert role_names(r["role"].isel(snapshot=-1).values).ravel().tolist() == ["diffuse", "sink"]
    row = summary_row(r)
    assert row["peak_not_previous_token"] == 1
    assert row["roles_at_start"] == {"sink": 1} and row["start_step"] == 0
    assert r["previous_token_peak"].attrs["units"] == "1"


def test_the_resampled_labels_take_the_options_thresholds():
    # thresholds under which sweep_like's near-uniform heads read local, sink or diffuse: labelled
    # by the defaults on the resamples, they read otherwise, and most agreements fell to 0
    from dynamics.analysis.pipeline import AnalysisOptions
    from dynamics.analysis.probe_resample import probe_counts
    from dynamics.analysis.roles import RoleThresholds, assign_roles, role_scores

    ds = sweep_like().isel(run=0)
    roles = RoleThresholds(sink=0.15, diffuse=0.6, local=0.5, induction=0.2)
    got = analyse_run(ds, AnalysisOptions(roles=roles)).load()
    final = ds["attention"].isel(snapshot=-1)
    want = assign_roles(role_scores(final, ds["probe_tokens"], roles, weights=probe_counts(P)), roles)
    np.testing.assert_array_equal(got["role_resampled"].values, want.transpose("resample", ...).values)
    default = assign_roles(role_scores(final, ds["probe_tokens"], weights=probe_counts(P)))
    assert (default.transpose("resample", ...).values != got["role_resampled"].values).any()
