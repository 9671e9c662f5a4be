"""Command input, checked before any work: each check raises :class:`UsageError`, which the
command line prints as one line naming the problem, with exit code 2.

Kept apart from the commands (dynamics/cli.py) because every command shares them: paths to
write (a store, a report folder), stores to read, devices, worker counts and --set overrides,
and the parser's own rules (:class:`OneLineParser`: one-line errors, a flag given once).
Heavy modules (store, torch) are imported inside the checks that need them, so ``dynamics --help``
and input errors stay instant.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

from dynamics.escapes import ESCAPED as _ESCAPED
from dynamics.limits import DEEPEST_IN_REPORT, DEEPEST_IN_STORE
from dynamics.paths import absolute
from dynamics.schema import MKDIR_PROBE

EXIT_BAD_INPUT = 2
"""Exit status of bad input: a usage error, a config or store refused before any work."""

_LONG_WORD = 4200  # past PATH_MAX (4096): a path is never cut
_LONG_LINE = 8000
def clipped(text: str) -> str:
    """``text`` with each run of non-space characters longer than 4,200 (no path is) cut to its
    start and end, then, past 8,000 characters, the whole cut in its middle, each cut naming the
    length it left out of: a 100 kB value was echoed whole in its refusal, one line of 100 kB
    (a list of a thousand numbers, with its spaces, too). Paths and short lists stay whole.
    ASCII control characters are shown escaped (``\\n``): a path holding a newline printed the
    refusal as two lines."""
    words = text.translate(_ESCAPED).split(" ")
    text = " ".join(w if len(w) <= _LONG_WORD else f"{w[:200]}...({len(w):,} characters)...{w[-40:]}" for w in words)
    return text if len(text) <= _LONG_LINE else f"{text[:3000]} ...({len(text):,} characters)... {text[-1000:]}"


class UsageError(Exception):
    """Bad input found before any work: printed as one line, exit code 2."""


class _Once(argparse._StoreAction):
    """A flag that takes one value refuses a second: argparse keeps the last one silently, and
    ``--out a --out b`` wrote to b (as ``--set`` refuses a key given twice)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = vars(namespace).setdefault(_GIVEN, set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given twice; give it once")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


_GIVEN = "_flags_given"


class _Subcommands(argparse._SubParsersAction):
    """Subcommands whose own ``--help`` opens with the line ``dynamics --help`` lists them by:
    ``dynamics status --help`` said nothing of what status prints, only its usage."""

    def add_parser(self, name, **kwargs):
        kwargs.setdefault("description", kwargs.get("help"))
        return super().add_parser(name, **kwargs)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage itself is in --help), exit code 2, a
    flag that takes one value is refused when given twice (:class:`_Once`), and a flag is named
    whole: argparse took a prefix of one, and `dynamics run c.toml --run X` named the run X
    (``--run-id``), where the other commands' ``--run`` picks a recorded run."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, _Once)
        self.register("action", "store", _Once)
        self.register("action", "parsers", _Subcommands)

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        vars(namespace).pop(_GIVEN, None)
        return namespace, rest

    def parse_args(self, args=None, namespace=None):
        namespace, rest = self.parse_known_args(args, namespace)
        if rest:
            # argparse refuses a subcommand's unknown flag from the top parser, whose help lists
            # no flags of the subcommand's: its own help is the one to read
            chosen = [a.choices.get(getattr(namespace, a.dest, None)) for a in self._actions
                      if isinstance(a, argparse._SubParsersAction)]
            (next((p for p in chosen if p is not None), self)).error(f"unrecognized arguments: {' '.join(rest)}")
        return namespace

    def error(self, message: str):
        # "dynamics: error:" as every other refusal of the command, where argparse put the
        # subcommand's prog ("dynamics run: error:"); prog names the help to read. A bench script's
        # parser keeps its own name.
        head = self.prog.split()[0] if self.prog.startswith("dynamics ") else self.prog
        self.exit(EXIT_BAD_INPUT, f"{head}: error: {clipped(message)} (see {self.prog} --help)\n")


# How errors name a path the command chose: naming --out when none was given puzzled.
DEFAULT_STORE = "no --out given: the default store"
DEFAULT_REPORT = "the default report folder"
STORE_HELP = "a dynamics store: its folder, or an fsspec URL (file://, s3://, ...)"


def check_out(path: str, finished: Callable[[], bool] | None = None, flag: str = "--out",
              also: tuple[str, ...] = ()) -> None:
    """--out of a command that makes or extends a store: a URL with a filesystem, an empty or new
    writable path outside any store, or a writable dynamics store; never something else to overwrite.
    ``finished()``, asked of a read-only store, says the command has nothing to write there (a
    finished run, which `dynamics run` skips): then it may stay read-only. `flag` names the path in
    errors: "--out", or how a default path came to be chosen."""
    from dynamics import store

    if path.startswith("file://"):
        path = _local(path)  # a local path, as the store reads it: checked as one
    elif "://" in path:
        check_url(path, f"{flag} ")
        return
    p = Path(path)
    check_not_in_store(p, flag)
    if p.is_dir() and not os.access(p, os.R_OK | os.X_OK):
        # its listing raised PermissionError below: "run stopped ... run it again", exit 1, for
        # input that is refused before any work
        raise UsageError(f"{flag} {path}: no permission to read this directory; check its permissions")
    if not p.exists():
        check_creatable(p, flag)
        check_depth(p, flag, DEEPEST_IN_STORE, "store")
    elif p.is_dir() and all(store.is_partial(e.name) or e.name.startswith(MKDIR_PROBE) for e in p.iterdir()):
        # An empty directory (made by hand for the results) holds nothing to overwrite: it
        # becomes the store, as a file:// URL to it does. So does one holding only zarr's
        # temporary of a store's first zarr.json: a creation killed before it landed. Another
        # command's probe (`cannot_make_in`), there for microseconds, made it "not a dynamics store".
        # (an empty /sys folder: access() said yes to root, and the run failed as it began, exit 1)
        if not os.access(p, os.W_OK | os.X_OK) or cannot_make_in(p):
            raise UsageError(f"{flag} {path}: no permission to write into this empty directory")
        check_depth(p, flag, DEEPEST_IN_STORE, "store")
    elif not store.is_store(path):
        raise UsageError(store.damaged_root(path)
                         or f"{flag} {path} exists and is not a dynamics store; refusing to overwrite it")
    else:
        # a newer version's store, or a damaged sweep index: `run` trained into such a store, and
        # rewrote its root zarr.json, where every other command refused it
        store.check_store(path)
        if finished is None or not finished():
            # its runs/ and checkpoints/ too: a read-only one (or a file there) let a sweep start its
            # cluster and rewrite the sweep index, then fail every point (exit 1)
            # ``also``: the store's folders the command writes besides (demo: analysis, derived, and
            # so .staging, where a file let it train every run, then fail each analysis)
            check_writable(path, flag, into=("runs", "checkpoints", *also))


def check_depth(p: Path, flag: str, deepest: int, what: str) -> None:
    """A local folder a command writes in is shallow enough for the paths it makes inside it,
    `deepest` bytes below it at most, to fit in PATH_MAX; else the work failed part-way, at its
    first write that deep ("File name too long"), after a store was made or training had begun."""
    where = absolute(p)  # where the store writes: `lnk/..` past the link, as the kernel reads it
    parent = where
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        limit = os.pathconf(parent, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 4096
    # PATH_MAX counts the terminating NUL
    if (n := len(os.fsencode(str(where)))) + deepest >= limit:
        raise UsageError(f"{flag} {p}: a path {n:,} bytes long, and the files a {what} holds lie up to {deepest} "
                         f"bytes deeper, past the {limit:,} a path may have here; give a shorter path")


def _local(value: str) -> str:
    """The local path a path or a file:// URL names (the URL's %-escapes undone, as the store reads it)."""
    return unquote(value[len("file://"):]) if value.startswith("file://") else value


def check_url(path: str, what: str = "") -> None:
    """A store URL names a filesystem that this Python has, and one that outlasts the command:
    without it every read would fail alike and be reported as "not a dynamics store"."""
    import fsspec

    scheme = path.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(scheme)
    except (ValueError, ImportError) as e:
        raise UsageError(f"{what}{path}: no filesystem for the URL scheme {scheme!r} ({e})") from None
    if scheme == "memory":
        # fsspec's memory filesystem is one process's dict: the store would vanish when the
        # command exits (a sweep's workers, other processes, would each write their own).
        raise UsageError(f"{what}{path}: a memory:// store lives only as long as this command; "
                         "give a path or a URL that outlasts it")
    try:  # reached once here: a refused connection was a traceback from deep in the sweep, or "not a store"
        fs, root = fsspec.core.url_to_fs(path)
        fs.exists(root)
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own: the first line of any names it
        reason = (str(e).splitlines() or [""])[0] or type(e).__name__
        raise UsageError(f"{what}{path}: cannot be reached: {reason}") from None


def check_args(args) -> None:
    """What every command's arguments share: no empty value (it would quietly become the default),
    and ``~`` in a path expanded as the shell would (``--out=~/x`` reaches us unexpanded; stores
    expand it, so a report or config path left as a folder named ``~`` in the working directory
    would be another path than the store's)."""
    for name, value in vars(args).items():
        label = name.upper() if name in _POSITIONAL else "--" + name.replace("_", "-")
        if isinstance(value, str) and not value.strip():
            raise UsageError(f"{label}: empty value")
        if name in _PATHS and value == "-":
            # by convention standard input or output, which no command here reads or writes: it
            # became a store, a report folder or a config file named "-" in the working directory
            raise UsageError(f"{label} -: a path is needed here, not standard input or output "
                             "(./- names a file called -)")
        if name in _PATHS and isinstance(value, str) and value.startswith("file://") and not _local(value).strip():
            # read as the local path "", which every later step took for the working directory
            raise UsageError(f"{label} {value}: a file:// URL with no path")
        if name in _PATHS and isinstance(value, str) and value.startswith("~"):
            value = os.path.expanduser(value)
            setattr(args, name, value)
        if name in _PATHS and isinstance(value, str):
            _check_examinable(value, label)


def _check_examinable(value: str, label: str) -> None:
    """A local path whose stat fails but for "not there" (a name too long, a folder on the way
    this user may not enter) is bad input: every later check's exists() raised it as a traceback."""
    if "://" in value and not value.startswith("file://"):
        return
    local = _local(value)
    try:
        os.stat(local)
    except (FileNotFoundError, NotADirectoryError):
        pass  # not there (yet): the command's own checks say whether that is right
    except OSError as e:
        raise UsageError(f"{label} {value}: cannot be looked at: {e.strerror or e}") from None
    except ValueError:  # file://...%00...: argv holds no NUL, but an escape in a URL can
        raise UsageError(f"{label} {value}: a path cannot hold a NUL byte") from None


_POSITIONAL = ("config", "store")
_PATHS = ("config", "store", "out", "report")


def check_creatable(p: Path, flag: str) -> None:
    """A path that does not exist yet can be made: its nearest existing ancestor is a writable directory."""
    parent = p.absolute()
    while not parent.exists():
        if parent.is_symlink():  # mkdir would fail on it with FileExistsError, after the work
            raise UsageError(f"{flag} {p}: {parent} is a symbolic link to {os.readlink(parent)}, which does not exist")
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {p}: {parent} is a file, not a directory")
    # A folder on the way still to be made, with a name too long for the filesystem: its stat
    # said only "not there", and mkdir failed after training began (exit 1, a folder left behind)
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    if long := [c for c in p.absolute().relative_to(parent).parts if len(os.fsencode(c)) > limit]:
        raise UsageError(f"{flag} {p}: the name {long[0][:24]}... is {len(os.fsencode(long[0]))} bytes long, more than "
                         f"the {limit} a name may have in {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {p}: no permission to create it in {parent}")
    if why := cannot_make_in(parent):
        raise UsageError(f"{flag} {p}: cannot create it in {parent} ({why})")


def cannot_make_in(folder: Path) -> str | None:
    """Why no folder can be made in the existing directory ``folder``, or None. access() answers
    yes to root everywhere, /proc, /sys and immutable folders included: mkdir is asked. Not for a
    store's own folders, where another command may be listing runs as the probe comes and goes."""
    try:
        # in the folder the kernel reads (`lnk/..` resolved): Python 3.12's mkdtemp returns its
        # folder through abspath, which drops `lnk/..` as text, and the rmdir then missed the probe
        os.rmdir(tempfile.mkdtemp(prefix=MKDIR_PROBE, dir=absolute(folder)))
    except OSError as e:
        return e.strerror or str(e)
    return None


def check_writable(path: str, what: str, into: tuple[str, ...] = ()) -> None:
    """A local store a command writes into is writable: said before the work, not after it.
    ``into``: the store's folders it writes under (``analysis``, ``derived``), checked where they
    exist: a writable root over a read-only one let the whole analysis run, then fail to save."""
    local = "://" not in path or path.startswith("file://")  # a file:// URL is a local folder: checked as one
    if not local:
        return
    check_depth(Path(_local(path)), what, DEEPEST_IN_STORE, "store")
    if into:
        from dynamics import store

        # one that is a file: the work would fail to save, run by run; .staging, where analyses and
        # derived results are written before they are swapped in, failed with a traceback after it
        # (not for run and sweep, which never write there)
        into = (*into, ".staging") if {"analysis", "derived"} & set(into) else into
        store.check_folders(path, into)
    for folder in (_local(path), *(os.path.join(_local(path), f) for f in into)):
        if (folder == _local(path) or os.path.isdir(folder)) and not os.access(folder, os.W_OK | os.X_OK):
            where = "the store is" if folder == _local(path) else f"its {os.path.basename(folder)}/ folder is"
            raise UsageError(f"{what} {path}: {where} read-only here, and this command writes into it"
                             + (" (--no-save writes nothing)" if what in ("predict", "gates") else ""))
    _check_one_filesystem(_local(path), what, path, [f for f in into if f in ("analysis", "derived")])


def _check_one_filesystem(root: str, what: str, path: str, staged: list[str]) -> None:
    """Results staged in ``.staging`` are renamed into ``analysis/`` and ``derived/``, which cannot
    cross filesystems: where one is a link to another disk (or a bind mount, a container's volume,
    on the same device number), every analysis (a predictor fit, a gate fit) was computed, then
    lost with a traceback at its swap (EXDEV). So an empty folder is renamed there and back."""
    staging = os.path.join(root, ".staging")
    for name in staged:
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            continue  # made by the command, beside .staging
        try:
            probe = tempfile.mkdtemp(prefix=MKDIR_PROBE, dir=staging if os.path.isdir(staging) else root)
        except OSError:
            return  # the checks before this one, and the command, say why
        moved = os.path.join(folder, os.path.basename(probe))
        try:
            os.rename(probe, moved)
        except OSError as e:
            if e.errno == errno.EXDEV:
                raise UsageError(f"{what} {path}: its {name}/ folder is on another filesystem than its .staging "
                                 f"(a link, or a mount); results are written in .staging, then moved into {name}/, "
                                 "which cannot cross filesystems: link or mount the whole store instead") from None
        finally:
            for leftover in (probe, moved):
                with contextlib.suppress(OSError):
                    os.rmdir(leftover)


def check_store(path: str) -> None:
    """A store a command reads: a readable dynamics store of a version this package knows."""
    from dynamics import store

    if "://" in path and not path.startswith("file://"):
        check_url(path)
    elif not Path(_local(path)).exists():
        # a mistyped path, not something else at that path: say which
        raise UsageError(f"no store at {path}: the path does not exist")
    try:
        # not a store, a damaged root or a newer version's store: refused by every command, as by `run`
        store.check_store(path)
    except store.StoreError as e:
        raise UsageError(str(e)) from None


def no_runs(path: str, what: str) -> UsageError:
    """The refusal of a store holding no run group: "holds no runs{what}", and where its sweep
    index lists runs not started yet, how many (`dynamics status` lists them as pending)."""
    from dynamics import store
    from dynamics.status import sweep_points

    try:  # an entry that is no run id (a hand edit) is no point: status names it, and lists no pending row
        pending = len(sweep_points(path, ()).get("runs", {}))
    except store.StoreError:
        pending = 0
    if pending:
        return UsageError(f"{path} holds no runs{what} yet: its sweep index lists {pending} not started (pending in "
                          f"`dynamics status`; the sweep that lists them trains them)")
    return UsageError(f"{path} holds no runs{what}")


def check_device(device: str) -> None:
    """A CUDA device that this torch cannot use is bad input, found before any store is made."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"train.device {device!r}: this torch {torch.__version__} has no usable CUDA device")
        text = device.partition(":")[2] or "0"
        if not text.isdigit():
            raise UsageError(f"train.device {device!r}: expected cuda or cuda:<index>")
        index = int(text)
        if index >= torch.cuda.device_count():
            raise UsageError(f"train.device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")


def check_devices(cfg) -> None:
    """Every device a sweep's points would train on: a train.device axis's values, else the base one
    (which no point trains on when the axis sets it at every point)."""
    for device in dict.fromkeys(cfg.sweep.axes.get("train.device", (cfg.train.device,))):
        check_device(str(device))


def check_not_swept(cfg, overrides: list[str]) -> None:
    """A --set of a key the [sweep] grid varies would be replaced at every point: silently, no run
    would use the value asked for. The grid's own values are set with --set sweep.<key>=[...]."""
    from dynamics.config import parse_override
    from dynamics.schema import config_value  # TOML has no null: None is a missing path

    for text in overrides:
        key, value = parse_override(text)
        if key in cfg.sweep.axes:
            raise UsageError(f"--set {key}: a [sweep] axis, which every point of the grid sets; "
                             f"to change its values, --set 'sweep.{key}=[...]'")
        # an intervene.* axis may be a whole table, which replaces any key set inside it
        outer = next((axis for axis in cfg.sweep.axes if key.startswith(axis + ".")), None)
        if outer is not None:
            raise UsageError(f"--set {key}: inside the [sweep] axis {outer}, whose values replace it at every "
                             f"point of the grid; to change them, --set 'sweep.{outer}=[...]'")
        # and a table set whole, holding a key an axis sets: that value was replaced at every point
        for axis in cfg.sweep.axes:
            if axis.startswith(key + ".") and config_value(value, axis[len(key) + 1:]) is not None:
                raise UsageError(f"--set {key}: its {axis[len(key) + 1:]} is the [sweep] axis {axis}, which every "
                                 f"point of the grid sets; to change its values, --set 'sweep.{axis}=[...]'")



def check_workers(workers: int | None, scheduler: str | None = None) -> None:
    """--workers, where given, is a positive count, and sizes a cluster of ours, not --scheduler's."""
    if workers is not None and workers < 1:
        raise UsageError(f"--workers: must be >= 1, got {workers}")
    if workers is not None and scheduler:  # it was ignored there, and the first line named it all the same
        raise UsageError(f"--workers {workers}: sizes the cluster a sweep starts itself; with --scheduler the runs "
                         f"go to that cluster's own workers (give one of the two)")


def check_not_in_store(p: Path, flag: str) -> None:
    """Nothing is written at or under a store other than through it: a run group or a report's
    files there would be read as the store's own (a bogus run, unrecognised objects)."""
    from dynamics import store

    # as written and with links resolved: a link to a folder inside a store leads into it
    parents = {*Path(os.path.normpath(p.absolute())).parents, *Path(os.path.realpath(p)).parents}
    for parent in sorted(parents, key=lambda q: len(q.parts), reverse=True):
        if store.is_store(str(parent)):
            raise UsageError(f"{flag} {p} is inside the store {parent}; choose a path outside it")


def report_dir(text: str, flag: str) -> Path:
    """The folder a report is written to: a local path (a file:// URL is one); another URL is refused,
    as Path() would make it a folder named "s3:" (or "file:") in the working directory."""
    if text.startswith("file://"):
        return Path(_local(text))
    if "://" in text:
        raise UsageError(f"{flag} {text}: a report is written to a local folder; give a path")
    return Path(text)


def check_report_dir(out: Path, flag: str) -> None:
    from dynamics import store

    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out} exists and is not a directory")
    check_not_in_store(out, flag)
    if out.exists() and store.is_store(str(out)):
        raise UsageError(f"{flag} {out} is a dynamics store; a report goes next to it, not into it")
    if out.is_dir() and any((out / name).exists() for name in ("zarr.json", ".zgroup", ".zarray")):
        # another tool's zarr store: the report's files would be mixed into its data
        raise UsageError(f"{flag} {out} is a zarr store; give the report a folder of its own")
    from dynamics.report.page import _sole_writer, refuse_foreign_files

    try:  # the report's own rules, asked before any work (demo trains for minutes before it reports)
        refuse_foreign_files(out)
        if out.is_dir():  # a report being written there: the demo was refused only after all its work
            with _sole_writer(out):
                pass
    except store.StoreError as e:
        raise UsageError(f"{flag} {e}") from None
    if not out.exists():
        check_creatable(out, flag)
    check_depth(out, flag, DEEPEST_IN_REPORT, "report")
    for folder in (out, out / "figures"):  # where the report makes its folder, and renames its page
        # (the demo wrote its report to /sys/kernel/iommu_groups after all its work: access() says yes to root)
        if folder.is_dir() and (not os.access(folder, os.W_OK | os.X_OK) or cannot_make_in(folder)):
            raise UsageError(f"{flag} {out}: no permission to write in {folder}")
