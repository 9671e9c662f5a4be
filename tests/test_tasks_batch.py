"""Tests of dynamics.tasks.batch: make_batch's arguments, task keys, mixtures and the low-data pool."""

import math

import numpy as np
import pytest

from dynamics import tasks
from dynamics.config import from_dict
from dynamics.tasks import SPLITS, data_hash, make_batch
from tests.test_tasks import ALL, cfg_for


def test_bad_arguments_raise():
    cfg = cfg_for("induction")
    with pytest.raises(ValueError, match="split"):
        make_batch(cfg, "test", 0, 4)
    with pytest.raises(ValueError, match="component"):
        make_batch(cfg, "train", 0, 4, component="markov")
    with pytest.raises(ValueError, match="step"):
        make_batch(cfg, "train", -1, 4)
    with pytest.raises(ValueError, match="batch_size"):
        make_batch(cfg, "train", 0, 0)
    assert SPLITS == ("train", "eval", "probe")


@pytest.mark.parametrize("name", ["induction", "offset_copy", "markov", "slash_text"])
def test_task_keys_lists_exactly_the_keys_the_generator_reads(name):
    # tasks.TASK_KEYS decides which sweep points are the same run (a key the task does not read);
    # a key missing there would refuse a real sweep, an extra one let duplicate runs through
    other = {"min_period": 5, "max_period": 9, "delta": 2, "p": 0.5, "markov_order": 2, "markov_branching": 2,
             "holdout": 0.3}
    assert set(other) == {k for keys in tasks.TASK_KEYS.values() for k in keys}
    h = data_hash(cfg_for(name))
    for key, value in other.items():
        assert (data_hash(cfg_for(name, **{key: value})) != h) == (key in tasks.TASK_KEYS[name]), key


def test_a_task_key_no_task_of_the_config_reads_is_named():
    from dynamics.config import ConfigError

    # at its default, a key is not "set": every config carries every task key
    assert tasks.unread_keys(from_dict({"task": {"name": "induction"}})) == {}
    assert tasks.unread_keys(from_dict({"task": {"name": "induction", "min_period": 5, "delta": 5, "p": 0.8}})) == {"delta": 5}
    mixture = {"name": "mixture", "components": ["induction", "markov"], "delta": 2, "markov_order": 2, "holdout": 0.3}
    assert tasks.unread_keys(from_dict({"task": mixture})) == {"delta": 2, "holdout": 0.3}
    with pytest.raises(ConfigError, match=r"^task\.delta = 2: the induction and markov tasks do not read it "
                                          r"\(only offset_copy does\)"):
        tasks.check_read(from_dict({"task": mixture}))
    tasks.check_read(from_dict({"task": {"name": "offset_copy", "delta": 2}}))


def test_mixture_proportions_and_components():
    cfg = cfg_for("mixture", **ALL["mixture"])
    b = make_batch(cfg, "train", 0, 2000)
    w = np.array([0.5, 0.3, 0.2])
    freq = np.bincount(b.component, minlength=3) / 2000
    assert np.all(np.abs(freq - w) <= 5 * np.sqrt(w * (1 - w) / 2000))
    # Rows carry their component's structure.
    ind = b.component == 0
    assert b.repeat_mask[ind].any() and not b.repeat_mask[~ind].any()
    slash = b.tokens[b.component == 2]
    assert (slash == ord("/")).any(axis=1).mean() > 0.9


def test_mixture_equal_weights_when_empty():
    cfg = cfg_for("mixture", components=["induction", "markov"])
    freq = np.bincount(make_batch(cfg, "train", 1, 2000).component, minlength=2) / 2000
    assert np.all(np.abs(freq - 0.5) <= 5 * math.sqrt(0.25 / 2000))


def test_component_forcing():
    cfg = cfg_for("mixture", **ALL["mixture"])
    for i, name in enumerate(cfg.task.component_names):
        b = make_batch(cfg, "eval", 2, 5, component=name)
        assert (b.component == i).all()
        # A forced component is the same stream as that task on its own.
        alone = make_batch(cfg_for(name, vocab=256), "eval", 2, 5)
        np.testing.assert_array_equal(b.tokens, alone.tokens)
        np.testing.assert_array_equal(b.repeat_mask, alone.repeat_mask)
    assert (make_batch(cfg_for("markov"), "train", 0, 3, component="markov").component == 0).all()
    with pytest.raises(ValueError, match="component"):
        make_batch(cfg, "train", 0, 4, component="offset_copy")


def test_low_data_pool_draws_train_rows_from_a_fixed_pool():
    cfg = from_dict({"task": {"name": "induction", "pool_size": 5}, "model": {"context": 32}})
    seen = {tuple(r) for step in range(20) for r in make_batch(cfg, "train", step, 8).tokens}
    assert len(seen) <= 5
    pool = make_batch(from_dict({"task": {"name": "induction"}, "model": {"context": 32}}), "train", 0, 5).tokens
    assert seen <= {tuple(r) for r in pool}
    # eval and probe stay fresh, and the data hash tells the low-data run apart
    assert len({tuple(r) for r in make_batch(cfg, "eval", 0, 16).tokens}) > 5
    assert data_hash(cfg) != data_hash(from_dict({"task": {"name": "induction"}, "model": {"context": 32}}))


def test_low_data_pool_draws_every_row_of_the_pool():
    # Rows are drawn uniformly from all pool_size rows: with 2, 64 draws from one row only would
    # have probability 2^-63.
    cfg = from_dict({"task": {"name": "induction", "pool_size": 2}, "model": {"context": 32}})
    pool = make_batch(from_dict({"task": {"name": "induction"}, "model": {"context": 32}}), "train", 0, 2).tokens
    drawn = {tuple(r) for r in make_batch(cfg, "train", 0, 64).tokens}
    assert drawn == {tuple(r) for r in pool}


def test_a_forced_component_of_a_pooled_train_split_is_that_component_fresh():
    # Per-component rows (the recorder's and the gates' data) come from the task itself, never
    # from the low-data pool, whose rows mix components.
    mixture = {"name": "mixture", "components": ["induction", "markov"]}
    pooled = from_dict({"task": {**mixture, "pool_size": 4}, "model": {"context": 32}})
    fresh = from_dict({"task": mixture, "model": {"context": 32}})
    for i, name in enumerate(pooled.task.component_names):
        b = make_batch(pooled, "train", 3, 6, component=name)
        assert (b.component == i).all()
        np.testing.assert_array_equal(b.tokens, make_batch(fresh, "train", 3, 6, component=name).tokens)


def test_each_thread_keeps_one_low_data_pool():
    # A sweep worker's thread trains pooled runs one after another; a cache of every pool made kept
    # each seed's pool for the worker's life. Threads side by side keep their own.
    import threading

    from dynamics.tasks import batch

    cfgs = [from_dict({"task": {"name": "induction", "pool_size": 5}, "model": {"context": 32}, "train": {"seed": s}})
            for s in (0, 1)]
    first = batch._pool(cfgs[0])
    assert batch._pool(cfgs[0]) is first  # kept while its run trains
    batch._pool(cfgs[1])
    assert batch._pool(cfgs[0]) is not first  # the next run's pool replaced it
    mine = batch._pool(cfgs[0])
    other = {}
    thread = threading.Thread(target=lambda: other.update(pool=batch._pool(cfgs[1]), again=batch._pool(cfgs[1])))
    thread.start()
    thread.join()
    assert other["again"] is other["pool"] and batch._pool(cfgs[0]) is mine
