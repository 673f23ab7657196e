import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


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
