"""Record accounting: events emitted by every stage, Beam metrics, and ``stats.json``.

Each stage emits events ``((source, name), n)`` on a tagged output and bumps a Beam
counter of the same name. Names: ``input``, ``kept``, ``duplicate``, ``filtered:<reason>``,
``dead:<reason>``, ``redacted:<kind>``, ``lines_removed:<rule>`` (lines a quality rule removed from
a kept document, ``pipelines.stages.quality.c4``), ``quality_score:<bin>`` (kept documents whose
classifier score lies in the bin of width 0.1 starting at ``bin``), ``decontaminated:<set>`` (kept
documents whose spans matching an evaluation set were cut), ``tokens``, ``text_bytes``, ``length:<bin>`` (kept
documents whose token count lies in the power-of-two bin starting at ``bin``), ``skipped_file``
(an input file of unknown format that was not read; not a record), ``empty_file`` (a 0-byte
input file; not a record), ``skipped_link`` (an input link whose target does not exist; not a
record), ``skipped_record:<type>`` (a WARC record that is no document, such as ``request``; not a
record), ``near_unresolved`` (label pairs the near-dedup clustering rounds left unjoined and one step
settled, source :data:`RUN_SOURCE`: a run-level count, in ``stats.json``'s ``run`` section). The counts are summed
with ``CombinePerKey`` and folded into ``stats.json``, whose invariant per source and in
total is::

    input_records == kept + sum(filtered.values()) + duplicates + dead_letter
"""
from __future__ import annotations

from collections import defaultdict

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

EVENTS = "events"  # tag of the events output of every stage
NAMESPACE = "colaflow"
RUN_SOURCE = ""  # the source of run-level events: counted in the "run" section, in no source and not in the total
_RUN = {"near_unresolved": "near_unresolved_pairs"}  # run-level event → its key in the "run" section


_COUNTERS: dict = {}


def event(source: str, name: str, n: int = 1) -> beam.pvalue.TaggedOutput:
    """An event for the ``events`` output; also increments the Beam counter ``colaflow/<name>``."""
    counter = _COUNTERS.get(name)
    if counter is None:  # Metrics.counter() is costly per call; the returned handle is reusable
        counter = _COUNTERS[name] = Metrics.counter(NAMESPACE, name.replace(":", "_"))
    counter.inc(n)
    return beam.pvalue.TaggedOutput(EVENTS, ((source, name), n))


class EventTally:
    """Events counted per bundle and emitted once per ``(source, name)`` from ``finish_bundle``:
    one element per bundle instead of one per record (the per-record cost of the stages that see
    every record). Use: ``add`` in ``process``, ``yield from tally.flush()`` in ``finish_bundle``."""

    def __init__(self):
        self.counts: dict[tuple[str, str], int] = defaultdict(int)

    def add(self, source: str, name: str, n: int = 1) -> None:
        """Count ``n`` events ``name`` (e.g. ``filtered:too_short``) for ``source``."""
        self.counts[source, name] += n

    def flush(self):
        """Windowed ``events`` outputs of the tallied counts (global window); resets the tally."""
        for (source, name), n in sorted(self.counts.items()):
            tagged = event(source, name, n)
            yield beam.pvalue.TaggedOutput(EVENTS, GlobalWindows.windowed_value(tagged.value))
        self.counts.clear()


def _empty() -> dict:
    return {"input_records": 0, "kept": 0, "filtered": {}, "duplicates": 0, "dead_letter": 0,
            "dead_letter_reasons": {}, "redactions": {}, "lines_removed": {}, "quality_scores": {},
            "decontaminated": {}, "tokens": 0, "text_bytes": 0,
            "length_tokens": {}, "skipped_files": 0, "empty_files": 0, "skipped_links": 0, "skipped_records": {}}


def _add(entry: dict, name: str, n: int) -> None:
    simple = {"input": "input_records", "kept": "kept", "duplicate": "duplicates",
              "tokens": "tokens", "text_bytes": "text_bytes", "skipped_file": "skipped_files",
              "empty_file": "empty_files", "skipped_link": "skipped_links"}
    if name in simple:
        entry[simple[name]] += n
        return
    kind, _, reason = name.partition(":")
    section = {"filtered": "filtered", "dead": "dead_letter_reasons", "redacted": "redactions",
               "lines_removed": "lines_removed", "quality_score": "quality_scores", "decontaminated": "decontaminated",
               "length": "length_tokens", "skipped_record": "skipped_records"}.get(kind)
    if section is None:
        raise ValueError(f"unknown event name {name!r}")
    entry[section][reason] = entry[section].get(reason, 0) + n
    if kind == "dead":
        entry["dead_letter"] += n


def aggregate(events: list[tuple[tuple[str, str], int]]) -> dict:
    """Fold summed events into ``{"total": {...}, "sources": {source: {...}}, "run": {...}}`` (keys sorted).

    Each entry: input_records, kept, filtered {reason: n}, duplicates, dead_letter,
    dead_letter_reasons {reason: n}, redactions {kind: n}, lines_removed {rule: lines}, quality_scores
    {bin lower edge: kept documents} (the classifier's score histogram), decontaminated {set: kept
    documents cut}, tokens,
    text_bytes (UTF-8 bytes of kept documents), length_tokens {bin lower edge: kept documents},
    skipped_files (input files of unknown format not read), empty_files (0-byte input files),
    skipped_links (input links without a target), skipped_records {WARC record type: n} (WARC
    records that are no documents: ``request``, ``warcinfo``, ``metadata``, ...; not input records)
    and balanced (bool: the invariant above holds). ``run``: counts of the run as a whole,
    near_unresolved_pairs (label pairs the near-dedup clustering rounds did not join, settled after
    them; non-zero means ``dedup.near_rounds`` is too low for the corpus's clusters).
    """
    sources: dict[str, dict] = defaultdict(_empty)
    total, run = _empty(), dict.fromkeys(_RUN.values(), 0)
    for (source, name), n in sorted(events):
        if source == RUN_SOURCE:
            if name not in _RUN:
                raise ValueError(f"unknown run-level event name {name!r}")
            run[_RUN[name]] += n
            continue
        _add(sources[source], name, n)
        _add(total, name, n)
    out = {"total": total, "sources": {s: sources[s] for s in sorted(sources)}, "run": run}
    for entry in [total, *out["sources"].values()]:
        for section in ("filtered", "dead_letter_reasons", "redactions", "lines_removed", "quality_scores",
                        "decontaminated", "skipped_records"):
            entry[section] = dict(sorted(entry[section].items()))
        entry["length_tokens"] = dict(sorted(entry["length_tokens"].items(), key=lambda kv: int(kv[0])))
        entry["balanced"] = is_balanced(entry)
    return out


def is_balanced(entry: dict) -> bool:
    """Whether ``input_records == kept + sum(filtered) + duplicates + dead_letter``."""
    return entry["input_records"] == (entry["kept"] + sum(entry["filtered"].values())
                                      + entry["duplicates"] + entry["dead_letter"])
