"""`gates.fit` and `gates._engine`: fit_chg (its labels on a known answer, batched restarts, the
settle of each stage), Adam with per-set clipping, and the recorder's chg_snapshot.

Several tests pin definitions that the rest of the suite did not, each found by a mutation that left
it passing (a helper audit's): G+/G- fitted from the random draw instead of the lambda = 0 fit, one
clipping norm shared by all gate sets, every update on the first fit batch, the authors' defaults changed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dynamics.config import from_dict
from dynamics.gates import (
    FACILITATING,
    INTERFERING,
    IRRELEVANT,
    GateOptions,
    chg_snapshot,
    fit_chg,
    head_ablation,
    label_agreement,
)
from dynamics.gates._engine import _optimise
from dynamics.tasks import make_batch
from dynamics.train import build
from tests.test_gates import FAST, TINY, _hand_nll, one_thread  # noqa: F401 - one_thread: the module-scoped autouse fixture


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


def test_positive_lambda_opens_and_negative_lambda_shuts_a_head_that_does_not_matter(tiny):
    model, cfg = tiny
    with torch.no_grad():
        model.blocks[1].attn.W_O[1].zero_()  # head (1, 1) writes nothing: the NLL ignores its gate
    ds = fit_chg(model, cfg, FAST)
    plus, minus = ds.chg.sel(restart=0, layer=1, head=1).values
    assert plus > 0.95 and minus < 0.05
    assert ds.chg_role.sel(restart=0, layer=1, head=1).item() == IRRELEVANT
    assert np.isfinite(ds.nll.values).all()


def test_a_head_the_model_needs_is_facilitating_and_one_that_hurts_is_interfering():
    # One layer, two heads: head 0 is trained to copy (removing it costs nats); head 1 is head 0
    # with W_O = -0.7 W_O[0], so it cancels most of head 0 and removing it lowers the loss.
    # The regulariser is a mean over L * H = 2 heads, so at the default lambda it moves one
    # head's loss by up to 0.1 * 8 / 2 = 0.4 nats and outweighs both; lambda 0.005 keeps it
    # below what either head does to the NLL, and the labels are then the paper's.
    cfg = from_dict({"model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16,
                               "context": 8}, "task": {"name": "offset_copy", "delta": 2}})
    torch.manual_seed(0)
    model = build(cfg, torch.device("cpu"))
    params = model.optim_parameters()
    for step in range(80):  # sign descent: no optimiser to construct (torch.optim imports for seconds)
        tokens = torch.from_numpy(make_batch(cfg, "train", step, 16).tokens)
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        with torch.no_grad():
            for p, g in zip(params, torch.autograd.grad(loss, params), strict=True):
                p -= 0.01 * g.sign()
    attn = model.blocks[0].attn
    with torch.no_grad():
        for w in (attn.W_Q, attn.W_K, attn.W_V):
            w[1] = w[0]
        attn.W_O[1] = -0.7 * attn.W_O[0]
    opts = GateOptions(steps=60, init_steps=10, restarts=2, batch_size=8, fit_batches=2, eval_batches=1, lam=0.005)
    delta = head_ablation(model, cfg, "zero", opts).values[0, :, 0]
    assert delta[0] > 1.0 and delta[1] < -0.05  # the known answer: needed, and harmful
    ds = fit_chg(model, cfg, opts)
    assert ds.role.values[0].tolist() == [FACILITATING, INTERFERING]
    assert ds.agreement.values.min() == 1.0
    plus, minus = ds.chg.mean("restart").values[0].T  # (H,) each
    assert plus[0] > 0.95 and minus[0] > 0.7  # kept open even when pushed shut
    assert plus[1] < 0.4 and minus[1] < 0.05  # shut even when pushed open


def test_optimise_returns_each_gates_change_over_the_last_tenth_of_updates():
    # A constant gradient of -1 makes each bias-corrected Adam update exactly +lr (clipping off),
    # so after 20 updates every logit is 20 lr and moved 2 lr over the last tenth (2 updates).
    from dataclasses import replace

    from dynamics.gates._engine import _optimise

    opts = replace(FAST, lr=0.1, grad_clip=0.0)
    logits, settle = _optimise(torch.zeros(3, 2, 2), 20, opts, lambda lg, step: -lg.flatten(1).sum(1))
    np.testing.assert_allclose(logits.numpy(), 2.0, rtol=1e-5)
    expected = torch.sigmoid(torch.tensor(2.0)) - torch.sigmoid(torch.tensor(1.8))
    np.testing.assert_allclose(settle.numpy(), expected.item(), rtol=1e-4)
    _, none = _optimise(torch.zeros(3, 2, 2), 0, opts, lambda lg, step: -lg.flatten(1).sum(1))
    assert none.shape == (3, 2, 2) and not none.any()  # no updates: nothing moved


def test_batched_restarts_equal_sequential_fits_from_the_same_init(tiny):
    model, cfg = tiny
    init = torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(0)) * 2
    opts = GateOptions(steps=6, init_steps=4, batch_size=4, fit_batches=2, eval_batches=1)
    batched = fit_chg(model, cfg, opts, init_logits=init)
    assert batched.sizes["restart"] == 3
    for i in range(3):
        alone = fit_chg(model, cfg, opts, init_logits=init[i : i + 1])
        for name in ("chg", "chg_init", "nll"):
            np.testing.assert_allclose(batched[name].values[i], alone[name].values[0], atol=1e-5, rtol=1e-4)


def test_chg_snapshot_is_deterministic_and_leaves_training_state_alone(tiny):
    model, cfg = tiny
    tokens = torch.randint(0, 16, (4, 17), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    weights = [p.detach().clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    opts = GateOptions(restarts=1, init_steps=2, batch_size=4, fit_batches=1, eval_batches=1)
    with torch.no_grad():  # the recorder's context
        chg, role = chg_snapshot(model, cfg, steps=3, options=opts)
    assert chg.shape == (2, 2, 2) and chg.dtype == np.float32 and role.shape == (2, 2) and role.dtype == np.int8
    assert np.isfinite(chg).all() and set(role.ravel()) <= {0, 1, 2, 3}
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)
    again, role_again = chg_snapshot(model, cfg, steps=3, options=opts)
    np.testing.assert_array_equal(chg, again)
    np.testing.assert_array_equal(role, role_again)


def test_chg_snapshot_of_several_restarts_is_their_mean_and_majority(tiny):
    from dataclasses import replace

    model, cfg = tiny
    opts = GateOptions(restarts=3, init_steps=2, steps=3, batch_size=4, fit_batches=1, eval_batches=1)
    chg, role = chg_snapshot(model, cfg, steps=3, options=opts)
    fits = fit_chg(model, cfg, replace(opts, steps=3))
    assert fits.sizes["restart"] == 3 and np.ptp(fits.chg.values, axis=0).max() > 0  # restarts that differ
    np.testing.assert_allclose(chg, fits.chg.mean("restart").transpose("layer", "head", "fit").values, rtol=1e-6)
    np.testing.assert_array_equal(role, label_agreement(fits.chg_role.values)[0])
