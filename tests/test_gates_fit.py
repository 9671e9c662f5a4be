"""Known answers for `gates.fit` and `gates._engine`: the definitions no other test pinned.

Each test here failed under a mutation that left tests/test_gates.py passing (a helper audit's):
G+/G- fitted from the random draw instead of the lambda = 0 fit, one clipping norm shared by all
gate sets, every update on the first fit batch, and the authors' defaults changed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynamics.config import from_dict
from dynamics.gates import GateOptions, fit_chg
from dynamics.gates._engine import _optimise
from dynamics.train import build
from tests.test_gates import TINY, _hand_nll, one_thread  # noqa: F401 - one_thread: the module-scoped autouse fixture


@pytest.fixture
def tiny():
    cfg = from_dict(TINY)
    torch.manual_seed(0)
    return build(cfg, torch.device("cpu")), cfg


def test_the_defaults_are_the_authors():
    # Nam et al. 2025: lambda 0.1, Adam at lr 1 with gradients clipped to norm 1, logits clamped
    # to +-4 in the regulariser; 4 restarts of 200 updates, this project's defaults for its sizes.
    o = GateOptions()
    assert (o.lam, o.lr, o.grad_clip, o.clamp, o.restarts, o.steps) == (0.1, 1.0, 1.0, 4.0, 4, 200)


def test_g_plus_and_g_minus_start_from_the_lambda_zero_fit(tiny):
    model, cfg = tiny
    init = torch.full((1, 2, 2), 2.0)  # (restart, layer, head) logits: gates 0.88
    ds = fit_chg(model, cfg, GateOptions(lr=0.05, init_steps=40, steps=1, restarts=1, batch_size=4, fit_batches=2,
                                         eval_batches=1), init_logits=init)
    moved = np.abs(ds.chg_init.values - torch.sigmoid(init).numpy()).max()
    assert moved > 0.05  # the lambda = 0 stage moved the gates away from the draw ...
    # ... and G+ and G- took one Adam update (at most lr in logit, so < 0.02 in gate) on from there
    assert np.abs(ds.chg.values - ds.chg_init.values[..., None]).max() < 0.02


def test_each_gate_set_is_clipped_by_its_own_norm():
    # Two sets fitted together, one with gradients of norm ~100 and one of ~0.01: clipped by one
    # shared norm, the small set's gradients shrink 10^4-fold, and Adam's first steps (its moments
    # still warming up, epsilon not negligible at that size) differ; clipped per set, each is
    # updated exactly as when fitted alone.
    scale = torch.tensor([100.0, 0.01])[:, None, None]  # (S, 1, 1)
    target = torch.tensor([[[1.0, -2.0], [3.0, 0.5]]])  # (1, L, H)

    def objective(logits, step, sc=scale):
        return (sc * (logits - target) ** 2 * (1 + step % 3)).flatten(1).sum(1)  # (S,)

    opts = GateOptions(lr=1.0, grad_clip=1.0)
    start = torch.zeros(2, 2, 2)
    both, _ = _optimise(start, 10, opts, objective)
    alone = torch.cat([_optimise(start[i:i + 1], 10, opts, lambda lg, s, i=i: objective(lg, s, scale[i:i + 1]))[0]
                       for i in range(2)])
    assert torch.equal(both, alone)


def test_a_gradient_whose_float32_norm_overflows_is_clipped_not_zeroed():
    # `dynamics gates --lam 1e30`: the regulariser's gradient (1e30 / heads per gate) squared
    # overflows float32, the norm was inf and the clip factor 0, so G+ and G- never moved from the
    # lambda = 0 gates and were reported as settled; clipped to norm 1, it moves as a gradient of
    # any other size pointing the same way does.
    scale = torch.tensor([1e30, 1e10])[:, None, None]  # (S, 1, 1): the same direction, two sizes
    opts = GateOptions(lr=1.0, grad_clip=1.0)
    logits, settle = _optimise(torch.zeros(2, 2, 2), 5, opts, lambda lg, step: -(scale * lg).flatten(1).sum(1))
    assert logits[1].min() > 4  # the 1e10 set moved by about lr a step
    assert torch.allclose(logits[0], logits[1])
    assert settle[0].min() > 0

    # and a set fitted beside it is clipped bitwise as when fitted alone (restarts stay
    # independent): a float64 norm for every set once one overflowed moved it by 2e-7
    target = torch.tensor([[1.0, -2.0], [3.0, 0.5]])

    def quadratic(lg, step):  # (S, L, H) -> (S,), gradients of norm ~10 that float64 rounds otherwise
        return (3.7 * (lg - target) ** 2 * (1 + step % 3)).flatten(1).sum(1)

    def beside(lg, step):
        return torch.cat([-(1e30 * lg[:1]).flatten(1).sum(1), quadratic(lg[1:], step)])

    together, _ = _optimise(torch.zeros(2, 2, 2), 5, opts, beside)
    alone, _ = _optimise(torch.zeros(1, 2, 2), 5, opts, quadratic)
    assert torch.equal(together[1], alone[0])


def test_updates_cycle_through_the_fit_batches(tiny):
    # Update s uses fit batch s mod fit_batches: two updates over 2 or 3 batches see the same
    # two batches (the same gates); over 1 batch, the second update sees batch 0 again.
    model, cfg = tiny

    def gates(fit_batches: int) -> np.ndarray:
        opts = GateOptions(init_steps=2, steps=1, restarts=1, batch_size=4, fit_batches=fit_batches, eval_batches=1)
        return fit_chg(model, cfg, opts, init_logits=torch.zeros(1, 2, 2)).chg_init.values

    two = gates(2)
    np.testing.assert_array_equal(gates(3), two)
    assert np.abs(gates(1) - two).max() > 1e-4


def test_nll_full_is_the_ungated_model_on_the_fit_batches(tiny):
    # attrs nll_full is the reference the report prints first ("all gates open"); scored with the
    # lambda = 0 gates instead, it read as the model's own loss and no test saw the difference.
    model, cfg = tiny
    opts = GateOptions(init_steps=2, steps=1, restarts=1, batch_size=4, fit_batches=2, eval_batches=1)
    ds = fit_chg(model, cfg, opts, init_logits=torch.full((1, 2, 2), -1.0))  # gates 0.27: far from open
    assert ds.attrs["nll_full"] == pytest.approx(_hand_nll(model, cfg, [0, 1], 4), rel=1e-5)


def test_settle_is_zero_for_the_stage_of_no_updates_and_in_stage_order(tiny):
    # settle is (restart, stage, layer, head) with stages init, plus, minus: with no lambda = 0
    # updates the init row is exactly 0 (nothing moved) and the G+/G- rows are not.
    model, cfg = tiny
    opts = GateOptions(init_steps=0, steps=2, restarts=1, batch_size=4, fit_batches=1, eval_batches=1)
    ds = fit_chg(model, cfg, opts, init_logits=torch.zeros(1, 2, 2))
    assert list(ds.stage.values) == ["init", "plus", "minus"]
    assert not ds.settle.sel(stage="init").values.any()
    assert (ds.settle.sel(stage=["plus", "minus"]).values > 0).all()


def test_mean_agreement_is_the_mean_over_heads_of_the_majority_share(tiny):
    # Updates of lr 1e-9 leave G+ and G- at the initial gates, so the roles are planted: restart 0
    # has every gate 0.88 (facilitating), restart 1 shuts head (0, 0) to 0.12 (interfering). That
    # head's majority share is 1/2, the other three heads' 1: mean (0.5 + 3) / 4 = 0.875.
    model, cfg = tiny
    init = torch.full((2, 2, 2), 2.0)
    init[1, 0, 0] = -2.0
    opts = GateOptions(init_steps=0, steps=1, lr=1e-9, restarts=2, batch_size=4, fit_batches=1, eval_batches=1)
    ds = fit_chg(model, cfg, opts, init_logits=init)
    assert ds.chg_role.values[:, 0, 0].tolist() == [0, 2]  # facilitating, interfering
    np.testing.assert_allclose(ds.agreement.values, [[0.5, 1.0], [1.0, 1.0]])
    assert ds.attrs["mean_agreement"] == pytest.approx(0.875)
