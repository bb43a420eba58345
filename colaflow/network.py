"""One timeout for every network read: fsspec's HTTP(S) and S3 filesystems, from ``cache.timeout_s``.

:func:`storage_options` gives the options a filesystem of one URL is opened with (the cache's
downloads pass them); :func:`set_network_timeout` makes them fsspec's defaults for every
filesystem of those protocols opened afterwards (``fsspec.config.conf``), so a manifest, a
tokenizer or an index read without the cache waits no longer than a download does. Every command
line sets it when it starts (:func:`colaflow.errors.guard`: ``COLAFLOW_CACHE_TIMEOUT_S`` or
:data:`DEFAULT_TIMEOUT_S`), and a command with a config sets its ``cache.timeout_s``.
"""
from __future__ import annotations

import os

DEFAULT_TIMEOUT_S = 60.0  # cache.timeout_s's default (cache.config.CacheConfig)
ENV_TIMEOUT = "COLAFLOW_CACHE_TIMEOUT_S"  # the cache's own environment override of it


def storage_options(url: str, timeout_s: float) -> dict:
    """fsspec storage options for ``url``: connect and per-read socket timeouts of ``timeout_s``
    seconds (HTTP(S): aiohttp's ``sock_connect``/``sock_read``, no cap on a whole long download;
    ``s3://``: botocore's ``connect_timeout``/``read_timeout``); ``{}`` for other schemes."""
    if url.startswith(("http://", "https://")):
        try:
            import aiohttp
        except ImportError:  # the preprocessing-only install: fsspec has no HTTP filesystem there either
            return {}
        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=timeout_s,
                                                                   sock_read=timeout_s)}}
    if url.startswith(("s3://", "s3a://")):
        return {"config_kwargs": {"connect_timeout": timeout_s, "read_timeout": timeout_s}}
    return {}


def set_network_timeout(timeout_s: float) -> None:
    """Make :func:`storage_options` of ``timeout_s`` fsspec's default for HTTP(S) and S3 (explicit
    options still win); replaces an earlier call's value."""
    import fsspec.config
    for protocol, url in (("http", "http://"), ("https", "https://"), ("s3", "s3://")):
        options = storage_options(url, timeout_s)
        if options:
            fsspec.config.conf.setdefault(protocol, {}).update(options)


def timeout_from_environment() -> float:
    """``COLAFLOW_CACHE_TIMEOUT_S`` when it is a positive number of seconds, else :data:`DEFAULT_TIMEOUT_S`
    (a bad value is reported by the cache's config, which reads the same variable)."""
    try:
        value = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S
