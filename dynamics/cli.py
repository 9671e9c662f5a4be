"""Command line: ``dynamics <command>`` (or ``python -m dynamics <command>``).

The only module that may import everything. Bad input is reported as one line naming the
problem, with exit code 2, before any work starts; heavy modules are imported inside the
commands so ``dynamics --help`` and input errors stay instant.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dynamics.config import ConfigError, load_config

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Bad input found before any work: printed as one line, exit code 2."""


def _progress_printer(label: str):
    """tqdm bar on a terminal, plain log lines otherwise."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = None

        def update(step: int, total: int, loss: float) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, desc=label, unit="step", dynamic_ncols=True)
            bar.n = step
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            bar.refresh()
            if step >= total:
                bar.close()

        return update

    last = [-1.0]

    def log(step: int, total: int, loss: float) -> None:
        now = time.monotonic()
        if step >= total or now - last[0] >= 5.0:
            last[0] = now
            print(f"[{label}] step {step}/{total} loss {loss:.4f}", file=sys.stderr, flush=True)

    return log


def _check_out(path: str) -> None:
    from dynamics import store

    p = Path(path)
    if "://" not in path and p.exists() and not store.is_store(path):
        raise UsageError(f"--out {path} exists and is not a dynamics store; refusing to overwrite it")


def _check_store(path: str) -> None:
    from dynamics import store

    if not store.is_store(path):
        raise UsageError(f"{path} is not a dynamics store")


def cmd_run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    if args.device:
        from dynamics.config import replace_section
        cfg = replace_section(cfg, "train", device=args.device)
    out = args.out or f"runs/{Path(args.config).stem}.zarr"
    _check_out(out)
    from dynamics.train import train_run

    run_id = args.run_id or cfg.run_id()
    result = train_run(cfg, out, run_id, progress=_progress_printer(run_id))
    if result.skipped:
        print(f"{run_id}: already {result.status} in {out}; nothing retrained")
    else:
        print(f"{run_id}: {result.status} after {result.steps_done} steps -> {out}")
    return 0 if result.status == "completed" else 1


def cmd_status(args: argparse.Namespace) -> int:
    _check_store(args.store)
    from dynamics import store

    index = store.read_sweep_index(args.store) or {}
    swept = index.get("runs", {})
    axes = index.get("axes", [])
    header = ["run", *axes, "status", "steps", "last_loss"]
    rows = []
    for run_id in store.list_runs(args.store):
        a = store.run_attrs(args.store, run_id)
        loss = a.get("last_loss")
        done = a.get("steps_done", a.get("checkpoint_step", 0))
        rows.append([run_id, *[str(swept.get(run_id, {}).get(k, "")) for k in axes], a.get("status", "?"),
                     f"{done}/{a.get('steps_total', '?')}", "-" if loss is None else f"{loss:.4f}"])
    _print_table(header, rows)
    return 0


def _print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)).rstrip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynamics", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="train one run (the base point of a config) into a store")
    p.add_argument("config", help="TOML config")
    p.add_argument("--out", help="store path (default runs/<config>.zarr)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    p.add_argument("--device", help="torch device (cpu, cuda, cuda:1)")
    p.add_argument("--run-id", help="run group name (default: derived from the resolved config)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("status", help="runs in a store: swept values, status, steps done, last loss")
    p.add_argument("store")
    p.set_defaults(func=cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, UsageError) as e:
        print(f"dynamics: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("dynamics: interrupted; runs are resumable with the same command", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a one-line message for store problems found up front
        from dynamics.store import StoreError

        if isinstance(e, StoreError):
            print(f"dynamics: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise
