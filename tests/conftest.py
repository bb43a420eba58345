"""Shared pytest fixtures (keep small: several test files use these)."""
from __future__ import annotations

import os

import pytest
import torch

# Triton fixes interpreter-or-compiled when a kernel module is first imported; any test may import
# trainer.kernels first, so a CPU-only session runs every Triton kernel through the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

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
