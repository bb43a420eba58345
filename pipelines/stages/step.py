"""The document step: one cleaning, filtering or redaction rule, applied to one document at a time.

A step is a small class with ``apply(doc) -> StepResult`` (after datatrove's pipeline steps and
filters, ``datatrove/pipeline/base.py`` and ``pipeline/filters/base_filter.py``: a filter says
keep, or why not). The steps run in the order :func:`pipelines.stages.filters.build_steps` lists.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping, NamedTuple, Protocol

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


def run_steps(doc: Doc, steps: Iterable[DocumentStep]) -> StepResult:
    """Apply ``steps`` in order to ``doc``: the first rejection is the result (later steps do not
    run, and events and listings of earlier steps are not counted); else the last step's document
    with the events of every step, summed per name in the order first counted, and the last listing."""
    events: dict[str, int] = {}
    listing = None
    for step in steps:
        result = step.apply(doc)
        if result.doc is None:
            return result
        doc = result.doc
        listing = result.listing or listing
        for name, n in result.events.items():
            events[name] = events.get(name, 0) + n
    return StepResult.keep(doc, events or NO_EVENTS, listing)
