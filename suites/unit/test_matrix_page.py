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
from harness.support.paths import REPO_ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (.ci/run installs Debian's)")


def _browser(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=3000",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_page_shows_every_cell_and_a_cells_evidence_opens(tmp_path):
    m = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    page = tmp_path / "matrix.html"
    page.write_text(matrix_page.to_html(m))
    key, ver = "twophase", m["columns"][-1]["version"]
    cell = m["rows"][key][ver]
    dom = _browser(f"file://{page}#{key}@{ver}", "--dump-dom").stdout
    cells = re.findall(r"<td class=\"cell\"", dom)
    assert len(cells) == len(m["rows"]) * len(m["columns"]), "a cell of matrix.json is missing from the page"
    opened = re.search(
        rf'<td class="cell" id="{re.escape(key)}@{re.escape(ver)}"[^>]*><details open="">(.*?)</details>', dom, re.S
    )
    assert opened, "clicking the cell (its link) did not open its evidence"
    evidence = html.unescape(re.sub(r"<[^>]+>", "", opened.group(1)))
    assert cell["outcome"] in evidence and (cell.get("shim") or cell.get("reason") or "")[:40] in evidence
    assert len(re.findall(r"<details open", dom)) == 1, "only the linked cell is open"
    for v in m["columns"]:
        assert f"vLLM {v['version']}</b>:" in dom, f"no verdict line for {v['version']}"


#: Measured in the page as a reader's browser lays it out: where the answer table's speculators 0.9.0 cells lie.
_PROBE = """<script>window.addEventListener('load', function () {
  var cells = Array.from(document.querySelectorAll("#clients td[id^='client0.9.0@']"));
  var head = Array.from(document.querySelectorAll('#clients thead th')).find(function (t) {
    return t.textContent.indexOf('0.9.0') >= 0; });
  var r = cells.map(function (c) { return c.getBoundingClientRect(); });
  var out = {width: window.innerWidth, height: window.innerHeight, cells: cells.length,
             scrollWidth: document.documentElement.scrollWidth,
             right: Math.max.apply(null, r.map(function (x) { return x.right; })),
             headTop: head ? head.getBoundingClientRect().top : null,
             headRight: head ? head.getBoundingClientRect().right : null,
             firstTop: r.length ? r[0].top : null};
  var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});</script>"""


def test_the_0_9_0_answer_is_on_the_first_screen_at_1440_px(tmp_path):
    """The 10-second check: in a 1,440 x 900 window, "which vLLM works with speculators 0.9.0?" is answered without
    scrolling sideways: the column's header and every one of its cells lie inside the window's width, the header
    and the newest build's cell on the first screen."""
    m = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    page = tmp_path / "matrix.html"
    page.write_text(matrix_page.to_html(m).replace("</body>", _PROBE + "</body>"))
    dom = _browser(f"file://{page}", "--dump-dom", "--window-size=1440,900").stdout
    got = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    assert got["cells"] == len(m["columns"]), got
    assert got["width"] == 1440 and got["headRight"] <= got["width"] and got["right"] <= got["width"], got
    assert 0 <= got["headTop"] < got["height"] and got["firstTop"] < got["height"], got


@pytest.mark.parametrize("width", [1440, 400])
def test_screenshots_of_the_page(width):
    """The committed screenshots (reports/matrix-<width>.png) are what Chromium shows of the committed page."""
    shot = REPO_ROOT / "reports" / f"matrix-{width}.png"
    out = _browser(
        f"file://{REPO_ROOT / 'reports' / 'matrix.html'}", f"--screenshot={shot}", f"--window-size={width},900"
    )
    assert shot.is_file() and shot.stat().st_size > 5_000, out.stderr[-1000:]


_LINK_PROBE = """<script>window.addEventListener('load', function () { setTimeout(function () {
  var c = document.getElementById(decodeURIComponent(location.hash.slice(1)));
  var head = Array.from(document.querySelectorAll('#clients thead th')).find(function (t) {
    return t.textContent.indexOf('0.9.0') >= 0; });
  var r = c.getBoundingClientRect(), h = head.getBoundingClientRect();
  var pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify({width: window.innerWidth, height: window.innerHeight, left: r.left, right: r.right,
    top: r.top, headTop: h.top, headBottom: h.bottom, headLeft: h.left, open: !!c.querySelector('details[open]')});
  document.body.appendChild(pre); }, 200); });</script>"""


def test_a_link_to_a_cell_at_400_px_shows_the_cell_under_its_column_header(tmp_path):
    """On a phone-width window a link to speculators 0.9.0 on one vLLM opens that cell inside the window, with its
    column's header still in view above it (the headers are sticky; the link centres the cell both ways)."""
    m = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    page = tmp_path / "matrix.html"
    page.write_text(matrix_page.to_html(m).replace("</body>", _LINK_PROBE + "</body>"))
    ver = m["columns"][-1]["version"]
    dom = _browser(f"file://{page}#client0.9.0@{ver}", "--dump-dom", "--window-size=400,900").stdout
    got = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    assert got["open"] and got["left"] >= 0 and got["right"] <= got["width"] + 1, got
    assert -1 <= got["headTop"] < got["headBottom"] <= got["top"] + 1 and got["headLeft"] < got["width"], got


_PICKER_PROBE = """<script>window.addEventListener('load', function () { setTimeout(function () {
  var t = document.getElementById('clients'), shown = Array.from(t.querySelectorAll('thead th[data-release]'))
    .filter(function (x) { return x.offsetWidth > 0; }).map(function (x) { return x.dataset.release; });
  var pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify({width: window.innerWidth, table: t.getBoundingClientRect().right,
    picked: document.getElementById('release').value, shown: shown});
  document.body.appendChild(pre); }, 200); });</script>"""


@pytest.mark.parametrize("width", [400, 1440])
def test_a_narrow_window_shows_one_release_without_scrolling_sideways(tmp_path, width):
    """At 400 px the release picker starts on the newest speculators release and the answer table fits the window;
    at 1,440 px every release is shown."""
    from harness.reporting.client_axis import CLIENTS

    m = json.loads((REPO_ROOT / "reports" / "matrix.json").read_text())
    page = tmp_path / "matrix.html"
    page.write_text(matrix_page.to_html(m).replace("</body>", _PICKER_PROBE + "</body>"))
    dom = _browser(f"file://{page}", "--dump-dom", f"--window-size={width},900").stdout
    got = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1)))
    if width == 400:
        assert got["picked"] == list(CLIENTS)[-1] and got["shown"] == [got["picked"]], got
        assert got["table"] <= got["width"], got
    else:
        assert got["picked"] == "all" and got["shown"] == list(CLIENTS), got
