"""Known-answer tests for dynamics.analysis.bifurcation."""

import dask
import numpy as np
import pytest
import xarray as xr

from dynamics.analysis.bifurcation import bifurcation_step, commitment_step, gini, head_importance, winner_take_all


def _refuse(*args, **kwargs):
    raise AssertionError("computed eagerly: the analysers must only build a dask graph")


def no_compute():
    """Any dask computation inside this context fails the test."""
    return dask.config.set(scheduler=_refuse)


STEPS = np.array([0, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120])


def curve(values, steps=STEPS):
    return xr.DataArray(np.asarray(values, float), dims="snapshot", coords={"step": ("snapshot", steps)})


def noisy_jump(seed, jump_at, level=1.0, height=0.5, sd=0.005):
    x = level + np.random.default_rng(seed).normal(scale=sd, size=len(STEPS))
    x[jump_at:] += height
    return x


def test_bifurcation_step_finds_a_planted_jump():
    for jump_at in (3, 5, 9, 11):
        out = bifurcation_step(curve(noisy_jump(jump_at, jump_at)))
        assert out.dims == ()
        assert float(out) == STEPS[jump_at]


def test_bifurcation_step_is_nan_for_flat_or_returning_curves():
    assert np.isnan(float(bifurcation_step(curve(noisy_jump(0, len(STEPS), height=0.0)))))
    assert np.isnan(float(bifurcation_step(curve(np.ones(len(STEPS))))))
    excursion = noisy_jump(1, 5)
    excursion[-1] = 1.0  # back inside the band at the end: never left for good
    assert np.isnan(float(bifurcation_step(curve(excursion))))


def test_bifurcation_step_takes_the_final_departure_and_downward_jumps():
    x = noisy_jump(2, 4)
    x[7] = 1.0  # dips back into the band once; the departure that lasts starts at 8
    assert float(bifurcation_step(curve(x))) == STEPS[8]
    assert float(bifurcation_step(curve(noisy_jump(3, 6, height=-0.4)))) == STEPS[6]


def test_bifurcation_step_relative_floor():
    # A perfectly flat baseline has sigma = 0: without the relative floor any drift would
    # count; with rel_tol = 0.05 a 2% drift stays inside, a 10% one leaves.
    x = np.ones(len(STEPS))
    x[6:] = 1.02
    assert np.isnan(float(bifurcation_step(curve(x))))
    assert float(bifurcation_step(curve(x), rel_tol=0.0)) == STEPS[6]
    x[6:] = 1.1
    assert float(bifurcation_step(curve(x))) == STEPS[6]
    x[6:] = 1.07  # between 5% and 10%: the default floor is 5%, no wider
    assert float(bifurcation_step(curve(x))) == STEPS[6]
    assert np.isnan(float(bifurcation_step(curve(x), rel_tol=0.1)))


def test_bifurcation_step_band_uses_the_sample_sd_of_the_baseline():
    # Baseline 1.0, 1.1, 0.9: mean 1, sample sd sqrt((0 + 0.01 + 0.01) / (3 - 1)) = 0.1, so the
    # band is 1 +- 3 * 0.1 = [0.7, 1.3] (the relative floor, 0.05, is narrower). A plateau at 1.27
    # stays inside; at 1.33 it leaves. (The population sd, 0.0816, would put the edge at 1.245.)
    x = np.ones(len(STEPS))
    x[:3] = [1.0, 1.1, 0.9]
    x[6:] = 1.27
    assert np.isnan(float(bifurcation_step(curve(x))))
    x[6:] = 1.33
    assert float(bifurcation_step(curve(x))) == STEPS[6]


def test_bifurcation_step_absolute_floor_on_a_zero_baseline():
    # Heads with identical starting attention: divergence exactly 0 at the baseline, so sigma and
    # |mu| are both 0 and float rounding (1e-9) was the bifurcation.
    x = np.zeros(len(STEPS))
    x[6:] = 1e-9
    assert np.isnan(float(bifurcation_step(curve(x))))
    assert float(bifurcation_step(curve(x), abs_tol=0.0)) == STEPS[6]
    x[6:] = 0.01  # a real departure from 0
    assert float(bifurcation_step(curve(x))) == STEPS[6]
    with pytest.raises(ValueError, match="abs_tol"):
        bifurcation_step(curve(x), abs_tol=-1.0)


def test_a_split_inside_the_baseline_is_dated_where_the_curve_left_its_first_value():
    # A large learning rate: the heads part within the first steps. Baseline 0.3, 0.38, 0.56: mean
    # 0.4133, sample sd 0.1305, band 0.4133 +- 0.3916 = [0.0218, 0.805], which holds the plateau at
    # 0.73, so the band alone said "never" for the run that split fastest. The curve left its first
    # value's floor band, 0.3 +- 0.015, at snapshot 1 and stayed out: step 5.
    fast = np.full(len(STEPS), 0.73)
    fast[:3] = [0.3, 0.38, 0.56]
    assert float(bifurcation_step(curve(fast))) == STEPS[1]
    # Left inside the baseline and went on past the band (0.9 > 0.805 at snapshot 3): still the
    # step it left its first value, not the later one the widened band gives (a faster split would
    # otherwise read later than a slower one whose band holds it).
    fast[3:] = 0.9
    assert float(bifurcation_step(curve(fast))) == STEPS[1]
    # A drift of 0.30 -> 0.32 that holds leaves 0.3 +- 0.015 at snapshot 1 for good: dated there,
    # though a larger jump comes at snapshot 5 (the band, 0.3133 +- 0.0346, alone dates that one)
    drift = np.array([0.30, 0.32, 0.32, 0.32, 0.32, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7])
    assert float(bifurcation_step(curve(drift))) == STEPS[1]
    assert float(bifurcation_step(curve(drift), rel_tol=0.1)) == STEPS[5]  # 0.32 inside 0.3 +- 0.03
    # 0.3, 0.31, 0.33: 0.31 is inside 0.3 +- 0.015, 0.33 outside, and the band (0.3133 +- 0.0458)
    # holds the plateau at 0.33: snapshot 2.
    slow = np.full(len(STEPS), 0.33)
    slow[:2] = [0.3, 0.31]
    assert float(bifurcation_step(curve(slow))) == STEPS[2]
    assert float(bifurcation_step(curve(slow), rel_tol=0.2)) != STEPS[2]  # 0.33 is inside 0.3 +- 0.06
    # Back at its first value at the end (0.305 is inside 0.3 +- 0.015): it did not leave for good.
    back = fast.copy()
    back[-1] = 0.305
    assert np.isnan(float(bifurcation_step(curve(back))))
    # Heads that start identical (0) and part at snapshot 2; 1e-9 at snapshot 1 is rounding.
    zero = np.full(len(STEPS), 0.05)
    zero[:2] = [0.0, 1e-9]
    assert float(bifurcation_step(curve(zero))) == STEPS[2]
    # The baseline's length is the option's: a jump at snapshot 3 leaves a 3-snapshot band (0.3 +-
    # 0.015), and falls inside a 4-snapshot one (0.4 +- 0.6), where the first value's band dates it.
    late = np.full(len(STEPS), 0.7)
    late[:3] = 0.3
    assert float(bifurcation_step(curve(late))) == STEPS[3]
    assert float(bifurcation_step(curve(late), n_baseline=4)) == STEPS[3]


def test_a_split_inside_the_baseline_in_a_ragged_lazy_sweep():
    # Two runs: the first split at snapshot 1 and was recorded at 5 snapshots only (padding, NaN
    # step, after them: not data, so not a return to the first value); the second is flat, then
    # jumps at snapshot 4.
    x = np.array([[0.3, 0.5, 0.7, 0.7, 0.7, np.nan, np.nan], [0.3, 0.3, 0.3, 0.3, 0.6, 0.6, 0.6]])
    steps = np.array([[0, 1, 2, 4, 8, np.nan, np.nan], [0, 1, 2, 4, 8, 16, 32]])
    da = xr.DataArray(x, dims=("run", "snapshot"), coords={"step": (("run", "snapshot"), steps)})
    np.testing.assert_array_equal(bifurcation_step(da).values, [1, 8])
    with no_compute():
        lazy = bifurcation_step(da.chunk({"run": 1}))
    np.testing.assert_array_equal(lazy.compute().values, [1, 8])


def test_bifurcation_step_vectorised_lazy_and_without_step_coord():
    jumps = np.array([[3, 6, 100], [4, 11, 8]])  # 100: never
    x = np.stack([[noisy_jump(10 * r + h, j) for h, j in enumerate(row)] for r, row in enumerate(jumps)])
    da = xr.DataArray(x, dims=("run", "head", "snapshot"), coords={"step": ("snapshot", STEPS)})
    expected = np.where(jumps < len(STEPS), STEPS[np.minimum(jumps, len(STEPS) - 1)], np.nan)
    out = bifurcation_step(da)
    assert out.dims == ("run", "head")
    np.testing.assert_array_equal(out.values, expected)
    with no_compute():
        lazy = bifurcation_step(da.chunk({"run": 1, "snapshot": 5}))
    assert lazy.chunks is not None
    np.testing.assert_array_equal(lazy.compute().values, expected)
    bare = bifurcation_step(da.drop_vars("step"))
    np.testing.assert_array_equal(bare.values, np.where(jumps < len(STEPS), jumps, np.nan))


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_an_all_nan_curve_has_no_bifurcation_lazily_as_in_memory_without_a_warning():
    # a layer of one head has no within-layer divergence: dask's nanmean and nanvar warned
    # "invalid value encountered in divide" (analyse on a store read lazily), numpy's did not
    curve = xr.DataArray(np.full((2, 5), np.nan), dims=("layer", "snapshot"), coords={"step": ("snapshot", STEPS[:5])})
    curve[1] = [1.0, 1.0, 1.0, 1.0, 5.0]
    for c in (curve, curve.chunk()):
        with dask.config.set(scheduler="synchronous"):
            out = bifurcation_step(c, n_baseline=3).compute()
        np.testing.assert_array_equal(out.values, [np.nan, STEPS[4]])


def test_bifurcation_step_validates():
    with pytest.raises(ValueError, match="n_baseline"):
        bifurcation_step(curve(np.ones(len(STEPS))), n_baseline=1)
    with pytest.raises(ValueError, match="n_baseline"):
        bifurcation_step(curve(np.ones(len(STEPS))), n_baseline=len(STEPS))


# ----------------------------------------------------------------------------- commitment


def test_commitment_step_planted_sequences():
    seqs = {
        (0, 0): [0, 0, 0, 0, 0, 0],  # never changes: first snapshot
        (0, 1): [0, 1, 0, 2, 2, 2],  # last change at index 3
        (1, 0): [1, 1, 1, 1, 1, 2],  # changes at the last snapshot
        (1, 1): [2, 1, 1, 1, 1, 1],  # settles at index 1
    }
    steps = np.array([0, 100, 200, 400, 800, 1600])
    labels = np.zeros((6, 2, 2), dtype=np.int8)
    for (l, h), s in seqs.items():
        labels[:, l, h] = s
    da = xr.DataArray(labels, dims=("snapshot", "layer", "head"), coords={"step": ("snapshot", steps)})
    out = commitment_step(da)
    assert out.dims == ("layer", "head")
    np.testing.assert_array_equal(out.values, [[0, 400], [1600, 100]])

    sweep = xr.concat([da, da.isel(head=[1, 0]).assign_coords(head=[0, 1])], dim="run")
    with no_compute():
        both = commitment_step(sweep.chunk({"snapshot": 2}))
    assert both.dims == ("run", "layer", "head") and both.chunks is not None
    np.testing.assert_array_equal(both.compute().values, [[[0, 400], [1600, 100]], [[400, 0], [100, 1600]]])


def test_commitment_step_missing_heads_and_single_snapshot():
    lab = np.array([[0.0, np.nan], [1.0, np.nan], [1.0, np.nan]])[:, None, :]
    da = xr.DataArray(lab, dims=("snapshot", "layer", "head"), coords={"step": ("snapshot", [0, 10, 20])})
    np.testing.assert_array_equal(commitment_step(da).values, [[10.0, np.nan]])
    np.testing.assert_array_equal(commitment_step(da.isel(snapshot=[0])).values, [[0.0, np.nan]])


def test_commitment_step_skips_a_label_missing_mid_run():
    # label 1 from step 10, missing at step 20: NaN != 1 made 20 and 30 two changes (30 reported)
    lab = np.array([[0, 1, np.nan, 1, 1], [np.nan, np.nan, 2, 2, 2], [0, 1, np.nan, 2, 2]], dtype=float)
    da = xr.DataArray(lab.T[:, None, :], dims=("snapshot", "layer", "head"),
                      coords={"step": ("snapshot", [0, 10, 20, 30, 40])})
    # missing at first: committed from its first label; a change across the gap still counts
    np.testing.assert_array_equal(commitment_step(da).values, [[10.0, 20.0, 30.0]])
    lazy = commitment_step(da.chunk({"head": 1}))
    assert isinstance(lazy.data, dask.array.Array)
    np.testing.assert_array_equal(lazy.values, [[10.0, 20.0, 30.0]])


# ----------------------------------------------------------------------------- gini


def test_steps_come_from_a_per_run_step_coordinate():
    # open_sweep gives step dims (run, snapshot) when runs were recorded at different steps;
    # the answer must be each run's own step, not the snapshot index.
    steps = np.array([[0, 10, 20, 30, 40, 50, 60], [0, 100, 200, 300, 400, 500, 600]])
    x = np.array([[1.0, 1.01, 0.99, 1.0, 2.0, 2.1, 2.2]] * 2)
    c = xr.DataArray(x, dims=("run", "snapshot"), coords={"step": (("run", "snapshot"), steps)})
    assert bifurcation_step(c).values.tolist() == [40.0, 400.0]
    codes = np.array([[0, 1, 0, 2, 2, 2, 2]] * 2)[:, :, None, None]
    lab = xr.DataArray(codes, dims=("run", "snapshot", "layer", "head"),
                       coords={"step": (("run", "snapshot"), steps)})
    assert commitment_step(lab).values.ravel().tolist() == [30.0, 300.0]


def test_bifurcation_step_is_nan_for_a_padded_run_that_never_departs():
    # open_sweep pads a shorter run (step NaN at the end). A run whose recorded curve ends inside
    # its band never bifurcated: NaN, not step 0 (the first padded snapshot's NaN step once read
    # as 0 by a skipna sum).
    x = np.array([[1.0, 1.01, 0.99, 1.0, 2.0, 2.1, 2.2], [1.0, 1.01, 0.99, 1.0, 1.0, np.nan, np.nan]])
    steps = np.array([[0, 10, 20, 30, 40, 50, 60], [0, 10, 20, 30, 40, np.nan, np.nan]])
    c = xr.DataArray(x, dims=("run", "snapshot"), coords={"step": (("run", "snapshot"), steps)})
    np.testing.assert_array_equal(bifurcation_step(c).values, [40.0, np.nan])
    np.testing.assert_array_equal(bifurcation_step(c.isel(run=[1], snapshot=slice(0, 5))).values, [np.nan])


@pytest.mark.parametrize("n", [2, 5, 12])
def test_gini_equal_and_one_hot(n):
    assert float(gini(xr.DataArray(np.full(n, 3.7), dims="head"))) == 0.0
    one_hot = np.zeros(n)
    one_hot[n // 2] = 2.0
    np.testing.assert_allclose(float(gini(xr.DataArray(one_hot, dims="head"))), (n - 1) / n, rtol=1e-14)


def test_gini_matches_sorted_formula_and_is_scale_invariant():
    x = np.random.default_rng(0).exponential(size=(4, 7))
    s = np.sort(x, axis=-1)
    i = np.arange(1, 8)
    ref = 2 * (i * s).sum(-1) / (7 * s.sum(-1)) - 8 / 7
    da = xr.DataArray(x, dims=("layer", "head"))
    np.testing.assert_allclose(gini(da).values, ref, rtol=1e-12)
    np.testing.assert_allclose(gini(3 * da).values, ref, rtol=1e-12)
    np.testing.assert_allclose(gini(da.rename(head="unit").T, dim="unit").values, ref, rtol=1e-12)


def test_gini_missing_values_and_all_zero():
    x = xr.DataArray([[1.0, 0.0, 0.0, np.nan], [0.0, 0.0, 0.0, 0.0], [np.nan] * 4], dims=("layer", "head"))
    np.testing.assert_allclose(gini(x).values, [2 / 3, 0.0, np.nan])


def test_winner_take_all_dims_lazy_and_run_dim():
    imp = np.random.default_rng(1).exponential(size=(2, 5, 3, 4))
    imp[0, :, 0] = 1.0  # equal heads
    imp[1, :, 1] = [0, 0, 3, 0]  # one head carries the layer
    da = xr.DataArray(imp, dims=("run", "snapshot", "layer", "head"), coords={"step": ("snapshot", np.arange(5))})
    out = winner_take_all(da)
    assert out.dims == ("run", "snapshot", "layer")
    np.testing.assert_allclose(out.values[0, :, 0], 0.0, atol=1e-15)
    np.testing.assert_allclose(out.values[1, :, 1], 0.75)
    with no_compute():
        lazy = winner_take_all(da.chunk({"snapshot": 2}))
    assert lazy.chunks is not None
    np.testing.assert_allclose(lazy.compute().values, out.values)
    np.testing.assert_array_equal(out["step"].values, np.arange(5))


def test_winner_take_all_is_undefined_for_a_layer_of_one_head():
    # The Gini of one value is 0, which read as "importance evenly spread" for every layer of a
    # one-head model; a layer with one head present (the others padded) is the same case.
    imp = xr.DataArray([[[2.0, np.nan, np.nan], [1.0, 3.0, np.nan], [0.0, 0.0, 5.0]]], dims=("snapshot", "layer", "head"))
    np.testing.assert_allclose(winner_take_all(imp).values, [[np.nan, 0.25, 2 / 3]])
    assert np.isnan(winner_take_all(imp.isel(head=[0]))).all()


def test_head_importance_is_the_gate_times_the_recorded_gradient():
    # Michel et al.'s xi sits on the head's output g z: dL/dxi = g dL/dg, with g in [0, 1].
    imp = xr.DataArray([[[2.0, 2.0, np.nan], [1.0, 4.0, 3.0]]], dims=("snapshot", "layer", "head"), name="importance")
    gate = xr.DataArray([[[1.0, 0.25, 1.0], [0.5, 0.0, 1.0]]], dims=("snapshot", "layer", "head"))
    out = head_importance(imp, gate)
    np.testing.assert_array_equal(out.values, [[[2.0, 0.5, np.nan], [0.5, 0.0, 3.0]]])
    assert out.name == "importance" and out.dims == imp.dims
    assert head_importance(imp) is imp  # fixed gates: g = 1
    np.testing.assert_array_equal(head_importance(imp, gate * 0 + 1).values, imp.values)
    # the Gini sees a shut head as carrying nothing, not as the layer's largest
    np.testing.assert_allclose(winner_take_all(out).values, [[0.3, 4 / 7]])  # sum|xi - xj| / (2 n^2 mean)
    np.testing.assert_allclose(winner_take_all(imp).values, [[0.0, 0.25]])


# Known answers that mutants of this module passed: each computed on paper or by a small numpy or
# scipy reference, never by the function under test.

def _curve(values, steps):
    return xr.DataArray(np.asarray(values, float), dims="snapshot",
                        coords={"step": ("snapshot", np.asarray(steps, float))})


def test_commitment_step_of_one_run_picked_from_a_ragged_sweep():
    # One run .sel()-ed from a ragged sweep has a 1-D step ending in NaN; its last label is
    # its last recorded one, not the padding (a mutant read the padding and gave NaN).
    lab = xr.DataArray(np.array([0.0, 1.0, 1.0, np.nan])[:, None, None], dims=("snapshot", "layer", "head"),
                       coords={"step": ("snapshot", [0.0, 10.0, 20.0, np.nan])})
    assert float(commitment_step(lab)[0, 0]) == 10.0


def test_commitment_step_ignores_a_change_into_padding_of_integer_labels():
    # Integer labels cannot hold NaN: only the NaN step marks the padding. A mutant that read
    # the padding's label as a change gave NaN.
    lab = xr.DataArray(np.array([0, 1, 1, 2])[:, None, None], dims=("snapshot", "layer", "head"),
                       coords={"step": ("snapshot", [0.0, 10.0, 20.0, np.nan])})
    assert float(commitment_step(lab)[0, 0]) == 10.0


def test_bifurcation_with_k_zero_and_every_point_outside():
    # k >= 0 is allowed (k = 0 keeps only the floors), and when nothing lies inside the band
    # the final stretch starts at snapshot 0. Band: mu = 2/3, w = max(0, 0.05 * 2/3, 1e-6).
    x = _curve([0.0, 2.0, 0.0, 5.0, 5.0], [0, 10, 20, 30, 40])
    assert float(bifurcation_step(x, k=0.0)) == 0.0


def test_bifurcation_baseline_mean_skips_a_missing_point():
    # Baseline [1, NaN, 1]: mu = 1, sd = 0, w = rel_tol = 0.05; 1.02 is inside, 1.5 outside.
    # A mean dividing by n_baseline (mu = 2/3) widened the band and found no departure.
    x = _curve([1.0, np.nan, 1.0, 1.0, 1.02, 1.5], [0, 10, 20, 30, 40, 50])
    assert float(bifurcation_step(x)) == 50.0


def test_bifurcation_band_keeps_its_floors_when_one_baseline_point_is_recorded():
    # sd of one value is undefined; np.fmax lets the floors define the band (w = 0.05 around
    # mu = 1). np.maximum made the band NaN and every such curve "never departs".
    x = _curve([np.nan, np.nan, 1.0, 1.02, 1.5], [0, 10, 20, 30, 40])
    assert float(bifurcation_step(x)) == 40.0


def test_bifurcation_relative_floor_uses_the_absolute_baseline_mean():
    # mu = -1: w = 0.05 |mu| = 0.05, so -1.02 is inside. Without abs() the floor vanished
    # and the tiny drift at step 30 was the bifurcation.
    x = _curve([-1.0, -1.0, -1.0, -1.02, -1.5, -1.5], [0, 10, 20, 30, 40, 50])
    assert float(bifurcation_step(x)) == 40.0


def test_bifurcation_of_a_padded_run_that_departs():
    # Padding past a run's last snapshot cannot contradict a departure.
    x = _curve([1.0, 1.0, 1.0, 1.0, 5.0, np.nan], [0, 10, 20, 30, 40, np.nan])
    assert float(bifurcation_step(x)) == 40.0


def test_steps_are_float64_and_exact_past_float32():
    # Documented float64 step; 2**24 + 1 is not representable in float32.
    big = 2.0**24
    x = _curve([1.0, 1.0, 1.0, 5.0, 5.0], [0, 1, 2, big + 1, big + 3])
    out = bifurcation_step(x)
    assert out.dtype == np.float64 and float(out) == big + 1


def test_gini_of_a_single_present_value_is_zero():
    # G in [0, (n-1)/n]: one value is 0 (winner_take_all, not gini, makes it NaN).
    assert float(gini(xr.DataArray([3.0, np.nan], dims="head"))) == 0.0


def test_head_importance_refuses_a_whole_run_or_a_run_as_gate_naming_the_argument():
    # A whole run came back unchanged, no error; a run passed as gate raised xarray's "the first
    # argument to .rename must be a dictionary".
    imp = xr.DataArray([[1.0, 2.0]], dims=("layer", "head"), name="importance")
    run = xr.Dataset({"importance": imp, "gate": imp * 0 + 1})
    with pytest.raises(ValueError, match=r"^head_importance: importance must be an xarray DataArray .*its variables: "
                                         r"importance, gate"):
        head_importance(run)
    with pytest.raises(ValueError, match=r"^head_importance: gate must be an xarray DataArray .*its variables"):
        head_importance(imp, run)
    with pytest.raises(ValueError, match=r"^head_importance: gate needs dims \('head',\)"):
        head_importance(imp, imp.isel(head=0))


def test_head_importance_is_nan_where_the_gate_is():
    # "NaN where either input is": a missing gate must not read as g = 1.
    imp = xr.DataArray([[2.0, 2.0]], dims=("layer", "head"))
    gate = xr.DataArray([[np.nan, 0.5]], dims=("layer", "head"))
    out = head_importance(imp, gate).values[0]
    assert np.isnan(out[0]) and out[1] == 1.0


def test_the_first_values_floor_is_of_its_size_for_a_negative_curve_too():
    # the band is two-sided and sign-free; the first value's floor is rel_tol |x_0|, not rel_tol x_0
    steps = [0, 1, 2, 4, 8, 16, 32, 64]
    x = xr.DataArray([-0.3, -0.305, -0.33, -0.33, -0.33, -0.33, -0.33, -0.33], dims="snapshot",
                     coords={"step": ("snapshot", steps)})
    assert float(bifurcation_step(x)) == 2.0  # -0.305 is inside -0.3 +- 0.015
    assert float(bifurcation_step(-x)) == 2.0
