"""Token blocks: many documents' tokens in one WebDataset sample (layout ``token_blocks``, format 2 and 3).

A block with key ``K`` (the escaped id of its first document) is two adjacent members:

* ``K.json.zst`` — zstd-compressed UTF-8 JSON ``{"layout": "token_block", "version": 2, "dtype": "uint16",
  "ids": "...", "sources": "...", "lengths": [...]}``: per document its original id, source and
  token count, in block order; ids and sources are text columns (:func:`text_column`: one string,
  the values joined by newlines, backslash and newline escaped) (optionally ``"texts"``, a list,
  ``null`` for a document stored without one). Version 1 (no ``"version"``; manifests of format 2)
  holds ids and sources as JSON lists and is still read;
* ``K.tokens.npy`` (raw: a ``.npy`` array whose data starts 64-byte aligned, so the tokens can be
  memory-mapped straight out of the tar) or ``K.tokens.npy.zst`` (one zstd frame): the
  documents' tokens concatenated, 1-D little-endian ``uint16``/``uint32``.

Tar headers and padding are thus paid per block, not per document (see ``docs/shard-format.md``
§4). Every reader that knows ``.npy`` and ``.json`` (webdataset, wids, DALI) reads a block as an
ordinary sample.
"""
from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from shards.format.keys import escape_key
from shards.format.sample import npy_concat, zstd_compress, zstd_decompress

BLOCK_LAYOUT = "token_block"
META_SUFFIX = "json.zst"
RAW_SUFFIX = "tokens.npy"
ZSTD_SUFFIX = "tokens.npy.zst"
COMPRESSIONS = ("none", "zstd")
TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))  # native byte order, as block metadata declares
# Tokens per block when none is given (block_tokens=0): raw blocks stay small (a consumer maps only
# what it reads); zstd compresses far better over large blocks (demo corpus: 1.18 bytes per token
# at 64 Ki tokens and level 3, 0.96 at 1 Mi tokens and level 9), decompressed once per block.
DEFAULT_BLOCK_TOKENS = {"none": 1 << 16, "zstd": 1 << 20}
BLOCK_ZSTD_LEVEL = 9  # ~40 MB/s to write, as fast to read as level 3
# The metadata (ids, sources, lengths as JSON) compresses better at level 1 than at 3 and about as well as
# at 9, in far less time: demo corpus, 61 blocks, 3.73 MB of JSON to 166 KB at level 1, 173 KB at 3.
META_ZSTD_LEVEL = 1
# Layout of the metadata: 1 (format 2) ids and sources as JSON lists; 2 (format 3) as text columns, since
# JSON's encoder spent 0.15-0.3 us on each item of those lists: most of a raw write of short documents
META_VERSION = 2


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


def text_column(values: Sequence) -> str:
    """Strings as one text column: each value (``str(value)``) with its backslashes and newlines written
    ``\\\\`` and ``\\n``, the values joined by newlines.

    Args:
        values: ``[documents]``, at least one.
    Returns:
        The column; :func:`split_column` gives the values back.
    """
    return "\n".join(str(v).replace("\\", "\\\\").replace("\n", "\\n") for v in values)


# the bytes a JSON string escapes (RFC 8259 section 7): control characters, quotation mark, backslash
_JSON_ESCAPED = bytes(range(0x20)) + b'"\\'


def column_json(values: Sequence) -> bytes:
    """The text column of ``values`` (:func:`text_column`) as a JSON string, UTF-8, quotes included.

    The bytes of ``json.dumps(text_column(values), ensure_ascii=False).encode()``, built without the
    encoder's character-by-character escaping (~3 ns a character, the largest part of a raw write of
    short documents) when no value holds a character JSON or the column escapes (the usual case): the
    values joined by the separator as JSON writes it.

    Args:
        values: ``[documents]``, at least one.
    Returns:
        The JSON string's bytes.
    """
    try:
        raw = "\\n".join(values).encode()  # the separators as JSON writes them
    except TypeError:  # ids given as numbers
        values = list(map(str, values))
        raw = "\\n".join(values).encode()
    if len(raw) - len(raw.translate(None, _JSON_ESCAPED)) == len(values) - 1:  # their backslashes alone
        return b'"' + raw + b'"'
    return json.dumps(text_column(values), ensure_ascii=False).encode()


def json_uint_arrays(values: np.ndarray, ends: Sequence[int]) -> list[bytes]:
    """Consecutive runs of non-negative integers (``values[:ends[0]]``, ``values[ends[0]:ends[1]]``, ...) as
    JSON arrays: each the bytes of ``json.dumps(run.tolist(), separators=(",", ":"))``, formatted by numpy
    for all runs at once (``json.dumps`` costs ~80 ns an integer).

    Args:
        values: 1-D ``int64``, every value >= 0.
        ends: exclusive end of each run, ascending, within ``len(values)``.
    Returns:
        One JSON array per run, ASCII bytes such as ``b"[58,612,0]"``.
    """
    width = len(str(int(values.max()))) if len(values) else 1
    cells = np.full((len(values), width + 1), ord(" "), np.uint8)  # a value's digits, right-aligned, and a comma
    cells[:, width] = ord(",")
    cells[:, width - 1] = values % 10 + ord("0")  # the ones digit, a zero included
    sizes = np.full(len(values), 2, np.int64)  # characters of each value and its comma
    rest = values
    for column in range(width - 2, -1, -1):  # one scalar division a column: numpy vectorises those
        rest = rest // 10
        digit = rest > 0  # else a leading zero, left a space
        sizes += digit
        cells[:, column] = np.where(digit, (rest % 10).astype(np.uint8) + ord("0"), ord(" "))
    text = cells[cells != ord(" ")].tobytes()
    at = np.zeros(len(values) + 1, np.int64)  # where each value's digits start
    np.cumsum(sizes, out=at[1:])
    starts = [0, *ends[:-1]]
    return [b"[" + text[at[a]:at[b] - 1] + b"]" if b > a else b"[]" for a, b in zip(starts, ends)]


_ESCAPE = re.compile(r"\\(.?)", re.DOTALL)
_UNESCAPED = {"\\": "\\", "n": "\n"}


def split_column(text: str, where: str = "block") -> list[str]:
    """The values of a :func:`text_column`.

    Raises:
        ValueError: an escape other than ``\\\\`` and ``\\n`` (message names ``where``).
    """
    values = text.split("\n")
    if "\\" not in text:
        return values
    try:
        return [_ESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], v) for v in values]
    except KeyError as e:
        raise ValueError(f"{where}: block metadata column holds the escape \\{e.args[0]} (only \\\\ and \\n)") from None


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
    if any(t.ndim != 1 for *_, t in docs):
        raise ValueError(f"block tokens must be 1-D, got shapes {sorted({t.shape for *_, t in docs if t.ndim != 1})}")
    [lengths_json] = json_uint_arrays(np.array([len(t) for *_, t in docs], np.int64), [len(docs)])
    return _encode([i for i, _, _ in docs], [s for _, s, _ in docs], lengths_json, [t for *_, t in docs], compression,
                   texts, metas)


def _encode(ids: list, sources: list, lengths_json: bytes, pieces: list[np.ndarray], compression: str,
            texts: list[str] | None, metas: list[dict] | None) -> tuple[str, dict[str, bytes]]:
    """The one block encoder (:func:`encode_block`, :class:`BlockPacker`).

    Args:
        ids, sources: ``[documents]`` per document, in block order.
        lengths_json: their token counts as a JSON array (:func:`json_uint_arrays`).
        pieces: 1-D arrays whose concatenation is the documents' tokens (views of the caller's arrays).
        compression, texts, metas: as :func:`encode_block`.
    Returns:
        ``(key, {suffix: bytes})``.
    Raises:
        ValueError: mixed or unsupported dtypes, or an unknown compression.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"shards.compression={compression!r}: use one of {COMPRESSIONS}")
    dtypes = set(map(attrgetter("dtype"), pieces))  # C calls: a block may hold thousands of short documents
    if len(dtypes) != 1 or next(iter(dtypes)) not in TOKEN_DTYPES:
        raise ValueError(f"block tokens must be 1-D and all uint16 or all uint32, got {sorted(map(str, dtypes))}")
    dtype = next(iter(dtypes))
    if dtype != dtype.newbyteorder("<"):  # a big-endian host: blocks are little-endian everywhere
        dtype = dtype.newbyteorder("<")
        pieces = [p.astype(dtype) for p in pieces]
    head = f'{{"layout":"{BLOCK_LAYOUT}","version":{META_VERSION},"dtype":"{dtype.name}"'.encode()
    extra = {k: v for k, v in (("texts", texts), ("metas", metas)) if v is not None}
    tail = b"," + json.dumps(extra, ensure_ascii=False, separators=(",", ":")).encode()[1:] if extra else b"}"
    # the columns go in as ready JSON (column_json, json_uint_arrays) between the fixed members and the optional ones
    meta_json = b"".join((head, b',"ids":', column_json(ids), b',"sources":', column_json(sources), b',"lengths":',
                          lengths_json, tail))
    npy = npy_concat(pieces, dtype)  # one copy of the tokens, however many pieces
    fields = {META_SUFFIX: zstd_compress(meta_json, META_ZSTD_LEVEL),
              (RAW_SUFFIX if compression == "none" else ZSTD_SUFFIX): npy if compression == "none"
              else zstd_compress(npy, BLOCK_ZSTD_LEVEL)}
    return escape_key(str(ids[0])), fields


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
    version = meta.get("version", 1)
    if version == META_VERSION:
        if not (isinstance(ids, str) and isinstance(sources, str)):
            raise ValueError(f"{where}: block metadata version {version} holds ids and sources as text columns, "
                             f"got {type(ids).__name__} and {type(sources).__name__}")
        ids, sources = split_column(ids, where), split_column(sources, where)
    elif version != 1:
        raise ValueError(f"{where}: block metadata version {version!r} is not supported (1 or {META_VERSION}); "
                         "upgrade colaflow")
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
        if texts is not None and texts[i] is not None:
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


def block_ends(lengths: np.ndarray, block_tokens: int) -> list[int]:
    """The packing rule: where each block of documents ends, documents in order.

    A block takes documents while their tokens stay within ``block_tokens``; the document that
    would cross it starts the next block, except that a block always takes at least one document
    (a longer document gets a block of its own). Documents are never split. Equivalently, one
    document at a time: close the block before a document when the block is not empty and its
    tokens plus the document's exceed ``block_tokens``.

    Args:
        lengths: ``[documents]`` non-negative token counts (any integer dtype).
        block_tokens: the block size in tokens (>= 1).
    Returns:
        Exclusive end index of every block, ascending; the last is ``len(lengths)`` (empty for no documents).
    """
    ends = np.cumsum(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], ends])
    out, start = [], 0
    while start < len(lengths):
        # the last document boundary within block_tokens of the block's start (whole documents only)
        end = int(np.searchsorted(offsets, offsets[start] + block_tokens, side="right")) - 1
        start = max(end, start + 1)
        out.append(start)
    return out


class BlockPacker:
    """Collect documents and cut them into blocks of about ``block_tokens`` tokens (:func:`block_ends`).

    Documents come in batches (:meth:`add_many`) or one at a time (:meth:`add`, a batch of one);
    the blocks are the same however the documents are batched. A block is emitted once the
    document that would cross ``block_tokens`` arrives; the last one by :meth:`flush`.

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
        self._reset()

    def _reset(self) -> None:
        # documents held for the block being filled, in order; chunk i holds the tokens of documents
        # _chunk_first[i] up to the next chunk's first (a batch given as one array is one chunk)
        self._ids: list = []
        self._sources: list = []
        self._lengths: list[int] = []
        self._chunks: list[np.ndarray] = []
        self._chunk_first: list[int] = []
        # per document, or None while no held document has one (most blocks have neither)
        self._texts: list[str | None] | None = None
        self._metas: list[dict] | None = None
        self._n = 0

    def add(self, doc_id: str, source: str, tokens: np.ndarray, text: str | None = None,
            meta: dict | None = None) -> Block | None:
        """Add one document (``meta``: further metadata, see :func:`encode_block`): :meth:`add_many` of one.

        Returns:
            The block it finished, or ``None`` (one document finishes at most one block).
        Raises:
            ValueError: as :meth:`add_many`.
        """
        if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype not in TOKEN_DTYPES:
            got = f"{tokens.dtype}{list(tokens.shape)}" if isinstance(tokens, np.ndarray) else type(tokens).__name__
            raise ValueError(f"tokens must be a 1-D uint16/uint32 array, got {got}")
        if not str(doc_id):
            raise ValueError(f"document {len(self._ids)} of the block being filled has an empty id; "
                             "every document needs an id (its sample key)")
        blocks = self._hold([doc_id], [source], [len(tokens)], [tokens], None if text is None else [text],
                            [meta] if meta else None)  # an empty meta is no meta (the pipeline passes {})
        return blocks[0] if blocks else None

    def add_many(self, ids: Sequence, sources: Sequence, tokens: np.ndarray | Sequence[np.ndarray],
                 lengths: np.ndarray | Sequence[int] | None = None, texts: Sequence[str | None] | None = None,
                 metas: Sequence[dict | None] | None = None, sink: Callable[[Block], None] | None = None) -> list[Block]:
        """Add documents in order; returns the blocks they finished (the last block stays open).

        Args:
            ids: ``[documents]`` document ids (sample keys once escaped), none empty.
            sources: ``[documents]`` source names.
            tokens: one 1-D ``uint16``/``uint32`` array of all the documents' tokens concatenated
                (with ``lengths``), or one 1-D array per document (without ``lengths``); held as given, not
                copied, until their block is encoded: do not change them before :meth:`flush` or a later add.
            lengths: ``[documents]`` non-negative token counts summing to ``len(tokens)``, when
                ``tokens`` is one array.
            texts: ``[documents]`` source texts (or ``None`` each) kept in the block metadata, or ``None``.
            metas: ``[documents]`` further metadata dicts (or ``None`` each), or ``None``.
            sink: called with each finished block as soon as it is encoded, instead of returning them: a
                writer writes it before the next is made, so a batch of any size holds one encoded block.
        Returns:
            The finished :class:`Block` s in order (often none; none with ``sink``).
        Raises:
            ValueError: lists of different lengths, an empty id, tokens that are not 1-D ``uint16``/``uint32``
                of one dtype (the dtype of the block being filled), ``lengths`` that do not add up to the
                tokens, or one array without ``lengths`` (a list of arrays with them).
        """
        ids, given = list(ids), lengths is not None
        if given != isinstance(tokens, np.ndarray):
            raise ValueError("give one concatenated token array with lengths, or a list of arrays without")
        if lengths is None:
            if not all(isinstance(t, np.ndarray) for t in tokens):
                raise ValueError("tokens must be 1-D uint16/uint32 numpy arrays, got "
                                 f"{sorted({type(t).__name__ for t in tokens if not isinstance(t, np.ndarray)})}")
            kinds = set(zip(map(attrgetter("dtype"), tokens), map(attrgetter("ndim"), tokens)))
            dtypes = {dtype for dtype, _ in kinds}
            if len(dtypes) > 1:  # joined, their tokens would be read at one width
                raise ValueError(f"block tokens must be all uint16 or all uint32, got {sorted(map(str, dtypes))}")
            if any(ndim != 1 or dtype not in TOKEN_DTYPES for dtype, ndim in kinds):
                raise ValueError("tokens must be 1-D uint16/uint32 arrays, got "
                                 f"{sorted(f'{d}, {k}-D' for d, k in kinds)}")
            # each document's array is held as it is: its tokens are copied once, into their block
            lengths, chunks = list(map(len, tokens)), list(tokens)
        else:
            lengths, chunks = np.asarray(lengths, dtype=np.int64).tolist(), [tokens]
        n, total = len(lengths), sum(lengths)
        if not len(ids) == len(sources) == n or any(c is not None and len(c) != n for c in (texts, metas)):
            raise ValueError(f"{len(ids)} ids, {len(sources)} sources and {n} token counts (and texts or metas"
                             " of another length?): give one of each per document")
        if given and (tokens.ndim != 1 or tokens.dtype not in TOKEN_DTYPES or len(tokens) != total
                      or min(lengths, default=0) < 0):
            raise ValueError(f"tokens must be one 1-D uint16/uint32 array of the documents' {total} tokens "
                             f"(non-negative lengths), got {tokens.dtype}{list(tokens.shape)}")
        if "" in ids:
            raise ValueError(f"document {len(self._ids) + ids.index('')} of the block being filled has an empty "
                             "id; every document needs an id (its sample key)")
        return self._hold(ids, list(sources), lengths, chunks, texts, metas, sink) if n else []

    def _hold(self, ids: list, sources: list, lengths: list[int], chunks: list[np.ndarray], texts, metas,
              sink: Callable[[Block], None] | None = None) -> list[Block]:
        """Hold checked documents; emit the blocks they finished (to ``sink``). ``chunks``: their tokens as
        one concatenated array or one array per document, of one dtype."""
        if self._chunks and chunks[0].dtype != self._chunks[0].dtype:  # refused here, not by a later call's block
            raise ValueError(f"document {ids[0]!r} has {chunks[0].dtype} tokens, the block being filled "
                             f"{self._chunks[0].dtype}: a block's tokens are read at one width; give one dtype")
        held = len(self._ids)
        self._ids += ids
        self._sources += sources
        self._lengths += lengths
        self._chunk_first += [held] if len(chunks) == 1 else range(held, held + len(chunks))
        self._chunks += chunks
        if texts is not None or self._texts is not None:
            self._texts = _extend(self._texts, texts, held, len(ids), None)
        if metas is not None or self._metas is not None:
            self._metas = _extend(self._metas, None if metas is None else [m or {} for m in metas], held, len(ids), {})
        self._n += sum(lengths)
        if self._n <= self.block_tokens:  # no document can have crossed the block size yet
            return []
        lengths = np.asarray(self._lengths, dtype=np.int64)
        return self._emit(block_ends(lengths, self.block_tokens)[:-1], lengths, sink)  # the last block stays open

    def flush(self) -> Block | None:
        """The block being filled, or ``None`` when empty."""
        return self._emit([len(self._ids)], np.asarray(self._lengths, dtype=np.int64))[0] if self._ids else None

    def _emit(self, ends: list[int], lengths: np.ndarray, sink: Callable[[Block], None] | None = None) -> list[Block]:
        """Encode the held documents up to each of ``ends`` as blocks (each to ``sink`` if given, else returned);
        keep the ones after the last. ``lengths``: ``int64 [held documents]``, their token counts."""
        if not ends:
            return []
        # token offset of each held document (an array: only a few entries per block are read)
        doc_at = np.concatenate([[0], np.cumsum(lengths)])
        out, start = [], 0
        put = sink or out.append
        for end, lengths_json in zip(ends, json_uint_arrays(lengths[:ends[-1]], ends)):
            # a document without a text keeps its place as null: texts pair with ids by position
            texts = None if self._texts is None else self._texts[start:end]
            metas = None if self._metas is None else self._metas[start:end]
            key, fields = _encode(self._ids[start:end], self._sources[start:end], lengths_json,
                                  self._pieces(start, end, doc_at), self.compression,
                                  texts if texts and any(t is not None for t in texts) else None,
                                  metas if metas and any(metas) else None)
            put(Block(key, fields, end - start, int(doc_at[end] - doc_at[start])))
            start = end
        if start == len(self._ids):
            self._reset()
            return out
        first_chunk = bisect.bisect_right(self._chunk_first, start) - 1  # the chunks still holding documents
        self._chunks = self._pieces(start, len(self._ids), doc_at)
        self._chunk_first = [max(f - start, 0) for f in self._chunk_first[first_chunk:]]
        self._ids, self._sources, self._lengths = self._ids[start:], self._sources[start:], self._lengths[start:]
        self._texts = None if self._texts is None else self._texts[start:]
        self._metas = None if self._metas is None else self._metas[start:]
        self._n -= int(doc_at[start])
        return out

    def _pieces(self, start: int, end: int, doc_at: np.ndarray) -> list[np.ndarray]:
        """Views of the chunks holding the tokens of held documents ``[start, end)`` (``end > start``;
        every chunk holding one of them, so a zero-length document's dtype is checked too)."""
        first = bisect.bisect_right(self._chunk_first, start) - 1
        stop = bisect.bisect_left(self._chunk_first, end)  # chunks first..stop-1 hold the documents
        pieces = self._chunks[first:stop]  # whole chunks in between; only the two ends may be cut
        last_end = self._chunk_first[stop] if stop < len(self._chunk_first) else len(self._ids)
        if end < last_end:
            pieces[-1] = pieces[-1][:doc_at[end] - doc_at[self._chunk_first[stop - 1]]]
        if start > self._chunk_first[first]:
            pieces[0] = pieces[0][doc_at[start] - doc_at[self._chunk_first[first]]:]
        return pieces


def _extend(column: list | None, values, held: int, n: int, empty) -> list | None:
    """A per-document column extended by ``values`` (``None``: ``n`` times ``empty``), still ``None``
    while neither it nor ``values`` holds anything; ``held`` documents precede the new ones."""
    if column is None:
        if values is None or all(v == empty for v in values):
            return None
        column = [empty] * held
    column += [empty] * n if values is None else values
    return column


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
