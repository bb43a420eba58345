"""Global statistics over one numpy array of rows per split, kept on disk instead of in memory:
:class:`SpilledRuns` writes every ``RUN_ROWS`` rows as a run file of sorted sections in the spill
folder (``OUT/.work/spill``) and reads its output back one of ``2**BUCKET_BITS`` ranges of the
sorted key at a time over all runs, so what it holds is its pending rows (fewer than ``RUN_ROWS``
plus one split's array) and one range over all runs: about ``1/2**BUCKET_BITS`` of all rows (it
grows with the corpus, 256 times slower than the rows; more where one key holds many rows, a range
being read whole), besides its output. :class:`pipelines.stages.keys.KeyStats`
(repeated content hashes, shared ids) and :class:`pipelines.stages.near_dedup.BandStats` (LSH band
buckets of two members or more) are the two users.
"""
from __future__ import annotations

import dataclasses
import uuid
from typing import NamedTuple

import apache_beam as beam
import fsspec
import numpy as np

BUCKET_BITS = 8  # runs are read back in 2**BUCKET_BITS ranges of a section's key (the top bits of its first field)
RUN_ROWS = 1 << 17  # rows held before they are written as a run (6 MB of KEY_ROWs)


class Section(NamedTuple):
    """One sorted section of a :class:`SortedRun` file.

    Attributes:
        offset: where it starts in the file, in bytes.
        starts: int64[2**BUCKET_BITS + 1]: where each range of its key starts, in rows; the last is
            its row count.
    """

    offset: int
    starts: np.ndarray


class SortedRun(NamedTuple):
    """A run file of the spill folder: some rows, as one or more sorted sections one after another.

    Attributes:
        path: the file's fsspec URL.
        sections: its sections, in file order.
    """

    path: str
    sections: tuple[Section, ...]


def _bucket_starts(top: np.ndarray) -> np.ndarray:
    """Where each of the 2**BUCKET_BITS ranges of sorted uint64 array ``top`` starts, and its length
    (int64[2**BUCKET_BITS + 1])."""
    bounds = np.arange(1, 1 << BUCKET_BITS, dtype=np.uint64) << np.uint64(64 - BUCKET_BITS)
    return np.concatenate([[0], np.searchsorted(top, bounds), [len(top)]]).astype(np.int64)


def write_run(folder: str, sections: list[np.ndarray]) -> SortedRun:
    """Write ``sections`` into a new file of ``folder`` as a :class:`SortedRun`.

    Args:
        folder: the spill folder (fsspec URL), which every worker can reach.
        sections: structured arrays, each sorted, whose first field is a uint64 key (its top
            ``BUCKET_BITS`` bits pick the range a row is read back in).
    Returns:
        the run.
    """
    path = f"{folder.rstrip('/')}/{uuid.uuid4().hex}.run"
    fs, local = fsspec.core.url_to_fs(path)
    fs.makedirs(local.rsplit("/", 1)[0], exist_ok=True)
    found, offset = [], 0
    with fs.open(local, "wb") as f:
        for rows in sections:
            f.write(np.ascontiguousarray(rows).view(np.uint8).data)  # the rows' own bytes: tobytes() copied them
            found.append(Section(offset, _bucket_starts(rows[rows.dtype.names[0]])))
            offset += rows.nbytes
    return SortedRun(path, tuple(found))


def read_range(runs: list[SortedRun], section: int, dtype: np.dtype, bucket: int) -> np.ndarray:
    """The rows of range ``bucket`` of section ``section`` of every run in ``runs``, together, sorted.

    Args:
        runs: the runs (all written with the same sections).
        section: which section.
        dtype: its rows' dtype.
        bucket: the range, ``0 <= bucket < 2**BUCKET_BITS``.
    Returns:
        a ``dtype`` array.
    """
    secs = [run.sections[section] for run in runs]
    sizes = [int(sec.starts[bucket + 1] - sec.starts[bucket]) for sec in secs]
    # each run's part read into its place, one part's bytes held at a time (parts joined by
    # np.concatenate held the range twice)
    found, at = np.empty(sum(sizes), dtype), 0
    for run, sec, n in zip(runs, secs, sizes):
        if n:
            fs, local = fsspec.core.url_to_fs(run.path)
            start = sec.offset + int(sec.starts[bucket]) * dtype.itemsize
            found[at:at + n] = np.frombuffer(fs.cat_file(local, start=start, end=start + n * dtype.itemsize), dtype)
            at += n
    found.sort()
    return found


def distinct(rows: np.ndarray) -> np.ndarray:
    """Sorted array ``rows`` without repeated rows."""
    return rows[np.concatenate([[True], rows[1:] != rows[:-1]])] if len(rows) else rows


@dataclasses.dataclass
class Spilled:
    """A :class:`SpilledRuns` accumulator.

    Attributes:
        pending: the arrays added since the last run was written.
        rows: their rows, in all.
        runs: the runs written so far.
    """

    pending: list[np.ndarray] = dataclasses.field(default_factory=list)
    rows: int = 0
    runs: list[SortedRun] = dataclasses.field(default_factory=list)


class SpilledRuns(beam.CombineFn):
    """Combine numpy arrays of rows (one per split) on disk: every ``RUN_ROWS`` rows are written as a
    :class:`SortedRun` to ``folder`` (:meth:`sections` says what a run holds), and the output is
    found over all runs one range of the key at a time (:meth:`found`, with :func:`read_range`).

    The accumulator is a :class:`Spilled`; runs are read, never deleted here: they go with
    ``OUT/.work/`` at the end of the job.

    Args:
        folder: the spill folder (fsspec URL; ``OUT/.work/spill``), which every worker can reach.
    """

    def __init__(self, folder: str):
        self.folder = folder

    def sections(self, rows: np.ndarray) -> list[np.ndarray]:
        """The sorted sections a run of ``rows`` holds (see :func:`write_run`); ``rows`` is the run's own
        array (:meth:`_flush` concatenated it), which a section may be, sorted in place."""
        raise NotImplementedError

    def found(self, runs: list[SortedRun]):
        """The output, from all runs."""
        raise NotImplementedError

    def create_accumulator(self) -> Spilled:
        """No rows yet."""
        return Spilled()

    def _flush(self, acc: Spilled) -> None:
        if acc.rows:
            rows = np.concatenate(acc.pending)
            acc.pending, acc.rows = [], 0
            acc.runs.append(write_run(self.folder, self.sections(rows)))

    def add_input(self, acc: Spilled, rows: np.ndarray) -> Spilled:
        """Add one split's rows."""
        acc.pending.append(rows)
        acc.rows += len(rows)
        if acc.rows >= RUN_ROWS:
            self._flush(acc)
        return acc

    def compact(self, acc: Spilled) -> Spilled:
        """The accumulator with its pending rows written as a run (Beam calls it before a partial is
        sent, so a partial is a list of file names)."""
        self._flush(acc)
        return acc

    def merge_accumulators(self, accumulators) -> Spilled:
        """All partial accumulators' pending rows and runs together, the pending rows written as a run
        whenever they reach ``RUN_ROWS`` (partials that were not compacted would else add up unbounded)."""
        merged = self.create_accumulator()
        for acc in accumulators:
            merged.runs += acc.runs
            for rows in acc.pending:
                self.add_input(merged, rows)
        return merged

    def extract_output(self, acc: Spilled):
        """:meth:`found` over all runs, the pending rows written first."""
        self._flush(acc)
        return self.found(acc.runs)
