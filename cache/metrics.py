"""Cache metrics in a prometheus-client registry owned by one cache object.

A private ``CollectorRegistry`` per cache keeps tests and multiple caches in one process
from colliding; expose it with ``prometheus_client.start_http_server(port, registry=...)``
or ``CacheMetrics.text()``.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class CacheMetrics:
    """Counters of one ``ShardCache`` (this process only).

    Metrics (prefix ``colaflow_cache_``):
        hits_total: ``get`` calls served from a ready, verified entry without waiting.
        misses_total: ``get`` calls that had to download or wait for a download.
        bytes_fetched_total: bytes read from sources (compressed size for ``.zst``), retries included.
        bytes_served_total: bytes of the files ``get`` returned.
        evictions_total: entries this process evicted to make room.
        stall_seconds_total: seconds ``get`` callers spent blocked waiting for a shard.
        corrupt_total: cached files that failed verification and were refetched.
        retries_total: download attempts that failed and were retried or reported.
        inflight: downloads running now.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ns = "colaflow_cache"
        r = self.registry
        self.hits = Counter("hits", "get() served from a ready entry", namespace=ns, registry=r)
        self.misses = Counter("misses", "get() that downloaded or waited", namespace=ns, registry=r)
        self.bytes_fetched = Counter("bytes_fetched", "bytes read from sources", namespace=ns, registry=r)
        self.bytes_served = Counter("bytes_served", "bytes of files returned by get()", namespace=ns, registry=r)
        self.evictions = Counter("evictions", "entries evicted to make room", namespace=ns, registry=r)
        self.stall_seconds = Counter("stall_seconds", "seconds get() blocked on a shard", namespace=ns, registry=r)
        self.corrupt = Counter("corrupt", "cached files failing verification", namespace=ns, registry=r)
        self.retries = Counter("retries", "failed download attempts", namespace=ns, registry=r)
        self.inflight = Gauge("inflight", "downloads running now", namespace=ns, registry=r)

    def snapshot(self) -> dict:
        """Current values: ``hits``, ``misses``, ``evictions``, ``corrupt``, ``retries``, ``inflight``
        (counts), ``bytes_fetched``, ``bytes_served`` (bytes), ``stall_seconds`` (seconds)."""
        get = self.registry.get_sample_value
        out = {name: int(get(f"colaflow_cache_{name}_total") or 0)
               for name in ("hits", "misses", "bytes_fetched", "bytes_served", "evictions", "corrupt", "retries")}
        out["stall_seconds"] = float(get("colaflow_cache_stall_seconds_total") or 0.0)
        out["inflight"] = int(get("colaflow_cache_inflight") or 0)
        return out

    def text(self) -> str:
        """Prometheus text exposition of this cache's registry."""
        return generate_latest(self.registry).decode("utf-8")
