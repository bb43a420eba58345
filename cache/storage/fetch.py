"""Download one shard into a partial file through fsspec, with retries, resume and verification.

Transfers stream in ``chunk_bytes`` blocks. HTTP(S) uses fsspec's ``HTTPFileSystem`` (aiohttp)
in streaming mode; a retry after a dropped connection or a truncated body resumes from the
partial file's end with a ``Range: bytes=N-`` request (RFC 9110 §14). Other fsspec file
systems (local paths, s3, gcs ...) resume by seeking. ``*.tar.zst`` sources are decompressed
on the fly (zstandard streaming, all frames) and restart from byte 0 on retry.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Callable

import aiohttp
import fsspec
import zstandard

from cache.errors import CacheFullError, ShardFetchError, ShardVerifyError
from colaflow.network import storage_options

log = logging.getLogger(__name__)


@dataclass
class FetchSpec:
    """What to download and how.

    Attributes:
        url: source URL (local path or any fsspec URL).
        part: local partial file to (re)write.
        size: expected local size in bytes, or ``None`` if unknown.
        sha256: expected hex digest of the local file, or ``None``.
        decompress: the source is zstd-compressed; store the decompressed bytes.
        hash: compute sha256 while downloading (``False`` under ``verify: never``).
    """

    url: str
    part: str
    size: int | None
    sha256: str | None
    decompress: bool
    hash: bool


@dataclass
class FetchResult:
    """A finished download: local ``size`` (bytes), ``sha256`` hex (``None`` if not hashed), bytes
    moved over the wire, and ``file_id``, the ``(st_dev, st_ino)`` of the file those bytes were
    written to and checked in (:meth:`cache.storage.store.Store.commit` renames only that file)."""

    size: int
    sha256: str | None
    wire_bytes: int
    file_id: tuple[int, int] = (0, 0)


class PartialChangedError(OSError):
    """The partial file of a live download was replaced or removed by someone else: the bytes now at
    its path are not the ones that were checked. The download is retried."""


def file_id(stat: os.stat_result) -> tuple[int, int]:
    """``(st_dev, st_ino)``: which file a path or descriptor is, whatever its name now."""
    return stat.st_dev, stat.st_ino


def check_same_file(path: str, expected: tuple[int, int], size: int) -> None:
    """Raise :class:`PartialChangedError` unless ``path`` is still file ``expected`` of ``size`` bytes."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PartialChangedError(errno.ENOENT, "the partial download was removed while it was written", path)
    if file_id(st) != expected or st.st_size != size:
        raise PartialChangedError(errno.ESTALE, f"the partial download was replaced while it was written "
                                  f"({st.st_size} bytes there now, {size} written and checked)", path)


class _Retryable(Exception):
    """An attempt failed in a way a fresh attempt may fix (e.g. a truncated zstd stream)."""


class _Mismatch(_Retryable):
    """The downloaded bytes have the wrong size or sha256."""


def remote_size(url: str, timeout_s: float) -> int | None:
    """Size of the source in bytes (HTTP HEAD / stat), or ``None`` if the server does not say."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options(url, timeout_s))
    try:
        size = fs.size(path)
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - size is only a hint for reservations
        log.debug("no size for %s: %s", url, e)
        return None
    return int(size) if size is not None else None


class Downloader:
    """Runs download attempts with exponential backoff (delay ``backoff_s * 2**attempt`` capped at
    ``backoff_max_s``, with +-25% jitter so processes that failed together do not retry together).

    Args:
        retries: extra attempts after the first.
        backoff_s: first delay, seconds.
        backoff_max_s: cap on one delay, seconds.
        timeout_s: connect / socket-read timeout, seconds.
        chunk_bytes: streaming block size, bytes.
        reserve: ``reserve(total_bytes)`` is called before the partial file grows past what was
            reserved; it may raise ``CacheFullError``.
        on_bytes: ``on_bytes(n)`` is called with the number of wire bytes of each block (metrics).
        on_retry: ``on_retry()`` is called once per failed attempt (metrics).
    """

    def __init__(self, retries: int, backoff_s: float, backoff_max_s: float, timeout_s: float,
                 chunk_bytes: int, reserve: Callable[[int], None], on_bytes: Callable[[int], None],
                 on_retry: Callable[[], None] = lambda: None):
        self.retries, self.backoff_s, self.backoff_max_s = retries, backoff_s, backoff_max_s
        self.timeout_s, self.chunk_bytes = timeout_s, chunk_bytes
        self.reserve, self.on_bytes, self.on_retry = reserve, on_bytes, on_retry

    def fetch(self, spec: FetchSpec) -> FetchResult:
        """Download ``spec.url`` into ``spec.part`` until its size and sha256 match.

        Returns:
            the verified result; ``spec.part`` then holds the complete file.

        Raises:
            ShardFetchError: the source is missing or refuses access (401/403, wrong credentials: not
                retried), or every attempt failed (the message names the URL, the attempts and the last error).
            ShardVerifyError: every attempt produced bytes with the wrong size or sha256.
            CacheFullError: no room for the shard (not retried; the partial file is removed).
        """
        last: BaseException | None = None
        attempts = self.retries + 1
        for attempt in range(attempts):
            if attempt:
                delay = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
                time.sleep(delay * random.uniform(0.75, 1.25))
            try:
                return self._attempt(spec)
            except FileNotFoundError as e:
                raise ShardFetchError(f"shard {spec.url}: not found at the source ({e}); check the manifest "
                                      f"URL and that the shard was uploaded", spec.url, attempt + 1) from e
            except (PermissionError, aiohttp.ClientResponseError) as e:
                if isinstance(e, PermissionError) or e.status in (401, 403):  # retrying cannot fix credentials
                    raise ShardFetchError(f"shard {spec.url}: access denied by the source ({e}); check the storage "
                                          f"credentials (AWS_* variables, ~/.aws) or the signed URL's token",
                                          spec.url, attempt + 1) from e
                last = e
            except CacheFullError:
                _remove(spec.part)
                raise
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    _remove(spec.part)
                    raise CacheFullError(f"shard {spec.url}: the disk under {os.path.dirname(spec.part)} is "
                                         f"full ({e}); free space or lower cache.max_bytes") from e
                last = e
            except Exception as e:  # noqa: BLE001 - any transport error is retried, then reported
                last = e
            self.on_retry()
            log.warning("shard %s: attempt %d/%d failed: %s", spec.url, attempt + 1, attempts, last)
        msg = (f"shard {spec.url}: download failed after {attempts} attempt(s); last error: "
               f"{type(last).__name__}: {last}. Check the source/server, or raise cache.retries / cache.timeout_s")
        cls = ShardVerifyError if isinstance(last, _Mismatch) else ShardFetchError
        raise cls(msg, spec.url, attempts) from last

    def _attempt(self, spec: FetchSpec) -> FetchResult:
        # resume only when the final size is known: otherwise a complete part file cannot be told apart
        offset = 0 if spec.decompress or spec.size is None else _size(spec.part)
        if spec.size is not None and offset > spec.size:
            offset = 0
        if spec.size is not None:
            self.reserve(spec.size)
        hasher = hashlib.sha256() if spec.hash else None
        if offset and hasher is not None:
            _hash_prefix(spec.part, offset, hasher, self.chunk_bytes)
        wire = 0
        with open(spec.part, "r+b" if offset else "wb") as out:
            written_to = file_id(os.fstat(out.fileno()))
            out.seek(offset)
            if spec.size is None or offset < spec.size:
                wire = self._stream(spec, out, offset, hasher)
            out.truncate()
            size = out.tell()
        try:
            check_same_file(spec.part, written_to, size)
        except PartialChangedError:
            _remove(spec.part)  # not this download's bytes: never resume from them
            raise
        if spec.size is not None and size != spec.size:
            if size > spec.size:
                _remove(spec.part)
            raise _Mismatch(f"got {size} bytes, manifest says {spec.size} (truncated body or wrong file)")
        digest = hasher.hexdigest() if hasher is not None else None
        if spec.sha256 and digest is not None and digest != spec.sha256.lower():
            _remove(spec.part)  # a bad prefix would poison every resume
            raise _Mismatch(f"sha256 {digest} does not match the manifest's {spec.sha256}")
        return FetchResult(size, digest, wire, written_to)

    def _stream(self, spec: FetchSpec, out, offset: int, hasher) -> int:
        """Copy the source from ``offset`` into ``out``; returns wire bytes read."""
        fs, path = fsspec.core.url_to_fs(spec.url, **storage_options(spec.url, self.timeout_s))
        http = spec.url.startswith(("http://", "https://"))
        if http:
            headers = {"Range": f"bytes={offset}-"} if offset else {}
            # block_size=0 selects fsspec's streaming HTTP file (one GET); size=1 skips its HEAD request
            src = fs.open(path, "rb", block_size=0, size=spec.size or 1, headers=headers)
        else:
            src = fs.open(path, "rb", block_size=self.chunk_bytes)
        wire = 0
        with src:
            skip = 0
            if offset and http and getattr(getattr(src, "r", None), "status", 206) != 206:
                skip = offset  # the server ignored Range and sends the whole file: drop what we have
            elif offset and not http:
                src.seek(offset)
            dec = _ZstdFrames() if spec.decompress else None
            written = offset
            reserved = spec.size if spec.size is not None else offset
            while True:
                block = src.read(self.chunk_bytes)
                if not block:
                    break
                wire += len(block)
                self.on_bytes(len(block))
                if skip:
                    block, skip = block[skip:], max(0, skip - len(block))
                data = dec.decompress(block) if dec is not None else block
                if not data:
                    continue
                if written + len(data) > reserved:
                    # unknown or exceeded size: grow the reservation ahead of the writes
                    reserved = written + len(data) + 8 * self.chunk_bytes
                    self.reserve(reserved)
                out.write(data)
                written += len(data)
                if hasher is not None:
                    hasher.update(data)
                if spec.size is not None and written > spec.size:
                    break  # wrong file; the size check reports it
            if dec is not None and not dec.complete:
                raise _Retryable("zstd stream ended mid-frame (truncated body)")
        return wire


class _ZstdFrames:
    """Streaming zstd decompression over concatenated frames that can tell a truncated last frame."""

    def __init__(self):
        self._dec = zstandard.ZstdDecompressor().decompressobj()
        self._fed = False

    def decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            self._fed = True
            out.append(self._dec.decompress(data))
            if not self._dec.eof:
                break
            data = self._dec.unused_data
            self._dec, self._fed = zstandard.ZstdDecompressor().decompressobj(), False
        return b"".join(out)

    @property
    def complete(self) -> bool:
        """No frame was left half-read."""
        return not self._fed


def hash_file(path: str, chunk_bytes: int = 4 << 20) -> str:
    """sha256 hex digest of a local file."""
    h = hashlib.sha256()
    _hash_prefix(path, None, h, chunk_bytes)
    return h.hexdigest()


def _hash_prefix(path: str, limit: int | None, hasher, chunk_bytes: int) -> None:
    with open(path, "rb") as f:
        left = limit
        while left is None or left > 0:
            block = f.read(chunk_bytes if left is None else min(chunk_bytes, left))
            if not block:
                break
            hasher.update(block)
            if left is not None:
                left -= len(block)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
