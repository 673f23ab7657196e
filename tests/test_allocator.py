"""linvit.allocator: a compute process keeps freed activation memory instead of page-faulting it
back in every batch (checked by counting minor page faults, in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from linvit import allocator

# Rounds of three 8 MiB tensors written and freed together, as a batch's activations are: the
# minor page faults of 20 rounds after 5, first with glibc's initial thresholds fixed (128 KiB:
# every tensor a fresh mapping; fixed, so that what ran before cannot have raised them), then
# after keep_freed_memory().
_ROUNDS = """
import ctypes, ctypes.util, resource, torch
from linvit.allocator import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, keep_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
assert libc.mallopt(M_MMAP_THRESHOLD, 128 << 10) and libc.mallopt(M_TRIM_THRESHOLD, 128 << 10)
def faults():
    for _ in range(5):
        [torch.ones(2 << 20) for _ in range(3)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        [torch.ones(2 << 20) for _ in range(3)]
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults(), keep_freed_memory(), faults())
"""

PAGES = (8 << 20) // 4096  # pages of one tensor

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                           reason="mallopt is glibc's")


@glibc
def test_freed_tensors_are_reused_without_page_faults():
    proc = subprocess.run([sys.executable, "-c", _ROUNDS], capture_output=True, text=True, check=True,
                          env={k: v for k, v in os.environ.items() if k != allocator.ENV})
    small, was_set, kept = proc.stdout.split()
    assert was_set == "True"
    assert int(small) >= 20 * 3 * PAGES * 0.9  # each tensor's pages faulted in afresh, every round
    assert int(kept) < PAGES // 4  # all 20 rounds together: not a quarter of one tensor's pages


def test_linvit_malloc_default_leaves_the_c_library_alone(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "default")
    assert allocator.keep_freed_memory() is False
