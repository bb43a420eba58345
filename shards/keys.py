"""Sample keys: the part of a tar member name before the first dot.

WebDataset groups members into samples by the base name up to the first dot, so a
document id such as ``hamlet.act1`` or ``a/b`` cannot be used as a key verbatim.
Ids are escaped reversibly with percent-encoding (RFC 3986), with ``.`` and ``/``
escaped as well, so every reader (webdataset, wids, DALI) sees the same key.
"""
from __future__ import annotations

from urllib.parse import quote, unquote

MAX_KEY_CHARS = 90  # GNU/USTAR name field is 100 bytes; leave room for ".tokens.npy.zst"


def escape_key(doc_id: str) -> str:
    """Turn a document id into a tar-safe sample key (no dots, no slashes).

    Raises:
        ValueError: the id is empty or its escaped form exceeds ``MAX_KEY_CHARS``.
    """
    if not doc_id:
        raise ValueError("empty document id cannot be a sample key")
    key = quote(doc_id, safe="-_").replace(".", "%2E")
    if len(key) > MAX_KEY_CHARS:
        raise ValueError(f"sample key for id {doc_id[:40]!r}... is {len(key)} chars, over {MAX_KEY_CHARS}")
    return key


def unescape_key(key: str) -> str:
    """Inverse of :func:`escape_key`."""
    return unquote(key)
