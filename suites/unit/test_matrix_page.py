"""The HTML matrix opened in a real headless browser (Chromium from Debian's packages): every cell of
matrix.json is on the page, a cell clicked (through its link, which clicks the cell's summary in the page)
shows its evidence, and a screenshot is kept."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pytest

from harness.reporting import matrix_page
from harness.paths import REPO_ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (.ci/run installs Debian's)")


def _browser(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--virtual-time-budget=3000", *args, url], capture_output=True, text=True, timeout=120)


def test_the_page_shows_every_cell_and_a_cells_evidence_opens(tmp_path):
    m = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    page = tmp_path / "matrix.html"
    page.write_text(matrix_page.to_html(m))
    key, ver = "twophase", m["columns"][-1]["version"]
    cell = m["rows"][key][ver]
    dom = _browser(f"file://{page}#{key}@{ver}", "--dump-dom").stdout
    cells = re.findall(r"<td class=\"cell\"", dom)
    assert len(cells) == len(m["rows"]) * len(m["columns"]), "a cell of matrix.json is missing from the page"
    opened = re.search(rf'<td class="cell" id="{re.escape(key)}@{re.escape(ver)}"[^>]*><details open="">(.*?)</details>',
                       dom, re.S)
    assert opened, "clicking the cell (its link) did not open its evidence"
    evidence = html.unescape(re.sub(r"<[^>]+>", "", opened.group(1)))
    assert cell["outcome"] in evidence and (cell.get("shim") or cell.get("reason") or "")[:40] in evidence
    assert len(re.findall(r"<details open", dom)) == 1, "only the linked cell is open"
    for v in m["columns"]:
        assert f"vLLM {v['version']}</b>:" in dom, f"no verdict line for {v['version']}"


def test_screenshot_of_the_page():
    shot = REPO_ROOT / "reports" / "matrix.png"
    out = _browser(f"file://{REPO_ROOT / 'reports' / 'matrix.html'}", f"--screenshot={shot}", "--window-size=1600,1000")
    assert shot.is_file() and shot.stat().st_size > 10_000, out.stderr[-1000:]
