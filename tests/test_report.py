"""`plan --report FILE.html`: a self-contained page, rendered in headless Chromium without console errors.

Chromium is a test dependency (scripts/setup.sh installs the Debian package); the test fails when it is
missing rather than skipping, so a CI machine without it is noticed.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from mithril_spec import cli
from mithril_spec.frontend import compile_file
from mithril_spec.planner.costs import estimate
from mithril_spec.planner.hardware import lookup
from mithril_spec.render.report import render_report

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
]
# Collects uncaught errors, rejected promises and console.error calls into an attribute of <html>.
ERROR_HOOK = """<script>
(function () {
  function note(m) {
    var e = document.documentElement;
    e.setAttribute("data-errors", (e.getAttribute("data-errors") || "") + m + ";");
  }
  window.addEventListener("error", function (ev) { note("error: " + ev.message); });
  window.addEventListener("unhandledrejection", function (ev) { note("rejection: " + ev.reason); });
  var orig = console.error;
  console.error = function () {
    note("console.error: " + Array.prototype.join.call(arguments, " "));
    return orig.apply(console, arguments);
  };
})();
</script>"""


def chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    assert path, "chromium is not installed: run scripts/setup.sh (apt-get install -y chromium)"
    return path


def run_chromium(args: list[str], timeout: int = 90) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def decode_png(data: bytes) -> tuple[int, int, set]:
    """(width, height, distinct colours) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    colours: set = set()
    for y in range(height):
        f = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                row[i] = (row[i] + row[i - bpp]) & 255
        elif f == 2:
            for i in range(stride):
                row[i] = (row[i] + prev[i]) & 255
        elif f == 3:
            for i in range(stride):
                left = row[i - bpp] if i >= bpp else 0
                row[i] = (row[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 7 == 0:
            colours.update(bytes(row[i:i + 3]) for i in range(0, stride, bpp * 3))
        prev = row
    return width, height, colours


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "gpt-tiny.html"
    rc = cli.main(["plan", str(ROOT / "specs" / "gpt-tiny.yaml"), "--hardware", "h100", "--report", str(out)])
    assert rc == 0 and out.is_file()
    return out


def test_report_is_self_contained(report):
    html = report.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html, re.I)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    for needed in ("Device mesh", "Memory per device", "Partition map", "Communication per step",
                   "blocks.[0-3].attn.q.weight", "all-reduce", "<svg"):
        assert needed in html, needed
    # a block parameter is drawn once for its 4 copies, not once per copy
    assert "blocks.0." not in html and "(4 copies, laid out alike; sizes per copy)" in html
    # one mesh cell per device, each partition map colours all 8 devices
    assert html.count('class="device" data-device=') == 8


def test_report_escapes_spec_text(tmp_path):
    """Free text from the spec (a hardware profile's description) is HTML-escaped."""
    text = (ROOT / "specs" / "mlp-dp.yaml").read_text() + (
        'hardware:\n  - {name: evil, base: cpu, description: "<script>alert(1)</script>"}\n')
    spec = tmp_path / "x.yaml"
    spec.write_text(text, encoding="utf-8")
    c = compile_file(spec)
    html = render_report(c.plan, estimate(c.plan, lookup("evil", c.spec, c.doc)))
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_report_renders_in_headless_chromium(report, tmp_path):
    page = tmp_path / "page.html"
    page.write_text(report.read_text(encoding="utf-8").replace("<head>", "<head>\n" + ERROR_HOOK, 1),
                    encoding="utf-8")
    url = page.as_uri()
    dom = run_chromium(["--dump-dom", "--virtual-time-budget=2000", url])
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout, "the page's script did not run to the end"
    html_tag = re.search(r"<html[^>]*>", dom.stdout).group(0)
    assert "data-errors" not in html_tag, html_tag
    assert "Partition map" in dom.stdout
    assert "Uncaught" not in dom.stderr

    # the hook itself works: a page that throws is caught
    bad = tmp_path / "bad.html"
    bad.write_text(page.read_text(encoding="utf-8").replace("</body>", "<script>undefinedFn();</script></body>"),
                   encoding="utf-8")
    caught = run_chromium(["--dump-dom", "--virtual-time-budget=2000", bad.as_uri()])
    assert "data-errors" in re.search(r"<html[^>]*>", caught.stdout).group(0)

    shot = tmp_path / "shot.png"
    r = run_chromium([f"--screenshot={shot}", "--window-size=900,700", url])
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    width, height, colours = decode_png(shot.read_bytes())
    assert (width, height) == (900, 700)
    assert len(colours) >= 8, f"screenshot looks blank: {len(colours)} colour(s)"
