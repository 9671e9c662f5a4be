"""The snapshot schedule."""

import numpy as np

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
