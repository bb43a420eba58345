"""A local file's bytes for random reads, holding no file descriptor where that can be avoided.

A consumer keeps every shard of its shuffle block open, and with tiny shards (one document
each) a block spans thousands of them: a descriptor per open shard would run past
``RLIMIT_NOFILE``. So the file object is closed as soon as the bytes are in hand:

* a file of at most :data:`RESIDENT_BYTES` is read whole into memory (``bytes``): no
  descriptor at all, and the copy is small;
* a larger one is memory-mapped (zero copy): Python's ``mmap`` keeps its own duplicate of the
  descriptor for as long as the mapping lives, but a shuffle block spans only a few such shards.
"""
from __future__ import annotations

import mmap
import os

# Files up to this size (bytes) are read into memory instead of mapped. Why 1 MiB: so small a
# shard holds few documents, so a shuffle block may span thousands of them (each would keep a
# descriptor if mapped), while reading it costs well under a millisecond. The price is memory: a
# consumer holds at most (shards of its shuffle block) x 1 MiB, reached only by shards just below
# the limit; one-document shards are a few KiB. Larger shards hold enough documents that a block
# spans few of them, and there the zero copy (pages shared by every worker) matters more.
RESIDENT_BYTES = 1 << 20


def read_or_map(f) -> bytes | mmap.mmap:
    """The whole content of the open binary file ``f`` (its descriptor is not kept: close ``f`` after).

    Returns ``bytes`` when the file has at most :data:`RESIDENT_BYTES` bytes, else a read-only
    ``mmap.mmap`` (which holds its own duplicate descriptor until it is garbage-collected).
    Both support ``len``, slicing (to ``bytes``) and the buffer protocol (``np.frombuffer``).

    Raises:
        OSError: the file cannot be read or mapped.
    """
    size = os.fstat(f.fileno()).st_size
    if size <= RESIDENT_BYTES:
        data = os.pread(f.fileno(), size, 0)
        if len(data) != size:
            raise OSError(f"{getattr(f, 'name', f)}: read {len(data)} of {size} bytes (file changed while read)")
        return data
    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def is_resident(data) -> bool:
    """Whether ``data`` (from :func:`read_or_map`) lives in memory, needing neither the file nor a descriptor."""
    return isinstance(data, bytes)
