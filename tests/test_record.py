"""The snapshot schedule."""

import numpy as np
import pytest

from dynamics.record import snapshot_steps


def test_schedule_dense_then_every_then_last():
    assert snapshot_steps(1000, 64, 250).tolist() == [0, 1, 2, 4, 8, 16, 32, 64, 250, 500, 750, 1000]


def test_schedule_includes_last_step_off_cadence():
    s = snapshot_steps(130, 8, 50)
    assert s.tolist() == [0, 1, 2, 4, 8, 50, 100, 130]


def test_schedule_short_run_and_no_dense_phase():
    assert snapshot_steps(3, 64, 100).tolist() == [0, 1, 2, 3]
    assert snapshot_steps(10, 0, 5).tolist() == [0, 5, 10]


def test_schedule_sorted_unique():
    s = snapshot_steps(4096, 1024, 512)
    assert np.all(np.diff(s) > 0) and s[0] == 0 and s[-1] == 4096


def test_schedule_cadence_starts_where_the_powers_of_two_stop():
    # dense_until 1000 is not a power of two: the geometric phase ends at 512, and the cadence
    # must take over there (600, 700, ...), not only after dense_until (it began at 1100).
    s = snapshot_steps(2000, 1000, 100)
    assert s.tolist() == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, *range(600, 2001, 100)]
    assert 100 in snapshot_steps(1000, 100, 100).tolist()  # a multiple of every <= dense_until


def _recorder_and_model():
    import torch

    from dynamics.config import from_dict
    from dynamics.model import Transformer
    from dynamics.record import Recorder

    cfg = from_dict({"model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16,
                               "context": 16},
                     "task": {"name": "markov"}, "record": {"n_probe": 2, "eval_batch_size": 4}})
    torch.manual_seed(0)
    return cfg, Recorder(cfg, torch.device("cpu")), Transformer(cfg.model)


def test_grad_cosine_known_answers_and_nan_for_a_zero_gradient():
    import torch
    import torch.nn.functional as F

    cfg, rec, model = _recorder_and_model()
    toks = torch.randint(0, 16, (4, 17), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(toks[:, :-1]).flatten(0, 1), toks[:, 1:].flatten()).backward()
    attn = model.blocks[0].attn
    attn.W_Q.grad[1] = 0.0  # as for a head whose pattern is clamped: no gradient reaches its W_Q
    first = rec.snapshot(model)
    assert np.isnan(first["grad_cosine"]).all()  # no earlier gradient to compare with
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(-2.0)  # the opposite direction: cosine -1 exactly
    second = rec.snapshot(model)["grad_cosine"]  # (L, H, 4)
    assert first["grad_norm"][0, 1, 0] == 0.0
    assert np.isnan(second[0, 1, 0])  # undefined, not 0 ("orthogonal")
    rest = np.delete(second.reshape(-1), np.ravel_multi_index((0, 1, 0), second.shape))
    np.testing.assert_allclose(rest, -1.0, atol=1e-6)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(-1.0)  # 2 g: opposite to the last snapshot's (-1), along the first one's (+1)
    third = rec.snapshot(model)["grad_cosine"].reshape(-1)
    np.testing.assert_allclose(np.delete(third, np.ravel_multi_index((0, 1, 0), second.shape)), -1.0, atol=1e-6)


def test_grad_norm_and_cosine_of_a_tiny_gradient_are_its_own_not_float32_underflow():
    # init_scale 1e-8 or a gate shut to 1e-26 gives gradient entries near 1e-24: their float32
    # squares underflowed, so grad_norm read 0 and grad_cosine -2e6 (eps 1e-30 in the denominator)
    import torch
    import torch.nn.functional as F

    cfg, rec, model = _recorder_and_model()
    toks = torch.randint(0, 16, (4, 17), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(toks[:, :-1]).flatten(0, 1), toks[:, 1:].flatten()).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(1e-24)  # float32 still holds every entry (normal down to 1.2e-38)
    first = rec.snapshot(model)
    exact = model.head_grads().double().flatten(-2).norm(dim=-1).numpy()  # (L, H, 4)
    assert (exact > 0).all() and exact.max() < 1e-21
    np.testing.assert_allclose(first["grad_norm"], exact, rtol=1e-6)
    np.testing.assert_allclose(model.head_grad_norms().numpy(), exact, rtol=1e-6)
    turned = {p: p.grad.clone() for p in model.parameters() if p.grad is not None}
    gen = torch.Generator().manual_seed(2)
    for p, g in turned.items():
        p.grad.add_(torch.randn(g.shape, generator=gen) * g.abs().max())  # another direction, same scale
    second = rec.snapshot(model)["grad_cosine"]
    a, b = (torch.stack([t.double() for t in model._per_head(lambda w, d=d: d[w])]).flatten(-2)
            for d in (turned, {p: p.grad for p in turned}))  # (L, H, 4, d_model*d_head): before, now
    cosine = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))  # no eps: these norms are ~1e-24
    np.testing.assert_allclose(second, cosine.numpy(), rtol=1e-5, atol=1e-6)
    assert (np.abs(second) <= 1.0).all()


def test_chg_is_fitted_at_every_kth_snapshot_and_at_the_last_step():
    from dynamics.config import from_dict
    from dynamics.record import chg_fitted

    cfg = from_dict({"train": {"steps": 10}, "record": {"chg_every": 3}})
    steps_at = np.array([0, 1, 2, 4, 8, 10])  # snapshots 0 and 3 by the cadence, 5 as the last step
    assert chg_fitted(cfg, steps_at).tolist() == [True, False, False, True, False, True]
    off = from_dict({"train": {"steps": 10}, "record": {"chg_every": 0}})
    assert not chg_fitted(off, steps_at).any()


def test_head_weights_are_recorded_up_to_d_model_256_on_auto():
    from dynamics.config import from_dict
    from dynamics.record import store_head_weights

    def cfg(d_model, mode="auto"):
        return from_dict({"model": {"d_model": d_model, "n_heads": 4}, "record": {"head_weights": mode}})

    assert store_head_weights(cfg(256)) and not store_head_weights(cfg(320))
    assert store_head_weights(cfg(320, "on")) and not store_head_weights(cfg(16, "off"))


def test_unfitted_chg_is_nan_and_its_role_unfitted_also_where_unwritten():
    # 0.0 would read as a shut gate and role 0 as "facilitating": an unfitted snapshot must not.
    from dataclasses import replace

    from dynamics.gates import UNFITTED
    from dynamics.record import variables

    cfg, rec, model = _recorder_and_model()
    blocks = rec.chg(model, fit=False)
    assert blocks["chg"].shape == (2, 2, 2) and np.isnan(blocks["chg"]).all()
    assert (blocks["chg_role"] == UNFITTED).all()
    with_chg = replace(cfg, record=replace(cfg.record, chg_every=2))
    dims, shape, dtype, fill = variables(with_chg, 3)["chg_role"]  # the store's fill for unwritten chunks
    assert (shape, dtype, fill) == ((3, 2, 2), "int8", UNFITTED)


def test_grad_norm_importance_and_a_gradient_that_vanishes_by_hand():
    # grad_norm is each head slice's Frobenius norm, importance |dL/dg| (signed gradients cancel
    # in a mean over snapshots), and a gradient that is zero now and was not before has no
    # direction to compare: NaN, not the 0 torch's cosine gives.
    import torch
    import torch.nn.functional as F

    cfg, rec, model = _recorder_and_model()
    toks = torch.randint(0, 16, (4, 17), generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(toks[:, :-1]).flatten(0, 1), toks[:, 1:].flatten()).backward()
    first = rec.snapshot(model)
    attn = model.blocks[1].attn
    assert first["grad_norm"][1, 0, 0] == pytest.approx(attn.W_Q.grad[0].norm().item(), rel=1e-6)
    assert first["grad_norm"][1, 1, 3] == pytest.approx(attn.W_O.grad[1].norm().item(), rel=1e-6)
    gate = torch.stack([b.attn.gate.grad for b in model.blocks]).numpy()  # (L, H) dL/dg
    assert (gate < 0).any()  # a sign to lose
    np.testing.assert_allclose(first["importance"], np.abs(gate), rtol=1e-6)
    attn.W_Q.grad[0] = 0.0  # this head's W_Q gradient vanishes; every other stays as it was
    second = rec.snapshot(model)["grad_cosine"]  # (L, H, 4)
    assert np.isnan(second[1, 0, 0])
    rest = np.delete(second.reshape(-1), np.ravel_multi_index((1, 0, 0), second.shape))
    np.testing.assert_allclose(rest, 1.0, atol=1e-6)


def test_a_completed_run_whose_last_gradient_is_nan_is_not_called_damaged(tmp_path):
    # The gradient of training batch `train.steps` is recorded but applied by no update, so nothing
    # checks that it is finite: a NaN gradient there, with a finite loss, leaves the run completed.
    # Its grad_norm, grad_cosine and importance at the last snapshot are then all NaN, zarr's fill
    # value, so zarr writes no chunk: `dynamics analyse`, `predict`, `report` and `sweep` called the
    # run damaged ("its chunk ... is missing, though the run wrote it").
    import tomllib

    import pytest
    import torch

    from dynamics import store
    from dynamics.config import from_dict
    from dynamics.model import Transformer
    from dynamics.record import Recorder, coords, snapshot_steps, variables
    from dynamics.train import train_run
    from tests.conftest import TINY

    path = str(tmp_path / "s.zarr")
    cfg = from_dict(tomllib.loads(TINY.format(steps=10, every=5)))
    result = train_run(cfg, path)
    assert result.status == "completed"
    run_id = result.run_id
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    last = len(steps_at) - 1

    # What the recorder makes of a NaN gradient at a later snapshot (prev_grads set: not the first)
    rec, model = Recorder(cfg, torch.device("cpu")), Transformer(cfg.model)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    rec.snapshot(model)
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    blocks = rec.snapshot(model)
    nan = {k: blocks[k] for k in ("grad_norm", "grad_cosine", "importance")}
    assert all(np.isnan(v).all() for v in nan.values())

    run = tmp_path / "s.zarr" / "runs" / run_id
    kept = run / "grad_cosine" / "c" / str(last) / "0" / "0" / "0"
    store.check_recorded(path, run_id)
    # grad_cosine's final chunk is there while grad_norm's is not: the gradient was not NaN, a chunk was lost
    (run / "grad_norm" / "c" / str(last) / "0" / "0" / "0").unlink()
    with pytest.raises(store.StoreError, match=rf"array grad_norm at snapshot {last} \(step 10\).* is missing"):
        store.check_recorded(path, run_id)

    w = store.RunWriter(path, run_id, variables=variables(cfg, len(steps_at)), coords=coords(cfg, steps_at),
                        attrs={}, resume=True)
    w.write_snapshot(last, nan)
    assert kept.exists()  # all fill value, written all the same: no chunk of this run is ever "all NaN"
    store.check_recorded(path, run_id)  # completed, every chunk it wrote is there
    assert np.isnan(store.open_run(path, run_id).grad_norm.isel(snapshot=-1).values).all()
    # so losing it is named, where a run from before could only pass it over (below)
    (run / "grad_norm" / "c" / str(last) / "0" / "0" / "0").unlink()
    with pytest.raises(store.StoreError, match=rf"array grad_norm at snapshot {last} \(step 10\).* is missing"):
        store.check_recorded(path, run_id)

    # A run from before the writer stored all-NaN chunks had none for that snapshot: its missing
    # gradient chunks are told from lost ones by grad_cosine's, missing too.
    store.update_run_attrs(path, run_id, empty_chunks_written=False)
    with pytest.raises(store.StoreError, match=rf"array grad_norm at snapshot {last} "):
        store.check_recorded(path, run_id)  # grad_cosine's chunk is there: the gradient was finite
    for name in ("grad_cosine", "importance"):
        for chunk in (run / name / "c" / str(last)).rglob("*"):
            if chunk.is_file():
                chunk.unlink()
    store.check_recorded(path, run_id)

    # a snapshot before the last: its gradient was checked before its update, so NaN there would
    # have ended the run diverged; in a completed run its missing chunk is a lost one
    (run / "grad_norm" / "c" / str(last - 1) / "0" / "0" / "0").unlink()
    (run / "grad_cosine" / "c" / str(last - 1) / "0" / "0" / "0").unlink()
    with pytest.raises(store.StoreError, match=rf"array grad_norm at snapshot {last - 1} \(step 8\)"):
        store.check_recorded(path, run_id)


def test_the_probe_and_each_components_eval_loss_by_hand(tmp_path):
    # Components' eval losses swapped, or eval and probe rows drawn from the train split, passed
    # every other test (a helper audit's mutations).
    import pytest
    import torch
    import torch.nn.functional as F

    from dynamics import store
    from dynamics.checkpoint import load_run_model
    from dynamics.config import from_dict
    from dynamics.tasks import make_batch
    from dynamics.train import train_run

    cfg = from_dict({"model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16,
                               "context": 12},
                     "task": {"name": "mixture", "components": ["induction", "markov"], "min_period": 3, "max_period": 5},
                     "train": {"steps": 4, "batch_size": 4, "warmup_steps": 1, "eval_batches": 2},
                     "record": {"dense_until": 2, "every": 2, "n_probe": 2, "eval_batch_size": 3}})
    path = str(tmp_path / "s.zarr")
    train_run(cfg, path)
    ds = store.open_run(path).load()
    model, _, _ = load_run_model(path)  # the final model: the last snapshot's
    np.testing.assert_array_equal(ds.probe_tokens.values, make_batch(cfg, "probe", 0, 2).tokens[:, :-1])
    for c, name in enumerate(cfg.task.component_names):
        rows = torch.from_numpy(np.concatenate([make_batch(cfg, "eval", i, 3, component=name).tokens for i in range(2)]))
        with torch.no_grad():
            want = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten()).item()
        assert ds.eval_loss.values[-1, c] == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("settings", [
    {}, {"model": {"d_model": 320, "n_heads": 4}}, {"record": {"head_weights": "off"}},
    {"record": {"head_weights": "on", "chg_every": 2}, "model": {"d_model": 320, "n_heads": 4}}])
def test_recorded_arrays_are_those_a_run_creates(settings):
    # what check_recorded expects of a run from its config attr, torch-free, against what the writer is given
    from dynamics import schema
    from dynamics.config import from_dict
    from dynamics.record import coords, variables

    cfg = from_dict({"train": {"steps": 10}} | settings)
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    assert schema.recorded_arrays(cfg.to_dict()) == set(variables(cfg, len(steps_at))) | set(coords(cfg, steps_at))
    assert schema.recorded_arrays({"model": {}}) is None and schema.recorded_arrays(None) is None


@pytest.mark.parametrize("attention_dtype", ["float16", "float32"])
def test_the_attention_array_is_made_in_record_attention_dtype(attention_dtype):
    # variables() declaring the maps float32 whatever record.attention_dtype passed every test:
    # the snapshot converts to the configured dtype, and the writer stored it in a float32 array
    # (twice the disk of the float16 default). Layout (S, L, H, P, T, T) by hand.
    from dynamics.config import from_dict
    from dynamics.record import variables

    cfg = from_dict({"model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "vocab_size": 16, "context": 8},
                     "task": {"name": "markov"}, "record": {"n_probe": 3, "attention_dtype": attention_dtype}})
    spec = variables(cfg, 5)
    assert spec["attention"][1:] == ((5, 2, 2, 3, 8, 8), attention_dtype)
    assert spec["grad_norm"][1:] == ((5, 2, 2, 4), "float32")
