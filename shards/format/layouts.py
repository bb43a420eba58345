"""The registry of shard layouts: a manifest's ``layout`` name -> how its shards are written, counted and read.

Every choice that depends on the layout is made here, once: the other packages look a layout
up by name (:func:`get_layout`) and call it.

* ``documents`` (format 1): one tar sample per document, members ``json`` + ``tokens.npy.zst``
  (+ ``txt.zst``) (:mod:`shards.format.sample`);
* ``token_blocks`` (format 2; format 3 writes its block metadata as text columns): one tar sample per
  block of documents (:mod:`shards.format.blocks`).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable, NamedTuple, Protocol

import numpy as np

from shards.access.documents import IndexedShard
from shards.access.token_blocks import BlockShard
from shards.format.blocks import COMPRESSIONS, BlockPacker
from shards.format.sample import encode_text_sample

if TYPE_CHECKING:  # the manifest looks layouts up: no import back at run time
    from shards.format.manifest import ShardInfo

HEADER_BYTES = 1536  # two tar headers plus average padding per one-document sample
BLOCK_DOC_BYTES = 16  # a document's share of its block's metadata, compressed

Write = Callable[[str, dict, int, int], None]  # (key, fields, tokens, documents): a tar writer's ``write``


class EncodedDocument(NamedTuple):
    """One tokenised document on its way to a shard (what a pipeline's workers exchange).

    Attributes:
        key: the sample key (``shards.format.keys.escape_key`` of the id).
        fields: what the layout's :meth:`Layout.sink` writes: member suffix -> bytes (``documents``),
            or the metadata ``json``, the raw little-endian ``tokens`` and an optional ``text``
            (``token_blocks``, packed into blocks when written).
        tokens: the document's token count.
        source: the corpus it came from.
        text_bytes: UTF-8 bytes of its text.
    """

    key: str
    fields: dict
    tokens: int
    source: str
    text_bytes: int


class DocumentSink(Protocol):
    """Takes the encoded documents of one shard in order and writes its samples (see :meth:`Layout.sink`)."""

    def add(self, doc: EncodedDocument) -> None:
        """Write ``doc`` (or keep it for the block being filled)."""

    def flush(self) -> None:
        """Write whatever is kept (the last block)."""


class Layout(Protocol):
    """What one layout means (see the module docstring for the two)."""

    name: str
    format_version: int

    def documents(self, info: ShardInfo) -> int:
        """Documents in the shard ``info`` describes (the loader's unit)."""

    def encode(self, meta: dict, tokens: np.ndarray, text: str | None) -> dict:
        """The ``fields`` of an :class:`EncodedDocument`: ``meta`` (JSON-able), 1-D ``uint16``/``uint32``
        ``tokens`` and the text to store, if any."""

    def encoded_bytes(self, doc: EncodedDocument) -> int:
        """About how many shard bytes ``doc`` takes (sizes the shard count before writing)."""

    def sink(self, write: Write, compression: str, block_tokens: int) -> DocumentSink:
        """A :class:`DocumentSink` writing samples with ``write`` (a tar writer's ``write``)."""

    def open(self, path: str, info: ShardInfo, token_dtype: str, index_dir: str | None):
        """An open handle of the local shard ``path``: ``IndexedShard`` or ``BlockShard`` (:mod:`shards.access`).

        Raises:
            ShardError: the shard does not match ``info`` or its layout. OSError: unreadable file.
        """


class _DocumentsSink:
    def __init__(self, write: Write):
        self.write = write

    def add(self, doc: EncodedDocument) -> None:
        self.write(doc.key, doc.fields, doc.tokens, 1)

    def flush(self) -> None:
        pass


class DocumentsLayout:
    """``documents``: one tar sample per document (format 1)."""

    name, format_version = "documents", 1

    def documents(self, info: ShardInfo) -> int:
        """One document per sample: ``info.samples``."""
        return info.samples

    def encode(self, meta: dict, tokens: np.ndarray, text: str | None) -> dict:
        """The sample's members (:func:`shards.format.sample.encode_text_sample`)."""
        return encode_text_sample(tokens, meta, text)

    def encoded_bytes(self, doc: EncodedDocument) -> int:
        """Its members' bytes plus tar headers and padding."""
        return sum(len(v) for v in doc.fields.values()) + HEADER_BYTES

    def sink(self, write: Write, compression: str, block_tokens: int) -> DocumentSink:
        """Each document written as its own sample (``compression`` and ``block_tokens`` do not apply)."""
        return _DocumentsSink(write)

    def open(self, path: str, info: ShardInfo, token_dtype: str, index_dir: str | None) -> IndexedShard:
        """:class:`shards.access.documents.IndexedShard` of ``path``."""
        return IndexedShard(path, info.samples, info.sha256, info.bytes, index_dir, token_dtype)


_BLOCK_KEYS = ("id", "source", "n_tokens", "n_bytes")  # what a block holds per document in its own lists


class _BlocksSink:
    def __init__(self, write: Write, compression: str, block_tokens: int):
        self.write, self.packer = write, BlockPacker(block_tokens, compression)

    def add(self, doc: EncodedDocument) -> None:
        meta = json.loads(doc.fields["json"])
        data = doc.fields["tokens"]
        tokens = np.frombuffer(data, dtype=f"<u{len(data) // doc.tokens}") if doc.tokens else np.zeros(0, np.uint16)
        extra = {k: v for k, v in meta.items() if k not in _BLOCK_KEYS}  # a web page's url, date, language
        self._put(self.packer.add(meta["id"], meta["source"], tokens, doc.fields.get("text"), extra))

    def flush(self) -> None:
        self._put(self.packer.flush())

    def _put(self, block) -> None:
        if block is not None:
            self.write(block.key, block.fields, block.tokens, block.documents)


class TokenBlocksLayout:
    """``token_blocks``: many documents per tar sample (:mod:`shards.format.blocks`; format 2, its block
    metadata as text columns since format 3)."""

    name, format_version = "token_blocks", 3

    def documents(self, info: ShardInfo) -> int:
        """The manifest's per-shard document count (a block holds many)."""
        return info.documents

    def encode(self, meta: dict, tokens: np.ndarray, text: str | None) -> dict:
        """``json`` metadata bytes, the tokens' raw little-endian bytes (an array object costs more than a
        short document's tokens while a shard's documents are held together) and ``text`` if stored."""
        fields = {"json": json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8"),
                  "tokens": tokens.astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes()}
        if text is not None:
            fields["text"] = text
        return fields

    def encoded_bytes(self, doc: EncodedDocument) -> int:
        """Its tokens' bytes plus its share of the block's metadata."""
        return len(doc.fields["tokens"]) + BLOCK_DOC_BYTES

    def sink(self, write: Write, compression: str, block_tokens: int) -> DocumentSink:
        """Documents cut into blocks of about ``block_tokens`` tokens (:class:`shards.format.blocks.BlockPacker`)."""
        return _BlocksSink(write, compression, block_tokens)

    def open(self, path: str, info: ShardInfo, token_dtype: str, index_dir: str | None) -> BlockShard:
        """:class:`shards.access.token_blocks.BlockShard` of ``path``."""
        return BlockShard(path, info.samples, info.sha256, info.bytes, index_dir, token_dtype, info.documents)


# the default (what preprocessing writes unless told otherwise) first
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (TokenBlocksLayout(), DocumentsLayout())}


def get_layout(name: str) -> Layout:
    """The layout called ``name``.

    Raises:
        ValueError: no such layout (the message lists the known ones).
    """
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"shard layout {name!r} is not one of {tuple(LAYOUTS)}") from None


def check_settings(layout: str, compression: str, block_tokens: int) -> None:
    """Raise ``ValueError`` naming ``shards.layout``/``shards.compression``/``shards.block_tokens`` and the valid
    values unless they describe a shard layout colaflow writes."""
    if layout not in LAYOUTS or compression not in COMPRESSIONS or block_tokens < 0:
        raise ValueError(f"shards.layout={layout!r}, shards.compression={compression!r}, shards.block_tokens="
                         f"{block_tokens}: use {'|'.join(LAYOUTS)}, {'|'.join(COMPRESSIONS)} and >= 0")
