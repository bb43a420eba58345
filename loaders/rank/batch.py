"""The batch type handed from the loader to the trainer.

A loader batch arrives compact (:class:`loaders.pack.packed.PackedBatch`: ``uint16``/``int32`` token
ids plus chunk lengths, about ``2 B T`` bytes) and stays compact through :meth:`TokenBatch.to`
and :meth:`TokenBatch.pin_memory`; labels, position ids and document ids are derived from it
with a dozen tensor operations the first time they are read, on the device the batch is on by
then (the GPU in training), so the loader never builds four ``int64 [B, T]`` arrays per batch.
"""
from __future__ import annotations

import numpy as np
import torch

from loaders.pack.packed import IGNORE, PackedBatch, consumed_array


def expand(ids: torch.Tensor, lens: torch.Tensor, row_chunks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The full tensors of a packed batch: ``(input_ids, labels, position_ids, document_ids)``,
    all ``int64`` ``[B, T]``, on ``ids``' device.

    Args:
        ids: ``uint16``/``int32``/``int64`` ``[B, T]`` token ids, the manifest's padding id on padding.
        lens: ``[chunks]`` chunk lengths (> 0) in row order; ``row_chunks``: ``[B]`` chunks per row
            (rows filled from the left).

    Per chunk: positions 0..len-1, ``document_ids`` = the chunk's index in its row,
    ``labels[t] = input_ids[t+1]`` inside the chunk and ``-100`` on its last token; padding has
    input 0, position 0, document -1, label -100. No host synchronisation (shapes only).
    """
    rows, width = ids.shape
    dev = ids.device
    lens, row_chunks = lens.long(), row_chunks.long()
    n = lens.numel()
    ids = ids.long()
    # the row of each chunk; not repeat_interleave(..., output_size=n), which takes ~15 ms per call on a CPU
    # with 2+ intra-op threads (torch 2.x), against ~0.02 ms for this
    row_of = torch.searchsorted(row_chunks.cumsum(0), torch.arange(n, device=dev), right=True)
    ends = lens.cumsum(0)
    row_base = torch.cat([ends.new_zeros(1), ends])[row_chunks.cumsum(0) - row_chunks]  # tokens before each row
    flat_start = row_of * width + (ends - lens) - row_base[row_of]
    fill = torch.zeros(rows, dtype=torch.long, device=dev).index_add_(0, row_of, lens)
    starts = torch.zeros(rows * width, dtype=torch.bool, device=dev)
    starts[flat_start] = True
    starts = starts.view(rows, width)
    col = torch.arange(width, device=dev).expand(rows, width)
    real = col < fill[:, None]
    document_ids = torch.where(real, starts.long().cumsum(1) - 1, -1)
    position_ids = torch.where(real, col - torch.where(starts, col, 0).cummax(1).values, 0)
    nxt = torch.cat([ids[:, 1:], ids.new_zeros(rows, 1)], 1)
    next_starts = torch.cat([starts[:, 1:], starts.new_ones(rows, 1)], 1)
    next_real = torch.cat([real[:, 1:], real.new_zeros(rows, 1)], 1)
    labels = torch.where(real & next_real & ~next_starts, nxt, IGNORE)
    return ids, labels, position_ids, document_ids


def one_document_rows(lens: np.ndarray, row_chunks: np.ndarray, width: int) -> bool:
    """Whether every row of a packed batch is one document filling it, or only padding (chunk
    lengths ``lens`` in row order, ``row_chunks`` chunks per row, ``width`` tokens per row)."""
    if len(lens) > len(row_chunks):  # more chunks than rows: some row holds two (no array pass needed)
        return False
    row_chunks = np.asarray(row_chunks)
    if np.any(row_chunks > 1):
        return False
    first = np.cumsum(row_chunks) - 1  # the chunk of each one-chunk row
    return bool(np.all(np.asarray(lens)[first[row_chunks == 1]] == width))


class TokenBatch:
    """A micro-batch of packed token rows.

    The four tensors are ``int64`` of shape ``[B, T]`` (B rows, T = ``seq_len``); a batch made
    by :meth:`from_packed` derives them (:func:`expand`) on first access, on its current device.

    Attributes:
        input_ids: token ids; padding positions hold the manifest's padding id (``Manifest.padding_id``).
        labels: next-token targets; ``-100`` where no loss is taken (padding, the last
            token of each document, so no prediction crosses a document boundary).
        position_ids: position within the document, restarting at 0 for each document.
        document_ids: per-token document index within the row (0, 1, ...), ``-1`` for padding;
            attention is allowed only where query and key share a document (block-diagonal causal).
        keys: sample keys of the documents that contributed tokens, for logging anomalies.
        consumed: ``int64`` ``[k, 3]``: ``(global position, chunk index, chunks in the document)``
            per chunk delivered (chunk ``-1``/``-2`` with 0 chunks: an empty/unreadable document);
            the loader turns these into its exact resume state (see :mod:`loaders.order.progress`).
        packed: the compact form it was built from (:class:`loaders.pack.packed.PackedBatch`), or ``None``;
            a CPU batch with one pickles as that.
        one_document_rows: whether every row is one document or only padding (attention can then
            be plain causal), read on the host: known from the packing, or from CPU tensors;
            ``None`` for device tensors of a batch not packed on the host.
    """

    def __init__(self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor,
                 document_ids: torch.Tensor, keys: list[str], consumed=None):
        self._full: tuple[torch.Tensor, ...] | None = (input_ids, labels, position_ids, document_ids)
        self._compact: tuple[torch.Tensor, ...] | None = None
        self._doc_tokens: int | None = None
        self._one_document: bool | None = None
        self.keys, self.consumed = keys, consumed_array(consumed)
        self.worker = 0  # the loader worker that packed it (see loaders.pack.packed.PackedBatch)
        self.packed: PackedBatch | None = None

    @classmethod
    def from_packed(cls, p: PackedBatch) -> "TokenBatch":
        """A batch over the packed batch's arrays (no copy); tensors over them, and the full tensors,
        come on first access (a loop that only counts tokens makes none)."""
        b = cls.__new__(cls)
        b._full, b._compact, b.packed = None, None, p  # the tensors over its arrays come on first need (_tensors)
        b._doc_tokens = p.num_doc_tokens
        b._one_document = p.one_document if p.one_document is not None else \
            one_document_rows(p.lens, p.row_chunks, p.ids.shape[1])
        b.keys, b.consumed, b.worker = p.keys, p.consumed, p.worker
        return b

    def _lazy(self, compact: tuple[torch.Tensor, ...], doc_tokens: int | None) -> "TokenBatch":
        b = TokenBatch.__new__(TokenBatch)
        b._full, b._compact, b._doc_tokens, b.packed = None, compact, doc_tokens, None
        b._one_document = self._one_document
        b.keys, b.consumed, b.worker = self.keys, self.consumed, self.worker
        return b

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        """The compact ``(ids, lens, row_chunks)`` tensors (see :func:`expand`); over the packed arrays, made once."""
        if self._compact is None:
            p = self.packed
            self._compact = (torch.from_numpy(p.ids), torch.from_numpy(p.lens), torch.from_numpy(p.row_chunks))
        return self._compact

    def _fields(self) -> tuple[torch.Tensor, ...]:
        if self._full is None:
            self._full = expand(*self._tensors())
        return self._full

    @property
    def host_ids(self):
        """The token ids without touching a device: the packed ``[B, T]`` numpy ids (``uint16``/``int32``,
        padding included) of a batch packed on the host, else :attr:`input_ids`."""
        return self.packed.ids if self.packed is not None else self.input_ids

    @property
    def input_ids(self) -> torch.Tensor:
        """``int64 [B, T]`` token ids (the padding id on padding)."""
        return self._fields()[0]

    @property
    def labels(self) -> torch.Tensor:
        """``int64 [B, T]`` next-token targets, ``-100`` where no loss is taken."""
        return self._fields()[1]

    @property
    def position_ids(self) -> torch.Tensor:
        """``int64 [B, T]`` positions, restarting at 0 for each document."""
        return self._fields()[2]

    @property
    def document_ids(self) -> torch.Tensor:
        """``int64 [B, T]`` document index within the row, ``-1`` on padding."""
        return self._fields()[3]

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, T)``: rows and tokens per row."""
        if self.packed is not None:  # no tensor needed
            return self.packed.ids.shape
        t = self._compact[0] if self._full is None else self._full[0]
        return tuple(t.shape)

    @property
    def num_slots(self) -> int:
        """B x T token slots (padding included)."""
        rows, width = self.shape
        return rows * width

    @property
    def num_real_tokens(self) -> int:
        """Count of positions that carry a loss (labels != -100)."""
        if self.labels.device.type == "cpu":
            return int(np.count_nonzero(self.labels.numpy() != IGNORE))
        return int((self.labels != IGNORE).sum())

    @property
    def num_doc_tokens(self) -> int:
        """Count of positions holding document tokens (``document_ids >= 0``), padding excluded."""
        if self._doc_tokens is not None:  # the chunk lengths say it without a pass over [B, T]
            return self._doc_tokens
        if self.document_ids.device.type == "cpu":
            return int(np.count_nonzero(self.document_ids.numpy() >= 0))
        return int((self.document_ids >= 0).sum())

    @property
    def one_document_rows(self) -> bool | None:
        """Whether every row holds one document or only padding (see the class attributes); never
        reads a device tensor."""
        if self._one_document is None and self._full is not None and self._full[3].device.type == "cpu":
            ids = self._full[3].numpy()
            self._one_document = bool(np.all(ids == ids[:, :1]))
        return self._one_document

    def __reduce__(self):
        # CPU batches travel (worker process -> trainer) as plain arrays in the pickle: one
        # pipe write instead of one shared-memory file and descriptor hand-over per tensor.
        if self.packed is not None:  # a packed batch is on the CPU (moving one makes a new batch)
            return TokenBatch.from_packed, (self.packed,)
        tensors = self._fields()
        if all(t.device.type == "cpu" and not t.requires_grad for t in tensors):
            return _rebuild, (tuple(t.numpy() for t in tensors), self.keys, self.consumed)
        return TokenBatch, (*tensors, self.keys, self.consumed)

    def to(self, device, non_blocking: bool = False) -> "TokenBatch":
        """The batch on ``device`` (keys and resume records unchanged); a compact batch moves only its
        compact tensors (about ``2 B T`` bytes) and is expanded there."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        if self._full is None:
            return self._lazy(tuple(move(t) for t in self._tensors()), self._doc_tokens)
        b = TokenBatch(*(move(t) for t in self._full), self.keys, self.consumed)
        b._one_document = self.one_document_rows
        return b

    def pin_memory(self) -> "TokenBatch":
        """The batch in pinned host memory (faster, asynchronous host-to-GPU copies)."""
        if self._full is None:
            return self._lazy(tuple(t.pin_memory() for t in self._tensors()), self._doc_tokens)
        return TokenBatch(*(t.pin_memory() for t in self._full), self.keys, self.consumed)


def _rebuild(arrays: tuple, keys: list[str], consumed) -> TokenBatch:
    return TokenBatch(*(torch.from_numpy(a) for a in arrays), keys, consumed)
