"""Beam transforms of the input: files → splits (:class:`ReadRecords`), each read into raw units
(:class:`pipelines.io.resume.SplitWorkFn`) → documents or dead letters (:class:`ParseFn`)."""
from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam

from pipelines.accounting.stats import EVENTS, EventTally, event
from pipelines.config import InputConfig
from pipelines.io.listing import InputFile, InputListing
from pipelines.io.pages import WarcPages
from pipelines.io.reading import plan_splits
from pipelines.records import (WARC, WARC_OTHER, DeadLetter, Filtered, RawUnit, file_format, file_stem, parse_unit,
                               relative_name)

DEAD = "dead"  # ParseFn's tag of dead letters


class ReadOutput(NamedTuple):
    """The outputs of :class:`ReadRecords`, each a ``PCollection``.

    Attributes:
        splits: the :class:`~pipelines.io.reading.Split` s of every file to read, spread over workers.
        events: ``((file stem, name), 1)`` per path not read: ``skipped_file`` (unknown format under
            ``input.unknown_files: skip``), ``empty_file`` (0 bytes) or ``skipped_link`` (a link
            whose target does not exist).
    """

    splits: beam.PCollection
    events: beam.PCollection


class ReadRecords(beam.PTransform):
    """``PBegin`` → :class:`ReadOutput`: the splits of every file of ``inputs`` (listed once, on
    the driver, by :func:`pipelines.io.listing.list_inputs`).

    Files are planned into splits (:func:`pipelines.io.reading.plan_splits`) and the splits are
    redistributed (``Reshuffle``), so each is read by one worker (:class:`pipelines.io.resume.SplitWorkFn`)
    and a large file is read by many workers and never held whole.
    """

    def __init__(self, inputs: InputListing, cfg: InputConfig):
        super().__init__()
        self.inputs, self.cfg = inputs, cfg

    def expand(self, pbegin):
        """Plan the listed files' splits and spread them; count the broken links: a :class:`ReadOutput` (not
        annotated: Beam warns about a return type that is not a PCollection)."""
        paths = [*self.inputs.files, *self.inputs.broken_links]
        planned = (pbegin
                   | "Files" >> beam.Create(paths, reshuffle=False)
                   | "Plan" >> beam.FlatMap(_plan, self.cfg).with_outputs(EVENTS, main="splits"))
        return ReadOutput(splits=planned.splits | "Spread" >> beam.Reshuffle(), events=planned[EVENTS])


def _plan(match: InputFile | str, cfg: InputConfig):
    if isinstance(match, str):  # a broken link (InputListing.broken_links)
        yield event(file_stem(match), "skipped_link")
    elif file_format(match.path, cfg) is None:
        yield event(file_stem(match.path), "skipped_file")
    elif match.size_in_bytes == 0:  # nothing to read, but the user gave it: counted, not dropped unseen
        yield event(file_stem(match.path), "empty_file")
    else:
        yield from plan_splits(match.path, match.size_in_bytes, cfg)


class ParseFn(beam.DoFn):
    """:class:`~pipelines.records.RawUnit` → :class:`~pipelines.records.Doc` (main output) or
    :class:`~pipelines.records.DeadLetter` (tag ``dead``); ``input``, ``dead:<reason>`` and
    ``filtered:<reason>`` events (tag ``events``), one ``input`` per unit.

    WARC response records are parsed by :class:`pipelines.io.pages.WarcPages` (a record that is no
    page is ``filtered:<reason>``); other WARC records (``warc_other``: ``request``, ``warcinfo``, ...)
    are no input records and count ``skipped_record:<type>`` only. Ids are qualified by each file's
    path relative to ``root`` (:attr:`InputListing.root <pipelines.io.listing.InputListing.root>`,
    :func:`pipelines.records.qualify_id`).
    """

    def __init__(self, cfg: InputConfig, root: str = ""):
        self.cfg, self.root = cfg, root
        self.pages = WarcPages(cfg)

    def start_bundle(self):
        """A fresh event tally for the bundle."""
        self.tally = EventTally()

    def process(self, unit: RawUnit):
        """Parse one unit (:func:`pipelines.records.parse_unit`, or :meth:`WarcPages.parse
        <pipelines.io.pages.WarcPages.parse>`): yields the document, or the dead letter naming the
        file and position on tag ``dead``."""
        if unit.fmt == WARC_OTHER:
            self.tally.add(file_stem(unit.path), f"skipped_record:{unit.raw.decode()}")
            return
        name = relative_name(unit.path, self.root)
        if unit.fmt == WARC:
            parsed = self.pages.parse(unit, name)
        else:
            parsed = parse_unit(unit.path, unit.line, unit.raw, unit.fmt, self.cfg, unit.offset, unit.size, name)
        self.tally.add(parsed.source, "input")
        if isinstance(parsed, DeadLetter):
            self.tally.add(parsed.source, f"dead:{parsed.reason}")
            yield beam.pvalue.TaggedOutput(DEAD, parsed)
        elif isinstance(parsed, Filtered):
            self.tally.add(parsed.source, f"filtered:{parsed.reason}")
        else:
            yield parsed

    def finish_bundle(self):
        """Emit the bundle's event counts on tag ``events``."""
        yield from self.tally.flush()
