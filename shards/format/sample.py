"""The sample schema: how one training sample maps to tar members and back.

A text sample with key ``K`` is stored as adjacent members, sorted by name:

* ``K.json`` — UTF-8 JSON metadata (``id``, ``source``, ``n_tokens``, ...);
* ``K.tokens.npy.zst`` — a 1-D ``uint16``/``uint32`` numpy array (``.npy`` format),
  compressed with zstandard on its own;
* ``K.txt.zst`` (optional) — the UTF-8 text the tokens came from, zstd-compressed.

An image sample is ``K.jpg`` or ``K.png`` (stored as is: already compressed) with a
class label ``K.cls`` (ASCII integer) and/or a caption ``K.txt`` (UTF-8), plus optional
``K.json`` metadata.

Decoded, a sample is a dict ``{"__key__": str, field: value}`` where ``field`` is the
member suffix up to its first dot (``tokens``, ``json``, ``txt``, ``jpg``, ``cls``).
"""
from __future__ import annotations

import io
import json
import threading

import numpy as np
import zstandard

from shards.format.tokens import TokenDecoder

ZSTD_LEVEL = 3

# Required fields per schema: each entry is a set of alternatives, one of which must be present.
SCHEMAS: dict[str, tuple[tuple[str, ...], ...]] = {
    "text": (("tokens",), ("json",)),
    "image": (("jpg", "png"), ("cls", "txt")),
    "any": (),
}
_IMAGE_MAGIC = {"jpg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n"}


def encode_npy(array: np.ndarray) -> bytes:
    """Serialise an array as ``.npy`` bytes (no pickle): the bytes ``np.save`` writes."""
    if array.ndim == 1 and array.dtype.kind in "biuf" and array.flags.c_contiguous:
        return npy_concat([array], array.dtype)
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_concat(pieces: list[np.ndarray], dtype: np.dtype) -> bytes:
    """The ``.npy`` bytes ``np.save`` writes for the 1-D concatenation of ``pieces``, each piece's data
    copied once (a token block's documents: joining them first and then prefixing the header copies twice).

    Args:
        pieces: 1-D ``dtype`` arrays (``biuf`` kinds; strided views are made contiguous first).
        dtype: their dtype.
    """
    head = io.BytesIO()  # a 1-D numeric header is always .npy version 1.0, the version np.save picks for it
    np.lib.format.write_array_header_1_0(head, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                "fortran_order": False, "shape": (sum(map(len, pieces)),)})
    try:
        return b"".join([head.getvalue(), *pieces])
    except (TypeError, BufferError):  # a strided view exposes no contiguous buffer
        return b"".join([head.getvalue(), *(np.ascontiguousarray(p) for p in pieces)])


# Members up to this size are compressed by a compressor kept per level and thread (one is not safe to
# share between threads): making one costs about 60 us, more than compressing a short document's member
# takes. Larger members get a new one, whose context is freed after: a level-9 context that compressed a
# 2 MB token block holds 13 MB.
KEEP_COMPRESSOR_BYTES = 1 << 20
_kept = threading.local()


def zstd_compress(data: bytes, level: int = ZSTD_LEVEL) -> bytes:
    """Compress one member's bytes as a single zstd frame (content size in the frame header, XXH64
    content checksum at its end: RFC 8878 section 3.1.1)."""
    if len(data) > KEEP_COMPRESSOR_BYTES:
        return _compressor(level).compress(data)
    kept = getattr(_kept, "by_level", None)
    if kept is None:
        kept = _kept.by_level = {}
    if level not in kept:
        kept[level] = _compressor(level)
    return kept[level].compress(data)


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """A new compressor of ``level`` writing frames as :func:`zstd_compress` describes."""
    # content size is written into the frame so readers can size their buffer once; the checksum
    # makes a corrupt frame an error when decompressed (without it, flipped bytes decode to other tokens)
    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)


def zstd_decompress(data: bytes) -> bytes:
    """Inverse of :func:`zstd_compress`; raises ``zstandard.ZstdError`` on corrupt input."""
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def encode_text_sample(tokens: np.ndarray, meta: dict, text: str | None = None) -> dict[str, bytes]:
    """Encode a tokenised document as member suffix → bytes.

    Args:
        tokens: 1-D ``uint16`` or ``uint32`` token ids.
        meta: JSON-serialisable metadata.
        text: optional source text, stored zstd-compressed as ``txt.zst``.
    Raises:
        ValueError: ``tokens`` is not a 1-D unsigned integer array.
    """
    if tokens.ndim != 1 or tokens.dtype not in (np.uint16, np.uint32):
        raise ValueError(f"tokens must be 1-D uint16/uint32, got shape {tokens.shape} dtype {tokens.dtype}")
    fields = {
        "tokens.npy.zst": zstd_compress(encode_npy(tokens)),
        "json": json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8"),
    }
    if text is not None:
        fields["txt.zst"] = zstd_compress(text.encode("utf-8"))
    return fields


def encode_image_sample(image_bytes: bytes, ext: str, cls: int | None = None, caption: str | None = None,
                        meta: dict | None = None) -> dict[str, bytes]:
    """Encode an already-compressed image with its label and/or caption as member suffix → bytes.

    Args:
        image_bytes: the JPEG or PNG file's bytes (stored unchanged, not re-compressed).
        ext: ``"jpg"`` (``"jpeg"`` is accepted and stored as ``jpg``) or ``"png"``.
        cls: integer class label, stored as ASCII decimal in ``cls``.
        caption: UTF-8 caption, stored in ``txt``.
        meta: JSON-serialisable metadata, stored in ``json``.
    Raises:
        ValueError: unknown ``ext``, bytes that do not start with that format's signature,
            or neither ``cls`` nor ``caption`` given.
    """
    ext = "jpg" if ext.lower() == "jpeg" else ext.lower()
    if ext not in _IMAGE_MAGIC:
        raise ValueError(f"image ext must be 'jpg' or 'png', got {ext!r}")
    if not image_bytes.startswith(_IMAGE_MAGIC[ext]):
        raise ValueError(f"image bytes do not start with the {ext.upper()} signature; pass the encoded file")
    if cls is None and caption is None:
        raise ValueError("an image sample needs a class label (cls) or a caption")
    fields = {ext: bytes(image_bytes)}
    if cls is not None:
        fields["cls"] = str(int(cls)).encode("ascii")
    if caption is not None:
        fields["txt"] = caption.encode("utf-8")
    if meta is not None:
        fields["json"] = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return fields


def field_name(suffix: str) -> str:
    """Decoded field name of a member suffix: up to its first dot (``tokens.npy.zst`` → ``tokens``)."""
    return suffix.split(".", 1)[0]


def missing_fields(suffixes, schema: str) -> list[str]:
    """Required fields of ``schema`` (``text``, ``image``, ``any``) not among ``suffixes``.

    Returns a list like ``["tokens"]`` or ``["jpg|png"]``; empty when the sample is complete.
    Raises:
        ValueError: unknown schema.
    """
    if schema not in SCHEMAS:
        raise ValueError(f"unknown sample schema {schema!r}; choose one of {', '.join(SCHEMAS)}")
    present = {field_name(s) for s in suffixes}
    return ["|".join(alts) for alts in SCHEMAS[schema] if not present.intersection(alts)]


def count_tokens(suffix: str, data: bytes) -> int:
    """Number of tokens in a ``tokens.npy[.zst]`` member, read from the ``.npy`` header only.

    Raises ``zstandard.ZstdError`` or ``ValueError`` on a corrupt member.
    """
    stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) if suffix.endswith(".zst") \
        else io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        raise ValueError(f"unsupported .npy format version {version}")
    shape, _, _ = read_header(stream)
    return int(np.prod(shape))


def decode_member(suffix: str, data: bytes):
    """Decode one member's bytes by its suffix (e.g. ``tokens.npy.zst``).

    Returns ``(field, value)`` where ``field`` is the suffix up to its first dot.
    Raises whatever the decoder raises (``zstandard.ZstdError``, ``ValueError``, ...);
    callers add the shard and member name.
    """
    field = field_name(suffix)
    plain = suffix.removesuffix(".zst")
    if plain.rsplit(".", 1)[-1] == "npy":  # a writable copy: decoded samples belong to their reader
        return field, np.array(TokenDecoder().tokens(suffix, data))
    if suffix.endswith(".zst"):
        data = zstd_decompress(data)
    ext = plain.rsplit(".", 1)[-1]
    if ext == "json":
        return field, json.loads(data.decode("utf-8"))
    if ext in ("txt", "text", "caption"):
        return field, data.decode("utf-8")
    if ext == "cls":
        return field, int(data.decode("ascii").strip())
    return field, data
