"""The report chart of ``hapc compile`` is SVG written as text (no matplotlib): well-formed,
one bar per device and series, each device labelled, capacity marked."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import torch
from torch import nn

import hapc
from hapc.report.svg import _nice, svg_chart
from hapc.report.summary import write_report

CLUSTER = {"name": "svg3", "nodes": [{
    "devices": [{"name": f"dev{i}", "tflops": t, "memory_GB": 8, "hbm_GBps": 20, "count": 1}
                for i, t in enumerate((1.0, 0.6, 0.4))],
    "intra_link": "loopback"}]}


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 4))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def test_report_chart_is_svg_with_a_bar_per_device(tmp_path):
    torch.manual_seed(0)
    plan = hapc.baseline(Loss(), (torch.randn(7, 12), torch.randint(0, 4, (7,))), CLUSTER, "dp-flops")
    md = write_report(plan, tmp_path).read_text()
    assert "![per-device time and memory](report.svg)" in md
    root = ET.fromstring((tmp_path / "report.svg").read_text())
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(f"{ns}text")]
    for rank, device in enumerate(plan.cluster.devices):
        assert f"{rank}:{device.type}" in texts
    assert {"time per device", "memory per device", "capacity"} <= set(texts)
    # background, per device 3 time series and 1 memory bar, legend: 3 series, peak, capacity
    assert len(list(root.iter(f"{ns}rect"))) == 1 + 3 * 4 + 5
    assert svg_chart(plan) == (tmp_path / "report.svg").read_text()        # deterministic


def test_axis_ceiling_is_a_round_number_at_or_above_the_top():
    assert [_nice(x) for x in (0.7, 1.0, 1.3, 3.2, 7.0, 42.0)] == [1.0, 1.0, 2.0, 5.0, 10.0, 50.0]
