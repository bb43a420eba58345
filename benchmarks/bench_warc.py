"""WARC reading and HTML extraction: MB of .warc.gz per CPU-second, colaflow vs datatrove.

The same generated files (``tests/support/warc.py``: a crawl's mix of request records, HTML
article pages of 3-12 paragraphs drawn from a word list, one 404 and one PNG in 50) are read by

* colaflow: ``pipelines.io.reading.read_split`` (gzip members, FastWARC) and
  ``pipelines.io.pages.WarcPages.parse`` (status and media type, charset, extraction, language id),
  with ``input.warc.extractor`` resiliparse (the default; also with ``input.warc.language`` off)
  and trafilatura;
* datatrove 0.10.1: ``WarcReader.read_file`` (warcio, cchardet, python-magic) and its
  ``Trafilatura`` extractor (``favour_precision``, ``deduplicate``: its defaults), its ``extract``
  called in-process (datatrove otherwise runs it in a sandbox process, whose CPU time this
  process would not see).

Both run in this one process, one core; CPU time is ``time.process_time``. colaflow also
identifies each page's language (py3langid), which datatrove leaves to a later step.

    .venv/bin/python benchmarks/bench_warc.py [--pages 2000] [--files 4]
    (datatrove side: pip install datatrove warcio faust-cchardet python-magic)
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipelines.config import InputConfig  # noqa: E402
from pipelines.io.pages import WarcPages  # noqa: E402
from pipelines.io.reading import plan_splits, read_split  # noqa: E402
from pipelines.records import WARC, Doc  # noqa: E402
from tests.support.warc import Page, article, write_warc  # noqa: E402

WORDS = ("river town mill stone wall baker bread morning council road bridge water hill library garden map "
         "valley school meadow flower child spring market harbour ship station train clock tower church field "
         "the a of and to in was for on with as by at from that which were this had been their").split()


def generate(folder: str, pages: int, files: int, seed: int = 0) -> list[str]:
    """Write ``files`` ``.warc.gz`` files holding ``pages`` response records in all; their paths."""
    rng = random.Random(seed)
    paths = []
    for f in range(files):
        batch = []
        for i in range(f, pages, files):
            if i % 50 == 7:
                batch.append(Page(f"https://site{i % 97}.example/missing/{i}", b"<html>gone</html>",
                                  status="404 Not Found"))
            elif i % 50 == 31:
                batch.append(Page(f"https://site{i % 97}.example/img/{i}.png", b"\x89PNG\r\n\x1a\n" + bytes(4000),
                                  "image/png"))
            else:
                paras = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 90))).capitalize() + "."
                         for _ in range(rng.randint(3, 12))]
                batch.append(Page(f"https://site{i % 97}.example/a/{i}", article(f"Page {i}", paras).encode()))
        path = os.path.join(folder, f"crawl-{f:05d}.warc.gz")
        write_warc(path, batch)
        paths.append(path)
    return paths


def run_colaflow(paths: list[str], extractor: str, language: bool = True) -> tuple[float, int]:
    """``(CPU seconds, documents)`` of colaflow's reading and extraction of ``paths`` (``language``:
    ``input.warc.language``)."""
    cfg = InputConfig()
    cfg.warc.extractor, cfg.warc.language = extractor, language
    pages = WarcPages(cfg)
    pages.language("warm up the language model")  # loaded once per worker; not per page
    start, docs = time.process_time(), 0
    for path in paths:
        for split in plan_splits(path, os.path.getsize(path), cfg):
            for unit in read_split(split, cfg):
                if unit.fmt == WARC:
                    docs += isinstance(pages.parse(unit, os.path.basename(path)), Doc)
    return time.process_time() - start, docs


def run_datatrove(paths: list[str]) -> tuple[float, int]:
    """``(CPU seconds, documents)`` of datatrove's ``WarcReader`` and ``Trafilatura`` on ``paths``."""
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader

    reader, extractor = WarcReader(os.path.dirname(paths[0])), Trafilatura()
    start, docs = time.process_time(), 0
    for path in paths:
        for doc in reader.read_file(os.path.basename(path)):
            docs += bool(extractor.extract(doc.text))
    return time.process_time() - start, docs


def main() -> None:
    """Generate the files, time each reader once, print MB per CPU-second and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=2000, help="response records in all")
    ap.add_argument("--files", type=int, default=4, help=".warc.gz files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = generate(folder, args.pages, args.files)
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        print(f"{args.pages} pages in {args.files} files, {mb:.1f} MB of .warc.gz")
        rows = [("colaflow + resiliparse", *run_colaflow(paths, "resiliparse")),
                ("colaflow + resiliparse, no language id", *run_colaflow(paths, "resiliparse", False)),
                ("colaflow + trafilatura", *run_colaflow(paths, "trafilatura"))]
        missing = [m for m in ("datatrove", "warcio", "cchardet", "magic") if importlib.util.find_spec(m) is None]
        if missing:
            print(f"datatrove baseline skipped: {', '.join(missing)} not installed")
        else:
            rows.append(("datatrove WarcReader + Trafilatura", *run_datatrove(paths)))
        for name, cpu, docs in rows:
            print(f"{name:<38} {cpu:7.2f} CPU-s  {mb / cpu:6.2f} MB/CPU-s  {docs} documents")
        if not missing:
            base = mb / rows[-1][1]
            for name, cpu, _ in rows[:-1]:
                print(f"{name} / datatrove: {mb / cpu / base:.2f}x")


if __name__ == "__main__":
    main()
