"""The tables and summary lines the commands print (``dynamics status``, ``analyse``, ``demo``)."""

from __future__ import annotations

import collections
import sys


def print_table(header: list[str], rows: list[list[str]]) -> None:
    from dynamics.escapes import escaped

    # escaped: a store's values and axis names, from anyone, are printed in it
    header, rows = [escaped(x) for x in header], [[escaped(x) for x in row] for row in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=False)).rstrip())


def print_consistency(path: str, rows: list[dict]) -> None:
    """Cross-seed consistency of the runs `analyse_store` has just analysed (its `rows`), and the
    finished runs it leaves out."""
    from dynamics.analyse import seed_consistency
    from dynamics.schema import FINISHED_STATUSES

    # every completed run analysed by this version but those this command found completed and did
    # not analyse (its analysis failed: it would be counted from an earlier one): the runs finished
    # since it listed them (new, or still training then) too, which another `analyse` may have
    # analysed meanwhile
    compared = [r["run"] for r in rows if not r.get("skipped") and r["status"] == "completed"]
    unanalysed = [r["run"] for r in rows if r["run"] not in compared and (r["status"] == "completed" or r.get("error"))]
    for group, sim, unmatched, n, lone in seed_consistency(path, leave_out=unanalysed):
        # heads are matched within a layer: with one head per layer the two figures are one number
        read = ("one head per layer, so no permutation to undo: how alike the seeds' heads are, with no unmatched "
                "reference to read it against" if lone else
                f"1 = same heads up to permutation; unmatched heads give {unmatched:.3f}")
        print(f"cross-seed consistency {group}: {sim:.3f} over {n} seeds ({read})")
    # Only runs that have a seed to be compared with: on runs of different configs, with no
    # seed group at all, the line listed every diverged run as "left out" of nothing.
    peers = _seed_groups(path, [r["run"] for r in rows if r["status"] in FINISHED_STATUSES])
    from dynamics import store
    from dynamics.grid import grid_key

    key = grid_key(store.read_sweep_index(path) or {})  # in the table's order, not by id (a hash)
    left_out = [f"{r['run']} ({'diverged' if r['status'] == 'diverged' else 'not analysed'})"
                for r in sorted(rows, key=lambda r: key(r["run"]))
                if r["status"] in FINISHED_STATUSES and r["run"] not in compared and peers.get(r["run"], 0) > 1]
    if left_out:
        print(f"cross-seed consistency leaves out {len(left_out)} finished run(s) without a final profile "
              f"(it compares completed, analysed runs): {', '.join(left_out)}")


def _seed_groups(path: str, run_ids: list[str]) -> dict[str, int]:
    """Each run's number of runs (itself included) among ``run_ids`` that differ from it at most in
    their seed (and where they ran): its cross-seed group. A run whose attrs cannot be read is left out."""
    from dynamics import store
    from dynamics.identity import seed_group

    key = {}
    for rid in run_ids:
        try:
            config = store.run_attrs(path, rid).get("config", {})
        except store.StoreError:
            continue
        key[rid] = seed_group(config)
    counts = collections.Counter(key.values())
    return {rid: counts[k] for rid, k in key.items()}


def analysis_failures(rows: list[dict]) -> list[str]:
    """Runs whose analysis raised (the others were analysed), named in one line on stderr."""
    failed = [r["run"] for r in rows if r.get("error")]
    if failed:
        print(f"dynamics: the analysis of {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return failed


def _bifurcation(step: int | str | None, layers: list | None, probes: list | None = None) -> str:
    """The bifurcation cell: the model's step, then its range over resampled probes and each
    layer's step where they differ from it (``100 (probes: 50-150; by layer: 50, 100)``); an
    analysis stored before layers had their own, or before the resamples, leaves those out."""
    def said(s):
        return "never" if s is None else str(s)

    extra = []
    if probes and any(s != step for s in probes):
        extra.append(f"probes: {'-'.join(map(said, probes))}")
    if layers and any(s != step for s in layers):
        extra.append(f"by layer: {', '.join(map(said, layers))}")
    return f"{said(step)} ({'; '.join(extra)})" if extra else said(step)


def print_analysis(rows: list[dict], path: str | None = None, pending: bool = False) -> None:
    from dynamics import store
    from dynamics.caveats import notes
    from dynamics.grid import grid_key
    from dynamics.status import bad_index_entries, row_labels

    # As `dynamics status` lists them: each run's swept values and the settings that tell apart
    # runs with the same ones, in the grid's order (run ids are hashes)
    index = (store.read_sweep_index(path) if path is not None else None) or {}
    swept, key = index.get("runs", {}), grid_key(index)
    if pending:  # sweep points not started yet (a sweep running, or stopped part-way), as status lists them
        listed = {r["run"] for r in rows}
        # an entry no run can have (a hand edit, '../evil') is no point to train: status names it
        bad = bad_index_entries(path, index, listed)
        rows = [*rows, *({"run": rid, "status": "pending", "skipped": True, "reason": "not started"}
                         for rid in swept if rid not in listed and rid not in bad)]
    rows = sorted(rows, key=lambda r: key(r["run"]))
    # every run of the store, not only the rows shown: the settings that tell a run from its twin
    # at one swept point (a sweep of the grid at another lr) are found among all of them, and
    # `analyse --run` of one twin lost its train.lr column
    ids = [r["run"] for r in rows]
    ids += [rid for rid in (store.list_runs(path, damaged="include") if path is not None else []) if rid not in ids]
    attrs = {}
    for rid in ids if path is not None else ():
        try:
            attrs[rid] = store.run_attrs(path, rid)
        except store.StoreError:  # pending, or its group unreadable: the row says why
            pass
    labels, shown = row_labels(index, attrs, ids)
    header = ["run", *labels, "status", "bifurcation", "divergence", "redundancy", "slash_dom", "final roles"]
    table = []
    for r in rows:
        point = shown(r["run"])
        if r.get("skipped"):
            table.append([r["run"], *point, r["status"], "-", "-", "-", "-",
                          f"not analysed ({r.get('reason', 'unfinished')})"])
            continue
        roles = " ".join(f"{k}:{v}" for k, v in sorted(r["roles"].items(), key=lambda kv: -kv[1]))
        bif = _bifurcation(r["bifurcation_step"], r.get("layer_bifurcation_steps"), r.get("bifurcation_probe_range"))
        div = r["final_divergence"]
        table.append([r["run"], *point, r["status"], bif, div if isinstance(div, str) else f"{div:.3f}",
                      _redundancy(r), str(r["slash_dominant"]), roles])
    print_table(header, table)
    if any(not r.get("skipped") for r in rows):  # the columns, once, under the table
        print("bifurcation: step the heads' divergence (the mean over layers) left its early band (split, or "
              "collapsed), and by layer each layer's own where one differs (a layer can leave its band while the mean "
              "does not), never where it did not: heads that start far apart (a large init_scale) can stay in "
              "their band, split from initialisation; a step among the band's first snapshots: the divergence left "
              "its first value for good there, a split the band it set would date late or not at all (a large lr, a "
              "sparse schedule); probes: where it differs from the step, the 5% to 95% range of the step over 200 "
              "bootstrap resamples of the run's probe sequences (the band is set on those same probes, so it holds none "
              "of their noise; one probe: not measured); "
              "divergence: mean within-layer JS distance at the last snapshot; redundancy: heads in a cluster of 2 or more there, of all heads (average linkage, JS distance cut at 0.1); "
              "slash_dom: heads slash-dominant there; final roles: heads per role there")
    # the notes on the columns first, under the table; then those on runs
    if any(r.get("final_divergence") == "undefined" for r in rows):
        lone = any(r.get("redundancy") == "undefined" for r in rows)
        print("undefined: one head per layer, so no pair of heads to compare (bifurcation and divergence are "
              "measured between the heads of a layer" + (", redundancy between the heads of the model)" if lone else ")"))
    if any(not r.get("skipped") and r.get("slash_dominant") == "undefined" for r in rows):
        print("slash_dom undefined: the probes are too short to score any slash offset (none that uniform attention "
              "or a first-token sink does not already reach), so no head can be measured as slash-dominant; "
              "undefined, not 0")
    if unseen := [r for r in rows if not r.get("skipped") and r.get("token_unseen") is not None]:
        ids = sorted({r["token_unseen"] for r in unseen})
        print(f"token roles: token {', '.join(map(str, ids))} is in none of the probe sequences of {len(unseen)} of "
              f"these run(s), so none of their heads can be measured as a token head (a vocabulary without it, or "
              f"too few probes: record.n_probe)")
    for line in role_notes([r for r in rows if not r.get("skipped")]):
        print(line)
    if early := [r for r in rows if not r.get("skipped") and "read_at_step" in r]:
        # the footnote's "last snapshot" of a diverged run is its last finite one, often well
        # before the schedule's end: only the status column said so
        # "up to": the snapshot at the diverging step is read when its attention is still finite
        # (a gradient overflowed under a finite loss), and "before" then contradicted "at step 5 (diverged at step 5)"
        print("diverged: read at the last snapshot with finite attention, recorded up to the divergence, not at the "
              "schedule's end: "
              + ", ".join(f"{r['run']} at step {r['read_at_step']} (diverged at step {r['diverged_step']})"
                          for r in early[:4]) + (f", and {len(early) - 4} more" if len(early) > 4 else ""))
    # A loss that blew up to a huge but finite value is no divergence, and heads that never moved
    # (an init_scale of 3e9 "completed" with every gradient 0) got roles like any run's
    for line in notes({r["run"]: r for r in rows if not r.get("skipped")}):
        print(line)


def _runs(counts: list[tuple[str, int]]) -> str:
    return (", ".join(f"{rid} ({n})" for rid, n in counts[:4])
            + (f", and {len(counts) - 4} more run(s)" if len(counts) > 4 else ""))


def role_notes(rows: list[dict]) -> list[str]:
    """Notes on what the final-roles column does not say, from `summary_row`'s rows: heads that
    meet Voita et al.'s positional-head rule but are labelled otherwise, heads holding a
    specific role at step 0, before any update, and heads whose label rests on the probe sample."""
    lines = []
    if missed := [(r["run"], r["peak_not_previous_token"]) for r in rows if r.get("peak_not_previous_token")]:
        from dynamics.analysis.positional import MISSED_NOTE

        lines.append(f"previous-token heads: {sum(n for _, n in missed)} head(s) {MISSED_NOTE}; `previous_token_peak` "
                     f"in the analysis names them: {_runs(missed)}")
    start = [(r["run"], r["roles_at_start"]) for r in rows if r.get("roles_at_start") and r.get("start_step") == 0]
    if start:
        total: dict[str, int] = {}
        for _, counts in start:
            for role, n in counts.items():
                total[role] = total.get(role, 0) + n
        lines.append(f"roles at step 0: {sum(total.values())} head(s) hold a specific role before any update ("
                     + ", ".join(f"{role} {n}" for role, n in total.items())
                     + "), so it was not learned: where uniform attention scores close to a role's threshold "
                       "(short probes for sink and self, few or repetitive tokens for induction), an untrained "
                       "head's small departures from uniform pass it, and an [intervene] template or a large "
                       "init_scale can set one: " + _runs([(rid, sum(c.values())) for rid, c in start]))
    if sensitive := [(r["run"], h) for r in rows for h in r.get("probe_sensitive_roles") or ()]:
        from dynamics.analysis.probe_resample import LABEL_AGREEMENT, N_RESAMPLES
        from dynamics.analysis.roles import probe_sensitive_text

        named = [f"{rid} {probe_sensitive_text(h)}" for rid, h in sensitive[:4]]
        lines.append(f"probe-sensitive roles: {len(sensitive)} head(s) get their final label on fewer than "
                     f"{LABEL_AGREEMENT:.0%} of {N_RESAMPLES} bootstrap resamples of their run's probe sequences, so "
                     f"another sample of probes like these may label them otherwise (`role_resampled` in the "
                     f"analysis): {', '.join(named)}" + (f", and {len(sensitive) - 4} more" if len(sensitive) > 4 else ""))
    return lines


def _redundancy(row: dict) -> str:
    """The redundancy cell: "5/8" heads from summary_row's counts, exact where two decimals were
    not (5/8 printed 0.62); a row without them (built by hand) gets its fraction."""
    red = row["redundancy"]
    if isinstance(red, str):
        return red
    if row.get("redundant_heads") is not None and row.get("heads"):
        return f"{row['redundant_heads']}/{row['heads']}"
    return f"{red:.3f}"


def demo_timing(t_train: float, t_analyse: float, t_total: float, n_skipped: int, n_runs: int,
                n_others: int = 0, *, resumed: int = 0, analysed: int | None = None) -> str:
    """The demo's closing line: its analysis time as a share of training (the goal is <= 10%).

    Only when this command trained every run it analysed: runs already finished in the store cost
    no training here, so the share would compare the analysis of every run with the training of
    some (of none on a second demo of one store: 0.0 s, and a ratio in the tens of thousands of
    percent); ``n_others``, the store's runs outside the demo's grid, are analysed and not trained;
    ``resumed`` runs were trained here from a checkpoint only (a part of their training, against
    the analysis of all of it: 22% where a whole demo gave 10%); ``analysed``: runs analysed.
    """
    if resumed:
        share = f"no share of training: {resumed} of {n_runs} runs were resumed from a checkpoint, not trained whole here"
    elif n_skipped:
        share = f"no share of training: {n_skipped} of {n_runs} runs were already finished, not retrained"
    elif n_others:
        share = f"no share of training: the store's {n_others} other run(s) were analysed or kept too, not trained"
    elif analysed == 0:
        share = "no share of training: no run was analysed"
    else:
        share = f"{t_analyse / t_train:.1%} of training" if t_train > 0 else "no share of training"
    return f"training {t_train:.1f}s, analysis {t_analyse:.1f}s ({share}), total {t_total:.0f}s"


def analysed_what(row: dict) -> str:
    """What `dynamics analyse`'s progress line says of one run's row."""
    if row.get("skipped"):
        return f"not analysed ({row.get('reason', 'unfinished')})"
    if row.get("kept"):
        return "kept (analysed before, by these analysers)"
    return f"analysed (replacing the analysis of {_analysers(row['replaced'])})" if "replaced" in row else "analysed"


def _analysers(version: str) -> str:
    return "analysers that stamped no version" if version == "unstamped" else f"analysers version {version}"


def analysed_line(rows: list[dict], seconds: float, path: str) -> str:
    """`dynamics analyse`'s closing line: the runs it analysed, and those it kept as analysed
    before (their rows read from their stored analyses; ``--again`` redoes them)."""
    n = sum(not r.get("skipped") and not r.get("kept") for r in rows)
    kept = sum(bool(r.get("kept")) for r in rows)
    said = (f"analysed {n} run{'' if n == 1 else 's'} in {seconds:.1f}s -> {path} (analysis/<run_id>)" if n
            # "analysed 0 runs ... -> STORE" read as if something had been written there
            else "analysed no run: none could be (the table says why)" if not kept else "analysed no run")
    if kept:
        said += (f"{'; ' if n else ': '}kept {kept} analysed before by these analysers, from the recordings "
                 f"they hold now (`--again` analyses {'it' if kept == 1 else 'them'} again)")
    # an older version's figures are gone once replaced: said, as a researcher may have quoted them
    if replaced := collections.Counter(r["replaced"] for r in rows if "replaced" in r):
        said += "; replaced the analyses of " + ", ".join(f"{k} run{'' if k == 1 else 's'} by {_analysers(v)}"
                                                        for v, k in sorted(replaced.items()))
    return said
