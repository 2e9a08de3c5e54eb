"""The notebook view of a plan in a real browser (headless Chromium), at notebook width, for 4,
64 and 1,000 devices: the chart is drawn (its bar colours are on the screenshot), no legend
covers a bar, nothing runs past the page's width, the text is readable, and the device table
shows at most 12 rows with the rest folded.

Chromium is Debian's package (``apt-get install chromium``; ``.ci/run`` installs it); without
it these tests skip.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
import torch
from torch import nn

import hapc
from hapc.report.notebook import ROWS_SHOWN, plan_html
from hapc.report.svg import MEMORY_COLOURS, TIME_COLOURS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")

PAGE_PX = 900            # a notebook's output column, roughly

# Runs in the page once it is laid out; its findings go into the DOM that --dump-dom prints.
MEASURE = """
<script>
try {
const box = e => e.getBoundingClientRect();
const cross = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
const bars = [...document.querySelectorAll('svg .bar')].map(box);
const legend = [...document.querySelectorAll('svg .legend')].map(box);
const svg = box(document.querySelector('svg'));
const sizes = [...document.querySelectorAll('svg text')].map(t => parseFloat(getComputedStyle(t).fontSize));
const firstTable = [...document.querySelectorAll('.hapc-plan > table')].find(t => t.querySelector('th').textContent === 'rank');
const folded = document.querySelector('.hapc-plan details');
const report = {
  bars: bars.length,
  thinnest_bar_px: Math.min(...bars.map(b => b.width)),
  legend_over_bars: legend.filter(l => bars.some(b => cross(l, b))).length,
  svg_right: svg.right, svg_width: svg.width,
  smallest_font_px: Math.min(...sizes),
  rows_shown: firstTable.querySelectorAll('tr').length - 1,
  folded_open: folded ? folded.open : null,
};
document.body.setAttribute('data-report', JSON.stringify(report));
} catch (err) { document.body.setAttribute('data-report', JSON.stringify({error: String(err)})); }
</script>
"""


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def _cluster(devices: int) -> dict:
    if devices == 4:
        return {"name": "four", "nodes": [{"devices": [
            {"name": f"dev{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
            for i, t in enumerate((1.0, 0.6, 0.4, 0.4))], "intra_link": "loopback"}]}
    nodes = devices // 8           # a third each of A100, V100 and T4 servers
    return {"name": f"mixed{devices}", "network": {"bandwidth_Gbps": 100, "latency_us": 10}, "nodes": [
        {"count": nodes // 3, "devices": [{"type": "A100-80GB", "count": 8}], "intra_link": "nvlink3"},
        {"count": nodes // 3, "devices": [{"type": "V100-32GB", "count": 8}], "intra_link": "nvlink2"},
        {"count": nodes - 2 * (nodes // 3), "devices": [{"type": "T4", "count": 8}], "intra_link": "pcie3"}]}


@functools.cache
def _traced():
    torch.manual_seed(0)
    return hapc.trace(Loss(), (torch.randn(4096, 64), torch.randint(0, 4, (4096,))))


@functools.cache
def _rendered(devices: int, tmp: Path) -> tuple[dict, bytes, int]:
    """(what the page measured, the screenshot's PNG, device rows of the plan)."""
    plan = hapc.baseline(_traced(), None, _cluster(devices), "dp-flops")
    assert plan.cluster.world == devices
    page = tmp / f"plan{devices}.html"
    page.write_text(f"<!doctype html><html><body style='width:{PAGE_PX}px; margin:8px'>{plan_html(plan)}"
                    f"{MEASURE}</body></html>")
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--window-size={PAGE_PX + 16},1400"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    found = re.search(r"data-report=\"([^\"]*)\"", dom)
    assert found, dom[:2000]
    report = json.loads(found.group(1).replace("&quot;", '"'))
    shot = tmp / f"plan{devices}.png"
    subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    from hapc.report.model import facts

    return report, shot.read_bytes(), len(facts(plan)["devices"])


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("browser")


@pytest.mark.parametrize("devices", [4, 64, 1000])
def test_the_chart_is_drawn_readable_and_clear_of_its_legend(devices, shots):
    report, png, rows = _rendered(devices, shots)
    assert report["bars"] >= 2 * min(rows, 32)                 # a time and a memory bar per row at least
    assert report["thinnest_bar_px"] >= 1
    assert report["legend_over_bars"] == 0
    assert report["svg_right"] <= PAGE_PX + 8 + 1 and report["svg_width"] >= 600
    assert report["smallest_font_px"] >= 11
    width, height, pixels = _decode_png(png)
    colours = _colour_counts(pixels)
    for colour in (TIME_COLOURS[0], TIME_COLOURS[1], MEMORY_COLOURS[0], MEMORY_COLOURS[2]):
        assert colours.get(_rgb(colour), 0) >= 200, f"{colour} barely on the screenshot of {devices} devices"


@pytest.mark.parametrize("devices", [4, 64, 1000])
def test_at_most_twelve_device_rows_show(devices, shots):
    report, _, rows = _rendered(devices, shots)
    assert report["rows_shown"] == min(rows, ROWS_SHOWN)
    assert report["folded_open"] in (None, False)


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def _colour_counts(pixels: list[tuple[int, ...]]) -> dict[tuple[int, int, int], int]:
    counts: dict[tuple[int, int, int], int] = {}
    for p in pixels:
        counts[p[:3]] = counts.get(p[:3], 0) + 1
    return counts


def _decode_png(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """Pixels of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes), in pure Python:
    the test needs no imaging library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, head = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = head
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, head
    bpp = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * bpp
    previous, pixels = bytearray(stride), []
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = previous[i], previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        pixels += [tuple(line[i:i + bpp]) for i in range(0, stride, bpp)]
        previous = line
    return width, height, pixels
