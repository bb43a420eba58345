"""What became of the records read before the tokenizer (:class:`ReadSummary`, :func:`summarize`):
the side input that lets an empty tokenizer sample, or a run that kept nothing, say why."""
from __future__ import annotations

import dataclasses

import apache_beam as beam

from colaflow.wording import count
from pipelines.records import BLANK_LINE, UNREADABLE_FILE, DeadLetter

EXAMPLES = 3  # unreadable files a summary names


@dataclasses.dataclass
class ReadSummary:
    """Counts of the records read before the tokenizer.

    Attributes:
        records: units read from the input files, blank JSONL lines not counted (they are
            dead-lettered as ``blank_line`` but hold no record).
        dead: dead letters per reason (blank lines included).
        filtered: documents dropped by cleaning, per reason.
        unreadable: ``(file, error)`` of up to ``EXAMPLES`` files that could not be read,
            smallest paths first (the same whatever the order of arrival).
    """

    records: int = 0
    dead: dict[str, int] = dataclasses.field(default_factory=dict)
    filtered: dict[str, int] = dataclasses.field(default_factory=dict)
    unreadable: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_total(cls, total: dict) -> "ReadSummary":
        """The summary of a ``stats.json`` entry (:func:`pipelines.accounting.stats.aggregate`): its records
        read (blank lines not counted), dead letters and filtered documents per reason; no
        unreadable file is named (``stats.json`` counts them only)."""
        dead = dict(total["dead_letter_reasons"])
        return cls(records=total["input_records"] - dead.get(BLANK_LINE, 0), dead=dead, filtered=dict(total["filtered"]))

    def why_empty(self) -> str:
        """One clause saying what became of the records, e.g. ``"of 5 records read: 5 dead-lettered
        (bad_json: 5)"``, followed by the unreadable files and their errors when there are any."""
        parts = []
        for label, reasons in (("dead-lettered", self.dead), ("filtered", self.filtered)):
            listed = {r: n for r, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])) if r != BLANK_LINE}
            if listed:
                each = ", ".join(f"{r}: {n:,}" for r, n in listed.items())
                parts.append(f"{sum(listed.values()):,} {label} ({each})")
        said = f"of {count(self.records, 'record')} read: {', '.join(parts) or 'none reached it'}"
        for path, error in self.unreadable:
            said += f"; cannot read {path} ({error.rstrip('.')})"
        return said

    def what_to_check(self) -> str:
        """Where to look, from what became of the records: the input settings when records were
        dead-lettered, the filtering steps' settings when they were filtered."""
        dead = any(r != BLANK_LINE for r in self.dead)
        steps = ("the settings of the steps that filtered them (the reasons name them: clean.*, language.*, "
                 "quality.*, classifier.*, decontam.*)")
        if self.filtered and not dead:
            return f"check {steps}"
        if self.filtered:
            return f"check --input, input.format and input.text_field, and {steps}"
        return "check --input, input.format and input.text_field"


class MergeSummaries(beam.CombineFn):
    """Combine :class:`ReadSummary` parts into one (sums of counts, the smallest unreadable paths)."""

    def create_accumulator(self) -> ReadSummary:
        """An empty summary: nothing read."""
        return ReadSummary()

    def add_input(self, acc: ReadSummary, part: ReadSummary) -> ReadSummary:
        """``acc`` plus ``part`` (a new summary; neither is changed)."""
        return self.merge_accumulators([acc, part])

    def merge_accumulators(self, accumulators) -> ReadSummary:
        """The sum of summaries: counts added, the first ``EXAMPLES`` unreadable files in path order."""
        out = ReadSummary()
        for acc in accumulators:
            out.records += acc.records
            for mine, theirs in ((out.dead, acc.dead), (out.filtered, acc.filtered)):
                for reason, n in theirs.items():
                    mine[reason] = mine.get(reason, 0) + n
            out.unreadable = tuple(sorted(set(out.unreadable + acc.unreadable)))[:EXAMPLES]
        return out

    def extract_output(self, acc: ReadSummary) -> ReadSummary:
        """The summary itself."""
        return acc


def _from_event(item) -> ReadSummary:
    (_, name), n = item
    kind, _, reason = name.partition(":")
    if name == "input":
        return ReadSummary(records=n)
    if kind == "dead":
        return ReadSummary(records=-n if reason == BLANK_LINE else 0, dead={reason: n})
    if kind == "filtered":
        return ReadSummary(filtered={reason: n})
    return ReadSummary()


def _from_dead(dead: DeadLetter):
    if dead.reason == UNREADABLE_FILE:
        yield ReadSummary(unreadable=((dead.file, dead.error),))


def summarize(events: list, dead, label: str = "ReadSummary"):
    """Singleton PCollection of :class:`ReadSummary` from the ``events`` PCollections of parsing and
    cleaning (``((source, name), n)``, a few per bundle) and the ``dead`` letters (PCollection of
    :class:`~pipelines.records.DeadLetter`; only ``unreadable_file`` ones are kept)."""
    parts = [e | f"{label}/Events{i}" >> beam.Map(_from_event) for i, e in enumerate(events)]
    parts.append(dead | f"{label}/Unreadable" >> beam.FlatMap(_from_dead))
    return parts | f"{label}/All" >> beam.Flatten() | f"{label}/Merge" >> beam.CombineGlobally(MergeSummaries())
