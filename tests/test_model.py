"""Properties of dynamics.model with known answers, on tiny models."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from dynamics import model as model_module
from dynamics.config import ModelConfig
from dynamics.model import HookPoint, Transformer, apply_rope

L, H, D, V, T = 2, 4, 32, 16, 12


def make(seed=0, **kw) -> Transformer:
    cfg = ModelConfig(**{"n_layers": L, "d_model": D, "n_heads": H, "d_mlp": 64, "vocab_size": V, "context": 16, **kw})
    torch.manual_seed(seed)
    return Transformer(cfg)


def tokens(B=3, seed=1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def nll(logits, toks):
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), toks[:, 1:].reshape(-1))


@pytest.mark.parametrize("pos", ["rope", "learned", "none"])
@pytest.mark.parametrize("attn_only", [False, True])
def test_output_shape(pos, attn_only):
    model = make(pos=pos, attn_only=attn_only)
    assert model(tokens()).shape == (3, T, V)
    assert hasattr(model, "W_pos") == (pos == "learned")
    assert hasattr(model.blocks[0], "mlp") != attn_only


def test_learned_pos_rejects_long_input():
    with pytest.raises(ValueError, match="context"):
        make(pos="learned")(torch.zeros(1, 17, dtype=torch.long))


def test_learned_positions_add_row_t_of_w_pos_at_position_t():
    # T = 12 < context 16: an offset slice (W_pos[1:T + 1]) has the right shape and ran unseen
    model, toks = make(pos="learned"), tokens()
    resid = model.run_with_cache(toks, ["blocks.0.hook_resid_pre"])[1]["blocks.0.hook_resid_pre"]  # (B, T, D)
    torch.testing.assert_close(resid, model.W_E[toks] + model.W_pos[:T], rtol=0, atol=0)


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_fused_equals_eager(pos):
    model, toks = make(pos=pos), tokens()
    fused = model(toks)
    seen = []
    noop = [(f"blocks.{l}.attn.hook_pattern", lambda t, n: seen.append(n)) for l in range(L)]
    with model.hooks(noop):
        eager = model(toks)
    assert len(seen) == L  # the pattern hook only fires on the eager path
    torch.testing.assert_close(eager, fused, atol=1e-5, rtol=1e-5)


def test_rope_relative_position():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 16, generator=g, dtype=torch.float64), torch.randn(1, 1, 16, generator=g, dtype=torch.float64)

    def dot(m, n):
        return (apply_rope(q, torch.tensor([m]), 100.0) * apply_rope(k, torch.tensor([n]), 100.0)).sum().item()

    for offset in (0, 1, 5):
        ref = dot(offset, 0)
        for n in (1, 3, 20):
            assert dot(n + offset, n) == pytest.approx(ref, abs=1e-10)
    assert dot(3, 0) != pytest.approx(dot(4, 0))  # and it does depend on the offset
    x = torch.randn(2, 7, 3, 16, dtype=torch.float64)
    r = apply_rope(x, torch.arange(7))
    torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))  # a rotation
    torch.testing.assert_close(r[:, 0], x[:, 0])  # position 0 is the identity


def test_rope_pairs_channel_i_with_i_plus_half():
    # Rotate-half (GPT-NeoX, Llama): channel i of the first half turns with channel i + d/2 by
    # position * base ** (-2 i / d). The relative-position test above passes for any pairing
    # (interleaved too), so this pins the convention on basis vectors with known images.
    d, base, m = 4, 100.0, 3
    basis = torch.eye(d, dtype=torch.float64).reshape(d, 1, 1, d)  # (B=d basis vectors, T=1, H=1, d)
    out = apply_rope(basis, torch.tensor([m]), base)[:, 0, 0]  # (d, d): row j is the image of e_j
    a0, a1 = m * 1.0, m * base ** (-2 * 1 / d)  # angles of pairs (0, 2) and (1, 3)
    expected = torch.tensor([
        [math.cos(a0), 0, math.sin(a0), 0],   # e0 -> cos e0 + sin e2
        [0, math.cos(a1), 0, math.sin(a1)],   # e1 -> cos e1 + sin e3
        [-math.sin(a0), 0, math.cos(a0), 0],  # e2 -> -sin e0 + cos e2
        [0, -math.sin(a1), 0, math.cos(a1)],  # e3 -> -sin e1 + cos e3
    ], dtype=torch.float64)
    torch.testing.assert_close(out, expected)


def test_zero_external_gate_equals_zero_W_O_slice():
    model, toks = make(), tokens()
    gates = torch.ones(L, H)
    gates[1, 2] = 0.0
    ablated = copy.deepcopy(model)
    with torch.no_grad():
        ablated.blocks[1].attn.W_O[2] = 0.0
    torch.testing.assert_close(model(toks, head_gates=gates), ablated(toks), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(model(toks, head_gates=gates), model(toks))


def test_batched_head_gates_equal_per_row_runs():
    model, toks = make(), tokens(B=3)
    gates = torch.rand(3, L, H, generator=torch.Generator().manual_seed(2))
    batched = model(toks, head_gates=gates)
    for b in range(3):
        torch.testing.assert_close(batched[b : b + 1], model(toks[b : b + 1], head_gates=gates[b]), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="head_gates"):
        model(toks, head_gates=torch.ones(H, L))


def test_head_gates_of_another_dtype_refused_by_name():
    # gates made from a numpy array are float64: named here, not torch.addmm's dtype error
    model, toks = make(), tokens(B=2)
    with pytest.raises(ValueError, match=r"head_gates: expected dtype torch.float32 \(the model's\), got torch.float64"):
        model(toks, head_gates=torch.ones(L, H, dtype=torch.float64))


def test_gate_grads_fixed_equal_autograd():
    model, toks = make(), tokens()
    loss = nll(model(toks), toks)
    ref = torch.autograd.grad(loss, [b.attn.gate for b in model.blocks], retain_graph=True)
    loss.backward()
    torch.testing.assert_close(model.gate_grads(), torch.stack(ref))
    assert model.gate_grads().abs().sum() > 0
    torch.testing.assert_close(model.gate_values(), torch.ones(L, H))


def test_gate_grads_learned_equal_autograd():
    model, toks = make(gates="learned").double(), tokens()
    with torch.no_grad():
        for b in model.blocks:
            b.attn.gate_logit.copy_(torch.randn(H, dtype=torch.float64))
    g = model.gate_values()
    loss = nll(model(toks), toks)
    # dL/dlogit = dL/dg * g (1 - g): the chain rule gives the reference dL/dg.
    dlogit = torch.autograd.grad(loss, [b.attn.gate_logit for b in model.blocks], retain_graph=True)
    loss.backward()
    torch.testing.assert_close(model.gate_grads(), torch.stack(dlogit) / (g * (1 - g)))
    torch.testing.assert_close(model.gate_l1(), g.mean())
    model.zero_grad()
    torch.testing.assert_close(model.gate_grads(), torch.zeros(L, H, dtype=torch.float64))


def test_gate_grads_zero_without_backward():
    assert torch.equal(make().gate_grads(), torch.zeros(L, H))
    assert make().gate_l1().item() == 0.0


def test_head_grad_norms_equal_manual():
    model, toks = make(), tokens()
    nll(model(toks), toks).backward()
    norms = model.head_grad_norms()
    assert norms.shape == (L, H, 4)
    for l, b in enumerate(model.blocks):
        for h in range(H):
            for i, w in enumerate((b.attn.W_Q, b.attn.W_K, b.attn.W_V, b.attn.W_O)):
                assert norms[l, h, i].item() == pytest.approx(w.grad[h].norm().item(), rel=1e-5)
    grads = model.head_grads()
    torch.testing.assert_close(grads[1, 3, 3], model.blocks[1].attn.W_O.grad[3].T)


def test_head_weights_layout():
    model = make()
    w = model.head_weights()
    assert w.shape == (L, H, 4, D, D // H)
    torch.testing.assert_close(w[0, 1, 0], model.blocks[0].attn.W_Q[1].detach())
    torch.testing.assert_close(w[1, 2, 3], model.blocks[1].attn.W_O[2].detach().T)
    assert not w.requires_grad
    assert torch.equal(model.head_grads(), torch.zeros_like(w))


@pytest.mark.parametrize("init", ["xavier_uniform", "xavier_normal", "normal"])
def test_init_scale_doubles_std(init):
    w1 = make(init=init).blocks[0].attn.W_Q.detach()
    w2 = make(init=init, init_scale=2.0).blocks[0].attn.W_Q.detach()
    assert w2.std().item() == pytest.approx(2 * w1.std().item(), rel=1e-5)
    expected = 0.02 if init == "normal" else math.sqrt(2 / (D + H * (D // H)))  # xavier std = sqrt(2/(fi+fo))
    assert w1.std().item() == pytest.approx(expected, rel=0.1)


def test_hooks_replace_and_are_removed():
    model, toks = make(), tokens()
    before = model(toks)
    zero_attn = [(f"blocks.{l}.hook_attn_out", lambda t, n: torch.zeros_like(t)) for l in range(L)]
    no_attn = copy.deepcopy(model)
    with torch.no_grad():
        for b in no_attn.blocks:
            b.attn.W_O.zero_()
            b.attn.b_O.zero_()
    with model.hooks(zero_attn):
        torch.testing.assert_close(model(toks), no_attn(toks))
    torch.testing.assert_close(model(toks), before)
    with pytest.raises(RuntimeError, match="boom"), model.hooks(zero_attn):
        raise RuntimeError("boom")
    assert not any(p.fns for p in model.hook_points().values())
    with pytest.raises(KeyError, match="nope"), model.hooks([("nope", lambda t, n: None)]):
        pass


def test_hooks_see_the_graph():
    model, toks = make(), tokens()
    pats = []
    with model.hooks([("blocks.1.attn.hook_pattern", lambda t, n: pats.append(t))]):
        model(toks)
    (penalty,) = torch.autograd.grad(pats[0][..., 0].sum(), [model.blocks[1].attn.W_Q])
    assert penalty.abs().sum() > 0


def test_run_with_cache_names_and_pattern():
    model, toks = make(), tokens()
    logits, cache = model.run_with_cache(toks)
    torch.testing.assert_close(logits, model(toks), atol=1e-5, rtol=1e-5)
    expected = {"hook_embed"}
    for l in range(L):
        expected |= {f"blocks.{l}.{n}" for n in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out",
                                                 "hook_resid_post", "mlp.hook_pre", "mlp.hook_post")}
        expected |= {f"blocks.{l}.attn.hook_{n}" for n in ("q", "k", "rot_q", "rot_k", "v", "attn_scores", "pattern", "z")}
    assert set(cache) == expected
    assert set(cache) == set(model.hook_points())
    pat = cache["blocks.0.attn.hook_pattern"]
    assert pat.shape == (3, H, T, T) and not pat.requires_grad
    torch.testing.assert_close(pat.sum(-1), torch.ones(3, H, T))
    assert torch.equal(pat.triu(1), torch.zeros_like(pat))  # causal: no weight on later keys
    assert torch.isinf(cache["blocks.0.attn.hook_attn_scores"].triu(1)[..., 0, 1:]).all()
    assert cache["blocks.1.attn.hook_q"].shape == (3, T, H, D // H)
    assert cache["blocks.1.attn.hook_z"].shape == (3, T, H, D // H)
    _, some = model.run_with_cache(toks, ["blocks.1.attn.hook_z"])
    assert set(some) == {"blocks.1.attn.hook_z"}
    _, pats = model.run_with_cache(toks, lambda n: n.endswith("hook_pattern"))
    assert set(pats) == {"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"}
    learned = make(pos="learned", attn_only=True).run_with_cache(toks)[1]
    assert "hook_pos_embed" in learned and learned["hook_pos_embed"].shape == (3, T, D)
    assert not any("rot" in n or "mlp" in n for n in learned)


def test_optim_parameters_exclude_gates():
    fixed = make()
    ids = {id(p) for p in fixed.optim_parameters()}
    assert all(b.attn.gate.requires_grad and id(b.attn.gate) not in ids for b in fixed.blocks)
    assert len(ids) == len(list(fixed.parameters())) - L
    assert fixed.n_params() == sum(p.numel() for p in fixed.parameters()) - L * H
    learned = make(gates="learned")
    ids = {id(p) for p in learned.optim_parameters()}
    assert all(id(b.attn.gate_logit) in ids and id(b.attn.gate_probe) not in ids for b in learned.blocks)
    torch.testing.assert_close(learned.gate_values(), torch.full((L, H), torch.sigmoid(torch.tensor(3.0)).item()))


def test_deterministic_init():
    a, b, c = make(seed=5).state_dict(), make(seed=5).state_dict(), make(seed=6).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.W_Q"], c["blocks.0.attn.W_Q"])


def test_hookpoint_is_identity():
    x = torch.randn(2, 3)
    assert torch.equal(HookPoint()(x), x)


# ----------------------------------------------------------------------------- known answers
# Each of these failed under a mutation that every other test passed (a helper audit's): the
# model's RoPE with rope_base ignored, or query positions shifted; a gate applied to another
# head, to b_O, or shared after W_O; hook_z taken after the gate; init_scale on W_Q and W_K only.


def one_layer(**kw) -> Transformer:
    cfg = ModelConfig(**{"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab_size": V, "context": 12, **kw})
    return Transformer(cfg, generator=torch.Generator().manual_seed(0)).double()


@pytest.mark.parametrize("hooked_qk", [False, True], ids=["fused path", "q and k hooked"])
def test_the_models_rope_is_apply_rope_at_positions_0_to_t_with_its_base(hooked_qk):
    # apply_rope had tests of its own; the model rotates with its cached table, which none checked
    m = one_layer(pos="rope", rope_base=37.0)
    names = ["blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k", "blocks.0.hook_resid_pre"]
    _, cache = m.run_with_cache(tokens(), names + (["blocks.0.attn.hook_q", "blocks.0.attn.hook_k"] if hooked_qk else []))
    x = m.blocks[0].ln1(cache["blocks.0.hook_resid_pre"])  # (B, T, D)
    for w, name in ((m.blocks[0].attn.W_Q, "q"), (m.blocks[0].attn.W_K, "k")):
        unrotated = torch.einsum("btd,hde->bthe", x, w)  # (B, T, H, dh)
        torch.testing.assert_close(cache[f"blocks.0.attn.hook_rot_{name}"], apply_rope(unrotated, torch.arange(T), 37.0))


@pytest.mark.parametrize("hook", [None, "attn.hook_pattern"], ids=["fused attention", "pattern hooked"])
def test_the_paired_rotation_gives_rotate_halfs_logits_and_gradients(hook):
    # Unhooked, the model reorders W_Q's and W_K's channels into RoPE's pairs and turns each with
    # one complex multiply; a hook on q makes it rotate-half the weights as stored, the rotation
    # apply_rope's tests check. Same function: same logits, same gradient for every weight.
    m = one_layer(pos="rope", rope_base=37.0, n_layers=2)
    toks = tokens()

    def run(names):
        m.zero_grad(set_to_none=True)
        with m.hooks([(f"blocks.{layer}.{n}", lambda t, name: None) for layer in range(2) for n in names]):
            logits = m(toks)
        nll(logits, toks).backward()
        return logits.detach(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}

    extra = [hook] if hook else []
    paired, rotate_half = run(extra), run(extra + ["attn.hook_q"])
    torch.testing.assert_close(paired[0], rotate_half[0], atol=1e-12, rtol=1e-12)
    assert paired[1].keys() == rotate_half[1].keys() and "blocks.1.attn.W_K" in paired[1]
    for name, grad in paired[1].items():
        torch.testing.assert_close(grad, rotate_half[1][name], atol=1e-12, rtol=1e-12, msg=name)


@pytest.mark.parametrize("gates", ["fixed", "learned"])
def test_a_gate_scales_its_own_heads_output_before_w_o_and_not_the_bias(gates):
    # gates (0, 0.7) equal a model with open gates whose W_O rows of each head are scaled by them
    m, ref = one_layer(gates=gates), one_layer(gates=gates)
    g = torch.tensor([0.0, 0.7], dtype=torch.float64)
    with torch.no_grad():
        if gates == "fixed":
            m.blocks[0].attn.gate.copy_(g)
        else:
            m.blocks[0].attn.gate_logit.copy_(torch.tensor([-1e9, math.log(0.7 / 0.3)]))
            ref.blocks[0].attn.gate_logit.fill_(1e9)  # sigmoid: 1
        for model in (m, ref):
            model.blocks[0].attn.b_O.copy_(torch.linspace(-1, 1, 16, dtype=torch.float64))
        ref.blocks[0].attn.W_O.mul_(g[:, None, None])  # (H, dh, D)
    torch.testing.assert_close(m(tokens()), ref(tokens()))


def test_hook_z_is_the_pattern_times_v_before_the_gate():
    m = one_layer(gates="learned")
    with torch.no_grad():
        m.blocks[0].attn.gate_logit.copy_(torch.tensor([-2.0, 1.0]))
    names = ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_v", "blocks.0.attn.hook_z"]
    _, cache = m.run_with_cache(tokens(), names)
    z = cache["blocks.0.attn.hook_pattern"] @ cache["blocks.0.attn.hook_v"].transpose(1, 2)  # (B, H, T, dh)
    torch.testing.assert_close(cache["blocks.0.attn.hook_z"], z.transpose(1, 2))


@pytest.mark.parametrize("init", ["xavier_uniform", "xavier_normal", "normal"])
def test_init_scale_scales_w_q_w_k_w_v_w_o_exactly_and_nothing_else(init):
    a, b = (Transformer(ModelConfig(d_model=16, n_heads=2, d_mlp=32, vocab_size=V, init=init, init_scale=s, pos="learned"),
                        generator=torch.Generator().manual_seed(0)).state_dict() for s in (1.0, 2.5))
    for key in a:
        if key.split(".")[-1] in ("W_Q", "W_K", "W_V", "W_O"):
            torch.testing.assert_close(b[key], 2.5 * a[key])
        else:
            assert torch.equal(a[key], b[key]), key


def test_the_embedding_gradient_is_the_same_on_one_thread_and_on_two():
    # W_E[tokens] took its gradient through index_put_(accumulate=True), which torch runs with
    # atomic float adds once it has more than one thread and 32768 elements (B x T x d_model):
    # at train.threads = 2 the same config and seed gave other W_E gradients from one run to the
    # next (the default model at batch 32: a whole run's arrays apart, 5e-7 in loss after 30
    # steps). The embedding's backward sums each row in token order, whatever the thread count.
    model = make()
    toks = torch.randint(0, V, (128, 16), generator=torch.Generator().manual_seed(3))  # 128 x 16 x 32 = 65536
    upstream = torch.randn(128, 16, D, generator=torch.Generator().manual_seed(4))
    seen = {}

    def keep(x, name):
        seen["embed"] = x
        return x

    def grad(threads):
        torch.set_num_threads(threads)
        model.zero_grad(set_to_none=True)
        with model.hooks([("hook_embed", keep)]):
            model(toks)
        (seen.pop("embed") * upstream).sum().backward()  # only W_E gets a gradient from this
        return model.W_E.grad.clone()

    before = torch.get_num_threads()
    try:
        one = grad(1)
        assert all(torch.equal(grad(2), one) for _ in range(5))
    finally:
        torch.set_num_threads(before)


# Known answers for mutants a helper audit's mutation run left alive in this file: xavier_normal
# with std sqrt(1 / fan_in) (the same number on the square attention matrices the init tests
# read), logits taken from the residual without ln_final, and the MLP reading ln1 instead of ln2
# (the two are identical at init, so only LayerNorms with their own weights tell them apart).


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """LayerNorm by its definition: (x - mean) / sqrt(population variance + 1e-5) * weight + bias."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * weight + bias


@pytest.mark.parametrize("init", ["xavier_uniform", "xavier_normal"])
def test_xavier_std_is_sqrt_2_over_fan_in_plus_fan_out_on_the_non_square_mlp(init):
    # W_in is 32 x 64 and W_out 64 x 32 (d_mlp = 64): Glorot's std sqrt(2 / (32 + 64)) = 0.144 for
    # both variants (uniform on +-sqrt(6 / 96)); sqrt(1 / fan_in) would give 0.177 and 0.125
    mlp = make(init=init).blocks[0].mlp
    w = torch.cat([mlp.W_in.detach().flatten(), mlp.W_out.detach().flatten()])  # 4096 draws
    assert w.std().item() == pytest.approx(math.sqrt(2 / 96), rel=0.04)
    if init == "xavier_uniform":
        assert w.abs().max().item() <= math.sqrt(6 / 96)


def test_logits_are_ln_final_of_the_last_residual_times_w_u():
    m = one_layer()
    with torch.no_grad():  # a LayerNorm with weights of its own, so skipping it cannot pass
        m.ln_final.weight.copy_(torch.linspace(0.5, 2.0, 16, dtype=torch.float64))
        m.ln_final.bias.copy_(torch.linspace(-1.0, 1.0, 16, dtype=torch.float64))
    logits, cache = m.run_with_cache(tokens(), ["blocks.0.hook_resid_post"])
    x = cache["blocks.0.hook_resid_post"]  # (B, T, D)
    torch.testing.assert_close(logits, _layer_norm(x, m.ln_final.weight, m.ln_final.bias) @ m.W_U)


def test_the_mlp_reads_ln2_of_the_residual_after_attention():
    # x + W_out gelu(W_in ln2(x) + b_in) + b_out on resid_mid (pre-LN, nanoGPT's Block)
    m = one_layer(d_mlp=24)
    block = m.blocks[0]
    with torch.no_grad():  # ln1 stays the identity affine map; ln2 gets weights of its own
        block.ln2.weight.copy_(torch.linspace(2.0, 0.5, 16, dtype=torch.float64))
        block.ln2.bias.copy_(torch.linspace(0.3, -0.6, 16, dtype=torch.float64))
        block.mlp.b_in.copy_(torch.linspace(-0.2, 0.2, 24, dtype=torch.float64))
    _, cache = m.run_with_cache(tokens(), ["blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out"])
    h = _layer_norm(cache["blocks.0.hook_resid_mid"], block.ln2.weight, block.ln2.bias)  # (B, T, D)
    expected = F.gelu(h @ block.mlp.W_in + block.mlp.b_in) @ block.mlp.W_out + block.mlp.b_out
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"], expected)


def test_attention_output_is_the_heads_z_times_their_w_o_slices_plus_b_o():
    # sum_h z_h W_O,h + b_O with open fixed gates; the gate test gives both models one b_O, so
    # dropping it there cancels
    m = one_layer()
    with torch.no_grad():
        m.blocks[0].attn.b_O.copy_(torch.linspace(-1.0, 1.0, 16, dtype=torch.float64))
    _, cache = m.run_with_cache(tokens(), ["blocks.0.attn.hook_z", "blocks.0.hook_attn_out"])
    attn = m.blocks[0].attn
    expected = torch.einsum("bthe,hed->btd", cache["blocks.0.attn.hook_z"], attn.W_O) + attn.b_O
    torch.testing.assert_close(cache["blocks.0.hook_attn_out"], expected)


@pytest.mark.parametrize("init", ["xavier_uniform", "xavier_normal", "normal"])
def test_the_embeddings_are_normal_with_std_0_02_whatever_the_init(init):
    # GPT-2's lookup-table init (module docstring): fans mean nothing for W_E and W_pos
    m = Transformer(ModelConfig(d_model=64, n_heads=2, vocab_size=64, context=64, pos="learned", init=init),
                    generator=torch.Generator().manual_seed(0))
    for w in (m.W_E, m.W_pos):  # 4096 draws each
        assert w.detach().std().item() == pytest.approx(0.02, rel=0.05)


def test_hooks_take_a_generator_of_hooks():
    # the unknown-name check read the pairs once: a generator was used up there, and no hook ran
    model = make()
    with model.hooks((n, lambda t, _: t * 0) for n in ["blocks.0.hook_attn_out"]):
        assert model.hook_points()["blocks.0.hook_attn_out"].active
    assert not any(p.active for p in model.hook_points().values())


def test_an_unknown_hook_name_adds_no_hook_at_all():
    # "removed on exit, even on error": a good hook named before a bad one stayed attached
    model = make()
    with pytest.raises(KeyError, match="unknown hook names"):
        with model.hooks([("blocks.0.hook_resid_pre", lambda t, n: None), ("no.such.hook", lambda t, n: None)]):
            pass
    assert not any(p.active for p in model.hook_points().values())


@pytest.mark.parametrize("name", ["hook_rot_q", "hook_rot_k", "hook_q", "hook_k"])
def test_a_hook_on_q_or_k_alone_takes_effect(name):
    # the fast RoPE path computes q and k without their hook points: a hook on any one of them
    # must send the forward through the path that calls it
    model, toks = make(), tokens()
    with torch.no_grad():
        base = model(toks)
        with model.hooks([(f"blocks.0.attn.{name}", lambda t, n: t * 0)]):
            assert not torch.allclose(base, model(toks))


def test_gate_values_are_detached_and_gate_grads_zero_before_a_backward():
    model = make(gates="learned")
    g = torch.sigmoid(torch.tensor(model.cfg.gate_init))
    assert not model.gate_values().requires_grad
    torch.testing.assert_close(model.gate_values(), torch.full((L, H), g.item()))
    assert torch.equal(model.gate_grads(), torch.zeros(L, H))


def test_one_set_of_head_gates_with_a_leading_1_is_the_same_set_for_every_row():
    model, toks = make(), tokens()
    g = torch.rand(L, H, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(toks, head_gates=g[None]), model(toks, head_gates=g))
        torch.testing.assert_close(model(toks, head_gates=g[None]), model(toks, head_gates=g.expand(3, L, H)))


def layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm by its definition: population variance, eps 1e-5 (torch's default)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def rope_by_hand(x, base):
    """Rotate-half RoPE at positions 0..T-1 on (B, T, H, d): channel i turns with channel i + d/2
    by the angle t * base ** (-2 i / d)."""
    d = x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    angle = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * base ** (-2 * i / d)  # (T, d/2)
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]  # (T, 1, d/2)
    x1, x2 = x[..., : d // 2].double(), x[..., d // 2:].double()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def causal_pattern(q, k):
    """softmax(q k^T / sqrt(dh)) over keys at or before each query; (B, T, H, dh) -> (B, H, T, T)."""
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])
    future = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


@pytest.mark.parametrize("attn_only", [False, True])
def test_attention_is_added_to_the_residual_not_put_in_its_place(attn_only):
    # `x = attn(ln1(x))` (residual dropped) passed every test: the MLP and logits tests read
    # resid_mid / resid_post from the cache, so they followed whatever the block put there.
    m = one_layer(attn_only=attn_only)
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.0.hook_resid_post"]
    names += [] if attn_only else ["blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out"]
    _, c = m.run_with_cache(tokens(), names)
    mid = c["blocks.0.hook_resid_pre"] + c["blocks.0.hook_attn_out"]
    if attn_only:
        torch.testing.assert_close(c["blocks.0.hook_resid_post"], mid)
    else:
        torch.testing.assert_close(c["blocks.0.hook_resid_mid"], mid)
        torch.testing.assert_close(c["blocks.0.hook_resid_post"], mid + c["blocks.0.hook_mlp_out"])


def test_the_heads_read_ln1_of_the_residual_with_eps_1e_5():
    # ln1 built with another eps (1e-2) passed: at init the residual's variance is ~4e-4
    # (embeddings of std 0.02), where the eps is most of the denominator. v = ln1(x) W_V by hand.
    m = one_layer(pos="learned")
    attn = m.blocks[0].attn
    _, c = m.run_with_cache(tokens(), ["blocks.0.hook_resid_pre", "blocks.0.attn.hook_v"])
    x = c["blocks.0.hook_resid_pre"]  # (B, T, D)
    assert x.var(-1).max().item() < 1e-2  # the regime where the eps matters
    h = layer_norm(x, m.blocks[0].ln1.weight, m.blocks[0].ln1.bias)
    torch.testing.assert_close(c["blocks.0.attn.hook_v"], torch.einsum("btd,hde->bthe", h, attn.W_V))


def test_the_paired_rope_table_of_one_base_is_not_served_to_a_model_of_another():
    # The complex table's cache key without the base passed: every test builds its RoPE models
    # with one base, so the first table made for (T, d_head, dtype, heads) was the right one.
    # Two models of one shape and different bases in one process (a rope_base sweep run by one
    # worker, an analysis of two runs) then rotated the second by the first's angles.
    model_module._ROPE_CACHE.clear()  # a cache: clearing it changes no result, only what is cached
    other, m = one_layer(pos="rope", rope_base=10000.0), one_layer(pos="rope", rope_base=37.0)
    toks = tokens()
    other(toks)  # the unhooked (paired) path fills the table for this shape at base 10000
    q_rot = {}

    def keep(t, name):
        q_rot[name] = t

    with m.hooks([("blocks.0.attn.hook_pattern", keep)]):
        m(toks)  # paired path at base 37
    x = layer_norm(m.W_E[toks].detach(), m.blocks[0].ln1.weight, m.blocks[0].ln1.bias)
    attn = m.blocks[0].attn
    q, k = (rope_by_hand(torch.einsum("btd,hde->bthe", x, w.detach()), 37.0) for w in (attn.W_Q, attn.W_K))
    torch.testing.assert_close(q_rot["blocks.0.attn.hook_pattern"], causal_pattern(q, k))


def test_apply_rope_turns_half_precision_input_by_float32_angles_with_base_10000_by_default():
    # Angles taken in float16 (x's dtype) passed: every test fed float32/64. At position 2000 a
    # float16 angle is off by up to 1 rad (its spacing there is 1 or 2). And the default base
    # (10000, RoFormer's) was read by no test: only norm and position-0 checks used it.
    x = torch.randn(1, 2048, 1, 8, generator=torch.Generator().manual_seed(0))
    want = rope_by_hand(x.double(), 10000.0)
    torch.testing.assert_close(apply_rope(x, torch.arange(x.shape[1])), want.float(), atol=2e-4, rtol=0)  # float32 angles near 2000 rad
    half = apply_rope(x.half(), torch.arange(x.shape[1]))
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.double(), rope_by_hand(x.half().double(), 10000.0), atol=4e-3, rtol=0)
