"""How a :class:`~hapc.plan.plan.Plan` shows itself in a notebook: ``plan`` as the last line of a
Jupyter cell renders :func:`plan_html`, and ``plan.report()`` returns :func:`plan_markdown`,
the same content as Markdown (for a README, an issue, or ``IPython.display.Markdown``).

Both give: the predicted time per iteration against the lower bound, the speed-up over each
standard baseline, a row per device (type, share, compute / communication / idle time, peak
memory against capacity) and the per-device chart (:mod:`hapc.report.model`, drawn by :mod:`hapc.report.summary`), inline as a base64
PNG so that the page needs no file beside it. matplotlib stays the only plotting dependency;
without it the chart is left out.
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING

from hapc.report.model import facts

if TYPE_CHECKING:
    from hapc.plan.plan import Plan


def _chart_data_uri(plan: Plan) -> str | None:
    from hapc.report.summary import chart_png

    png = chart_png(plan)
    return None if png is None else "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _headline(f: dict) -> str:
    gap = f" ({f['gap']:.2f}x the lower bound of {f['lower_bound_ms']:.3f} ms)" if f["gap"] else ""
    fit = "" if f["fits"] else "; does NOT fit in memory"
    return f"predicted time per iteration: {f['iteration_ms']:.3f} ms{gap}{fit}"


ROWS_SHOWN = 12          # device rows before the rest fold away (alike ranks share a row beyond 32)
DEVICE_COLUMNS = ("rank", "device", "share", "compute ms", "comm ms", "idle ms", "memory GB", "of GB", "used")


def _device_cells(d: dict) -> list[str]:
    used = f"{d['memory_used']:.0%}" + ("" if d["fits"] else " (does not fit)")
    return [str(d["rank"]), d["device"], f"{d['share']:.3f}", f"{d['compute_ms']:.3f}", f"{d['comm_ms']:.3f}",
            f"{d['idle_ms']:.3f}", f"{d['memory_GB']:.3f}", f"{d['capacity_GB']:.1f}", used]


def plan_markdown(plan: Plan, chart: bool = True) -> str:
    f = facts(plan)
    lines = [f"### {f['title']}", "", _headline(f), ""]
    if f["baselines"]:
        lines += ["| baseline | predicted ms | speed-up of this plan |", "|---|---:|---:|"]
        lines += [f"| {name} | {ms:.3f} | {speedup:.2f}x |" for name, ms, speedup in f["baselines"]]
        lines.append("")
    lines += ["| " + " | ".join(DEVICE_COLUMNS) + " |", "|" + "---:|" * len(DEVICE_COLUMNS)]
    shown, rest = f["devices"][:ROWS_SHOWN], f["devices"][ROWS_SHOWN:]
    lines += ["| " + " | ".join(_device_cells(d)) + " |" for d in shown]
    if rest:
        lines += ["", f"... and {len(rest)} more rows ({sum(d['count'] for d in rest)} devices): plan.summary() "
                      "lists them all"]
    uri = _chart_data_uri(plan) if chart else None
    if uri:
        lines += ["", f"![per-device time and memory]({uri})"]
    return "\n".join(lines) + "\n"


def plan_html(plan: Plan, chart: bool = True) -> str:
    f = facts(plan)
    esc = html.escape
    cell = 'style="text-align:right; padding:0 0.6em"'
    parts = [f"<div class=\"hapc-plan\"><h4>{esc(f['title'])}</h4>", f"<p>{esc(_headline(f))}</p>"]
    if f["baselines"]:
        rows = "".join(f"<tr><td>{esc(name)}</td><td {cell}>{ms:.3f}</td><td {cell}>{speedup:.2f}x</td></tr>"
                       for name, ms, speedup in f["baselines"])
        parts.append("<table><tr><th>baseline</th><th>predicted ms</th><th>speed-up of this plan</th></tr>"
                     f"{rows}</table>")
    head = "".join(f"<th>{esc(c)}</th>" for c in DEVICE_COLUMNS)
    def rows(devices: list[dict]) -> str:
        return "".join("<tr>" + "".join(f"<td {cell}>{esc(c)}</td>" for c in _device_cells(d)) + "</tr>"
                       for d in devices)
    shown, rest = f["devices"][:ROWS_SHOWN], f["devices"][ROWS_SHOWN:]
    parts.append(f"<table><tr>{head}</tr>{rows(shown)}</table>")
    if rest:        # expanded on demand: the page stays short on any cluster size
        parts.append(f"<details><summary>{len(rest)} more rows ({sum(d['count'] for d in rest)} devices)</summary>"
                     f"<table><tr>{head}</tr>{rows(rest)}</table></details>")
    uri = _chart_data_uri(plan) if chart else None
    if uri:
        parts.append(f'<img alt="per-device time and memory" src="{uri}"/>')
    parts.append("</div>")
    return "\n".join(parts)
