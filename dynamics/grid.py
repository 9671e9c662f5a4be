"""The sweep grid's order of a store's runs: how `dynamics status`, the analyse table, the
report's runs table and `open_sweep` list them, so that their rows line up run for run."""

from __future__ import annotations

import json
from collections.abc import Callable


def grid_order(index: dict) -> dict[str, tuple]:
    """Sort keys of the sweep index's runs: the grid's order, not the run ids' (hashes).

    By each axis of the index in turn, its values ranked in the order the index first lists
    them (the config's order; a later sweep's new values after): the first axis varies
    slowest, as in the config's grid. A run without a value for an axis sorts after the values.
    Runs at the same point (sweeps of one grid from other base configs, ``--set train.lr=...``)
    keep the index's own order, the order the sweeps recorded them, so each sweep's runs sit
    in the same place at every point; by run id (a hash) they swapped from point to point.
    """
    axes, swept = index.get("axes", []), index.get("runs", {})
    text = {rid: {a: json.dumps(v[a], sort_keys=True) for a in axes if a in v} for rid, v in swept.items()}
    rank: list[dict[str, int]] = [{} for _ in axes]
    for values in text.values():
        for seen, axis in zip(rank, axes, strict=True):
            if axis in values:
                seen.setdefault(values[axis], len(seen))
    return {rid: tuple(seen[values[axis]] if axis in values else len(seen)
                       for seen, axis in zip(rank, axes, strict=True)) + (position,)
            for position, (rid, values) in enumerate(text.items())}


def grid_key(index: dict) -> Callable[[str], tuple]:
    """Sort key on run ids: the grid's order (:func:`grid_order`), runs outside the index after it,
    by id. `status`, the analyse table and the report's runs table list runs by it, and `open_sweep`
    puts its ``run`` dim in it."""
    order = grid_order(index)
    return lambda run_id: (run_id not in order, order.get(run_id, ()), run_id)
