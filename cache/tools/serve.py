"""A folder served over HTTP/1.1 with single byte-range requests (``python -m cache serve``, the demo).

Built on ``http.server``: a ``GET`` or ``HEAD`` of a file answers ``200``, or ``206 Partial
Content`` for one ``Range: bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` (RFC 9110 §14), or ``416``
when the range lies outside the file. Folders and missing files are answered as
``SimpleHTTPRequestHandler`` does. Not meant for untrusted networks.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
CHUNK_BYTES = 1 << 20  # body bytes per write


def byte_range(header: str | None, size: int) -> tuple[int, int, int]:
    """``(start, end, status)`` of the bytes ``[start, end)`` to send for a ``Range`` header.

    Args:
        header: the request's ``Range`` value, or ``None``.
        size: the file's size in bytes.
    Returns:
        ``(0, size, 200)`` without a usable single range; ``(start, end, 206)`` for one; ``(0, 0, 416)``
        when it starts at or after the end of the file.
    """
    m = _RANGE_RE.match(header.strip()) if header else None
    if not m or not (m.group(1) or m.group(2)):
        return 0, size, 200
    if m.group(1):
        start = int(m.group(1))
        end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    else:  # suffix range: the last N bytes
        start, end = max(0, size - int(m.group(2))), size
    return (0, 0, 416) if start >= size or start >= end else (start, end, 206)


class RangeHandler(SimpleHTTPRequestHandler):
    """Serves files of one folder with single byte ranges (see the module docstring).

    Subclasses may refine :meth:`admit` (refuse a request), :meth:`range_header` and
    :meth:`send_file` (how the body goes out).
    """

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes; avoid 40 ms delayed-ACK stalls

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        """Request lines go to this module's logger at DEBUG, not to stderr."""
        log.debug("%s " + format, self.address_string(), *args)

    def do_HEAD(self):
        """Headers of a file (as for ``GET``, without the body)."""
        self._serve(head=True)

    def do_GET(self):
        """A file, whole or one byte range."""
        self._serve(head=False)

    def admit(self, name: str, head: bool) -> bool:
        """Whether to answer the request for file ``name`` (relative to the folder); a refusal has
        already sent its response. Always ``True`` here."""
        return True

    def range_header(self) -> str | None:
        """The ``Range`` header to honour (``None``: send the whole file)."""
        return self.headers.get("Range")

    def _serve(self, head: bool) -> None:
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return super().do_HEAD() if head else super().do_GET()
        name = os.path.relpath(path, self.directory).replace(os.sep, "/")
        if not self.admit(name, head):
            return
        size = os.path.getsize(path)
        start, end, status = byte_range(self.range_header(), size)
        if status == 416:
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.answered(name, status, 0)
            return
        self.send_file(path, name, start, end, size, status, head)

    def answered(self, name: str, status: int, length: int) -> None:
        """Called once the headers of a response are out (``length``: body bytes announced); nothing here."""

    def send_headers(self, start: int, end: int, size: int, status: int, length: int) -> None:
        """Status line and headers of a file response of ``length`` body bytes."""
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(length))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()

    def send_file(self, path: str, name: str, start: int, end: int, size: int, status: int, head: bool) -> None:
        """Send bytes ``[start, end)`` of ``path`` with ``status`` (200 or 206)."""
        self.send_headers(start, end, size, status, end - start)
        self.answered(name, status, end - start)
        if head:
            return
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start
            try:
                while left > 0 and (chunk := f.read(min(CHUNK_BYTES, left))):
                    self.wfile.write(chunk)
                    left -= len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True


class FileServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` whose threads never keep the process alive; :meth:`stop` ends it."""

    daemon_threads = True

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.shutdown()
        self.server_close()


def serve_directory(directory: str, host: str = "127.0.0.1", port: int = 0, handler=RangeHandler,
                    server_class=FileServer, **server_args) -> tuple[FileServer, str]:
    """Serve ``directory`` over HTTP from a daemon thread.

    Args:
        directory: folder to serve.
        host: interface to bind (default loopback only).
        port: TCP port; 0 picks a free one.
        handler, server_class, server_args: the request handler and server (subclasses of
            :class:`RangeHandler` and :class:`FileServer`) and the server's extra arguments.
    Returns:
        ``(server, base_url)``; ``base_url`` has no trailing slash. Stop with ``server.stop()``.
    Raises:
        OSError: the address cannot be bound.
    """
    server = server_class((host, port), partial(handler, directory=os.path.abspath(directory)), **server_args)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="colaflow-http",
                     daemon=True).start()
    bound_host, bound_port = server.server_address[:2]
    return server, f"http://{bound_host}:{bound_port}"
