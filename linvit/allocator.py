"""The C allocator's settings for a compute process: freed activation memory stays in the process.

PyTorch's CPU tensors come from the C library's malloc. glibc serves a block above its mmap
threshold (128 KiB at start, raised on the fly) with a fresh mapping, unmaps it when freed, and
gives the top of its heap back to the kernel above its trim threshold. A training or evaluation
step allocates and frees the same megabytes of activations every batch, so each batch writes to
fresh pages, and the kernel zeroes every page on first touch. Measured on this project's machine
(micro ViT, eval batches of 256, one thread): 400-820K minor page faults and 129-170 ms per batch
with glibc's defaults, 147-151K and 97-115 ms with both thresholds fixed as here.

The mmap threshold is glibc's own ceiling for its dynamic one (32 MiB on 64-bit): blocks up to
that size come from the heap, larger ones are still mapped and unmapped. The trim threshold is
1 GiB: at 64 MiB (twice the mmap threshold, the ratio glibc keeps when it raises them itself) the
operator benchmark's module steps at 4,096 tokens ran 5-20% slower than with glibc's defaults in
two alternating rounds, with about as many page faults (why is not established); at 1 GiB they
ran as with the defaults. Trimming less never raises a process's peak memory; it only keeps what
a peak took until the process ends. Elsewhere (macOS, musl) there is no `mallopt` and nothing
changes. Numbers are unaffected (torch aligns every CPU buffer to 64 bytes itself, whichever way
the memory was obtained): a 20-step student's weights and test predictions were the same bytes
with and without these settings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit glibc
TRIM_THRESHOLD = 1 << 30

# LINVIT_MALLOC=default leaves the C library's settings as they are.
ENV = "LINVIT_MALLOC"


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (see the module docstring); True when
    they were set, False where there is no glibc, or with LINVIT_MALLOC=default."""
    if os.environ.get(ENV, "").strip().lower() == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The mmap threshold first: setting either one stops glibc adjusting both on the fly.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
