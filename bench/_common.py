"""Helpers shared by the bench scripts (imported as ``bench._common`` once a script has put the
repository root on ``sys.path``)."""

from __future__ import annotations

import argparse
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path

# the package's own: a bad flag is one line, exit 2, before any work, as in `dynamics`
from dynamics.usage import EXIT_BAD_INPUT
from dynamics.usage import OneLineParser as Parser  # noqa: F401  (the bench scripts' parser)


def load_line() -> str:
    """The 1, 5 and 15 minute load averages, printed next to timings: other load on the machine skews them."""
    try:
        return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average n/a"


def cpus() -> str:
    """The CPUs this process may run on, as the figures were measured on them: os.cpu_count()
    counts the whole machine, and under taskset or a cgroup's cpuset the headers had said 2
    where 1 was usable (a sweep's 2 workers then ran 0.78x as fast as 1, read as on 2 cores)."""
    from dynamics.limits import usable_cores

    n, whole = usable_cores(), os.cpu_count()
    return f"{n} CPUs" if n == whole else f"{n} usable CPUs (of the machine's {whole})"


def at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= minimum (a count of steps, repeats, workers...)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def positive(text: str) -> float:
    """argparse type: a number > 0 (a size in MiB)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def bad_input(message: str) -> int:
    """Print one line naming the problem; the exit code for bad input."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def check_step_config(cfg, source: str) -> None:
    """ConfigError for a config whose training step this bench's does not reproduce: interventions
    add hooks and losses, and learned gates a regulariser and a hold, that only ``train_run``
    applies; timed without them, the figures would not be train.py's step, as they claim to be."""
    from dynamics.config import ConfigError

    changes = [what for what, on in (("an [intervene] table", bool(cfg.intervene)),
                                     ('learned gates (model.gates = "learned")', cfg.model.gates == "learned")) if on]
    if changes:
        raise ConfigError(f"{source}: {' and '.join(changes)} change{'' if len(changes) > 1 else 's'} train_run's step in ways this bench's step "
                          f"does not apply; time such a config with `dynamics run` (its run's wall_time)")


def peak_rss_bytes() -> int:
    """This process's own peak resident memory (VmHWM).

    Not ``ru_maxrss``: for a process started by fork/vfork + exec it is at least the parent's
    peak RSS at the spawn (the kernel carries the old address space's high-water mark over
    the exec), so a child spawned by a parent that had built a large store reported that as
    its own peak, and an analysis that did nothing showed as growing.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # no /proc status: kB on Linux


def probe_split_parser(doc: str):
    """The arguments of the benches that split a store's probes into two samples (probe_range,
    role_agreement): STORE, --probes, --draws and --seed."""
    p = Parser(description=doc.splitlines()[0])
    p.add_argument("store", help="a store of runs recorded on at least 2 x --probes probes")
    p.add_argument("--probes", type=at_least(2), default=8, help="probes a sample, as record.n_probe (default 8)")
    p.add_argument("--draws", type=at_least(1), default=40, help="sample pairs per run (default 40)")
    p.add_argument("--seed", type=int, default=1, help="seed of the draws (not of the resamples, which the analysis fixes)")
    return p


def open_split_runs(path: str, probes: int) -> dict | str:
    """Every run of the store at ``path``, opened in memory, or the one line that refuses it: no
    runs, a run not completed (its unwritten snapshots), or fewer than 2 x ``probes`` probes."""
    from dynamics import store

    try:
        runs = store.list_runs(path)
    except store.StoreError as e:
        return str(e)
    if not runs:
        return f"{path} holds no runs"
    opened = {rid: store.open_run(path, rid, dask=False) for rid in runs}
    for rid, ds in sorted(opened.items()):
        if ds.attrs.get("status") != "completed":
            return f"run {rid} is {ds.attrs.get('status', 'of no status')}: only completed runs are compared"
        if ds.sizes["probe"] < 2 * probes:
            return (f"run {rid} recorded {ds.sizes['probe']} probes, fewer than 2 x --probes {probes} "
                    f"(record with more: --set record.n_probe=64)")
    return opened
