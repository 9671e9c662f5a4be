"""The bounds on what a run may ask for, each past any sensible value and short of what fails
later with a traceback, after the store was made; :func:`dynamics.config.validate` and the
gate options enforce them."""

import os

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a setting that scales the model's float32 numbers must fit in one."""
MAX_STEPS = 10**8
"""Upper bound on train.steps: the loss curve and the snapshot schedule are allocated whole at
the start (10^8 steps: a 400 MB loss array, weeks of training even for the smallest model), so
a mistyped count fails here rather than exhausting memory."""


DEEPEST_IN_STORE = 210
"""Bytes a store's own paths add, at most, to its root's path. The deepest measured is 202,
zarr's temporary for a chunk of a run with a 128-byte run id (the longest a new run may have),
``runs/<id>/head_weights/c/6/0/0/0/0/0.<32 hex>.partial`` (tests/test_schema_limits.py measures
every command's); 8 more leave room for a snapshot chunk index of 9 digits, as `MAX_STEPS`
allows. A store whose root is so deep that these pass PATH_MAX is refused before any work by the
commands that write into it: one 4,041 bytes deep was made, then its run failed as it wrote."""

DEEPEST_IN_REPORT = 64
"""The same for a report folder: the deepest measured is 54 bytes,
``figures/<date>-<time>-<n>/attention/snapshot_0006.png``, with room for a 9-digit snapshot."""


MAX_WEIGHTS = 10**10
"""Upper bound on ModelConfig.weight_entries: 40 GB of float32 weights, 160 GB with their
gradients and AdamW's two moments, past any machine these runs are made on. A mistyped size
(model.d_model = 640000) passed validation and failed allocating the model after the store
and a 'failed' run were made."""


MAX_THREADS = 1024
"""Upper bound on train.threads, past the core count of any one machine these runs are made on:
torch hands the count to OpenMP as given, which tries to start that many threads at the first
parallel op, so a mistyped count (10**6) failed the run there, after the store was made. Counts
above this machine's cores but within the bound are allowed (a config may be written for a
larger machine); `dynamics run` notes them."""


MAX_POINTS = 10**4
"""Upper bound on a sweep grid's points: each is checked before any work (a millisecond or two
each) and listed in the store's sweep index, which every command reads. A grid of 10^5 points
was checked for three minutes in silence, in 420 MB, before its one-line refusal; 10^6 would
have taken half an hour."""


MAX_CONFIG_BYTES = 16 * 2**20
"""Upper bound on a config file's length, past any written one (a grid of MAX_POINTS values is
a few hundred kB): a config is read whole, and ``dynamics run /dev/zero`` read on without end,
filling memory, where a data file given by mistake was read whole before TOML refused it."""


MAX_DEPTH = 32
"""Upper bound on how deeply a config's tables and lists nest, past any config's (a sweep axis
of intervention tables is five deep): the config is walked recursively, and a value nested
hundreds deep ended a command in a RecursionError traceback."""


MAX_INT = 2**63
"""Integer settings lie in (-MAX_INT, MAX_INT): TOML integers have no bound, and one past int64
failed inside numpy or a float division with a traceback, some after the store was made."""


def usable_cores() -> int:
    """Cores this process may run on: one worker each, by default, for a sweep and for
    `dynamics analyse`. Under a CPU affinity mask (taskset, a cgroup cpuset, a batch scheduler's
    allocation) os.cpu_count() counts the whole machine, and that many processes would each hold
    a run on fewer cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks on this platform
        return max(1, os.cpu_count() or 1)
