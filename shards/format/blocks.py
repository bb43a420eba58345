"""Token blocks: many documents' tokens in one WebDataset sample (layout ``token_blocks``, format 2).

A block with key ``K`` (the escaped id of its first document) is two adjacent members:

* ``K.json.zst`` — zstd-compressed UTF-8 JSON ``{"layout": "token_block", "dtype": "uint16",
  "ids": [...], "sources": [...], "lengths": [...]}``: per document its original id, source and
  token count, in block order (optionally ``"texts"``);
* ``K.tokens.npy`` (raw: a ``.npy`` array whose data starts 64-byte aligned, so the tokens can be
  memory-mapped straight out of the tar) or ``K.tokens.npy.zst`` (one zstd frame): the
  documents' tokens concatenated, 1-D little-endian ``uint16``/``uint32``.

Tar headers and padding are thus paid per block, not per document (see ``docs/shard-format.md``
§4). Every reader that knows ``.npy`` and ``.json`` (webdataset, wids, DALI) reads a block as an
ordinary sample.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from shards.format.keys import escape_key
from shards.format.sample import encode_npy, zstd_compress, zstd_decompress

BLOCK_LAYOUT = "token_block"
META_SUFFIX = "json.zst"
RAW_SUFFIX = "tokens.npy"
ZSTD_SUFFIX = "tokens.npy.zst"
COMPRESSIONS = ("none", "zstd")
# Tokens per block when none is given (block_tokens=0): raw blocks stay small (a consumer maps only
# what it reads); zstd compresses far better over large blocks (demo corpus: 1.18 bytes per token
# at 64 Ki tokens and level 3, 0.96 at 1 Mi tokens and level 9), decompressed once per block.
DEFAULT_BLOCK_TOKENS = {"none": 1 << 16, "zstd": 1 << 20}
BLOCK_ZSTD_LEVEL = 9  # ~40 MB/s to write, as fast to read as level 3


@dataclass(frozen=True)
class BlockMeta:
    """Documents of one block, in block order.

    Attributes:
        ids: original document ids.
        sources: each document's source name.
        lengths: ``int64`` ``[documents]`` token counts.
        dtype: token dtype name (``uint16`` / ``uint32``).
    """

    ids: list[str]
    sources: list[str]
    lengths: np.ndarray
    dtype: str = "uint16"

    @property
    def offsets(self) -> np.ndarray:
        """``int64`` ``[documents + 1]``: token offsets of each document in the block."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    @property
    def tokens(self) -> int:
        """Total tokens of the block (sum of ``lengths``)."""
        return int(self.lengths.sum())


def is_block(suffixes: Iterable[str]) -> bool:
    """Whether a sample with these member suffixes is a token block (it has ``json.zst`` + tokens)."""
    s = set(suffixes)
    return META_SUFFIX in s and (RAW_SUFFIX in s or ZSTD_SUFFIX in s)


def encode_block(docs: list[tuple[str, str, np.ndarray]], compression: str = "none",
                 texts: list[str] | None = None, metas: list[dict] | None = None) -> tuple[str, dict[str, bytes]]:
    """Encode documents ``(id, source, tokens)`` as one block: ``(key, {suffix: bytes})``.

    Args:
        docs: at least one document; tokens 1-D ``uint16``/``uint32``, all of one dtype.
        compression: ``none`` (raw ``.npy``, memory-mappable) or ``zstd`` (one frame).
        texts: optional source texts, kept in the metadata.
        metas: optional further metadata per document (a web page's ``url``, ``date``, ``language``),
            kept as ``metas``.
    Raises:
        ValueError: no documents, mixed or unsupported dtypes, or an unknown compression.
    """
    if not docs:
        raise ValueError("a token block needs at least one document")
    if compression not in COMPRESSIONS:
        raise ValueError(f"shards.compression={compression!r}: use one of {COMPRESSIONS}")
    dtypes = {t.dtype for _, _, t in docs}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (np.uint16, np.uint32) or any(t.ndim != 1 for *_, t in docs):
        raise ValueError(f"block tokens must be 1-D and all uint16 or all uint32, got {sorted(map(str, dtypes))}")
    dtype = next(iter(dtypes))
    tokens = np.concatenate([t for _, _, t in docs]).astype(dtype.newbyteorder("<"), copy=False)
    meta = {"layout": BLOCK_LAYOUT, "dtype": dtype.name, "ids": [str(i) for i, _, _ in docs],
            "sources": [str(s) for _, s, _ in docs], "lengths": [len(t) for _, _, t in docs]}
    if texts is not None:
        meta["texts"] = texts
    if metas is not None:
        meta["metas"] = metas
    npy = encode_npy(tokens)
    meta_json = json.dumps(meta, ensure_ascii=False, separators=(",", ":")).encode()
    fields = {META_SUFFIX: zstd_compress(meta_json, BLOCK_ZSTD_LEVEL),
              (RAW_SUFFIX if compression == "none" else ZSTD_SUFFIX): npy if compression == "none"
              else zstd_compress(npy, BLOCK_ZSTD_LEVEL)}
    return escape_key(str(docs[0][0])), fields


def decode_meta(data: bytes, where: str = "block") -> BlockMeta:
    """Parse a block's ``json.zst`` member.

    Raises:
        ValueError: not zstd JSON of a token block, or lists of different lengths (message names ``where``).
    """
    try:
        meta = json.loads(zstd_decompress(data).decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - any decoding failure is reported with its location
        raise ValueError(f"{where}: block metadata is not zstd JSON ({type(e).__name__}: {e})") from e
    return decode_meta_dict(meta, where)


def decode_meta_dict(meta, where: str = "block") -> BlockMeta:
    """:class:`BlockMeta` of already-parsed block metadata. Raises ``ValueError`` as :func:`decode_meta`."""
    if not isinstance(meta, dict) or meta.get("layout") != BLOCK_LAYOUT:
        raise ValueError(f"{where}: metadata is not a token block (layout {meta.get('layout')!r})"
                         if isinstance(meta, dict) else f"{where}: metadata is not a JSON object")
    ids, sources, lengths = meta.get("ids", []), meta.get("sources", []), meta.get("lengths", [])
    if not (len(ids) == len(sources) == len(lengths)) or not ids:
        raise ValueError(f"{where}: block metadata lists {len(ids)} ids, {len(sources)} sources and "
                         f"{len(lengths)} lengths; they must be equal and non-zero")
    return BlockMeta(ids, sources, np.asarray(lengths, dtype=np.int64), str(meta.get("dtype", "uint16")))


def check_block(meta: BlockMeta, tokens: np.ndarray, where: str = "block") -> None:
    """Check a decoded block's tokens against its metadata.

    Raises:
        ValueError: dtype or total length differ (message names ``where``).
    """
    if tokens.ndim != 1 or tokens.dtype.name != meta.dtype or len(tokens) != meta.tokens:
        raise ValueError(f"{where}: tokens are {tokens.dtype}[{tokens.shape}], the metadata says "
                         f"{meta.dtype}[{meta.tokens}] over {len(meta.ids)} documents")


def block_documents(sample: dict) -> Iterator[dict]:
    """Split a decoded block sample (``{"__key__", "json", "tokens"}``) into documents.

    Yields per document, in block order, the shape of a one-sample-per-document text sample:
    ``{"__key__": escaped id, "json": {"id", "source", "n_tokens", "block": block key},
    "tokens": 1-D view}`` (plus ``"txt"`` when the block stored texts, and the document's entry of
    ``metas`` in its ``json``).
    Raises ``ValueError`` when the tokens do not match the metadata.
    """
    meta = decode_meta_dict(sample["json"], sample["__key__"])
    check_block(meta, sample["tokens"], sample["__key__"])
    off = meta.offsets
    texts, metas = sample["json"].get("texts"), sample["json"].get("metas")
    for i, (doc_id, source) in enumerate(zip(meta.ids, meta.sources)):
        meta_i = {"id": doc_id, "source": source, "n_tokens": int(off[i + 1] - off[i]), "block": sample["__key__"]}
        if metas is not None:
            meta_i.update(metas[i])
        doc = {"__key__": escape_key(doc_id), "json": meta_i, "tokens": sample["tokens"][off[i]:off[i + 1]]}
        if texts is not None:
            doc["txt"] = texts[i]
        yield doc


def iter_documents(path: str, fileobj=None, **kw) -> Iterator[dict]:
    """Decoded documents of one text shard of either layout: a token block's documents one by one
    (:func:`block_documents`), other samples as they are (arguments as ``shards.iter_samples``).

    Raises ``ShardError`` as ``iter_samples`` does, ``ValueError`` for a block whose tokens do not
    match its metadata.
    """
    from shards.io.reader import iter_samples  # the reader does not depend on blocks; keep it that way

    for sample in iter_samples(path, fileobj, **kw):
        meta = sample.get("json")
        if isinstance(meta, dict) and meta.get("layout") == BLOCK_LAYOUT:
            yield from block_documents(sample)
        else:
            yield sample


def block_counts(fields: dict[str, bytes], where: str = "block") -> tuple[int, int]:
    """``(documents, tokens)`` of a raw block sample, from its metadata only.

    Raises ``ValueError`` on unreadable metadata.
    """
    meta = decode_meta(fields[META_SUFFIX], where)
    return len(meta.ids), meta.tokens


class Block(NamedTuple):
    """An encoded block: its sample ``key``, member ``fields`` (suffix -> bytes), ``documents`` and ``tokens`` (counts)."""

    key: str
    fields: dict[str, bytes]
    documents: int
    tokens: int


class BlockPacker:
    """Collect documents and cut them into blocks of about ``block_tokens`` tokens.

    A block is emitted once adding the next document would cross ``block_tokens`` (a longer
    document gets a block of its own); documents are never split across blocks.

    Args:
        block_tokens: target tokens per block (>= 1; 0: :data:`DEFAULT_BLOCK_TOKENS` of the compression).
        compression: ``none`` or ``zstd`` (see :func:`encode_block`).
    Raises:
        ValueError: a negative ``block_tokens`` or an unknown compression.
    """

    def __init__(self, block_tokens: int = 0, compression: str = "none"):
        if compression not in COMPRESSIONS:
            raise ValueError(f"shards.compression={compression!r}: use one of {COMPRESSIONS}")
        if block_tokens < 0:
            raise ValueError(f"shards.block_tokens={block_tokens}: must be >= 1, or 0 for the default")
        self.block_tokens, self.compression = block_tokens or DEFAULT_BLOCK_TOKENS[compression], compression
        self._docs: list[tuple[str, str, np.ndarray]] = []
        self._texts: list[str] | None = None
        self._metas: list[dict] = []
        self._n = 0

    def add(self, doc_id: str, source: str, tokens: np.ndarray, text: str | None = None,
            meta: dict | None = None) -> Block | None:
        """Add one document (``meta``: further metadata, see :func:`encode_block`); returns the block
        it finished, or ``None``.

        Raises:
            ValueError: an empty ``doc_id`` (it could never be a sample key).
        """
        if not str(doc_id):
            raise ValueError(f"document {len(self._docs)} of the block being filled has an empty id; "
                             "every document needs an id (its sample key)")
        out = None
        if self._docs and self._n + len(tokens) > self.block_tokens:
            out = self.flush()
        self._docs.append((doc_id, source, tokens))
        self._metas.append(meta or {})
        if text is not None:
            self._texts = (self._texts or []) + [text]
        self._n += len(tokens)
        return out

    def flush(self) -> Block | None:
        """The block being filled, or ``None`` when empty."""
        if not self._docs:
            return None
        key, fields = encode_block(self._docs, self.compression, self._texts,
                                   self._metas if any(self._metas) else None)
        out = Block(key, fields, len(self._docs), self._n)
        self._docs, self._texts, self._metas, self._n = [], None, [], 0
        return out


def npy_data_offset(head: bytes) -> int:
    """Byte offset of the array data in ``.npy`` bytes starting with ``head`` (>= 12 bytes).

    The ``.npy`` header (NEP 1, ``numpy.lib.format``) is padded so the data starts 64-byte aligned.
    Raises ``ValueError`` when ``head`` is not a ``.npy`` header.
    """
    if head[:6] != b"\x93NUMPY" or head[6] not in (1, 2, 3):
        raise ValueError("not a .npy member (bad magic)")
    if head[6] == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    return 12 + int.from_bytes(head[8:12], "little")
