"""dynamics.optim against torch.optim, the optimisers it stands in for: the same weights bit for
bit, the same state dicts, each loading the other's. That a training process never imports
torch._dynamo, as torch.optim would, is tests/test_train.py's to check."""

import pytest
import torch
import torch.nn.functional as F

from dynamics import optim
from dynamics.config import from_dict
from dynamics.train import build

SETTINGS = {"lr": 1e-2, "weight_decay": 0.1}


def _torch(kind: str, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, betas=(0.9, 0.95), fused=True, **SETTINGS)
    return torch.optim.SGD(params, momentum=0.9, **SETTINGS)


def _ours(kind: str, params):
    if kind == "adamw":
        return optim.AdamW(params, betas=(0.9, 0.95), **SETTINGS)
    return optim.SGD(params, momentum=0.9, **SETTINGS)


def _model():
    cfg = from_dict({"model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "vocab_size": 16, "context": 32}})
    return build(cfg, torch.device("cpu"))


def _train(model, opt, steps: range) -> None:
    """Real gradients of a real loss, a learning rate set per step as training sets it, and one
    parameter left without a gradient at every other step (the optimisers skip it then)."""
    params = model.optim_parameters()
    for s in steps:
        for group in opt.param_groups:
            group["lr"] = 1e-2 * (1 + s % 3)
        x = torch.randint(0, 16, (4, 33), generator=torch.Generator().manual_seed(s))  # (B, T+1)
        for p in params:
            p.grad = None
        F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
        if s % 2:
            params[0].grad = None
        opt.step()


def _same_state(a: dict, b: dict) -> None:
    assert [{k: v for k, v in g.items() if k != "params"} for g in a["param_groups"]] == \
           [{k: v for k, v in g.items() if k != "params"} for g in b["param_groups"]]
    assert [g["params"] for g in a["param_groups"]] == [g["params"] for g in b["param_groups"]]
    assert a["state"].keys() == b["state"].keys()
    for i, entry in b["state"].items():
        assert a["state"][i].keys() == entry.keys()
        for k, v in entry.items():
            assert a["state"][i][k].dtype == v.dtype and torch.equal(a["state"][i][k], v), (i, k)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_ours_gives_torchs_weights_and_state_bit_for_bit(kind):
    ours, theirs = _model(), _model()
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters(), strict=True))
    opt_ours, opt_theirs = _ours(kind, ours.optim_parameters()), _torch(kind, theirs.optim_parameters())
    _train(ours, opt_ours, range(12))
    _train(theirs, opt_theirs, range(12))
    for a, b in zip(ours.optim_parameters(), theirs.optim_parameters(), strict=True):
        assert torch.equal(a, b)
    moved = [not torch.equal(a, b) for a, b in zip(ours.optim_parameters(), _model().optim_parameters(), strict=True)]
    assert all(moved)  # every parameter was updated: the comparison above is not of untouched weights
    _same_state(opt_ours.state_dict(), opt_theirs.state_dict())


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("first", ["ours", "torch"])
def test_a_state_dict_saved_by_either_resumes_in_the_other(kind, first, tmp_path):
    # A checkpoint written before dynamics.optim holds torch.optim's state dict, and one written
    # now must load into an older version: both directions, through torch.save and torch.load.
    make = {"ours": _ours, "torch": _torch}
    second = "torch" if first == "ours" else "ours"
    model = _model()
    opt = make[first](kind, model.optim_parameters())
    _train(model, opt, range(5))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")

    resumed = {}
    for who in (first, second):
        ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        m = _model()
        m.load_state_dict(ckpt["model"])
        o = make[who](kind, m.optim_parameters())
        o.load_state_dict(ckpt["optimizer"])
        _train(m, o, range(5, 10))
        resumed[who] = (m, o)
    for a, b in zip(resumed["ours"][0].optim_parameters(), resumed["torch"][0].optim_parameters(), strict=True):
        assert torch.equal(a, b)
    _same_state(resumed["ours"][1].state_dict(), resumed["torch"][1].state_dict())


def _saved(kind: str) -> dict:
    model = _model()
    opt = _ours(kind, model.optim_parameters())
    _train(model, opt, range(2))
    return opt.state_dict()


@pytest.mark.parametrize(("damage", "message"), [
    ("fewer_params", "parameter group that doesn't match the size"),
    ("two_groups", "different number of parameter groups"),
    ("other_shape", r"exp_avg has shape \(3,\), its parameter \(16, 32\)"),
    ("no_moment", "parameter 0 has no 'exp_avg_sq'"),
    ("unlisted", "state for parameter 999, which no group lists"),
    ("amsgrad", "neither amsgrad"),
])
def test_a_state_dict_that_does_not_fit_is_refused_before_anything_changes(damage, message):
    # torch.optim took a moment of another shape and failed at the next update, the run resumed
    state = _saved("adamw")
    group = state["param_groups"][0]
    if damage == "fewer_params":
        group["params"] = group["params"][:-1]
    elif damage == "two_groups":
        state["param_groups"] = [group, dict(group)]
    elif damage == "other_shape":
        state["state"][0]["exp_avg"] = torch.zeros(3)
    elif damage == "no_moment":
        del state["state"][0]["exp_avg_sq"]
    elif damage == "amsgrad":  # torch.optim.AdamW(amsgrad=True)'s: its updates are not this one's
        group["amsgrad"] = True
    else:
        state["state"][999] = state["state"][0]
    model = _model()
    opt = _ours("adamw", model.optim_parameters())
    groups_before = opt.param_groups
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(state)
    assert opt.param_groups is groups_before and opt.state == {}


def test_missing_group_settings_take_the_defaults_as_torch_does():
    # an older torch wrote no "decoupled_weight_decay"; torch.optim's __setstate__ fills it in
    state = _saved("adamw")
    del state["param_groups"][0]["decoupled_weight_decay"]
    opt = _ours("adamw", _model().optim_parameters())
    opt.load_state_dict(state)
    assert opt.param_groups[0]["decoupled_weight_decay"] is True


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_clears_every_grad_as_torchs_does(set_to_none):
    ours, theirs = _model(), _model()
    opts = _ours("adamw", ours.optim_parameters()), _torch("adamw", theirs.optim_parameters())
    for model, opt in zip((ours, theirs), opts, strict=True):
        params = model.optim_parameters()
        for p in params:
            p.grad = torch.ones_like(p)
        grads = [p.grad for p in params]
        opt.zero_grad(set_to_none=set_to_none)
        if set_to_none:
            assert all(p.grad is None for p in params)
        else:  # the same tensors, zeroed in place
            assert all(p.grad is g and not g.any() for p, g in zip(params, grads, strict=True))


def test_adamw_defaults_are_torchs():
    # The docstring promises torch.optim.AdamW(params, lr, betas, eps, weight_decay); its tests
    # and train.make_optimizer pass every setting, so default weight_decay 0 or betas (0.9, 0.99)
    # passed. Torch's defaults: betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2.
    ours = optim.AdamW([torch.zeros(1)], lr=0.1)
    theirs = torch.optim.AdamW([torch.zeros(1)], lr=0.1)
    for key in ("betas", "eps", "weight_decay"):
        assert ours.param_groups[0][key] == theirs.param_groups[0][key] == {"betas": (0.9, 0.999), "eps": 1e-8,
                                                                          "weight_decay": 1e-2}[key], key
    # and one update by hand: decay first, then the bias-corrected step m_hat / (sqrt(v_hat) + eps)
    # = g / (|g| + 1e-8) after one update
    p = torch.tensor([2.0, -3.0], dtype=torch.float64)
    g = torch.tensor([0.5, -0.25], dtype=torch.float64)
    p.grad = g.clone()
    optim.AdamW([p], lr=0.1).step()
    want = torch.tensor([2.0, -3.0], dtype=torch.float64) * (1 - 0.1 * 1e-2) - 0.1 * g / (g.abs() + 1e-8)
    torch.testing.assert_close(p, want, rtol=0, atol=1e-12)


def test_sgd_momentum_below_one_half_is_applied_by_hand():
    # A step that skipped the momentum buffer below momentum 0.5 passed: the tests use 0.9 only.
    # torch.optim.SGD: buf_1 = g_1, buf_2 = m buf_1 + g_2, p -= lr buf (dampening 0).
    p = torch.tensor([1.0, -2.0], dtype=torch.float64)
    opt = optim.SGD([p], lr=0.5, momentum=0.25)
    g1, g2 = torch.tensor([0.4, 0.8], dtype=torch.float64), torch.tensor([-0.2, 1.0], dtype=torch.float64)
    for g in (g1, g2):
        p.grad = g.clone()
        opt.step()
    want = torch.tensor([1.0, -2.0], dtype=torch.float64) - 0.5 * g1 - 0.5 * (0.25 * g1 + g2)
    torch.testing.assert_close(p, want, rtol=0, atol=1e-15)
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], 0.25 * g1 + g2, rtol=0, atol=1e-15)


def test_a_loaded_adamw_state_takes_its_parameters_dtype_as_torchs_does():
    # Moments loaded in their saved dtype (float64 from a double model, into float32 weights)
    # passed: every state dict in the tests was written for the same dtype. torch.optim casts
    # them to the parameter's dtype; the next update then runs as torch's, bit for bit.
    def state(opt):
        sd = opt.state_dict()
        sd["state"] = {0: {"step": torch.tensor(3.0), "exp_avg": torch.tensor([0.1, -0.2], dtype=torch.float64),
                           "exp_avg_sq": torch.tensor([0.01, 0.04], dtype=torch.float64)}}
        return sd

    ours_p, theirs_p = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])
    ours, theirs = optim.AdamW([ours_p], lr=0.1), torch.optim.AdamW([theirs_p], lr=0.1, fused=True)
    ours.load_state_dict(state(ours))
    theirs.load_state_dict(state(theirs))
    assert ours.state[ours_p]["exp_avg"].dtype == ours.state[ours_p]["exp_avg_sq"].dtype == torch.float32
    torch.testing.assert_close(ours.state[ours_p]["exp_avg"], torch.tensor([0.1, -0.2]))
    for p, opt in ((ours_p, ours), (theirs_p, theirs)):
        p.grad = torch.tensor([0.3, -0.1])
        opt.step()
    assert torch.equal(ours_p, theirs_p)
