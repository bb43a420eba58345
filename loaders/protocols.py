"""The loaders' swappable contracts, named: what the loader needs of its collaborators and what it offers.

Structural (``typing.Protocol``): an object conforms by having the members, without inheriting.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol

import numpy as np

if TYPE_CHECKING:
    from loaders.order.progress import Progress
    from shards import Manifest

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

    @property
    def index_dir(self) -> str:
        """Where this node keeps the shards' member indexes and document tables (shared by its processes)."""

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


class Order(Protocol):
    """The document order of one epoch (:class:`loaders.order.sample_order.SampleOrder` for one dataset,
    :class:`loaders.mixture.sources.MixtureOrder` for a mixture): global positions ``0 .. num_samples-1``
    in blocks of ``block`` positions, each a ``(shard, index in the shard)``."""

    num_samples: int
    num_blocks: int
    block: int

    def block_items(self, b: int, index: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions, shard indices and in-shard indices (``int64``) of block ``b`` (position ``i`` of
        the block: ``b * block + i``), or only of its items at offsets ``index`` (``int64``)."""

    def shards_from(self, position: int) -> list[int]:
        """Shard indices in the order they are first needed from ``position`` on."""


class ShardHandle(Protocol):
    """One open local shard, documents by index (what ``shards.format.layouts.Layout.open`` returns)."""

    errors: list[str]  # unreadable documents met by :meth:`locate`, for the caller to log and count as bad
    has_ids: bool  # whether :meth:`id_bytes_of` gives documents' raw ids (else the shard only knows keys)

    @property
    def resident(self) -> bool:
        """Whether its bytes are in memory (the file, and a cache pin on it, are no longer needed)."""

    def locate(self, index: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Documents ``index`` (``int64``) without a copy where the layout allows: ``(pools, pool, offset,
        length, ok)``, token arrays and per document the ``int64`` index of its pool, its first token
        there and its token count, and a ``bool`` mask of the readable ones."""

    def id_bytes_of(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw ids of documents ``index`` (``int64``; only when :attr:`has_ids`) as UTF-8 ``(uint8 data,
        int64 offsets [len(index) + 1])``, undecoded."""

    def key(self, index: int) -> str:
        """Sample key of document ``index``."""

    def key_list(self) -> list[str]:
        """Every document's sample key, in file order."""

    def tokens(self, index: int) -> tuple[str, np.ndarray]:
        """``(key, 1-D tokens)`` of document ``index``. Raises ``shards.ShardError`` naming the shard."""

    def close(self) -> None:
        """Let go of the shard's bytes."""


class Reader(Protocol):
    """Opens the shards of an order's indices through a :class:`ShardSource` (:class:`loaders.read.shard_reader.ShardReader`)."""

    def handle(self, shard: int) -> ShardHandle:
        """The open shard ``shard``. Raises ``shards.ShardError``: it cannot be fetched or opened (logged once)."""

    def failed(self, shard: int) -> bool:
        """Whether shard ``shard`` could not be opened (its documents count as bad)."""

    def shard_name(self, shard: int) -> str:
        """The shard's name in messages."""

    def key(self, shard: int, index: int) -> str:
        """Sample key of document ``index`` of shard ``shard``."""

    def prefetch(self, shards: list[int]) -> None:
        """The shards needed next, in order (handed to the shard source)."""

    def retain(self, shards: set[int]) -> None:
        """Close every open shard not in ``shards``."""

    def close(self) -> None:
        """Close every open shard."""


class Sources(Protocol):
    """What a loader reads: one dataset (:class:`loaders.sources.OneDataset`) or a weighted mixture of
    datasets (:class:`loaders.mixture.mixture.Mixture`); the loader and its stream are the same for both.

    The first members are used in loader worker processes (numpy only, picklable); the others by the
    rank's loader for the resume state and the per-source counts.
    """

    manifest: "Manifest"  # every shard of every source (names, counts, the data's fingerprint)

    def order(self, epoch: int, seed: int, shuffle: bool, block: int, lanes: int = 1) -> Order:
        """The document order of ``epoch`` (``lanes``: ``data.shard_lanes``)."""

    def reader(self, cache: ShardSource, index_dir: str | None) -> Reader:
        """A reader of the shards an :meth:`order` indexes."""

    def new_progress(self, epoch: int, order_key: dict, world_size: int) -> "Progress":
        """A fresh resume state of ``epoch`` (its length: the epoch's documents)."""

    def state_dict(self, progress: "Progress") -> dict:
        """The resume state to save (JSON-able) for ``progress``."""

    def merge(self, states: list[dict]) -> dict:
        """All ranks' saved states as one."""

    def restore(self, state: dict, order_key: dict, world_size: int,
                nothing_left: Callable[["Progress"], bool]) -> "Progress":
        """The resume state to continue from ``state`` (the next epoch's start when it was over:
        every rank complete, or ``nothing_left``). Raises ``ValueError``: a state of other data or settings."""

    def delivered(self, epoch: int, consumed: np.ndarray, chunk_tokens: np.ndarray) -> None:
        """A delivered batch's ``consumed`` records (``int64 [k, 3]``) and its chunks' token counts (``int64``)."""

    def counted(self, bad: int, empty: int) -> None:
        """Unreadable and empty documents newly recorded in the resume state."""

    def metrics(self, metrics: dict) -> dict:
        """The loader's ``metrics`` with this kind of sources' own counters added."""

    def counts(self) -> dict | None:
        """Tokens per source (see :meth:`RankLoader.source_counts`), ``None`` for one dataset."""

    def origin(self, epoch: int, position: int) -> tuple[str, int] | None:
        """``(source name, source epoch)`` of a position of ``epoch``, ``None`` for one dataset."""
