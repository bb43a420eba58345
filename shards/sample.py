"""The sample schema: how one training sample maps to tar members and back.

A text sample with key ``K`` is stored as two adjacent members:

* ``K.tokens.npy.zst`` — a 1-D ``uint16``/``uint32`` numpy array (``.npy`` format),
  compressed with zstandard on its own;
* ``K.json`` — UTF-8 JSON metadata (``id``, ``source``, ``n_tokens``, ...).

Decoded, a sample is a dict ``{"__key__": str, "tokens": np.ndarray, "json": dict}``.
Field names are the member name after the key, with ``.zst`` and the type suffix removed.
"""
from __future__ import annotations

import io
import json

import numpy as np
import zstandard

ZSTD_LEVEL = 3


def encode_npy(array: np.ndarray) -> bytes:
    """Serialise an array as ``.npy`` bytes (no pickle)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def zstd_compress(data: bytes) -> bytes:
    # content size is written into the frame so readers can size their buffer once
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(data)


def zstd_decompress(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def encode_text_sample(tokens: np.ndarray, meta: dict) -> dict[str, bytes]:
    """Encode a tokenised document as member suffix → bytes.

    Args:
        tokens: 1-D ``uint16`` or ``uint32`` token ids.
        meta: JSON-serialisable metadata.
    Raises:
        ValueError: ``tokens`` is not a 1-D unsigned integer array.
    """
    if tokens.ndim != 1 or tokens.dtype not in (np.uint16, np.uint32):
        raise ValueError(f"tokens must be 1-D uint16/uint32, got shape {tokens.shape} dtype {tokens.dtype}")
    return {
        "tokens.npy.zst": zstd_compress(encode_npy(tokens)),
        "json": json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8"),
    }


def decode_member(suffix: str, data: bytes):
    """Decode one member's bytes by its suffix (e.g. ``tokens.npy.zst``).

    Returns ``(field, value)`` where ``field`` is the suffix up to its first dot.
    Raises whatever the decoder raises (``zstandard.ZstdError``, ``ValueError``, ...);
    callers add the shard and member name.
    """
    field = suffix.split(".", 1)[0]
    if suffix.endswith(".zst"):
        data = zstd_decompress(data)
        suffix = suffix[:-4]
    ext = suffix.rsplit(".", 1)[-1]
    if ext == "npy":
        return field, np.load(io.BytesIO(data), allow_pickle=False)
    if ext == "json":
        return field, json.loads(data.decode("utf-8"))
    if ext in ("txt", "text", "caption"):
        return field, data.decode("utf-8")
    if ext == "cls":
        return field, int(data.decode("ascii").strip())
    return field, data
