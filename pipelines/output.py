"""The output folder of a run: refuse to mix two runs, clear the earlier one on ``--overwrite``,
remove what a failed run wrote, and write the JSONL side outputs (dead letters, duplicates).

A finished run is marked by ``manifest.json`` (written last); an unfinished (killed) run by
``_tmp_buckets/``; shards, ``val/``, ``stats.json``, ``dead_letter/``, ``duplicates/``, Beam's
``beam-temp-*`` folders or ``*.partial`` files without a manifest are leftovers of an interrupted
run. Any of these makes a new run refuse unless ``overwrite`` is set, which removes exactly these
artifacts (nothing else in the folder). A run that fails or is interrupted removes its own
artifacts (:func:`remove_artifacts`), so the corrected rerun needs no ``--overwrite``, and the
local folders the run created for ``--output`` when they are left empty (:func:`remove_created`).

Everything here goes through fsspec, so ``s3://``, ``gs://`` and ``memory://`` outputs work the
same as local folders.
"""
from __future__ import annotations

import os
import uuid

import apache_beam as beam
import fsspec
from fsspec.implementations.local import LocalFileSystem

from .cleaning import stable_bucket

DEAD_LETTER_DIR = "dead_letter"
DUPLICATES_DIR = "duplicates"
JSONL_PARTS = 8  # side-output lines are spread over at most this many part files per folder


class OutputExistsError(FileExistsError):
    """The output folder holds (part of) an earlier run; the message says what to do."""


class OutputNotWritableError(OSError):
    """``--output`` cannot be created or written; the message names it and the cause."""


def _artifacts(fs, root: str, prefix: str) -> list[str]:
    from .report import REPORT_HTML, REPORT_PNG, REPORT_TXT
    from .sharding import TMP_DIR, TOKENIZER_FILE
    from .splits import VAL_DIR

    names = ["manifest.json", "stats.json", TOKENIZER_FILE, "shardindex.json", REPORT_TXT, REPORT_PNG,
             REPORT_HTML, TMP_DIR, DEAD_LETTER_DIR, DUPLICATES_DIR, VAL_DIR]
    found = [f"{root}/{n}" for n in names if fs.exists(f"{root}/{n}")]
    patterns = [f"{prefix}-*.tar", f"{prefix}-*.idx", "beam-temp-*", "*.partial", ".*.partial"]
    return found + sorted(p for pattern in patterns for p in fs.glob(f"{root}/{pattern}"))


def _check_writable(fs, root: str, output_dir: str) -> None:
    probe = f"{root}/.colaflow-write-test-{uuid.uuid4().hex[:8]}"
    try:
        fs.makedirs(root, exist_ok=True)
        fs.pipe_file(probe, b"")
        fs.rm(probe)
    except OSError as e:
        raise OutputNotWritableError(
            f"cannot write to --output {output_dir}: {type(e).__name__}: {e}. "
            "Choose a folder you can write to (or fix its permissions).") from e


def _missing_folders(fs, root: str) -> list[str]:
    """The local folders of ``root`` and its parents that do not exist yet, deepest first (none for
    an object store, where a prefix is no folder and vanishes with its last object)."""
    if not isinstance(fs, LocalFileSystem):
        return []
    missing, path = [], os.path.abspath(root)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def prepare_output(output_dir: str, prefix: str, overwrite: bool = False) -> list[str]:
    """Create ``output_dir``, check it is writable, and refuse or clear an earlier run's files in it.

    Args:
        output_dir: folder or fsspec URL.
        prefix: shard name prefix (``shards.prefix``).
        overwrite: remove an earlier run's artifacts instead of refusing.
    Returns:
        the local folders this call created (``output_dir`` and any missing parents, deepest
        first), for :func:`remove_created` after a failed run; empty for object stores.
    Raises:
        OutputExistsError: the folder holds an earlier run and ``overwrite`` is false.
        OutputNotWritableError: the folder cannot be created or written (read-only, a file in
            the way, no permission, bucket missing).
    """
    fs, root = fsspec.core.url_to_fs(output_dir)
    created = _missing_folders(fs, root)
    _check_writable(fs, root, output_dir)
    found = _artifacts(fs, root, prefix)
    if not found:
        return created
    if not overwrite:
        from .sharding import TMP_DIR

        names = [p.rsplit("/", 1)[-1] for p in found]
        state = ("a finished run (manifest.json)" if "manifest.json" in names else
                 "an unfinished run (_tmp_buckets/)" if TMP_DIR in names else "leftovers of an earlier run")
        raise OutputExistsError(
            f"{output_dir} already holds {state}: {', '.join(names[:6])}"
            f"{f' and {len(names) - 6} more' if len(names) > 6 else ''}. "
            "Pass --overwrite to replace it, or choose a new --output folder.")
    for path in found:
        fs.rm(path, recursive=True)
    return created


def remove_created(created: list[str]) -> list[str]:
    """Remove the folders of ``created`` (from :func:`prepare_output`, deepest first) that are empty,
    stopping at the first that is not: a failed run leaves no empty ``--output`` behind, and a
    folder holding anything (user data, or what another process put there) is never touched
    (``os.rmdir`` removes only empty folders). Returns the folders removed; never raises."""
    removed = []
    for path in created:
        try:
            os.rmdir(path)
        except OSError:
            break
        removed.append(path)
    return removed


def remove_artifacts(output_dir: str, prefix: str) -> list[str]:
    """Remove every artifact of a run from ``output_dir`` (after a failed or interrupted run, whose
    folder :func:`prepare_output` had found clean); returns the names removed. Never raises: what
    cannot be removed is left for ``--overwrite``."""
    try:
        fs, root = fsspec.core.url_to_fs(output_dir)
        found = _artifacts(fs, root, prefix)
        for path in found:
            fs.rm(path, recursive=True)
    except OSError:
        return []
    return [p.rsplit("/", 1)[-1] for p in found]


class _WritePartFn(beam.DoFn):
    def __init__(self, folder_url: str):
        self.folder_url = folder_url

    def process(self, item):
        part, lines = item
        fs, root = fsspec.core.url_to_fs(self.folder_url)
        fs.makedirs(root, exist_ok=True)
        # one whole-object write per part: a retried bundle rewrites the same name, and nothing
        # is ever written for an empty part (S3 refuses an upload of zero parts)
        body = "".join(f"{line}\n" for line in sorted(lines)).encode("utf-8")
        fs.pipe_file(f"{root}/part-{part:05d}.jsonl", body)
        yield part


class WriteJsonl(beam.PTransform):
    """``PCollection[str]`` of JSON lines → ``{folder_url}/part-NNNNN.jsonl`` files (fsspec).

    Lines go to part ``stable_bucket(line, JSONL_PARTS)``, are sorted within it (same files on
    every runner) and written in one piece; an empty collection writes no file at all. Used for
    ``dead_letter/`` and ``duplicates/`` instead of Beam's ``WriteToText``, whose S3 writer fails
    on an empty file and whose ``beam-temp-*`` folders outlive a failed run.
    """

    def __init__(self, folder_url: str):
        super().__init__()
        self.folder_url = folder_url.rstrip("/")

    def expand(self, lines):
        """``lines`` (PCollection of str, one JSON object each) → ``part-NNNNN.jsonl`` files under the folder.

        Lines are spread over a fixed number of parts by a stable hash, so reruns write the same files;
        an empty part is never written (no file at all when there is no line)."""
        return (lines
                | "Part" >> beam.Map(lambda line: (stable_bucket(line, JSONL_PARTS), line))
                | "GroupPart" >> beam.GroupByKey()
                | "WritePart" >> beam.ParDo(_WritePartFn(self.folder_url)))
