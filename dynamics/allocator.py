"""Keep the memory a training step frees inside the process (glibc's malloc only).

Why: every CPU step allocates and frees the same activation and gradient buffers, a few MB
each. glibc serves a block over its mmap threshold with a fresh ``mmap``, and hands the top of
its heap back to the kernel once more than its trim threshold of it is free. Its own
adjustment of both thresholds (raised to the largest block freed so far) does not settle for
this pattern: the default model's step still page-faulted its buffers back in, 500 to 1,500
minor faults a step, each page zeroed by the kernel, 1 to 3 ms of system time on a step of
about 33 ms; with these thresholds, none (AMD EPYC, 1 thread). The step's wall time gains less
than that system time: 0.90x to 1.02x in ``python bench/train.py``'s alternated comparison in
fresh workers (section 5), which prints both figures. jemalloc or tcmalloc, which PyTorch's CPU
tuning guide suggests, need ``LD_PRELOAD`` before the process starts; ``mallopt`` works from
inside it.

The thresholds set are the ceilings glibc's own adjustment can reach on this machine's word
size (``DEFAULT_MMAP_THRESHOLD_MAX``, and twice it for trimming): the thresholds glibc itself
sets once the process has freed one mmap'd block of 32 MiB (64-bit). Setting them is process-wide and
stays for the rest of the process: ``mallopt`` has no way back to the adjusting default.
"""

from __future__ import annotations

import ctypes
import platform

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# DEFAULT_MMAP_THRESHOLD_MAX: 32 MiB with 8-byte longs, 512 KiB x 4 bytes on 32-bit
MMAP_THRESHOLD = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc's adjustment pairs with its mmap threshold

_kept: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to their ceilings, once per process.

    Returns True where they are set (now or by an earlier call), False where the C library is
    not glibc or refused them; then nothing changed and training is only slower, so this never
    raises.
    """
    global _kept
    if _kept is None:
        _kept = _set_thresholds()
    return _kept


def _set_thresholds() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
