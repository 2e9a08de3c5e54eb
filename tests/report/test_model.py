"""The report model (hapc.report.model): every view reads its figures from one place, and the
chart groups alike ranks on large clusters."""

from __future__ import annotations

import torch
from torch import nn

import hapc
from hapc.ir.layout import Replicate
from hapc.ir.shards import largest_remainder
from hapc.report.model import BARS_BEFORE_GROUPING, batch_rows, chart, facts, rank_runs
from hapc.report.summary import summary_text


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 4))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def _plan(counts: tuple[int, int]):
    cluster = {"name": "two-kinds", "nodes": [{"devices": [
        {"name": "fast", "tflops": 2.0, "memory_GB": 8, "hbm_GBps": 20, "count": counts[0]},
        {"name": "slow", "tflops": 1.0, "memory_GB": 8, "hbm_GBps": 20, "count": counts[1]}],
        "intra_link": "loopback"}]}
    torch.manual_seed(0)
    return hapc.baseline(Loss(), (torch.randn(80, 12), torch.randint(0, 4, (80,))), cluster, "dp-flops")


def test_the_summary_shows_the_models_figures():
    plan = _plan((2, 1))
    f, text = facts(plan), summary_text(plan)
    assert text.splitlines()[0] == f["title"]
    assert f"{f['iteration_ms']:.3f} ms" in text.splitlines()[1]
    assert [d["device"] for d in f["devices"]] == [d.type for d in plan.cluster.devices]


def test_a_chart_has_a_bar_per_rank_on_small_clusters():
    plan = _plan((2, 1))
    c = chart(plan)
    assert len(c.labels) == 3 and all(len(s) == 3 for s in c.series)
    assert c.names == ["compute", "communication", "idle"]
    assert c.series[0] == [x * 1e3 for x in plan.sim.compute_seconds]


def test_a_chart_groups_alike_ranks_on_large_clusters():
    plan = _plan((24, 24))
    assert plan.cluster.world > BARS_BEFORE_GROUPING
    c = chart(plan)
    assert len(c.labels) < plan.cluster.world
    assert c.labels[0].startswith("0-") and all(len(s) == len(c.labels) for s in (*c.series, c.memory_gb))


def test_rank_runs_split_where_the_device_or_a_figure_changes():
    labels = ["0:A", "1:A", "2:A", "3:B"]
    assert rank_runs(labels, [1.0, 1.0, 2.0, 2.0]) == ([0, 2, 3], ["0-1:A", "2:A", "3:B"])


def test_the_chart_and_the_notebook_group_ranks_as_the_summary_table():
    plan = _plan((24, 24))
    rows = batch_rows(plan)
    groups = plan.sim.row_groups(batch_rows=rows)
    assert 1 < len(groups) < plan.cluster.world
    c, f = chart(plan), facts(plan)
    assert [label.split(":")[0] for label in c.labels] == [str(a) if b - a == 1 else f"{a}-{b - 1}" for a, b in groups]
    assert [d["rank"] for d in f["devices"]] == [label.split(":")[0] for label in c.labels]
    table_ranks = [line.split()[0] for line in plan.sim.table(rows).splitlines()[3:]]
    assert table_ranks == [d["rank"] for d in f["devices"]]


def test_the_notebook_shows_at_most_twelve_rows_and_folds_the_rest():
    from hapc.report.notebook import ROWS_SHOWN, plan_html, plan_markdown

    cluster = {"name": "many", "nodes": [{"devices": [
        {"name": f"d{i}", "tflops": 1.0 + i / 10, "memory_GB": 8, "hbm_GBps": 20, "count": 1} for i in range(40)],
        "intra_link": "loopback"}]}
    torch.manual_seed(0)
    plan = hapc.baseline(Loss(), (torch.randn(80, 12), torch.randint(0, 4, (80,))), cluster, "dp-flops")
    assert len(facts(plan)["devices"]) == 40            # 40 distinct devices: no run to group
    html = plan_html(plan, chart=False)
    assert html.count("<tr>") == 1 + ROWS_SHOWN + 1 + (40 - ROWS_SHOWN) and "<details><summary>28 more rows" in html
    md = plan_markdown(plan, chart=False)
    assert sum(line.startswith("| ") for line in md.splitlines()) == 1 + ROWS_SHOWN
    assert "... and 28 more rows (28 devices)" in md


def test_rows_are_the_batch_pieces_the_program_cuts_not_the_shares():
    """Batch 80 on shares 2/2/1 of 5: rows 32/32/16; the table shows them beside the shares,
    and a plan that never cuts the batch holds it whole on every rank."""
    plan = _plan((2, 1))
    rows = batch_rows(plan)
    assert rows == largest_remainder(80, plan.ratios) == [32, 32, 16]
    assert [d["rows"] for d in facts(plan)["devices"]] == rows
    table = summary_text(plan).splitlines()
    head = next(line for line in table if line.lstrip().startswith("rank"))
    assert head.split()[3:5] == ["share", "rows"]
    assert [line.split()[4] for line in table[table.index(head) + 1:][:3]] == ["32", "32", "16"]
    traced = hapc.trace(Loss(), (torch.randn(80, 12), torch.randint(0, 4, (80,))))
    replicated = hapc.baseline(traced, None, plan.cluster, "megatron-tp")
    assert replicated.program.source_layouts["x"] == Replicate()     # tensor parallel: every rank reads all rows
    assert batch_rows(replicated) == [80, 80, 80]


def test_no_speed_up_is_claimed_over_a_baseline_that_does_not_fit(tmp_path):
    """Data parallelism replicates a 17 MB model that 50 MB devices cannot hold with its
    optimizer state: the reports say how much it is short instead of a speed-up (issue 23),
    and plan.json keeps it."""
    from hapc.plan import Plan
    from hapc.report.notebook import plan_html, plan_markdown

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(512, 4096), nn.Linear(4096, 512)

        def forward(self, x, y):
            return nn.functional.mse_loss(self.b(torch.relu(self.a(x))), y)

    cluster = {"name": "tight", "nodes": [{"devices": [
        {"name": "big", "tflops": 2, "memory_GB": 0.12, "hbm_GBps": 100, "count": 2},
        {"name": "small", "tflops": 1, "memory_GB": 0.05, "hbm_GBps": 100, "count": 2}], "intra_link": "loopback"}]}
    torch.manual_seed(0)
    plan = hapc.synthesize(Wide(), (torch.randn(32, 512), torch.randn(32, 512)), cluster)
    assert plan.fits and set(plan.baseline_shortfall) == {"dp-even", "dp-flops"}
    assert all(v > 1e7 for v in plan.baseline_shortfall.values())
    assert set(plan.speedups) == set(plan.baselines) - {"dp-even", "dp-flops"}
    line = next(ln for ln in summary_text(plan).splitlines() if ln.startswith("baselines"))
    assert "dp-even" in line and "(does not fit: 17.38 MB short)" in line and "zero3" in line
    assert "does not fit: 17.38 MB short" in plan_markdown(plan, chart=False)
    assert "does not fit: 17.38 MB short" in plan_html(plan, chart=False)
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json").baseline_shortfall == plan.baseline_shortfall


def test_no_speed_up_is_claimed_over_data_parallelism_that_cannot_split_the_batch():
    """A batch of 3 on 5 devices: data parallelism would compute the whole batch everywhere (a
    baseline DDP cannot run), so the reports say so instead of a speed-up over it (issue 23)."""
    cluster = {"name": "five", "nodes": [{"devices": [
        {"name": "fast", "tflops": 2.0, "memory_GB": 8, "hbm_GBps": 20, "count": 2},
        {"name": "slow", "tflops": 1.0, "memory_GB": 8, "hbm_GBps": 20, "count": 3}], "intra_link": "loopback"}]}
    torch.manual_seed(0)
    plan = hapc.synthesize(Loss(), (torch.randn(3, 12), torch.randint(0, 4, (3,))), cluster)
    assert {"dp-even", "dp-flops"} <= set(plan.baselines) and not {"dp-even", "dp-flops"} & set(plan.speedups)
    line = next(ln for ln in summary_text(plan).splitlines() if ln.startswith("baselines"))
    assert "dp-even" in line and "(not split: a batch of 3 for 5 devices)" in line
    assert "megatron-tp" in plan.speedups
