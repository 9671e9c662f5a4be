"""Task generators: purity, shapes, and the structure each task promises."""

import datetime
import math
import re

import numpy as np
import pytest

from dynamics import tasks
from dynamics.config import from_dict
from dynamics.tasks import SPLITS, Batch, corpus_info, data_hash, make_batch


def cfg_for(name, vocab=None, context=64, seed=0, **task):
    if vocab is None:
        vocab = 256 if name in ("slash_text", "corpus", "mixture") else 64
    return from_dict({
        "task": {"name": name, **task},
        "model": {"vocab_size": vocab, "context": context},
        "train": {"seed": seed},
    })


ALL = {
    "induction": {},
    "offset_copy": {},
    "markov": {},
    "slash_text": {},
    "corpus": {},
    "mixture": {"components": ["induction", "markov", "slash_text"], "weights": [0.5, 0.3, 0.2]},
}


# ----------------------------------------------------------------------------- generic


@pytest.mark.parametrize("name", list(ALL))
def test_shapes_dtypes_ranges(name):
    cfg = cfg_for(name, context=48, **ALL[name])
    b = make_batch(cfg, "train", 3, 8)
    assert isinstance(b, Batch)
    assert b.tokens.shape == (8, 49) and b.tokens.dtype == np.int64
    assert b.component.shape == (8,) and b.component.dtype == np.int64
    assert b.repeat_mask.shape == (8, 48) and b.repeat_mask.dtype == bool
    assert b.tokens.min() >= 0 and b.tokens.max() < cfg.model.vocab_size
    assert b.component.min() >= 0 and b.component.max() < len(cfg.task.component_names)


@pytest.mark.parametrize("name", list(ALL))
def test_pure_function_of_config_seed_step_split(name):
    cfg = cfg_for(name, **ALL[name])
    a, b = make_batch(cfg, "train", 7, 6), make_batch(cfg, "train", 7, 6)
    for x, y in zip((a.tokens, a.component, a.repeat_mask), (b.tokens, b.component, b.repeat_mask), strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.tokens, make_batch(cfg, "train", 8, 6).tokens)
    assert not np.array_equal(a.tokens, make_batch(cfg, "eval", 7, 6).tokens)
    assert not np.array_equal(make_batch(cfg, "eval", 7, 6).tokens, make_batch(cfg, "probe", 7, 6).tokens)
    other_seed = cfg_for(name, seed=1, **ALL[name])
    assert not np.array_equal(a.tokens, make_batch(other_seed, "train", 7, 6).tokens)


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
def test_data_hash_synthetic(name):
    h = data_hash(cfg_for(name))
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert h == data_hash(cfg_for(name, seed=5))  # the seed picks samples, not the task
    changed = {"induction": {"max_period": 8}, "offset_copy": {"p": 0.5}, "markov": {"markov_branching": 2},
               "slash_text": None}[name]
    if changed is not None:
        assert h != data_hash(cfg_for(name, **changed))
    assert h != data_hash(cfg_for("induction" if name != "induction" else "markov"))


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


# ----------------------------------------------------------------------------- induction


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


# ----------------------------------------------------------------------------- offset_copy


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


@pytest.mark.parametrize("name", ["induction", "offset_copy"])
def test_every_token_of_the_vocabulary_is_drawn(name):
    # Fresh tokens are uniform over range(V): 64 rows of 65 miss a given one of 64 tokens with
    # probability under (63/64)^1000 (distinct segments and copies leave ~1000 fresh draws).
    tokens = make_batch(cfg_for(name, vocab=64), "train", 0, 64).tokens
    assert set(np.unique(tokens).tolist()) == set(range(64))


# ----------------------------------------------------------------------------- markov


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


# ----------------------------------------------------------------------------- slash_text


def check_slash_record(rec, tree, hosts):
    if m := re.fullmatch(r"(\d{4})/(\d{2})/(\d{2})", rec):
        datetime.date(*map(int, m.groups()))  # raises if the day is invalid for the month
        return "date"
    if m := re.fullmatch(r"(\d+)/(\d+)", rec):
        a, b = map(int, m.groups())
        assert 1 <= a < b
        return "fraction"
    if rec.startswith("https://"):
        host, *parts = rec[len("https://") :].split("/")
        assert host in hosts and parts
        parent = f"https://{host}"
        kind = "url"
    else:
        assert rec.startswith("/")
        parent, parts, kind = "", rec[1:].split("/"), "path"
    for part in parts:  # each field is a child of the field before
        assert part in tree[parent], (rec, parent, part)
        parent = f"{parent}/{part}"
    return kind


def test_slash_text_fields_depend_on_previous_field():
    cfg = cfg_for("slash_text", context=96)
    b = make_batch(cfg, "train", 0, 32)
    assert b.tokens.max() < 256
    tree, hosts = tasks._slash_tree()
    kinds = set()
    for row in b.tokens:
        text = bytes(row.astype(np.uint8)).decode("ascii")
        assert "/" in text
        records = re.split(r"[ \n]", text)[:-1]  # the last record may be cut
        for rec in records:
            kinds.add(check_slash_record(rec, tree, hosts))
    assert kinds == {"date", "fraction", "path", "url"}


def test_slash_text_month_determines_days():
    # All 29 Februaries that exist are leap years; no day beyond its month's length exists.
    pool = tasks._slash_records()["date"]
    assert "2000/02/29" in pool and "2001/02/29" not in pool and "1999/04/31" not in pool
    assert len(pool) == (datetime.date(2030, 1, 1) - datetime.date(1990, 1, 1)).days


def test_slash_text_separators_and_record_kinds_follow_their_weights():
    # " " with probability 0.7, else "\n"; kinds path, url, date, fraction with 0.3, 0.2, 0.25,
    # 0.25 per record. Only each row's first 5 records are counted: at most 45 bytes each with
    # their separator, they always fit in the row's 256, while a row's cut last record is more
    # often a long one (a path or url). 10,240 records: standard deviations under 0.005.
    tree, hosts = tasks._slash_tree()
    records, seps = [], []
    for row in make_batch(cfg_for("slash_text", context=255), "train", 0, 2048).tokens:
        text = bytes(row.astype(np.uint8)).decode("ascii")
        records += re.split(r"[ \n]", text)[:5]
        seps += [c for c in text if c in " \n"][:5]
    assert abs(seps.count(" ") / len(seps) - 0.7) < 0.02
    kinds = [check_slash_record(r, tree, hosts) for r in records]
    for kind, weight in zip(("path", "url", "date", "fraction"), (0.3, 0.2, 0.25, 0.25), strict=True):
        assert abs(kinds.count(kind) / len(kinds) - weight) < 0.02, kind


def test_slash_text_fractions_are_the_proper_ones_up_to_64():
    # a/b for 1 <= a < b <= 64: sum over b of (b - 1) = 63 * 64 / 2 = 2016 of them.
    pool = tasks._slash_records()["fraction"]
    assert len(pool) == 2016 and len(set(pool)) == 2016
    assert all(int(a) < int(b) <= 64 for a, b in (f.split("/") for f in pool))


# ----------------------------------------------------------------------------- corpus


def test_corpus_split_and_hash():
    info = corpus_info(0.1)
    assert set(info) == {"hash", "n_files", "n_train_files", "n_eval_files", "n_bytes", "root"}
    assert info["n_train_files"] + info["n_eval_files"] == info["n_files"] > 100
    assert 0.03 < info["n_eval_files"] / info["n_files"] < 0.2
    assert corpus_info(0.1)["hash"] == info["hash"] == data_hash(cfg_for("corpus"))
    names = list(tasks._corpus_files().names)
    assert names == sorted(names) and not any("site-packages" in n for n in names)
    assert all(n.endswith(".py") for n in names)
    held = tasks._held_out(tuple(names), 0.1)
    train = {n for n, h in zip(names, held, strict=True) if not h}
    held_names = {n for n, h in zip(names, held, strict=True) if h}
    assert train and held_names and not train & held_names
    # A larger holdout only adds files to the held-out set (hash threshold on the path).
    assert held_names <= {n for n, h in zip(names, tasks._held_out(tuple(names), 0.3), strict=True) if h}


def test_corpus_data_hash_counts_the_generator_version(monkeypatch):
    # The corpus hash left GENERATOR_VERSIONS out: a changed window sampler would have claimed
    # the data of every run made before it. Version 1 keeps the content hash stores hold.
    from dynamics.tasks import hashing

    cfg = cfg_for("corpus")
    mixed = from_dict({"task": {"name": "mixture", "components": ["markov", "corpus"]}, "model": {"vocab_size": 256}})
    v1, mixed_v1 = data_hash(cfg), data_hash(mixed)
    assert v1 == corpus_info(0.1)["hash"]
    monkeypatch.setitem(hashing.GENERATOR_VERSIONS, "corpus", 2)
    v2 = data_hash(cfg)
    assert re.fullmatch(r"[0-9a-f]{64}", v2) and v2 != v1 and data_hash(mixed) != mixed_v1


def test_a_corpus_split_without_windows_is_a_config_error_before_any_batch():
    # Which files a holdout keeps depends on this machine's standard library, so config
    # validation passes these; tasks.check must refuse them, naming the key.
    import hashlib

    from dynamics.config import ConfigError

    names = tasks._corpus_files().names
    u = sorted(int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], "big") / 2.0**64 for n in names)
    tasks.check(cfg_for("corpus"))
    with pytest.raises(ConfigError, match=r"^task\.holdout: .* no held-out \(eval and probe\) file"):
        tasks.check(cfg_for("corpus", holdout=u[0] / 2))
    with pytest.raises(ConfigError, match=r"^task\.holdout: .* no training file"):
        tasks.check(cfg_for("corpus", holdout=(u[-1] + 1) / 2))
    longest = int(tasks._corpus_files().lengths.max())
    with pytest.raises(ConfigError, match=r"^model\.context: .* too long for the corpus"):
        tasks.check(from_dict({"task": {"name": "mixture", "components": ["markov", "corpus"]},
                               "model": {"vocab_size": 256, "context": longest, "pos": "none"}}))


def test_a_standard_library_without_py_files_is_one_line_exit_2_before_any_store(tmp_path, monkeypatch):
    # A stripped install (or a root at an empty folder) raised RuntimeError from tasks.check:
    # a traceback from `dynamics run`. A fresh cache over the empty root; monkeypatch puts the
    # module's own cached corpus back afterwards, so other tests do not read it again.
    import functools

    from dynamics.cli import main
    from dynamics.config import ConfigError
    from dynamics.tasks import corpus

    empty = tmp_path / "lib"
    empty.mkdir()
    (empty / "README.txt").write_text("no python here\n")
    monkeypatch.setattr(corpus, "_stdlib_root", lambda: str(empty))
    monkeypatch.setattr(corpus, "_corpus_files", functools.lru_cache(maxsize=1)(corpus._corpus_files.__wrapped__))
    message = f"task.name: the corpus task reads this Python's standard library, but no .py file was found under {empty}"
    with pytest.raises(ConfigError) as e:
        tasks.check(cfg_for("corpus"))
    assert str(e.value) == message
    config = tmp_path / "c.toml"
    config.write_text('[model]\nvocab_size = 256\ncontext = 16\n[task]\nname = "corpus"\n[train]\nsteps = 2\n')
    assert main(["run", str(config), "--out", str(tmp_path / "out.zarr")]) == 2
    assert not (tmp_path / "out.zarr").exists()


def test_corpus_windows_are_substrings_of_the_right_split():
    cfg = cfg_for("corpus", context=64)
    corpus = tasks._corpus_files()
    held = tasks._held_out(corpus.names, cfg.task.holdout)
    by_split = {
        "train": [corpus.file(i) for i in np.flatnonzero(~held)],
        "eval": [corpus.file(i) for i in np.flatnonzero(held)],
    }
    for split, contents in by_split.items():
        b = make_batch(cfg, split, 0, 4)
        np.testing.assert_array_equal(b.tokens, make_batch(cfg, split, 0, 4).tokens)
        for row in b.tokens:
            window = bytes(row.astype(np.uint8))
            assert any(window in c for c in contents), split
    probe = make_batch(cfg, "probe", 0, 2)
    for row in probe.tokens:
        assert any(bytes(row.astype(np.uint8)) in c for c in by_split["eval"])


# ----------------------------------------------------------------------------- mixture


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


def test_mixture_hash_combines_components():
    cfg = cfg_for("mixture", **ALL["mixture"])
    h = data_hash(cfg)
    assert h != data_hash(cfg_for("mixture", components=["induction", "markov", "slash_text"]))
    assert h != data_hash(cfg_for("mixture", components=["induction", "markov", "slash_text"],
                                  weights=[0.5, 0.3, 0.2], max_period=8))
    assert h == data_hash(cfg_for("mixture", components=["induction", "markov", "slash_text"], weights=[5, 3, 2]))


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


# ----------------------------------------------------------------------------- generator outputs pinned

GOLDEN = {  # sha256 of train/eval/probe batches at step 3 (tokens, repeat_mask, component), and data_hash
    "induction": ("5b49a77e1be98540", "c2a985d383f5b9e0"),
    "offset_copy": ("3748f746d6cacd33", "a55bbc7d7dc7e59d"),
    "markov": ("93af84b4fae9802b", "ec181987573b1ac5"),
    "slash_text": ("e85dbb0562dd027b", "3dd688af5d977ee4"),
    "mixture": ("c54baeb2606f3075", "8be19bd96c707991"),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_a_generator_whose_output_changes_changes_its_data_hash(name):
    # data_hash stands for the data in run ids and resumes: a generator edited without a
    # GENERATOR_VERSIONS bump trains other data under the same hash, and resumes old runs on it.
    # Whoever changes a generator's output on purpose bumps its version and re-pins both here.
    # (The corpus is this Python's standard library: its bytes are the machine's, not pinned.)
    import hashlib

    cfg = cfg_for(name, context=48, **ALL[name])
    h = hashlib.sha256()
    for split in ("train", "eval", "probe"):
        b = make_batch(cfg, split, 3, 8)
        h.update(b.tokens.tobytes() + b.repeat_mask.tobytes() + b.component.tobytes())
    assert (h.hexdigest()[:16], data_hash(cfg)[:16]) == GOLDEN[name]


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


def test_a_standard_library_directory_that_cannot_be_listed_is_refused_not_skipped(tmp_path, monkeypatch):
    # os.walk skips a directory it cannot list unless told otherwise: the corpus was then made of
    # the rest, in silence, under a content hash of its own. A root that is not there is the one
    # listing failure a root process meets here; the same handler names an unreadable folder.
    import functools

    from dynamics.config import ConfigError
    from dynamics.tasks import corpus

    gone = tmp_path / "lib"
    monkeypatch.setattr(corpus, "_stdlib_root", lambda: str(gone))
    monkeypatch.setattr(corpus, "_corpus_files", functools.lru_cache(maxsize=1)(corpus._corpus_files.__wrapped__))
    with pytest.raises(ConfigError) as e:
        tasks.check(cfg_for("corpus"))
    assert str(e.value) == (f"task.name: the corpus task cannot list the standard-library directory {gone}: "
                            f"No such file or directory")


def test_corpus_window_starts_are_uniform_over_every_valid_start(tmp_path, monkeypatch):
    # A tiny standard library whose every byte says where it is: a window's first byte is its
    # start. 50 + 30 valid starts of 11-byte windows, each drawn 1/80 of the time, the first and
    # the last of each file included (a start pinned to 0, or an off-by-one at the end, failed).
    import functools

    from dynamics.tasks import corpus

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "a.py").write_bytes(bytes(range(0, 60)))
    (lib / "b.py").write_bytes(bytes(range(100, 140)))
    monkeypatch.setattr(corpus, "_stdlib_root", lambda: str(lib))
    monkeypatch.setattr(corpus, "_corpus_files", functools.lru_cache(maxsize=1)(corpus._corpus_files.__wrapped__))
    windows = corpus._corpus(np.random.default_rng(0), 40_000, 11, 0.0, "train")  # (n, 11)
    first = windows[:, 0]
    assert (windows - first[:, None] == np.arange(11)[None, :]).all()  # inside one file
    starts = sorted(set(range(0, 50)) | set(range(100, 130)))
    counts = np.array([(first == s).sum() for s in starts])
    assert counts.sum() == 40_000  # no start outside those
    assert np.abs(counts / 40_000 - 1 / 80).max() < 0.003  # 5 standard deviations of a share of 1/80
