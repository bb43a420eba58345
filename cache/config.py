"""Cache configuration (the ``cache:`` section of a YAML config).

Precedence, lowest first: dataclass defaults, the YAML file, per-node ``nodes:`` overrides
whose host-name pattern (``fnmatch``) matches ``socket.gethostname()``, environment
variables ``COLAFLOW_CACHE_<FIELD>`` (e.g. ``COLAFLOW_CACHE_DIR``), command-line
``key=value`` overrides.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import socket
from dataclasses import dataclass, field
from fractions import Fraction

from colaflow.config import ConfigError, apply_overrides, check_fields, from_dict, setting
from colaflow.network import DEFAULT_TIMEOUT_S

VERIFY_POLICIES = ("always", "first", "never")
ENV_PREFIX = "COLAFLOW_CACHE_"

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | float | str) -> int:
    """Parse a byte size: an int, or a human size such as ``"200GiB"``, ``"1.5 TB"``, ``"512MiB"``.

    SI units (kB, MB, GB, TB, PB: powers of 1000) and IEC units (KiB ... PiB: powers of 1024) are
    accepted, case-insensitively; a bare number is bytes.

    Returns:
        the size in bytes (int, rounded down).

    Raises:
        ValueError: negative, non-numeric or unknown unit (the message names the value).
    """
    if isinstance(value, bool):
        raise ValueError(f"size {value!r} is not a number of bytes")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"size {value!r} is negative")
        return int(value)
    m = _SIZE_RE.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"size {value!r} is not a byte size (examples: 1048576, '512MiB', '200GiB', '1.5TB')")
    return int(Fraction(m.group(1)) * _UNITS[unit])  # exact: no float rounding for large sizes


def format_size(n: int) -> str:
    """Human IEC size for messages, e.g. ``format_size(3 * 2**30) == '3.0GiB'``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)}B" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    raise AssertionError("unreachable")


@dataclass
class CacheConfig:
    """Per-node shard cache settings.

    Attributes:
        dir: local cache directory (NVMe on a cluster node); ``~`` is expanded.
        max_bytes: byte limit for cached shards, reservations and partial downloads included;
            int or a human size such as ``"200GiB"``; must be > 0.
        prefetch_shards: downloads kept in flight ahead of the reader (also the prefetch window).
        verify: sha256 policy for cached files: ``always`` (hash on every ``get``), ``first``
            (hash once after download, trust the on-disk marker afterwards) or ``never``
            (size check only).
        min_free_bytes: free space kept on the cache's file system; evict or fail before going below.
        retries: extra download attempts after the first fails (HTTP 5xx, dropped connection,
            truncated body, sha256 mismatch).
        backoff_s: first retry delay in seconds; doubles per attempt (exponential backoff).
        backoff_max_s: cap on one retry delay, seconds.
        timeout_s: connect and per-read socket timeout, seconds, of every network read of a
            command (downloads, and manifests or indexes read without the cache: :mod:`colaflow.network`).
        decompress: store ``*.tar.zst`` sources decompressed (as ``*.tar``); the manifest's sha256
            and size then describe the decompressed file.
        chunk_bytes: read/write block size while streaming a download, bytes (int or human size).
        partial_ttl_s: partial downloads nobody holds older than this are deleted when a cache
            opens; younger ones are resumed with HTTP Range requests.
        fetch_wait_s: how long a process waits for a shard another process is downloading while
            that download makes no progress (its partial file does not grow), seconds; then it fails
            naming the holder's pid (a stuck process would otherwise keep every other one waiting).
            Also the limit on a wait for the cache's accounting lock.
        nodes: per-node overrides, ``{host-name fnmatch pattern: {field: value}}``; every matching
            pattern applies, in file order. Every pattern's fields are checked on every node, so that a
            typo fails where it is written rather than only on the nodes it matches.
    """

    dir: str = "~/.cache/colaflow/shards"
    max_bytes: int | str = "10GiB"
    prefetch_shards: int = setting(2, ge=0)
    verify: str = setting("first", choices=VERIFY_POLICIES)
    min_free_bytes: int | str = "256MiB"
    retries: int = setting(4, ge=0)
    backoff_s: float = setting(0.5, ge=0)
    backoff_max_s: float = setting(30.0, ge=0)
    timeout_s: float = setting(DEFAULT_TIMEOUT_S, gt=0)
    decompress: bool = True
    chunk_bytes: int | str = "4MiB"
    partial_ttl_s: float = setting(86400.0, ge=0)
    fetch_wait_s: float = setting(600.0, gt=0)
    nodes: dict | None = field(default_factory=dict)  # None: an empty `nodes:`; checked by _check_nodes

    def __post_init__(self) -> None:
        check_fields(self, "cache.")
        for name in ("max_bytes", "min_free_bytes", "chunk_bytes"):
            try:
                parse_size(getattr(self, name))
            except ValueError as e:
                raise ConfigError(f"cache.{name}: {e}") from e
        for name in ("max_bytes", "chunk_bytes"):
            if parse_size(getattr(self, name)) <= 0:
                raise ConfigError(f"cache.{name}={getattr(self, name)!r}: use a size > 0 (examples: '512MiB', "
                                  "'200GiB')")
        self.nodes = _check_nodes(self.nodes)

    @property
    def max_bytes_int(self) -> int:
        """``max_bytes`` in bytes."""
        return parse_size(self.max_bytes)

    @property
    def min_free_bytes_int(self) -> int:
        """``min_free_bytes`` in bytes."""
        return parse_size(self.min_free_bytes)

    @property
    def chunk_bytes_int(self) -> int:
        """``chunk_bytes`` in bytes."""
        return parse_size(self.chunk_bytes)

    @property
    def path(self) -> str:
        """``dir`` with ``~`` and environment variables expanded, absolute."""
        return os.path.abspath(os.path.expanduser(os.path.expandvars(self.dir)))

    def resolved(self, hostname: str | None = None, environ: dict | None = None) -> "CacheConfig":
        """This config with node overrides and ``COLAFLOW_CACHE_*`` environment overrides applied.

        Args:
            hostname: node name matched against ``nodes`` patterns; default ``socket.gethostname()``.
            environ: environment mapping; default ``os.environ``.

        Raises:
            ConfigError: an override names an unknown field or holds a bad value.
        """
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return from_dict(CacheConfig, _overlay(data, hostname, environ), "cache.")


def _check_nodes(nodes) -> dict:
    """``nodes`` checked: a mapping of host patterns to mappings of cache fields, every pattern's
    fields valid whether or not it matches this node; ``None`` (an empty ``nodes:``) is ``{}``.

    Raises:
        ConfigError: one line naming the key, e.g. ``cache.nodes["gpu-*"].max_sise``, and what to use.
    """
    if nodes is None:
        return {}
    if not isinstance(nodes, dict):
        raise ConfigError(f"cache.nodes={nodes!r}: cache.nodes must be a mapping {{host pattern: {{key: value}}}}, "
                          "e.g. nodes: {'gpu-*': {max_bytes: 3TiB}}")
    for pattern, values in nodes.items():
        where = f'cache.nodes["{pattern}"]'
        if not isinstance(values, dict):
            raise ConfigError(f"{where}={values!r}: each pattern must hold a mapping {{key: value}} of cache "
                              "fields, e.g. nodes: {'gpu-*': {max_bytes: 3TiB}}")
        if "nodes" in values:
            raise ConfigError(f"{where} cannot itself hold 'nodes'; list every pattern directly under cache.nodes")
        try:
            from_dict(CacheConfig, values, f"{where}.")
        except ConfigError as e:  # a field's own check names it cache.<field>: name the pattern too
            msg = str(e)
            raise ConfigError(msg if where in msg else msg.replace("cache.", f"{where}.", 1)) from None
    return nodes


def _overlay(data: dict, hostname: str | None, environ: dict | None) -> dict:
    """Apply node-pattern then environment overrides to a plain ``cache`` dict (in place)."""
    host = hostname if hostname is not None else socket.gethostname()
    for pattern, values in _check_nodes(data.get("nodes")).items():
        if fnmatch.fnmatch(host, str(pattern)):
            data.update(values)
    env = os.environ if environ is None else environ
    names = {f.name for f in dataclasses.fields(CacheConfig)} - {"nodes"}
    for var, raw in sorted(env.items()):
        if not var.startswith(ENV_PREFIX):
            continue
        key = var[len(ENV_PREFIX):].lower()
        if key not in names:
            raise ConfigError(f"environment variable {var} names no cache field; valid: "
                              f"{', '.join(ENV_PREFIX + n.upper() for n in sorted(names))}")
        if key == "dir":
            data[key] = raw  # a path stays a string ("~" would be YAML null)
        else:
            apply_overrides(data, [f"{key}={raw}"])
            try:  # checked here, so that an error names the variable rather than cache.<field>
                from_dict(CacheConfig, {key: data[key]}, "cache.")
            except ConfigError as e:
                raise ConfigError(f"environment variable {var}={raw!r}: {e}") from e
    return data


def load_cache_config(path: str | None = None, overrides: list[str] | None = None,
                      hostname: str | None = None, environ: dict | None = None) -> CacheConfig:
    """Load a ``CacheConfig`` from YAML (a whole colaflow config with a ``cache:`` section, or
    the section alone), then node, environment and ``key=value`` overrides, in that order.

    Uses ``colaflow.config`` for parsing (``load_config`` semantics). Overrides may be written
    with or without the ``cache.`` prefix.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: unknown keys, malformed overrides or bad values.
    """
    import yaml

    data: dict = {}
    if path:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if isinstance(data.get("cache"), dict):
            data = data["cache"]
    data = _overlay(dict(data), hostname, environ)
    ovr = [o[len("cache."):] if o.startswith("cache.") else o for o in overrides or []]
    return from_dict(CacheConfig, apply_overrides(data, ovr), "cache.")
