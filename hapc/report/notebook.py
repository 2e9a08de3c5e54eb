"""How a :class:`~hapc.plan.plan.Plan` shows itself in a notebook: ``plan`` as the last line of a
Jupyter cell renders :func:`plan_html`, and ``plan.report()`` returns :func:`plan_markdown`,
the same content as Markdown (for a README, an issue, or ``IPython.display.Markdown``).

Both give: the predicted time per iteration against the lower bound, the speed-up over each
standard baseline, a row per device (type, share, compute / communication / idle time, peak
memory against capacity) and the per-device chart: the SVG of ``report.md``
(:mod:`hapc.report.svg`), inline in the HTML and as a data URI in the Markdown, so that the
page needs no file beside it.
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING

from hapc.report.model import facts, memory_label, speedup_text

if TYPE_CHECKING:
    from hapc.plan.plan import Plan


def _chart_data_uri(plan: Plan) -> str:
    from hapc.report.svg import svg_chart

    return "data:image/svg+xml;base64," + base64.b64encode(svg_chart(plan).encode()).decode("ascii")


def _headline(f: dict) -> str:
    gap = f" ({f['gap']:.2f}x the lower bound of {f['lower_bound_ms']:.3f} ms)" if f["gap"] else ""
    fit = "" if f["fits"] else "; does NOT fit in memory"
    mfu = "" if f["mfu"] is None else f", model FLOPs utilisation {f['mfu'] * 100:.1f}%"
    return f"predicted time per iteration: {f['iteration_ms']:.3f} ms{gap}{mfu}{fit}"


ROWS_SHOWN = 12          # device rows before the rest fold away (alike ranks share a row beyond 32)


def _columns(f: dict) -> list[str]:
    """The device table's columns; ``rows`` (the batch rows a rank computes) where known."""
    rows = ["rows"] if _has_rows(f) else []
    return ["rank", "device", "share", *rows, "compute ms", "comm ms", "idle ms", "peak memory"]


def _has_rows(f: dict) -> bool:
    return any(d["rows"] is not None for d in f["devices"])


def _device_cells(d: dict, rows: bool) -> list[str]:
    memory = memory_label(d["memory_GB"], d["capacity_GB"]) + ("" if d["fits"] else " (does not fit)")
    held = [str(d["rows"])] if rows else []
    return [str(d["rank"]), d["device"], f"{d['share']:.3g}", *held, f"{d['compute_ms']:.3f}", f"{d['comm_ms']:.3f}",
            f"{d['idle_ms']:.3f}", memory]


def plan_markdown(plan: Plan, chart: bool = True) -> str:
    f = facts(plan)
    lines = [f"### {f['title']}", "", _headline(f), ""]
    if f["baselines"]:
        lines += ["| baseline | predicted ms | speed-up of this plan |", "|---|---:|---:|"]
        lines += [f"| {name} | {ms:.3f} | {speedup_text(speedup, why)} |" for name, ms, speedup, why in f["baselines"]]
        lines.append("")
    if plan.pipeline is not None:
        lines += ["```", *_staged_lines(plan), "```", ""]
    columns, has_rows = _columns(f), _has_rows(f)
    lines += ["| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
    shown, rest = f["devices"][:ROWS_SHOWN], f["devices"][ROWS_SHOWN:]
    lines += ["| " + " | ".join(_device_cells(d, has_rows)) + " |" for d in shown]
    if rest:
        lines += ["", f"... and {len(rest)} more rows ({sum(d['count'] for d in rest)} devices): plan.summary() "
                      "lists them all"]
    if chart:
        lines += ["", f"![per-device time and memory]({_chart_data_uri(plan)})"]
    return "\n".join(lines) + "\n"


def _staged_lines(plan: Plan) -> list[str]:
    """A pipelined or accumulating plan's stage lines, and what the device table then shows."""
    from hapc.report.pipeline import pipeline_lines

    return [*pipeline_lines(plan), "the table below is the best one-stage plan over all devices, for comparison"]


def plan_html(plan: Plan, chart: bool = True) -> str:
    f = facts(plan)
    esc = html.escape
    cell = 'style="text-align:right; padding:0 0.6em"'
    parts = [f"<div class=\"hapc-plan\"><h4>{esc(f['title'])}</h4>", f"<p>{esc(_headline(f))}</p>"]
    if f["baselines"]:
        rows = "".join(f"<tr><td>{esc(name)}</td><td {cell}>{ms:.3f}</td>"
                       f"<td {cell}>{esc(speedup_text(speedup, why))}</td></tr>"
                       for name, ms, speedup, why in f["baselines"])
        parts.append("<table><tr><th>baseline</th><th>predicted ms</th><th>speed-up of this plan</th></tr>"
                     f"{rows}</table>")
    if plan.pipeline is not None:
        parts.append(f"<pre>{esc(chr(10).join(_staged_lines(plan)))}</pre>")
    head = "".join(f"<th>{esc(c)}</th>" for c in _columns(f))
    has_rows = _has_rows(f)

    def rows(devices: list[dict]) -> str:
        return "".join("<tr>" + "".join(f"<td {cell}>{esc(c)}</td>" for c in _device_cells(d, has_rows)) + "</tr>"
                       for d in devices)
    shown, rest = f["devices"][:ROWS_SHOWN], f["devices"][ROWS_SHOWN:]
    parts.append(f"<table><tr>{head}</tr>{rows(shown)}</table>")
    if rest:        # expanded on demand: the page stays short on any cluster size
        parts.append(f"<details><summary>{len(rest)} more rows ({sum(d['count'] for d in rest)} devices)</summary>"
                     f"<table><tr>{head}</tr>{rows(rest)}</table></details>")
    if chart:       # inline: crisp at any zoom, and its text is the page's
        from hapc.report.svg import svg_chart

        svg = svg_chart(plan).replace("<svg ", '<svg style="max-width:100%; height:auto" role="img" '
                                                'aria-label="per-device time and memory" ', 1)
        parts.append(f'<div class="hapc-chart">{svg}</div>')
    parts.append("</div>")
    return "\n".join(parts)
