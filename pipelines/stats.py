"""Record accounting: events emitted by every stage, Beam metrics, and ``stats.json``.

Each stage emits events ``((source, name), n)`` on a tagged output and bumps a Beam
counter of the same name. Names: ``input``, ``kept``, ``duplicate``, ``filtered:<reason>``,
``dead:<reason>``, ``redacted:<kind>``, ``tokens``, ``text_bytes``. The counts are summed
with ``CombinePerKey`` and folded into ``stats.json``, whose invariant per source and in
total is::

    input_records == kept + sum(filtered.values()) + duplicates + dead_letter
"""
from __future__ import annotations

from collections import defaultdict

import apache_beam as beam
from apache_beam.metrics import Metrics

EVENTS = "events"  # tag of the events output of every stage
NAMESPACE = "colaflow"


_COUNTERS: dict = {}


def event(source: str, name: str, n: int = 1) -> beam.pvalue.TaggedOutput:
    """An event for the ``events`` output; also increments the Beam counter ``colaflow/<name>``."""
    counter = _COUNTERS.get(name)
    if counter is None:  # Metrics.counter() is costly per call; the returned handle is reusable
        counter = _COUNTERS[name] = Metrics.counter(NAMESPACE, name.replace(":", "_"))
    counter.inc(n)
    return beam.pvalue.TaggedOutput(EVENTS, ((source, name), n))


def _empty() -> dict:
    return {"input_records": 0, "kept": 0, "filtered": {}, "duplicates": 0, "dead_letter": 0,
            "dead_letter_reasons": {}, "redactions": {}, "tokens": 0, "text_bytes": 0}


def _add(entry: dict, name: str, n: int) -> None:
    simple = {"input": "input_records", "kept": "kept", "duplicate": "duplicates",
              "tokens": "tokens", "text_bytes": "text_bytes"}
    if name in simple:
        entry[simple[name]] += n
        return
    kind, _, reason = name.partition(":")
    section = {"filtered": "filtered", "dead": "dead_letter_reasons", "redacted": "redactions"}.get(kind)
    if section is None:
        raise ValueError(f"unknown event name {name!r}")
    entry[section][reason] = entry[section].get(reason, 0) + n
    if kind == "dead":
        entry["dead_letter"] += n


def aggregate(events: list[tuple[tuple[str, str], int]]) -> dict:
    """Fold summed events into ``{"total": {...}, "sources": {source: {...}}}`` (keys sorted).

    Each entry: input_records, kept, filtered {reason: n}, duplicates, dead_letter,
    dead_letter_reasons {reason: n}, redactions {kind: n}, tokens, text_bytes (UTF-8 bytes of
    kept documents) and balanced (bool: the invariant above holds).
    """
    sources: dict[str, dict] = defaultdict(_empty)
    total = _empty()
    for (source, name), n in sorted(events):
        _add(sources[source], name, n)
        _add(total, name, n)
    out = {"total": total, "sources": {s: sources[s] for s in sorted(sources)}}
    for entry in [total, *out["sources"].values()]:
        for section in ("filtered", "dead_letter_reasons", "redactions"):
            entry[section] = dict(sorted(entry[section].items()))
        entry["balanced"] = is_balanced(entry)
    return out


def is_balanced(entry: dict) -> bool:
    """Whether ``input_records == kept + sum(filtered) + duplicates + dead_letter``."""
    return entry["input_records"] == (entry["kept"] + sum(entry["filtered"].values())
                                      + entry["duplicates"] + entry["dead_letter"])


def summary(stats: dict) -> str:
    """A short human summary of ``stats.json`` plus shard facts."""
    t = stats["total"]
    filtered = ", ".join(f"{k} {v}" for k, v in t["filtered"].items()) or "none"
    dead = ", ".join(f"{k} {v}" for k, v in t["dead_letter_reasons"].items()) or "none"
    bpt = t["text_bytes"] / t["tokens"] if t["tokens"] else 0.0
    lines = [
        f"records in {t['input_records']:,}  kept {t['kept']:,}  duplicates {t['duplicates']:,}  "
        f"dead-letter {t['dead_letter']:,} ({dead})",
        f"filtered: {filtered}",
        f"shards {stats.get('shards', 0)}  tokens {t['tokens']:,}  text bytes/token {bpt:.2f}  "
        f"vocab {stats.get('vocab_size', 0)} ({stats.get('token_dtype', '?')})",
    ]
    if t["redactions"]:
        lines.append("redacted: " + ", ".join(f"{k} {v}" for k, v in t["redactions"].items()))
    if not t["balanced"]:
        lines.append("WARNING: counts do not balance (input != kept + filtered + duplicates + dead-letter)")
    return "\n".join(lines)
