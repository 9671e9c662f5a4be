"""Shared fixtures: tiny configs that train in seconds."""

import os

import numpy as np
import pytest

# Tests run single-threaded torch: deterministic and fair on a shared 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")


TINY = """
[model]
n_layers = 2
d_model = 32
n_heads = 2
attn_only = true
vocab_size = 16
context = 16

[task]
name = "induction"
min_period = 3
max_period = 6

[train]
steps = {steps}
lr = 3e-3
batch_size = 16
seed = 0
warmup_steps = 5

[record]
dense_until = 8
every = {every}
n_probe = 4
eval_batch_size = 16
"""


# The slowest test files, slowest first (`--durations=0` summed by file, on the first-generation
# AMD EPYC at 7121840). README's test command hands whole files to its two processes
# (`--dist loadfile`), and pytest-xdist's default order is the files with the most tests first:
# a two-test file of two minutes (test_cli_demo.py) could start last, with the other process
# idle for most of it. Started first, the many short files even the two processes out at the end.
SLOWEST_FIRST = (
    "test_bench.py", "test_report_data.py", "test_cli_demo.py", "test_analyse.py", "test_predict_curve.py",
    "integration/test_sweep_cluster_loss.py", "integration/test_sweep_distributed.py",
    "integration/test_failure_review.py", "integration/test_induction.py", "integration/test_train_run.py",
    "test_train.py", "test_pipeline.py", "test_predict.py", "test_cli_stores.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist present: keep the order below
        config.option.loadscopereorder = False
    # A shell without job control starts a background command (`pytest ... &`) with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler; the Ctrl-C tests here, and
    # the commands they start (children inherit an ignored signal), then saw no Ctrl-C at all:
    # seven failed in a suite run so, none in the same suite run in the foreground.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return SLOWEST_FIRST.index(path) if path in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests, and the other files, keep their order


@pytest.fixture
def tiny_config(tmp_path):
    """Write a tiny induction config; returns a function(steps, every) -> path."""

    def make(steps: int = 40, every: int = 10, extra: str = "") -> str:
        p = tmp_path / f"tiny_{steps}_{every}.toml"
        p.write_text(TINY.format(steps=steps, every=every) + extra)
        return str(p)

    return make


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(d, d/tiny.toml, d/s.zarr) for tests/test_cli.py, test_cli_stores.py and test_cli_messages.py:
    one tiny run trained once per module, beside a file `afile` and a foreign zarr store to refuse.
    Module-scoped, not session-scoped: some tests add to d (d/empty.zarr, d/s-report). Modules with
    a `tiny` of their own (tests/test_gates.py's, imported by some test_gates_*.py; test_gates_fit.py's;
    tests/test_cli_known_answers.py's, ...) override it."""
    from dynamics.config import load_config
    from dynamics.train import train_run

    d = tmp_path_factory.mktemp("cli")
    cfg = d / "tiny.toml"
    cfg.write_text(TINY.format(steps=10, every=5))
    path = d / "s.zarr"
    train_run(load_config(cfg), str(path))
    (d / "afile").write_text("not a directory")
    (d / "foreign.zarr").mkdir()  # a zarr store another tool made
    (d / "foreign.zarr" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    return d, cfg, path


@pytest.fixture(scope="session")
def tiny_probe_store(tmp_path_factory) -> str:
    """One tiny run of 4 probes (40 steps, a snapshot every 10), trained once and only read: the
    probe-splitting benches' tests (bench/probe_range.py, bench/role_agreement.py) split its probes."""
    import tomllib

    from dynamics.config import from_dict
    from dynamics.train import train_run

    path = str(tmp_path_factory.mktemp("probe_split") / "s.zarr")
    raw = tomllib.loads(TINY.format(steps=40, every=10))
    assert raw["record"]["n_probe"] == 4
    train_run(from_dict(raw), path)
    return path


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs of that size, for a full disk (skips where it cannot mount: root
    only); mount.remount(path, size) resizes it.

    Each is unmounted after the test; one still busy is detached (``umount -l``) and the test
    errors. A mount left behind (an unmount whose failure went unchecked) was renamed with pytest's
    old temporary folders from one run to the next, and no later run could delete them.
    """
    import subprocess
    import time

    mounted = []

    def mount(size: str):
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        try:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True)
        except FileNotFoundError:  # no mount(8): not Linux
            r = None
        if r is None or r.returncode != 0:
            pytest.skip("cannot mount a small filesystem here (a tmpfs: root, on Linux)")
        mounted.append(d)
        return d

    def remount(d, size: str):
        subprocess.run(["mount", "-o", f"remount,size={size}", str(d)], check=True)

    mount.remount = remount
    yield mount
    busy = []
    for d in mounted:
        for _ in range(20):  # a process the test started may still be closing its files there
            if subprocess.run(["umount", str(d)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(d)], check=False)
            busy.append(str(d))
    if busy:
        pytest.fail(f"tmpfs still busy after the test, detached: {', '.join(busy)}")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The report tests' shared store, trained and reported once per session (per xdist worker):
    (store path, index.html, run ids); see tests/_report_store.py."""
    from tests._report_store import build_report

    return build_report(tmp_path_factory.getbasetemp() / "report-store")


def wait_for_checkpoint(path, run_id: str, at_least: int, proc=None, timeout: float = 300.0) -> dict:
    """Poll a store until ``run_id``'s checkpoint has reached step ``at_least``, so a test can stop
    a training subprocess mid-run; returns the run's attributes as they were then.

    Fails the test, saying why, when `proc` (the training subprocess, if given) exits before
    that checkpoint, or when `timeout` seconds pass: it returned silently then, and the test went
    on to check a kill or an interrupt that had landed on a run never started, or already done.
    The deadline is no timed assertion, only far past what any run here takes on a loaded machine.
    """
    import time

    from dynamics import store

    deadline = time.monotonic() + timeout
    attrs: dict = {}
    while True:
        exited = proc is not None and proc.poll() is not None  # before the read: its last checkpoint counts
        if store.is_store(path) and run_id in store.list_runs(path):
            attrs = store.run_attrs(path, run_id)
            if attrs.get("checkpoint_step", 0) >= at_least:
                return attrs
        seen = {k: attrs.get(k) for k in ("status", "checkpoint_step")} if attrs else "no run yet"
        if exited:
            err = proc.stderr.read() if getattr(proc, "stderr", None) is not None else ""
            pytest.fail(f"the training process exited ({proc.returncode}) before run {run_id} checkpointed "
                        f"step {at_least} ({seen}){': ' + err.strip()[-2000:] if err else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"run {run_id} in {path} did not checkpoint step {at_least} within {timeout:g} s ({seen})")
        time.sleep(0.02)


def assert_same_run_arrays(a, b) -> None:
    """The runs recorded at stores `a` and `b` hold the same variables, bitwise equal."""
    from dynamics import store

    got, want = store.open_run(a).load(), store.open_run(b).load()
    assert set(got.data_vars) == set(want.data_vars)
    for name in want.data_vars:
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)


def interrupt_at(n: int):
    """A train_run progress callback that stops the run, as Ctrl-C would, once it reports step >= n."""

    def progress(step, steps, loss):
        if step >= n:
            raise KeyboardInterrupt

    return progress


def cli_in_process(*args, cwd=None, warnings_as_errors: bool = False):
    """``dynamics ARGS`` run by calling :func:`dynamics.cli.main` in this process, for checks of what
    the command says and its exit code that do not depend on it being a process of its own (a
    ``python -m dynamics`` costs seconds of imports, torch's above all). Returns what
    ``subprocess.run(..., capture_output=True, text=True)`` would: returncode, stdout, stderr.

    As a fresh ``python -m dynamics`` would show them, warnings raised during the call (Python's
    default filters: DeprecationWarning and the like ignored) and log records of WARNING and above
    (the lastResort handler's) are written on its stderr, so a check that stderr is one line still
    sees them; ``warnings_as_errors`` raises them instead, as ``PYTHONWARNINGS=error`` does. What the
    command may change in this process is put back: the working directory, SIGINT and SIGTERM
    handlers, the environment, torch's thread count.
    """
    import contextlib
    import io
    import logging
    import signal
    import subprocess
    import sys
    import warnings

    from dynamics import cli

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    cwd_before, env_before = os.getcwd(), dict(os.environ)
    handlers_before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    torch = sys.modules.get("torch")
    threads_before = torch.get_num_threads() if torch is not None else None
    log_handler = logging.StreamHandler(err)
    log_handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    try:
        if cwd is not None:
            os.chdir(cwd)
        root.addHandler(log_handler)
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.resetwarnings()
            if warnings_as_errors:
                warnings.simplefilter("error")
            else:
                warnings.simplefilter("always")
                for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                    warnings.simplefilter("ignore", category)

            def show(message, category, filename, lineno, file=None, line=None):  # on stderr, in order
                err.write(warnings.formatwarning(message, category, filename, lineno, line))

            warnings.showwarning = show  # put back by catch_warnings
            try:
                code = cli.main(argv)
            except SystemExit as e:  # argparse: usage errors and --help
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        root.removeHandler(log_handler)
        os.chdir(cwd_before)
        for s, handler in handlers_before.items():
            if handler is not None:
                signal.signal(s, handler)
        if os.environ != env_before:
            os.environ.clear()
            os.environ.update(env_before)
        if threads_before is not None and torch.get_num_threads() != threads_before:
            torch.set_num_threads(threads_before)
    return subprocess.CompletedProcess(["dynamics", *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def planted():
    """The planted sweep of tests/test_predict.py and its curve at h = 0 and h = 0.1: built once per
    session (per xdist worker) for the tests/test_predict*.py files, which only read it."""
    from dynamics import predict
    from dynamics.predict import PredictOptions
    from tests.test_predict import FAST, make_runs

    runs = make_runs()
    opt = PredictOptions(target="slash", horizons=(0.0, 0.1), **FAST)
    return runs, opt, predict.predict_runs(runs, opt)


@pytest.fixture(scope="session")
def tables(planted):
    """The planted sweep's head rows, its features at h = 0.1 and at init, and its folds."""
    from dynamics import predict

    runs, opt, _ = planted
    rows = predict.target_table(runs, opt)
    feats = predict.feature_table(runs, rows, 0.1, opt)
    init = predict.feature_table(runs, rows, None, opt)
    return rows, feats, init, predict.group_splits(rows.row_group.values, opt.n_splits)


@pytest.fixture
def threaded_cluster():
    """A one-worker cluster inside this process (threads: no worker start-up, torch already imported)."""
    import logging

    import torch
    from distributed import LocalCluster

    threads = torch.get_num_threads()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                      scheduler_kwargs={"dashboard_address": ":0"}, silence_logs=logging.ERROR) as cluster:
        yield cluster.scheduler_address
    torch.set_num_threads(threads)  # run_point limits torch to one thread in its worker


@pytest.fixture(autouse=True, scope="module")
def earlier_garbage_collected_before_a_strict_module(request):
    """Collect what earlier modules left before a module that turns warnings into errors.

    A pipe a test left open in a reference cycle is closed by the collector, which warns
    (ResourceWarning) in whichever test it happens to run in. In a module marked
    ``filterwarnings("error")`` that warning failed a test with nothing to do with the pipe (CI:
    test_store's plain open_zarr, while zarr's asyncio allocated). Collected here, it is not
    this module's to answer for; the module's own leaks still fail it.
    """
    import gc
    import warnings

    marks = getattr(request.module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    if any(m.name == "filterwarnings" and "error" in m.args for m in marks):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
    yield


@pytest.fixture(autouse=True)
def no_dask_client_left_behind():
    """Close any Dask client a test left as dask's default.

    A task that talks to the scheduler (run_point's stop Event) makes its worker a client, set as
    the default; in a threaded cluster that is this process's default, and a launcher's client that
    failed to close stays one. Left behind, a later test's plain .load() went to a closed cluster
    and waited for ever (the suite hung once in test_train, after the sweep tests).
    """
    from distributed import default_client

    def current():
        try:
            return default_client()
        except ValueError:
            return None

    before = current()  # a module's own cluster client (test_sweep_distributed) stays
    yield
    for _ in range(8):
        leftover = current()
        if leftover is None or leftover is before:
            break
        leftover.close()
