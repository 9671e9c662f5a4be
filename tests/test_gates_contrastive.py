"""`gates.contrastive`: the held-out losses of a contrastive fit, its clamp on the forget term,
and `parse_contrast`."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dynamics.config import ConfigError, from_dict
from dynamics.gates import HELDOUT_STEP, GateOptions, fit_contrastive, parse_contrast
from dynamics.tasks import make_batch
from tests.test_gates import TINY, _hand_nll, one_thread, tiny_model  # noqa: F401 - fixtures: one_thread (autouse), tiny


def test_contrastive_losses_are_held_out_nll_full_gated_and_thresholded(tiny):
    # Updates of lr 1e-9 leave the gates at sigmoid(+-2) = 0.88 / 0.12: "gated" is the held-out
    # NLL with those gates, "circuit" the NLL with them binarised at the 0.5 threshold (1 / 0),
    # "full" with every gate 1; all three on held-out batches from HELDOUT_STEP.
    model, cfg = tiny
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O.mul_(20.0)  # heads that matter, so the three states differ clearly
    init = torch.tensor([[[2.0, -2.0], [-2.0, 2.0]]])  # (restart, layer, head)
    opts = GateOptions(steps=1, lr=1e-9, restarts=1, batch_size=4, fit_batches=1, eval_batches=2)
    ds = fit_contrastive(model, cfg, "offset_copy", "markov", opts, init_logits=init)
    held = [HELDOUT_STEP, HELDOUT_STEP + 1]
    for side, name in (("retain", "offset_copy"), ("forget", "markov")):
        loss = ds.contrast_loss.sel(restart=0, side=side)
        want = {"full": _hand_nll(model, cfg, held, 4, component=name),
                "gated": _hand_nll(model, cfg, held, 4, init.sigmoid(), component=name),
                "circuit": _hand_nll(model, cfg, held, 4, (init > 0).float(), component=name)}
        assert min(abs(want["full"] - want["gated"]), abs(want["gated"] - want["circuit"])) > 1e-2
        assert {s: loss.sel(state=s).item() for s in want} == pytest.approx(want, rel=1e-5)


def test_contrastive_fit_stops_pushing_forget_past_max_diff(tiny):
    # Adam's first update moves each logit by lr * sign(gradient). Where the forget NLL already
    # exceeds the retain NLL by more than max_diff, the forget term is clamped and only
    # -logp_retain and the regulariser pull: the update follows the retain gradient alone.
    model, cfg = tiny
    init = torch.tensor([[[0.5, -0.5], [1.0, 0.0]]])  # (restart, layer, head)
    batches = {n: torch.from_numpy(make_batch(cfg, "eval", 0, 4, component=n).tokens) for n in ("offset_copy", "markov")}

    def nll_and_grad(name):
        x = init.clone().requires_grad_(True)
        b = batches[name]
        logits = model(b[:, :-1], head_gates=x.sigmoid().expand(b.shape[0], 2, 2))
        loss = F.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten())
        return loss.item(), torch.autograd.grad(loss, [x])[0]

    (nll_a, grad_a), (nll_b, grad_b) = nll_and_grad("offset_copy"), nll_and_grad("markov")
    # retain the component the initial gates already fit better, so the forget term starts clamped
    (retain, g_r, nll_r), (forget, g_f, nll_f) = sorted(
        [("offset_copy", grad_a, nll_a), ("markov", grad_b, nll_b)], key=lambda x: x[2])
    max_diff, lam = 1e-4, 0.1
    assert nll_f - nll_r > max_diff
    g = g_r - lam / 4  # d(-lambda * mean(logit)) / d logit, all inside the clamp
    assert ((g - g_f).sign() != g.sign()).any()  # the unclamped forget term would turn some update
    opts = GateOptions(steps=1, lr=0.1, restarts=1, batch_size=4, fit_batches=1, eval_batches=1, lam=lam,
                       max_diff=max_diff)
    ds = fit_contrastive(model, cfg, retain, forget, opts, init_logits=init)
    want = torch.sigmoid(init - 0.1 * g.sign())
    np.testing.assert_allclose(ds.contrast_gate.values, want.numpy(), rtol=1e-5)


def test_parse_contrast_names_the_bad_component():
    cfg = from_dict(TINY)
    assert parse_contrast("retain=markov, forget=offset_copy", cfg) == ("markov", "offset_copy")
    with pytest.raises(ConfigError, match="induction"):
        parse_contrast("retain=induction,forget=markov", cfg)
    for bad in ("retain=markov", "keep=markov,forget=offset_copy", "retain=markov,forget=markov"):
        with pytest.raises(ConfigError):
            parse_contrast(bad, cfg)
    with pytest.raises(ConfigError, match="gates.steps"):
        GateOptions(steps=0)
