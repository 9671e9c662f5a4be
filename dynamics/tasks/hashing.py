"""What a config trains on, as a hash: generator versions and :func:`data_hash`."""

from __future__ import annotations

import hashlib
import json

from dynamics.config import RunConfig
from dynamics.tasks.batch import _mixture_weights
from dynamics.tasks.corpus import _corpus_hash
from dynamics.tasks.induction import permutation_sampler
from dynamics.tasks.slash_text import _slash_pool

# Bump a task's version whenever the arrays it produces for a given config change; the
# version enters data_hash, so runs made with different generators are told apart. The corpus
# is the exception at version 1: its hash was the bare content hash before the version counted,
# and stores hold it (a resume compares it), so version 1 keeps it and later versions wrap it.
GENERATOR_VERSIONS = {
    "induction": 1,
    "offset_copy": 1,
    "markov": 1,
    "slash_text": 1,
    "corpus": 1,
}


def data_hash(cfg: RunConfig) -> str:
    """SHA-256 hex digest identifying the data a config trains on.

    For ``corpus`` it is the corpus content hash (sorted relative file names and bytes, as
    in :func:`corpus_info`) while its generator is at version 1, and a hash of that and the
    version after a bump; it does not cover ``task.holdout`` or ``model.context``, which the
    run's config (and id) hold. For synthetic tasks a hash of the generator version and the
    task parameters that affect the output; for ``mixture`` a hash of the components'
    hashes and the normalised weights.

    Example
    -------
    >>> from dynamics.config import from_dict
    >>> len(data_hash(from_dict({"task": {"name": "markov"}})))
    64
    """
    names = cfg.task.component_names
    if cfg.task.pool_size:  # a low-data pool is a different dataset for every seed
        from dataclasses import replace

        base = data_hash(replace(cfg, task=replace(cfg.task, pool_size=0)))
        return _sha({"base": base, "pool_size": cfg.task.pool_size, "seed": cfg.train.seed})
    if cfg.task.name != "mixture":
        return _component_hash(cfg, names[0])
    blob = {
        "task": "mixture",
        "components": list(names),
        "weights": [round(float(w), 12) for w in _mixture_weights(cfg)],
        "hashes": [_component_hash(cfg, n) for n in names],
    }
    return _sha(blob)


def other_data(run_id: str, path: str, recorded: str, here: str, task: str) -> str:
    """Why a run recorded on data ``recorded`` is not resumed where its config makes ``here``
    (for the StoreError of `train_run` and of the sweep launcher, which imports no torch)."""
    return (f"run {run_id} in {path} was recorded on data with hash {recorded}, but this machine makes {here} "
            f"for task {task!r} (another Python's standard library, for the corpus?); refusing to resume it on "
            f"other data")


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _component_hash(cfg: RunConfig, name: str) -> str:
    t, V = cfg.task, cfg.model.vocab_size
    if name == "corpus":
        version = GENERATOR_VERSIONS["corpus"]
        return _corpus_hash() if version == 1 else _sha({"task": name, "version": version, "content": _corpus_hash()})
    if name == "slash_text":  # the record pool (tree, dates, fractions) is the definition
        params = {"pool": hashlib.sha256(_slash_pool()[0].tobytes()).hexdigest()}
    else:
        params = {
            "induction": {"vocab_size": V, "min_period": t.min_period, "max_period": t.max_period},
            "offset_copy": {"vocab_size": V, "delta": t.delta, "p": t.p},
            "markov": {"vocab_size": V, "order": t.markov_order, "branching": t.markov_branching},
        }[name]
        if name == "induction" and V > 1024 and permutation_sampler(t.max_period, V):
            params["sampler"] = "permutation"  # these drew i.i.d. with redraws before; every other config's hash stays
    return _sha({"task": name, "version": GENERATOR_VERSIONS[name], "params": params})
