"""The one listing of ``--input``: which files a path or glob names, and which paths it skips, with why.

An existing path is taken literally before it is read as a glob, so a folder or file named
``data [v2] (old)/a.jsonl`` is found as it is, and so are a glob's leading folders
(``data [v2] (old)/*.jsonl`` globs inside that folder when it exists). Otherwise the glob (Beam's syntax: ``*`` within
one folder, ``**`` across folders, ``?``, ``[...]``) is matched against a listing that follows
links: a linked folder is walked like any other (once, however many links reach it), a linked
file is read through its link's path, and a link whose target is missing (or a loop of links) is a skipped path, named
and counted (``skipped_links`` in ``stats.json``), never dropped unseen. Object stores (``gs://``,
``s3://``) have no links; they are listed by Beam's filesystems.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems

_WILDCARDS = re.compile(r"[*?\[]")


class ListingError(OSError):
    """The input's folder cannot be listed (a missing bucket, no permission, no filesystem for the
    scheme); the message names the path and the cause."""


@dataclass(frozen=True)
class InputFile:
    """One listed input file.

    Attributes:
        path: the path as listed (a link's own path, not its target's).
        size_in_bytes: its size (of the target, for a link).
    """

    path: str
    size_in_bytes: int


@dataclass(frozen=True)
class InputListing:
    """What ``--input`` names.

    Attributes:
        root: the folder sample ids are named relative to (:func:`pipelines.records.relative_name`):
            a literal file's folder, or the glob up to its first wildcard (:func:`pipelines.records.input_root`).
        files: the existing files, sorted by path.
        broken_links: links among the matches whose target does not exist, sorted.
        folder: ``True`` when the input is an existing folder (which the job refuses: it wants a glob of files).
    """

    root: str
    files: tuple[InputFile, ...]
    broken_links: tuple[str, ...] = ()
    folder: bool = False


def _local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _walk(top: str):
    """``(path, size or None for a broken link)`` of every file under ``top``, following linked
    folders once each (a link cycle is walked once)."""
    seen: set[str] = set()

    def fail(error: OSError):  # os.walk would skip an unreadable folder without a word
        raise error

    for folder, subfolders, names in os.walk(top, followlinks=True, onerror=fail):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = [d for d in subfolders if os.path.realpath(os.path.join(folder, d)) not in seen]
        for name in names:
            path = os.path.join(folder, name)
            try:
                yield path, os.path.getsize(path)
            except OSError:  # os.walk lists a link by its own name: its target is gone, or a loop of links
                if not os.path.islink(path):
                    raise
                yield path, None


def literal_folder(pattern: str) -> str:
    """The longest run of ``pattern``'s leading folders that exists as written, wildcard characters
    and all (``data [v2]`` of ``data [v2]/*.jsonl`` when that folder exists); ``""`` for none. The
    rest of the pattern is the glob matched inside it."""
    parts = pattern.split("/")
    top = ""
    for i in range(1, len(parts)):
        folder = "/".join(parts[:i]) or "/"
        if not os.path.isdir(folder):
            break
        top = folder
    return top


def _list_local(pattern: str) -> tuple[str, list[InputFile], list[str]]:
    """The folder the matches are named relative to, the files ``pattern`` matches and its broken links."""
    from pipelines.records import input_root

    top = literal_folder(pattern)
    rest = pattern[len(top):].lstrip("/") if top else pattern
    root = top if _WILDCARDS.search(top) else input_root(pattern)  # a folder named like a glob is taken as it is
    regex = re.compile(FileSystem.translate_pattern(rest))
    files, broken = [], []
    following = rest.split("/", 1)
    if len(following) > 1 and not _WILDCARDS.search(following[0]):  # a plain folder that does not exist
        return root, files, broken
    for path, size in _walk(top or "."):
        relative = os.path.relpath(path, top or ".")
        if not regex.match(relative):
            continue
        name = os.path.join(top, relative) if top else relative  # as the pattern spells it
        if size is None:
            broken.append(name)
        else:
            files.append(InputFile(name, size))
    return root, files, broken


def list_inputs(pattern: str) -> InputListing:
    """List what ``pattern`` (a path or glob, local or any Beam filesystem URL) names.

    Args:
        pattern: ``--input`` as given.
    Returns:
        the :class:`InputListing` (no files when nothing matches; the caller says so).
    Raises:
        ListingError: the folder to list cannot be read, naming it and the cause.
    """
    from pipelines.records import input_root

    local = _local(pattern)
    path = pattern.removeprefix("file://") if local else pattern
    try:
        if local:
            if os.path.isdir(path):
                return InputListing(path.rstrip("/"), (), folder=True)
            if os.path.isfile(path):
                return InputListing(os.path.dirname(path), (InputFile(path, os.path.getsize(path)),))
            if os.path.islink(path):
                return InputListing(os.path.dirname(path), (), (path,))
            if not _WILDCARDS.search(path):
                return InputListing(os.path.dirname(path), ())
            root, files, broken = _list_local(path)
            return InputListing(root, tuple(sorted(files, key=lambda f: f.path)), tuple(sorted(broken)))
        if FileSystems.exists(path) and not path.endswith("/"):
            meta = FileSystems.match([path])[0].metadata_list
            literal = [m for m in meta if m.path == path]
            if literal:
                return InputListing(path.rsplit("/", 1)[0], (InputFile(path, literal[0].size_in_bytes),))
        inside = [] if _WILDCARDS.search(path) else FileSystems.match([path.rstrip("/") + "/*"])[0].metadata_list
        if inside:
            return InputListing(path.rstrip("/"), (), folder=True)
        matched = FileSystems.match([path])[0].metadata_list
    except OSError as e:  # Beam's BeamIOError, os.walk's PermissionError
        raise ListingError(f"cannot list --input {pattern}: {e}") from e
    files = sorted((InputFile(m.path, m.size_in_bytes) for m in matched), key=lambda f: f.path)
    return InputListing(input_root(path), tuple(files))
