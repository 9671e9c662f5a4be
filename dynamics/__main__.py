"""The ``dynamics`` program: ``dynamics ...`` and ``python -m dynamics ...`` both run :func:`console`."""

import signal

from dynamics import exits
from dynamics.cli import main


def console() -> int:
    """The program: :func:`dynamics.cli.main`, then an exit that a late Ctrl-C or SIGTERM leaves alone.

    Once main returns, the command's work is on disk and its exit status settled; what remains is
    the interpreter joining idle I/O threads (zarr's) and running exit handlers. A Ctrl-C there
    printed a KeyboardInterrupt traceback under a finished command's last line, or ended the
    process by SIGINT in place of that status. Not in main itself: a program calling main keeps
    its own Ctrl-C.
    """
    exits.PROGRAM = True  # the process ends with the command: see exits.PROGRAM
    try:
        return main()
    finally:  # an uncaught error's status (argparse's exit, a bug's traceback) is settled as well
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as Ctrl-C: exit 143 for work already saved


if __name__ == "__main__":
    raise SystemExit(console())
