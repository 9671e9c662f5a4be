"""Command line: dynamics <command>, or python -m dynamics <command>; each command's --help says more.

The only module that may import everything. Bad input is reported as one line naming the
problem, with exit code 2, before any work starts (the checks the commands share are in
:mod:`dynamics.usage`; how a command ends, that line included, in :mod:`dynamics.exits`);
heavy modules are imported inside the commands so ``dynamics --help`` and input errors stay
instant.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
import time
from pathlib import Path
from urllib.parse import unquote

from dynamics import tables
from dynamics.budget import check_fits
from dynamics.config import ConfigError, RunConfig, load_config, parse_override
from dynamics.exits import EXIT_INTERRUPTED, WRITE_REFUSED, run_to_end, stage
from dynamics.limits import usable_cores
from dynamics.messages import (
    damaged_runs_named,
    gates_progress,
    name_damaged,
    note_mixed_training,
    predict_progress,
    print_note,
    progress_printer,
)
from dynamics.notes import grid_notes, start_notes
from dynamics.paths import absolute
from dynamics.tables import analysis_failures, demo_timing, print_analysis, print_consistency, print_table
from dynamics.usage import (
    DEFAULT_REPORT,
    DEFAULT_STORE,
    STORE_HELP,
    OneLineParser,
    UsageError,
    check_args,
    check_device,
    check_devices,
    check_not_swept,
    check_out,
    check_report_dir,
    check_store,
    check_workers,
    check_writable,
    no_runs,
    report_dir,
)
from dynamics.usage import EXIT_BAD_INPUT as EXIT_BAD_INPUT  # cli.EXIT_BAD_INPUT, as before


def cmd_run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    if args.device and any(parse_override(o)[0] == "train.device" for o in args.set):
        raise UsageError("give --device or --set train.device, not both")
    if args.device:
        from dynamics.config import replace_section
        cfg = replace_section(cfg, "train", device=args.device)
    check_device(cfg.train.device)
    out = args.out or f"runs/{Path(args.config).stem}.zarr"
    from dynamics.store import StoreError, check_run_id, has_run, is_finished

    run_id = check_run_id(args.run_id, new=not has_run(out, args.run_id)) if args.run_id else cfg.run_id()
    check_out(out, finished=lambda: is_finished(out, run_id),  # a finished run is skipped: no write
              flag="--out" if args.out else DEFAULT_STORE)
    # torch only for a GPU run, which check_device has imported; a finished run is skipped, needing no memory
    check_fits(cfg, lambda: is_finished(out, run_id))
    # After the checks that need no torch: a mistyped path is refused in a second, not after
    # the seconds torch takes to import.
    from dynamics import interventions, tasks

    interventions.check(cfg)
    tasks.check(cfg)
    tasks.check_read(cfg)
    from dynamics.identity import unread_setting_problem

    if (problem := unread_setting_problem(cfg.to_dict())) is not None:
        raise ConfigError(problem)
    # Said as training begins: before it, a refusal (the run trained elsewhere, recorded with
    # another config, damaged) is to be the command's one line, and a skipped run trains nothing.
    notes = []
    if cfg.train.device == "cpu" and cfg.train.threads > (cores := usable_cores()):
        # Not refused: the config may be meant for a larger machine, and the numbers are the same
        # up to float rounding; but threads beyond the cores fight each other (README: 3.3x slower).
        notes.append(f"train.threads {cfg.train.threads} is more than the {cores} core"
                     f"{'s' if cores > 1 else ''} this process may use; its threads would share cores and train slower")
    from dynamics.signals import sigterm_as_interrupt
    from dynamics.train import InterruptedAfterFinish, train_run

    if cfg.record.chg_every:
        # Training waits for each fit, and no progress line comes while it runs (README: 64 s
        # against 12 s for mixture.toml at 300 steps): say why the lines will pause.
        from dynamics.record import chg_fitted, snapshot_steps

        steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
        notes.append(f"CHG is fitted at {int(chg_fitted(cfg, steps_at).sum())} of the {steps_at.size} "
                     f"snapshots (record.chg_every = {cfg.record.chg_every}), {3 * cfg.record.chg_steps} gate updates "
                     f"each; training waits for each fit, so the progress lines pause")
    if cfg == RunConfig():
        notes.append(_default_note(args))
    notes += start_notes([cfg])  # not refused: a harder task (config_rules.validate), a run of use for its losses
    if cfg.sweep.axes:
        given = [key for key, _ in map(parse_override, args.set) if key.split(".")[0] == "sweep"]
        source = f"{args.config} with --set {given[0]}" if given else args.config  # its file may have none
        from dynamics.sweep.grid import expand_grid

        try:  # a grid `dynamics sweep` refuses is a mistake in the file, whichever command reads it
            expand_grid(cfg)
        except ConfigError as e:
            raise ConfigError(f"{e} ({source}'s [sweep] table; `dynamics run` trains only its base point, "
                              f"but `dynamics sweep` of it would be refused)") from None
        notes.append(f"{source} has a [sweep] table; `dynamics run` trains only its base point "
                     f"(`dynamics sweep` trains the grid)")

    from dynamics.sweep.twins import refuse_run_twin

    guard = None  # a run id given by name (--run-id) is the user's own, not checked
    if not args.run_id and not has_run(out, run_id):
        guard = refuse_run_twin(out, cfg)  # and what checks again, as the run's group is made

    started = []  # training has begun: a StoreError after it is no refusal

    def begin(step: int) -> None:
        started.append(step)
        for note in notes:
            print(f"dynamics: note: {note}", file=sys.stderr, flush=True)

    interrupted = None
    try:
        with sigterm_as_interrupt():
            result = train_run(cfg, out, run_id, progress=progress_printer(run_id), started=begin,
                               before_create=guard)
    except InterruptedAfterFinish as e:  # the run finished as the interrupt came: said so, not "resumable"
        result, interrupted = e.result, e
    except StoreError as e:
        if not started:
            raise  # bad input, refused before any work: main() prints it as one line, exit 2
        return _run_failed(out, run_id, e, trained=True)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the run's attributes hold the full traceback, where they could
        return _run_failed(out, run_id, e, trained=bool(started))
    if result.skipped:
        print(f"{run_id}: already {result.status} in {out}; nothing retrained")
    else:
        # "after 3000 steps" alone read as 3000 trained now, where a resume trained the last 2200
        resumed = f" (resumed at step {result.resumed_from})" if result.resumed_from else ""
        print(f"{run_id}: {result.status} after {result.steps_done} steps{resumed} -> {out}")
    if interrupted is not None:
        print(f"dynamics: interrupted as {run_id} finished: it is {result.status}, with nothing left to resume",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0 if result.status == "completed" else 1


def _run_failed(out: str, run_id: str, e: BaseException, *, trained: bool) -> int:
    """One line for a run that failed while training (exit 1), saying where its traceback is:
    in the run's attributes only if the run could record it there (a full disk, or a store
    deleted mid-run, may have left nothing, or only an earlier session's traceback). A run this
    session (``trained``) marked completed or diverged before the error is said to be so."""
    from dynamics import store
    from dynamics.train import traceback_recorded

    try:
        attrs = store.run_attrs(out, run_id)
    except Exception:  # noqa: BLE001 - no store or no run left to read
        attrs = {}
    message = (str(e).splitlines() or [""])[0]
    if (status := attrs.get("status")) in ("completed", "diverged"):
        # Its final attributes landed and only the root index's refresh after them failed (a disk
        # that filled just then), or it had finished before and this command stopped on the way
        # to skipping it: "failed" contradicted what `dynamics status` shows.
        what = (f"{status}, but refreshing the store's root index afterwards failed" if trained else
                f"was already {status}, but this command stopped before skipping it")
        print(f"dynamics: run {run_id} {what}: {type(e).__name__}: {message} (its arrays and attributes are "
              f"whole{'; the same command again refreshes the index' if trained else ''})", file=sys.stderr)
        return 1
    where = "traceback in the run's attributes" if traceback_recorded(attrs, e) else "its traceback could not be recorded in the store"
    fix = WRITE_REFUSED.get(getattr(e, "errno", None))  # a full disk, whether or not "failed" could be written
    print(f"dynamics: run {run_id} failed: {type(e).__name__}: {message} ({where})"
          + (f"; {fix} and run the same command again" if fix else ""), file=sys.stderr)
    return 1


def _default_note(args: argparse.Namespace) -> str:  # an empty file (a failed redirect) trained them in silence
    return (f"{args.config}{' with its --set' if args.set else ''} changes no default: this is RunConfig()'s "
            f"default run (is it the config you meant?)")


def cmd_sweep(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    check_not_swept(cfg, args.set)
    check_workers(args.workers, args.scheduler)
    if not args.scheduler:  # an existing cluster's workers may have the GPUs this machine lacks
        check_devices(cfg)
    out = args.out or f"runs/{Path(args.config).stem}.zarr"
    check_out(out, flag="--out" if args.out else DEFAULT_STORE)
    if cfg == RunConfig():  # a grid of this one point, as `run` notes
        print(f"dynamics: note: {_default_note(args)}", file=sys.stderr, flush=True)
    for note in grid_notes(cfg):  # a refused grid refuses here, first
        print_note(note)
    from dynamics.sweep import run_sweep  # imports torch: after the checks that need none
    summary = run_sweep(cfg, out, workers=args.workers, scheduler=args.scheduler)
    for line in summary.lines():
        print(line)
    return 0 if summary.ok else 1


def cmd_status(args: argparse.Namespace) -> int:
    check_store(args.store)
    from dynamics.status import show_status

    return show_status(args.store)


def analyse_store(path: str, run_ids: list[str] | None = None, workers: int | None = None,
                  again: bool = False) -> list[dict]:
    """Run every analyser on each finished run of a store and write analysis/<run_id>; one summary
    per run. A run analysed before by this code, from the recording it holds now, is kept unless
    ``again`` (see dynamics.analyse.analyse_one).

    ``workers`` processes at once, one per core by default (see dynamics.analyse). A line on
    stderr per run; SIGTERM stops it as Ctrl-C does, worker processes included.
    """
    from dynamics.analyse import analyse_store as analyse
    from dynamics.signals import sigterm_as_interrupt

    def log(done: int, total: int, row: dict) -> None:
        print(f"[analyse] {done}/{total} {row['run']} {tables.analysed_what(row)}", file=sys.stderr, flush=True)

    with sigterm_as_interrupt():
        return analyse(path, run_ids, workers=workers or usable_cores(), progress=log, again=again)


def _no_run(path: str, run_id: str, verb: str) -> UsageError:
    """The refusal of ``--run`` naming a run the store does not hold: a sweep point not started
    yet is one that `dynamics status` lists (as pending), so say that rather than "no run"."""
    from dynamics.status import sweep_points

    if run_id in sweep_points(path, ()).get("runs", {}):  # an entry that is no run id is none
        return UsageError(f"run {run_id!r} in {path} is a sweep point not started yet (pending): nothing to {verb}")
    return UsageError(f"no run {run_id!r} in {path}")


def cmd_analyse(args: argparse.Namespace) -> int:
    check_store(args.store)
    check_writable(args.store, "analyse", into=("analysis", "derived"))
    from dynamics import store

    # a damaged run is listed: its row says why it was not analysed, and the others are analysed
    ids = store.list_runs(args.store, damaged="include")
    if args.run and args.run not in ids:
        raise _no_run(args.store, args.run, "analyse")
    if not ids:
        raise no_runs(args.store, " to analyse")
    if args.run:
        store.run_attrs(args.store, args.run)  # the one run asked for is damaged: StoreError naming it, exit 2
    t0 = time.perf_counter()
    check_workers(args.workers)
    rows = analyse_store(args.store, [args.run] if args.run else None, workers=args.workers, again=args.again)
    print_analysis(rows, args.store, pending=not args.run)
    if not args.run:
        print_consistency(args.store, rows)
    note_mixed_training(args.store, [r["run"] for r in rows if not r.get("skipped")])
    print(tables.analysed_line(rows, time.perf_counter() - t0, args.store))
    if args.run and rows[0].get("skipped") and not rows[0].get("error"):
        # the one run asked for was not analysed (unfinished, too few snapshots): exit 0 read as done
        print(f"dynamics: run {args.run} was not analysed: {rows[0].get('reason', 'unfinished')} "
              f"({rows[0]['status']})", file=sys.stderr)
        return 1
    return 1 if analysis_failures(rows) else 0


def cmd_predict(args: argparse.Namespace) -> int:
    if args.horizon is not None and args.horizons is not None:
        raise UsageError("give --horizon or --horizons, not both")
    if args.horizons is not None:
        try:
            horizons = tuple(float(x) for x in args.horizons.split(","))
        except ValueError:
            raise UsageError(f"--horizons: expected numbers separated by commas, got {args.horizons!r}") from None
    elif args.horizon is None and args.unit == "step":  # the default horizon is a fraction of the run
        raise UsageError("--unit step needs --horizon or --horizons in steps (the default horizon, 0.1, is a "
                         "fraction of the run)")
    else:
        try:
            horizons = (float(args.horizon if args.horizon is not None else "0.1"),)
        except ValueError:  # "0.1,0.2" here was read as two horizons
            raise UsageError(f"--horizon: expected one number, got {args.horizon!r} (--horizons takes several)") from None
    if args.folds < 2:  # PredictOptions would name it n_splits, which is no flag
        raise UsageError(f"--folds: must be >= 2, got {args.folds}")
    check_store(args.store)
    if not args.no_save:
        check_writable(args.store, "predict", into=("derived",))
    from dynamics import predict
    from dynamics.predict.options import MAX_NULL

    if not 0 <= args.null <= MAX_NULL:  # as --folds: PredictOptions would name its field, null
        raise UsageError(f"--null: permutations must be in [0, {MAX_NULL}]; got {args.null}")
    try:  # every PredictError is bad input found before any model is fitted: one line, exit 2
        opts = predict.PredictOptions(target=args.target, horizons=horizons, unit=args.unit, group_by=args.group,
                                      n_splits=args.folds, use_stored_analysis=not args.recompute, null=args.null)
        curve = predict.predict_store(args.store, opts, progress=predict_progress)
    except predict.PredictError as e:
        raise UsageError(str(e)) from None
    print(predict.format_curve(curve))
    note_mixed_training(args.store, curve["run"].values.tolist())
    if not args.no_save:
        print(predict.save_curve(args.store, curve))
    # left out of the curve (its "left out" line): named with why on stderr, exit 1, as by analyse and report
    damaged = [r.removesuffix(" (damaged)") for r in curve.attrs["runs_left_out"] if r.endswith(" (damaged)")]
    return 1 if damaged_runs_named(args.store, damaged, chunks=True, decode=True) else 0


def default_report_dir(store_path: str) -> Path:
    """Where `report` and `demo` put a store's report without --out / --report: next to a local
    store (runs/x.zarr -> runs/x-report, git-ignored with runs/); for a URL, its name in the
    working directory (a path built from the URL would be a folder named "s3:"). A file:// URL
    names a local store: its report goes next to it, as for the plain path."""
    if store_path.startswith("file://"):
        store_path = unquote(store_path[len("file://"):])
    base = Path(store_path.rstrip("/").rsplit("/", 1)[-1] if "://" in store_path else store_path.rstrip("/"))
    base = base.absolute() if base.name in ("", ".", "..") else base  # `dynamics report .` inside a store
    base = absolute(base) if ".." in base.parts else Path(os.path.normpath(base))  # past a link, as the store is read
    return base.with_name(base.name.removesuffix(".zarr") + "-report")


def cmd_report(args: argparse.Namespace) -> int:
    check_store(args.store)
    from dynamics import store
    from dynamics.report import write_report

    ids = store.list_runs(args.store, damaged="include")  # the page names a damaged run as unreadable
    if not ids:
        raise no_runs(args.store, " to report on")
    if args.run and args.run not in ids:
        raise _no_run(args.store, args.run, "report on")
    if args.run:
        store.run_attrs(args.store, args.run)  # the run to show is damaged: StoreError naming it, exit 2
    out = report_dir(args.out, "--out") if args.out else default_report_dir(args.store)
    check_report_dir(out, "--out" if args.out else DEFAULT_REPORT)
    damaged: dict[str, str] = {}  # found by the report's own read of each run's attributes
    damaged_data: list[str] = []  # of readable runs: stored analyses, recordings drawn, derived curves, gates
    page = write_report(args.store, out, run_id=args.run, compute_missing=not args.no_compute,
                        on_damaged=damaged.__setitem__, on_damaged_data=damaged_data.append, on_note=print_note,
                        progress=lambda line: print(f"[report] {line}", file=sys.stderr))
    for line in damaged_data:  # named on the page where it would have been shown; exit 0 read as all well
        print(f"dynamics: {line}", file=sys.stderr)
    name_damaged(damaged)
    print(f"report written to {page}\nopen {page.resolve().as_uri()}")
    return 1 if damaged or damaged_data else 0


def cmd_gates(args: argparse.Namespace) -> int:
    check_store(args.store)
    if not args.no_save:
        check_writable(args.store, "gates", into=("derived",))
    from dynamics import store
    from dynamics.config import recorded_config
    from dynamics.gates import GateOptions, check_fittable, gate_report, parse_contrast, report_lines, report_table
    from dynamics.gates.report import save_fit

    runs = store.list_runs(args.store, damaged="include")  # a damaged one, if chosen: run_attrs names it
    if not runs:
        raise no_runs(args.store, "")
    run_id = args.run or (runs[0] if len(runs) == 1 else None)
    if args.run and run_id not in runs:
        raise _no_run(args.store, args.run, "fit gates to")
    if run_id not in runs:
        raise UsageError(f"{args.store} holds {len(runs)} runs; choose one with --run ({', '.join(runs[:8])}"
                         + (f", and {len(runs) - 8} more: dynamics status {args.store} lists them)" if len(runs) > 8
                            else ")"))
    attrs = store.run_attrs(args.store, run_id)
    cfg = recorded_config(attrs.get("config"), f"run {run_id} in {args.store}")
    # Component names are checked against the run before the model is loaded or anything fitted.
    check_fittable(cfg)
    contrast = parse_contrast(args.contrast, cfg) if args.contrast else None
    given = {"steps": args.steps, "init_steps": args.init_steps, "restarts": args.restarts, "lam": args.lam}
    try:
        options = GateOptions(**{k: v for k, v in given.items() if v is not None})
    except ConfigError as e:  # named as the flag given, not as the option's field
        message = str(e)
        for key in given:
            message = message.replace(f"gates.{key}:", f"--{key.replace('_', '-')}:")
        raise UsageError(message) from None
    from dynamics.checkpoint import batch_loss, load_run_model

    model, cfg, step = load_run_model(args.store, run_id)  # StoreError (exit 2) when there is no checkpoint
    status = store.run_status(args.store, run_id, attrs)  # "stopped" for a killed run, as status names it
    if not math.isfinite(loss := batch_loss(model, cfg)):  # every gate and NLL would be NaN, and saved
        raise UsageError(f"run {run_id} ({status}) at its checkpoint step {step} gives a loss of {loss}; "
                         f"there is no model to fit gates to")
    from dynamics.tasks import data_hash

    recorded_hash, hash_here = attrs.get("data_hash"), data_hash(cfg)
    if recorded_hash is not None and recorded_hash != hash_here:
        # The fit draws the task's eval batches here; on the corpus task they depend on this
        # machine's standard library, which differs from the one the run was trained on.
        print(f"dynamics: note: this machine makes other data for run {run_id}'s task than it was trained on (data_hash "
              f"{hash_here[:12]} here, {recorded_hash[:12]} recorded); the gates are fitted to this machine's data",
              file=sys.stderr)
    if status != "completed":
        print(f"dynamics: note: run {run_id} is {status}; these gates are fitted to its checkpoint at step {step} "
              f"of {cfg.train.steps}, not to a finished model", file=sys.stderr)
    ds = gate_report(model, cfg, options, contrast=contrast, progress=gates_progress(run_id))
    ds.attrs["step"] = step  # the checkpoint fitted; the run may be resumed past it later
    print(f"{run_id} at step {step}: causal head gating, {options.restarts} restart(s) x {options.steps} updates")
    print_table(*report_table(ds))
    for line in report_lines(ds):
        print(line)
    if not args.no_save:
        print(save_fit(args.store, run_id, ds))
    return 0


def _quickstart_config() -> Path:
    """experiments/quickstart.toml of this checkout (the demo runs from a clone: README)."""
    for base in (Path(__file__).resolve().parents[1], Path.cwd()):
        path = base / "experiments" / "quickstart.toml"
        if path.is_file():
            return path
    raise UsageError("experiments/quickstart.toml not found: run the demo from a clone of the repository")


def _within(path: Path, folder: Path) -> bool:
    """Whether `path` is `folder` or under it, both resolved (symlinks, ``..``) as far as they exist."""
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: quickstart sweep -> analyse -> predict -> report."""
    config = _quickstart_config()
    cfg = load_config(config, args.set)
    check_not_swept(cfg, args.set)
    check_workers(args.workers)
    check_devices(cfg)
    out = args.out or "runs/quickstart.zarr"
    check_out(out, flag="--out" if args.out else DEFAULT_STORE, also=("analysis", "derived"))
    report_out = report_dir(args.report, "--report") if args.report else default_report_dir(out)
    check_report_dir(report_out, "--report" if args.report else DEFAULT_REPORT)
    local = unquote(out[len("file://"):]) if out.startswith("file://") else None if "://" in out else out
    if local is not None and _within(report_out, Path(local)):
        # the store is made only by the sweep below, so check_report_dir could not see it yet
        named = f"store --out {out}" if args.out else f"store {out} (no --out given: the default)"
        raise UsageError(f"--report {report_out} is {'the' if _within(Path(local), report_out) else 'inside the'} "
                         f"{named} is to become; a report goes next to it, not into it")
    from dynamics import predict
    from dynamics.report import write_report
    from dynamics.sweep import check_points, run_sweep

    check_points(cfg, out)  # a bad grid, or a point too big for memory, refused before the banner
    for note in grid_notes(cfg):  # as `sweep` says them: a demo of 2 steps per run trained 12 runs none could analyse
        print_note(note)
    t0 = time.perf_counter()
    stage(args, 1, 4, f"sweep: {config.name} -> {out}")
    summary = run_sweep(cfg, out, workers=args.workers)
    print("\n".join(summary.lines()))
    t_train = time.perf_counter() - t0
    from dynamics import store

    others = len(set(store.list_runs(out, damaged="include")) - set(summary.labels))
    if others:  # --out at a store of other runs: analysed, predicted and reported with the demo's
        print(f"dynamics: note: {out} holds {others} run(s) besides this demo's {summary.total}; the analysis, "
              f"predictor and report below include them", file=sys.stderr, flush=True)

    stage(args, 2, 4, f"analyse (cross-seed consistency left out: `dynamics analyse {shlex.quote(str(out))}` gives it)")
    t1 = time.perf_counter()
    rows = analyse_store(out, workers=args.workers)
    print_analysis(rows, out)
    t_analyse = time.perf_counter() - t1
    said = note_mixed_training(out, [r["run"] for r in rows if not r.get("skipped")])  # runs of an earlier demo
    failed = analysis_failures(rows)

    stage(args, 3, 4, "predict: how early is each head's final role readable from its early training (gradients, attention, weights)?")
    for target in ("role",):  # the quickstart task (induction) grows few slash heads: role is the question
        opts = predict.PredictOptions(target=target, horizons=(0.0, 0.05, 0.1, 0.2, 0.5))
        try:
            curve = predict.predict_store(out, opts, progress=predict_progress)
        except predict.PredictError as e:  # e.g. no head became slash-dominant in this sweep
            print(f"predict --target {target}: not possible on this sweep: {e}")
            continue
        print(predict.format_curve(curve))
        print(predict.save_curve(out, curve))  # a curve of its target saved before is replaced: said

    stage(args, 4, 4, "report")
    page = write_report(out, report_out, on_note=lambda note: None if note in said else print_note(note))
    print(demo_timing(t_train, t_analyse, time.perf_counter() - t0, len(summary.skipped), summary.total, others,
                      resumed=sum(store.run_attrs(out, r).get("starts", 1) > 1 for r in summary.labels
                                  if r not in summary.skipped), analysed=sum(not r.get("skipped") and not r.get("kept") for r in rows)))
    print(f"report: {page}\nopen {page.resolve().as_uri()}")
    return 0 if summary.ok and not failed else 1


def build_parser() -> argparse.ArgumentParser:
    # python -OO strips docstrings: every command had ended in an AttributeError traceback
    parser = OneLineParser(prog="dynamics", description=(__doc__ or "Command line: dynamics <command>").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="train one run (the base point of a config) into a store")
    p.add_argument("config", help="TOML config")
    p.add_argument("--out", help="store path or fsspec URL (default runs/<config>.zarr)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    p.add_argument("--device", help="torch device (cpu, cuda, cuda:1)")
    p.add_argument("--run-id", help="run group name (default: derived from the resolved config)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="train every point of a config's [sweep] grid (skips finished runs)")
    p.add_argument("config", help="TOML config (without a [sweep] table, its base point is the one run)")
    p.add_argument("--out", help="store path or fsspec URL (default runs/<config>.zarr)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    p.add_argument("--workers", type=int, help="worker processes of the embedded cluster (default: one per core)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on an existing Dask cluster (tcp://host:port or a scheduler file)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("status", help="runs in a store, in grid order: swept values, status, steps the store records (+N unrecorded past the last checkpoint; ? where refused), the step a resume restarts from, last loss recorded (a finished run's at its last step, an unfinished one's before its checkpoint)")
    p.add_argument("store", help=STORE_HELP)
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("analyse", help="compute every analyser for every finished run not analysed before by this code (--again: all); write results next to the recordings")
    p.add_argument("store", help=STORE_HELP)
    p.add_argument("--run", help="only this run id")
    p.add_argument("--workers", type=int, help="processes analysing runs at once (default: one per core)")
    p.add_argument("--again", action="store_true", help="analyse runs analysed before by these analysers too "
                   "(by default their stored analyses are kept)")
    p.set_defaults(func=cmd_analyse)
    p = sub.add_parser("predict", help="predict each head's final specialisation from early training: gradients, attention, weights (grouped CV)")
    p.add_argument("store", help=STORE_HELP)
    p.add_argument("--target", default="slash", help="slash (default), role, importance, chg or redundant")
    p.add_argument("--horizon", help="one horizon (default 0.1)")
    p.add_argument("--horizons", help="comma-separated horizons for the curve, e.g. 0,0.02,0.05,0.1,0.2,0.5")
    p.add_argument("--unit", default="fraction", help="horizons as a 'fraction' of each run (default) or a training 'step'")
    p.add_argument("--group", default="seed", help="hold out whole 'seed's (default), 'run's or 'config's")
    p.add_argument("--folds", type=int, default=5, help="grouped CV folds, at most the number of groups (default 5)")
    p.add_argument("--null", type=int, default=0, metavar="N",
                   help="also fit N curves on final roles permuted between runs, and say how often the how-early "
                        "criterion then names a horizon (its false-alarm rate here) and how often it says 'legible at "
                        "initialisation'; each costs about one curve's time")
    p.add_argument("--recompute", action="store_true", help="compute final targets from the recordings, not the stored analysis")
    p.add_argument("--no-save", action="store_true", help="print only; do not write derived/predict.<target>")
    p.set_defaults(func=cmd_predict)
    p = sub.add_parser("report", help="write an HTML report (figures + step slider) of a store; opens from file://")
    p.add_argument("store", help=STORE_HELP)
    p.add_argument("--out", help="report directory (default <store>-report next to the store, "
                                  ".zarr dropped: runs/x.zarr -> runs/x-report)")
    p.add_argument("--run", help="run shown in the attention maps and dendrogram (default: median final loss)")
    p.add_argument("--no-compute", action="store_true",
                   help="leave runs without stored analysis out instead of analysing them in memory")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("gates", help="causal head gating (G+, G-, roles) and single-head ablation of a recorded run")
    p.add_argument("store", help=STORE_HELP)
    p.add_argument("--run", help="run id (default: the store's only run)")
    p.add_argument("--contrast", metavar="retain=A,forget=B", help="also fit gates that keep component A and lose B")
    p.add_argument("--steps", type=int, help="Adam updates of the G+/G- (and contrastive) fits (default 200)")
    p.add_argument("--init-steps", type=int,
                   help="Adam updates of the lambda=0 fit (default: as --steps; 0: G+/G- start from the random initial gates)")
    p.add_argument("--restarts", type=int, help="gate sets fitted in parallel from random inits (default 4)")
    p.add_argument("--lam", type=float, help="|lambda| of the G+/G- fits (default 0.1, the authors')")
    p.add_argument("--no-save", action="store_true", help="print only; do not write derived/gates.<run>")
    p.set_defaults(func=cmd_gates)
    p = sub.add_parser("demo", help="the main job: quickstart sweep, analysis, predictor curve and report")
    p.add_argument("--out", help="store path (default runs/quickstart.zarr)")
    p.add_argument("--report", help="report directory (default <store>-report next to the store: runs/quickstart-report)")
    p.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    p.set_defaults(func=cmd_demo)
    return parser


_SIGNED = re.compile(r"-\.?[0-9]")


def _signed_values_attached(argv: list[str]) -> list[str]:
    """``--opt -0.1,0.2`` as ``--opt=-0.1,0.2``: argparse takes a value that starts with "-" for an
    option unless it is one plain negative number, and said "--horizons: expected one argument"
    of a list of them (so the value's own check can name what is wrong with it)."""
    out: list[str] = []
    for a in argv:
        if out and _SIGNED.match(a) and out[-1].startswith("--") and "=" not in out[-1] and out[-1] != "--":
            out[-1] = f"{out[-1]}={a}"
        else:
            out.append(a)
    return out


# What a stopped command leaves: only training resumes; the others' results are saved whole or
# not at all (store.write_analysis, write_derived), so "resumable" would promise what they do not do.
def main(argv: list[str] | None = None) -> int:
    argv = _signed_values_attached(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    # check_args (no empty value; ~ in a path expanded) inside, so that its refusal is one line too
    return run_to_end(args.command, lambda: check_args(args) or args.func(args), lambda: getattr(args, "stage", None))
