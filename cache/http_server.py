"""A small HTTP/1.1 file server with Range support, for tests, benchmarks and the demo.

Built on ``http.server`` (``ThreadingHTTPServer`` + ``SimpleHTTPRequestHandler``) with single
byte-range requests answered ``206 Partial Content`` (RFC 9110 §14). For tests it can also
misbehave on purpose (``Faults``): HTTP 500s, connections dropped mid-body, truncated or
corrupted bodies, stalls, ignored Range headers, plus added latency and a bandwidth cap; and
it can stand in for signed-URL storage (``Faults.require_query``).
Not meant for untrusted networks.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

FAULTS = ("500", "drop", "short", "corrupt", "stall", "ignore-range")
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass
class Faults:
    """Scripted misbehaviour, consumed one fault per GET of a file.

    Attributes:
        plan: ``{file name relative to the served folder: [fault, ...]}``; faults are ``500``
            (HTTP 500), ``drop`` (send half the body, then close the connection), ``short``
            (a complete response holding only the first half of the file), ``corrupt`` (flip one
            byte), ``stall`` (wait ``stall_s`` before answering), ``ignore-range`` (answer 200 with
            the whole file even to a Range request).
        latency_s: delay before every response, seconds.
        rate_bytes_per_s: bandwidth cap per response, bytes/second (``None`` = unlimited).
        stall_s: how long ``stall`` waits, seconds.
        require_query: if set, a request whose URL query differs (e.g. not ``token=abc``) gets
            HTTP 403, like signed-URL storage with an expired or missing signature.
    """

    plan: dict[str, list[str]] = field(default_factory=dict)
    latency_s: float = 0.0
    rate_bytes_per_s: float | None = None
    stall_s: float = 5.0
    require_query: str | None = None

    def take(self, name: str) -> str | None:
        """Pop the next scripted fault for file ``name`` (``None`` when none is left)."""
        queue = self.plan.get(name)
        return queue.pop(0) if queue else None


@dataclass
class Request:
    """One served request, for assertions: method, file name, Range header, status, body bytes sent,
    URL query (without ``?``)."""

    method: str
    name: str
    range: str | None
    status: int
    sent: int
    query: str = ""


class _Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes; avoid 40 ms delayed-ACK stalls

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return super().do_HEAD() if head else super().do_GET()
        server = self.server
        name = os.path.relpath(path, self.directory).replace(os.sep, "/")
        query = urlsplit(self.path).query
        if server.faults.require_query is not None and query != server.faults.require_query:
            server.record(Request(self.command, name, self.headers.get("Range"), 403, 0, query))
            self.send_error(HTTPStatus.FORBIDDEN, "signature missing or expired")
            return
        fault = None if head else server.faults.take(name)
        if server.faults.latency_s:
            time.sleep(server.faults.latency_s)
        if fault == "stall":
            time.sleep(server.faults.stall_s)
        if fault == "500":
            server.record(Request(self.command, name, self.headers.get("Range"), 500, 0))
            self.send_error(HTTPStatus.INTERNAL_SERVER_ERROR, "injected fault")
            return
        size = os.path.getsize(path)
        start, end, status = 0, size, 200
        rng = self.headers.get("Range")
        m = _RANGE_RE.match(rng.strip()) if rng and fault != "ignore-range" else None
        if m and (m.group(1) or m.group(2)):
            if m.group(1):
                start = int(m.group(1))
                end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            else:  # suffix range: the last N bytes
                start = max(0, size - int(m.group(2)))
            if start >= size or start >= end:
                server.record(Request(self.command, name, rng, 416, 0))
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        length = end - start
        if fault == "short":
            length //= 2
        flip = start + length // 2 if fault == "corrupt" and length else None
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(length))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        # logged before the body goes out: a client may act on the response before this thread resumes
        req = Request(self.command, name, rng, status, 0, query)
        server.record(req)
        if not head:
            limit = length // 2 if fault == "drop" else length
            with open(path, "rb") as f:
                f.seek(start)
                self._send_body(f, limit, flip, server.faults.rate_bytes_per_s, req)
            if fault == "drop":
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _send_body(self, f, length: int, flip: int | None, rate: float | None, req: Request) -> None:
        """Copy ``length`` bytes from ``f`` (flipping the byte at absolute offset ``flip``), at most
        ``rate`` bytes/s, counting them in ``req.sent``."""
        sent, t0 = 0, time.monotonic()
        try:
            while sent < length:
                pos = f.tell()
                chunk = f.read(min((64 if rate else 1024) << 10, length - sent))
                if not chunk:
                    break
                if flip is not None and pos <= flip < pos + len(chunk):
                    i = flip - pos
                    chunk = chunk[:i] + bytes([chunk[i] ^ 0x01]) + chunk[i + 1:]
                if rate:
                    ahead = sent / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
                self.wfile.write(chunk)
                sent += len(chunk)
                req.sent = sent
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class FileServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that keeps a request log (``requests``) and a ``faults`` plan."""

    daemon_threads = True

    def __init__(self, address, handler, faults: Faults | None = None):
        super().__init__(address, handler)
        self.faults = faults or Faults()
        self.requests: list[Request] = []
        self._log_lock = threading.Lock()

    def record(self, req: Request) -> None:
        """Log one served request (thread-safe; read back with :meth:`gets`)."""
        with self._log_lock:
            self.requests.append(req)

    def gets(self, name: str | None = None) -> list[Request]:
        """Logged GET requests (of ``name`` if given)."""
        with self._log_lock:
            return [r for r in self.requests if r.method == "GET" and (name is None or r.name == name)]

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.shutdown()
        self.server_close()


def serve_directory(directory: str, host: str = "127.0.0.1", port: int = 0,
                    faults: Faults | None = None) -> tuple[FileServer, str]:
    """Serve ``directory`` over HTTP from a daemon thread.

    Args:
        directory: folder to serve.
        host: interface to bind (default loopback only).
        port: TCP port; 0 picks a free one.
        faults: optional misbehaviour plan (tests).

    Returns:
        ``(server, base_url)``; ``base_url`` has no trailing slash. Stop with ``server.stop()``.
    """
    handler = partial(_Handler, directory=os.path.abspath(directory))
    server = FileServer((host, port), handler, faults)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="colaflow-http",
                     daemon=True).start()
    bound_host, bound_port = server.server_address[:2]
    return server, f"http://{bound_host}:{bound_port}"
