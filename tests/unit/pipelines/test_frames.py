"""Frames: encoded lists that concatenate, read a chunk at a time, with blobs read in place."""
from __future__ import annotations

import pickle
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.runners.dask.parts import group_pieces
from pipelines.io.frames import CHUNK_ELEMENTS, Blob, PartWriter, chunks, decode, decode_list, encode


def test_encoded_partition_round_trips():
    values = [("h", ("id", "text é", "src")), (None, 3)]
    assert decode_list(encode(values)) == values and isinstance(encode(values), bytes)
    assert encode([]) == b"" and decode_list(b"") == []


@settings(max_examples=30, deadline=None)
@given(a=st.integers(0, 3 * CHUNK_ELEMENTS), b=st.integers(0, 600), blobs=st.lists(st.binary(max_size=64), max_size=5))
def test_partitions_are_frames_of_chunks_that_concatenate(a, b, blobs):
    first, second = list(range(a)), [("k", i) for i in range(b)] + [(i, Blob(x)) for i, x in enumerate(blobs)]
    part = encode(first)
    assert [len(c) for c in chunks(part)] == [min(CHUNK_ELEMENTS, a - i) for i in range(0, a, CHUNK_ELEMENTS)]
    assert isinstance(decode(part), types.GeneratorType)  # read a frame at a time
    writer = PartWriter()
    for x in second:
        writer.append(x)
    joined = decode_list(part + writer.getvalue())  # a Flatten joins partitions by concatenation
    assert joined[:a + b] == first + second[:b]
    assert [(i, bytes(blob.data)) for i, blob in joined[a + b:]] == list(enumerate(blobs))


def test_a_blob_decodes_as_a_view_of_the_encoded_bytes_not_a_copy():
    run = bytes(range(256)) * 4096  # 1 MiB
    piece = encode([(7, Blob(run)), (7, Blob(b"second"))])
    (key, first), (_, second) = decode_list(piece)
    assert key == 7 and isinstance(first.data, memoryview) and first.data.obj is piece
    assert first.data == run and bytes(second.data) == b"second"
    # a shard writer's group reads its runs from the shuffled pieces in place
    [(bucket, runs)] = list(group_pieces([piece]))
    assert bucket == 7 and all(r.data.obj is piece for r in runs)
    # a view re-encodes (a group handed on encoded) and pickles in band like bytes
    again = decode_list(encode(runs))
    assert [bytes(r.data) for r in again] == [run, b"second"]
    for protocol in (2, 4, 5):
        copy = pickle.loads(pickle.dumps(first, protocol=protocol))
        assert isinstance(copy, Blob) and bytes(copy.data) == run


def test_the_writer_holds_its_output_once():
    """Frames go into one growing buffer that getvalue hands over, not a list joined at the end (2x)."""
    import tracemalloc

    values = [("key", f"{i:08d}" + "x" * 200, i) for i in range(40_000)]
    tracemalloc.start()
    writer = PartWriter()
    for value in values:
        writer.append(value)
    part = writer.getvalue()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(part) > 8_000_000 and decode_list(part)[-1] == values[-1]
    assert peak < 1.4 * len(part), (peak, len(part))


def test_bytes_that_are_not_whole_frames_raise():
    part = encode(list(range(10))) + encode([Blob(b"x" * 100)])
    with pytest.raises(ValueError, match="runs past the end"):
        decode_list(part[:-1])
    with pytest.raises(ValueError, match="header cut short"):
        decode_list(part + b"\x00")
