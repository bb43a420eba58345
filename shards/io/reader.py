"""Reading shards: a streaming iterator of samples, strict or lenient.

Members are grouped into samples by key (name up to the first dot after the last
slash, as webdataset, wids and DALI do); members of one sample must be adjacent.
Strict reading (the default) raises :class:`ShardError` at the first fault; lenient
reading (pass a :class:`ReadStats`) skips the faulty sample, counts the fault by class
and keeps its message. Every message names the shard and the member.

tarfile stops silently at a corrupt or truncated header after the first member, so
after the last member the reader checks that the two zero blocks of the end-of-archive
marker follow (POSIX.1-1988 ustar: "two consecutive 512-byte blocks of zeros").
"""
from __future__ import annotations

# fsspec is imported where it is used: loader worker processes reading local shards skip its import
import collections
import logging
import tarfile
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from shards.format.keys import split_name
from shards.format.sample import decode_member, missing_fields

log = logging.getLogger("shards")

END_OF_ARCHIVE = 2 * tarfile.BLOCKSIZE
MAX_MESSAGES = 1000

# Fault classes, as counted in ReadStats.counts and named in ShardError.kind.
FAULTS = ("duplicate_member", "non_adjacent", "no_suffix", "not_regular", "missing_field",
          "undecodable", "truncated", "corrupt")


class ShardError(Exception):
    """A shard is malformed; the message names the shard and member.

    Attributes:
        kind: the fault class (one of :data:`FAULTS` or a manifest check such as ``checksum_mismatch``).
    """

    def __init__(self, message: str, kind: str = "corrupt"):
        super().__init__(message)
        self.kind = kind


@dataclass
class ReadStats:
    """Faults met while reading leniently: counts per fault class and the first messages.

    Attributes:
        counts: fault class → number of occurrences.
        messages: the first :data:`MAX_MESSAGES` fault messages (each names shard and member).
        samples: samples yielded by :func:`iter_samples`.
    """

    counts: collections.Counter = field(default_factory=collections.Counter)
    messages: list[str] = field(default_factory=list)
    samples: int = 0

    @property
    def faults(self) -> int:
        """Faults of every kind counted so far."""
        return sum(self.counts.values())

    def add(self, kind: str, message: str) -> None:
        """Count one fault of ``kind``, keep its message (up to ``MAX_MESSAGES``) and log a warning."""
        self.counts[kind] += 1
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(message)
        log.warning("skipped (%s): %s", kind, message)


def _fault(stats: ReadStats | None, kind: str, message: str) -> None:
    """Raise in strict mode (no stats), count in lenient mode."""
    if stats is None:
        raise ShardError(message, kind)
    stats.add(kind, message)


class _TailReader:
    """Read-through wrapper keeping the last bytes read, so the end-of-archive marker can be checked
    after tarfile's stream reader (which reads ahead) has finished."""

    def __init__(self, f: BinaryIO, keep: int = 8 * tarfile.RECORDSIZE):
        self._f, self._keep = f, keep
        self._chunks: collections.deque[tuple[int, bytes]] = collections.deque()
        self._kept = 0
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        if b:
            self._chunks.append((self.pos, b))
            self.pos += len(b)
            self._kept += len(b)
            while self._kept - len(self._chunks[0][1]) >= self._keep:
                self._kept -= len(self._chunks.popleft()[1])
        return b

    def bytes_at(self, start: int, n: int) -> bytes:
        """Bytes ``[start, start + n)`` of the stream (fewer at end of file)."""
        while self.pos < start + n and self.read(start + n - self.pos):
            pass
        out = b"".join(b[max(0, start - p): start + n - p] for p, b in self._chunks
                       if p < start + n and p + len(b) > start)
        if self._chunks and self._chunks[0][0] > start:
            raise ShardError(f"internal: end-of-archive bytes at {start} no longer buffered")
        return out


def _end_ok(path: str, tail: bytes, offset: int, last: str, stats: ReadStats | None) -> bool:
    """Check the end-of-archive marker at ``offset``; False (after counting) when it is missing."""
    if len(tail) < END_OF_ARCHIVE:
        _fault(stats, "truncated", f"{path}: truncated after member {last!r}: the file ends at byte "
               f"{offset + len(tail)} without the end-of-archive marker; rewrite or re-download the shard")
        return False
    if tail.count(0) != END_OF_ARCHIVE:
        _fault(stats, "corrupt", f"{path}: corrupt tar header at byte {offset} after member {last!r} "
               "(tar readers stop there); rewrite or re-download the shard")
        return False
    return True


def iter_raw(path: str, fileobj=None, *, stats: ReadStats | None = None,
             schema: str = "any") -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield ``(key, {suffix: bytes})`` per sample, in file order, without decoding.

    Args:
        path: shard path or fsspec URL (used in messages; opened when ``fileobj`` is None).
        fileobj: an open binary stream of the shard, read sequentially from its start.
        stats: lenient mode: skip faulty samples and count faults here (default: strict).
        schema: required fields, ``"text"``, ``"image"`` or ``"any"`` (see ``shards.format.sample.SCHEMAS``).
    Raises:
        ShardError (strict mode): truncated or corrupt tar, a member without a suffix or that is
            not a regular file, a key whose members are not adjacent, a duplicate member, or a
            sample missing a required field; ``ShardError.kind`` names the fault class.
    """
    for key, fields, _ in iter_groups(path, fileobj, stats=stats, schema=schema):
        yield key, fields


def iter_groups(path: str, fileobj=None, *, stats: ReadStats | None = None, schema: str = "any"
                ) -> Iterator[tuple[str, dict[str, bytes], dict[str, tarfile.TarInfo]]]:
    """Like :func:`iter_raw`, also yielding each member's ``tarfile.TarInfo`` (``offset_data``, ``size``)."""
    if fileobj is None:
        import fsspec
        with fsspec.open(path, "rb") as f:
            yield from iter_groups(path, f, stats=stats, schema=schema)
        return
    src = _TailReader(fileobj)
    seen: set[str] = set()
    key, fields, infos, bad = None, {}, {}, False
    member = "<first header>"

    def complete():
        if key is None or bad:
            return None
        missing = missing_fields(fields, schema)
        if missing:
            _fault(stats, "missing_field", f"{path}: sample {key!r} has no member {key}.{missing[0]}.* "
                   f"(required by schema {schema!r}); members: {', '.join(sorted(fields))}")
            return None
        return key, fields, infos

    try:
        tar = tarfile.open(fileobj=src, mode="r|")
        for ti in tar:
            member = ti.name
            if ti.isdir():
                continue
            if not ti.isreg():
                _fault(stats, "not_regular", f"{path}: member {ti.name!r} is not a regular file")
                continue
            k, suffix = split_name(ti.name)
            if not suffix:
                _fault(stats, "no_suffix", f"{path}: member {ti.name!r} has no field suffix")
                continue
            if k != key:
                done = complete()
                if done:
                    yield done
                key, fields, infos, bad = k, {}, {}, False
                if k in seen:
                    bad = True
                    _fault(stats, "non_adjacent", f"{path}: member {ti.name!r}: key {k!r} appears again after "
                           "other keys (members of a sample must be adjacent)")
                seen.add(k)
            data = tar.extractfile(ti).read()
            if suffix in fields:
                bad = True
                _fault(stats, "duplicate_member", f"{path}: duplicate member {ti.name!r}")
            fields[suffix], infos[suffix] = data, ti
        if not _end_ok(path, src.bytes_at(tar.offset, END_OF_ARCHIVE), tar.offset, member, stats):
            return  # the pending sample may have lost members: dropped (the fault is counted)
    except (tarfile.TarError, EOFError, OSError) as e:
        kind = "truncated" if isinstance(e, EOFError) or str(e) in ("unexpected end of data", "empty file") \
            else "corrupt"
        _fault(stats, kind, f"{path}: unreadable tar at member {member!r}: {e}; rewrite or re-download the shard")
        return  # the pending sample may be incomplete: dropped (and counted above)
    done = complete()
    if done:
        yield done


def decode_sample(path: str, key: str, fields: dict[str, bytes]) -> dict:
    """Decode raw fields into ``{"__key__": key, field: value, ...}``.

    Raises:
        ShardError: a member fails to decode (message names shard and member; kind ``undecodable``).
    """
    sample = {"__key__": key}
    for suffix, data in fields.items():
        try:
            name, value = decode_member(suffix, data)
        except Exception as e:  # noqa: BLE001 - any decoder failure is reported with its location
            raise ShardError(f"{path}: cannot decode member {key}.{suffix}: {type(e).__name__}: {e}",
                             "undecodable") from e
        sample[name] = value
    return sample


def iter_samples(path: str, fileobj=None, *, stats: ReadStats | None = None, schema: str = "any") -> Iterator[dict]:
    """Yield decoded samples of one shard: ``{"__key__": str, "tokens": np.ndarray, "json": dict, ...}``.

    Arguments and errors as :func:`iter_raw`; a member that fails to decode raises
    :class:`ShardError` (kind ``undecodable``), or is skipped and counted with ``stats``.
    """
    for key, fields in iter_raw(path, fileobj, stats=stats, schema=schema):
        try:
            sample = decode_sample(path, key, fields)
        except ShardError as e:
            _fault(stats, e.kind, str(e))
            continue
        if stats is not None:
            stats.samples += 1
        yield sample
