"""The loaders' swappable contracts, named: what the loader needs of its collaborators and what it offers.

Structural (``typing.Protocol``): an object conforms by having the members, without inheriting.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Iterable, Iterator, Protocol

ShardRef = tuple[str, "str | None", "int | None"]  # (url, sha256 hex or None, size in bytes or None)


class ShardSource(Protocol):
    """Where the loader gets local shard files: the node cache (``cache.ShardCache``) or shards
    already on a local disk (:class:`loaders.read.shard_reader.LocalShards`).

    A source pickles as what a loader worker process needs to open its own copy (the cache does:
    its config).
    """

    def pinned(self, url: str, sha256: str | None = None, size: int | None = None) -> AbstractContextManager[str]:
        """Context manager giving the local path of shard ``url``, kept on disk while inside.

        Raises:
            OSError / cache.CacheError: the shard cannot be fetched or verified (names the URL).
        """

    def prefetch(self, items: Iterable[ShardRef]) -> None:
        """The shards the reader will open next, in order (a source without read-ahead ignores it)."""

    def metrics(self) -> dict:
        """This process's counters (``hits``, ``misses``, ``stall_seconds``, ...; empty when none)."""

    @property
    def registry(self):
        """A ``prometheus_client.CollectorRegistry`` of the counters, or ``None``."""

    def close(self) -> None:
        """Stop background work (prefetch threads); files stay where they are."""


class RankLoader(Protocol):
    """The loader of one rank as a training loop sees it (:class:`loaders.rank.loader.TextLoader`).

    Iterating it yields one epoch of ``loaders.rank.batch.TokenBatch`` es.
    """

    epoch: int
    totals: dict  # cumulative: batches, doc_tokens, slots (B x T), data_wait_seconds, queue_depth_sum/samples

    def __iter__(self) -> Iterator:
        """The rest of the current epoch's batches."""

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning, unless the state already points into it."""

    @property
    def consumed(self) -> int:
        """Documents of the current epoch already delivered (by any rank, as far as this rank knows)."""

    def state_dict(self) -> dict:
        """This rank's resume state (JSON-able)."""

    def global_state_dict(self) -> dict:
        """All ranks' resume states merged (a collective when ``torch.distributed`` is initialised)."""

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue from a saved state, at any world size and worker count.

        Raises:
            ValueError: the state belongs to other data or order settings.
        """

    def metrics(self) -> dict:
        """Counters of this rank (see :meth:`loaders.rank.loader.TextLoader.metrics`)."""

    def source_counts(self) -> dict | None:
        """Tokens per mixture source (``names``, ``tokens_base``, ``tokens_new``, ``epochs``, ``shares``),
        or ``None`` for one dataset."""
