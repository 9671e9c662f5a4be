"""How far float rounding moves a sweep: two analysed stores of the same runs, compared run by run.

    python bench/rounding.py STORE_A STORE_B

The same config and seed give bitwise the same arrays on one machine, but another CPU runs
other vectorised kernels (AVX-512 against AVX2, another BLAS), which round differently. To see
what that does to the results, train the same sweep twice with only the kernels changed, e.g.
on one x86 machine::

    dynamics demo --out a.zarr
    ATEN_CPU_CAPABILITY=avx2 dynamics demo --out b.zarr
    python bench/rounding.py a.zarr b.zarr

Printed, for each run both stores hold (matched by run id, which the kernels do not enter): its
swept values, the first training step whose loss differs, the largest relative difference of
the training loss, the largest absolute difference of the final snapshot's attention weights
(inf where one store has a value the other lacks: a run diverged in one only), and how many
heads' final roles differ (both stores must be analysed by this version). A run
whose attention differs by ~1 at the end went elsewhere: rounding differences grew, not shrank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `bench._common` and `dynamics` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Parser, bad_input  # noqa: E402


def compare_run(a: str, b: str, run_id: str) -> dict:
    """The differences between `run_id` in stores `a` and `b` (see the module docstring)."""
    from dynamics import store
    from dynamics.analysis.pipeline import is_current

    x, y = store.open_run(a, run_id), store.open_run(b, run_id)
    la, lb = x.loss.values.astype(np.float64), y.loss.values.astype(np.float64)  # (train_step,)
    n = min(la.size, lb.size)
    la, lb = la[:n], lb[:n]
    differ = ~((la == lb) | (np.isnan(la) & np.isnan(lb)))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(la - lb) / np.abs(lb)
    # A value one store lacks (a run diverged in one only) is as far apart as can be; nanmax
    # below would pass over it, and a run gone elsewhere would print no difference.
    rel[np.isnan(la) != np.isnan(lb)] = np.inf
    # float16 maps at the last snapshot either run wrote: (layer, head, probe, query, key). Not the
    # schedule's last slot: a run that diverged never wrote it, and two identical diverged runs
    # compared all-NaN maps there ("nan", not 0); a snapshot one run lacks still counts as inf.
    n_snap = min(x.sizes["snapshot"], y.sizes["snapshot"])
    written = [np.flatnonzero(d.attention.isel(snapshot=slice(0, n_snap)).notnull()
                              .any([k for k in d.attention.dims if k != "snapshot"]).values) for d in (x, y)]
    last = max((int(w[-1]) for w in written if w.size), default=n_snap - 1)
    ma = x.attention.isel(snapshot=last).values.astype(np.float32)
    mb = y.attention.isel(snapshot=last).values.astype(np.float32)
    att = np.where(np.isnan(ma) != np.isnan(mb), np.inf, np.abs(ma - mb))
    roles = None
    xa, ya = store.open_analysis(a, run_id), store.open_analysis(b, run_id)
    if xa is not None and ya is not None and is_current(xa) and is_current(ya):
        roles = int((xa.role.isel(snapshot=-1).values != ya.role.isel(snapshot=-1).values).sum())
    return {
        "run": run_id,
        "first_step": int(np.argmax(differ)) if differ.any() else None,
        "loss_rel": float(np.nanmax(rel)) if differ.any() else 0.0,
        "attention": float(np.nanmax(att)) if att.size else 0.0,
        "roles": roles,
        "heads": int(x.sizes["layer"] * x.sizes["head"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("store_a")
    parser.add_argument("store_b")
    args = parser.parse_args(argv)
    from dynamics import store

    for p in (args.store_a, args.store_b):
        if not store.is_store(p):
            return bad_input(f"{p} is not a dynamics store")
    try:
        return _compare(args.store_a, args.store_b)
    except store.StoreError as e:  # a damaged run: one line, as bad input gets, not a traceback
        return bad_input(str(e))


def _compare(store_a: str, store_b: str) -> int:
    from dynamics import store

    common = sorted(set(store.list_runs(store_a)) & set(store.list_runs(store_b)))
    if not common:
        return bad_input(f"{store_a} and {store_b} hold no run in common")
    values = {r: store.run_attrs(store_a, r).get("sweep_values") or {} for r in common}
    swept = {r: " ".join(f"{k}={v}" for k, v in values[r].items()) for r in common}
    # in grid order, numbers as numbers
    common.sort(key=lambda r: (tuple((0, v, "") if isinstance(v, int | float) else (1, 0, str(v))
                                     for v in values[r].values()), r))
    print(f"{'run':<13}{'swept':<28}{'first step':>11}{'loss rel':>10}{'attention':>10}{'roles':>8}")
    total, heads, unknown = 0, 0, False
    for run_id in common:
        d = compare_run(store_a, store_b, run_id)
        roles = "-" if d["roles"] is None else f"{d['roles']}/{d['heads']}"
        first = "none" if d["first_step"] is None else str(d["first_step"])
        print(f"{run_id:<13}{swept[run_id]:<28}{first:>11}{d['loss_rel']:>10.2e}{d['attention']:>10.3g}{roles:>8}")
        if d["roles"] is None:
            unknown = True
        else:
            total, heads = total + d["roles"], heads + d["heads"]
    print(f"final roles differing: {total} of {heads} heads" + (" (runs marked - are not analysed in both)" if unknown else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
