"""Tests of dynamics.tasks.hashing: data_hash of the synthetic tasks, the corpus and mixtures."""

import re

import pytest

from dynamics.config import from_dict
from dynamics.tasks import corpus_info, data_hash
from tests.test_tasks import ALL, cfg_for


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


def test_mixture_hash_combines_components():
    cfg = cfg_for("mixture", **ALL["mixture"])
    h = data_hash(cfg)
    assert h != data_hash(cfg_for("mixture", components=["induction", "markov", "slash_text"]))
    assert h != data_hash(cfg_for("mixture", components=["induction", "markov", "slash_text"],
                                  weights=[0.5, 0.3, 0.2], max_period=8))
    assert h == data_hash(cfg_for("mixture", components=["induction", "markov", "slash_text"], weights=[5, 3, 2]))
