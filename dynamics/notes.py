"""The notes `dynamics run` (one config), `dynamics sweep` and `dynamics demo` (their points) say
as they start, on configs they train as asked but whose runs a researcher would otherwise find
wanting only later.

Notes, not refusals (those are :mod:`dynamics.config_rules`'s): the run is of use as it is, or
the config may be meant so. Pure functions of the configs, quick for a sweep of many points and
runs of many steps: schedules are counted (:func:`dynamics.budget.n_snapshots`), not built.
"""

from __future__ import annotations

from collections.abc import Sequence

from dynamics.budget import n_snapshots
from dynamics.config import RunConfig
from dynamics.config_rules import small_vocabulary_note
from dynamics.schema import BASELINE_SNAPSHOTS


def few_snapshots_note(cfgs: Sequence[RunConfig]) -> str | None:
    """The note for configs whose snapshot schedule records fewer snapshots than `dynamics analyse`
    needs under its default options (the divergence curve's early band and one more:
    ``BASELINE_SNAPSHOTS + 1``); None where every one records enough.

    Said as training starts because otherwise the first word of it came from `analyse`, after the
    compute was spent ("not analysed (only 2 snapshot(s) recorded ...)"). A run of N steps has at
    most N + 1 snapshots, so below ``BASELINE_SNAPSHOTS`` steps only more steps help.

    Examples
    --------
    >>> from dynamics.config import from_dict
    >>> few_snapshots_note([from_dict({"train": {"steps": 300}, "record": {"dense_until": 0, "every": 500}})])[:70]
    'the snapshot schedule records 2 snapshot(s) (train.steps 300, record.d'
    """
    need = BASELINE_SNAPSHOTS + 1
    counts = [n_snapshots(c.train.steps, c.record.dense_until, c.record.every) for c in cfgs]
    few = [(c, n) for c, n in zip(cfgs, counts, strict=True) if n < need]
    if not few:
        return None
    first, n = few[0]
    which = (f"the snapshot schedule records {n} snapshot(s)" if len(cfgs) == 1 else
             f"{len(few)} of the {len(cfgs)} sweep points record{'s' if len(few) == 1 else ''} fewer than {need} "
             f"snapshots (the first: {n})")
    cadence = "lower record.every or raise record.dense_until"
    r = first.record
    fix = cadence if first.train.steps + 1 >= need else (
        f"raise train.steps to at least {need - 1} (a run of N steps has at most N + 1 snapshots)"
        # at that many steps this cadence may still record too few (dense_until 0, every 500: 2): say both
        + ("" if n_snapshots(need - 1, r.dense_until, r.every) >= need else f", and {cadence}"))
    return (f"{which} (train.steps {first.train.steps}, record.dense_until {first.record.dense_until}, record.every "
            f"{first.record.every}); `dynamics analyse` needs at least {need}, so such a run trains but cannot be "
            f"analysed: {fix}")


def start_notes(cfgs: Sequence[RunConfig]) -> list[str]:
    """Every note for `cfgs`: :func:`dynamics.config_rules.small_vocabulary_note` and
    :func:`few_snapshots_note`, those that apply."""
    return [note for note in (small_vocabulary_note(cfgs), few_snapshots_note(cfgs)) if note]


def grid_notes(cfg: RunConfig) -> list[str]:
    """:func:`start_notes` of every point of ``cfg``'s sweep grid, as `dynamics sweep` and
    `dynamics demo` say them (a grid that is refused is refused here)."""
    from dynamics.sweep.grid import expand_grid  # here: dynamics.sweep imports the store, which `run` needs not yet

    return start_notes([p.cfg for p in expand_grid(cfg)])
