"""Shared pytest fixtures (keep small: several test files use these)."""
from __future__ import annotations

import pytest

from cache.http_server import serve_directory


@pytest.fixture
def http_server(tmp_path):
    """A Range-capable HTTP server on 127.0.0.1 serving a fresh folder.

    Yields ``(server, base_url, root)``: put files under ``root`` (a ``pathlib.Path``) and fetch
    ``f"{base_url}/{name}"``. ``server.gets(name)`` lists served GETs; ``server.faults`` scripts
    misbehaviour (see ``cache.http_server.Faults``).
    """
    root = tmp_path / "served"
    root.mkdir()
    server, base_url = serve_directory(str(root))
    try:
        yield server, base_url, root
    finally:
        server.stop()
