"""Shard indexes: byte offsets of every sample's members, for random access and other readers.

Two on-disk forms are written, both derived from one :class:`ShardIndex` per shard:

* a DALI index beside each shard (``shard-000000.idx``), the ``v1.2`` text format that
  DALI's ``wds2idx`` writes and ``fn.readers.webdataset(index_paths=...)`` reads:
  first line ``v1.2 N_SAMPLES``, then one line per sample of
  ``ext data_offset size name`` groups (offsets of member data, in bytes);
* a wids dataset description (``shardindex.json``, ``"__kind__": "wids-shard-index-v1"``)
  listing per shard ``url``, ``nsamples``, ``filesize``, ``md5sum`` plus our ``sha256``,
  ``tokens`` and ``dali_index`` (the per-shard index file, relative to the JSON).

Offsets come from ``tarfile.TarInfo.offset_data``; :func:`read_sample` seeks to them.
"""
from __future__ import annotations

# fsspec is imported where it is used: loader worker processes reading local shards skip its import
import functools
import hashlib
import json
import os
import tarfile
import uuid
from dataclasses import dataclass, field
from typing import BinaryIO

from shards.format.keys import split_name
from shards.format.sample import count_tokens, field_name
from shards.io.reader import ShardError, decode_sample, iter_groups

DALI_INDEX_VERSION = "v1.2"
WIDS_KIND = "wids-shard-index-v1"
WIDS_FILE = "shardindex.json"


@dataclass(frozen=True)
class SampleEntry:
    """One sample's place in a shard.

    Attributes:
        key: the sample key.
        members: ``(suffix, data_offset, size)`` per member in file order; offsets and sizes in bytes.
    """

    key: str
    members: tuple[tuple[str, int, int], ...]


@dataclass
class ShardIndex:
    """Everything known about one shard: its wids listing fields and per-sample offsets.

    Attributes:
        url: shard name or URL as listed in the wids index (relative to the index file).
        nsamples: number of samples.
        filesize: file size in bytes.
        md5sum: hex MD5 of the file (wids checks it).
        sha256: hex SHA-256 of the file (the manifest's checksum).
        tokens: tokens over all ``tokens.npy[.zst]`` members (0 if none).
        samples: per-sample entries in file order.
    """

    url: str
    nsamples: int
    filesize: int
    md5sum: str
    sha256: str
    tokens: int = 0
    samples: list[SampleEntry] = field(default_factory=list)


class HashingReader:
    """Read-through wrapper computing MD5, SHA-256 and size of everything read."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.md5, self.sha256, self.size = hashlib.md5(), hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        """Read up to ``n`` bytes (all when -1) and feed them to both hashes and the size count."""
        b = self._f.read(n)
        self.md5.update(b)
        self.sha256.update(b)
        self.size += len(b)
        return b


def build_shard_index(path: str, url: str | None = None, schema: str = "any") -> ShardIndex:
    """Index one shard in a single sequential pass (hashes, sample offsets, token count).

    Args:
        path: shard path or fsspec URL.
        url: name to list in the wids index (default: the file's base name).
        schema: required fields per sample (``text``, ``image``, ``any``).
    Raises:
        ShardError: the shard is malformed (strict reading, see :func:`shards.io.reader.iter_raw`)
            or a tokens member cannot be decoded.
    """
    samples, tokens = [], 0
    import fsspec
    with fsspec.open(path, "rb") as f:
        hf = HashingReader(f)
        for key, fields, infos in iter_groups(path, hf, schema=schema):
            samples.append(SampleEntry(key, tuple((s, infos[s].offset_data, infos[s].size) for s in fields)))
            for suffix, data in fields.items():
                if field_name(suffix) == "tokens" and ".npy" in suffix:
                    try:
                        tokens += count_tokens(suffix, data)
                    except Exception as e:  # noqa: BLE001 - reported with its location
                        raise ShardError(f"{path}: cannot read member {key}.{suffix}: {e}", "undecodable") from e
        while hf.read(1 << 20):  # hash the end-of-archive padding too
            pass
    return ShardIndex(url or os.path.basename(path), len(samples), hf.size, hf.md5.hexdigest(),
                      hf.sha256.hexdigest(), tokens, samples)


def dali_index_path(shard_path: str) -> str:
    """``shard-000000.tar`` → ``shard-000000.idx`` (the name ``wds2idx`` picks)."""
    return (shard_path[:-4] if shard_path.endswith(".tar") else shard_path) + ".idx"


def write_dali_index(index: ShardIndex, path: str) -> None:
    """Write ``index`` as a DALI ``v1.2`` index file (atomically).

    Raises:
        ShardError: a member name holds whitespace (the format is space-separated).
    """
    lines = [f"{DALI_INDEX_VERSION} {index.nsamples}"]
    for entry in index.samples:
        parts = []
        for suffix, offset, size in entry.members:
            name = f"{entry.key}.{suffix}"
            if len(name.split()) != 1:
                raise ShardError(f"{index.url}: member {name!r} holds whitespace; a DALI index cannot list it")
            parts.append(f"{suffix} {offset} {size} {name}")
        lines.append(" ".join(parts))
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:16]}"  # unique per call: two hosts' writers may share a pid
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def read_dali_index(path: str) -> list[SampleEntry]:
    """Parse a DALI ``v1.2`` index (ours or ``wds2idx``'s) into sample entries.

    Raises:
        ShardError: unknown version, malformed line, or a sample count that does not match.
    """
    import fsspec
    with fsspec.open(path, "r", encoding="utf-8") as f:
        lines = f.read().splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[0] != DALI_INDEX_VERSION:
        raise ShardError(f"{path}: not a DALI {DALI_INDEX_VERSION} index (first line {lines[:1]})")
    entries = []
    for n, line in enumerate(lines[1:], start=2):
        parts = line.split()
        if not parts:
            continue
        if len(parts) % 4:
            raise ShardError(f"{path}: line {n}: expected groups of 'ext offset size name'")
        members = tuple((parts[i], int(parts[i + 1]), int(parts[i + 2])) for i in range(0, len(parts), 4))
        entries.append(SampleEntry(split_name(parts[3])[0], members))
    if len(entries) != int(head[1]):
        raise ShardError(f"{path}: header says {head[1]} samples, found {len(entries)}")
    return entries


def wids_index(indexes: list[ShardIndex], name: str | None = None) -> dict:
    """The wids dataset description for ``indexes`` (``ShardListDataset`` reads it).

    Shard URLs are as given in each :class:`ShardIndex` (relative to the JSON's folder).
    """
    shardlist = [{"url": ix.url, "nsamples": ix.nsamples, "filesize": ix.filesize, "md5sum": ix.md5sum,
                  "sha256": ix.sha256, "tokens": ix.tokens, "dali_index": dali_index_path(ix.url)}
                 for ix in indexes]
    out = {"__kind__": WIDS_KIND, "wids_version": 1, "shardlist": shardlist}
    if name:
        out["name"] = name
    return out


def write_wids_index(indexes: list[ShardIndex], path: str, name: str | None = None) -> None:
    """Write :func:`wids_index` as JSON to ``path`` (atomically)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:16]}"  # unique per call: two hosts' writers may share a pid
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(wids_index(indexes, name), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


@functools.lru_cache(maxsize=64)
def _cached_entries(shard_path: str, idx_path: str | None, stamp: tuple) -> tuple[SampleEntry, ...]:
    if idx_path:
        return tuple(read_dali_index(idx_path))
    return tuple(build_shard_index(shard_path).samples)


def sample_entries(shard_path: str) -> tuple[SampleEntry, ...]:
    """Sample entries of a local shard: from its DALI index beside it, else by scanning the shard.

    Cached per file modification time. Raises ``ShardError`` as the index or shard reader does.
    """
    idx = dali_index_path(shard_path)
    if os.path.exists(idx):
        return _cached_entries(shard_path, idx, (os.stat(idx).st_mtime_ns,))
    st = os.stat(shard_path)
    return _cached_entries(shard_path, None, (st.st_mtime_ns, st.st_size))


def read_sample(shard_path: str, entry_or_i: SampleEntry | int, index: ShardIndex | list | None = None,
                decode: bool = True, fileobj: BinaryIO | None = None, check: bool = True) -> dict:
    """Random access: read one sample by its index entry or by its position in the shard.

    Seeks straight to each member's data; the 512-byte header before it is parsed with
    ``tarfile.TarInfo.frombuf`` to check that the index still matches the shard.

    Args:
        shard_path: shard path or fsspec URL (seekable).
        entry_or_i: a :class:`SampleEntry`, or the sample's 0-based position in the shard.
        index: entries (or a :class:`ShardIndex`) to look ``i`` up in; default :func:`sample_entries`.
        decode: decode fields (``{"__key__", "tokens", "json", ...}``); else ``{suffix: bytes}`` plus ``__key__``.
        fileobj: the shard already open for binary reading (kept open by callers that read many samples).
        check: parse each member's header (about 45 us per member) to catch a stale index; hot
            loops over an index just built or verified may turn it off.
    Raises:
        IndexError: ``i`` is out of range.
        ShardError: the index does not match the shard, the shard is truncated, or a member
            fails to decode; the message names the shard and member.
    """
    if isinstance(entry_or_i, SampleEntry):
        entry = entry_or_i
    else:
        entries = index.samples if isinstance(index, ShardIndex) else index
        entries = sample_entries(shard_path) if entries is None else entries
        if not -len(entries) <= entry_or_i < len(entries):
            raise IndexError(f"{shard_path}: sample {entry_or_i} out of range (shard has {len(entries)})")
        entry = entries[entry_or_i]
    # members of a sample are adjacent: one read covers all their headers and data
    start = min(off for _, off, _ in entry.members) - tarfile.BLOCKSIZE
    end = max(off + size for _, off, size in entry.members)
    if fileobj is not None:
        fileobj.seek(start)
        span = fileobj.read(end - start)
    else:
        import fsspec
        with (open if "://" not in shard_path else fsspec.open)(shard_path, "rb") as f:
            f.seek(start)
            span = f.read(end - start)
    fields = {}
    for suffix, offset, size in entry.members:
        name = f"{entry.key}.{suffix}"
        at = offset - start
        if len(span) < at + size:
            raise ShardError(f"{shard_path}: member {name!r}: truncated ({max(0, len(span) - at)} of {size} bytes)",
                             "truncated")
        fields[suffix] = span[at: at + size]
        if not check:
            continue
        try:
            ti = tarfile.TarInfo.frombuf(span[at - tarfile.BLOCKSIZE: at], "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            raise ShardError(f"{shard_path}: member {name!r}: no tar header at byte {offset - 512} ({e});"
                             " the index is stale: rebuild it with `python -m shards index`", "corrupt") from e
        if ti.size != size or not name.startswith(ti.name):
            raise ShardError(f"{shard_path}: member {name!r}: index says {size} bytes at {offset}, the header "
                             f"there is {ti.name!r} of {ti.size} bytes; rebuild with `python -m shards index`",
                             "corrupt")
    if not decode:
        return {"__key__": entry.key, **fields}
    return decode_sample(shard_path, entry.key, fields)
