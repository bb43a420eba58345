"""WARC input (issue 36): response records become documents with their url, date and language,
the rest is counted by reason, broken gzip members are dead letters naming file and offset, and a
``.warc.gz`` read in byte ranges gives the same shards as read whole. Real DirectRunner jobs over
WARC files written with warcio."""
from __future__ import annotations

import codecs
import gzip
import json

import numpy as np
import pytest
from warcio.archiveiterator import ArchiveIterator

from pipelines.accounting.report import report_text
from pipelines.config import InputConfig, PipelineConfig, WarcConfig
from pipelines.io.pages import HtmlExtractor, WarcPages, decode_html
from pipelines.io.warc import warc_ranges, warc_units
from pipelines.job import no_records_error, run
from pipelines.records import Doc, DocMeta
from pipelines.stages.write_shards import encode_sample
from shards import Manifest, iter_documents
from tests.support.local_engines import child_env, start_dask
from tests.support.pipeline import synthetic_config
from tests.support.warc import PARAGRAPHS, Page, article, write_warc

RUSSIAN = ("Река текла мимо старых каменных стен города, где мельница стояла триста лет. "
           "Каждое утро пекарь открывал свою лавку до рассвета, и запах хлеба плыл по улице.")
JAPANESE = "川は町の古い石垣のそばを流れていました。毎朝、パン屋は夜明け前に店を開けました。"
FRENCH = ("La rivière coulait le long des vieux murs de pierre de la ville, où le moulin était "
          "depuis trois cents ans. Chaque matin, le boulanger ouvrait sa boutique avant l'aube.")
BROKEN = ("<html><head><title>Broken page</title><body><div><p>The river ran past the old stone walls <b>of the "
          "town<p>where the mill had stood<div><table><tr><td>for three hundred years</table>&nbsp;&amp; more"
          "<p>Every morning the baker opened his shop before dawn")  # no closing tags, unclosed <b>


def _pages(tag: str = "crawl") -> list[Page]:
    pages = [Page(f"https://town.example/news/{i}",
                  article(f"News {i}", [f"Story {i} of the {tag} file."] + PARAGRAPHS[i % 5:]).encode(),
                  date=f"2024-03-{1 + i % 28:02d}T12:00:00Z") for i in range(30)]
    return pages + [
        Page("https://town.example/broken", BROKEN.encode()),
        Page("https://ru.example/", article("Город", [RUSSIAN]).encode("koi8-r"), "text/html; charset=KOI8-R"),
        Page("https://jp.example/", article("町", [JAPANESE], head='<meta charset="shift_jis">').encode("shift_jis"),
             "text/html"),
        Page("https://fr.example/", article("Ville", [FRENCH]).encode("cp1252"), "text/html; charset=iso-8859-1"),
        Page("https://town.example/missing", b"<html><body><p>Not found</p></body></html>", status="404 Not Found"),
        Page("https://town.example/moved", b"", status="301 Moved Permanently"),
        Page("https://town.example/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(200), "image/png"),
        Page("https://town.example/blank", b"<html><head><title></title></head><body>  </body></html>"),
    ]


def _offsets(path) -> list[int]:
    """Each record's offset, by warcio (an oracle independent of the reader under test)."""
    with open(path, "rb") as f:
        it = ArchiveIterator(f)
        return [it.get_record_offset() for _ in it]


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    d = tmp_path_factory.mktemp("crawl")
    write_warc(d / "crawl.warc.gz", _pages())
    write_warc(d / "plain.warc", _pages("plain")[:3], compress=False, requests=False)
    write_warc(d / "cut.warc.gz", _pages("cut")[:4], requests=False)
    data = (d / "cut.warc.gz").read_bytes()
    cut_at = _offsets(d / "cut.warc.gz")[-1]  # the last response record's member
    (d / "cut.warc.gz").write_bytes(data[:cut_at + 120])
    write_warc(d / "bad.warc.gz", _pages("bad")[:4], requests=False)
    data = bytearray((d / "bad.warc.gz").read_bytes())
    bad_at = _offsets(d / "bad.warc.gz")[2]  # the second response record's member
    data[bad_at + 40:bad_at + 80] = bytes(40)
    (d / "bad.warc.gz").write_bytes(bytes(data))
    return d, cut_at, bad_at


def _run(folder, out, split_bytes: int) -> dict:
    cfg = synthetic_config()
    cfg.input.split_bytes = split_bytes
    cfg.tokenizer.vocab_size = 400
    cfg.shards.store_text, cfg.shards.num_shards = True, 2  # the default layout: token blocks
    return run(f"{folder}/*.warc*", str(out), cfg, report=False)


@pytest.fixture(scope="module")
def whole(crawl, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    return out, _run(crawl[0], out, 16_000_000)


def _documents(out) -> dict[str, dict]:
    return {d["json"]["id"]: d for info in Manifest.load(str(out)).shards for d in iter_documents(str(out / info.name))}


def test_pages_become_documents_with_url_date_and_language(whole):
    out, stats = whole
    docs = _documents(out)
    news = docs["crawl.warc.gz/https://town.example/news/3"]
    assert news["json"]["url"] == "https://town.example/news/3" and news["json"]["date"] == "2024-03-04T12:00:00Z"
    assert news["json"]["language"] == "en" and news["json"]["source"] == "crawl"
    assert news["txt"].startswith("News 3\n\nStory 3 of the crawl file.") and PARAGRAPHS[3] in news["txt"]
    assert "Copyright" not in news["txt"] and "Home" not in news["txt"]  # main content only
    assert RUSSIAN in docs["crawl.warc.gz/https://ru.example/"]["txt"]  # charset of the HTTP header
    assert docs["crawl.warc.gz/https://ru.example/"]["json"]["language"] == "ru"
    assert JAPANESE in docs["crawl.warc.gz/https://jp.example/"]["txt"]  # charset of the meta tag
    assert docs["crawl.warc.gz/https://jp.example/"]["json"]["language"] == "ja"
    assert FRENCH in docs["crawl.warc.gz/https://fr.example/"]["txt"]  # iso-8859-1 read as windows-1252
    broken = docs["crawl.warc.gz/https://town.example/broken"]["txt"]
    assert "The river ran past the old stone walls of the town" in broken and "for three hundred years" in broken
    assert "Every morning the baker opened his shop before dawn" in broken and "<" not in broken
    assert docs["plain.warc/https://town.example/news/1"]["json"]["source"] == "plain"


def test_records_that_are_no_pages_are_counted_by_reason_and_the_ledger_is_exact(whole):
    _, stats = whole
    crawl = stats["sources"]["crawl"]
    assert crawl["input_records"] == 38  # response records only
    assert crawl["filtered"] == {"http_301": 1, "http_404": 1, "no_text": 1, "not_html": 1}
    assert crawl["kept"] == 34 and crawl["dead_letter"] == 0 and crawl["balanced"]
    assert crawl["skipped_records"] == {"request": 38, "warcinfo": 1}  # beside the ledger, not input records
    assert stats["total"]["skipped_records"] == {"request": 38, "warcinfo": 4}
    assert stats["sources"]["plain"]["input_records"] == 3 and stats["sources"]["plain"]["kept"] == 3
    report = report_text(stats)
    assert "http_404" in report and "WARC records that hold no document" in report and "request" in report
    assert stats["total"]["balanced"] and all(e["balanced"] for e in stats["sources"].values())


def test_broken_gzip_members_are_dead_letters_naming_file_and_offset(crawl, whole):
    _, cut_at, bad_at = crawl
    out, stats = whole
    letters = {(r["file"].rsplit("/", 1)[-1], r["offset"]): r
               for p in (out / "dead_letter").iterdir() for r in map(json.loads, p.read_text().splitlines())}
    cut = letters["cut.warc.gz", cut_at]
    assert cut["reason"] == "unreadable_file" and "truncated" in cut["error"] and f"{cut_at:,}" in cut["error"]
    bad = letters["bad.warc.gz", bad_at]
    assert bad["reason"] == "unreadable_file" and "corrupt" in bad["error"] and f"{bad_at:,}" in bad["error"]
    assert len(letters) == 2
    assert stats["sources"]["cut"]["input_records"] == 4 and stats["sources"]["cut"]["dead_letter"] == 1
    assert stats["sources"]["cut"]["kept"] == 3
    # the job read on after the corrupt member: the records before and after it are kept
    assert stats["sources"]["bad"]["input_records"] == 4 and stats["sources"]["bad"]["kept"] == 3


def test_byte_range_splits_give_identical_shards(crawl, whole, tmp_path):
    out, stats = whole
    split = tmp_path / "split"
    split_stats = _run(crawl[0], split, 1500)
    for key in ("input_records", "kept", "filtered", "dead_letter", "skipped_records"):
        assert split_stats["total"][key] == stats["total"][key]
    manifest = Manifest.load(str(out))
    assert [s.sha256 for s in Manifest.load(str(split)).shards] == [s.sha256 for s in manifest.shards]
    for info in manifest.shards:
        assert (split / info.name).read_bytes() == (out / info.name).read_bytes()


def test_charsets_follow_header_then_meta_then_utf8_then_detection():
    page = "<p>Ça coûte 5 €</p>"
    assert decode_html(page.encode("cp1252"), "windows-1252") == page
    assert decode_html(page.encode("cp1252"), "latin1") == page  # as browsers read ISO-8859-1
    meta = '<meta http-equiv="Content-Type" content="text/html; charset=koi8-r"><p>Город</p>'
    assert decode_html(meta.encode("koi8-r")) == meta
    assert decode_html("<p>naïve</p>".encode("utf-8"), "no-such-charset") == "<p>naïve</p>"
    assert decode_html(b"\xc3\x28<p>\x81\x8d</p>", "utf-8").startswith("\ufffd(")  # never raises
    assert decode_html(codecs.BOM_UTF16_LE + "<p>Grüße</p>".encode("utf-16-le"), "iso-8859-1") == "<p>Grüße</p>"
    utf8 = '<meta charset="utf-16"><p>Grüße</p>'
    assert decode_html(utf8.encode("utf-8")) == utf8  # a meta tag readable as ASCII is not UTF-16


def _units(path, **cfg) -> list:
    with open(path, "rb") as f:
        return list(warc_units(f, str(path), 0, -1, InputConfig(**cfg)))


def test_a_member_without_a_valid_record_is_one_dead_unit_and_reading_goes_on(tmp_path):
    write_warc(tmp_path / "ok.warc.gz", _pages()[:2], requests=False)
    garbage = gzip.compress(b"<html>a gzip member that holds no WARC record</html>")
    (tmp_path / "mixed.warc.gz").write_bytes(garbage + (tmp_path / "ok.warc.gz").read_bytes())
    units = _units(tmp_path / "mixed.warc.gz")
    assert [u.fmt for u in units] == ["unreadable", "warc_other", "warc", "warc"]
    assert units[0].raw.startswith(b"gzip member at byte 0 holds no valid WARC record: ")
    assert units[1].offset == len(garbage)


def test_a_file_gzipped_whole_is_one_member_of_many_records(tmp_path):
    write_warc(tmp_path / "plain.warc", _pages()[:3], compress=False)
    (tmp_path / "whole.warc.gz").write_bytes(gzip.compress((tmp_path / "plain.warc").read_bytes()))
    units = _units(tmp_path / "whole.warc.gz")
    assert [u.raw.url for u in units if u.fmt == "warc"] == [p.url for p in _pages()[:3]]
    (large,) = _units(tmp_path / "whole.warc.gz", max_record_bytes=1000)
    assert large.fmt == "too_large" and large.size == (tmp_path / "plain.warc").stat().st_size
    assert large.raw == (tmp_path / "plain.warc").read_bytes()[:200]


def test_extractor_options_from_the_config():
    html = article("Tables", [PARAGRAPHS[0]]).replace("</article>", "<table><tr><td>cell text of a table</td></tr>"
                                                                      "</table></article>")
    assert "cell text of a table" in HtmlExtractor(WarcConfig()).text(html)
    assert "cell text of a table" not in HtmlExtractor(WarcConfig(include_tables=False)).text(html)
    text = HtmlExtractor(WarcConfig(extractor="trafilatura")).text(article("News", PARAGRAPHS), "https://a.example/")
    assert PARAGRAPHS[0] in text and PARAGRAPHS[4] in text and "Copyright" not in text
    assert WarcPages(InputConfig(warc=WarcConfig(language=False))).language(PARAGRAPHS[0]) == ""


def test_the_documents_layout_keeps_url_date_and_language_in_the_sample_json():
    doc = Doc("c.warc.gz/https://a.example/", "text", "c", DocMeta("https://a.example/", "2024-03-01T12:00:00Z", "en"))
    meta = json.loads(encode_sample((doc, np.arange(3, dtype=np.uint16)), layout="documents").fields["json"])
    assert meta == {"id": doc.id, "source": "c", "n_tokens": 3, "n_bytes": 4, "url": "https://a.example/",
                    "date": "2024-03-01T12:00:00Z", "language": "en"}


def test_warc_files_without_a_response_record_are_said_to_hold_none():
    one = str(no_records_error("in/*", ["in/a.warc.gz"], PipelineConfig()))
    assert "(a.warc.gz): it holds no WARC response record, so" in one
    mixed = str(no_records_error("in/*", ["in/a.warc.gz", "in/b.jsonl"], PipelineConfig()))
    assert "they hold only blank lines or whitespace, or decompress to nothing (JSONL, text) or no WARC response " \
           "record (WARC)" in mixed


def test_every_split_count_reads_every_member_once_broken_headers_included(tmp_path):
    path = tmp_path / "broken.warc.gz"
    write_warc(path, _pages()[:8])
    data, offsets = bytearray(path.read_bytes()), _offsets(path)
    data[offsets[5] + 10:offsets[5] + 30] = bytes(20)  # the deflate header of a member: no boundary there
    data[offsets[9] + 60:offsets[9] + 90] = bytes(30)  # inside a member: corrupt, still a boundary
    path.write_bytes(bytes(data[:-50]))  # and the last member truncated
    whole = _units(path)
    assert [u.fmt for u in whole].count("unreadable") == 3
    cfg = InputConfig()
    for split_bytes in range(150, len(data), 137):
        with open(path, "rb") as f:
            units = [u for start, end in warc_ranges(str(path), len(data) - 50, split_bytes)
                     for u in warc_units(f, str(path), start, end, cfg)]
        assert units == whole, split_bytes


def test_a_dask_cluster_reading_byte_ranges_writes_the_same_shards(crawl, whole, tmp_path):
    pytest.importorskip("distributed")
    out, stats = whole
    cfg = synthetic_config()
    cfg.input.split_bytes, cfg.tokenizer.vocab_size = 1500, 400
    cfg.shards.store_text, cfg.shards.num_shards = True, 2
    engine = start_dask(tmp_path / "logs", workers=2, env=child_env())
    try:
        dask_stats = run(f"{crawl[0]}/*.warc*", str(tmp_path / "out"), cfg,
                         ["--runner=DaskRunner", f"--dask_client_address={engine.address}"], report=False)
    finally:
        engine.stop()
    assert dask_stats["total"] == stats["total"] and dask_stats["sources"] == stats["sources"]
    for info in Manifest.load(str(out)).shards:
        assert (tmp_path / "out" / info.name).read_bytes() == (out / info.name).read_bytes()


def test_an_uncompressed_file_cut_anywhere_in_its_last_record_ends_in_a_dead_unit_naming_it(tmp_path):
    """FastWARC reads a cut-off record of a plain .warc as far as it goes; it was kept as a short page."""
    write_warc(tmp_path / "whole.warc", _pages()[:2], compress=False)
    data = (tmp_path / "whole.warc").read_bytes()
    whole = [u._replace(path=str(tmp_path / "cut.warc")) for u in _units(tmp_path / "whole.warc")]
    last = whole[-1].offset
    assert whole[-1].fmt == "warc" and all(u.fmt != "unreadable" for u in whole)
    cut = tmp_path / "cut.warc"
    for end in range(last + 1, len(data) - 4):  # the last 4 bytes are the record's closing blank lines
        cut.write_bytes(data[:end])
        try:
            units = _units(cut)
        except OSError:  # FastWARC refused the header: the reader makes that the split's dead letter
            continue
        assert units[:-1] == whole[:-1], end
        assert units[-1].fmt == "unreadable" and units[-1].offset == last, end
        assert f"WARC record at byte {last:,}".encode() in units[-1].raw and b"truncated" in units[-1].raw
    for end in range(len(data) - 4, len(data) + 1):
        cut.write_bytes(data[:end])
        assert _units(cut) == whole
