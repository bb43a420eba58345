"""WARC files for tests and benchmarks, written with warcio: real-looking HTML pages and the records
a crawl also holds (requests, metadata, images, errors)."""
from __future__ import annotations

import io
from typing import NamedTuple

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

PARAGRAPHS = [
    "The river ran past the old stone walls of the town, where the mill had stood for three hundred years.",
    "Every morning the baker opened his shop before dawn, and the smell of bread drifted down the lane.",
    "In the spring the meadows filled with flowers, and children walked to school along the hedgerows.",
    "The council met on Tuesdays to discuss the roads, the bridge and the price of water from the hills.",
    "A new library opened last year with a reading room, a garden and a collection of maps of the valley.",
]


class Page(NamedTuple):
    """One response record to write.

    Attributes:
        url: ``WARC-Target-URI``.
        body: the HTTP payload.
        content_type: the HTTP ``Content-Type`` header (``None``: no header).
        status: the HTTP status line.
        date: ``WARC-Date``.
    """

    url: str
    body: bytes
    content_type: str | None = "text/html; charset=utf-8"
    status: str = "200 OK"
    date: str = "2024-03-01T12:00:00Z"


def article(title: str, paragraphs: list[str], head: str = "") -> str:
    """A page with a menu, an article and a footer, as a site template writes it."""
    body = "".join(f"<p>{p}</p>\n" for p in paragraphs)
    return (f"<!DOCTYPE html>\n<html><head>{head}<title>{title}</title></head><body>\n"
            f"<nav><ul><li><a href='/'>Home</a></li><li><a href='/news'>News</a></li></ul></nav>\n"
            f"<main><article><h1>{title}</h1>\n{body}</article></main>\n"
            f"<footer>Copyright 2024 The Town Paper. All rights reserved.</footer></body></html>\n")


def write_warc(path, pages: list[Page], compress: bool = True, requests: bool = True) -> None:
    """Write a WARC file: a ``warcinfo`` record, then per page a response record (and a request
    record before it when ``requests``), one gzip member per record when ``compress``."""
    with open(path, "wb") as f:
        writer = WARCWriter(f, gzip=compress)
        writer.write_record(writer.create_warcinfo_record(str(path).rsplit("/", 1)[-1], {"software": "tests"}))
        for page in pages:
            if requests:
                req = StatusAndHeaders("GET / HTTP/1.1", [("Host", "example.org")], is_http_request=True)
                writer.write_record(writer.create_warc_record(page.url, "request", payload=io.BytesIO(b""),
                                                              http_headers=req,
                                                              warc_headers_dict={"WARC-Date": page.date}))
            headers = [("Content-Type", page.content_type)] if page.content_type is not None else []
            http = StatusAndHeaders(page.status, headers, protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(page.url, "response", payload=io.BytesIO(page.body),
                                                          http_headers=http,
                                                          warc_headers_dict={"WARC-Date": page.date}))
