"""WARC response records to documents: the HTTP status and media type checked, the HTML decoded by
its declared charset, the text extracted (resiliparse or trafilatura, ``input.warc``) and its
language identified.

A response record that is no page is filtered by reason (:func:`page_reason`): ``http_<status>``
(any status but 200), ``not_http`` (no HTTP status line), ``not_html`` (another media type), and
after extraction ``no_text`` (nothing left). The HTML is decoded by its byte-order mark, else by
the charset of the HTTP ``Content-Type`` header, else of a ``<meta charset>`` or ``<meta
http-equiv>`` tag (UTF-16 there read as UTF-8, as browsers do), else as UTF-8,
else as what ``uchardet`` (resiliparse) detects, labels mapped as browsers map them (WHATWG:
``iso-8859-1`` is windows-1252); undecodable bytes become U+FFFD, so decoding never fails.
"""
from __future__ import annotations

import codecs
import re

from pipelines.config import InputConfig, LanguageConfig, WarcConfig
from pipelines.records import (RAW_EXCERPT_BYTES, DeadLetter, Doc, Filtered, RawUnit, WarcResponse, WebMeta,
                               file_stem, qualify_id)
from pipelines.stages.language import LanguageFilter

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_META_CHARSET = re.compile(rb"""<meta\b[^>]{0,300}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:\-]+)""", re.I)
_SNIFF = (b"<!doctype html", b"<html")


def page_reason(response: WarcResponse) -> str | None:
    """Why a response record is no HTML page, or ``None`` when it is one.

    Args:
        response: the record as read.
    Returns:
        ``not_http``, ``http_<status>`` (any status but 200), ``not_html`` (a media type other than
        HTML; without one, a body that does not start as HTML) or ``None``.
    """
    if response.status == 0:
        return "not_http"
    if response.status != 200:
        return f"http_{response.status}"
    if response.content_type:
        return None if response.content_type in HTML_TYPES else "not_html"
    return None if response.body[:1024].lstrip().lower().startswith(_SNIFF) else "not_html"


def _codec(label: str | bytes | None) -> str | None:
    """Python's codec for a charset label as browsers read it (WHATWG), or ``None`` for an unknown label."""
    if not label:
        return None
    from resiliparse.parse.encoding import map_encoding_to_html5

    name = label.decode("ascii", "replace") if isinstance(label, bytes) else label
    return map_encoding_to_html5(name.strip().lower(), fallback_utf8=False)


def _bom(body: bytes) -> str | None:
    """The codec a byte-order mark at the start of ``body`` names (it overrides any declaration)."""
    boms = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
    return next((codec for bom, codec in boms if body.startswith(bom)), None)


def decode_html(body: bytes, charset: str = "") -> str:
    """The HTML ``body`` as text (see the module docstring for the order of charsets tried).

    Args:
        body: the HTTP payload.
        charset: the ``charset`` of the HTTP ``Content-Type`` header ("" when none).
    Returns:
        the text; never raises (bytes no charset decodes become U+FFFD).
    """
    meta = _META_CHARSET.search(body, 0, 4096)
    in_meta = _codec(meta.group(1) if meta else None)
    if in_meta and in_meta.startswith("utf-16"):  # a tag readable as ASCII is not UTF-16 (WHATWG: UTF-8)
        in_meta = "utf-8"
    declared = [c for c in (_bom(body), _codec(charset), in_meta) if c]
    for codec in dict.fromkeys([*declared, "utf-8"]):
        try:
            return body.decode(codec)
        except UnicodeDecodeError:
            continue
    if not declared:
        from resiliparse.parse.encoding import detect_encoding

        declared = [_codec(detect_encoding(body)) or "cp1252"]
    return body.decode(declared[0], errors="replace")


class HtmlExtractor:
    """HTML text → plain text with the extractor ``input.warc.extractor`` names, as configured there."""

    def __init__(self, cfg: WarcConfig):
        self.cfg = cfg

    def text(self, html: str, url: str = "") -> str:
        """The page's text ("" when the extractor finds none).

        Raises:
            Exception: whatever the extractor raises on markup it cannot parse.
        """
        if self.cfg.extractor == "trafilatura":
            import trafilatura

            return trafilatura.extract(html, url=url or None, include_comments=self.cfg.include_comments,
                                       include_tables=self.cfg.include_tables,
                                       favor_precision=self.cfg.favor == "precision",
                                       favor_recall=self.cfg.favor == "recall") or ""
        from resiliparse.extract.html2text import extract_plain_text

        return extract_plain_text(html, main_content=self.cfg.main_content,
                                  skip_elements=None if self.cfg.include_tables else ["table"])


class WarcPages:
    """``warc`` units → :class:`~pipelines.records.Doc` (text, :class:`~pipelines.records.WebMeta`),
    :class:`~pipelines.records.Filtered` (:func:`page_reason`, ``no_text``) or a
    :class:`~pipelines.records.DeadLetter` (``extract_failed``). The language model loads on first use.

    The document's id is the URL qualified by the file (``crawl/a.warc.gz/https://...``), its
    source the file stem, as for other inputs.
    """

    def __init__(self, cfg: InputConfig):
        self.extractor = HtmlExtractor(cfg.warc)
        self.identify = cfg.warc.language
        self._language: LanguageFilter | None = None

    def language(self, text: str) -> str:
        """ISO 639-1 code of ``text`` (py3langid, its first 2,000 characters); "" when
        ``input.warc.language`` is off."""
        if not self.identify:
            return ""
        if self._language is None:
            self._language = LanguageFilter(LanguageConfig(enabled=True))
        return self._language.classify(text)[0]

    def parse(self, unit: RawUnit, name: str) -> Doc | Filtered | DeadLetter:
        """One ``warc`` unit's document, or why there is none (never raises).

        Args:
            unit: the unit; its ``raw`` a :class:`~pipelines.records.WarcResponse`.
            name: the file's path relative to the input root (qualifies the id).
        Returns:
            the document, the filter reason or the dead letter.
        """
        response, stem = unit.raw, file_stem(unit.path)
        reason = page_reason(response)
        if reason:
            return Filtered(stem, reason)
        try:
            text = self.extractor.text(decode_html(response.body, response.charset), response.url)
        except Exception as e:  # noqa: BLE001 - an extractor's failure on one page must not stop the job
            return DeadLetter(unit.path, 0, "extract_failed", f"{self.extractor.cfg.extractor} failed on "
                              f"{response.url}: {type(e).__name__}: {e}", stem,
                              response.body[:RAW_EXCERPT_BYTES].decode("utf-8", "backslashreplace"), unit.offset)
        if not text.strip():
            return Filtered(stem, "no_text")
        doc_id = qualify_id(name, response.url) if response.url else qualify_id(name, None, f"@{unit.offset:012d}")
        return Doc(doc_id, text, stem, WebMeta(response.url, response.date, self.language(text)))
