"""A Plan in a notebook: ``_repr_html_`` renders the summary (time per iteration, speed-ups,
shares, memory against capacity) with the per-device chart inline, and ``plan.report()``
returns the same as Markdown."""

from __future__ import annotations

import base64
import dataclasses
import functools
import html
import re

import torch
from torch import nn

import hapc
from hapc.ir.shards import largest_remainder
from hapc.report.model import memory_label
from hapc.report.svg import svg_chart

CELL = 'style="text-align:right; padding:0 0.6em"'


def _cluster(memory_GB: float = 8.0) -> dict:
    return {"name": "nb3", "nodes": [{
        "devices": [{"name": f"dev{i}", "tflops": t, "memory_GB": memory_GB, "hbm_GBps": 20, "count": 1}
                    for i, t in enumerate((1.0, 0.6, 0.4))],
        "intra_link": "loopback"}]}


@functools.cache
def _traced():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 4))

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.net(x), y)

    return hapc.trace(Loss(), (torch.randn(7, 12), torch.randint(0, 4, (7,))))


def _plan(memory_GB: float = 8.0):
    plan = hapc.baseline(_traced(), None, _cluster(memory_GB), "dp-flops")
    return dataclasses.replace(plan, baselines={"dp-even": plan.cost * 1.5, "megatron-tp": plan.cost * 3.0})


@functools.cache
def _pages() -> tuple[str, str]:
    """(HTML, Markdown), rendered once."""
    plan = _plan()
    return plan._repr_html_(), plan.report()


def _svg_in_markdown(text: str) -> str:
    found = re.search(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", text)
    assert found, "no inline SVG"
    return base64.b64decode(found.group(1)).decode()


def test_html_summary_has_every_figure_and_an_inline_chart():
    plan = _plan()
    page = _pages()[0]
    assert f"{plan.cost * 1e3:.3f} ms" in page
    assert "dp-even" in page and "1.50x" in page and "megatron-tp" in page and "3.00x" in page
    rows = largest_remainder(7, plan.ratios)       # the batch of 7, cut as the program cuts it
    for rank, share in enumerate(plan.ratios):
        assert f"<td {CELL}>{share:.3g}</td><td {CELL}>{rows[rank]}</td>" in page
        assert html.escape(memory_label(plan.memory[rank] / 1e9, 8.0)) in page
    assert page.count("<td") == 3 * 8 + 2 * 3          # device rows of 8 columns, baseline rows of 3
    svg = page[page.index("<svg"):page.index("</svg>") + 6]
    assert svg.replace('style="max-width:100%; height:auto" role="img" aria-label="per-device time and memory" ',
                       "") == svg_chart(plan).strip()


def test_markdown_report_says_the_same():
    plan = _plan()
    md = _pages()[1]
    assert md.startswith("### hapc plan 'dp-flops'")
    assert f"{plan.cost * 1e3:.3f} ms" in md
    assert "| dp-even |" in md and "| 1.50x |" in md
    assert "| rank | device | share | rows |" in md
    rows = [ln for ln in md.splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) == 3
    assert _svg_in_markdown(md) == svg_chart(plan)


def test_memory_over_capacity_is_flagged():
    from hapc.report.notebook import plan_html, plan_markdown

    plan = _plan(memory_GB=1e-7)
    assert "does NOT fit" in plan_markdown(plan, chart=False) and "does not fit" in plan_html(plan, chart=False)
