"""The chart of a plan is SVG written as text (the one renderer of report.md and the notebook):
well-formed, a bar per device and part, each device labelled with its figures, the legend clear
of the bars, small memory visible, capacity marked where the axis reaches it."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import torch
from torch import nn

import hapc
from costmodel.memory import PARTS
from hapc.report.model import figure, memory_label
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


NS = "{http://www.w3.org/2000/svg}"


def _plan(memory_GB: float = 8.0, batch: int = 7):
    torch.manual_seed(0)
    cluster = {**CLUSTER, "nodes": [{**CLUSTER["nodes"][0], "devices": [
        {**d, "memory_GB": memory_GB} for d in CLUSTER["nodes"][0]["devices"]]}]}
    return hapc.baseline(Loss(), (torch.randn(batch, 12), torch.randint(0, 4, (batch,))), cluster, "dp-flops")


def _box(el: ET.Element) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of a rect."""
    x, y = float(el.get("x", 0)), float(el.get("y", 0))
    return x, y, x + float(el.get("width")), y + float(el.get("height"))


def test_report_chart_is_svg_with_a_bar_per_device_and_part(tmp_path):
    plan = _plan()
    md = write_report(plan, tmp_path).read_text()
    assert "![per-device time and memory](report.svg)" in md
    root = ET.fromstring((tmp_path / "report.svg").read_text())
    texts = [t.text for t in root.iter(f"{NS}text")]
    for rank, device in enumerate(plan.cluster.devices):
        assert f"{rank}:{device.type}" in texts
    assert {"time per device", "memory per device", "compute", "parameters", "activations"} <= set(texts)
    bars = [r for r in root.iter(f"{NS}rect") if r.get("class") == "bar"]
    memory = plan.sim.memory.devices
    nonzero_parts = sum(1 for d in memory for p in PARTS if getattr(d, p) > 0)
    nonzero_times = sum(1 for s in (plan.sim.compute_seconds, plan.sim.comm_seconds, plan.sim.idle_seconds)
                        for x in s if x > 0)
    assert len(bars) == nonzero_parts + nonzero_times
    values = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "value"]
    sim = plan.sim
    totals = [(c + m + i) * 1e3 for c, m, i in zip(sim.compute_seconds, sim.comm_seconds, sim.idle_seconds)]
    assert values == [f"{figure(t)} ms" for t in totals] + [
        memory_label(b / 1e9, d.memory_bytes / 1e9) for b, d in zip(plan.memory, plan.cluster.devices)]
    assert svg_chart(plan) == (tmp_path / "report.svg").read_text()        # deterministic


def test_legend_is_clear_of_every_bar():
    root = ET.fromstring(svg_chart(_plan()))
    bars = [_box(r) for r in root.iter(f"{NS}rect") if r.get("class") == "bar"]
    legend = [_box(r) for r in root.iter(f"{NS}rect") if r.get("class") == "legend"]
    assert bars and legend
    for lx0, ly0, lx1, ly1 in legend:
        for bx0, by0, bx1, by1 in bars:
            assert lx1 <= bx0 or bx1 <= lx0 or ly1 <= by0 or by1 <= ly0


def test_small_memory_is_drawn_in_a_unit_that_shows_it_and_labelled_with_capacity():
    """A few kB on 8 GB devices: the axis is in kB, the bars are wide, the labels say of what."""
    plan = _plan()
    root = ET.fromstring(svg_chart(plan))
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert "kB (predicted peak)" in texts
    assert "axis scaled to the largest peak; capacity in the labels" in texts
    assert not [el for el in root.iter(f"{NS}line") if el.get("class") == "capacity"]
    values = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "value"]
    assert all(v.endswith("of 8 GB, <1%") and " kB " in v for v in values[3:])
    widest = max(float(r.get("width")) for r in root.iter(f"{NS}rect") if r.get("class") == "bar"
                 and r.get("fill") == "#55a868")      # optimizer state: the largest part here
    assert widest > 100


def test_capacity_is_marked_when_near_and_shortfall_is_said():
    plan = _plan(memory_GB=5e-6)     # 5 kB: every device is short
    root = ET.fromstring(svg_chart(plan))
    assert len([el for el in root.iter(f"{NS}line") if el.get("class") == "capacity"]) == 3
    values = [t for t in root.iter(f"{NS}text") if t.get("class") == "value"][3:]
    assert all("short" in v.text and v.get("fill") == "#d62728" for v in values)
    assert "capacity" in [t.text for t in root.iter(f"{NS}text")]


def test_figures_read_without_exponents():
    assert [figure(x) for x in (0.0012345, 0.1263, 12.5, 1342.7, 0)] == ["0.001234", "0.1263", "12.50", "1343", "0"]
    assert memory_label(6.4e-6, 8) == "6.400 kB of 8 GB, <1%"
    assert memory_label(40, 32) == "40.00 GB of 32 GB, 125%, 8.000 GB short"


def test_axis_ceiling_is_a_round_number_at_or_above_the_top():
    assert [_nice(x) for x in (0.7, 1.0, 1.3, 3.2, 7.0, 42.0)] == [1.0, 1.0, 2.0, 5.0, 10.0, 50.0]
