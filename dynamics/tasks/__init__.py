"""Next-token tasks, each chosen to elicit a known attention-head role.

A batch is a pure function of ``(config, seed, step, split)``: every call builds its own
``numpy.random.Generator`` from ``SeedSequence([seed, step, split_id, task_key])``, so a
resumed run needs no data-loader state and any batch can be regenerated for analysis.
Batches are numpy (``int64`` tokens); the trainer converts them. This package never
imports torch.

Tasks (``cfg.task.name``) and the roles they target (see data/README.md):

- ``induction``: a random segment of period P ~ U[min_period, max_period] repeated; varying
  P defeats a fixed-offset (RoPE slash) shortcut, so induction heads are needed
  (Olsson et al. 2022; Bietti et al. 2023).
- ``offset_copy``: token t copies token t - delta with probability p; slash-dominant heads
  at offset delta - 1, since the query at t predicts token t + 1 (Cheng et al. 2026, arXiv
  2601.08297).
- ``markov``: a sparse random n-gram chain, fixed by the task config; self and local heads
  over offsets 0 .. order - 1, and the "global bigram" stage of Bietti et al. 2023.
- ``slash_text``: bytes of paths, URLs, dates and fractions in which "/" separates fields
  that depend on the field before; '/'-token-dominant heads (the slash-dominance post).
- ``corpus``: byte windows of the running interpreter's standard-library ``.py`` files,
  with a held-out split of files for "eval" and "probe".
- ``mixture``: each row drawn from one component by ``cfg.task.weights``.

Modules
-------
- :mod:`~dynamics.tasks.batch`: ``SPLITS``, :class:`Batch`, :func:`make_batch`, :func:`check`, the low-data pool and
  the dispatch to the generators.
- :mod:`~dynamics.tasks.hashing`: ``GENERATOR_VERSIONS`` and :func:`data_hash`.
- :mod:`~dynamics.tasks.induction`, :mod:`~dynamics.tasks.offset_copy`, :mod:`~dynamics.tasks.markov`
  (with :func:`markov_transitions`), :mod:`~dynamics.tasks.slash_text`: one generator each.
- :mod:`~dynamics.tasks.corpus`: the standard-library corpus, its held-out files and :func:`corpus_info`.
"""

# `name as name`: module-level names kept reachable as tasks.<name>, outside __all__
# (the private ones are those the tests call).
from dynamics.tasks.batch import SPLITS, TASK_KEYS, Batch, check, check_read, make_batch, unread_keys
from dynamics.tasks.corpus import _corpus_files as _corpus_files
from dynamics.tasks.corpus import _held_out as _held_out
from dynamics.tasks.corpus import corpus_info
from dynamics.tasks.hashing import GENERATOR_VERSIONS, data_hash
from dynamics.tasks.markov import _markov as _markov
from dynamics.tasks.markov import markov_transitions
from dynamics.tasks.slash_text import SLASH_KINDS as SLASH_KINDS
from dynamics.tasks.slash_text import _slash_records as _slash_records
from dynamics.tasks.slash_text import _slash_tree as _slash_tree

__all__ = ["Batch", "SPLITS", "TASK_KEYS", "GENERATOR_VERSIONS", "check", "check_read", "make_batch", "unread_keys", "data_hash", "corpus_info", "markov_transitions"]
