"""The live view in a real headless browser: the system's Chromium (Debian's `chromium` package)
driven by playwright (`pip install playwright`; never `playwright install`, which downloads its own
browsers). The page must run its script, draw the tree and the charts, show a hostile kernel source
as text (no dialog opens), pick up a node written while it is open, and look like something: a
screenshot with more than one colour in it.

Set KERNELEVOLVE_SCREENSHOT=path.png to keep the screenshot."""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelevolve.store import Workspace

from .test_serve import BETTER, EVIL, HOSTILE, Live, add_node, serving

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed: pip install playwright"),
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH: apt-get install -y chromium"),
]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with serving(tmp_path / "ws") as served:
        yield served


# Pixel statistics of a PNG, computed by the browser itself (no imaging library needed here).
STATS_JS = """async (data) => {
  const img = new Image();
  img.src = "data:image/png;base64," + data;
  await img.decode();
  const c = document.createElement("canvas");
  c.width = img.width; c.height = img.height;
  const g = c.getContext("2d");
  g.drawImage(img, 0, 0);
  const px = g.getImageData(0, 0, c.width, c.height).data;
  let n = 0, sum = 0, sq = 0;
  const colours = new Set();
  for (let i = 0; i < px.length; i += 4 * 7) {
    const v = 0.299 * px[i] + 0.587 * px[i + 1] + 0.114 * px[i + 2];
    n++; sum += v; sq += v * v;
    if (colours.size < 64) colours.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
  }
  const mean = sum / n;
  return { width: c.width, height: c.height, variance: sq / n - mean * mean, colours: colours.size };
}"""


def test_live_view_renders_updates_and_escapes(live: Live, tmp_path: Path) -> None:
    assert sync_playwright is not None and CHROMIUM is not None
    dialogs: list[str] = []
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{live.server.url}#/run/{live.run_id}/node/4")

            # The script ran: the tree, the curve and the node's source are in the page.
            page.wait_for_selector("#tree svg circle", timeout=15_000)
            page.wait_for_selector("#curve svg path", timeout=15_000)
            page.wait_for_selector("#source", timeout=15_000)
            assert page.locator("#tree svg circle").count() >= 5
            body = page.inner_text("body")
            assert live.run_id in body and "double" in body and "Best path: 1 → 2 → 4" in body

            # The hostile source is shown as the text it is; nothing it holds ran or became markup.
            assert page.text_content("#source") == EVIL and HOSTILE in page.inner_text("#source")
            assert page.locator("script").count() == 1  # the page's own live.js only
            assert page.locator("#node img").count() == 0 and page.locator("#run img").count() == 0
            assert "return x + x  # fused" in page.inner_text("#diff")

            # A node written by a search while the page is open shows up by itself (polling).
            with Workspace.open(live.root) as ws:
                add_node(ws, live.run_id, 4, BETTER.replace("fused", "fused twice"), 2.6)
            page.wait_for_selector('tr[data-node="6"]', timeout=15_000)
            page.wait_for_function(
                "document.querySelector('#curve').textContent.includes('best 2.60x')", timeout=15_000
            )

            shot = page.screenshot(full_page=True)
            stats = page.evaluate(STATS_JS, base64.b64encode(shot).decode())
            keep = os.environ.get("KERNELEVOLVE_SCREENSHOT")
            (Path(keep) if keep else tmp_path / "live.png").write_bytes(shot)

            # The bench page draws its charts too.
            page.goto(f"{live.server.url}#/bench/{live.bench_id}")
            page.wait_for_selector("#chart-speedup svg rect", timeout=15_000)
            assert "double" in page.inner_text("main")
        finally:
            browser.close()
    assert not dialogs, f"a dialog opened: {dialogs}"
    assert not errors, f"the page's script failed: {errors}"
    assert stats["width"] >= 1000 and stats["height"] >= 800
    assert stats["variance"] > 100 and stats["colours"] >= 8, stats  # not a blank page
