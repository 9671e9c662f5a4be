"""`dynamics.tasks` through its interface, every task: shapes, purity, fresh tokens, pinned outputs; the
shared cfg_for and ALL. Each module's own tests are in tests/test_tasks_<module>.py."""

import numpy as np
import pytest

from dynamics.config import from_dict
from dynamics.tasks import Batch, data_hash, make_batch


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


@pytest.mark.parametrize("name", ["induction", "offset_copy"])
def test_every_token_of_the_vocabulary_is_drawn(name):
    # Fresh tokens are uniform over range(V): 64 rows of 65 miss a given one of 64 tokens with
    # probability under (63/64)^1000 (distinct segments and copies leave ~1000 fresh draws).
    tokens = make_batch(cfg_for(name, vocab=64), "train", 0, 64).tokens
    assert set(np.unique(tokens).tolist()) == set(range(64))


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
