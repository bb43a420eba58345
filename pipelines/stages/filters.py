"""The document steps of a run, in order (:func:`build_steps`), and the DoFn that applies them
(:class:`FilterFn`)."""
from __future__ import annotations

from typing import Sequence

import apache_beam as beam

from pipelines.accounting.stats import EventTally
from pipelines.config import PipelineConfig
from pipelines.records import Doc
from pipelines.stages.classifier import ClassifierStep
from pipelines.stages.clean import CleanTextStep, LengthStep, RawLengthStep
from pipelines.stages.decontam import DecontamStep
from pipelines.stages.language import LanguageStep
from pipelines.stages.pii import RedactStep
from pipelines.stages.quality import quality_steps
from pipelines.stages.step import DocumentStep, run_steps_batch


def build_steps(cfg: PipelineConfig) -> list[DocumentStep]:
    """The document steps of ``cfg``, in the order they run: raw length (a huge document costs no
    cleaning), :func:`~pipelines.stages.clean.clean_text`, length, language, the quality steps
    (:func:`~pipelines.stages.quality.quality_steps`: Gopher quality, Gopher repetition, C4, FineWeb),
    the fastText classifier (after the cheap rules, on the lines C4 kept), decontamination (on the
    text as it will be trained on, before placeholders replace PII), PII redaction (a step whose
    section is disabled keeps every document). The one place the list is built."""
    return [RawLengthStep(cfg.clean), CleanTextStep(cfg.clean), LengthStep(cfg.clean),
            LanguageStep(cfg.language), *quality_steps(cfg.quality),
            ClassifierStep(cfg.classifier), DecontamStep(cfg.decontam), RedactStep(cfg.pii)]


LISTED = "listed"  # tag of the steps' listing lines (OUT/decontaminated/)


class FilterFn(beam.DoFn):
    """:class:`~pipelines.records.Doc` → the document every step kept (main output), or nothing.

    Events (tag ``events``, per source): ``filtered:<reason>`` for a rejected document (once,
    by the first step that rejects it), and the event counts of the steps (``redacted:<kind>``)
    for a kept one. The result's listing line, if any, goes to tag ``listed``. Each step's
    :meth:`~pipelines.stages.step.DocumentStep.setup` runs once per DoFn instance.
    """

    def __init__(self, steps: Sequence[DocumentStep]):
        self.steps = tuple(steps)

    def setup(self):
        """Set up every step (loads the language model when enabled)."""
        for step in self.steps:
            step.setup()

    def start_bundle(self):
        """A fresh event tally for the bundle."""
        self.tally = EventTally()

    def process(self, doc: Doc):
        """:meth:`filter_batch` of one document."""
        yield from self.filter_batch([doc])

    def filter_batch(self, docs: Sequence[Doc]):
        """Apply the steps to ``docs`` (:func:`~pipelines.stages.step.run_steps_batch`: a model
        scores them together); yields each document's listing line and the kept documents, in order."""
        for doc, result in zip(docs, run_steps_batch(docs, self.steps)):
            if result.listing is not None:
                yield beam.pvalue.TaggedOutput(LISTED, result.listing)
            if result.doc is None:
                self.tally.add(doc.source, f"filtered:{result.reason}")
                continue
            for name, n in result.events.items():
                self.tally.add(doc.source, name, n)
            yield result.doc

    def finish_bundle(self):
        """Emit the bundle's event counts on tag ``events``."""
        yield from self.tally.flush()
