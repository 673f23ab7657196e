"""linvit.allocator: a compute process keeps freed activation memory instead of page-faulting it
back in every batch (checked by counting minor page faults, in fresh interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from linvit import allocator

# Rounds of three 8 MiB tensors written and freed together, as a batch's activations are; prints
# the minor page faults of 20 rounds after 5 (in which the heap grows to its size either way).
_ROUNDS = """
import resource, sys, torch
from linvit.allocator import keep_freed_memory
print(keep_freed_memory(), file=sys.stderr)
def batch():
    return [torch.ones(2 << 20) for _ in range(3)]
for _ in range(5):
    batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

PAGES = (8 << 20) // 4096  # pages of one tensor


def _faults(**env) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-c", _ROUNDS], capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    return int(proc.stdout.strip()), proc.stderr.strip().splitlines()[-1]


glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                           reason="mallopt is glibc's")


@glibc
def test_freed_tensors_are_reused_without_page_faults():
    kept, was_set = _faults()
    default, was_default = _faults(LINVIT_MALLOC="default")
    assert (was_set, was_default) == ("True", "False")
    # glibc's defaults give the freed 24 MiB back to the kernel: every round faults its pages in again.
    assert default >= 20 * PAGES  # at least a tensor a round
    assert kept < PAGES // 4  # all 20 rounds together: not a quarter of one tensor's pages


def test_linvit_malloc_default_leaves_the_c_library_alone(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "default")
    assert allocator.keep_freed_memory() is False
