"""What `dynamics analyse` costs: time against training the same store, memory against its size.

    python bench/analysis.py [--steps 1000] [--rounds 2] [--store-mb 32 288 864] [--cap-mb 512]

1. Time. Each round trains a fresh store with ``train_run`` (``RunConfig()`` defaults, or
   ``--config``; recording on, default cadence) and then runs ``cli.analyse_store`` on it
   (what ``dynamics analyse STORE`` does) --analyses times; printed: the analysis time as a
   fraction of that round's training time, wall clock and CPU time (all threads), the
   median over rounds. Goal: at most 10%.
2. Memory. A synthetic sweep store of ``--runs`` runs is written with ``store.RunWriter``
   (the recorder's schema, see ``record.variables``): ``--layers`` x ``--heads`` heads,
   ``--probes`` probes of length ``--context``, as many snapshots per run as make the float16
   attention arrays ``--store-mb`` uncompressed in all; causal softmax rows that sharpen over
   snapshots, with previous-token, sink, self and content heads. Each store is analysed by
   ``analyse_store`` with one process (``--workers 1``: N workers hold N runs at once) in a
   fresh subprocess; printed: which path it took for each run (runs under ``dynamics.analyse.IN_MEMORY_BYTES`` are loaded
   whole, larger ones analysed lazily with dask), its peak resident memory during the analysis
   (the process's own high-water mark ``VmHWM``, reset just before the analysis where
   ``/proc/self/clear_refs`` allows; not ``ru_maxrss``, which starts at the peak of the parent
   that spawned it) less its resident memory just before the analysis (imports done), and that increment
   over the store's uncompressed bytes (attention alone, and all arrays); and, between the
   two largest stores on the same path, how many bytes of peak memory each extra byte of one
   run's attention costs (runs are analysed one at a time): about 0 when the analysis
   streams, 1 or more when it holds the run.
   With ``--cap-mb`` a single run as large as the largest store is analysed under
   ``resource.setrlimit(RLIMIT_AS)`` = baseline address space + cap, and the bench reports
   whether it finished (every run analysed: a run whose analysis raised, MemoryError included,
   is reported by ``analyse_store`` as not analysed, and counts as a failure). That limit
   bounds resident memory by limit - baseline RSS, which is the cap plus whatever the baseline
   had mapped but not resident (printed: the memory the run was really given, against its
   attention bytes). Sizes are MiB (2**20 bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not an install

import numpy as np  # noqa: E402

from bench._common import Parser, at_least, bad_input, cpus, load_line, peak_rss_bytes, positive  # noqa: E402

KINDS = ("prev", "sink", "self", "content")
SYNTHETIC_D_MODEL = 64  # build_store's default: each head's W_Q/W_K/W_V/W_O slices are d_model x d_head


# --------------------------------------------------------------------------- synthetic store


def attention_maps(rng: np.random.Generator, noise: np.ndarray, sharpness: float, hot: np.ndarray) -> np.ndarray:
    """(L, H, P, T, T) causal softmax rows; sharpness in [0, 1] goes from early to trained."""
    L, H, P, T, _ = noise.shape
    q = np.arange(T)[:, None]
    k = np.arange(T)[None, :]
    logits = noise * np.float32(0.5 + 3.0 * sharpness)
    bump = np.float32(2.0 + 10.0 * sharpness)
    masks = {"prev": (k == q - 1), "sink": (k == 0) & (q >= 0), "self": (k == q)}
    for layer in range(L):
        for head in range(H):
            kind = KINDS[(layer * H + head) % len(KINDS)]
            if kind == "content":
                logits[layer, head] += bump * hot
            else:
                logits[layer, head] += bump * masks[kind]
    logits = np.where(k <= q, logits, -np.inf)
    logits -= logits.max(axis=-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=-1, keepdims=True)
    return logits.astype(np.float16)


def synthetic_config(*, layers: int, heads: int, probes: int, context: int, steps: int,
                     d_model: int = SYNTHETIC_D_MODEL):
    """The RunConfig a synthetic store is recorded under (not trained: its arrays are made up)."""
    from dynamics.config import ModelConfig, RecordConfig, RunConfig, TrainConfig

    return RunConfig(model=ModelConfig(n_layers=layers, n_heads=heads, d_model=d_model, context=context,
                                       attn_only=True, vocab_size=64),
                     train=TrainConfig(steps=steps), record=RecordConfig(n_probe=probes, head_weights="on"))


def build_store(path: str, *, layers: int, heads: int, probes: int, context: int, attention_mb: float,
                d_model: int = SYNTHETIC_D_MODEL, seed: int = 0, run_id: str = "synthetic") -> dict:
    """Write a synthetic completed run; returns its sizes."""
    from dynamics import store
    from dynamics.record import coords, variables

    per_snap = layers * heads * probes * context * context * 2
    n_snap = max(4, int(round(attention_mb * 2**20 / per_snap)))
    steps = n_snap * 10
    cfg = synthetic_config(layers=layers, heads=heads, probes=probes, context=context, steps=steps, d_model=d_model)
    steps_at = np.linspace(0, steps, n_snap).round().astype(np.int64)
    variables_ = variables(cfg, n_snap)
    writer = store.RunWriter(path, run_id, variables=variables_, coords=coords(cfg, steps_at),
                             attrs={"status": "running", "config": cfg.to_dict()})
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 64, size=(probes, context))
    tokens[:, ::7] = ord("/")  # some '/' for the token role
    writer.write_region("probe_tokens", 0, tokens)
    noise = rng.normal(size=(layers, heads, probes, context, context)).astype(np.float32)
    hot = (rng.random((probes, 1, context)) < 0.08).astype(np.float32)
    hw = rng.normal(0, 0.1, size=(layers, heads, 4, d_model, cfg.model.head_dim)).astype(np.float32)
    for i in range(n_snap):
        s = i / max(n_snap - 1, 1)
        hw += rng.normal(0, 0.01, size=hw.shape).astype(np.float32)
        writer.write_snapshot(i, {
            "attention": attention_maps(rng, noise, s, hot),
            "grad_norm": rng.gamma(2.0, 0.1, size=(layers, heads, 4)).astype(np.float32),
            "grad_cosine": rng.uniform(-1, 1, size=(layers, heads, 4)).astype(np.float32),
            "importance": rng.random((layers, heads)).astype(np.float32),
            "gate": np.ones((layers, heads), np.float32),
            "head_weights": hw,
            "eval_loss": np.array([4.0 - 2.5 * s], np.float32),
        })
    writer.write_region("loss", 0, np.linspace(4, 1, steps).astype(np.float32))
    writer.set_attrs(status="completed", steps_done=steps)
    writer.finalize()
    total = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for _, shape, dt, *_ in variables_.values())
    return {"snapshots": n_snap, "attention_bytes": n_snap * per_snap, "total_bytes": total,
            "shape": f"S={n_snap} L={layers} H={heads} P={probes} T={context}"}


# --------------------------------------------------------------------------- child process


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Reset this process's resident high-water mark (VmHWM) to its current RSS, where allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def analysis_failures(rows: list[dict]) -> list[str]:
    """'run: why' for each run analyse_store did not analyse (it reports a run whose analysis
    raised, MemoryError included, as a skipped row rather than raising)."""
    return [f"{r['run']}: {r.get('reason', r.get('error', 'not analysed'))}" for r in rows if r.get("skipped")]


def child(store_path: str, cap_mb: float | None) -> int:
    """Analyse a store in this fresh process; print JSON with times and memory."""
    import threading

    threading.stack_size(4 * 2**20)  # thread stacks count against RLIMIT_AS; 8 MB each by default
    import dask  # noqa: F401  (imports first, so the baseline holds them)
    import xarray  # noqa: F401

    from dynamics import analyse, cli, store
    from dynamics.analysis import analyse_run  # noqa: F401

    # sized as the analysis sizes it: the variables it reads, not the whole run
    in_memory = all(analyse.analysed_variables(store_path, r).nbytes < analyse.IN_MEMORY_BYTES
                    for r in store.list_runs(store_path))
    reset_peak_rss()  # the peak of the imports is no part of the analysis
    base_rss, base_vm = rss_bytes(), vm_bytes()
    if cap_mb is not None:
        limit = base_vm + int(cap_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        rows = cli.analyse_store(store_path, workers=1, again=True)
        failures = analysis_failures(rows)
        ok, err = not failures, "; ".join(failures)
    except MemoryError as e:
        ok, err, rows = False, f"MemoryError: {e}", []
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    peak = peak_rss_bytes()
    print(json.dumps({"ok": ok, "error": err, "wall": wall, "cpu": cpu, "base_rss": base_rss, "base_vm": base_vm,
                      "path": "in memory" if in_memory else "lazy",
                      "peak_rss": peak, "runs": len(rows)}))
    return 0


def run_child(store_path: str, cap_mb: float | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", store_path] + (["--cap-mb", str(cap_mb)] if cap_mb else [])
    # Few malloc arenas: address space per thread would otherwise dwarf the data under RLIMIT_AS.
    env = os.environ | {"MALLOC_ARENA_MAX": "2"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in res.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        return {"ok": False, "error": (res.stderr.strip().splitlines() or ["no output"])[-1], "peak_rss": 0,
                "base_rss": 0, "wall": float("nan"), "cpu": float("nan")}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- time vs training


def time_round(cfg, tmp: str, analyses: int) -> tuple[float, float, float, float]:
    from dynamics import cli
    from dynamics.train import train_run

    path = tempfile.mkdtemp(dir=tmp, suffix=".zarr")
    w0, c0 = time.perf_counter(), time.process_time()
    result = train_run(cfg, path)
    t_wall, t_cpu = time.perf_counter() - w0, time.process_time() - c0
    if result.status != "completed":  # a share of a run cut short (diverged) is against less training than said
        raise SystemExit(f"bench analysis: the trained run ended {result.status} after {result.steps_done} of "
                         f"{cfg.train.steps} steps; no time share is measured on it")
    walls, cpus = [], []
    for _ in range(analyses):
        w0, c0 = time.perf_counter(), time.process_time()
        # again: every analysis after the first would keep the one before, and time no analysing
        rows = cli.analyse_store(path, again=True)
        if kept := [r["run"] for r in rows if r.get("kept")]:
            raise SystemExit(f"bench analysis: {', '.join(kept)} kept, not analysed: no analysis time measured")
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        if failures := analysis_failures(rows):
            # the time of an analysis that stopped early is no analysis time
            raise SystemExit(f"bench analysis: the trained run was not analysed: {'; '.join(failures)}")
    return t_wall, t_cpu, statistics.median(walls), statistics.median(cpus)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="experiment TOML for part 1 (default: RunConfig() defaults)")
    parser.add_argument("--steps", type=at_least(1), default=1000, help="training steps of part 1's runs")
    parser.add_argument("--rounds", type=at_least(1), default=2, help="train + analyse rounds in part 1")
    parser.add_argument("--analyses", type=at_least(1), default=2, help="analyses per trained store (median)")
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch intra-op threads for training")
    parser.add_argument("--store-mb", type=positive, nargs="+", default=[32.0, 288.0, 864.0],
                        help="uncompressed attention MiB of each synthetic store")
    parser.add_argument("--runs", type=at_least(1), default=3, help="runs per synthetic sweep store")
    parser.add_argument("--layers", type=at_least(1), default=2)
    parser.add_argument("--heads", type=at_least(1), default=8)
    parser.add_argument("--probes", type=at_least(1), default=16)
    parser.add_argument("--context", type=at_least(1), default=64)
    parser.add_argument("--cap-mb", type=positive, default=None,
                        help="address-space cap, MiB above the baseline address space, for one run as large as the largest store")
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.cap_mb)

    from dynamics import interventions
    from dynamics.analysis import AnalysisOptions
    from dynamics.budget import n_snapshots
    from dynamics.config import ConfigError, RunConfig, check, load_config, replace_section
    from dynamics.usage import UsageError, check_device

    need = AnalysisOptions().baseline_snapshots + 1  # as dynamics.analyse: fewer snapshots are not analysed
    try:
        if not args.skip_time:
            cfg = load_config(args.config) if args.config else RunConfig()
            cfg = replace_section(cfg, "train", steps=args.steps, threads=args.threads)  # train_run applies it
            check_device(cfg.train.device)  # a config's cuda on a machine without one: a line, not a traceback
            interventions.check(cfg)  # a distillation's teacher store: a line, not a traceback in the warm-up
            if (n := n_snapshots(cfg.train.steps, cfg.record.dense_until, cfg.record.every)) < need:
                raise ConfigError(f"--steps {args.steps}: {n} snapshot(s), and an analysis needs >= {need}")
    except (ConfigError, UsageError) as e:
        return bad_input(str(e))
    if not args.skip_memory and SYNTHETIC_D_MODEL % args.heads:
        return bad_input(f"--heads {args.heads} does not divide the synthetic model's d_model {SYNTHETIC_D_MODEL}")
    if not args.skip_memory:  # the synthetic stores' config, as the package would check it
        try:
            check(synthetic_config(layers=args.layers, heads=args.heads, probes=args.probes, context=args.context,
                                   steps=10 * need))
        except ConfigError as e:
            return bad_input(f"--layers {args.layers} --heads {args.heads} --probes {args.probes} --context "
                             f"{args.context}: the synthetic stores' config: {e}")

    print(f"{cpus()}, {load_line()}")
    failed = 0  # synthetic stores whose analysis failed (the --cap-mb run's verdict is a figure, not this)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_time:
            import torch

            torch.set_num_threads(args.threads)
            # Untimed first: the first train_run and analysis of a process pay one-off costs (torch's
            # first use, dask.array, scipy and xarray internals imported on first call), which fell in
            # round 0 alone and raised the median of 2 rounds by half their excess. `dynamics demo`
            # gives the whole-command figure, imports included.
            time_round(replace_section(cfg, "train", steps=min(args.steps, 50)), tmp, 1)
            rows = [time_round(cfg, tmp, args.analyses) for _ in range(args.rounds)]
            wall = statistics.median(r[2] / r[0] for r in rows)
            cpu = statistics.median(r[3] / r[1] for r in rows)
            print(f"\n1. time: analyse_store / train_run on the same store ({'--config ' + args.config if args.config else 'RunConfig() defaults'}, "
                  f"{args.steps} steps, recording on; median of {args.rounds} rounds after an untimed warm-up)")
            print(f"   wall {wall:.1%}   cpu {cpu:.1%}   (goal <= 10%; training {args.threads} torch thread(s), "
                  f"analysis on dask's threads)")

        if not args.skip_memory:
            print("\n2. memory: analyse_store, one process, fresh for each synthetic sweep store")
            header = (f"   {'store':<34}{'attn MiB':>9}{'all MiB':>8}{'disk MiB':>9}{'path':>11}{'peak-base MiB':>14}"
                      f"{'/ attn':>8}{'/ all':>7}{'wall s':>8}")
            print(header)  # store: runs x the shape of each
            print("   " + "-" * (len(header) - 3))
            results = []
            for mb in sorted(args.store_mb):
                path = os.path.join(tmp, f"synthetic-{mb:g}.zarr")
                parts = [build_store(path, layers=args.layers, heads=args.heads, probes=args.probes,
                                     context=args.context, attention_mb=mb / args.runs, seed=i, run_id=f"synthetic{i}")
                         for i in range(args.runs)]
                info = {"shape": f"{args.runs} x {parts[0]['shape']}",
                        "attention_bytes": sum(x["attention_bytes"] for x in parts),
                        "total_bytes": sum(x["total_bytes"] for x in parts)}
                disk = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
                r = run_child(path)
                results.append((path, info, r))
                inc = r["peak_rss"] - r["base_rss"]
                head = (f"   {info['shape']:<34}{info['attention_bytes'] / 2**20:>9.0f}{info['total_bytes'] / 2**20:>8.0f}"
                        f"{disk / 2**20:>9.0f}{r.get('path', '?'):>11}")
                if r["ok"]:
                    print(f"{head}{inc / 2**20:>14.0f}{inc / info['attention_bytes']:>8.2f}"
                          f"{inc / info['total_bytes']:>7.2f}{r['wall']:>8.1f}")
                else:  # the memory of an analysis that stopped early is no figure of the analysis
                    failed += 1
                    print(f"{head}{'-':>14}{'-':>8}{'-':>7}{'-':>8}  FAILED: {r['error']}")
            same = [x for x in results if x[2].get("path") == results[-1][2].get("path") and x[2]["ok"]]
            if len(same) >= 2:
                (_, i0, r0), (_, i1, r1) = same[-2], same[-1]
                # Runs are analysed one after another, so peak memory can only follow the size of
                # one run: the increment is per extra byte of a run's attention.
                per_run0, per_run1 = i0["attention_bytes"] / args.runs, i1["attention_bytes"] / args.runs
                if per_run1 == per_run0:  # repeated --store-mb, or sizes both raised to the 4-snapshot floor
                    print(f"   marginal: not measured: the two largest stores hold the same attention per run "
                          f"({per_run1 / 2**20:.0f} MiB; a run has at least 4 snapshots): give larger --store-mb")
                else:
                    grow = ((r1["peak_rss"] - r1["base_rss"]) - (r0["peak_rss"] - r0["base_rss"])) / (per_run1 - per_run0)
                    print(f"   marginal ({r1.get('path')} path, {per_run0 / 2**20:.0f} -> {per_run1 / 2**20:.0f} MiB of "
                          f"attention per run): peak memory grows {grow:.2f} bytes per extra byte of a run's attention "
                          f"(0: streams; >= 1: holds the run)")
            if args.cap_mb:
                # One run as large as the largest store, so the run itself exceeds the cap.
                path = os.path.join(tmp, "synthetic-one-run.zarr")
                info = build_store(path, layers=args.layers, heads=args.heads, probes=args.probes,
                                   context=args.context, attention_mb=max(args.store_mb), seed=0, run_id="synthetic0")
                r = run_child(path, cap_mb=args.cap_mb)
                verdict = "finished" if r["ok"] else f"failed ({r['error']})"
                print(f"   one run of {info['attention_bytes'] / 2**20:.0f} MiB of attention ({info['shape']}) "
                      f"under RLIMIT_AS = baseline address space + {args.cap_mb:.0f} MiB: {verdict}")
                if "base_vm" in r:
                    # RLIMIT_AS bounds the address space, not resident memory: what the baseline had
                    # mapped but not resident (malloc arenas, thread stacks, BLAS buffers, libraries)
                    # can become resident without growing it. So resident memory may grow by up to
                    # limit - baseline RSS = cap + (baseline address space - baseline RSS).
                    room = r["base_vm"] + args.cap_mb * 2**20 - r["base_rss"]
                    print(f"     memory it was given: resident memory could grow by up to {room / 2**20:.0f} MiB "
                          f"above its baseline ({room / info['attention_bytes']:.2f} x the run's attention: the cap "
                          f"plus {(r['base_vm'] - r['base_rss']) / 2**20:.0f} MiB mapped but not resident at the "
                          f"baseline); it grew by {(r['peak_rss'] - r['base_rss']) / 2**20:.0f} MiB "
                          f"({(r['peak_rss'] - r['base_rss']) / info['attention_bytes']:.2f} x the run's attention)")
    print(f"\n{load_line()} at end")
    if failed:
        print(f"bench analysis: the analysis of {failed} synthetic store(s) failed; their rows show no figures",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
