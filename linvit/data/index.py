"""The shard folder as the loader reads it: the manifest's checks (`read_manifest`), where each
sample of a shard lies and which shards have been checked (random access into webdataset tar
shards, hashed once per machine), and the loader's two reading stages (`_placeholders`: the
samples as (shard, number); `_read_batches`: the samples a batch of those names, read by offset).

A shard's index is the byte offset of each sample's first tar header (plus the end of the last
sample), so a reader fetches one sample with one `os.pread` and parses only its members. The
index doubles as the shard's verification stamp: it records the file's size, mtime_ns and inode
and the sha256 the file had when the index was made, in ``_index/{shard}.json`` beside the shards
(``shards.py`` writes it with each shard) or, where that folder cannot be written, in
``~/.cache/linvit/shard-index/`` (keyed by the shard's resolved path). A shard whose size, mtime
or inode differ from its stamp (rewritten, copied, truncated) is scanned again: read once,
hashed, indexed, and checked against the manifest's sample count and sha256. So a shard is hashed
when written and when first read on a machine, not by every rank every epoch. (A change that keeps
the size, mtime and inode, as a disk's bit rot would, goes unseen until the stamp is removed.)
Ranks that meet an unchecked shard at once take turns (a lock on the index folder): one scans, the
others find its stamp.

Why a tar reader of our own: Python's `tarfile` parses each member's header in Python
(TarInfo.frombuf and friends), 69% of the loader's time on 28x28 PNG shards (two members of a
few hundred bytes per sample). webdataset's own readers go through `tarfile` too, and its indexed
reader for random access, ``wids``, is not part of the pinned webdataset 1.0.2 (it was a separate
module); its tar index (``wids_mmtar``) is built anew at every open by walking every header,
checks no header checksum and ignores GNU long names and pax path records. `_TarReader` parses
what webdataset's shards need (ustar/GNU headers, GNU long names, pax path records) with each
header's checksum checked, hashes as it reads when asked, and records each member's offset. The
samples are grouped by webdataset's own `group_by_keys`, so a sample read here is the dict the
library would give.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
from array import array
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from webdataset.tariterators import base_plus_ext, group_by_keys

from linvit.data.sources import DataError, MissingDataError
from linvit.io import write_text

_REQUIRED_KEYS = ("classes", "num_classes", "image_size", "channels", "mean", "std", "splits")
INDEX = "_index"  # beside the shards: {shard}.json, each shard's index and verification stamp
# Where a reader keeps the indexes of shards whose folder it cannot write.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "linvit" / "shard-index"
# A tar block; headers, and the padding after each member's data, come in these.
BLOCK = 512
READ_CHUNK = 1 << 20  # bytes read (and hashed) at a time
OPEN_SHARDS = 32  # shard files a reader keeps open (the least recently read is closed first)
_META_NAME = re.compile(r"__[^/]*__($|/)")  # webdataset's metadata members (skipped, as it skips them)


class _TarReader:
    """The regular members of one tar file as (name, bytes), read in 1 MiB chunks that are also
    hashed (``digest``: False for none), so reading checks the shard's sha256 too; `entries` also
    gives each member's offset (of its first header, a GNU long name's or pax header's included).

    Why not `tarfile`: see the module docstring. This parses ustar/GNU headers (name, prefix, size,
    type), GNU long names and pax path/size records, with the header checksum checked, so a damaged
    header is an error rather than garbage; everything else (directories, links) is skipped, as
    webdataset does.
    """

    def __init__(self, f, digest: bool = True):
        self.f = f
        self.digest = hashlib.sha256() if digest else None
        self.buf, self.pos = b"", 0
        self.offset = 0  # of the next unread byte, from the start of the file
        self.read = 0  # bytes read from the file

    def _take(self, n: int, skip: int = 0) -> bytes:
        """The next n bytes; the `skip` bytes after them (a member's padding) are passed over."""
        if len(self.buf) - self.pos < n + skip:
            chunk = self.f.read(max(READ_CHUNK, n + skip))
            self.read += len(chunk)
            if self.digest is not None:
                self.digest.update(chunk)
            self.buf, self.pos = self.buf[self.pos:] + chunk, 0
            if len(self.buf) < n + skip:
                raise DataError(f"unexpected end of data ({len(self.buf)} of {n + skip} bytes)")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n + skip
        self.offset += n + skip
        return out

    def members(self) -> Iterator[tuple[str, bytes]]:
        return ((name, data) for name, data, _ in self.entries())

    def entries(self, end: int | None = None) -> Iterator[tuple[str, bytes, int]]:
        """(name, data, offset of the member's first header); stops at the end-of-archive marker,
        or at byte `end` (a sample's range, read alone)."""
        long_name = pax = None
        start = None
        while end is None or self.offset < end:
            start = self.offset if start is None else start
            header = self._take(BLOCK)
            if header[0] == 0 and header.count(0) == BLOCK:  # (a member's name is never empty)
                self.offset -= BLOCK  # the marker's offset: where the last sample ends
                return  # end-of-archive marker
            try:
                stored = int(header[148:156].replace(b"\0", b" ").strip() or b"0", 8)
                size = int(header[124:136].replace(b"\0", b" ").strip() or b"0", 8)
            except ValueError:
                raise DataError("bad tar header (size or checksum not a number)") from None
            if stored != sum(header) - sum(header[148:156]) + 8 * 32:  # the checksum counts itself as spaces
                raise DataError("bad tar header checksum")
            kind = header[156:157]
            data = self._take(size, skip=-size % BLOCK)  # the data, then padding to the next block
            if kind == b"L":  # GNU long name: the next member's name
                long_name = data.rstrip(b"\0").decode("utf-8")
                continue
            if kind == b"x":  # pax extended header: the next member's path and size
                pax = _pax_records(data)
                continue
            if kind not in (b"0", b"\0", b""):
                long_name = pax = start = None
                continue  # directories, links, global pax headers: no sample data
            name = header[:100].split(b"\0", 1)[0].decode("utf-8")
            if header[257:262] == b"ustar" and header[345] != 0:
                name = header[345:500].split(b"\0", 1)[0].decode("utf-8") + "/" + name
            if pax and "size" in pax:  # the data is what the pax record says, not the header field
                raise DataError("pax size records are not supported")
            name = (pax or {}).get("path") or long_name or name
            long_name = pax = None
            if not _META_NAME.match(name):
                yield name, data, start
            start = None

    def hexdigest_of_rest(self) -> str:
        # The padding after the end-of-archive marker is part of the file too.
        while chunk := self.f.read(READ_CHUNK):
            self.read += len(chunk)
            self.digest.update(chunk)
        return self.digest.hexdigest()


def _pax_records(data: bytes) -> dict[str, str]:
    """'<length> <key>=<value>\\n' records of a pax header."""
    out, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        length = int(data[pos:data.index(b" ", pos)])
        key, _, value = data[data.index(b" ", pos) + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8")] = value.decode("utf-8")
        pos += length
    return out


def scan(path: str | Path) -> tuple[str, list[int] | None, str | None, int]:
    """One read of a shard: (sha256, sample offsets or None, why it does not parse or None, bytes
    read). Offsets: each sample's first byte (samples grouped as webdataset's `group_by_keys` groups
    them: a new sample where a member's key changes), then the end of the last sample."""
    with open(path, "rb") as f:
        reader = _TarReader(f)
        offsets, key, why = [], None, None
        try:
            for name, _, start in reader.entries():
                prefix, _ = base_plus_ext(name)
                if prefix is not None and prefix != key:
                    offsets.append(start)
                    key = prefix
            offsets.append(reader.offset)
        except (DataError, UnicodeDecodeError, ValueError) as e:
            offsets, why = None, (str(e) if isinstance(e, DataError) else f"{type(e).__name__}: {e}")
        return reader.hexdigest_of_rest(), offsets, why, reader.read


def _stamp(st: os.stat_result) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def write_index(path: str | Path, sha256: str, offsets: list[int], st: os.stat_result | None = None) -> Path:
    """A shard's index and stamp (its file as it is now) into `_index/` beside it (see the module
    docstring); returns where it went. `st`: the stat the scan began from (else taken now)."""
    path = Path(path)
    st = os.stat(path) if st is None else st
    record = {"shard": path.name, "sha256": sha256, **_stamp(st), "samples": len(offsets) - 1,
              "offsets": offsets}
    text = json.dumps(record, separators=(",", ":")) + "\n"
    try:
        return write_text(path.parent / INDEX / f"{path.name}.json", text)
    except OSError:  # a folder this process cannot write (read-only storage): the cache
        return write_text(_cached_index(path), text)


def _cached_index(path: Path) -> Path:
    real = os.path.realpath(path)
    return CACHE / f"{hashlib.sha256(real.encode()).hexdigest()[:16]}-{path.name}.json"


def _record(path: Path, st: os.stat_result) -> dict | None:
    """`path`'s index record (beside it, else in the cache) whose stamp is the file as it is (`st`)."""
    for record_path in (path.parent / INDEX / f"{path.name}.json", _cached_index(path)):
        try:
            record = json.loads(record_path.read_text())
            if all(record[k] == v for k, v in _stamp(st).items()) and isinstance(record["offsets"], list):
                return record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def stamped_sha256(path: str | Path) -> str | None:
    """The sha256 `path`'s stamp vouches for (the file unchanged since: size, mtime, inode), or None."""
    try:
        record = _record(Path(path), os.stat(path))
    except OSError:
        return None
    return None if record is None else record["sha256"]


@contextmanager
def _turn(path: Path):
    """This process's turn to scan the shards of `path`'s folder (an exclusive lock on the index
    folder, where there is one to open): ranks starting together do not all hash the same shard."""
    try:
        (path.parent / INDEX).mkdir(exist_ok=True)
        fd = os.open(path.parent / INDEX, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (Lustre mounted noflock): each may scan
            pass
        yield
    finally:
        os.close(fd)  # closing releases the lock


class Checked:
    """Stamped, indexed shards of one folder, for one process: `offsets` gives a shard's index,
    checked against its stamp, scanning the shard when the stamp is missing or stale; the errors
    name the shard. `bytes_read` counts the shard bytes this object read (scans and samples)."""

    def __init__(self):
        self.offsets_of: dict[str, array] = {}  # int64s: a third of a list's memory (ImageNet: 10 MB)
        self.bytes_read = 0

    def offsets(self, path: str | Path, samples: int, sha256: str, *, verifying: bool = False) -> array:
        """`path`'s sample offsets. A shard that is missing, does not parse, has another sample
        count or sha256 than the manifest's raises naming it (``verifying``: in the words of
        `ShardSet.verify`)."""
        key = str(path)
        if key in self.offsets_of:
            return self.offsets_of[key]
        path = Path(path)
        offsets = self._stamped(path, samples, sha256)
        if offsets is None:
            with _turn(path):
                offsets = self._stamped(path, samples, sha256)  # another rank's scan, meanwhile
                if offsets is None:
                    offsets = self._scan(path, samples, sha256, verifying)
        self.offsets_of[key] = offsets = array("q", offsets)
        return offsets

    def _stamped(self, path: Path, samples: int, sha256: str) -> list[int] | None:
        """The offsets of `path`'s stamped index, if it vouches for the manifest's sha256 and count."""
        try:
            record = _record(path, os.stat(path))
        except FileNotFoundError:
            raise MissingDataError(f"{path}: shard missing") from None
        if record is None or record["sha256"] != sha256 or len(record["offsets"]) != samples + 1:
            return None
        return record["offsets"]

    def _scan(self, path: Path, samples: int, sha256: str, verifying: bool) -> list[int]:
        try:
            st = os.stat(path)
            digest, offsets, why, read = scan(path)
        except FileNotFoundError:
            raise MissingDataError(f"{path}: shard missing") from None
        self.bytes_read += read
        if verifying and digest != sha256:
            raise DataError(f"{path}: sha256 differs from _info.json (corrupt or rewritten shard)")
        if why is not None:
            raise DataError(f"{path}: corrupt shard ({why})")
        # A damaged member's data passes the header checks, so count and hash as well.
        if len(offsets) - 1 != samples:
            raise DataError(f"{path}: corrupt shard ({len(offsets) - 1} samples, manifest says {samples})")
        if digest != sha256:
            raise DataError(f"{path}: corrupt shard (sha256 differs from the manifest)")
        try:
            write_index(path, digest, offsets, st)
        except OSError:
            pass  # nowhere to keep it: this process keeps it in memory, the next one scans again
        return offsets


def read_run(fd: int, url: str, offsets, first: int, stop: int, checked: Checked) -> list[dict]:
    """Samples first..stop-1 of the open shard `fd` (at `url`), read with one pread, each the dict
    webdataset's `group_by_keys` gives."""
    start, end = offsets[first], offsets[stop]
    data = os.pread(fd, end - start, start)
    checked.bytes_read += len(data)
    if len(data) != end - start:
        raise DataError(f"{url}: corrupt shard (unexpected end of data at byte {start + len(data)})")
    reader = _TarReader(io.BytesIO(data), digest=False)
    try:
        files = (dict(fname=name, data=d, __url__=url) for name, d, _ in reader.entries(end - start))
        samples = list(group_by_keys(files))
    except Exception as e:  # DataError from the reader, duplicate names... webdataset appends context to args
        reason = str(e.args[0]).split(" @ ")[0] if e.args else type(e).__name__
        raise DataError(f"{url}: corrupt shard ({reason})") from e
    if len(samples) != stop - first:
        raise DataError(f"{url}: corrupt shard ({len(samples)} samples at bytes {start}..{end}, "
                        f"its index says {stop - first})")
    return samples


def _placeholders(src: Iterator[dict], expected: dict[str, tuple[int, str]]) -> Iterator[tuple[str, int]]:
    """Pipeline stage: shard URLs in, (url, sample number) out, as many as the manifest says."""
    for item in src:
        url = item["url"]
        yield from ((url, i) for i in range(expected[url][0]))


def _read_batches(src: Iterator[list[tuple[str, int]]], expected: dict[str, tuple[int, str]],
                  checked: Checked) -> Iterator[list[dict]]:
    """Pipeline stage: batches of placeholders in, batches of samples (webdataset's dicts) out.
    A run of consecutive samples of one shard is read with one pread; a shard is checked (its
    stamp, else a scan) when first met, so an error names it after the batches before it."""
    files: OrderedDict[str, int] = OrderedDict()
    try:
        for batch in src:
            samples, i = [], 0
            while i < len(batch):
                url, first = batch[i]
                stop = first + 1
                while i + stop - first < len(batch) and batch[i + stop - first] == (url, stop):
                    stop += 1
                offsets = checked.offsets(url, *expected[url])
                if url not in files:
                    if len(files) >= OPEN_SHARDS:
                        os.close(files.popitem(last=False)[1])
                    try:
                        files[url] = os.open(url, os.O_RDONLY)
                    except FileNotFoundError:
                        raise MissingDataError(f"{url}: shard missing") from None
                files.move_to_end(url)
                samples += read_run(files[url], url, offsets, first, stop, checked)
                i += stop - first
            yield samples
    finally:
        for fd in files.values():
            os.close(fd)


def read_manifest(path: Path) -> dict:
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise MissingDataError(f"{path}: no shard manifest (shards not written, or writing was interrupted)") from None
    except (OSError, ValueError) as e:  # ValueError covers bad JSON and bad UTF-8
        raise DataError(f"{path}: corrupt shard manifest ({e})") from e
    if not isinstance(info, dict):
        raise DataError(f"{path}: corrupt shard manifest (not a JSON object)")
    for key in _REQUIRED_KEYS:
        if key not in info:
            raise DataError(f"{path}: shard manifest lacks key {key!r}")
    wrong = _manifest_type_error(info)
    if wrong:
        raise DataError(f"{path}: shard manifest key {wrong}")
    for split, entry in info["splits"].items():
        try:
            consistent = sum(s["samples"] for s in entry["shards"]) == entry["samples"] and all(
                isinstance(s["name"], str) and isinstance(s["sha256"], str) for s in entry["shards"])
        except (KeyError, TypeError) as e:
            raise DataError(f"{path}: split {split!r} entry is malformed ({type(e).__name__}: {e})") from None
        if not consistent:
            raise DataError(f"{path}: split {split!r} shard entries do not add up to {entry['samples']} samples")
    return info


def _manifest_type_error(info: dict) -> str | None:
    """What is wrong with the types of a manifest's fields (as `shards.write_shards` writes them),
    or None: the readers index and do arithmetic with them, where a wrong type fails far away."""
    def whole(v, low=1):
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    def numbers(v):
        return isinstance(v, list) and len(v) == info["channels"] and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)

    size = info["image_size"]
    if not whole(info["num_classes"]):
        return f"'num_classes' is {info['num_classes']!r}, not a positive whole number"
    if not isinstance(info["classes"], list) or len(info["classes"]) != info["num_classes"]:
        return f"'classes' is not a list of its {info['num_classes']} class names"
    if info["channels"] not in (1, 3) or isinstance(info["channels"], bool):
        return f"'channels' is {info['channels']!r}, not 1 or 3"
    if size is not None and not (isinstance(size, list) and len(size) == 2 and all(whole(s) for s in size)):
        return f"'image_size' is {size!r}, not [height, width] (or null for images of mixed sizes)"
    for key in ("mean", "std"):
        if not numbers(info[key]):
            return f"{key!r} is {info[key]!r}, not one number per channel"
    if not isinstance(info["splits"], dict):
        return "'splits' is not a mapping of split names to their shards"
    return None
