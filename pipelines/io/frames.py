"""Many elements as one ``bytes`` object that is written and read a chunk at a time: frames of
up to ``CHUNK_ELEMENTS`` pickled elements, concatenated (the bytes of two encoded lists joined
are the encoding of the two lists joined). Holds the Dask runner's partitions and the shard
writer's sorted runs; every element a job moves must be picklable (pickle is Beam's own coder
for Python objects).

A frame is a header (``<QI``: the pickle's length in bytes and its buffer count, then ``<Q`` per
buffer: its length), the pickle (protocol 5) and its out-of-band buffers (PEP 574). Only a
:class:`Blob` is stored out of band: decoding gives it a ``memoryview`` of the encoded bytes
instead of a copy, so a task that reads a large payload out of its input partition (a shard
writer's runs) does not hold it twice.
"""
from __future__ import annotations

import io
import pickle
import struct

CHUNK_ELEMENTS = 256  # elements pickled together in one frame
_HEADER = struct.Struct("<QI")  # pickle bytes, buffer count


class Blob:
    """A bytes-like payload (``data``: ``bytes`` or a read-only ``memoryview``) that frames store
    out of band and decode without a copy: what :func:`decode` yields holds a ``memoryview`` of
    the encoded bytes (kept alive by it). Pickled any other way (protocol < 5, or 5 without a
    buffer callback, as Beam's coders do) it is an ordinary copy of its bytes."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return Blob, (pickle.PickleBuffer(self.data),)
        return Blob, (bytes(self.data),)


def _write_frame(stream: io.BytesIO, chunk: list) -> None:
    buffers: list = []
    data = pickle.dumps(chunk, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    stream.write(_HEADER.pack(len(data), len(raws)))
    stream.write(struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws)))
    stream.write(data)
    for raw in raws:
        stream.write(raw)


class PartWriter:
    """Builds one encoded list (a bag partition, a shard writer's run) element by element:
    every ``chunk`` (default ``CHUNK_ELEMENTS``) appended elements are pickled into one frame
    and dropped, so a task holds its output as bytes plus at most one
    chunk of objects, never the whole output as objects
    (at 16× the demo corpus a stage's output as objects was several times its bytes). Memory:
    the frames so far, in one growing buffer, plus one chunk; :meth:`getvalue` returns that
    buffer without copying it (frames kept apart and joined held the output twice)."""

    def __init__(self, chunk: int = CHUNK_ELEMENTS):
        self._stream = io.BytesIO()
        self._chunk: list = []
        self._size = chunk

    def append(self, value) -> None:
        """Add one element."""
        self._chunk.append(value)
        if len(self._chunk) >= self._size:
            _write_frame(self._stream, self._chunk)
            self._chunk = []

    def getvalue(self) -> bytes:
        """The encoded list: its frames concatenated (``b""`` for no elements). Ends the writer."""
        if self._chunk:
            _write_frame(self._stream, self._chunk)
        stream, self._stream, self._chunk = self._stream, io.BytesIO(), []
        return stream.getvalue()  # the stream's own buffer, not a copy


def encode(values, chunk: int = CHUNK_ELEMENTS) -> bytes:
    """Elements (any iterable) as bytes: :class:`PartWriter` frames of ``chunk`` elements."""
    writer = PartWriter(chunk)
    for value in values:
        writer.append(value)
    return writer.getvalue()


def chunks(part):
    """The frames of bytes (or a ``memoryview`` of them) made by :func:`encode` or
    :class:`PartWriter`, each as its list of elements, lazily (a generator), read in place
    without copying ``part``. Raises ``ValueError`` on bytes that are not whole frames
    (``pickle.UnpicklingError`` when a frame's pickle is damaged)."""
    view = memoryview(part)
    pos, end = 0, view.nbytes
    while pos < end:
        if pos + _HEADER.size > end:
            raise ValueError(f"frame header cut short at byte {pos} of {end}")
        size, count = _HEADER.unpack_from(view, pos)
        lengths = struct.unpack_from(f"<{count}Q", view, pos + _HEADER.size)
        data = pos + _HEADER.size + 8 * count
        at = data + size
        if at + sum(lengths) > end:
            raise ValueError(f"frame at byte {pos} runs past the end ({end} bytes)")
        buffers = []
        for length in lengths:
            buffers.append(view[at:at + length])
            at += length
        yield pickle.loads(view[data:data + size], buffers=buffers)
        pos = at


def decode(part):
    """The elements of :func:`chunks`, one frame's chunk of them existing as objects at a time
    (a generator); raises as :func:`chunks` does."""
    for chunk in chunks(part):
        yield from chunk


def decode_stream(stream):
    """The elements of frames read from ``stream`` (a binary file object), a frame at a time
    (a generator): only one frame's bytes and elements exist at once, never the whole file.

    Raises:
        ValueError: the file ends inside a frame.
    """
    for chunk in chunks_stream(stream):
        yield from chunk


def chunks_stream(stream):
    """The frames read from ``stream`` (a binary file object), each as its list of elements, one
    frame read at a time (a generator): a reader that stops early reads no further.

    Raises:
        ValueError: the file ends inside a frame.
    """
    while True:
        head = stream.read(_HEADER.size)
        if not head:
            return
        if len(head) < _HEADER.size:
            raise ValueError("frame header cut short")
        size, count = _HEADER.unpack(head)
        lengths = struct.unpack(f"<{count}Q", stream.read(8 * count))
        data = stream.read(size)
        buffers = [stream.read(length) for length in lengths]
        if len(data) < size or any(len(b) < n for b, n in zip(buffers, lengths)):
            raise ValueError("frame runs past the end of the file")
        yield pickle.loads(data, buffers=buffers)


def decode_list(part: bytes) -> list:
    """All elements of :func:`encode` bytes as one list."""
    return list(decode(part))
