"""`gates.maths`: the CHG and contrastive objectives, the role taxonomy and its agreement across
restarts, the mixture weights and the rank agreement of G- with ablation, on planted numbers."""

import numpy as np
import pytest
import torch

from dynamics.config import from_dict
from dynamics.gates import (
    CHG_ROLES,
    FACILITATING,
    INCONSISTENT,
    INTERFERING,
    IRRELEVANT,
    UNFITTED,
    chg_roles,
    label_agreement,
    tied_majority,
)
from dynamics.gates.maths import chg_loss, component_weights, contrastive_loss, rank_agreement
from tests.test_gates import TINY, one_thread  # noqa: F401 - one_thread: the module-scoped autouse fixture


def test_chg_loss_is_nll_minus_lambda_times_mean_clamped_logit():
    logits = torch.tensor([[[-9.0, 0.0], [2.0, 9.0]]], requires_grad=True)  # clamp -> -4, 0, 2, 4: mean 0.5
    nll = torch.tensor([1.0])
    assert chg_loss(nll, logits, 0.1).item() == pytest.approx(0.95)
    assert chg_loss(nll, logits, -0.1).item() == pytest.approx(1.05)
    (grad,) = torch.autograd.grad(chg_loss(nll, logits, 0.1).sum(), [logits])
    # Descent raises logits inside the clamp for lambda > 0 (toward open); none outside.
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.025, -0.025, 0.0])


def test_contrastive_loss_stops_gradient_through_retain_and_clamps_forget():
    lr, lf = torch.tensor([-1.0], requires_grad=True), torch.tensor([-2.0], requires_grad=True)
    z = torch.zeros(1, 1, 1)
    loss = contrastive_loss(lr, lf, z, lam=0.0, max_diff=5.0)
    assert loss.item() == pytest.approx(1.0 + (-2.0 + 1.0))
    g_r, g_f = torch.autograd.grad(loss.sum(), [lr, lf])
    assert g_r.item() == -1.0 and g_f.item() == 1.0  # stopgrad: retain gets only -logp_r's gradient
    far = torch.tensor([-9.0], requires_grad=True)  # 8 nats below retain: past max_diff
    loss = contrastive_loss(lr, far, z, lam=0.0, max_diff=5.0)
    assert loss.item() == pytest.approx(1.0 - 5.0)
    assert torch.autograd.grad(loss.sum(), [far])[0].item() == 0.0


def test_contrastive_regulariser_is_the_mean_of_the_clamped_logits():
    # clamp(logit, -4, 4) of -9, 0, 2, 5 is -4, 0, 2, 4: mean 0.5 (unclamped the mean is -0.5).
    logits = torch.tensor([[[-9.0, 0.0], [2.0, 5.0]]], requires_grad=True)
    lr, lf = torch.tensor([-1.0]), torch.tensor([-2.0])  # -(-1) + (-2 + 1) = 0 before the regulariser
    assert contrastive_loss(lr, lf, logits, lam=0.1).item() == pytest.approx(-0.05)
    (grad,) = torch.autograd.grad(contrastive_loss(lr, lf, logits, lam=0.1).sum(), [logits])
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.025, -0.025, 0.0])  # none outside the clamp


def test_component_weights_are_the_mixture_weights_normalised():
    # The report's weighted ablation delta and head importance are these convex combinations.
    base = {"model": {**TINY["model"], "context": 32}}
    mix = from_dict({**base, "task": {"name": "mixture", "components": ["offset_copy", "markov"], "weights": [3, 1]}})
    assert component_weights(mix).tolist() == [0.75, 0.25]
    equal = from_dict({**base, "task": {"name": "mixture", "components": ["offset_copy", "markov", "induction"]}})
    assert component_weights(equal).tolist() == pytest.approx([1 / 3] * 3)
    assert component_weights(from_dict({**base, "task": {"name": "markov"}})).tolist() == [1.0]


def test_rank_agreement_says_which_side_is_constant():
    # rho is NaN either way; the report prints the reason, so each side must name itself.
    from dynamics.gates.maths import rank_agreement_undefined

    varied, flat = np.array([0.1, 0.5, 0.9]), np.array([0.2, 0.2, 0.2])
    assert rank_agreement_undefined(varied, flat) == "the ablation delta is the same for every head"
    assert rank_agreement_undefined(flat, varied) == "G- is the same for every head"
    assert rank_agreement_undefined(varied, np.array([0.1, np.nan, 0.3])) == (
        "G- or the ablation delta is not finite for some head")
    assert rank_agreement_undefined(varied, varied) is None


def test_rank_agreement_pairs_dataarrays_head_for_head_and_names_shapes_that_differ():
    # a (head, layer) delta beside a (layer, head) G- paired other heads by position: 0.80 for
    # identical values; a delta per task component failed in numpy's concatenate
    import xarray as xr

    minus = xr.DataArray(np.array([[0.1, 0.4, 0.2], [0.9, 0.3, 0.7]]), dims=("layer", "head"))
    assert rank_agreement(minus, minus.transpose("head", "layer")) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"G- has shape \(2, 3\) and the ablation delta \(2, 3, 2\); give each"):
        rank_agreement(minus, minus.expand_dims(component=2, axis=-1))


def test_taxonomy_from_planted_gates():
    plus = np.array([0.9, 0.9, 0.1, 0.1, np.nan, 0.5])
    minus = np.array([0.9, 0.1, 0.1, 0.9, 0.9, 0.49])
    roles = chg_roles(plus, minus)
    assert roles.dtype == np.int8
    assert roles.tolist() == [FACILITATING, IRRELEVANT, INTERFERING, INCONSISTENT, UNFITTED, IRRELEVANT]
    assert [CHG_ROLES[r] for r in roles[:5]] == ["facilitating", "irrelevant", "interfering", "inconsistent", "unfitted"]
    assert chg_roles(np.array([0.7]), np.array([0.7]), threshold=0.8).tolist() == [INTERFERING]


def test_label_agreement_is_the_majority_share():
    roles = np.array([[0, 1, -1], [0, 2, -1], [0, 2, -1], [1, 2, -1]])  # 4 restarts x 3 heads
    majority, agreement = label_agreement(roles)
    assert majority.tolist() == [0, 2, -1]
    assert agreement[:2].tolist() == pytest.approx([0.75, 0.75]) and np.isnan(agreement[2])
    # a share of the restarts that fitted the head: an unfitted one (-1) does not vote
    majority, agreement = label_agreement(np.array([[0], [0], [-1], [1]]))
    assert majority.tolist() == [0] and agreement.tolist() == pytest.approx([2 / 3])


def test_a_tie_is_where_two_roles_share_the_top_count():
    roles = np.array([[0, 1, 2, -1], [1, 1, 2, -1], [2, 0, 3, -1], [3, 0, 3, -1]])  # 4 restarts x 4 heads
    assert tied_majority(roles).tolist() == [True, True, True, False]  # 1-1-1-1, 2-2, 2-2; none fitted
    assert tied_majority(roles[:3]).tolist() == [True, False, False, False]  # 1-1-1; 2-1; 2-1


def test_rank_agreement_is_undefined_below_three_heads_and_where_a_side_is_constant():
    # Two heads rank (1, 2) on both sides: rho was +-1 whatever the fits, printed as 1.000.
    assert np.isnan(rank_agreement(np.array([0.1, 0.9]), np.array([0.2, 0.3])))
    assert np.isnan(rank_agreement(np.array([0.5, 0.5, 0.5]), np.array([0.1, 0.2, 0.3])))
    assert rank_agreement(np.array([0.1, 0.5, 0.9]), np.array([0.2, 0.3, 0.1])) == pytest.approx(-0.5)
    # ranks, not values: one outlying delta leaves the order, and rho, at 1 (Pearson's r: 0.80)
    assert rank_agreement(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 100.0])) == pytest.approx(1.0)


def test_chg_gate_at_exactly_the_threshold_counts_as_high_on_both_sides():
    # The taxonomy says G >= t is high, for G+ and for G- alike: G- = 0.5 is high at t = 0.5.
    from dynamics.analysis.chg import FACILITATING, INCONSISTENT, chg_roles

    assert chg_roles(np.array([0.5, 0.1]), np.array([0.5, 0.5])).tolist() == [FACILITATING, INCONSISTENT]


def test_chg_roles_refuses_gates_of_other_shapes():
    # (restarts, heads) G+ against a (heads,) G- would broadcast into labels never fitted together
    from dynamics.analysis.chg import chg_roles

    with pytest.raises(ValueError, match=r"plus has shape \(2, 3\) but minus has \(3,\)"):
        chg_roles(np.full((2, 3), 0.9), np.full(3, 0.1))


def test_chg_majority_counts_inconsistent_restarts_and_breaks_ties_low():
    # Every fitted code votes, inconsistent (3) included: 3, 3, 0 is an inconsistent majority
    # of 2/3. A 1-1 tie goes to the lower code (irrelevant 1 before interfering 2).
    from dynamics.analysis.chg import label_agreement

    majority, agreement = label_agreement(np.array([[3, 2], [3, 1], [0, -1]]))
    assert majority.tolist() == [3, 1]
    assert agreement.tolist() == pytest.approx([2 / 3, 1 / 2])


def test_chg_majority_of_a_head_one_restart_fitted_is_that_restarts_role():
    # Unfitted restarts (-1) do not vote, so one fitted restart is a majority of 1 (agreement
    # 1.0); only a head no restart fitted is -1 with agreement NaN.
    from dynamics.analysis.chg import label_agreement

    majority, agreement = label_agreement(np.array([[2, -1], [-1, -1], [-1, -1]]))
    assert majority.tolist() == [2, -1]
    assert agreement[0] == 1.0 and np.isnan(agreement[1])


def test_unsettled_counts_nan_and_the_settle_distance_itself_as_unsettled():
    # Known answers (a mutation audit's): a gate exactly its movement away from the threshold
    # could still reach it, and a NaN gate or movement (a fit whose loss is not finite) is never
    # settled; `|g - t| < settle` read all three as settled, and the CHG caution went quiet.
    from dynamics.gates.maths import unsettled

    assert unsettled(np.array([0.5, np.nan, 0.6]), np.array([0.0, 0.0, np.nan]), 0.5).tolist() == [True, True, True]
    assert unsettled(np.array([0.75, 0.75]), np.array([0.25, 0.125]), 0.5).tolist() == [True, False]
