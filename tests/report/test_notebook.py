"""A Plan in a notebook: ``_repr_html_`` renders the summary (time per iteration, speed-ups,
shares, memory against capacity) with the per-device chart inline, and ``plan.report()``
returns the same as Markdown."""

from __future__ import annotations

import base64
import dataclasses
import functools
import re

import pytest
import torch
from torch import nn

import hapc


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
def _pages() -> tuple[str, str, tuple[str, str]]:
    """(HTML, Markdown, matplotlib backend before and after), rendered once: a chart is slow."""
    import matplotlib

    plan = _plan()
    before = matplotlib.get_backend()
    page, md = plan._repr_html_(), plan.report()
    return page, md, (before, matplotlib.get_backend())


def _png(text: str) -> bytes:
    found = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text)
    assert found, "no inline PNG"
    return base64.b64decode(found.group(1))


def test_html_summary_has_every_figure_and_an_inline_chart():
    pytest.importorskip("matplotlib")
    plan = _plan()
    page = _pages()[0]
    assert f"{plan.cost * 1e3:.3f} ms" in page
    assert "dp-even" in page and "1.50x" in page and "megatron-tp" in page and "3.00x" in page
    for rank, share in enumerate(plan.ratios):
        assert f"{share:.3f}" in page
        assert f"{plan.memory[rank] / 1e9:.3f}" in page
    assert page.count("<td") >= 3 * 9 and "8.0" in page          # capacity per device
    assert _png(page).startswith(b"\x89PNG\r\n\x1a\n")


def test_markdown_report_says_the_same():
    pytest.importorskip("matplotlib")
    plan = _plan()
    md = _pages()[1]
    assert md.startswith("### hapc plan 'dp-flops'")
    assert f"{plan.cost * 1e3:.3f} ms" in md
    assert "| dp-even |" in md and "| 1.50x |" in md
    rows = [ln for ln in md.splitlines() if re.match(r"\| \d+ \|", ln)]
    assert len(rows) == 3
    assert _png(md) == _png(_pages()[0])


def test_memory_over_capacity_is_flagged():
    from hapc.report.notebook import plan_html, plan_markdown

    plan = _plan(memory_GB=1e-7)
    assert "does NOT fit" in plan_markdown(plan, chart=False) and "does not fit" in plan_html(plan, chart=False)


def test_chart_leaves_the_matplotlib_backend_alone():
    pytest.importorskip("matplotlib")
    before, after = _pages()[2]
    assert after == before
