"""Keep the memory a training step frees inside the process (glibc's malloc only).

Why: every CPU step allocates and frees the same activation and gradient buffers, a few MB
each. glibc serves a block over its mmap threshold with a fresh ``mmap``, and hands the top of
its heap back to the kernel once more than its trim threshold of it is free, so the next step
faults those pages in again, each zeroed by the kernel. Its own adjustment of both thresholds
(raised to the largest block freed so far) did not settle for the default model's step: 150 to
1,800 minor faults a step in the runs measured, and 0.3 to 3.2 ms of system time on a step of
about 33 ms; with these thresholds, none (AMD EPYC, 1 thread). ``python bench/train.py`` prints both
(section 5, glibc's default against these in fresh workers, alternated). The step's wall time
gained less than that system time: 0.90x to 1.02x glibc's default over five runs, within the
host's drift. Under Dask's nannies, which set ``MALLOC_TRIM_THRESHOLD_=65536`` (turning glibc's
adjustment off, so every block over 128 KiB was mmap'd), a sweep's run took 2.3x the wall time;
these thresholds override that setting, as they do a user's ``MALLOC_*_`` or ``GLIBC_TUNABLES``
ones. jemalloc or tcmalloc, which PyTorch's CPU tuning guide suggests, need ``LD_PRELOAD`` before
the process starts; ``mallopt`` works from inside it.

The thresholds set are the ceilings glibc's own adjustment can reach on 64-bit
(``DEFAULT_MMAP_THRESHOLD_MAX``, and twice it for trimming): the thresholds glibc itself sets
once the process has freed one mmap'd block of 32 MiB. So a process keeps up to 64 MiB of
freed heap. Setting them is process-wide and stays for the rest of the process: ``mallopt`` has
no way back to the adjusting default.
"""

from __future__ import annotations

import ctypes
import platform

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, the largest mallopt takes there
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc's adjustment pairs with its mmap threshold

_kept: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to their ceilings, once per process.

    Returns True where glibc took them (now or at an earlier call). False where the C library
    is not glibc or it refused one: training is then only slower, so this never raises. With
    jemalloc or tcmalloc preloaded, glibc takes them and its malloc, unused, keeps them: True,
    and nothing else changes.
    """
    global _kept
    if _kept is None:  # two threads racing here only call mallopt twice, which takes its own lock
        _kept = _set_thresholds()
    return _kept


def _set_thresholds() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
