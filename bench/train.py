"""Training throughput and model-FLOP utilisation (MFU) of the default model.

    python bench/train.py [--device cpu|cuda] [--config experiments/induction.toml] [--threads 1]
                          [--set model.d_model=128 ...] [--steps 5] [--repeats 7]
                          [--compile] [--no-threads] [--no-profile]

The model is ``RunConfig()``'s defaults (ModelConfig: 2 layers, d_model 64, 4 heads of 16,
d_mlp 256, vocab 64, context 64, RoPE, fixed gates; TrainConfig: batch 32, AdamW, grad clip
1.0) unless ``--config`` names an experiment TOML; ``--set`` overrides keys as in
``dynamics run``. One training step is exactly train.py's
(batch generation, lr set, zero_grad, forward, cross-entropy, backward, clip, AdamW step),
with no recording.

Everything is a ratio of two things measured in this one process, alternated in blocks and
reduced to medians, because the machines are shared:

- MFU = tokens/s x FLOPs/token / the machine's own float32 matmul rate (``torch.mm`` on
  --peak-n square matrices, same thread count, timed between the training blocks).
  FLOPs/token = 6 N + 6 L (T + 1) H d_head (Chowdhery et al. 2022, PaLM, appendix B: dense
  matmuls forward + backward, plus QK^T and AV, here over the causal triangle only, T (T+1)/2
  of the T x T square, which is the work the model needs; PaLM counts the square, which
  would add 7% to the default model's MFU). N counts the weights of the matmuls: W_Q, W_K,
  W_V, W_O, W_in, W_out, W_U, not the W_E / W_pos lookup tables, biases or LayerNorm gains.
  Softmax, GELU, LayerNorm, biases and the optimiser count 0 FLOPs, so they are part of the gap.
- ``--compile``: the same step with ``torch.compile(model.forward)``, timed in blocks
  alternated with the eager ones, and the compile time. Training does not compile: see README.
- Where the gap is: the step split into phases (data, forward, backward, clip, optimiser)
  timed directly; within forward + backward, profiler self time per kernel family, and the
  framework share (wall time not spent inside any ATen kernel: Python, autograd, dispatch);
  and the step at half and twice the batch, a line through the three step times splitting the
  step into a fixed cost and a cost per row (and the MFU of the per-row cost alone); and the
  rate each of the model's matmul shapes reaches on its own, against the peak; and the model's
  attention alone under each SDPA backend that runs here.
- train_run's loop against the bare step: ``train_run(recording=False)`` step time read
  from its progress callback (setup excluded), alternated with the bare loop.
- Threads (cpu): 1 vs 2 intra-op threads, and 2 with OMP_WAIT_POLICY=PASSIVE, each in a
  fresh worker process (OpenMP settings are fixed at start-up), alternated.
- Allocator (cpu, glibc): the step with glibc's default malloc thresholds against train.py's
  (``dynamics.allocator.keep_freed_memory``), step time and minor page faults per step, each in
  a fresh worker process (the thresholds cannot be unset), alternated. Every other figure here
  is measured with train.py's thresholds, as training runs.

Absolute figures (tokens/s, ms) are printed for reference; on a shared CPU only the ratios
mean anything, on a GPU the absolute ones do too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not an install

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench._common import Parser, at_least, bad_input, check_step_config, cpus, load_line, peak_rss_bytes  # noqa: E402
from dynamics.allocator import keep_freed_memory  # noqa: E402
from dynamics.config import ConfigError, RunConfig, load_config, parse_override, replace_section, with_values  # noqa: E402
from dynamics.tasks import make_batch  # noqa: E402
from dynamics.train import build, grad_holders, lr_at, make_optimizer, train_run  # noqa: E402
from dynamics.usage import UsageError, check_device  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


class Trainer:
    """train.py's step, without the store; ``phases`` collects per-phase times when asked."""

    def __init__(self, cfg: RunConfig, device: torch.device, keep_memory: bool = True):
        self.cfg, self.device = cfg, device
        if device.type == "cpu" and keep_memory:
            keep_freed_memory()  # as train.py does on cpu
        self.model = build(cfg, device)
        self.optimizer = make_optimizer(cfg, self.model)
        self.params = self.model.optim_parameters()
        self.grad_holders = grad_holders(self.model, self.params)  # as train.py
        self.step_no = 0

    def step(self, phases: dict[str, list[float]] | None = None) -> None:
        cfg, model, opt, dev = self.cfg, self.model, self.optimizer, self.device
        marks = [time.perf_counter()] if phases is not None else None

        def mark():
            if marks is not None:
                sync(dev)
                marks.append(time.perf_counter())

        step = self.step_no % cfg.train.steps
        tokens = torch.from_numpy(make_batch(cfg, "train", step, cfg.train.batch_size).tokens).to(dev)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        for p in self.grad_holders:
            p.grad = None
        mark()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        mark()
        loss.backward()
        loss.item()  # train.py reads the loss every step
        mark()
        if cfg.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.params, cfg.train.grad_clip)
        mark()
        opt.step()
        mark()
        self.step_no += 1
        if phases is not None:
            for name, a, b in zip(PHASES, marks[:-1], marks[1:], strict=True):
                phases.setdefault(name, []).append(b - a)

    def timed(self, n: int) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(n):
            self.step()
        sync(self.device)
        return (time.perf_counter() - t0) / n

    def faults(self, n: int) -> tuple[float, float]:
        """Minor page faults and seconds of system time per step over ``n`` steps (this
        process's, so nothing else may run in it meanwhile)."""
        before = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(n):
            self.step()
        after = resource.getrusage(resource.RUSAGE_SELF)
        return (after.ru_minflt - before.ru_minflt) / n, (after.ru_stime - before.ru_stime) / n


PHASES = ("data", "forward", "backward", "clip", "optimizer")


def attention_flops_per_token(m) -> float:
    """QK^T and AV, forward + backward (x3), 2 FLOPs per multiply-add, over the causal triangle:
    per token, (T + 1) / 2 keys on average, so 3 * 2 * 2 * L * H * d_head * (T + 1) / 2."""
    return 6.0 * m.n_layers * (m.context + 1) * m.n_heads * m.head_dim


# train_run reports progress every 10 steps; its step time needs two reports after step 0's
# snapshot (steps 10 and 20), both before the final step.
MIN_RUN_STEPS = 21


def flops_per_token(cfg: RunConfig, model) -> tuple[float, int]:
    lookup = {id(model.W_E)} | ({id(model.W_pos)} if hasattr(model, "W_pos") else set())
    # Matmul weights only: a bias or a LayerNorm gain is one FLOP per element, not six.
    n = sum(p.numel() for p in model.optim_parameters() if id(p) not in lookup and p.ndim >= 2)
    return 6.0 * n + attention_flops_per_token(cfg.model), n


def mm_rate(a: torch.Tensor, b: torch.Tensor, device: torch.device, min_time: float = 0.05) -> float:
    """FLOP/s of a @ b: batches of calls, doubling, until one batch takes at least min_time.

    One device sync per batch: a sync after every call timed a small matmul's launch-and-wait
    round trip on CUDA (tens of microseconds), not its throughput.
    """
    flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    reps = 1
    while True:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        sync(device)
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return flops * reps / dt
        reps *= 2


def model_gemms(cfg: RunConfig) -> list[tuple[str, int, int, int, int]]:
    """(name, M, K, N, count per step) of the dense matmuls of one training step.

    Each forward matmul (M x K) @ (K x N) has two backward ones of the same FLOPs, counted as
    3 here; their shapes differ (K and M, N swap), which the rate of the forward shape stands in for.
    """
    m, B = cfg.model, cfg.train.batch_size
    M, d, hd = B * m.context, m.d_model, m.n_heads * m.head_dim
    rows = [("qkv", M, d, 3 * hd, 3 * m.n_layers), ("out", M, hd, d, 3 * m.n_layers)]
    if not m.attn_only:
        rows += [("mlp_in", M, d, m.d_mlp, 3 * m.n_layers), ("mlp_out", M, m.d_mlp, d, 3 * m.n_layers)]
    rows.append(("unembed", M, d, m.vocab_size, 3))
    return rows


def profile_breakdown(trainer: Trainer, steps: int) -> dict[str, float] | None:
    """Self time per kernel family in forward + backward, as fractions of their wall time."""
    from torch.profiler import ProfilerActivity, profile

    dev = trainer.device
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    families = {  # first match wins, by substring of the ATen op name
        "attention (sdpa)": ("scaled_dot_product", "flash_attention", "efficient_attention"),
        "layer_norm": ("layer_norm",),
        "gelu": ("gelu",),
        "softmax / cross-entropy": ("softmax", "nll_loss", "cross_entropy"),
        "matmul": ("mm", "matmul", "linear"),
        "elementwise / copies": ("mul", "add", "sub", "div", "cat", "copy", "neg", "fill", "zero", "sum",
                                 "index", "embedding", "clone", "contiguous", "stack", "where", "masked", "sqrt"),
    }
    cfg, model = trainer.cfg, trainer.model
    batches = [torch.from_numpy(make_batch(cfg, "train", s, cfg.train.batch_size).tokens).to(dev)
               for s in range(steps)]
    sync(dev)
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for tokens in batches:
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
        sync(dev)
        wall = time.perf_counter() - t0
    attr = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    out = dict.fromkeys([*families, "other kernels"], 0.0)
    others: dict[str, float] = {}
    kernel_total = 0.0
    for ev in prof.key_averages():
        name = ev.key.lower()
        if not name.startswith("aten::"):
            continue  # autograd nodes, profiler ranges: their self time is framework overhead
        t = getattr(ev, attr, 0.0) / 1e6
        if dev.type == "cuda" and t == 0.0:
            continue
        kernel_total += t
        op = name[len("aten::"):]
        for fam, keys in families.items():
            if any(k in op for k in keys):
                out[fam] += t
                break
        else:
            out["other kernels"] += t
            others[op] = others.get(op, 0.0) + t
    shares = {k: v / wall for k, v in out.items()}
    top = sorted(others, key=others.get, reverse=True)[:3]
    shares = {(f"{k} ({', '.join(top)})" if k == "other kernels" and top else k): v for k, v in shares.items()}
    # The wall time no op accounts for: on the CPU the framework's own work; on a GPU (one
    # stream, so kernels do not overlap) the device idles while Python, dispatch and kernel
    # launches catch up, which is where a launch-bound small model's step goes.
    idle = "framework (python, autograd, dispatch)" if dev.type != "cuda" else \
        "no kernel running (python, dispatch, launches)"
    shares[idle] = max(0.0, 1.0 - kernel_total / wall)
    return shares


def attention_backends(cfg: RunConfig, device: torch.device, gen: torch.Generator) -> None:
    """Per-layer forward + backward of the model's causal attention, alone, under each SDPA
    backend that runs here, alternated: whether the fused kernel the model takes (the default
    dispatch) is the fastest one at this shape, or a slower one is part of the gap."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    m = cfg.model
    shape = (cfg.train.batch_size, m.n_heads, m.context, m.head_dim)
    q, k, v = (torch.randn(*shape, device=device, generator=gen, requires_grad=True) for _ in range(3))
    backends = {"default dispatch (the model's)": None, "flash": SDPBackend.FLASH_ATTENTION,
                "math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION}

    def once(backend) -> None:
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    times: dict[str, list[float]] = {}
    for name, backend in backends.items():
        # On CUDA a backend that cannot take float32 warns once per reason before it raises (six
        # UserWarnings on an H200); the "no kernel here" line below already says which did not run.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                once(backend)  # warm-up, and whether this backend runs here at all
            except RuntimeError:
                continue
        times[name] = []
    for _ in range(5):
        for name in times:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(10):
                once(backends[name])
            sync(device)
            times[name].append((time.perf_counter() - t0) / 10)
    base = median(times["default dispatch (the model's)"])
    print(f"   attention alone, {' x '.join(map(str, shape))} (B x H x T x d_head), causal, forward + backward "
          f"per layer (5 alternated rounds, medians):")
    for name, ts in times.items():
        print(f"     {name:<34}{median(ts) * 1e3:>8.2f} ms  {median(ts) / base:>6.2f}x")
    if missing := [name for name in backends if name not in times]:
        print(f"     (no kernel here for: {', '.join(missing)})")


def batch_line(cfg: RunConfig, device: torch.device, big: torch.Tensor, steps: int, rounds: int
               ) -> tuple[dict[int, float], list[tuple[float, float]], float] | None:
    """Step time at half, once and twice the config's batch (a Trainer each, alternated blocks,
    medians), the least-squares line ``t = fixed + per_row * B`` through each round's three
    times (a round's blocks run back to back, so the host's drift between rounds stays out of
    its line), and the peak matmul rate timed in the same rounds. None for a batch of 1 (no
    half batch). The fixed part is an extrapolation to batch 0, so its spread over the rounds
    is several times the step times' own: read it with that spread.

    The fixed part is what a step costs whatever its batch (Python, dispatch, autograd, the
    optimiser, the kernels' per-call set-up); the per-row part is the work that grows with the
    tokens. The profiler cannot give the first: it inflates short ops (on the AMD EPYC, GELU's
    forward and backward took 3.2 ms a step under it, where swapping GELU for ReLU saved 0.8 ms
    unprofiled).
    """
    B = cfg.train.batch_size
    if B < 2:
        return None
    trainers = {b: Trainer(replace_section(cfg, "train", batch_size=b), device) for b in (B // 2, B, 2 * B)}
    for t in trainers.values():
        t.timed(2)  # warm-up: each batch size's buffers
    times: dict[int, list[float]] = {b: [] for b in trainers}
    peak = []
    for r in range(rounds):
        for b in (list(trainers) if r % 2 == 0 else list(reversed(trainers))):
            times[b].append(trainers[b].timed(steps))
        peak.append(mm_rate(big, big, device, min_time=0.2))
    lines = [line_through({b: v[r] for b, v in times.items()}) for r in range(rounds)]
    return {b: median(v) for b, v in times.items()}, lines, median(peak)


def line_through(points: dict[int, float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through ``{x: y}``, two points or more."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def train_run_step_time(cfg: RunConfig, steps: int, tmp: str) -> float:
    """Per-step wall time inside train_run(recording=False), from its progress callback."""
    stamps: dict[int, float] = {}

    def progress(step: int, total: int, loss: float) -> None:
        stamps[step] = time.perf_counter()

    path = tempfile.mkdtemp(dir=tmp, suffix=".zarr")
    result = train_run(cfg, path, progress=progress, recording=False)
    if result.status != "completed":  # a step time of a run cut short, or an IndexError below
        raise SystemExit(f"bench train: the train_run ended {result.status} after {result.steps_done} of "
                         f"{cfg.train.steps} steps; no step time is measured on it")
    marks = sorted(s for s in stamps if 10 <= s < cfg.train.steps)  # step 0 records; skip it
    return (stamps[marks[-1]] - stamps[marks[0]]) / (marks[-1] - marks[0])


def worker(args: argparse.Namespace) -> int:
    """Subprocess mode for the thread and allocator comparisons: print one step time as JSON."""
    torch.set_num_threads(args.threads)
    cfg = make_cfg(args)
    trainer = Trainer(cfg, torch.device("cpu"), keep_memory=not args.glibc_default)
    trainer.timed(2)
    times = [trainer.timed(args.steps) for _ in range(args.repeats)]
    faults, sys_s = trainer.faults(args.steps)
    # VmHWM, not ru_maxrss: a spawned worker's ru_maxrss starts at its parent's peak, so both
    # malloc settings showed the parent's figure (peak_rss_bytes)
    peak_mib = peak_rss_bytes() / 2**20
    print(json.dumps({"step_s": median(times), "faults": faults, "sys_s": sys_s, "peak_mib": peak_mib}))
    return 0


def run_worker(args: argparse.Namespace, threads: int, env: dict[str, str], extra: tuple[str, ...] = ()) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--threads", str(threads), "--steps", str(args.steps),
           "--repeats", "3", *extra] + (["--config", args.config] if args.config else []) \
        + [f"--set={t}" for t in args.set]
    env = {k: val for k, val in os.environ.items() if k != "OMP_WAIT_POLICY"} | env
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def threads_compare(args: argparse.Namespace, rounds: int) -> dict[str, float]:
    variants = {
        "1 thread": {"threads": 1, "env": {"OMP_NUM_THREADS": "1"}},
        "2 threads": {"threads": 2, "env": {"OMP_NUM_THREADS": "2"}},
        "2 threads, OMP_WAIT_POLICY=PASSIVE": {"threads": 2, "env": {"OMP_NUM_THREADS": "2",
                                                                     "OMP_WAIT_POLICY": "PASSIVE"}},
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            v = variants[name]
            times[name].append(run_worker(args, v["threads"], v["env"])["step_s"])
    return {k: median(v) for k, v in times.items()}


ALLOCATORS = {"glibc default": ("--glibc-default",), "train.py's (dynamics.allocator)": ()}


def allocator_compare(args: argparse.Namespace, rounds: int) -> dict[str, dict[str, float]]:
    """Medians of step time, minor page faults and system time per step, and peak resident
    memory, under each of ALLOCATORS, in fresh workers alternated."""
    got: dict[str, list[dict]] = {k: [] for k in ALLOCATORS}
    for r in range(rounds):
        for name in (list(ALLOCATORS) if r % 2 == 0 else list(reversed(ALLOCATORS))):
            got[name].append(run_worker(args, args.threads, {"OMP_NUM_THREADS": str(args.threads)}, ALLOCATORS[name]))
    return {k: {key: median([g[key] for g in v]) for key in v[0]} for k, v in got.items()}


def make_cfg(args: argparse.Namespace) -> RunConfig:
    for t in args.set:
        # replaced below by --device and --threads: `--set train.device=cuda` ran on the CPU, its
        # header echoing the --set
        key = t.split("=", 1)[0].strip()
        if key in ("train.device", "train.threads"):
            flag = "--" + key.split(".")[1]
            raise ConfigError(f"--set {key}: this bench sets it from {flag}; pass {flag} instead")
    cfg = load_config(args.config, args.set) if args.config else \
        with_values(RunConfig(), dict(parse_override(t) for t in args.set))
    check_step_config(cfg, f"--config {args.config}" if args.config else "--set")
    # train_run sets torch's threads from train.threads: keep it equal to --threads
    return replace_section(cfg, "train", device=args.device, threads=args.threads)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--config", default=None, help="experiment TOML (default: RunConfig() defaults)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config key, as in `dynamics run` (e.g. model.d_model=128)")
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch intra-op threads on cpu (sweeps use 1)")
    parser.add_argument("--steps", type=at_least(1), default=5, help="training steps per timed block")
    parser.add_argument("--repeats", type=at_least(1), default=7, help="alternated blocks per measurement")
    parser.add_argument("--peak-n", type=at_least(1), default=None, help="size of the peak matmul (2048 cpu, 8192 cuda)")
    parser.add_argument("--run-steps", type=int, default=100,
                        help=f"steps of each train_run in the loop comparison (at least {MIN_RUN_STEPS})")
    parser.add_argument("--pairs", type=at_least(1), default=5, help="alternated train_run / bare pairs")
    parser.add_argument("--compile", action="store_true",
                        help="also time a torch.compile'd model, alternated with the eager one")
    parser.add_argument("--no-threads", action="store_true", help="skip the 1 vs 2 threads comparison")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiler breakdown")
    parser.add_argument("--no-batch-line", action="store_true",
                        help="skip the step time at half and twice the batch (fixed vs per-row cost)")
    parser.add_argument("--no-train-run", action="store_true", help="skip train_run vs bare loop")
    parser.add_argument("--no-allocator", action="store_true",
                        help="skip glibc's default malloc thresholds vs train.py's")
    parser.add_argument("--allocator-rounds", type=at_least(1), default=4,
                        help="alternated rounds of that comparison (two fresh workers each)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--glibc-default", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if not args.no_train_run and args.run_steps < MIN_RUN_STEPS:
        parser.error(f"argument --run-steps: must be at least {MIN_RUN_STEPS} for the train_run comparison "
                     f"(its progress comes every 10 steps), got {args.run_steps}; or pass --no-train-run")

    try:
        cfg = make_cfg(args)
        check_device(args.device)
    except (ConfigError, UsageError) as e:
        return bad_input(str(e))
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    m, B = cfg.model, cfg.train.batch_size
    tokens_per_step = B * m.context
    trainer = Trainer(cfg, device)
    fpt, n_params = flops_per_token(cfg, trainer.model)
    peak_n = args.peak_n or (8192 if device.type == "cuda" else 2048)
    gen = torch.Generator(device=device).manual_seed(0)
    big = torch.randn(peak_n, peak_n, device=device, generator=gen)

    where = f"cpu, {args.threads} thread(s) of {cpus()} ({cpu_name()})" if device.type == "cpu" \
        else torch.cuda.get_device_name(device)
    source = ("--config " + args.config if args.config else "RunConfig() defaults") + \
        "".join(f" --set {t}" for t in args.set)
    print(f"model: {source}: L={m.n_layers} "
          f"d_model={m.d_model} H={m.n_heads} d_head={m.head_dim} d_mlp={0 if m.attn_only else m.d_mlp} "
          f"V={m.vocab_size} T={m.context} pos={m.pos}; batch {B} = {tokens_per_step} tokens/step; "
          f"torch {torch.__version__}")
    print(f"device: {where}; {load_line()} at start")
    print(f"FLOPs/token = 6 x {n_params} + 6 L (T+1) H d_head = {fpt / 1e6:.2f} MFLOP "
          f"({attention_flops_per_token(m) / fpt:.0%} attention, causal triangle)")
    # What other conventions would add, so the MFU can be compared with theirs.
    square = 12.0 * m.n_layers * m.context * m.n_heads * m.head_dim - attention_flops_per_token(m)
    small = sum(p.numel() for p in trainer.model.optim_parameters() if p.ndim < 2)
    print(f"   counting QK^T and AV over the full T x T square (PaLM) would add {square / fpt:.1%}; "
          f"counting the {small} biases and LayerNorm parameters as weights (6 FLOPs each) {6.0 * small / fpt:.1%}")

    # ---- 1. throughput and MFU: training blocks alternated with the peak matmul
    trainer.timed(3)  # warm-up: allocator, kernels, lazy inits
    compiled = None
    if args.compile:
        # Same weights and data stream, forward (and so backward) through Inductor.
        compiled = Trainer(cfg, device)
        compiled.model.forward = torch.compile(compiled.model.forward, dynamic=False)
        t0 = time.perf_counter()
        compiled.timed(3)
        compile_s = time.perf_counter() - t0
    step_t, peak, comp_t = [], [], []
    mm_rate(big, big, device, min_time=0.2)  # warm-up: the first big matmul pays for its buffers
    for _ in range(args.repeats):
        step_t.append(trainer.timed(args.steps))
        peak.append(mm_rate(big, big, device, min_time=0.2))
        if compiled is not None:
            comp_t.append(compiled.timed(args.steps))
    t_step, peak_rate = median(step_t), median(peak)
    tok_s = tokens_per_step / t_step
    mfu = tok_s * fpt / peak_rate
    print(f"\n1. throughput ({args.repeats} alternated blocks of {args.steps} steps, medians)")
    print(f"   step {t_step * 1e3:.1f} ms = {tok_s:,.0f} tokens/s; peak mm {peak_n}^2 float32 "
          f"{peak_rate / 1e9:.1f} GFLOP/s" + ("   [absolute: reference only on a shared CPU]" if device.type == "cpu" else ""))
    print(f"   MFU = {mfu:.1%} of the peak matmul rate measured alongside  (goal >= 50%)")
    if device.type == "cpu":
        faults, sys_s = trainer.faults(args.steps)
        print(f"   minor page faults: {faults:,.0f} a step, system time {sys_s * 1e3:.2f} ms a step, "
              + ("with train.py's malloc thresholds" if keep_freed_memory() else
                 "malloc as it was: the C library is not glibc, or it refused train.py's thresholds"))
    if compiled is not None:
        t_comp = median(comp_t)
        print(f"   torch.compile(model.forward), alternated with the eager blocks: step {t_comp * 1e3:.1f} ms, "
              f"MFU {tokens_per_step / t_comp * fpt / peak_rate:.1%}, speed-up {t_step / t_comp:.2f}x over eager; "
              f"compiling and its first 3 steps took {compile_s:.1f} s (Inductor's cache warms on later runs)")

    # ---- 2. where the gap is
    print("\n2. where the step goes")
    phases: dict[str, list[float]] = {}
    for _ in range(args.repeats * args.steps):
        trainer.step(phases)
    ph = {k: median(v) for k, v in phases.items()}
    total = sum(ph.values())
    print("   phase      " + "".join(f"{p:>11}" for p in PHASES))
    print("   share      " + "".join(f"{ph[p] / total:>11.1%}" for p in PHASES))
    if not args.no_batch_line and (fit := batch_line(cfg, device, big, args.steps, args.repeats)) is not None:
        t_b, lines, p_b = fit
        fixed, per_row = median([a for a, _ in lines]), median([b for _, b in lines])
        lo, hi = min(a for a, _ in lines), max(a for a, _ in lines)
        flops_row = fpt * m.context  # counted FLOPs of one row of the batch
        print(f"   step time at batch {' / '.join(map(str, t_b))}: {' / '.join(f'{v * 1e3:.1f}' for v in t_b.values())} ms "
              f"({args.repeats} alternated rounds, medians); the least-squares line through each round's three: "
              f"{fixed * 1e3:.2f} ms + {per_row * 1e3:.3f} ms a row (medians; the first term {lo * 1e3:.2f} to "
              f"{hi * 1e3:.2f} ms over the rounds)")
        print(f"   its {fixed * 1e3:.2f} ms, {fixed / t_b[B]:.0%} of the step at batch {B}, do not grow with the batch "
              f"(Python, dispatch, autograd, each kernel's set-up, the optimiser); the rows' own {per_row * 1e3:.3f} ms run at "
              f"MFU {flops_row / per_row / p_b:.1%}: what the MFU approaches as the batch grows, while the line holds")

    rows = model_gemms(cfg)
    rates: dict[str, list[float]] = {name: [] for name, *_ in rows}
    peak2, step2 = [], []
    operands = {name: (torch.randn(M, K, device=device, generator=gen), torch.randn(K, N, device=device, generator=gen))
                for name, M, K, N, _ in rows}
    for _ in range(3):  # each round: a training block, every shape, the peak (so load drifts cancel)
        step2.append(trainer.timed(args.steps))
        for name, *_ in rows:
            rates[name].append(mm_rate(*operands[name], device))
        peak2.append(mm_rate(big, big, device, min_time=0.2))
    p2, t2 = median(peak2), median(step2)
    gemm_flops = sum(2.0 * M * K * N * c for _, M, K, N, c in rows)
    gemm_time = sum(2.0 * M * K * N * c / median(rates[name]) for name, M, K, N, c in rows)
    print("   dense matmul (fwd shape)  GFLOP/step   rate / peak")
    for name, M, K, N, c in rows:
        print(f"   {name:<9}{f'{M}x{K} @ {K}x{N}':>19}{2.0 * M * K * N * c / 1e9:>11.3f}{median(rates[name]) / p2:>14.0%}")
    print(f"   dense matmuls: {gemm_flops / (fpt * tokens_per_step):.0%} of the counted FLOPs, at {gemm_flops / gemm_time / p2:.0%} "
          f"of peak (FLOP-weighted) on their own: small shapes are not the gap. At those rates they would take "
          f"{gemm_time / t2:.0%} of a step (step timed alongside); the rest of the step is the gap.")
    del operands
    attention_backends(cfg, device, gen)

    if not args.no_profile:
        try:
            shares = profile_breakdown(trainer, max(3, args.steps))
            print("   forward + backward, profiler self time (share of their wall time):")
            for k, v in sorted(shares.items(), key=lambda kv: -kv[1]):
                print(f"     {k:<60}{v:>7.1%}")
        except Exception as e:  # the profiler is optional diagnostics
            print(f"   profiler breakdown unavailable: {type(e).__name__}: {e}")

    # ---- 3. train_run's loop against the bare step
    if not args.no_train_run:
        run_cfg = replace_section(cfg, "train", steps=args.run_steps)
        bare, loop = [], []
        with tempfile.TemporaryDirectory() as tmp:
            train_run_step_time(run_cfg, args.run_steps, tmp)  # warm-up: first-run costs in this process
            for r in range(args.pairs):
                for which in (("bare", "run") if r % 2 == 0 else ("run", "bare")):
                    if which == "bare":
                        bare.append(trainer.timed(args.run_steps // 3))
                    else:
                        loop.append(train_run_step_time(run_cfg, args.run_steps, tmp))
        ratios = sorted(a / b for a, b in zip(loop, bare, strict=True))
        print(f"\n3. train_run(recording=False) step / bare step = {median(loop) / median(bare):.3f} "
              f"(medians of {args.pairs} alternated pairs, {args.run_steps}-step runs; per-pair ratios "
              f"{ratios[0]:.2f}..{ratios[-1]:.2f}; >1 is train.py's loop overhead)")

    # ---- 4. threads
    if device.type == "cpu" and not args.no_threads:
        t = threads_compare(args, rounds=3)
        base = t["1 thread"]
        print("\n4. intra-op threads (fresh process each, 3 alternated rounds, step time relative to 1 thread)")
        for k, v in t.items():
            print(f"   {k:<36}{v / base:>7.2f}x")

    # ---- 5. malloc thresholds
    if device.type == "cpu" and not args.no_allocator:
        if not keep_freed_memory():
            print("\n5. malloc thresholds: not compared: the C library is not glibc, or it refused train.py's")
        else:
            a = allocator_compare(args, rounds=args.allocator_rounds)
            base = a["glibc default"]["step_s"]
            print(f"\n5. malloc thresholds, {args.threads} thread(s) (fresh process each, {args.allocator_rounds} "
                  f"alternated rounds, medians)")
            print(f"   {'':<34}{'step / default':>15}{'page faults a step':>20}{'system ms a step':>18}"
                  f"{'peak RSS MiB':>14}")
            for k, v in a.items():
                print(f"   {k:<34}{v['step_s'] / base:>14.3f}x{v['faults']:>20,.0f}{v['sys_s'] * 1e3:>18.2f}"
                      f"{v['peak_mib']:>14,.0f}")
    print(f"\n{load_line()} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
