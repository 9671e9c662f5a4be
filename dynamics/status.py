"""What ``dynamics status`` shows: one row per run of a store, in the sweep grid's order, and
which runs cannot be read at all (damaged)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from dynamics import store
from dynamics.grid import grid_key
from dynamics.identity import setting_cell
from dynamics.schema import FINISHED_STATUSES, config_value


def damaged_runs(path: str, ids: list[str], chunks: bool = False, decode: bool = False) -> dict[str, str]:
    """The runs of `ids` whose group cannot be read, each with the store's one-line reason.

    ``chunks``: also a finished run missing a chunk it wrote (:func:`dynamics.store.check_recorded`).
    ``decode``: also a run with a chunk that cannot be decoded (:func:`dynamics.store.unreadable_chunk`,
    which reads every chunk: for runs already found damaged, to say why).
    """
    damaged = {}
    for run_id in ids:
        try:
            attrs = store.run_attrs(path, run_id)
            if chunks:
                store.check_recorded(path, run_id, attrs=attrs)
            if decode and (error := store.unreadable_chunk(path, run_id)) is not None:
                raise error
        except store.StoreError as e:
            damaged[run_id] = str(e)
    return damaged


def setting_columns(settings: dict[str, dict], points: dict[str, list[str]]) -> list[str]:
    """Settings that tell apart runs shown with the same swept values, sorted.

    ``settings``: run id -> its :func:`dynamics.identity.read_settings` (recorded runs; a pending
    one has no config); ``points``: run id -> the values its row shows for the sweep's axes. Two
    sweeps of one grid from other base configs (``--set train.lr=...``), or a seed sweep of
    conditioned gates beside its free runs, give runs whose swept values are the same: the report's
    runs table (``report.data._table_settings``) shows these settings too, taken from here, or such
    runs read as identical rows. A setting a run lacks (an ``[intervene]`` section it has none of) differs too.
    """
    from dynamics.identity import differing_settings

    peers: dict[str, list[dict]] = {}
    for run_id, flat in settings.items():
        peers.setdefault(json.dumps(points.get(run_id, []), sort_keys=True), []).append(flat)
    return sorted({k for group in peers.values() for k in differing_settings(group)})


def row_labels(index: dict, attrs: dict[str, dict], run_ids) -> tuple[list[str], Callable[[str], list[str]]]:
    """The columns that say which run a row is, and a function giving them for a run id.

    ``index``: the store's sweep index; ``attrs``: run id -> run attrs of the recorded runs that
    could be read; ``run_ids``: every run the table lists (pending ones too). The columns are the
    sweep's axes (for a run outside the index, its config's values, as in the report's runs
    table), then the settings that tell apart runs with the same swept values, the seed
    included unless it is an axis (:func:`setting_columns`; ``none`` where a run lacks one, blank for a run whose config is
    unknown: pending or damaged). ``dynamics status`` and the ``analyse`` table share them.
    """
    from dynamics.identity import read_settings

    axes, swept = index.get("axes", []), index.get("runs", {})

    def point(run_id: str) -> list[str]:
        if run_id in swept or not isinstance(attrs.get(run_id, {}).get("config"), dict):
            return [setting_cell(swept.get(run_id, {}).get(k, "")) for k in axes]
        # outside the index (`dynamics run` into a sweep's store): its own config's values, as the
        # report's runs table shows them; left blank, it was never grouped with its point's runs
        values = (config_value(attrs[run_id]["config"], k) for k in axes)
        return [setting_cell("none" if v is None else v) for v in values]

    points = {r: point(r) for r in run_ids}
    # The seed too, unless it is an axis: runs that differ only in it (`dynamics run --set
    # train.seed=...`, outside any sweep) were rows told apart by their hash alone.
    seed = {} if "train.seed" in axes else {"train.seed": None}
    settings = {r: read_settings(a["config"]) | {k: config_value(a["config"], k) for k in seed}
                for r, a in attrs.items() if isinstance(a.get("config"), dict)}
    extra = setting_columns(settings, points)

    def shown(run_id: str) -> list[str]:
        if run_id not in settings:
            return [*points[run_id], *("" for _ in extra)]
        return [*points[run_id], *(setting_cell(settings[run_id].get(k, "none")) for k in extra)]

    return [*axes, *extra], shown


def status_table(path: str) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """Header, rows and damaged runs (id -> reason) of ``dynamics status STORE`` (:func:`status_of`)."""
    header, rows, damaged, _ = status_of(path)
    return header, rows, damaged


def status_of(path: str) -> tuple[list[str], list[list[str]], dict[str, str], dict[str, str]]:
    """Header, rows, damaged runs (id -> reason) and bad sweep-index entries (entry -> the line
    naming it, :func:`bad_index_entries`: no row) of ``dynamics status STORE``.

    Columns: run id, the sweep index's axes, the settings that tell apart runs with the same
    swept values (:func:`setting_columns`; ``none`` where a run lacks it, blank for a run whose
    config is unknown: pending or damaged), status (:func:`dynamics.store.run_status`, or
    ``damaged``, or ``pending`` for a sweep point not started), steps recorded of total (with
    ``(+N unrecorded)`` for steps a stopped session trained past its last checkpoint; ``?`` for
    a refused run, whose store records fewer than its checkpoint's),
    ``resumes_at`` (the last checkpoint's step for an unfinished run, ``lost`` where that
    checkpoint is gone, ``refused`` where recordings before it are missing, which `run` names,
    ``-`` for a finished one, never retrained, and for a pending one, which
    has no checkpoint) and the last loss recorded (``-`` where none is read: training, lost,
    refused). Rows in the grid's order; runs outside any sweep after it, by id.
    """
    index = store.read_sweep_index(path) or {}
    recorded = store.list_runs(path, damaged="include")
    bad = bad_index_entries(path, index, set(recorded))
    index = without(index, bad)
    swept = index["runs"]
    damaged, attrs = {}, {}
    for run_id in recorded:
        try:
            attrs[run_id] = store.run_attrs(path, run_id)
        except store.StoreError as e:  # its group cannot be read: named, and the others shown
            damaged[run_id] = str(e)
    # a checkpoint whose run group is gone: named (run and sweep refuse to write over it), not hidden
    orphans = store.checkpoints_without_runs(path, set(recorded))
    labels, shown = row_labels(index, attrs, [*recorded, *swept, *orphans])
    header = ["run", *labels, "status", "steps", "resumes_at", "last_loss"]
    rows = []
    for run_id in recorded:
        if run_id in damaged:
            rows.append([run_id, *shown(run_id), "damaged", "-", "-", "-"])
            continue
        a = attrs[run_id]
        status, a = store.run_now(path, run_id, a)  # "stopped": killed, resumable with the same command
        loss = a.get("last_loss")
        # while a run trains, its checkpoint is the progress; steps_done is where it (re)started
        done = max(int(a.get("steps_done", 0)), int(a.get("checkpoint_step", 0)))
        # an unfinished run resumes from its last checkpoint; a finished one is never retrained
        finished = a.get("status") in FINISHED_STATUSES
        resumes, kept_loss = ("-", None) if finished else resumes_at(path, run_id, a, status)
        steps = f"{done}/{a.get('steps_total', '?')}"
        if not finished:
            # The last checkpoint's step (its file's, newer than the attrs while a run trains; the
            # attrs' where it is lost). A session that stopped (Ctrl-C, a kill, a failed write after
            # which a full disk dropped every write) trained past it steps whose losses and snapshots
            # the store lacks, and a resume trains them again: status said 36/60 of a run recorded to 22.
            at = int(resumes) if resumes.isdigit() else int(a.get("checkpoint_step", 0))
            done = max(done, at)
            steps = f"{at}/{a.get('steps_total', '?')}" + (f" (+{done - at} unrecorded)" if done > at else "")
            if resumes == "refused":  # the store lacks recordings before the checkpoint: how many it holds, unread
                steps = f"?/{a.get('steps_total', '?')}"
            # the last loss its store records: not the attrs' (its session's last, past the checkpoint,
            # or an earlier session's after a kill); "-" where none is read (training, lost, refused)
            loss = kept_loss
        # a diverged session ended with a loss JSON cannot hold (NaN, inf): not "-", which says unwritten
        last = f"{loss:.4f}" if loss is not None else "not finite" if a.get("status") == "diverged" else "-"
        rows.append([run_id, *shown(run_id), status, steps, resumes, last])
    for run_id in orphans:
        if store.run_listed(path, run_id):  # made since the listing: its group comes before its checkpoint
            continue
        try:
            store.check_checkpoint_kept(path, run_id, {})
        except store.StoreError as e:
            damaged[run_id] = str(e)
            rows.append([run_id, *shown(run_id), "damaged", "-", "-", "-"])
    for run_id in (r for r in swept if r not in recorded and r not in damaged):  # not started yet: no checkpoint
        total = index.get("steps", {}).get(run_id, "?")  # "?": an index written before it held steps
        rows.append([run_id, *shown(run_id), "pending", f"0/{total}", "-", "-"])
    key = grid_key(index)
    rows.sort(key=lambda row: key(row[0]))
    return header, rows, damaged, bad


def bad_index_entries(path: str, index: dict, recorded: set[str]) -> dict[str, str]:
    """Entries of the sweep index's runs that no run can have: entry -> one line naming it and the store.

    The launcher writes run ids (hashes); an entry that is no valid run id (``../evil``, a name
    with a space) came from a hand edit. `status` listed it as a pending point that no sweep
    trains: `dynamics sweep` keeps it in the index as a point of an earlier sweep and never
    starts it. A recorded run is never one (its group's name is a run id).
    """
    bad = {}
    for entry in index.get("runs", {}):
        if entry in recorded:
            continue
        try:
            store.check_run_id(entry)  # new: a pending point's group would be made under this name
        except store.StoreError as e:
            why = str(e).split(": ", 1)[-1]  # past "invalid run id '...'", which would name it twice
            bad[entry] = (f"{path}: the sweep index lists {entry!r}, which is no run id ({why}): not a sweep point, "
                          f"and no sweep trains it; delete it from the \"sweep\" attribute's runs in the store's "
                          f"root zarr.json")
    return bad


def without(index: dict, bad) -> dict:
    """The sweep index less the entries `bad` names (:func:`bad_index_entries`): no sweep point,
    so no pending row in status, analyse, the report, nor a count of runs not started."""
    return {**index, "runs": {r: values for r, values in index.get("runs", {}).items() if r not in bad}}


def sweep_points(path: str, recorded) -> dict:
    """The store's sweep index (``{}`` where it has none) less the entries no run can have."""
    index = store.read_sweep_index(path) or {}
    return without(index, bad_index_entries(path, index, set(recorded)))


def show_status(path: str) -> int:
    """``dynamics status STORE``: the table on stdout; damaged runs and bad sweep-index entries named
    on stderr, one line each, and exit 1 where there are any. A store with nothing to list is
    refused in one line (exit 2), as `analyse`, `report` and `gates` refuse a store of no runs."""
    from dynamics.messages import name_damaged
    from dynamics.tables import print_table

    header, rows, damaged, bad = status_of(path)
    for line in bad.values():
        print(f"dynamics: {line}", file=sys.stderr)
    if not rows:
        # A header alone read as a table of runs that failed to show. Runs of a sweep not started yet
        # are rows (pending), so this is a store that nothing has trained into yet. A StoreError, not
        # dynamics.usage's UsageError (the same line, exit 2): usage imports torch, which report's
        # imports (grid_key, from here) must not reach.
        raise store.StoreError(f"{path} holds no runs yet: `dynamics run CONFIG --out {path}` or `dynamics sweep CONFIG "
                         f"--out {path}` trains some")
    name_damaged(damaged)  # the others are shown
    print_table(header, rows)
    return 1 if damaged or bad else 0


def resumes_at(path: str, run_id: str, attrs: dict, status: str) -> tuple[str, float | None]:
    """The step an unfinished run resumes at, with the loss recorded at the step before it (None
    where it is not read: a live run, a checkpoint at step 0). The step: its checkpoint's, or ``lost`` where that checkpoint
    is gone (`run` and `sweep` refuse it: :func:`dynamics.store.check_checkpoint_kept`), or
    ``refused`` where recordings before it are missing (:func:`dynamics.resume.refuse_unrecorded`):
    in either, a step offered a resume that the next command refused.

    It is read from the checkpoint itself: the attrs name it only after it is written, so a kill
    between the two left them naming the checkpoint before (status said 420, the run resumed at
    430), and so did a Ctrl-C pressed again while an interrupted run's writes drained (the
    writer thread cut off at exit, its attrs "interrupted" and one checkpoint behind)."""
    try:
        store.check_checkpoint_kept(path, run_id, attrs)
    except store.StoreError:
        return "lost", None
    start = store.checkpoint_step(path, run_id) or int(attrs.get("checkpoint_step", 0))
    if start and status != "running":  # a live run's writes are in flight: nothing to judge yet
        from dynamics.resume import refuse_unrecorded

        # A store copied while the run trained holds a later checkpoint than recordings: status
        # offered a resume there that `run` then refused (an audit's copy said 990, refused).
        # The check `run` makes (tens of ms a run: only unfinished runs, often one per worker).
        try:
            kept = refuse_unrecorded(path, run_id, None, start)  # None: the schedule the run recorded
        except Exception:  # noqa: BLE001 - a chunk failing its checksum (a ValueError): `run` refuses it too, naming it
            return "refused", None
        return str(start), kept
    return str(start), None
