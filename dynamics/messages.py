"""What commands say on stderr while they work: progress lines and notes.

Progress goes to stderr so that a command's results on stdout stay clean to pipe; on a terminal
training shows a tqdm bar, elsewhere a log line at most every 5 s (and the last step's always).
"""

from __future__ import annotations

import sys
import time


def predict_progress(text: str) -> None:
    # its stages, on stderr: with --null N a predict fits N + 1 curves, half a minute of silence
    print(f"[predict] {text}", file=sys.stderr, flush=True)


def progress_printer(label: str):
    """tqdm bar on a terminal, plain log lines otherwise."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = None

        def update(step: int, total: int, loss: float) -> None:
            nonlocal bar
            if bar is None:
                # initial: a resumed run starts at its checkpoint, and its rate counts from there
                bar = tqdm(total=total, initial=step, desc=label, unit="step", dynamic_ncols=True)
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


def note_mixed_training(path: str, ids: list[str]) -> list[str]:
    """A note on stderr where the runs ``ids`` compared were not all trained by the same dynamics
    code (provenance.mixed_code), one where not with the same torch build, device and CPU
    kernels (provenance.mixed_execution), and one where runs of one task setting were trained on
    other data (provenance.mixed_data), and one where their importance is of two forms
    (provenance.mixed_importance); a run whose attributes cannot be read is named elsewhere.
    Returns the notes said."""
    from dynamics import store
    from dynamics.provenance import (
        importance_form,
        mixed_code,
        mixed_data,
        mixed_execution,
        mixed_importance,
        trained_by,
        trained_on,
        trained_on_data,
    )

    codes, executions, data, forms = {}, {}, {}, {}
    for run_id in ids:
        try:
            attrs = store.run_attrs(path, run_id)
        except store.StoreError:
            continue
        codes[run_id], executions[run_id], data[run_id] = trained_by(attrs), trained_on(attrs), trained_on_data(attrs)
        forms[run_id] = importance_form(attrs)
    said = [note for note in (mixed_code(codes), mixed_execution(executions), mixed_data(data), mixed_importance(forms))
            if note]
    for note in said:
        print_note(note)
    return said


def print_note(note: str | None) -> None:
    from dynamics.escapes import escaped

    if note:  # escaped: it quotes a store's attrs (torch version, device), from anyone
        print(f"dynamics: note: {escaped(note)}", file=sys.stderr)


def damaged_runs_named(path: str, ids: list[str], chunks: bool = False, decode: bool = False) -> list[str]:
    """The runs of `ids` whose group cannot be read, each named on stderr with why, then in one line."""
    from dynamics.status import damaged_runs

    damaged = damaged_runs(path, ids, chunks, decode)
    name_damaged(damaged)
    return list(damaged)


def name_damaged(damaged: dict[str, str]) -> None:
    for reason in damaged.values():
        print(f"dynamics: {reason}", file=sys.stderr)
    if damaged:
        print(f"dynamics: {len(damaged)} run(s) could not be read (damaged), skipped: {', '.join(damaged)}",
              file=sys.stderr)


def gates_progress(run_id: str):
    """Log lines on stderr through the fits: each stage's start and end, and every 5 s between."""
    last = [-1.0]

    def show(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done == 0 or done >= total or now - last[0] >= 5.0:
            last[0] = now
            unit = "passes" if stage == "ablation" else "updates"
            print(f"[gates {run_id}] {stage}: {done}/{total} {unit}", file=sys.stderr, flush=True)

    return show
