"""Shard URLs beside a manifest, signed URLs included (``https://host/ds/manifest.json?token=abc``).

A signed URL's query (token, expiry, signature) authorises one fetch; it is not part of the
object's name. Shard names are resolved against the URL's *path* (RFC 3986 §5.2 reference
resolution, via :mod:`urllib.parse`) and the manifest's query is carried over to each shard.
"""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

MANIFEST_NAME = "manifest.json"


def split_query(url: str) -> tuple[str, str]:
    """``(url without ?query and #fragment, query)`` for a ``scheme://`` URL; a local path is returned
    unchanged with an empty query (``?`` is a legal file-name character)."""
    if "://" not in url:
        return url, ""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), parts.query


def url_name(url: str) -> str:
    """Last path segment of ``url`` with any query dropped, e.g. ``shard-000001.tar.zst``."""
    return split_query(url)[0].rstrip("/").rsplit("/", 1)[-1]


def shard_url(manifest_url: str, shard_name: str) -> str:
    """URL of a shard given the manifest's URL (or its folder) and the shard's name.

    ``http://h/ds/manifest.json?token=abc`` + ``shard-000000.tar`` gives
    ``http://h/ds/shard-000000.tar?token=abc``; local paths and unsigned URLs are joined with ``/``.
    """
    base, query = split_query(manifest_url)
    if base.endswith(MANIFEST_NAME):
        base = base[: -len(MANIFEST_NAME)]
    url = base.rstrip("/") + "/" + shard_name
    return f"{url}?{query}" if query else url
