"""The bench's report pages as a person opening them sees them: Debian's
headless Chromium lays each out in a 1366 x 768 viewport (an iframe of that
size in one page, so that one browser start measures every report), with no
network, and says how wide the page is, where its findings are, whether its
main table fits and which plots it drew."""
import json
import re
import shutil

import pytest

from helpers import run

SCREEN = (1366, 768)  # a laptop's screen
MEASURE = """
addEventListener("load", () => {
  const box = e => e ? e.getBoundingClientRect() : null;
  const out = [...document.querySelectorAll("iframe")].map(frame => {
    const doc = frame.contentDocument, win = frame.contentWindow;
    const findings = doc.getElementById("findings"), ran = doc.querySelector(".ran");
    const firstTable = doc.querySelector("table");
    return {
      page: frame.getAttribute("src"), width: win.innerWidth, height: win.innerHeight,
      scrollWidth: doc.documentElement.scrollWidth, title: doc.querySelector("h1").textContent,
      ran: ran && ran.textContent, ranTop: ran && box(ran).top,
      findings: findings ? [...findings.querySelectorAll("li")].map(li => li.textContent) : null,
      findingsTop: findings && box(findings).top, findingsBottom: findings && box(findings).bottom,
      findingsBeforeTables: !!(findings && firstTable &&
                               findings.compareDocumentPosition(firstTable) & Node.DOCUMENT_POSITION_FOLLOWING),
      mainTables: [...doc.querySelectorAll(".table-box.main")].map(b => ({
        scrollWidth: b.scrollWidth, clientWidth: b.clientWidth,
        headers: [...b.querySelectorAll("th")].map(th => th.textContent)})),
      images: [...doc.images].map(img => ({alt: img.alt, naturalWidth: img.naturalWidth})),
      notDrawn: [...doc.querySelectorAll(".not-drawn")].map(p => p.textContent),
    };
  });
  const pre = document.createElement("pre");
  pre.id = "measured";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
"""


def chromium_flags(profile):
    chromium = shutil.which("chromium")
    if not chromium:
        pytest.skip("no chromium: `make test` installs Debian's (TEST_TOOLS=1 scripts/install.sh)")
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-quic",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}"]


def measure(pages, folder):
    """{page path: what Chromium measured} for report pages (pathlib.Path), one browser start for all."""
    frames = "".join(f'<iframe src="{page.as_uri()}" width="{SCREEN[0]}" height="{SCREEN[1]}" '
                     'style="border:0;display:block"></iframe>' for page in pages)
    harness = folder / "measure-pages.html"
    harness.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">{frames}'
                       f"<script>{MEASURE}</script></body></html>")
    # file:// pages are each an origin of their own unless the browser is told they are one
    done = run(chromium_flags(folder / "chromium-profile") + [
        "--allow-file-access-from-files", f"--window-size={SCREEN[0] + 40},{SCREEN[1]}", "--dump-dom",
        harness.as_uri()], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    import html
    measured = json.loads(html.unescape(found.group(1)))
    return {page: m for page, m in zip(pages, measured)}


def assert_reads_at_first_look(m):
    """The command in one line, then the findings, all on the first screen and
    before any table; nothing wider than the screen; the main table fits."""
    assert m["width"] == SCREEN[0] and m["height"] == SCREEN[1], m
    assert m["scrollWidth"] <= SCREEN[0], f"{m['page']}: the page is {m['scrollWidth']} px wide"
    assert m["ran"] and m["ran"].startswith("ringtrain-bench ") and "\n" not in m["ran"].strip(), m["ran"]
    assert m["findings"], f"{m['page']}: no findings"
    assert m["ranTop"] < m["findingsTop"] < 700 and m["findingsBottom"] <= SCREEN[1], m
    assert m["findingsBeforeTables"], m["page"]
    assert all(re.search(r"\d", sentence) for sentence in m["findings"]), m["findings"]  # each with its number
    for table in m["mainTables"]:
        assert table["scrollWidth"] <= table["clientWidth"], (m["page"], table)


def assert_plots_match_their_json(m, folder):
    """Every plot drawn on the page is one that plots.json, beside the report,
    lists as drawn, with at least one data series of at least one point; every
    plot not drawn has its one line on the page, and no PNG."""
    plots = json.loads((folder / "plots.json").read_text())["plots"]
    drawn = [p for p in plots if p["drawn"]]
    assert [i["alt"] for i in m["images"]] == [p["caption"] for p in drawn], (m["images"], plots)
    assert all(i["naturalWidth"] > 0 for i in m["images"]), m["images"]
    for p in drawn:
        assert p["series"] and all(s["points"] >= 1 for s in p["series"]), p
        assert (folder / p["file"]).exists(), p
    for p in plots:
        if not p["drawn"]:
            assert not (folder / p["file"]).exists(), p
            assert f"Not drawn: {p['caption']}: {p['why_not_drawn']}." in m["notDrawn"], (p, m["notDrawn"])
    return plots
