"""Deterministic JSONL output for the record listings (``dead_letter/``, ``duplicates/``).

Beam's ``WriteToText`` writes lines in arrival order, which differs between runners and
between runs, and with one shard funnels every line through one writer. Here a line goes to
file ``stable_bucket(line, M)`` of ``M = ceil(lines / LINES_PER_FILE)`` files, each file's lines
are grouped and sorted, and written as ``records-NNNNN-of-MMMMM.jsonl`` (UTF-8, one line each,
``\\n``-terminated), so every runner writes the same bytes and no writer holds more than about
``LINES_PER_FILE`` lines. A file is written under a unique ``.partial`` name and then renamed,
so a retried or speculative task never exposes or interleaves a half-written file. With no
lines, one empty ``records-00000-of-00001.jsonl`` is written (a listing that exists and is empty).
"""
from __future__ import annotations

import math
import uuid

import apache_beam as beam
import fsspec

from .cleaning import stable_bucket

LINES_PER_FILE = 100_000


def num_files(lines: int) -> int:
    """Files for ``lines`` lines: ``ceil(lines / LINES_PER_FILE)``, at least 1."""
    return max(1, math.ceil(lines / LINES_PER_FILE))


def file_url(folder: str, index: int, total: int) -> str:
    """URL of file ``index`` of ``total`` in ``folder``."""
    return f"{folder}/records-{index:05d}-of-{total:05d}.jsonl"


def write_lines(url: str, lines: list[str]) -> str:
    """Write ``lines`` sorted, one per line, to ``url`` atomically (unique ``.partial``, then rename);
    returns ``url``. Raises ``OSError`` from the filesystem (e.g. no permission)."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    partial = f"{path}.{uuid.uuid4().hex}.partial"
    fs.pipe_file(partial, "".join(line + "\n" for line in sorted(lines)).encode("utf-8"))
    fs.mv(partial, path)
    return url


def _assign(line: str, count: int):
    return stable_bucket(line, num_files(count)), line


def _write_group(item, folder: str, count: int) -> str:
    index, lines = item
    return write_lines(file_url(folder, index, num_files(count)), list(lines))


def _write_if_empty(_, folder: str, count: int):
    if count == 0:
        yield write_lines(file_url(folder, 0, 1), [])


class WriteSortedJsonl(beam.PTransform):
    """``PCollection[str]`` (JSON lines without ``\\n``) → files ``FOLDER/records-*.jsonl`` (see module
    docstring); output: the URLs written."""

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder.rstrip("/")

    def expand(self, lines):
        count = beam.pvalue.AsSingleton(lines | "Count" >> beam.combiners.Count.Globally())
        written = (lines
                   | "Assign" >> beam.Map(_assign, count)
                   | "Group" >> beam.GroupByKey()
                   | "Write" >> beam.Map(_write_group, self.folder, count))
        empty = (lines.pipeline
                 | "Start" >> beam.Create([None])
                 | "WriteEmpty" >> beam.FlatMap(_write_if_empty, self.folder, count))
        return (written, empty) | "Written" >> beam.Flatten()
