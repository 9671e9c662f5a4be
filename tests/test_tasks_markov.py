"""Tests of dynamics.tasks.markov: the sparse chain, its transitions and evaluation paths."""

import numpy as np
import pytest

from dynamics import tasks
from dynamics.tasks import make_batch
from tests.test_tasks import cfg_for


def transitions(tokens, order):
    out = {}
    for row in tokens:
        for t in range(order, len(row)):
            out.setdefault(tuple(row[t - order : t]), set()).add(int(row[t]))
    return out


@pytest.mark.parametrize("order,branching", [(1, 3), (2, 2)])
def test_markov_sparse_and_fixed_across_seeds(order, branching):
    V = 16
    seen = {}
    for seed in (0, 1):
        cfg = cfg_for("markov", vocab=V, markov_order=order, markov_branching=branching, seed=seed)
        b = make_batch(cfg, "train", seed, 64)
        assert not b.repeat_mask.any()
        for ctx, nxt in transitions(b.tokens, order).items():
            seen.setdefault(ctx, set()).update(nxt)
    assert len(seen) >= V  # plenty of contexts observed
    assert max(len(s) for s in seen.values()) <= branching
    assert sum(len(s) for s in seen.values()) > len(seen)  # not deterministic either
    # Observed successors are among the chain's allowed ones.
    ctxs = np.array(sorted(seen))
    succ, prob = tasks.markov_transitions(V, order, branching, ctxs)
    np.testing.assert_allclose(prob.sum(axis=1), 1.0)
    for c, s, pr in zip(ctxs, succ, prob, strict=True):
        assert seen[tuple(c)] <= set(s[pr > 0].tolist())
    # contexts the chain cannot have: rules were returned for them
    for bad in (np.full((1, order), V), np.full((1, order), -1), np.zeros((1, order + 1), int), np.full((1, order), 0.5)):
        with pytest.raises(ValueError, match="contexts must be"):
            tasks.markov_transitions(V, order, branching, bad)
    # sizes the chain cannot have: an IndexError or a reshape error from inside the rules before
    for args, name in (((V, 0, branching, np.zeros((1, 0), int)), "order"), ((V, order, 0, ctxs), "K"),
                       ((0, order, branching, ctxs[:0]), "V"), ((V, order, 2.0, ctxs), "K")):
        with pytest.raises(ValueError, match=rf"^markov_transitions: {name} must be an integer >= 1; got "):
            tasks.markov_transitions(*args)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_markov_evaluation_paths_agree(order):
    outs = [tasks._markov(np.random.default_rng(4), 8, 40, 12, order, 3, m) for m in ("lut", "table", "hash")]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_markov_rules_read_every_token_of_the_context():
    # The chain is a hash of the whole context: contexts that differ only in their oldest token
    # have their own successors (a chain that ignored it would be of a lower order).
    V, K = 16, 3
    one, _ = tasks.markov_transitions(V, 1, K, np.arange(V)[:, None])
    assert len({tuple(s) for s in one}) > 1
    for newest in range(V):
        ctx = np.stack([np.arange(V), np.full(V, newest)], axis=1)  # (a, newest) for every a
        succ, _ = tasks.markov_transitions(V, 2, K, ctx)
        assert len({tuple(s) for s in succ}) > 1


def test_markov_probabilities_are_dirichlet_one():
    # Normalised -log U weights are Dirichlet(1, ..., 1): with two successors the first one's
    # probability is uniform on (0, 1), so about 1/4 of contexts give it less than 1/4 (level
    # < 64 of 256: 63.5 / 256 = 0.248). Normalised U weights would give 1/6. Over the 4096
    # contexts of V = 64, order 2 the binomial standard deviation is 0.007.
    ctx = np.stack(np.divmod(np.arange(64 * 64), 64), axis=1)
    _, prob = tasks.markov_transitions(64, 2, 2, ctx)
    assert abs((prob[:, 0] < 0.25).mean() - 0.248) < 0.03


def test_markov_first_tokens_are_uniform_over_the_vocabulary():
    cfg = cfg_for("markov", vocab=16, markov_order=2)
    first = make_batch(cfg, "train", 0, 256).tokens[:, :2]  # drawn uniformly, before the chain reads them
    assert set(first.ravel().tolist()) == set(range(16))


def test_markov_draws_each_successor_with_its_documented_probability():
    # Each context's successors come at the probabilities markov_transitions gives: over ~4M
    # transitions the last successor's rate is within 4 sds of them. A draw that never reached the
    # top quantisation level made it (256 - c) / 65280 too rare (z -8 to -11), which only the
    # data-hash pin had caught.
    from dynamics.tasks import markov_transitions
    from dynamics.tasks.markov import _markov

    V, K = 64, 3
    tok = _markov(np.random.default_rng(123), 32768, 129, V, 1, K)  # (n, L)
    succ, prob = markov_transitions(V, 1, K, np.arange(V)[:, None])  # (V, K)
    distinct = np.array([len(set(r)) == K for r in succ.tolist()])
    ctx, nxt = tok[:, :-1].ravel(), tok[:, 1:].ravel()
    use = distinct[ctx]
    ctx, nxt = ctx[use], nxt[use]
    hit = nxt == succ[ctx, -1]
    p = prob[ctx, -1]
    z = (hit.sum() - p.sum()) / np.sqrt((p * (1 - p)).sum())
    assert abs(z) < 4, z
