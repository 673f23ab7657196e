import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# A wait on another process (its end, a file it writes, a state a daemon reaches) is bounded by
# patient(seconds): the seconds the wait needed with room to spare on an idle 2-core machine, times a
# scale, so that a test fails because something is wrong, not because the machine is busy. The scale is
# LINVIT_TEST_TIMEOUT_SCALE where set (1: the bare values), else DEFAULT_TIMEOUT_SCALE or the machine's
# load per CPU when the wait starts (1-minute load average / CPUs), whichever is larger: a suite beside a
# training run at load 8-16 on 2 cores waits up to 8x. Only a wait that fails is longer.
DEFAULT_TIMEOUT_SCALE = 4.0
_SCALE = os.environ.get("LINVIT_TEST_TIMEOUT_SCALE", "").strip()
try:
    _GIVEN_SCALE = float(_SCALE) if _SCALE else None
except ValueError:
    _GIVEN_SCALE = math.nan


def pytest_configure(config):
    if _GIVEN_SCALE is not None and not (math.isfinite(_GIVEN_SCALE) and _GIVEN_SCALE > 0):
        raise pytest.UsageError(f"LINVIT_TEST_TIMEOUT_SCALE={_SCALE!r}: expected a positive number, the factor on "
                                "every timeout a test sets for another process (e.g. 4)")


def timeout_scale() -> float:
    """The factor on a wait's seconds (see above), read when the wait starts."""
    if _GIVEN_SCALE is not None:
        return _GIVEN_SCALE
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        load = 0.0
    return max(DEFAULT_TIMEOUT_SCALE, load)


def patient(seconds: float) -> float:
    """`seconds`, the bound of a wait on another process on an idle machine, scaled for this one's load."""
    return seconds * timeout_scale()


def run(cmd, cwd, check=True, **kw):
    """Run a command with the test interpreter's environment on PATH (linvit, snakemake)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def repo():
    return REPO


# A tiny synthetic dataset, and a module's shards of it (the checkpoint and device tests train on it).
TINY_SYNTHETIC = {"source": "synthetic", "num_classes": 4, "train_samples": 64, "test_samples": 32}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from linvit.data import write_shards

    out = tmp_path_factory.mktemp("shards")
    write_shards("synthetic", TINY_SYNTHETIC, out, samples_per_shard=64)
    return out


@pytest.fixture
def quiet_machine(monkeypatch):
    """One torch thread (the machine is shared) and a fixed git revision (commits landing mid-test
    must not change the code version between a stopped run and its rerun)."""
    import torch

    import linvit.io as lio

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(lio, "git_revision", lambda: "test-revision")
    yield
    torch.set_num_threads(threads)
