"""The sources of a data mixture (``data.mixture``): their entries, one mixture epoch's order, and their shards.

A source is a prebuilt dataset with a token ``weight`` or a budget per mixture epoch (``epochs`` of
its tokens, or ``max_tokens``); its unit is the document, not the tar sample. Mixture shards have
*global* indices: the source's offset plus its shard index.
"""
from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256

import numpy as np

from colaflow.config import ConfigError, from_dict
from loaders.mixture.plan import MixturePlan
from loaders.order.sample_order import SampleOrder
from loaders.protocols import ShardSource
from loaders.read.shard_reader import ShardReader
from shards import Manifest
from shards.format.manifest import ShardInfo


@dataclass
class MixtureSource:
    """One entry of ``data.mixture``.

    Attributes:
        manifest: ``manifest.json`` path, its folder, or an ``http(s)://``/fsspec URL.
        name: short name in metrics, reports and ``python -m loaders keys`` (default: the
            manifest's folder name).
        weight: share of the mixture's tokens (any positive scale; normalised over sources).
        epochs: tokens per mixture epoch as a multiple of the source's tokens (e.g. 2.0 reads
            it twice per mixture epoch; fractions allowed).
        max_tokens: tokens per mixture epoch, absolute.
    """

    manifest: str = ""
    name: str = ""
    weight: float = 0.0
    epochs: float = 0.0
    max_tokens: int = 0


def parse_sources(entries: list) -> list[MixtureSource]:
    """``data.mixture`` (a list of mappings) as checked :class:`MixtureSource` s.

    Raises:
        ConfigError: a field is unknown or of the wrong type, a manifest is missing, a name
            repeats, a source sets both a weight and a budget, or weights and budgets are mixed.
    """
    if not isinstance(entries, list) or not entries:
        raise ConfigError("data.mixture: expected a non-empty list of sources (manifest + weight or epochs/max_tokens)")
    out = []
    for i, e in enumerate(entries):
        src = from_dict(MixtureSource, e, f"data.mixture[{i}].")
        if not src.manifest:
            raise ConfigError(f"data.mixture[{i}]: 'manifest' is required (path, folder or URL of manifest.json)")
        src.name = src.name or src.manifest.rstrip("/").removesuffix("manifest.json").rstrip("/").rsplit("/", 1)[-1]
        if src.weight < 0 or src.epochs < 0 or src.max_tokens < 0:
            raise ConfigError(f"data.mixture[{i}] ({src.name}): weight, epochs and max_tokens must be >= 0")
        if src.weight and (src.epochs or src.max_tokens) or (src.epochs and src.max_tokens):
            raise ConfigError(f"data.mixture[{i}] ({src.name}): set one of weight, epochs or max_tokens")
        out.append(src)
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"data.mixture: source names repeat ({names}); give each source a distinct 'name'")
    if any(s.weight for s in out) and any(s.epochs or s.max_tokens for s in out):
        raise ConfigError("data.mixture: use weights for every source or budgets (epochs/max_tokens) for every source")
    if not any(s.weight or s.epochs or s.max_tokens for s in out):
        raise ConfigError("data.mixture: every source needs a weight > 0 (or epochs/max_tokens)")
    return out


@dataclass
class LoadedSource:
    """A source with its manifest: ``items`` = documents, ``tokens`` = tokens of one source epoch."""

    spec: MixtureSource
    manifest: Manifest

    @property
    def items(self) -> int:
        """Documents of one source epoch (the loader's unit; a token block holds many)."""
        return self.manifest.total_documents

    @property
    def tokens(self) -> int:
        """Tokens of one source epoch."""
        return self.manifest.total_tokens

    @property
    def budget(self) -> float:
        """Tokens per mixture epoch (budget mode), else 0."""
        return self.spec.max_tokens or self.spec.epochs * self.tokens


def load_sources(specs: list[MixtureSource]) -> list[LoadedSource]:
    """Load every source's manifest (fsspec). Raises ``FileNotFoundError``/``ValueError`` naming the
    source; ``ValueError`` also for an empty source, or vocabularies or tokenizer files that differ."""
    out = []
    for s in specs:
        try:
            m = Manifest.load(s.manifest)
        except (FileNotFoundError, ValueError) as e:
            raise type(e)(f"mixture source {s.name!r}: {e}") from e
        if m.total_documents < 1 or m.total_tokens < 1:
            raise ValueError(f"mixture source {s.name!r} ({s.manifest}) has no documents or no tokens")
        out.append(LoadedSource(s, m))
    vocabs = {src.spec.name: src.manifest.vocab_size for src in out}
    if len(set(vocabs.values())) > 1:
        raise ValueError(f"mixture sources have different vocabularies {vocabs}; preprocess them with one tokenizer")
    written_by = {src.spec.name: src.manifest.tokenizer_identity.sha256[:12] for src in out
                  if src.manifest.tokenizer_identity is not None and src.manifest.tokenizer_identity.sha256}
    if len(set(written_by.values())) > 1:
        raise ValueError(f"mixture sources were tokenized by different tokenizer files (sha256 {written_by}); "
                         "preprocess them with one tokenizer")
    return out


def source_shares(sources: list[LoadedSource]) -> tuple[list[float], float]:
    """``(token shares, mixture epoch tokens)``: weights with E = all sources' tokens, or budgets with E = their sum."""
    if any(s.spec.weight for s in sources):
        return [s.spec.weight for s in sources], float(sum(s.tokens for s in sources))
    budgets = [s.budget for s in sources]
    return budgets, float(sum(budgets))


def shard_offsets(sources: list[LoadedSource]) -> np.ndarray:
    """``int64`` ``[sources + 1]``: each source's first global shard index (and the total)."""
    return np.concatenate([[0], np.cumsum([len(s.manifest.shards) for s in sources])]).astype(np.int64)


def combined_manifest(sources: list[LoadedSource]) -> Manifest:
    """All sources' shards in one list (names prefixed ``SOURCE/``, each with its document count),
    for messages and the data's fingerprint."""
    shards = [ShardInfo(f"{s.spec.name}/{i.name}", i.samples, i.tokens, i.bytes, i.sha256, d, i.blocks)
              for s in sources for i, d in zip(s.manifest.shards, s.manifest.document_counts())]
    first = sources[0].manifest
    # token_blocks: the layout whose counts are the listed documents (each source keeps its own layout)
    return Manifest(shards, first.tokenizer, first.tokenizer_identity, first.vocab_size, first.token_dtype,
                    layout="token_blocks")


def source_seed(seed: int, name: str) -> int:
    """Seed of a source's own sample order (a 63-bit int): fixed by ``data.seed`` and the source's name,
    so sources draw independent orders and reordering ``data.mixture`` changes none of them."""
    return int.from_bytes(sha256(f"{seed}\0{name}".encode()).digest()[:8], "little") >> 1


class MixtureOrder:
    """One mixture epoch with the interface of :class:`loaders.order.sample_order.SampleOrder`.

    Args:
        plan: the mixture's draw.
        epoch: mixture epoch.
        sources: the loaded sources (plan order).
        seed, shuffle, block, lanes: the loader's order settings (each source gets :func:`source_seed`).
    """

    def __init__(self, plan: MixturePlan, epoch: int, sources: list[LoadedSource], seed: int, shuffle: bool,
                 block: int, lanes: int = 1):
        self.epoch, self.sources, self.seed, self.shuffle, self.lanes = epoch, sources, seed, shuffle, lanes
        self.block = max(1, int(block))
        self.src, self.item = plan.epoch_draws(epoch)
        self.num_samples = len(self.src)
        self.num_blocks = -(-self.num_samples // self.block)
        self.offsets = shard_offsets(sources)
        self._orders: dict[tuple[int, int], SampleOrder] = {}
        self._blocks: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}

    def source_order(self, s: int, source_epoch: int) -> SampleOrder:
        """The sample order of source ``s`` in its epoch ``source_epoch``."""
        key = (s, source_epoch)
        if key not in self._orders:
            if len(self._orders) > 4 * len(self.sources):
                self._orders.clear()
            src = self.sources[s]
            self._orders[key] = SampleOrder(src.manifest.document_counts(),
                                            source_seed(self.seed, src.spec.name), source_epoch, self.shuffle,
                                            self.block, self.lanes)
        return self._orders[key]

    def _source_block(self, s: int, e: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        key = (s, e, b)
        if key not in self._blocks:
            if len(self._blocks) > 8 * len(self.sources):
                self._blocks.clear()
            _, shard, local = self.source_order(s, e).block_items(b)
            self._blocks[key] = (shard, local)
        return self._blocks[key]

    def locate(self, src: np.ndarray, item: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global shard index and in-shard index (``int64`` arrays) of source items ``(src, item)``."""
        shard, local = np.empty(len(src), np.int64), np.empty(len(src), np.int64)
        for s in np.unique(src).tolist():
            sel = np.flatnonzero(src == s)
            n = self.sources[s].items
            e, p = np.divmod(item[sel], n)
            for (ee, bb) in sorted(set(zip(e.tolist(), (p // self.block).tolist()))):
                part = (e == ee) & (p // self.block == bb)
                sh, lo = self._source_block(s, ee, bb)
                at = p[part] % self.block
                shard[sel[part]] = sh[at] + self.offsets[s]
                local[sel[part]] = lo[at]
        return shard, local

    def block_items(self, b: int, index: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions, global shard indices and in-shard indices of mixture block ``b`` (``int64``), or
        only of its items at offsets ``index`` (``int64``)."""
        lo, hi = b * self.block, min((b + 1) * self.block, self.num_samples)
        at = np.arange(hi - lo, dtype=np.int64) if index is None else index
        shard, local = self.locate(self.src[lo:hi][at], self.item[lo:hi][at])
        return lo + at, shard, local

    def shards_from(self, position: int) -> list[int]:
        """Global shard indices in the order they are first needed from ``position`` on."""
        seen: dict[int, None] = {}
        for b in range(position // self.block, self.num_blocks):
            seen.update(dict.fromkeys(self.block_items(b)[1].tolist()))
            if len(seen) >= int(self.offsets[-1]):
                break
        return list(seen)


class MixtureReader:
    """Reads the shards of a mixture order's global indices, each source through its own
    :class:`loaders.read.shard_reader.ShardReader` (a :class:`loaders.protocols.Reader`).

    Args:
        sources: the loaded sources (global shard index = the source's offset + its shard index).
        cache: the node's shard source, shared by every source.
        index_dir: the node's member-index store (``None``: the default).
    """

    def __init__(self, sources: list[LoadedSource], cache: ShardSource, index_dir: str | None = None):
        self.cache, self.names = cache, [s.spec.name for s in sources]
        self.offsets = shard_offsets(sources)
        self.readers = [ShardReader(s.manifest, s.spec.manifest, cache, index_dir) for s in sources]

    def _source(self, shard: int) -> int:
        return int(np.searchsorted(self.offsets, shard, side="right") - 1)

    def _route(self, shard: int) -> tuple[ShardReader, int]:
        s = self._source(shard)
        return self.readers[s], shard - int(self.offsets[s])

    def shard_ref(self, shard: int) -> tuple[str, str, int]:
        """``(url, sha256, bytes)`` of a global shard."""
        reader, local = self._route(shard)
        return reader.shard_ref(local)

    def shard_name(self, shard: int) -> str:
        """``SOURCE/NAME`` of a global shard, as in :func:`combined_manifest`."""
        reader, local = self._route(shard)
        return f"{self.names[self._source(shard)]}/{reader.shard_name(local)}"

    def prefetch(self, shards: list[int]) -> None:
        """Tell the shard source the future read order over all sources."""
        self.cache.prefetch([self.shard_ref(s) for s in shards])

    def handle(self, shard: int):
        """The open shard of a global index; raises :class:`shards.ShardError` as :meth:`ShardReader.handle`."""
        reader, local = self._route(shard)
        return reader.handle(local)

    def key(self, shard: int, index: int) -> str:
        """Sample key of ``(global shard, index)``."""
        reader, local = self._route(shard)
        return reader.key(local, index)

    def failed(self, shard: int) -> bool:
        """Whether the global shard could not be opened."""
        reader, local = self._route(shard)
        return reader.failed(local)

    def retain(self, shards: set[int]) -> None:
        """Close every open shard not in ``shards`` (global indices)."""
        keep: list[set[int]] = [set() for _ in self.readers]
        for g in shards:
            s = self._source(g)
            keep[s].add(int(g) - int(self.offsets[s]))
        for reader, k in zip(self.readers, keep):
            reader.retain(k)

    def close(self) -> None:
        """Close every source's reader (unpins its shards)."""
        for reader in self.readers:
            reader.close()
