"""colaflow's file server (:mod:`cache.tools.serve`) made to misbehave on purpose, with a request log.

``Faults`` scripts HTTP 500s, connections dropped mid-body, truncated or corrupted bodies,
stalls, ignored Range headers, added latency and a bandwidth cap, and can stand in for
signed-URL storage (``Faults.require_query``); ``server.gets(name)`` lists the GETs served.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import urlsplit

from cache.tools.serve import FileServer, RangeHandler
from cache.tools.serve import serve_directory as _serve_directory

FAULTS = ("500", "drop", "short", "corrupt", "stall", "ignore-range")


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


class FaultHandler(RangeHandler):
    """:class:`cache.tools.serve.RangeHandler` that applies the server's :class:`Faults` and logs each response."""

    def admit(self, name: str, head: bool) -> bool:
        """Refuse a wrong signature (403) or a scripted ``500``; wait the latency and any ``stall``."""
        server, self.fault = self.server, None
        self.query = urlsplit(self.path).query
        if server.faults.require_query is not None and self.query != server.faults.require_query:
            server.record(Request(self.command, name, self.headers.get("Range"), 403, 0, self.query))
            self.send_error(HTTPStatus.FORBIDDEN, "signature missing or expired")
            return False
        self.fault = None if head else server.faults.take(name)
        if server.faults.latency_s:
            time.sleep(server.faults.latency_s)
        if self.fault == "stall":
            time.sleep(server.faults.stall_s)
        if self.fault == "500":
            server.record(Request(self.command, name, self.headers.get("Range"), 500, 0))
            self.send_error(HTTPStatus.INTERNAL_SERVER_ERROR, "injected fault")
            return False
        return True

    def range_header(self) -> str | None:
        """The ``Range`` header, unless the fault is ``ignore-range``."""
        return None if self.fault == "ignore-range" else self.headers.get("Range")

    def answered(self, name: str, status: int, length: int) -> None:
        """Log the response before its body goes out (a client may act on it before this thread resumes)."""
        self.request_log = Request(self.command, name, self.headers.get("Range"), status, 0, self.query)
        self.server.record(self.request_log)

    def send_file(self, path: str, name: str, start: int, end: int, size: int, status: int, head: bool) -> None:
        """The file's bytes with the scripted fault: ``short``, ``corrupt``, ``drop``, and the bandwidth cap."""
        length = end - start
        if self.fault == "short":
            length //= 2
        flip = start + length // 2 if self.fault == "corrupt" and length else None
        self.send_headers(start, end, size, status, length)
        self.answered(name, status, length)
        if head:
            return
        with open(path, "rb") as f:
            f.seek(start)
            self._send_body(f, length // 2 if self.fault == "drop" else length, flip, self.server.faults.rate_bytes_per_s)
        if self.fault == "drop":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _send_body(self, f, length: int, flip: int | None, rate: float | None) -> None:
        """Copy ``length`` bytes from ``f`` (flipping the byte at absolute offset ``flip``), at most
        ``rate`` bytes/s, counting them in the logged request's ``sent``."""
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
                self.request_log.sent = sent
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class FaultServer(FileServer):
    """:class:`cache.tools.serve.FileServer` with a request log (``requests``) and a ``faults`` plan."""

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


def serve_directory(directory: str, host: str = "127.0.0.1", port: int = 0,
                    faults: Faults | None = None) -> tuple[FaultServer, str]:
    """Serve ``directory`` from a daemon thread with ``faults`` (none by default) and a request log.

    Returns ``(server, base_url)`` as :func:`cache.tools.serve.serve_directory`; stop with ``server.stop()``.
    """
    return _serve_directory(directory, host, port, FaultHandler, FaultServer, faults=faults)
