"""What a run report reads: the metrics of a run (``metrics.jsonl``) and its markers (``events.jsonl``).

Markers are what changes the meaning of the curves at a step: a resume from a checkpoint (the
loss and throughput restart there), a rollback after repeated bad steps (training continues from
an earlier step with a lower learning rate) and skipped steps (non-finite or spiking loss).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field


@dataclass
class RunMetrics:
    """The records of one run, by step, and the lines that could not be read.

    Attributes:
        records: one dict per logged step, sorted by ``step``.
        bad_lines: ``(line number, reason)`` of skipped lines.
        path: the file read.
    """

    records: list[dict]
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    path: str = ""

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of the records whose ``key`` is a finite number."""
        pts = [(r["step"], float(r[key])) for r in self.records
               if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
               and math.isfinite(r[key])]
        return [p[0] for p in pts], [p[1] for p in pts]

    def total(self, key: str) -> float:
        """Sum of the finite values of ``key`` over all records (e.g. ``tokens``)."""
        return sum(self.series(key)[1])


def read_metrics(path: str) -> RunMetrics:
    """Read a ``metrics.jsonl``: records of the same step are merged, later fields winning (a resumed
    run re-logs steps; evaluation writes ``val_loss`` at a step the training record also has).

    Raises:
        FileNotFoundError: ``path`` does not exist (message says what to run first).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no metrics file; train first (python -m trainer --config ...) "
                                "or point at the run folder holding metrics.jsonl")
    by_step: dict[int, dict] = {}
    bad: list[tuple[int, str]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append((n, f"not JSON ({e.msg})"))
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                bad.append((n, "not an object with an integer 'step'"))
                continue
            by_step.setdefault(rec["step"], {}).update(rec)  # later fields win (resume, val_loss lines)
    return RunMetrics([by_step[s] for s in sorted(by_step)], bad, path)


@dataclass
class Markers:
    """Events of a run worth marking on its plots (from ``events.jsonl``, one entry per step, not per rank).

    Attributes:
        resumes: steps a process resumed at (``resume`` events).
        rollbacks: ``(from_step, to_step)`` of each rollback.
        skipped: ``(step, kind)`` of each skipped step, ``kind`` = ``nonfinite`` or ``loss_spike``.
    """

    resumes: list[int] = field(default_factory=list)
    rollbacks: list[tuple[int, int]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)


def read_markers(path: str) -> Markers:
    """Markers of ``events.jsonl`` at ``path`` (none when the file is missing; unreadable lines skipped)."""
    m = Markers()
    if not os.path.exists(path):
        return m
    resumes, rollbacks, skipped = set(), set(), set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(e, dict) or not isinstance(e.get("step"), int):
                continue
            kind = e.get("event")
            if kind == "resume":
                resumes.add(e["step"])
            elif kind == "rollback" and isinstance(e.get("to_step"), int):
                rollbacks.add((e["step"], e["to_step"]))
            elif kind in ("nonfinite", "loss_spike"):
                skipped.add((e["step"], kind))
    m.resumes, m.rollbacks, m.skipped = sorted(resumes), sorted(rollbacks), sorted(skipped)
    return m
