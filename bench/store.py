"""Which codec should the store use? Write one realistic run with each and compare.

    python bench/store.py [--snapshots 30] [--repeats 3]

The run mirrors what the recorder writes for the default model (2 layers, 4 heads, 8 probes,
context 64): float16 attention maps, per-head gradient norms and cosines, importance, gates,
per-head W_Q/W_K/W_V/W_O slices (float32), eval loss per component and the per-step loss.
Attention maps are causal softmax rows (upper triangle exactly 0) that sharpen over training
from near-uniform to peaky, with a mix of head types (previous token, sink, self, content), as
real recordings do. Every codec writes the same arrays through ``RunWriter`` into a fresh
local store; write time (all snapshots and the loss) and read time (open_run + load) are
the best of --repeats; sizes are the chunk bytes on disk. At these chunk sizes throughput is
bounded by per-chunk file and task overhead as much as by the codec.
Printed per codec: bytes per snapshot (all arrays, and attention alone), compression ratio
(raw / stored), write throughput in MB/s of raw data (wall clock, and per CPU-second of the
whole process, which other load on the machine does not distort), read throughput (just after
the write, so from the page cache, not the disk), and the
codec the store uses next to the rule it was chosen by.

Then the root index (``--index-runs``): the store's root zarr.json indexes every group, and a
run rewrites it at each of its checkpoints, under the store lock. One update (of one run's
entry) is timed with the store holding that many runs and their analyses, the entries copies
of a run written here with the default config in its attributes, against validating and
serialising the whole root through zarr, as the store did before (median of 5 each, alternated).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Parser, at_least, cpus  # noqa: E402
from dynamics import store  # noqa: E402
from dynamics.store.writer import COMPRESSORS  # noqa: E402

L, H, P, T, D_MODEL, D_HEAD, STEPS = 2, 4, 8, 64, 64, 16, 3000


def attention_maps(rng: np.random.Generator, sharpness: float) -> np.ndarray:
    """(L, H, P, T, T) causal softmax rows; `sharpness` in [0, 1] goes from early to trained."""
    q = np.arange(T)[:, None]
    k = np.arange(T)[None, :]
    logits = rng.normal(0.0, 0.5 + 3.0 * sharpness, size=(L, H, P, T, T))
    bump = 2.0 + 10.0 * sharpness
    kinds = ["prev", "sink", "self", "content"]
    for layer in range(L):
        for head in range(H):
            kind = kinds[(layer * H + head) % len(kinds)]
            if kind == "prev":
                logits[layer, head] += bump * (k == q - 1)
            elif kind == "sink":
                logits[layer, head] += bump * (k == 0)
            elif kind == "self":
                logits[layer, head] += bump * (k == q)
            else:  # content: a few keys per probe attract every later query
                hot = rng.random((P, 1, T)) < 0.08
                logits[layer, head] += bump * hot
    logits = np.where(k <= q, logits, -np.inf)
    logits -= logits.max(axis=-1, keepdims=True)
    w = np.exp(logits)
    return (w / w.sum(axis=-1, keepdims=True)).astype(np.float16)


def make_run(n_snap: int, seed: int = 0) -> tuple[dict, dict, list[dict], np.ndarray]:
    rng = np.random.default_rng(seed)
    snap = ("snapshot", "layer", "head")
    variables = {
        "attention": ((*snap, "probe", "query", "key"), (n_snap, L, H, P, T, T), "float16"),
        "grad_norm": ((*snap, "weight"), (n_snap, L, H, 4), "float32"),
        "grad_cosine": ((*snap, "weight"), (n_snap, L, H, 4), "float32"),
        "importance": (snap, (n_snap, L, H), "float32"),
        "gate": (snap, (n_snap, L, H), "float32"),
        "head_weights": ((*snap, "weight", "d_model", "d_head"), (n_snap, L, H, 4, D_MODEL, D_HEAD), "float32"),
        "eval_loss": (("snapshot", "component"), (n_snap, 2), "float32"),
        "loss": (("train_step",), (STEPS,), "float32"),
    }
    steps = np.unique(np.linspace(0, STEPS - 1, n_snap).astype(int))
    coords = {
        "step": ("snapshot", steps[:n_snap] if len(steps) >= n_snap else np.arange(n_snap)),
        "layer": ("layer", np.arange(L)),
        "head": ("head", np.arange(H)),
        "weight": ("weight", np.array(["q", "k", "v", "o"])),
        "component": ("component", np.array(["induction", "markov"])),
        "train_step": ("train_step", np.arange(STEPS)),
    }
    weights = rng.normal(0, 0.1, size=(L, H, 4, D_MODEL, D_HEAD)).astype(np.float32)
    snapshots = []
    for i in range(n_snap):
        s = i / max(n_snap - 1, 1)
        weights = weights + rng.normal(0, 0.01, size=weights.shape).astype(np.float32)
        snapshots.append(
            {
                "attention": attention_maps(rng, s),
                "grad_norm": rng.gamma(2.0, 0.1 * (1 - 0.8 * s), size=(L, H, 4)).astype(np.float32),
                "grad_cosine": rng.uniform(-1, 1, size=(L, H, 4)).astype(np.float32),
                "importance": rng.random((L, H)).astype(np.float32),
                "gate": np.ones((L, H), np.float32),
                "head_weights": weights.copy(),
                "eval_loss": (4.0 - 2.5 * s + rng.normal(0, 0.05, 2)).astype(np.float32),
            }
        )
    loss = (4.0 * np.exp(-np.arange(STEPS) / 800) + 1.0 + rng.normal(0, 0.05, STEPS)).astype(np.float32)
    return variables, coords, snapshots, loss


def dir_bytes(path: Path, exclude: str = "zarr.json") -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.name != exclude)


def checksum_against_zstd(attention: np.ndarray) -> tuple[float, float, int]:
    """Microseconds to checksum one zstd-1 attention chunk (google-crc32c, which zarr's Crc32cCodec
    calls) and to decode it (numcodecs' Zstd, which its ZstdCodec calls), and the chunk's size."""
    import google_crc32c
    import numcodecs

    zstd = numcodecs.Zstd(level=1)
    chunk = zstd.encode(attention.tobytes())
    times: dict[str, list[float]] = {"crc": [], "zstd": []}
    for _ in range(200):
        for name, fn in (("crc", lambda: google_crc32c.value(chunk)), ("zstd", lambda: zstd.decode(chunk))):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return float(np.median(times["crc"])) * 1e6, float(np.median(times["zstd"])) * 1e6, len(chunk)


def bench_codec(codec: str, variables, coords, snapshots, loss, repeats: int, tmp: Path) -> dict:
    best_write = best_read = best_cpu = float("inf")
    for r in range(repeats):
        path = Path(tempfile.mkdtemp(dir=tmp)) / f"{codec}-{r}.zarr"  # a codec may be timed in several rounds
        writer = store.RunWriter(path, "run", variables=variables, coords=coords, attrs={}, codec=codec)
        t0, c0 = time.perf_counter(), time.process_time()
        for i, arrays in enumerate(snapshots):
            writer.write_snapshot(i, arrays)
        writer.write_region("loss", 0, loss)
        best_write = min(best_write, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)  # all threads: robust to other load
        t0 = time.perf_counter()
        ds = store.open_run(path).load()  # the analysers' path: lazy open, dask load
        best_read = min(best_read, time.perf_counter() - t0)
    run_dir = path / "runs" / "run"
    for name in ("attention", "head_weights"):  # the codec must be lossless
        np.testing.assert_array_equal(ds[name].values, np.stack([s[name] for s in snapshots]))
    data_names = [n for n in variables if n != "loss"]
    raw = sum(s[n].nbytes for s in snapshots for n in data_names) + loss.nbytes
    stored = sum(dir_bytes(run_dir / n) for n in variables)
    att_raw = sum(s["attention"].nbytes for s in snapshots)
    att_stored = dir_bytes(run_dir / "attention")
    return {
        "codec": codec,
        "bytes_per_snapshot": stored / len(snapshots),
        "attention_bytes_per_snapshot": att_stored / len(snapshots),
        "ratio": raw / stored,
        "attention_ratio": att_raw / att_stored,
        "write_mb_s": raw / best_write / 1e6,
        "write_mb_cpu_s": raw / best_cpu / 1e6,
        "read_mb_s": raw / best_read / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshots", type=at_least(1), default=30)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--index-runs", type=at_least(1), nargs="+", default=[12, 100, 500],
                        help="runs in the store for the root index's update time (default: 12 100 500)")
    args = parser.parse_args(argv)

    variables, coords, snapshots, loss = make_run(args.snapshots)
    raw_snap = sum(a.nbytes for a in snapshots[0].values())
    print(
        f"run: {args.snapshots} snapshots of L={L} H={H} P={P} T={T} (attention float16), "
        f"{raw_snap / 1e3:.0f} kB raw per snapshot, {STEPS} loss steps; {cpus()}"
    )
    rows = []
    bare_name = f"{store.DEFAULT_CODEC}, no crc32c"
    with tempfile.TemporaryDirectory() as tmp:
        # untimed: the first write and read of a process pay zarr's and the codecs' first use, which
        # fell on the first codec listed ("none" read 0.81 s against 0.03 s for the rest)
        # (a run of its own: the first 2 of these snapshots, in a store declared for all, read back
        # as many snapshots as declared and failed the losslessness check beyond --snapshots 2)
        bench_codec(store.DEFAULT_CODEC, *make_run(2, seed=1), 1, Path(tmp))
        for codec in store.CODECS:
            rows.append(bench_codec(codec, variables, coords, snapshots, loss, args.repeats, Path(tmp)))
        # What the checksum costs: the store's codec without it (offered here only, not in the rule),
        # alternated with the store's in 3 rounds, the best of each kept, as within bench_codec.
        store.CODECS[bare_name] = COMPRESSORS[store.DEFAULT_CODEC]
        try:
            pair = {store.DEFAULT_CODEC: [], bare_name: []}
            for i in range(3):
                for name in list(pair)[:: 1 if i % 2 == 0 else -1]:  # alternated: neither always runs first
                    pair[name].append(bench_codec(name, variables, coords, snapshots, loss, args.repeats, Path(tmp)))
        finally:
            del store.CODECS[bare_name]
        with_crc, bare = ({k: (max(r[k] for r in runs) if isinstance(runs[0][k], float) else runs[0][k])
                           for k in runs[0]} for runs in pair.values())

    header = (
        f"{'codec':<26}{'kB/snap':>9}{'attn kB/snap':>14}{'ratio':>8}{'attn ratio':>12}"
        f"{'write MB/s':>12}{'MB/cpu-s':>10}{'read MB/s':>11}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        mark = "  <- store" if r["codec"] == store.DEFAULT_CODEC else ""
        print(
            f"{r['codec']:<26}{r['bytes_per_snapshot'] / 1e3:>9.1f}{r['attention_bytes_per_snapshot'] / 1e3:>14.1f}"
            f"{r['ratio']:>8.2f}{r['attention_ratio']:>12.2f}{r['write_mb_s']:>12.0f}{r['write_mb_cpu_s']:>10.0f}"
            f"{r['read_mb_s']:>11.0f}{mark}"
        )
    # The pair side by side, each the best of its 3 rounds: the rows above are the best of one
    # round each, so the bare row was not to be read against the store's row there.
    for r, note in ((with_crc, "(with its crc32c, as every codec above;"), (bare, " the same rounds without it)")):
        print(
            f"{r['codec'] + (' (paired)' if r is with_crc else ''):<26}{r['bytes_per_snapshot'] / 1e3:>9.1f}"
            f"{r['attention_bytes_per_snapshot'] / 1e3:>14.1f}{r['ratio']:>8.2f}{r['attention_ratio']:>12.2f}"
            f"{r['write_mb_s']:>12.0f}{r['write_mb_cpu_s']:>10.0f}{r['read_mb_s']:>11.0f}  {note}"
        )
    chosen = next(r for r in rows if r["codec"] == store.DEFAULT_CODEC)
    print(
        f"\ncrc32c on every chunk: {with_crc['bytes_per_snapshot'] - bare['bytes_per_snapshot']:.0f} bytes a snapshot; "
        f"in 3 alternated rounds (best of each), {store.DEFAULT_CODEC} with it writes "
        f"{with_crc['write_mb_cpu_s'] / bare['write_mb_cpu_s']:.2f}x the MB per CPU-second without it "
        f"({with_crc['write_mb_s'] / bare['write_mb_s']:.2f}x wall) and reads {with_crc['read_mb_s'] / bare['read_mb_s']:.2f}x the MB/s"
    )
    crc_us, zstd_us, size = checksum_against_zstd(snapshots[-1]["attention"])
    print(f"   alone, on one attention chunk ({size / 1e3:.0f} kB compressed): the checksum {crc_us:.0f} us, "
          f"zstd's decoding {zstd_us:.0f} us ({crc_us / zstd_us:.1%}; median of 200 calls each, alternated)")
    best = max(rows, key=lambda r: r["ratio"])
    # the rule: least CPU per MB among the codecs within 5% of the best ratio
    near = [r for r in rows if r["ratio"] >= 0.95 * best["ratio"]]
    rule = max(near, key=lambda r: r["write_mb_cpu_s"])
    print(
        f"\nstore uses: {store.DEFAULT_CODEC} (ratio {chosen['ratio']:.2f}, {chosen['write_mb_cpu_s']:.0f} MB/cpu-s, "
        f"{chosen['write_mb_s']:.0f} MB/s wall)"
    )
    print(f"best ratio: {best['codec']} ({best['ratio']:.2f}, {best['write_mb_cpu_s']:.0f} MB/cpu-s)")
    print(
        f"least CPU within 5% of the best ratio: {rule['codec']}"
        + ("" if rule is chosen else "  (differs from the store's choice)")
    )
    with tempfile.TemporaryDirectory() as tmp:
        bench_index(args.index_runs, Path(tmp))
    return 0


def bench_index(sizes: list[int], tmp: Path) -> None:
    """Print one root-index update's time at each number of runs in the store (see the docstring)."""
    import copy
    import json
    import statistics

    import xarray as xr
    from zarr.buffer import default_buffer_prototype

    from dynamics.config import RunConfig
    from dynamics.store._loc import _Loc
    from dynamics.store._zarr_private import GroupMetadata
    from dynamics.store.index import _index_entries

    path = tmp / "index.zarr"
    variables, coords, snapshots, _ = make_run(2, seed=2)
    w = store.RunWriter(path, "r0", variables=variables, coords=coords,
                        attrs={"status": "completed", "config": RunConfig().to_dict()})
    w.write_snapshot(0, snapshots[0])
    w.finalize()
    # an analysis group beside it, for its index entry (a few of analyse_run's attrs)
    store.write_analysis(path, "r0", xr.Dataset({"importance": (("layer", "head"), snapshots[0]["importance"])},
                                                attrs={"analysis_version": 1, "kappa": 0.5}))
    loc = _Loc(path)
    base = json.loads((path / "zarr.json").read_text())
    run, analysis = (base["consolidated_metadata"]["metadata"][g] for g in ("runs/r0", "analysis/r0"))

    def zarrs_whole_root() -> None:  # the store's write before: the whole root through zarr
        root = json.loads((path / "zarr.json").read_text())
        meta = GroupMetadata.from_dict(copy.deepcopy(root))
        loc.set("zarr.json", meta.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes())

    print("\nroot index: one run's entry updated (the store's _index_entries, at every checkpoint of a run), "
          "against the whole root validated and written through zarr as before (median of 5, alternated)")
    for n in sizes:
        root = copy.deepcopy(base)
        flat = root["consolidated_metadata"]["metadata"]
        for i in range(1, n):
            flat[f"runs/r{i}"], flat[f"analysis/r{i}"] = copy.deepcopy(run), copy.deepcopy(analysis)
        (path / "zarr.json").write_text(json.dumps(root))
        now: list[float] = []
        before: list[float] = []
        calls = ((now, lambda: _index_entries(loc, ["runs/r0"])), (before, zarrs_whole_root))
        for i in range(5):
            for times, call in calls[:: 1 if i % 2 == 0 else -1]:  # alternated: neither always runs first
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
        a, b = statistics.median(now), statistics.median(before)
        size = (path / "zarr.json").stat().st_size
        print(f"  {n:>5} runs ({size / 1024:,.0f} KiB root): {a * 1e3:8.1f} ms; zarr's whole root {b * 1e3:8.1f} ms "
              f"({b / a:.1f}x)")


if __name__ == "__main__":
    raise SystemExit(main())
