"""The output folder of a run: refuse to mix two runs, or clear the earlier one on ``--overwrite``.

A finished run is marked by ``manifest.json`` (written last); an unfinished (killed) run by
``_tmp_buckets/``; shards, ``val/``, ``stats.json``, ``dead_letter/`` or ``duplicates/`` without a
manifest are leftovers of an interrupted commit. Any of these makes a new run refuse unless
``overwrite`` is set, which removes exactly these artifacts (nothing else in the folder).
"""
from __future__ import annotations

import fsspec

DEAD_LETTER_DIR = "dead_letter"
DUPLICATES_DIR = "duplicates"


class OutputExistsError(FileExistsError):
    """The output folder holds (part of) an earlier run; the message says what to do."""


def _artifacts(fs, root: str, prefix: str) -> list[str]:
    from .report import REPORT_PNG, REPORT_TXT
    from .sharding import TMP_DIR, TOKENIZER_FILE
    from .splits import VAL_DIR

    names = ["manifest.json", "stats.json", TOKENIZER_FILE, "shardindex.json", REPORT_TXT, REPORT_PNG,
             TMP_DIR, DEAD_LETTER_DIR, DUPLICATES_DIR, VAL_DIR]
    found = [f"{root}/{n}" for n in names if fs.exists(f"{root}/{n}")]
    return found + sorted(fs.glob(f"{root}/{prefix}-*.tar") + fs.glob(f"{root}/{prefix}-*.idx"))


def prepare_output(output_dir: str, prefix: str, overwrite: bool = False) -> None:
    """Create ``output_dir``; refuse or clear an earlier run's files in it.

    Args:
        output_dir: folder or fsspec URL.
        prefix: shard name prefix (``shards.prefix``).
        overwrite: remove an earlier run's artifacts instead of refusing.
    Raises:
        OutputExistsError: the folder holds an earlier run and ``overwrite`` is false.
    """
    fs, root = fsspec.core.url_to_fs(output_dir)
    fs.makedirs(root, exist_ok=True)
    found = _artifacts(fs, root, prefix)
    if not found:
        return
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
