"""The batch type handed from the loader to the trainer."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .packed import PackedBatch, expand

_FIELDS = ("input_ids", "labels", "position_ids", "document_ids")


def _rebuild(arrays: tuple, keys: list[str], consumed: list) -> "TokenBatch":
    return TokenBatch(*(torch.from_numpy(a) for a in arrays), keys, consumed)


@dataclass
class TokenBatch:
    """A micro-batch of packed token rows.

    All tensors are ``int64`` of shape ``[B, T]`` (B rows, T = ``seq_len``).

    Attributes:
        input_ids: token ids; padding positions hold 0.
        labels: next-token targets; ``-100`` where no loss is taken (padding, the last
            token of each document, so no prediction crosses a document boundary).
        position_ids: position within the document, restarting at 0 for each document.
        document_ids: per-token document index within the row (0, 1, ...), ``-1`` for padding;
            attention is allowed only where query and key share a document (block-diagonal causal).
        keys: sample keys of the documents that contributed tokens, for logging anomalies.
        consumed: ``(global position, chunk index, chunks in the document)`` per chunk delivered
            (chunk ``-1``/``-2`` with 0 chunks: an empty/unreadable document); the loader turns
            these into its exact resume state (see :mod:`loaders.progress`).
        packed: the compact form it was built from (:class:`loaders.packed.PackedBatch`), or ``None``;
            a CPU batch with one pickles as that (ids plus chunk lengths, about 2 B T bytes).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    document_ids: torch.Tensor
    keys: list[str]
    consumed: list[tuple[int, int, int]] = field(default_factory=list)
    packed: PackedBatch | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_packed(cls, p: PackedBatch) -> "TokenBatch":
        """Expand a packed batch (:func:`loaders.packed.expand`) into ``int64`` ``[B, T]`` tensors."""
        ids, labels, pos, docs = expand(p)
        return cls(torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(pos), torch.from_numpy(docs),
                   p.keys, p.consumed, p)

    @property
    def num_real_tokens(self) -> int:
        """Count of positions that carry a loss (labels != -100)."""
        if self.labels.device.type == "cpu":
            return int(np.count_nonzero(self.labels.numpy() != -100))
        return int((self.labels != -100).sum())

    @property
    def num_doc_tokens(self) -> int:
        """Count of positions holding document tokens (``document_ids >= 0``), padding excluded."""
        if self.packed is not None:  # the chunk lengths say it without a pass over [B, T]
            return self.packed.num_doc_tokens
        if self.document_ids.device.type == "cpu":
            return int(np.count_nonzero(self.document_ids.numpy() >= 0))
        return int((self.document_ids >= 0).sum())

    def __reduce__(self):
        # CPU batches travel (worker process -> trainer) as plain arrays in the pickle: one
        # pipe write instead of one shared-memory file and descriptor hand-over per tensor,
        # which costs more than copying a few hundred KiB.
        tensors = [getattr(self, f) for f in _FIELDS]
        if self.packed is not None and all(t.device.type == "cpu" for t in tensors):
            return TokenBatch.from_packed, (self.packed,)
        if all(t.device.type == "cpu" and not t.requires_grad for t in tensors):
            return _rebuild, (tuple(t.numpy() for t in tensors), self.keys, self.consumed)
        return TokenBatch, (*tensors, self.keys, self.consumed)

    def to(self, device, non_blocking: bool = False) -> "TokenBatch":
        """The batch with every tensor moved to ``device`` (keys and resume records unchanged)."""
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return TokenBatch(move(self.input_ids), move(self.labels), move(self.position_ids),
                          move(self.document_ids), self.keys, self.consumed)

    def pin_memory(self) -> "TokenBatch":
        """The batch with every tensor in pinned host memory (faster, asynchronous host-to-GPU copies)."""
        return TokenBatch(self.input_ids.pin_memory(), self.labels.pin_memory(), self.position_ids.pin_memory(),
                          self.document_ids.pin_memory(), self.keys, self.consumed)
