"""The output folder of a run: refuse to mix two runs, keep the earlier one until a ``--overwrite``
run succeeds, remove what a failed run wrote (``pipelines/README.md``: the folder's states), and
write the JSONL side outputs (dead letters, duplicates). Everything goes through fsspec.

Artifacts of a run: ``manifest.json`` (written last: a finished run), ``_tmp_buckets/`` (an
unfinished one), shards and their indexes, ``val/``, ``stats.json``, ``tokenizer.model``, the
reports, ``dead_letter/``, ``duplicates/``, ``decontaminated/``, Beam's ``beam-temp-*`` and ``*.partial`` files, and
every shard and index an earlier ``manifest.json`` lists, whatever its ``shards.prefix``.
``.work/`` (each finished input split's output, :mod:`pipelines.io.resume`) is none: a failed run
keeps it for ``--resume``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import heapq
import os
import sys
import uuid

import apache_beam as beam
import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipelines.stages.clean import stable_bucket
from pipelines.stages.write_shards import BucketRuns

DEAD_LETTER_DIR = "dead_letter"
DUPLICATES_DIR = "duplicates"
DECONTAMINATED_DIR = "decontaminated"
JSONL_PARTS = 8  # side-output lines are spread over at most this many part files per folder
BACKUP_DIR = ".previous-run"  # hidden: the earlier run while a --overwrite run is not done
BACKUP_DONE = ".complete"  # in BACKUP_DIR once every artifact of the earlier run is in it


class OutputExistsError(FileExistsError):
    """The output folder holds (part of) an earlier run; the message says what to do."""


class OutputNotWritableError(OSError):
    """``--output`` cannot be created or written; the message names it and the cause."""


def _artifacts(fs, root: str, prefix: str) -> list[str]:
    from pipelines.accounting.report import REPORT_HTML, REPORT_PNG, REPORT_TXT
    from pipelines.stages.split import VAL_DIR
    from pipelines.stages.write_shards import TMP_DIR
    from shards.tokenizers import FOLDER_FILE_NAMES

    fs.invalidate_cache()  # other processes (Beam workers) wrote here since the last listing
    names = ["manifest.json", "stats.json", *FOLDER_FILE_NAMES, "shardindex.json", REPORT_TXT, REPORT_PNG,
             REPORT_HTML, TMP_DIR, DEAD_LETTER_DIR, DUPLICATES_DIR, DECONTAMINATED_DIR, VAL_DIR]
    found = [f"{root}/{n}" for n in names if fs.exists(f"{root}/{n}")]
    patterns = [f"{prefix}-*.tar", f"{prefix}-*.idx", "beam-temp-*", "*.partial", ".*.partial"]
    globbed = {p for pattern in patterns for p in fs.glob(f"{root}/{pattern}")}
    listed = {f"{root}/{n}" for n in _listed_files(fs, root) if fs.exists(f"{root}/{n}")}
    return found + sorted(globbed | listed - set(found))


def _listed_files(fs, root: str) -> list[str]:
    """The shards and their DALI indexes that ``root/manifest.json`` lists, whatever their prefix
    (an earlier run with another ``shards.prefix``); none when there is no readable manifest, whose
    folder then holds no finished run to list."""
    import json

    from shards.io.index import dali_index_path

    try:
        shards = json.loads(fs.cat_file(f"{root}/manifest.json")).get("shards", [])
        names = [s["name"] for s in shards if isinstance(s, dict) and isinstance(s.get("name"), str)]
    except (OSError, ValueError, AttributeError):
        return []
    plain = [n for n in names if "/" not in n and n not in ("", ".", "..")]  # never outside the folder
    return plain + [dali_index_path(n) for n in plain]


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


@dataclasses.dataclass
class PreparedOutput:
    """What :func:`prepare_output` did to ``--output``; :func:`finish_output` or :func:`abort_output`
    completes it once the run is over.

    Attributes:
        output_dir: the folder or fsspec URL given.
        prefix: shard name prefix (``shards.prefix``).
        created: the local folders created for it (``output_dir`` and missing parents, deepest
            first); empty for object stores.
        backup: whether ``OUT/.previous-run/`` holds an earlier, finished run to keep until this
            run succeeds (``--overwrite``).
    """

    output_dir: str
    prefix: str
    created: list[str]
    backup: bool = False


def _move_back(fs, root: str) -> None:
    """Move everything in ``root/.previous-run/`` back into ``root`` and remove that folder. The
    completion mark goes first, so a move back cut short is finished by the next run."""
    backup = f"{root}/{BACKUP_DIR}"
    if fs.exists(f"{backup}/{BACKUP_DONE}"):
        fs.rm(f"{backup}/{BACKUP_DONE}")
    fs.invalidate_cache()
    for path in fs.ls(backup, detail=False):
        fs.mv(path, f"{root}/{path.rstrip('/').rsplit('/', 1)[-1]}", recursive=True)
    fs.invalidate_cache()
    if fs.exists(backup):  # an object store drops the prefix with its last object
        fs.rm(backup, recursive=True)


def _move_to_backup(fs, root: str, found: list[str]) -> None:
    """Move the artifacts ``found`` into ``root/.previous-run/`` and mark it complete; an error or
    Ctrl-C part way moves what was moved back before it propagates."""
    backup = f"{root}/{BACKUP_DIR}"
    try:
        fs.makedirs(backup, exist_ok=True)
        for path in found:
            fs.mv(path, f"{backup}/{path.rsplit('/', 1)[-1]}", recursive=True)
        fs.pipe_file(f"{backup}/{BACKUP_DONE}", b"the earlier run, kept until a --overwrite run of colaflow succeeds\n")
    except BaseException:
        _move_back(fs, root)
        raise


def prepare_output(output_dir: str, prefix: str, overwrite: bool = False, resume: bool = False) -> PreparedOutput:
    """Create ``output_dir``, check it is writable, and refuse an earlier run's files in it, or with
    ``overwrite`` move them into ``OUT/.previous-run/`` (kept until the run succeeds).

    A ``.previous-run/`` left by a killed ``--overwrite`` run is handled first: without its
    completion mark (the move into it was cut short) its files go back into ``output_dir``; with
    it, the run is refused unless ``overwrite``, which removes the killed run's partial artifacts
    and keeps that folder as the backup (it holds the last finished run).

    Args:
        output_dir: folder or fsspec URL.
        prefix: shard name prefix (``shards.prefix``).
        overwrite: set the earlier run aside (replaced on success) instead of refusing.
        resume: remove the partial artifacts of an unfinished earlier run instead of refusing
            (``--resume`` recomputes them; a finished run is still refused).
    Returns:
        a :class:`PreparedOutput` for :func:`finish_output` (success) or :func:`abort_output`.
    Raises:
        OutputExistsError: the folder holds an earlier run (or a backup of one) and ``overwrite``
            is false.
        OutputNotWritableError: the folder cannot be created or written (read-only, a file in
            the way, no permission, bucket missing).
        OSError: moving the earlier run aside failed (what was moved is moved back first).
    """
    fs, root = fsspec.core.url_to_fs(output_dir)
    created = _missing_folders(fs, root)
    _check_writable(fs, root, output_dir)
    backup = f"{root}/{BACKUP_DIR}"
    if fs.exists(backup) and not fs.exists(f"{backup}/{BACKUP_DONE}"):
        _move_back(fs, root)
    found = _artifacts(fs, root, prefix)
    if fs.exists(f"{backup}/{BACKUP_DONE}"):
        if not overwrite:
            out = output_dir.rstrip("/")
            partial = f"delete {', '.join(p.rsplit('/', 1)[-1] for p in found)} from {out}, " if found else ""
            raise OutputExistsError(
                f"{out} holds a run that was killed while it replaced an earlier one, which is kept in "
                f"{out}/{BACKUP_DIR}/. Pass --overwrite to run again (the earlier run stays there until the new "
                f"one succeeds), or restore it by hand: {partial}move the files of {BACKUP_DIR}/ back into {out} "
                f"and delete {BACKUP_DIR}/.")
        for path in found:  # the killed run's partial output
            fs.rm(path, recursive=True)
        return PreparedOutput(output_dir, prefix, created, backup=True)
    names = [p.rsplit("/", 1)[-1] for p in found]
    if resume and "manifest.json" not in names:
        for path in found:  # the unfinished run's partial output, recomputed from its finished splits
            fs.rm(path, recursive=True)
        return PreparedOutput(output_dir, prefix, created)
    if not found:
        return PreparedOutput(output_dir, prefix, created)
    if not overwrite:
        from pipelines.io.resume import WORK_DIR
        from pipelines.stages.write_shards import TMP_DIR

        state = ("a finished run (manifest.json)" if "manifest.json" in names else
                 "an unfinished run (_tmp_buckets/)" if TMP_DIR in names else "leftovers of an earlier run")
        reuse = (", --resume to reuse its finished input splits" if "manifest.json" not in names
                 and fs.exists(f"{root}/{WORK_DIR}") else "")
        raise OutputExistsError(
            f"{output_dir} already holds {state}: {', '.join(names[:6])}"
            f"{f' and {len(names) - 6} more' if len(names) > 6 else ''}. "
            f"Pass --overwrite to replace it{reuse}, or choose a new --output folder.")
    _move_to_backup(fs, root, found)
    return PreparedOutput(output_dir, prefix, created, backup=True)


def refuse_inputs_in_artifacts(output_dir: str, prefix: str, input_paths: list[str], tokenizer: str | None) -> None:
    """Before an ``overwrite`` run: refuse input files or a tokenizer that lie inside the earlier
    run's artifacts in a local ``output_dir`` (``OUT/tokenizer.model``, ``OUT/dead_letter/*.jsonl``),
    which :func:`prepare_output` would move into ``OUT/.previous-run/`` before the run reads them.
    Paths are compared resolved (``os.path.realpath``, so symlinks and relative paths count); remote
    paths and outputs are not checked.

    Args:
        output_dir: the ``--output`` folder or fsspec URL.
        prefix: shard name prefix (``shards.prefix``).
        input_paths: the files ``--input`` matched.
        tokenizer: the ``--tokenizer`` path, or ``None``.
    Raises:
        OutputExistsError: one of them lies inside an artifact; the message names the flag and the
            file and says to copy it elsewhere first.
    """
    fs, root = fsspec.core.url_to_fs(output_dir)
    if not isinstance(fs, LocalFileSystem) or not fs.isdir(root):
        return
    held = [os.path.realpath(path) for path in _artifacts(fs, root, prefix)]
    flagged = [("--tokenizer", tokenizer)] if tokenizer else []
    for flag, path in flagged + [("--input", path) for path in input_paths]:
        real = os.path.realpath(path) if "://" not in path else ""
        if any(real == h or real.startswith(h.rstrip(os.sep) + os.sep) for h in held):
            out = output_dir.rstrip("/")
            raise OutputExistsError(f"{flag} {path} lies inside the earlier run in {out}, which --overwrite sets "
                                    f"aside (into {out}/{BACKUP_DIR}/) before this run reads it; copy the file "
                                    f"out of {out} first and pass the copy to {flag}")


def finish_output(prepared: PreparedOutput) -> None:
    """After a successful run: delete the earlier run kept in ``OUT/.previous-run/``, if any. Never
    raises: a backup that cannot be deleted is reported in one warning line."""
    if not prepared.backup:
        return
    fs, root = fsspec.core.url_to_fs(prepared.output_dir)
    try:
        fs.rm(f"{root}/{BACKUP_DIR}", recursive=True)
    except OSError as e:
        print(f"warning: cannot delete the earlier run kept in {prepared.output_dir.rstrip('/')}/{BACKUP_DIR}/ "
              f"({type(e).__name__}: {e}); delete that folder by hand", file=sys.stderr)


def abort_output(prepared: PreparedOutput) -> list[str]:
    """After a failed or interrupted run: remove its artifacts (:func:`remove_artifacts`), move the
    earlier run back from ``OUT/.previous-run/`` (byte for byte as it was) and remove the local
    folders created for ``--output`` when left empty (:func:`remove_created`). Returns the names
    removed. Never raises: when this run's files cannot all be removed, the earlier run stays in
    ``.previous-run/`` (the next run explains it), as it does when moving it back fails."""
    removed = remove_artifacts(prepared.output_dir, prepared.prefix)
    if prepared.backup:
        try:
            fs, root = fsspec.core.url_to_fs(prepared.output_dir)
            if not _artifacts(fs, root, prepared.prefix):  # else a name would clash with a leftover
                _move_back(fs, root)
        except OSError:
            pass
    remove_created(prepared.created)
    return removed


def remove_created(created: list[str]) -> list[str]:
    """Remove the folders of ``created`` (:attr:`PreparedOutput.created`, deepest first) that are empty,
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
    folder :func:`prepare_output` had cleared); returns the names removed. Never raises: what
    cannot be removed is left for ``--overwrite``."""
    try:
        fs, root = fsspec.core.url_to_fs(output_dir)
        found = _artifacts(fs, root, prefix)
        for path in found:
            fs.rm(path, recursive=True)
    except OSError:
        return []
    return [p.rsplit("/", 1)[-1] for p in found]


JSONL_RUN_BYTES = 8 << 20  # memory a bundle's lines hold (sys.getsizeof) before it spills its runs


class _PartRunsFn(beam.DoFn):
    """JSON lines → ``(part, path of a run)`` per part and bundle: the bundle's lines of part
    ``stable_bucket(line, JSONL_PARTS)``, sorted, in a file of the spill folder; written early
    once they hold ``JSONL_RUN_BYTES``, so a bundle of the whole corpus (the DirectRunner's) holds
    no more than that, and the grouping moves paths, not one line per listed document."""

    def __init__(self, spill_folder: str):
        self.spill_folder = spill_folder

    def start_bundle(self):
        """Start empty runs."""
        self._runs = BucketRuns(self.spill_folder, JSONL_RUN_BYTES, _line_run)

    def process(self, line: str):
        """Add ``line`` to its part's run; writes the runs past ``JSONL_RUN_BYTES``."""
        yield from self._runs.add(stable_bucket(line, JSONL_PARTS), line, sys.getsizeof(line))

    def finish_bundle(self):
        """Write the runs left."""
        for run in self._runs.flush():
            yield beam.transforms.window.GlobalWindows.windowed_value(run)


def _line_run(lines: list[str]) -> bytes:
    """A part's lines, sorted, one per line, UTF-8."""
    lines.sort()
    return "".join(f"{line}\n" for line in lines).encode("utf-8")


def _run_lines(f):
    """The lines of an open run file, without their newline (str, in file order)."""
    for line in f:
        yield line[:-1].decode("utf-8")


class _WritePartFn(beam.DoFn):
    def __init__(self, folder_url: str):
        self.folder_url = folder_url

    def process(self, item):
        part, paths = item
        fs, root = fsspec.core.url_to_fs(self.folder_url)
        fs.makedirs(root, exist_ok=True)
        # the runs merged a line at a time; one file per part, written only when a line exists
        # (a retried bundle rewrites the same name; S3 refuses an upload of zero parts)
        with contextlib.ExitStack() as files, fs.open(f"{root}/part-{part:05d}.jsonl", "wb") as out:
            runs = [_run_lines(files.enter_context(fsspec.open(path, "rb"))) for path in paths]
            for line in heapq.merge(*runs):
                out.write(f"{line}\n".encode("utf-8"))
        yield part


class WriteJsonl(beam.PTransform):
    """``PCollection[str]`` of JSON lines → ``{folder_url}/part-NNNNN.jsonl`` files (fsspec).

    Lines go to part ``stable_bucket(line, JSONL_PARTS)``, are sorted within it (same files on
    every runner: each bundle's lines of a part sorted into a run in ``spill_folder``, the runs
    merged) and written part by part; an empty collection writes no file at all. Used for
    ``dead_letter/``, ``duplicates/`` and ``decontaminated/`` instead of Beam's ``WriteToText``,
    whose S3 writer fails on an empty file and whose ``beam-temp-*`` folders outlive a failed run.

    Applied to a tuple of PCollections, it spills each one's lines in the stage that makes them
    (a ``Part`` step each) and groups the runs of all: a Flatten of the lines would cross a stage
    boundary, which the DirectRunner holds whole (duplicates/ at 16x the demo corpus: 137,420 lines,
    20 MB, and about 80 MB while they were split into runs).

    Args:
        folder_url: the folder of the part files.
        spill_folder: where the sorted runs go (the job's ``OUT/.work/spill/``).
    """

    def __init__(self, folder_url: str, spill_folder: str):
        super().__init__()
        self.folder_url, self.spill_folder = folder_url.rstrip("/"), spill_folder

    def expand(self, lines):
        """``lines`` (PCollection of str, one JSON object each, or a tuple of them) → ``part-NNNNN.jsonl``
        files under the folder.

        Lines are spread over a fixed number of parts by a stable hash, so reruns write the same files;
        an empty part is never written (no file at all when there is no line)."""
        inputs = lines if isinstance(lines, tuple) else (lines,)
        runs = tuple(pc | f"Part{i or ''}" >> beam.ParDo(_PartRunsFn(self.spill_folder))
                     for i, pc in enumerate(inputs))
        runs = runs[0] if len(runs) == 1 else runs | "Runs" >> beam.Flatten()
        return (runs
                | "GroupPart" >> beam.GroupByKey()
                | "WritePart" >> beam.ParDo(_WritePartFn(self.folder_url)))
