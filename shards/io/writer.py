"""Writing shards: plain tar (GNU format), deterministic headers, atomic commit.

Every header carries a fixed mtime, owner and mode so the same samples always give
byte-identical shards. A shard is written under a temporary name unique to the writer
(``NAME.<random hex>.partial``) and renamed into place when closed, so no reader ever sees a
partial shard, and two writers of one shard (a retried or speculative task on a shared
filesystem) never write into the same file: the last rename wins, and both wrote the same bytes.
"""
from __future__ import annotations

import hashlib
import os
import tarfile
import uuid
from typing import BinaryIO, Sequence

import numpy as np

from shards.format.blocks import Block, BlockPacker, is_block
from shards.format.keys import member_name
from shards.format.manifest import ShardInfo

FIXED_MTIME = 0
FIXED_MODE = 0o444
TMP_SUFFIX = ".partial"
# Shards stop at 4 GiB (the writer refuses to grow past it): bounded downloads, retries and
# cache slots, and no member ever needs GNU base-256 size fields, which wids cannot parse.
MAX_SHARD_BYTES = 4 << 30
DEFAULT_BLOCK_SHARD_BYTES = 256 << 20  # TokenBlockWriter's shard size when no limit is given


class _HashingFile:
    """File wrapper that hashes and counts every byte written."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, b: bytes) -> int:
        self.sha256.update(b)
        self.size += len(b)
        return self._f.write(b)


def sample_tar_bytes(fields: dict[str, bytes]) -> int:
    """Tar bytes one sample adds: a 512-byte header per member plus data padded to 512 bytes."""
    return sum(tarfile.BLOCKSIZE + -(-len(v) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE for v in fields.values())


def _header_template() -> bytearray:
    """The 512-byte GNU tar header every member shares (POSIX ustar layout with the GNU magic): regular
    file, mode :data:`FIXED_MODE`, uid/gid 0, no owner names, mtime :data:`FIXED_MTIME`; name and size
    empty and the checksum field blank (eight spaces, as the checksum counts it)."""
    h = bytearray(tarfile.BLOCKSIZE)
    h[100:108] = b"%07o\0" % FIXED_MODE
    h[108:116] = h[116:124] = b"%07o\0" % 0  # uid, gid
    h[136:148] = b"%011o\0" % FIXED_MTIME
    h[148:156] = b" " * 8
    h[156:157] = tarfile.REGTYPE
    h[257:265] = tarfile.GNU_MAGIC
    return h


_HEADER = _header_template()


def _member_header(name: str, size: int) -> bytes:
    """The tar header :mod:`tarfile` writes (GNU format) for member ``name`` (ASCII, at most 100
    bytes: :func:`shards.format.keys.member_name`) of ``size`` bytes (< 8 GiB), built directly:
    ``TarInfo.tobuf`` costs about 3x more, paid per document by one-document-per-sample shards."""
    h = _HEADER.copy()
    h[:len(name)] = name.encode("ascii")
    h[124:136] = b"%011o\0" % size
    h[148:155] = b"%06o\0" % sum(h)  # the checksum: every byte, its own field counted as spaces
    return bytes(h)


class TarShardWriter:
    """Write one shard file.

    Usage::

        with TarShardWriter("out/shard-000000.tar") as w:
            w.write("doc1", {"tokens.npy.zst": b"...", "json": b"{}"})
        info = w.info  # ShardInfo with sha256 and byte size

    ``tokens`` passed to :meth:`write` is added to the shard's token count. Members are
    written in GNU tar format with one 512-byte header each: names that would need a
    GNU longname or PAX header are refused (see :func:`shards.format.keys.member_name`).

    Args:
        path: final shard path; bytes go to ``path + ".<16 random hex>.partial"`` (unique per
            writer, so concurrent attempts at one shard never share it) until :meth:`close`
            renames that file onto ``path`` (atomic on POSIX filesystems).
        limit_bytes: hard cap on the finished file's size in bytes (default 4 GiB).
    """

    def __init__(self, path: str, limit_bytes: int = MAX_SHARD_BYTES):
        self.path = path
        self.limit_bytes = limit_bytes
        self.tmp_path = f"{path}.{uuid.uuid4().hex[:16]}{TMP_SUFFIX}"
        self._raw = open(self.tmp_path, "wb")
        self._out = _HashingFile(self._raw)
        self._keys: set[str] = set()
        self.samples = 0
        self.tokens = 0
        self.documents = 0
        self.blocks = 0
        self.info: ShardInfo | None = None

    @property
    def bytes_written(self) -> int:
        """Real tar bytes so far (headers and padding included, end-of-archive blocks not yet)."""
        return self._out.size

    def write(self, key: str, fields: dict[str, bytes], tokens: int = 0, documents: int = 1) -> None:
        """Append one sample: ``fields`` maps suffix (``json``, ``tokens.npy.zst``) to bytes.

        ``tokens`` and ``documents`` (a token block holds many, see :mod:`shards.format.blocks`) are added
        to the shard's counts; a token block also counts as a block.

        Raises:
            ValueError: no fields, a bad key or suffix (see :func:`shards.format.keys.member_name`),
                a duplicate key, or a sample that would grow the shard past ``limit_bytes``
                (nothing is written then; close this shard and start another).
        """
        if not fields:
            raise ValueError(f"{self.path}: sample {key!r} has no fields")
        try:
            names = {suffix: member_name(key, suffix) for suffix in fields}
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from None
        if key in self._keys:
            raise ValueError(f"{self.path}: duplicate sample key {key!r}")
        if final_size(self.bytes_written + sample_tar_bytes(fields)) > self.limit_bytes:
            raise ValueError(f"{self.path}: sample {key!r} would grow the shard past {self.limit_bytes} bytes;"
                             " use ShardSequenceWriter(max_bytes=...) to roll over to a new shard")
        self._keys.add(key)
        for suffix in sorted(fields):  # members of a sample adjacent and sorted
            # the bytes tarfile.addfile writes, without its copy through a BytesIO in 16 KiB pieces
            data = fields[suffix]
            self._out.write(_member_header(names[suffix], len(data)))
            self._out.write(data)
            if len(data) % tarfile.BLOCKSIZE:
                self._out.write(tarfile.NUL * (tarfile.BLOCKSIZE - len(data) % tarfile.BLOCKSIZE))
        self.samples += 1
        self.tokens += tokens
        self.documents += documents
        self.blocks += is_block(fields)

    def close(self) -> ShardInfo:
        """Finish the archive, fsync, rename into place; returns the shard's :class:`ShardInfo`.

        Raises ``ValueError`` when no sample was written (an empty shard is never left behind).
        """
        # end of archive as tarfile.close writes it: two zero blocks, then zeros up to a whole record
        self._out.write(tarfile.NUL * (2 * tarfile.BLOCKSIZE))
        self._out.write(tarfile.NUL * (final_size(self._out.size - 2 * tarfile.BLOCKSIZE) - self._out.size))
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        if self.samples == 0:
            os.unlink(self.tmp_path)
            raise ValueError(f"{self.path}: refusing to write an empty shard")
        os.replace(self.tmp_path, self.path)
        self.info = ShardInfo(os.path.basename(self.path), self.samples, self.tokens,
                              self._out.size, self._out.sha256.hexdigest(), self.documents, self.blocks)
        return self.info

    def abort(self) -> None:
        """Drop the partial file."""
        self._raw.close()
        if os.path.exists(self.tmp_path):
            os.unlink(self.tmp_path)

    def __enter__(self) -> "TarShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def final_size(n: int) -> int:
    """Tar size after closing: two zero blocks, then padding to tarfile's 10240-byte record."""
    return -(-(n + 2 * tarfile.BLOCKSIZE) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def shard_name(prefix: str, index: int) -> str:
    """Canonical shard file name ``{prefix}-{index:06d}.tar``."""
    return f"{prefix}-{index:06d}.tar"


class ShardSequenceWriter:
    """Roll samples over a sequence of shards bounded by ``max_samples`` and/or ``max_bytes``.

    ``max_bytes`` counts real tar bytes (headers and padding); a shard is closed before the
    sample that would push it over the limit, except that a shard always holds at least one
    sample. Shards are named ``{prefix}-{start_index + i:06d}.tar``; :attr:`shards` lists
    the :class:`ShardInfo` of every committed shard.

    Raises:
        ValueError: neither limit given, or ``max_bytes`` over :data:`MAX_SHARD_BYTES`.
    """

    def __init__(self, directory: str, prefix: str = "shard", max_samples: int | None = None,
                 max_bytes: int | None = None, start_index: int = 0):
        if max_samples is None and max_bytes is None:
            raise ValueError("give max_samples or max_bytes")
        if max_bytes is not None and max_bytes > MAX_SHARD_BYTES:
            raise ValueError(f"max_bytes {max_bytes} is over the {MAX_SHARD_BYTES}-byte shard limit")
        os.makedirs(directory, exist_ok=True)
        self.directory, self.prefix = directory, prefix
        self.max_samples, self.max_bytes = max_samples, max_bytes
        self.next_index = start_index
        self.shards: list[ShardInfo] = []
        self._w: TarShardWriter | None = None

    def write(self, key: str, fields: dict[str, bytes], tokens: int = 0, documents: int = 1) -> None:
        """Append one sample to the current shard, first closing it if a limit would be crossed.

        Raises ``ValueError`` as :meth:`TarShardWriter.write` does.
        """
        size = sample_tar_bytes(fields)
        w = self._w
        if w is not None and (
            (self.max_samples is not None and w.samples >= self.max_samples)
            or (self.max_bytes is not None and final_size(w.bytes_written + size) > self.max_bytes)
        ):
            self.shards.append(w.close())
            w = None
        if w is None:
            w = self._w = TarShardWriter(os.path.join(self.directory, shard_name(self.prefix, self.next_index)))
            self.next_index += 1
        w.write(key, fields, tokens, documents)

    def close(self) -> list[ShardInfo]:
        """Commit the last shard (if it holds samples); returns :attr:`shards`."""
        if self._w is not None:
            if self._w.samples:
                self.shards.append(self._w.close())
            else:  # its only sample was refused: leave no empty shard behind
                self._w.abort()
            self._w = None
        return self.shards

    def abort(self) -> None:
        """Drop the shard in progress (committed shards stay)."""
        if self._w is not None:
            self._w.abort()
            self._w = None


class TokenBlockWriter:
    """Write tokenised documents as token blocks (:mod:`shards.format.blocks`) over a sequence of shards.

    Documents are cut into blocks of about ``block_tokens`` tokens (never split); blocks roll
    over shards as in :class:`ShardSequenceWriter` (``max_samples`` counts blocks). Use with
    ``Manifest(layout="token_blocks", shards=writer.close())``.

    Args:
        directory, prefix, max_samples, max_bytes, start_index: as :class:`ShardSequenceWriter`
            (without either limit, shards stop at :data:`DEFAULT_BLOCK_SHARD_BYTES`).
        block_tokens: target tokens per block (0: ``shards.format.blocks.DEFAULT_BLOCK_TOKENS`` of the compression).
        compression: ``none`` (raw, memory-mappable) or ``zstd`` (one frame per block).
    Raises:
        ValueError: bad limits, a negative ``block_tokens`` or an unknown compression.
    """

    def __init__(self, directory: str, prefix: str = "shard", max_samples: int | None = None,
                 max_bytes: int | None = None, block_tokens: int = 0, compression: str = "none",
                 start_index: int = 0):
        self.packer = BlockPacker(block_tokens, compression)
        if max_samples is None and max_bytes is None:
            max_bytes = DEFAULT_BLOCK_SHARD_BYTES
        self.shards_writer = ShardSequenceWriter(directory, prefix, max_samples, max_bytes, start_index)

    def add(self, doc_id: str, source: str, tokens: np.ndarray, text: str | None = None) -> None:
        """Append one document (1-D ``uint16``/``uint32`` tokens): :meth:`add_many` of one.

        Raises ``ValueError`` as :meth:`add_many` does."""
        block = self.packer.add(doc_id, source, tokens, text)
        if block:
            self._write_block(block)

    def add_many(self, ids: Sequence, sources: Sequence, tokens: np.ndarray | Sequence[np.ndarray],
                 lengths: np.ndarray | Sequence[int] | None = None, texts: Sequence[str] | None = None) -> None:
        """Append documents in order; the blocks are the same however they are batched, and each is written as
        soon as it is encoded (memory holds one encoded block, not the batch's).

        Args:
            ids, sources: ``[documents]`` document ids (none empty) and source names.
            tokens: one 1-D ``uint16``/``uint32`` array of every document's tokens concatenated (with
                ``lengths``: ``[documents]`` token counts), or one 1-D array per document (without).
            texts: ``[documents]`` source texts to keep, or ``None``.
        Raises:
            ValueError: as :meth:`shards.format.blocks.BlockPacker.add_many` and :meth:`ShardSequenceWriter.write`.
        """
        self.packer.add_many(ids, sources, tokens, lengths, texts, sink=self._write_block)

    def _write_block(self, block: Block) -> None:
        self.shards_writer.write(block.key, block.fields, block.tokens, block.documents)

    def close(self) -> list[ShardInfo]:
        """Write the last block, commit the last shard; returns every shard's :class:`ShardInfo`."""
        block = self.packer.flush()
        if block:
            self._write_block(block)
        return self.shards_writer.close()

    def abort(self) -> None:
        """Drop the shard in progress (committed shards stay)."""
        self.shards_writer.abort()
