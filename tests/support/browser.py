"""Headless Chromium (Debian's ``chromium``) for tests: screenshots of HTML pages and which of their
images the browser loaded. Tests using it skip when no Chromium is installed (``.ci/run`` installs it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed "
                                    "(apt-get install chromium; .ci/run installs it)")

# after the page's load event: every <img> with its src and the size the browser decoded
_PROBE = ("<script>window.addEventListener('load', () => document.body.setAttribute('data-images', "
          "JSON.stringify([...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth, "
          "i.naturalHeight]))));</script>")


def _chromium(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                               "--hide-scrollbars", "--no-first-run", f"--user-data-dir={profile}",
                               "--virtual-time-budget=10000", *args], capture_output=True, text=True,
                              timeout=timeout)


def screenshot(html_path: str, png_path: str, width: int = 1400, height: int = 2000) -> None:
    """Render ``html_path`` at ``width`` x ``height`` CSS pixels into ``png_path``."""
    proc = _chromium([f"--window-size={width},{height}", f"--screenshot={png_path}",
                      "file://" + os.path.abspath(html_path)])
    assert os.path.exists(png_path), proc.stderr[-3000:]


class _Body(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images = None

    def handle_starttag(self, tag, attrs):
        if tag == "body" and dict(attrs).get("data-images"):
            self.images = json.loads(dict(attrs)["data-images"])


def loaded_images(html_path: str) -> list[tuple[str, bool, int, int]]:
    """``(src, complete, natural width, natural height)`` of every ``<img>`` of the page as Chromium
    loaded it (width 0 = the image did not load). A copy of the page with a probe script beside it is used."""
    with open(html_path, encoding="utf-8") as f:
        page = f.read()
    probe = os.path.join(os.path.dirname(os.path.abspath(html_path)), ".probe-" + os.path.basename(html_path))
    with open(probe, "w", encoding="utf-8") as f:
        f.write(page.replace("</body>", _PROBE + "</body>"))
    try:
        proc = _chromium(["--dump-dom", "file://" + probe])
    finally:
        os.remove(probe)
    parser = _Body()
    parser.feed(proc.stdout)
    assert parser.images is not None, proc.stderr[-3000:]
    return [tuple(i) for i in parser.images]


def ink_fraction(png_path: str, background: tuple[int, int, int] = (255, 255, 255)) -> float:
    """Share of pixels of an image that differ from ``background`` (0 = blank)."""
    import numpy as np
    from PIL import Image
    px = np.asarray(Image.open(png_path).convert("RGB"), dtype=np.int16)
    return float((np.abs(px - np.array(background)).sum(axis=-1) > 30).mean())
