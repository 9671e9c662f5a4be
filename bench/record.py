"""What recording costs: train_run(recording=True) against recording=False, and where the time goes.

    python bench/record.py [--steps 1000] [--repeats 3] [--dense-steps 100] [--threads 1] [--skip-runs]

The config is ``RunConfig()``'s defaults (see bench/train.py) with its RecordConfig defaults
(dense_until 64, every 100: 18 snapshots over 1000 steps) unless ``--config`` names a TOML.
Printed, all as ratios measured in this one process:

1. End to end. Whole ``train_run`` calls into fresh stores, the variants alternated
   (``--repeats`` rounds, order reversed every other round), medians of the per-round
   ratios: wall time, and CPU time of the process (all threads: the writer thread and
   zarr's event loop included; less sensitive than wall time to other load on the machine).
   At the default cadence over --steps, and at a dense cadence (a snapshot every step:
   record.every = 1, dense_until = 0) over --dense-steps, where the recorder's cost is
   also measured with the background writer replaced by synchronous writes, to see what
   the thread buys.
2. Where the time goes, per snapshot, each piece timed on its own (median of --calls,
   alternated with training steps) as a multiple of one training step: the probe forward
   (attention on the probe batch, eager path), the held-out eval loss, the gradient
   statistics (per-head grads, norms, cosines, gates, weights), the copy of the checkpoint
   state (clones, on the training thread), and on the background thread the zarr writes of
   the snapshot arrays and of the loss, and the checkpoint's torch.save and atomic write
   (fsync + attrs); with ``record.chg_every`` set, the causal-head-gating fit too, which runs
   at every chg_every-th snapshot and the last, not at each.
   Its overhead columns are that multiple x the snapshots it runs at / steps at each cadence:
   what the piece adds if nothing overlaps (the training-thread pieces always add; the
   background ones only when no core is free for them).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not an install

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dynamics.train as train_mod  # noqa: E402
from bench._common import Parser, at_least, bad_input, check_step_config, cpus, load_line  # noqa: E402
from dynamics import checkpoint, store  # noqa: E402
from dynamics.config import ConfigError, RunConfig, load_config, replace_section  # noqa: E402
from dynamics.record import Recorder, chg_fitted, coords, snapshot_steps, variables  # noqa: E402
from dynamics.tasks import make_batch  # noqa: E402
from dynamics.usage import UsageError, check_device  # noqa: E402


class _SyncWriter:
    """Drop-in for train._Writer that runs every write on the training thread."""

    def __init__(self, writer):
        self.writer = writer

    def submit(self, fn, *args) -> None:
        fn(*args)

    def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


def run_once(cfg: RunConfig, tmp: str, recording: bool, sync_writes: bool = False) -> tuple[float, float]:
    """(wall, cpu) seconds of one train_run into a fresh store."""
    path = tempfile.mkdtemp(dir=tmp, suffix=".zarr")
    original = train_mod._Writer
    if sync_writes:
        train_mod._Writer = _SyncWriter
    try:
        w0, c0 = time.perf_counter(), time.process_time()
        result = train_mod.train_run(cfg, path, recording=recording)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    finally:
        train_mod._Writer = original
    if result.status != "completed":  # an assert: gone under python -O, and a traceback
        raise SystemExit(f"bench record: a run ended {result.status} after {result.steps_done} of {cfg.train.steps} "
                         f"steps; no overhead is measured on it")
    return wall, cpu


def end_to_end(cfg: RunConfig, variants: dict[str, dict], repeats: int, tmp: str) -> dict[str, tuple[float, float, float, float]]:
    """Per variant: (median wall ratio, median cpu ratio, min wall ratio, max wall ratio) to 'off'."""
    names = list(variants)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    run_once(replace_section(cfg, "train", steps=min(cfg.train.steps, 20)), tmp, True)  # warm imports and kernels
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            w, c = run_once(cfg, tmp, **variants[name])
            wall[name].append(w)
            cpu[name].append(c)
    out = {}
    for name in names:
        if name == "off":
            continue
        wr = [a / b for a, b in zip(wall[name], wall["off"], strict=True)]
        cr = [a / b for a, b in zip(cpu[name], cpu["off"], strict=True)]
        out[name] = (statistics.median(wr), statistics.median(cr), min(wr), max(wr))
    return out


def components(cfg: RunConfig, calls: int, tmp: str) -> tuple[dict[str, tuple[str, float]], float]:
    """name -> (thread, seconds per snapshot), and the median training step, measured alternately."""
    device = torch.device(cfg.train.device)
    model = train_mod.build(cfg, device)
    opt = train_mod.make_optimizer(cfg, model)
    recorder = Recorder(cfg, device)
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    writer = store.RunWriter(os.path.join(tmp, "parts.zarr"), "run", variables=variables(cfg, len(steps_at)),
                             coords=coords(cfg, steps_at), attrs={"status": "running"})
    state = {"step": 0}
    holders = train_mod.grad_holders(model, model.optim_parameters())  # as train.py

    def train_step() -> None:
        s = state["step"]
        tokens = torch.from_numpy(make_batch(cfg, "train", s, cfg.train.batch_size).tokens).to(device)
        for group in opt.param_groups:
            group["lr"] = train_mod.lr_at(cfg, s)
        for p in holders:
            p.grad = None
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        loss.item()
        torch.nn.utils.clip_grad_norm_(model.optim_parameters(), cfg.train.grad_clip or float("inf"))
        opt.step()
        state["step"] = s + 1

    def grads_and_forward() -> torch.Tensor:  # leave .grad set, as at a snapshot, with its sequence gates'
        s = state["step"]
        tokens = torch.from_numpy(make_batch(cfg, "train", s, cfg.train.batch_size).tokens).to(device)
        model.zero_grad(set_to_none=True)
        xi = Recorder.sequence_gates(model, tokens.shape[0])  # (B, L, H)
        F.cross_entropy(model(tokens[:, :-1], head_gates=xi).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        return xi.grad

    for _ in range(3):
        train_step()
    sequence_grads = grads_and_forward()
    blocks = recorder.snapshot(model, sequence_grads)
    ckpt = checkpoint.checkpoint_state(model, opt, 1, recorder.prev_grads, None)  # not `state`: train_step reads that
    # train.py flushes the losses of the steps since the last snapshot: record.every of them,
    # fewer in a run shorter than that.
    losses = np.zeros(min(cfg.record.every, cfg.train.steps), dtype=np.float32)

    pieces = {
        "probe forward (attention)": ("training", lambda: recorder.attention(model)),
        "eval loss": ("training", lambda: recorder.eval_loss(model)),
        # what a snapshot runs (float64 norms and cosines): a float32 copy here took ~40% less
        "gradient stats, gates, weights": ("training", lambda: recorder.gradient_stats(model, sequence_grads)),
        "checkpoint state copy": ("training", lambda: checkpoint.checkpoint_state(model, opt, 1, recorder.prev_grads, None)),
        "zarr: snapshot arrays": ("writer", lambda: writer.write_snapshot(1, blocks)),
        "zarr: loss region": ("writer", lambda: writer.write_region("loss", 0, losses)),
        "checkpoint pickle, file + attrs": ("writer", lambda: train_mod._save_checkpoint(
            os.path.join(tmp, "parts.zarr"), "run", ckpt, writer, 1, 1, 0.0)),
    }
    if cfg.record.chg_every:  # a fit takes seconds: the table had left it out, and called the rest "all"
        pieces[CHG_PIECE] = ("training", lambda: recorder.chg(model, True))
    times: dict[str, list[float]] = {k: [] for k in pieces}
    step_times: list[float] = []
    def sync() -> None:  # on CUDA each piece's queued kernels landed in whichever piece synced next
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        train_step()
        sync()
        step_times.append(time.perf_counter() - t0)
        for name, (_, fn) in pieces.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    writer.finalize()
    return {k: (pieces[k][0], statistics.median(v)) for k, v in times.items()}, statistics.median(step_times)


CHG_PIECE = "CHG fit (some snapshots)"


def after_step_0(cfg: RunConfig, piece: str) -> int:
    """How many snapshots after step 0 (recording off takes that one too) `piece` runs at."""
    steps_at = snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)
    return int(chg_fitted(cfg, steps_at)[1:].sum()) if piece == CHG_PIECE else len(steps_at) - 1


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="experiment TOML (default: RunConfig() defaults)")
    parser.add_argument("--steps", type=at_least(1), default=1000, help="training steps of the default-cadence runs")
    parser.add_argument("--dense-steps", type=at_least(1), default=100, help="training steps of the every-step runs")
    parser.add_argument("--repeats", type=at_least(1), default=3, help="alternated rounds of whole runs")
    parser.add_argument("--calls", type=at_least(1), default=9, help="timed calls per snapshot piece")
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch intra-op threads (sweeps use 1)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-runs", action="store_true", help="only the per-piece table (fast)")
    args = parser.parse_args(argv)

    try:
        base = load_config(args.config) if args.config else RunConfig()
        check_step_config(base, f"--config {args.config}")
        base = replace_section(base, "train", device=args.device, threads=args.threads)  # train_run applies it
        cfg = replace_section(base, "train", steps=args.steps)
        dense = replace_section(replace_section(base, "train", steps=args.dense_steps), "record", every=1, dense_until=0)
        check_device(args.device)
    except (ConfigError, UsageError) as e:
        return bad_input(str(e))
    torch.set_num_threads(args.threads)
    # Snapshots beyond step 0: recording off takes that one too (part 1), so these are what the
    # end-to-end ratios compare; counting it put the pieces' sum 1/18 above them.
    n_default = len(snapshot_steps(cfg.train.steps, cfg.record.dense_until, cfg.record.every)) - 1
    n_dense = len(snapshot_steps(dense.train.steps, 0, 1)) - 1
    # the goal is the issue's, at the default model's cadence over 1000 steps: 8 snapshots over
    # 100 steps printed "+10.8% (goal <= 3%)" for a cadence the goal is not about
    goal = "(goal <= 3%)" if not args.config and args.steps == 1000 else \
        f"(the <= 3% goal is for the defaults' 1000 steps; {n_default} snapshot(s) after step 0 over {args.steps} here)"
    r = cfg.record
    print(f"config: {'--config ' + args.config if args.config else 'RunConfig() defaults'}; "
          f"record: dense_until {r.dense_until}, every {r.every}, n_probe {r.n_probe}, "
          f"eval {cfg.train.eval_batches} x {r.eval_batch_size} seqs/component, head_weights {r.head_weights}; "
          f"{args.threads} torch thread(s), {cpus()}, {load_line()}")
    print(f"default cadence: {n_default} snapshots after step 0 over {cfg.train.steps} steps; "
          f"dense cadence: {n_dense} after step 0 over {dense.train.steps} steps")

    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_runs:
            print(f"\n1. end to end: train_run time / recording=False time "
                  f"(median of {args.repeats} alternated rounds; [min, max] of the wall ratios)")
            res = end_to_end(cfg, {"off": dict(recording=False), "on": dict(recording=True)}, args.repeats, tmp)
            w, c, lo, hi = res["on"]
            print(f"   default cadence, {args.steps} steps: wall {w:.3f} [{lo:.3f}, {hi:.3f}]  cpu {c:.3f}"
                  f"   -> overhead {w - 1:+.1%} wall, {c - 1:+.1%} cpu {goal}")
            res = end_to_end(dense, {"off": dict(recording=False), "on": dict(recording=True),
                                     "on, sync writes": dict(recording=True, sync_writes=True)}, args.repeats, tmp)
            for name, (w, c, lo, hi) in res.items():
                print(f"   every step, {args.dense_steps} steps, {name:<16} wall {w:.3f} [{lo:.3f}, {hi:.3f}]  cpu {c:.3f}")

        parts, step = components(cfg, args.calls, tmp)
        # each piece's seconds over a run at each cadence: its time x the snapshots it runs at
        runs_at = {name: (after_step_0(cfg, name), after_step_0(dense, name)) for name in parts}
        total = sum(t * runs_at[name][0] for name, (_, t) in parts.items())
        print(f"\n2. per snapshot, each piece alone (median of {args.calls} calls alternated with training steps)")
        header = f"   {'piece':<32}{'thread':>10}{'x step':>9}{'share':>8}{'default':>10}{'dense':>9}"
        print(header)
        print("   " + "-" * (len(header) - 3))

        def row(name: str, thread: str, pieces: list[str]) -> None:
            at_default = sum(parts[k][1] * runs_at[k][0] for k in pieces)
            at_dense = sum(parts[k][1] * runs_at[k][1] for k in pieces)
            per_snapshot = at_default / n_default if n_default else sum(parts[k][1] for k in pieces)
            share = f"{at_default / total:>8.0%}" if total else f"{'-':>8}"
            print(f"   {name:<32}{thread:>10}{per_snapshot / step:>9.2f}{share}"
                  f"{at_default / step / cfg.train.steps:>10.2%}{at_dense / step / dense.train.steps:>9.1%}")

        for name, (thread, _) in parts.items():
            row(name, thread, [name])
        row("all, training thread", "", [k for k, (th, _) in parts.items() if th == "training"])
        row("all", "", list(parts))
        print("   (x step: the piece's time in training steps, per snapshot at the default cadence; share: of all the "
              "pieces' time at the default cadence; default / dense: the piece's time at each snapshot it runs at "
              "beyond step 0, which recording off takes too, over the run's steps)")
        if CHG_PIECE in parts:
            print(f"   ({CHG_PIECE}: record.chg_every {cfg.record.chg_every}, so at {runs_at[CHG_PIECE][0]} of the "
                  f"{n_default} snapshots after step 0 at the default cadence and {runs_at[CHG_PIECE][1]} of "
                  f"{n_dense} at the dense; one fit x step {parts[CHG_PIECE][1] / step:.1f})")
    print(f"\n{load_line()} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
