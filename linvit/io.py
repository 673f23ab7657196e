"""Atomic file writes and run provenance: an interrupted job never leaves a file that looks complete.

Every file the package writes goes through `atomic_path`: a temporary `.{name}.XXXXXXXX.tmp`
beside the target, renamed onto it only when complete. A job killed mid-write leaves such a
temporary file; `remove_stale_temps` deletes them when a step starts again in that folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

from . import __version__

# The names atomic_path gives its temporary files (mkstemp adds 8 characters of [a-z0-9_]).
_TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{6,}\.tmp$")


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; on success it is synced and renamed onto `path`.

    On failure the temporary file is removed and nothing at `path` changes; an OSError (full disk,
    permissions) is re-raised naming `path`, since the bare error names no file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # a read-only folder: name the file written, not the temporary one
        why = f"cannot write {path}: {err.strerror or err}"
        raise (OSError(err.errno, why) if err.errno else OSError(why)) from err
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the data is on disk before the name says it is complete
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except OSError as err:
        # Only bare errors (ENOSPC from a write names no file) or ones naming the temporary file;
        # subclasses such as urllib's URLError carry their own meaning and pass through.
        if str(path) in str(err) or not (type(err) is OSError or err.filename == tmp):
            raise
        why = err.strerror or str(err)
        raise (OSError(err.errno, f"cannot write {path}: {why}") if err.errno else
               OSError(f"cannot write {path}: {why}")) from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_stale_temps(folder: str | Path, name: str | None = None) -> list[Path]:
    """Delete the temporary files interrupted atomic writes left in `folder` (not recursive);
    with `name`, only those of that one file."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir() if _TEMP_NAME.match(p.name) and p.is_file()
             and (name is None or p.name.startswith(f".{name}."))]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json(path: str | Path, data) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_safetensors(path: str | Path, tensors: dict) -> Path:
    """Tensors to a safetensors file, atomically; a failed write (full disk) is an OSError naming `path`."""
    import safetensors
    import safetensors.torch  # looked up at call time, so a test can stand in for the writer

    with atomic_path(path) as tmp:
        try:
            safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
        except safetensors.SafetensorError as err:
            raise OSError(f"cannot write {path}: {str(err).splitlines()[0]}") from None
    return Path(path)


def read_json(path: str | Path, what: str = "file", keys: tuple[str, ...] = ()) -> dict:
    """A JSON file's object; with `keys`, each of them must be in it. Every failure is one line
    naming the file (and the key)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        where = f" ({err.msg} at line {err.lineno})" if isinstance(err, json.JSONDecodeError) else ""
        raise ValueError(f"{what} {path} is not valid JSON{where}") from None
    if keys and not isinstance(data, dict):
        raise ValueError(f"{what} {path} does not hold a JSON object")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"{what} {path} lacks key(s) {', '.join(map(repr, missing))}")
    return data


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file, read in chunks (shards and weights can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_info(field: str) -> str:
    """A field of /proc/cpuinfo's first processor ("model name", "vendor_id", ...); "" where there
    is none (not Linux, or a field this CPU's architecture does not report)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip().lower() == field:
                return value.strip()
    except OSError:
        pass
    return ""


def code_version() -> dict:
    """What identifies the code that produced a result: the package version and the git revision."""
    return {"linvit_version": __version__, "git_revision": git_revision()}


def provenance(config: dict, **extra) -> dict:
    """What a run writes beside its results: its resolved config, the package version, the git revision."""
    return {"config": config, **code_version(), **extra}
