"""The compact form of a batch: what a loader worker builds and sends (numpy only, no torch).

A packed batch of B rows of T tokens holds only the token ids (``uint16`` when the vocabulary
fits, else ``int32``), each chunk's length and each row's chunk count, plus the keys and the
resume records. Labels, position ids and document ids follow from these and are
derived on the consumer side (:func:`expand`), so a worker sends about ``2 B T`` bytes instead
of four ``int64`` ``[B, T]`` arrays (16x less), and worker processes never import torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

IGNORE = -100


@dataclass
class PackedBatch:
    """A micro-batch in compact form.

    Attributes:
        ids: ``uint16``/``int32`` ``[B, T]`` token ids, 0 on padding.
        lens: ``int32`` ``[chunks]``: chunk lengths in row order (each chunk is its own document).
        row_chunks: ``int32`` ``[B]``: chunks per row (rows are filled from the left).
        keys: sample keys of the documents that contributed tokens.
        consumed: ``(global position, chunk, n_chunks)`` records (see :mod:`loaders.progress`).
    """

    ids: np.ndarray
    lens: np.ndarray
    row_chunks: np.ndarray
    keys: list[str] = field(default_factory=list)
    consumed: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def num_doc_tokens(self) -> int:
        """Tokens of documents (padding excluded)."""
        return int(self.lens.sum())

    @property
    def num_slots(self) -> int:
        """B x T."""
        return int(self.ids.size)


def compact_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` as ``uint16`` when every id fits, else ``int32`` (token ids are < 2**31)."""
    if ids.size and int(ids.max()) >= 1 << 16:
        return ids.astype(np.int32)
    return ids.astype(np.uint16)


def expand(p: PackedBatch) -> tuple[np.ndarray, ...]:
    """The full arrays of a packed batch: ``(input_ids, labels, position_ids, document_ids)``, all
    ``int64`` ``[B, T]``.

    Per chunk: positions 0..len-1, ``document_ids`` = the chunk's index in its row,
    ``labels[t] = input_ids[t+1]`` inside the chunk and ``-100`` on its last token; padding has
    input 0, position 0, document -1, label -100.
    """
    rows, width = p.ids.shape
    lens = p.lens.astype(np.int64)
    n = len(lens)
    ids = p.ids.astype(np.int64).reshape(-1)
    row_of = np.repeat(np.arange(rows, dtype=np.int64), p.row_chunks)
    ends = np.cumsum(lens)
    row_first = np.concatenate([[0], np.cumsum(p.row_chunks)])[:-1].astype(np.int64)  # first chunk of each row
    row_base = np.concatenate([[0], ends])[row_first]  # tokens before each row's first chunk
    chunk_start = row_of * width + (ends - lens) - row_base[row_of]  # flat start of each chunk
    chunk_index = np.arange(n, dtype=np.int64) - row_first[row_of]
    total = int(ends[-1]) if n else 0
    flat_chunk = np.repeat(np.arange(n, dtype=np.int64), lens)
    flat = chunk_start[flat_chunk] + np.arange(total, dtype=np.int64) - (ends - lens)[flat_chunk]
    pos = np.zeros(rows * width, np.int64)
    docs = np.full(rows * width, -1, np.int64)
    labels = np.full(rows * width, IGNORE, np.int64)
    pos[flat] = flat - chunk_start[flat_chunk]
    docs[flat] = chunk_index[flat_chunk]
    inner = flat[pos[flat] < lens[flat_chunk] - 1]  # every chunk token but its last
    labels[inner] = ids[inner + 1]
    shape = (rows, width)
    return ids.reshape(shape), labels.reshape(shape), pos.reshape(shape), docs.reshape(shape)
