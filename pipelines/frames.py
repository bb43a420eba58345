"""Many elements as one ``bytes`` object that is written and read a chunk at a time: pickled
frames of up to ``CHUNK_ELEMENTS`` elements, concatenated.

The Dask runner holds every bag partition this way (:mod:`pipelines.dask_parts` says why), and
the shard writer's sorted runs of samples are the same (:mod:`pipelines.sharding`). Frames
concatenate: the bytes of two encoded lists joined are the encoding of the two lists joined.
Pickle is Beam's own coder for Python objects; every element a job moves must be picklable.
"""
from __future__ import annotations

import io
import pickle

CHUNK_ELEMENTS = 256  # elements pickled together in one frame


class PartWriter:
    """Builds one encoded list (a bag partition, a shard writer's run) element by element:
    every ``chunk`` (default ``CHUNK_ELEMENTS``) appended elements are pickled (highest
    protocol) into one frame and dropped, so a task holds its output as bytes plus at most one
    chunk of objects, never the whole output as objects
    (at 16× the demo corpus a stage's output as objects was several times its bytes). Memory:
    the frames so far (bytes) plus one chunk; :meth:`getvalue` briefly holds both the frames
    and their concatenation."""

    def __init__(self, chunk: int = CHUNK_ELEMENTS):
        self._frames: list[bytes] = []
        self._chunk: list = []
        self._size = chunk

    def append(self, value) -> None:
        """Add one element."""
        self._chunk.append(value)
        if len(self._chunk) >= self._size:
            self._frames.append(pickle.dumps(self._chunk, protocol=pickle.HIGHEST_PROTOCOL))
            self._chunk = []

    def getvalue(self) -> bytes:
        """The encoded list: its frames concatenated (``b""`` for no elements). Ends the writer."""
        if self._chunk:
            self._frames.append(pickle.dumps(self._chunk, protocol=pickle.HIGHEST_PROTOCOL))
        frames, self._frames, self._chunk = self._frames, [], []
        return b"".join(frames)


def encode(values, chunk: int = CHUNK_ELEMENTS) -> bytes:
    """Elements (any iterable) as bytes: :class:`PartWriter` frames of ``chunk`` elements."""
    writer = PartWriter(chunk)
    for value in values:
        writer.append(value)
    return writer.getvalue()


def decode(part: bytes):
    """The elements of bytes made by :func:`encode` or :class:`PartWriter`, lazily: one frame's
    chunk of elements exists as objects at a time (a generator). Raises ``pickle.UnpicklingError``
    (or ``EOFError``) on bytes that are not whole frames."""
    stream = io.BytesIO(part)  # shares the bytes; no copy
    while stream.tell() < len(part):
        yield from pickle.load(stream)


def decode_list(part: bytes) -> list:
    """All elements of :func:`encode` bytes as one list."""
    return list(decode(part))
