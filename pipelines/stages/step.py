"""The document step: one cleaning, filtering or redaction rule, applied to one document at a time
(or to a batch of documents, where a model scores many at once).

A step is a small class with ``apply(doc) -> StepResult`` (after datatrove's pipeline steps and
filters, ``datatrove/pipeline/base.py`` and ``pipeline/filters/base_filter.py``: a filter says
keep, or why not). The steps run in the order :func:`pipelines.stages.filters.build_steps` lists.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping, NamedTuple, Protocol, Sequence

from pipelines.records import Doc

NO_EVENTS: Mapping[str, int] = MappingProxyType({})


class StepResult(NamedTuple):
    """What a :class:`DocumentStep` made of one document: the document to pass on, or why it is dropped.

    Attributes:
        doc: the document to pass on (the input, or a changed copy); ``None`` when rejected.
        reason: why the document is rejected, counted as ``filtered:<reason>``; ``None`` when kept.
        events: counts of further events of a kept document, ``{name: n}`` in the order they are
            counted (e.g. ``{"redacted:email": 2}``); counted only for a document every step keeps.
        listing: a JSON line naming what the step did to the document, written to
            ``OUT/decontaminated/`` (only the decontamination step lists), or ``None``.
    """

    doc: Doc | None
    reason: str | None = None
    events: Mapping[str, int] = NO_EVENTS
    listing: str | None = None

    @classmethod
    def keep(cls, doc: Doc, events: Mapping[str, int] = NO_EVENTS, listing: str | None = None) -> "StepResult":
        """``doc`` passed on, with ``events`` (``{name: n}``) to count and a ``listing`` line."""
        return cls(doc, None, events, listing)

    @classmethod
    def reject(cls, reason: str, listing: str | None = None) -> "StepResult":
        """The document dropped as ``filtered:<reason>``, with a ``listing`` line."""
        return cls(None, reason, NO_EVENTS, listing)


class DocumentStep(Protocol):
    """One rule of the document steps. Subclass it to inherit the no-op :meth:`setup`."""

    def setup(self) -> None:
        """Load what the step needs (a model), once per worker before the first document; the
        step is pickled to the workers before this runs. Default: nothing."""

    def apply(self, doc: Doc) -> StepResult:
        """The document kept (possibly changed, with event counts) or rejected with a reason."""
        ...

    def apply_batch(self, docs: Sequence[Doc]) -> list[StepResult]:
        """:meth:`apply` to each of ``docs``; a step that scores documents with a model overrides
        it to score them together.

        Args:
            docs: the documents every earlier step kept.
        Returns:
            one result per document, in order.
        """
        return [self.apply(doc) for doc in docs]


def run_steps_batch(docs: Sequence[Doc], steps: Iterable[DocumentStep]) -> list[StepResult]:
    """Apply ``steps`` in order to each of ``docs``, each step to the documents still kept at once
    (:meth:`DocumentStep.apply_batch`). Per document: the first rejection is the result (later steps
    do not run, and events and listings of earlier steps are not counted); else the last step's
    document with the events of every step, summed per name in the order first counted, and the
    last listing.

    Args:
        docs: the documents.
        steps: the steps, in the order they run.
    Returns:
        one result per document, in order.
    """
    current = list(docs)
    results: list[StepResult | None] = [None] * len(current)
    events: list[dict[str, int]] = [{} for _ in current]
    listings: list[str | None] = [None] * len(current)
    alive = list(range(len(current)))
    for step in steps:
        if not alive:
            break
        kept = []
        for i, result in zip(alive, step.apply_batch([current[i] for i in alive])):
            if result.doc is None:
                results[i] = result
                continue
            current[i] = result.doc
            listings[i] = result.listing or listings[i]
            for name, n in result.events.items():
                events[i][name] = events[i].get(name, 0) + n
            kept.append(i)
        alive = kept
    for i in alive:
        results[i] = StepResult.keep(current[i], events[i] or NO_EVENTS, listings[i])
    return results


def run_steps(doc: Doc, steps: Iterable[DocumentStep]) -> StepResult:
    """:func:`run_steps_batch` of one document.

    Args:
        doc: the document.
        steps: the steps, in the order they run.
    Returns:
        its result.
    """
    return run_steps_batch([doc], steps)[0]
