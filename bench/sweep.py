"""How much a sweep speeds up with worker processes: the same grid with 1 worker, then with 2.

    python bench/sweep.py [--runs 4] [--steps 300] [--workers 1 2]

Each worker count gets a fresh LocalCluster (one single-threaded worker process per slot,
as ``dynamics sweep`` makes) that is started and warmed up (torch imported, one throwaway
run trained) before the clock starts, then ``run_sweep`` trains the grid into a fresh
store. Printed: the wall time per worker count and the speedup relative to the first, all
measured in this one process, for the sweep alone and with the cluster's start, warm-up and
stop (what ``dynamics sweep`` pays in all). Each worker count is timed ``--repeat`` times, alternating, and
the best time counts. The goal on an idle 2-core machine is >= 1.8x for 2 workers; the gap
to 2x is the launcher, the scheduler and the store writes sharing those 2 cores.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not an install

from bench._common import Parser, at_least, bad_input, cpus  # noqa: E402


def grid(runs: int, steps: int):
    from dynamics.config import from_dict

    return from_dict({
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "attn_only": True, "vocab_size": 32, "context": 32},
        "task": {"name": "induction", "min_period": 4, "max_period": 12},
        "train": {"steps": steps, "batch_size": 32, "warmup_steps": 20},
        "record": {"dense_until": 16, "every": 50, "n_probe": 4},
        "sweep": {"train": {"seed": list(range(runs))}},
    })


def _warm(path: str) -> str:
    from dynamics.config import from_dict
    from dynamics.train import set_threads, train_run

    set_threads(1)
    cfg = from_dict({"model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab_size": 16, "context": 16},
                     "task": {"min_period": 2, "max_period": 6}, "train": {"steps": 2, "eval_batches": 1},
                     "record": {"n_probe": 1}})
    train_run(cfg, path)
    return "ok"


def time_sweep(cfg, n_workers: int, root: Path) -> tuple[float, float]:
    """(the sweep alone, the sweep with its cluster's start, warm-up and stop), seconds.

    The second is what ``dynamics sweep`` pays in all, give or take the throwaway run (whose
    torch import its workers pay at their first task anyway); the first leaves those fixed
    costs out, which a longer sweep spreads thinner.
    """
    from distributed import Client

    from dynamics.sweep import local_cluster, run_sweep

    start = time.perf_counter()
    with local_cluster(n_workers) as cluster, Client(cluster) as client:
        root.mkdir(parents=True, exist_ok=True)
        client.run(lambda: _warm(str(root / f"warm-{n_workers}-{os.getpid()}.zarr")))
        t0 = time.perf_counter()
        summary = run_sweep(cfg, str(root / f"sweep-{n_workers}.zarr"), scheduler=cluster.scheduler_address,
                            progress=False)
        elapsed = time.perf_counter() - t0
    whole = time.perf_counter() - start
    if not summary.ok:
        raise SystemExit(f"bench sweep failed: {summary.lines()}")
    return elapsed, whole


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=at_least(1), default=4, help="grid points (seeds)")
    parser.add_argument("--steps", type=at_least(1), default=300, help="training steps per run")
    parser.add_argument("--workers", type=at_least(1), nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=at_least(1), default=2, help="rounds over the worker counts; the best time counts")
    args = parser.parse_args(argv)
    if len(set(args.workers)) < len(args.workers):  # a count's second sweep found its runs done: ~0 s
        parser.error(f"--workers {' '.join(map(str, args.workers))}: a worker count given twice")
    from dynamics.config import ConfigError
    from dynamics.sweep import expand_grid

    try:
        cfg = grid(args.runs, args.steps)
        expand_grid(cfg)  # past the point limit: refused here, not by run_sweep once a cluster started
    except ConfigError as e:
        return bad_input(str(e))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{cpus()}, load average {load:.1f} before starting "
          "(other busy processes take cores from the workers: the ratio means something on an idle machine)")
    times: dict[int, list[float]] = {n: [] for n in args.workers}
    wholes: dict[int, list[float]] = {n: [] for n in args.workers}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeat):
            # reversed every other round, so a drift in machine load favours neither side
            for n in (args.workers if rep % 2 == 0 else args.workers[::-1]):
                alone, whole = time_sweep(cfg, n, Path(tmp) / f"{rep}")
                times[n].append(alone)
                wholes[n].append(whole)
                print(f"{args.runs} runs x {args.steps} steps, {n} worker(s): {alone:.1f} s the sweep, {whole:.1f} s "
                      f"with the cluster's start, warm-up and stop", flush=True)
    base = args.workers[0]
    for what, table in (("the sweep alone", times), ("with the cluster's start, warm-up and stop", wholes)):
        best = {n: min(t) for n, t in table.items()}
        for n in args.workers[1:]:
            print(f"speedup {n} vs {base} worker(s), {what}: {best[base] / best[n]:.2f}x (best of {args.repeat}: "
                  f"{best[base]:.1f} s vs {best[n]:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
