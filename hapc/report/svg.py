"""The per-device time and memory chart of ``report.md``, written as SVG text.

Two bar charts need no plotting library, whose import and rendering would cost a compile more
CPU than the chart is worth: this module writes the picture (stacked time per device, memory
per device against capacity) as plain SVG, which Markdown viewers show like a PNG. The
notebook view keeps its matplotlib PNG (:func:`hapc.report.summary.chart_png`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hapc.plan.plan import Plan

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c")      # compute, communication, idle
CAPACITY = "#d62728"
PANEL_HEIGHT_PX = 260
TOP_PX, LEFT_PX, LABEL_PX = 40, 60, 130


def escape(text: str) -> str:
    """Text as SVG character data: ``&``, ``<`` and ``>`` as entities (what
    ``xml.sax.saxutils.escape`` does, whose import pulls in urllib and http.client: a tenth of
    a second of ``hapc replan``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_svg_chart(plan: Plan, path: str | Path) -> Path:
    """Write the chart of ``plan`` to ``path``; returns the path."""
    Path(path).write_text(svg_chart(plan))
    return Path(path)


def svg_chart(plan: Plan) -> str:
    from hapc.report.model import chart

    c = chart(plan)
    labels, series, names, title = c.labels, c.series, c.names, c.title
    memory_gb, capacity_gb = c.memory_gb, c.capacity_gb
    ranks = list(range(len(labels)))

    bar_px = 28
    panel_w = max(300, bar_px * len(ranks) + 40)
    width = 2 * (LEFT_PX + panel_w) + 40
    height = TOP_PX + PANEL_HEIGHT_PX + LABEL_PX
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    totals = [sum(col) for col in zip(*series)]
    parts += _panel(LEFT_PX, panel_w, title, "ms per iteration", labels, totals, bar_px,
                    lambda i, scale: _stack(i, [s[i] for s in series], scale), names, COLOURS)
    x0 = 2 * LEFT_PX + panel_w + 20
    parts += _panel(x0, panel_w, "memory per device", "GB", labels, memory_gb + capacity_gb, bar_px,
                    lambda i, scale: [(0.0, memory_gb[i] * scale, COLOURS[0])], ["predicted peak"], COLOURS[:1],
                    marks=[c for c in capacity_gb])
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _stack(i: int, values: Sequence[float], scale: float) -> list[tuple[float, float, str]]:
    out, bottom = [], 0.0
    for value, colour in zip(values, COLOURS):
        out.append((bottom * scale, value * scale, colour))
        bottom += value
    return out


def _panel(x0: float, width: float, title: str, unit: str, labels: list[str], extent: Sequence[float],
           bar_px: float, bars, names: list[str], colours: Sequence[str], marks: Sequence[float] = ()) -> list[str]:
    """One bar chart: axes, ticks, bars (``bars(i, px_per_unit)`` -> [(y0_px, h_px, colour)]),
    capacity marks, rotated device labels and a legend."""
    top, base = TOP_PX, TOP_PX + PANEL_HEIGHT_PX
    ceiling = _nice(max([*extent, 1e-12]))
    scale = PANEL_HEIGHT_PX / ceiling
    out = [f'<text x="{x0 + width / 2:.1f}" y="{top - 22}" text-anchor="middle" font-size="13">{escape(title)}</text>',
           f'<text transform="translate({x0 - 45:.1f},{(top + base) / 2:.1f}) rotate(-90)" '
           f'text-anchor="middle">{escape(unit)}</text>',
           f'<line x1="{x0}" y1="{base}" x2="{x0 + width}" y2="{base}" stroke="black"/>',
           f'<line x1="{x0}" y1="{top}" x2="{x0}" y2="{base}" stroke="black"/>']
    for k in range(6):
        value = ceiling * k / 5
        y = base - value * scale
        out.append(f'<line x1="{x0 - 4}" y1="{y:.1f}" x2="{x0}" y2="{y:.1f}" stroke="black"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{value:.3g}</text>')
    step = width / max(1, len(labels))
    for i, label in enumerate(labels):
        cx = x0 + step * (i + 0.5)
        for y0, h, colour in bars(i, scale):
            out.append(f'<rect x="{cx - bar_px * 0.4:.1f}" y="{base - y0 - h:.1f}" width="{bar_px * 0.8:.1f}" '
                       f'height="{max(h, 0.0):.1f}" fill="{colour}"/>')
        if i < len(marks):
            y = base - marks[i] * scale
            out.append(f'<line x1="{cx - bar_px * 0.5:.1f}" y1="{y:.1f}" x2="{cx + bar_px * 0.5:.1f}" '
                       f'y2="{y:.1f}" stroke="{CAPACITY}" stroke-width="2"/>')
        out.append(f'<text transform="translate({cx + 4:.1f},{base + 6}) rotate(90)" font-size="9">'
                   f'{escape(label)}</text>')
    legend = list(zip(names, colours)) + ([("capacity", CAPACITY)] if marks else [])
    for k, (name, colour) in enumerate(legend):
        y = top + 6 + 14 * k
        out.append(f'<rect x="{x0 + width - 150}" y="{y}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x0 + width - 135}" y="{y + 9}">{escape(name)}</text>')
    return out


def _nice(top: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``top`` (the axis ceiling)."""
    power = 10.0 ** math.floor(math.log10(top))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= top * (1 - 1e-12))
