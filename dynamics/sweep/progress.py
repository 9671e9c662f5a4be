"""Progress display in the launcher: tqdm bars on a terminal, plain log lines otherwise, or nothing."""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

from dynamics.sweep.summary import FINISHED

QUIET_S = 30.0
"""Seconds without a step report after which the running line says so (runs report every 10 steps,
at most twice a second), or 3 times a run's longest gap between reports where that is longer."""


class _Display:
    """Plain log lines (not a terminal): one line per run that ends, running runs every 10 s,
    each silent for `QUIET_S` or more marked ``(no report for N s)``.

    ``done`` counts finished runs (completed or diverged) only: a failed, interrupted or
    cancelled one is trained again by the next launch, so counting it would say the sweep
    is further along than it is (after Ctrl-C, "4/4" with two runs cancelled).
    """

    def __init__(self, total: int, done: int, stream=None, every: float = 10.0):
        # sys.stderr as it is now, not as it was at import (a caller may have replaced it)
        self.total, self.done, self.stream, self.every = total, done, stream or sys.stderr, every
        self.steps: dict[str, tuple[int, int]] = {}
        self.heard: dict[str, float] = {}  # run -> when its last step report came
        self.gap: dict[str, float] = {}  # run -> the longest time between two of its reports so far
        self.last = time.monotonic()

    def starting(self, todo: int, workers: int | str) -> None:
        """Before the cluster starts: in a log, the first line came only with the first run's step
        report, ten seconds in. ``workers``: a count, or the address of a cluster already running."""
        on = f"{workers} worker(s)" if isinstance(workers, int) else f"the cluster at {workers}"
        print(f"[sweep] {todo} run(s) to train on {on}, {self.done} of {self.total} already finished; "
              f"a line as each ends, and the running ones every {self.every:g} s", file=self.stream, flush=True)

    def step(self, run_id: str, step: int, total: int, loss: float) -> None:
        self.steps[run_id] = (step, total)
        now = time.monotonic()
        if run_id in self.heard:
            self.gap[run_id] = max(self.gap.get(run_id, 0.0), now - self.heard[run_id])
        self.heard[run_id] = now

    def waiting(self, run_id: str, text: str) -> None:
        """The run's task waits for another process that is training it."""
        print(f"[sweep] {run_id} waiting: {text}", file=self.stream, flush=True)

    def notice(self, text: str) -> None:
        """Something about the cluster, not one run (its workers gone, or back)."""
        print(f"[sweep] {text}", file=self.stream, flush=True)

    def say(self, text: str) -> None:
        """A line of the command's own (``dynamics: stopping the sweep ...``), as it is written."""
        print(text, file=self.stream, flush=True)

    def finished(self, run_id: str, status: str, note: str = "") -> None:
        self.done += status in FINISHED
        self.steps.pop(run_id, None)
        print(f"[sweep] {run_id} {status}{note} ({self.done}/{self.total} finished)", file=self.stream, flush=True)

    def tick(self) -> None:
        now = time.monotonic()
        if self.steps and now - self.last >= self.every:
            self.last = now
            running = ", ".join(f"{r} {s}/{t}{self._quiet_for(r, now)}" for r, (s, t) in sorted(self.steps.items()))
            print(f"[sweep] {self.done}/{self.total} finished; running: {running}", file=self.stream, flush=True)

    def _quiet_for(self, run_id: str, now: float) -> str:
        # A run reports every 10 steps (at most twice a second). One whose worker died (it waits
        # to be trained again), or whose reports a lost scheduler no longer passes on, kept its
        # last count in this line, unchanged, as if it were training: three runs "running" on
        # two workers. Its count is kept, and how long it has said nothing: from QUIET_S, or 3
        # times its own longest gap so far, where its steps are slow (a large model's 4 s steps
        # gave 40 s gaps, marked though training went on).
        quiet = now - self.heard.get(run_id, now)
        return f" (no report for {quiet:.0f} s)" if quiet >= max(QUIET_S, 3 * self.gap.get(run_id, 0.0)) else ""

    def close(self) -> None:
        pass


class _Bars(_Display):
    """tqdm: an overall bar (runs finished of total, ETA) and one step bar per running run."""

    def __init__(self, total: int, done: int, stream=None):
        from tqdm import tqdm

        super().__init__(total, done, stream)
        stream = self.stream
        self.tqdm = tqdm
        self.overall = tqdm(total=total, initial=done, desc="sweep", unit="run", position=0,
                            dynamic_ncols=True, file=stream)
        self.bars: dict[str, Any] = {}
        self.slot: dict[str, int] = {}

    def step(self, run_id: str, step: int, total: int, loss: float) -> None:
        bar = self.bars.get(run_id)
        if bar is None:
            taken = set(self.slot.values())
            self.slot[run_id] = next(i for i in itertools.count(1) if i not in taken)
            # initial: a resumed run starts at its checkpoint ("14401043.78step/s" without it)
            bar = self.tqdm(total=total, initial=step, desc=run_id, unit="step", position=self.slot[run_id],
                            leave=False, dynamic_ncols=True, file=self.stream)
            self.bars[run_id] = bar
        bar.n = step
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        bar.refresh()

    # The same "[sweep] " lines as the plain log's (README quotes them), written above the bars
    def waiting(self, run_id: str, text: str) -> None:
        self.tqdm.write(f"[sweep] {run_id} waiting: {text}", file=self.stream)

    def notice(self, text: str) -> None:
        self.tqdm.write(f"[sweep] {text}", file=self.stream)

    def say(self, text: str) -> None:  # a plain print landed at the end of a bar's line
        self.tqdm.write(text, file=self.stream)

    def finished(self, run_id: str, status: str, note: str = "") -> None:
        bar = self.bars.pop(run_id, None)
        self.slot.pop(run_id, None)
        if bar is not None:
            bar.close()
        if status not in FINISHED or note:
            self.tqdm.write(f"[sweep] {run_id} {status}{note}", file=self.stream)
        if status in FINISHED:  # as the log lines count: the bar's ETA is for the runs still to finish
            self.done += 1
            self.overall.update(1)

    def starting(self, todo: int, workers: int | str) -> None:
        pass  # the overall bar is drawn already

    def tick(self) -> None:
        pass

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.overall.close()


class _Quiet(_Display):
    def starting(self, todo: int, workers: int | str) -> None:
        pass

    def waiting(self, run_id: str, text: str) -> None:
        pass

    def notice(self, text: str) -> None:
        pass

    def finished(self, run_id: str, status: str, note: str = "") -> None:
        self.done += status in FINISHED

    def tick(self) -> None:
        pass


def _display(progress: bool | None, total: int, done: int) -> _Display:
    if progress is False:
        return _Quiet(total, done)
    if progress is None:
        progress = sys.stderr.isatty()
    return _Bars(total, done) if progress else _Display(total, done)
