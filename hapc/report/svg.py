"""The per-device time and memory chart, written as SVG text: the one picture of a plan.

``report.md`` links it as ``report.svg``; the notebook view puts the same SVG inline. A plotting
library would cost a compile more CPU than two bar charts are worth, and two renderers would
draw two different pictures of one plan.

The layout is chosen to stay readable from 3 devices to 1,000 (whose ranks the report model
groups into runs of alike ones), at notebook width:

* one horizontal bar per row, its label on the left in plain text (never rotated) and its
  value on the right, so every figure can be read without an axis;
* each panel's legend sits between its title and its bars, so it never covers one;
* memory is stacked by part (parameters, gradients, optimizer state, activations,
  communication buffers) and its axis is scaled to the largest peak: a device using 0.001 of
  80 GB still shows a bar and its parts. Capacity is a red mark on the bar when the axis
  reaches it, and is always in the value label (``0.0012 of 80 GB, <1%``);
* a value too small for a pixel still gets one, and its label says what it is.

Elements carry classes (``bar``, ``capacity``, ``legend``, ``label``, ``value``) so tests, in
Python or in a browser, can check the geometry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hapc.report.model import figure, memory_label, memory_unit

if TYPE_CHECKING:
    from hapc.plan.plan import Plan
    from hapc.report.model import Chart

WIDTH_PX = 760                  # fits a notebook's output column, and a README's
ROW_PX, BAR_PX = 20, 14
FONT_PX, TITLE_PX = 12, 14
CHAR_PX = 7.0                   # width of a character at FONT_PX (sans-serif, generous)
VALUE_PX = 190                  # the value column on the right
PAD_PX = 10
TIME_COLOURS = ("#1f77b4", "#ff7f0e", "#b0b0b0")          # compute, communication, idle
MEMORY_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860")
CAPACITY = "#d62728"
# Capacity is drawn on the memory axis only when it is within this factor of the largest peak;
# beyond, the axis would squash the bars to nothing, and the value labels carry the capacity.
CAPACITY_ON_AXIS_WITHIN = 4.0


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
    """The chart of ``plan`` (:func:`hapc.report.model.chart`) as an SVG document."""
    from hapc.report.model import chart

    return render(chart(plan))


@dataclass(frozen=True)
class _Frame:
    """Where the columns of every panel sit: labels, bars, values."""

    label_right: float
    bars_left: float
    bars_right: float

    @property
    def bars_width(self) -> float:
        return self.bars_right - self.bars_left


def render(c: Chart) -> str:
    longest = max((len(label) for label in c.labels), default=4)
    label_px = min(260.0, max(80.0, CHAR_PX * longest + PAD_PX))
    frame = _Frame(label_px, label_px + PAD_PX, WIDTH_PX - VALUE_PX)
    body: list[str] = []
    y = PAD_PX
    times = [sum(col) for col in zip(*c.series)]
    y = _panel(body, y, frame, c.title, "ms per iteration", c.labels, c.series, c.names, TIME_COLOURS,
               times, [f"{figure(t)} ms" for t in times])
    y += 2 * PAD_PX
    top = max([*c.memory_gb, 1e-12])
    on_axis = max(c.capacity_gb, default=0.0) <= CAPACITY_ON_AXIS_WITHIN * top
    unit, per_gb = memory_unit(top)
    values = [memory_label(used, cap) for used, cap in zip(c.memory_gb, c.capacity_gb)]
    note = "" if on_axis else "axis scaled to the largest peak; capacity in the labels"
    y = _panel(body, y, frame, "memory per device", f"{unit} (predicted peak)", c.labels,
               [[x * per_gb for x in part] for part in c.memory_parts], c.memory_names, MEMORY_COLOURS,
               [x * per_gb for x in c.memory_gb], values,
               capacity=[x * per_gb for x in c.capacity_gb] if on_axis else None, note=note,
               short=[used > cap for used, cap in zip(c.memory_gb, c.capacity_gb)])
    height = y + PAD_PX
    head = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height:.0f}" '
            f'viewBox="0 0 {WIDTH_PX} {height:.0f}" font-family="sans-serif" font-size="{FONT_PX}">',
            f'<rect width="{WIDTH_PX}" height="{height:.0f}" fill="white"/>']
    return "\n".join([*head, *body, "</svg>"]) + "\n"


def _panel(out: list[str], y: float, frame: _Frame, title: str, unit: str, labels: Sequence[str],
           series: Sequence[Sequence[float]], names: Sequence[str], colours: Sequence[str],
           totals: Sequence[float], values: Sequence[str], capacity: Sequence[float] | None = None,
           note: str = "", short: Sequence[bool] = ()) -> float:
    """One horizontal bar chart from ``y`` down; returns where it ends."""
    out.append(f'<text x="{PAD_PX}" y="{y + TITLE_PX:.1f}" font-size="{TITLE_PX}" font-weight="bold">'
               f'{escape(title)}</text>')
    y += TITLE_PX + 6
    legend = list(zip(names, colours)) + ([("capacity", CAPACITY)] if capacity is not None else [])
    y = _legend(out, y, legend)
    if note:
        out.append(f'<text x="{PAD_PX}" y="{y + FONT_PX:.1f}" fill="#555">{escape(note)}</text>')
        y += FONT_PX + 6
    extent = max([*totals, *(capacity or []), 1e-12])
    ceiling = _nice(extent)
    scale = frame.bars_width / ceiling
    top = y
    for i, label in enumerate(labels):
        row_top = top + i * ROW_PX
        mid = row_top + ROW_PX / 2
        out.append(f'<text class="label" x="{frame.label_right:.1f}" y="{mid + FONT_PX / 2 - 2:.1f}" '
                   f'text-anchor="end">{escape(label)}</text>')
        x = frame.bars_left
        bar_top = mid - BAR_PX / 2
        for values_of_part, colour in zip(series, colours):
            value = values_of_part[i]
            if value <= 0:
                continue
            w = max(1.0, value * scale)             # a part too small for a pixel still shows
            out.append(f'<rect class="bar" x="{x:.1f}" y="{bar_top:.1f}" width="{w:.1f}" height="{BAR_PX}" '
                       f'fill="{colour}"/>')
            x += w
        if capacity is not None:
            cx = frame.bars_left + capacity[i] * scale
            out.append(f'<line class="capacity" x1="{cx:.1f}" y1="{bar_top - 2:.1f}" x2="{cx:.1f}" '
                       f'y2="{bar_top + BAR_PX + 2:.1f}" stroke="{CAPACITY}" stroke-width="2"/>')
        fill = f' fill="{CAPACITY}"' if i < len(short) and short[i] else ""
        out.append(f'<text class="value" x="{frame.bars_right + 6:.1f}" y="{mid + FONT_PX / 2 - 2:.1f}"{fill}>'
                   f'{escape(values[i])}</text>')
    base = top + len(labels) * ROW_PX + 2
    out.append(f'<line x1="{frame.bars_left:.1f}" y1="{top:.1f}" x2="{frame.bars_left:.1f}" y2="{base:.1f}" '
               f'stroke="black"/>')
    out.append(f'<line x1="{frame.bars_left:.1f}" y1="{base:.1f}" x2="{frame.bars_right:.1f}" y2="{base:.1f}" '
               f'stroke="black"/>')
    for k in range(6):
        tick = ceiling * k / 5
        x = frame.bars_left + tick * scale
        out.append(f'<line x1="{x:.1f}" y1="{base:.1f}" x2="{x:.1f}" y2="{base + 4:.1f}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{base + 6 + FONT_PX:.1f}" text-anchor="middle">{tick:g}</text>')
    out.append(f'<text x="{frame.bars_left + frame.bars_width / 2:.1f}" y="{base + 10 + 2 * FONT_PX:.1f}" '
               f'text-anchor="middle">{escape(unit)}</text>')
    return base + 10 + 2 * FONT_PX


def _legend(out: list[str], y: float, items: Sequence[tuple[str, str]]) -> float:
    """Swatches in a row under the title (wrapping at the chart's width); returns where the
    bars may start."""
    x = PAD_PX
    for name, colour in items:
        width = 14 + CHAR_PX * len(name) + 16
        if x + width > WIDTH_PX - PAD_PX and x > PAD_PX:
            x, y = PAD_PX, y + FONT_PX + 6
        out.append(f'<rect class="legend" x="{x:.1f}" y="{y:.1f}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text class="legend" x="{x + 14:.1f}" y="{y + 9:.1f}">{escape(name)}</text>')
        x += width
    return y + FONT_PX + 8


def _nice(top: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``top`` (the axis ceiling)."""
    power = 10.0 ** math.floor(math.log10(top))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= top * (1 - 1e-12))
