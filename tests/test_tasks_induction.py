"""Tests of dynamics.tasks.induction: periodic rows of distinct tokens, periods and samplers."""

import numpy as np

from dynamics.tasks import data_hash, make_batch
from tests.test_tasks import cfg_for


def smallest_period(row):
    for p in range(1, len(row)):
        if np.array_equal(row[p:], row[:-p]):
            return p
    return len(row)


def test_induction_periodic_with_varying_period():
    cfg = cfg_for("induction", min_period=3, max_period=12, context=40)
    b = make_batch(cfg, "train", 0, 64)
    periods = np.array([smallest_period(r) for r in b.tokens])
    assert periods.min() >= 3 and periods.max() <= 12
    assert len(np.unique(periods)) >= 5  # periods vary, so no fixed offset solves the task
    for row, p in zip(b.tokens, periods, strict=True):
        assert len(np.unique(row[:p])) == p  # tokens within a segment are distinct
    t = np.arange(40)
    np.testing.assert_array_equal(b.repeat_mask, t[None, :] + 1 >= periods[:, None])
    assert (b.component == 0).all()


def test_induction_large_vocab_distinct():
    cfg = cfg_for("induction", vocab=5000, min_period=20, max_period=32, context=64)
    b = make_batch(cfg, "train", 0, 16)
    for row in b.tokens:
        p = smallest_period(row)
        assert 20 <= p <= 32 and len(np.unique(row[:p])) == p


def test_induction_iid_segments_are_redrawn_until_distinct():
    # Past V = 1024 a short segment is drawn i.i.d. and its repeats redrawn. At k = 64, V = 4096 a
    # row has a repeat with probability 1 - prod(1 - i/4096) = 0.39, so 32 rows without the redraw
    # would all be distinct with probability 1e-7. Every token of the period is used here
    # (min = max), unlike test_induction_large_vocab_distinct, whose rows use only a prefix.
    from dynamics.tasks.induction import permutation_sampler

    assert not permutation_sampler(64, 4096)  # the i.i.d. path
    cfg = cfg_for("induction", vocab=4096, min_period=64, max_period=64, context=128)
    for row in make_batch(cfg, "train", 0, 32).tokens:
        assert len(np.unique(row[:64])) == 64


def test_induction_draws_every_period_from_min_to_max_equally():
    cfg = cfg_for("induction", min_period=3, max_period=6, context=16)
    b = make_batch(cfg, "train", 0, 4000)
    periods = np.argmax(b.repeat_mask, axis=1) + 1  # the first target that repeats is at t + 1 = P
    counts = np.bincount(periods, minlength=7)[3:]
    assert counts.sum() == 4000 and (counts > 0).all() and len(counts) == 4
    assert np.abs(counts / 4000 - 0.25).max() < 0.03  # 4.4 standard deviations of a share of 4000 rows


def test_induction_segments_as_long_as_the_vocabulary_are_permutations_and_drawn_blockwise(monkeypatch):
    # Over 1024 tokens a segment was drawn i.i.d. and its repeats redrawn until none remained: a
    # coupon collector's endgame as the segment nears the vocabulary (43 s a batch of 32 at 2048 of
    # 2048). Those configs now draw a permutation's prefix, and their data hash says so.
    from dynamics.tasks import induction

    cfg = cfg_for("induction", vocab=2048, min_period=2, max_period=2048, context=4096)
    b = make_batch(cfg, "train", 0, 4)
    for row, p in zip(b.tokens, np.argmax(b.repeat_mask, axis=1) + 1, strict=True):
        assert len(np.unique(row[:p])) == p
    assert induction.permutation_sampler(2048, 2048) and not induction.permutation_sampler(1024, 2048)
    assert induction.permutation_sampler(1024, 1024)  # small vocabularies: always
    from dynamics.tasks.hashing import _sha

    def unmarked(max_period):  # the hash as it was before: every other config keeps it, runs resume
        params = {"vocab_size": 2048, "min_period": 2, "max_period": max_period}
        return _sha({"task": "induction", "version": 1, "params": params})

    assert data_hash(cfg) != unmarked(2048)
    assert data_hash(cfg_for("induction", vocab=2048, min_period=2, max_period=1024, context=2048)) == unmarked(1024)
    # longer than the vocabulary: drawn i.i.d. before and now, so its hash (and its runs' resume) stays
    assert data_hash(cfg_for("induction", vocab=2048, min_period=2, max_period=2100, context=4200)) == unmarked(2100)
    # Blockwise is the same draws in the same order as all at once: the same tokens as before
    whole = np.argsort(np.random.default_rng(5).random((37, 50)), axis=1)[:, :20]
    monkeypatch.setattr(induction, "SORT_BLOCK", 150)  # 3 rows a block
    np.testing.assert_array_equal(induction._permutation_prefix(np.random.default_rng(5), 37, 20, 50), whole)
