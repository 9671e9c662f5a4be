"""Tests of dynamics.tasks.offset_copy: the copy rate and offset."""

import math

import pytest

from dynamics.tasks import make_batch
from tests.test_tasks import cfg_for


@pytest.mark.parametrize("delta,p", [(1, 0.8), (3, 0.8), (5, 0.3)])
def test_offset_copy_rate_and_offset(delta, p):
    V, T, B = 64, 64, 256
    cfg = cfg_for("offset_copy", delta=delta, p=p, context=T)
    b = make_batch(cfg, "train", 0, B)
    x = b.tokens
    mask = b.repeat_mask  # mask[:, t] says whether token t + 1 was copied
    assert not mask[:, : delta - 1].any()  # nothing before delta is copied
    # Every copied token equals the one delta back.
    copied = mask[:, delta - 1 :]
    assert (x[:, delta:][copied] == x[:, :-delta][copied]).all()
    # Copy decisions happen at rate p (binomial, 5 sigma).
    n = copied.size
    assert abs(copied.mean() - p) <= 5 * math.sqrt(p * (1 - p) / n)
    # Observed equality at offset delta: p + (1 - p) / V (chance matches of fresh draws).
    eq = (x[:, delta:] == x[:, :-delta]).mean()
    q = p + (1 - p) / V
    assert abs(eq - q) <= 5 * math.sqrt(q * (1 - q) / n)
    # At another offset the match rate is near chance unless offsets line up with delta.
    other = delta + 1 if delta > 1 else 2
    if other % delta:
        eq_other = (x[:, other:] == x[:, :-other]).mean()
        assert eq_other < 0.2
