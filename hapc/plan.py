"""A plan: the chosen distributed program, its shares and what the cost model predicts for it.

``plan.json`` is canonical: keys sorted, floats rounded to 9 significant digits, nothing
that depends on the clock, so the same model and cluster give a byte-identical file (CI
compares plans with ``hapc check``). It holds the graph too, so a plan can be re-simulated
on another cluster or emitted without tracing the model again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from costmodel.cluster import Cluster, load_cluster
from costmodel.simulator import SimResult, simulate
from hapc.errors import UserError
from hapc.ir.graph import Graph
from hapc.ir.layout import parse_layout
from hapc.ir.precision import Precision
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy

FORMAT = "hapc-plan/1"


@dataclass
class Plan:
    program: DistProgram
    cluster: Cluster
    sim: SimResult
    name: str = "hapc"                                  # "hapc" or the baseline it is
    baselines: dict[str, float] = field(default_factory=dict)   # name -> predicted seconds
    search: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)         # file, kwargs, optimizer
    precision: Precision = field(default_factory=Precision)     # dtypes, TF32, gradient reduction

    # ---- the contract's properties ---------------------------------------------------------
    @property
    def cost(self) -> float:
        """Predicted seconds per iteration."""
        return self.sim.iteration_seconds

    @property
    def ratios(self) -> list[float]:
        """Per-device shares of the sharded work, in cluster order."""
        return list(self.program.shares)

    @property
    def memory(self) -> list[float]:
        """Predicted peak bytes per device, in cluster order."""
        return list(self.sim.memory.totals)

    @property
    def graph(self) -> Graph:
        return self.program.graph

    @property
    def lower_bound(self) -> float:
        return self.sim.lower_bound_seconds

    @property
    def speedups(self) -> dict[str, float]:
        return {k: v / self.cost for k, v in self.baselines.items() if self.cost > 0}

    def simulate(self, cluster: Cluster | str | dict | None = None) -> SimResult:
        cl = self.cluster if cluster is None else load_cluster(cluster)
        return simulate(self.program, cl, optimizer=self.model.get("optimizer", "adamw"))

    def layouts(self) -> dict[str, str]:
        """Layout of every value in the program, by name."""
        return {k: repr(v) for k, v in self.program.layouts().items()}

    def collectives(self) -> list[tuple[str, str, str, str]]:
        """(value, from, to, method) of every layout change."""
        return [(s.src, repr(s.src_layout), repr(s.dst_layout), s.method)
                for s in self.program.steps if isinstance(s, Redistribute)]

    # ---- reading ---------------------------------------------------------------------------
    def summary(self) -> str:
        from hapc.report import summary_text

        return summary_text(self)

    def report(self) -> str:
        """The plan as Markdown: time per iteration, speed-ups, devices, chart (inline PNG)."""
        from hapc.notebook import plan_markdown

        return plan_markdown(self)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the same content as :meth:`report`, as HTML."""
        from hapc.notebook import plan_html

        return plan_html(self)

    def __repr__(self) -> str:
        return (f"Plan({self.name}: {self.cost * 1e3:.3f} ms/iter on {self.cluster.world} devices, "
                f"lower bound {self.lower_bound * 1e3:.3f} ms)")

    # ---- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        for s in self.program.steps:
            if isinstance(s, Compute):
                steps.append({"compute": s.node, "inputs": [repr(x) for x in s.strategy.inputs],
                              "outputs": [repr(x) for x in s.strategy.outputs], "local": s.strategy.local,
                              "rescale": list(s.strategy.rescale) if s.strategy.rescale else None,
                              "reads": list(s.inputs)})
            else:
                steps.append({"redistribute": s.src, "out": s.out, "from": repr(s.src_layout),
                              "to": repr(s.dst_layout), "method": s.method})
        sim = self.sim
        cluster = self.cluster.to_dict()
        if self.cluster.op_table is not None:     # the measured times this plan was priced with
            cluster["measured_ops"] = self.cluster.op_table.restricted_to(self.graph).to_dict()
        return _canonical({
            "format": FORMAT,
            "name": self.name,
            "model": self.model,
            "graph_hash": self.graph.hash(),
            "cluster": cluster,
            "shares": list(self.program.shares),
            "source_layouts": {k: repr(v) for k, v in sorted(self.program.source_layouts.items())},
            "steps": steps,
            "predicted": {
                "iteration_seconds": sim.iteration_seconds,
                "compute_seconds": sim.compute_seconds, "comm_seconds": sim.comm_seconds,
                "idle_seconds": sim.idle_seconds, "memory_bytes": list(sim.memory.totals),
                "lower_bound_seconds": sim.lower_bound_seconds,
            },
            "baselines": self.baselines,
            "search": self.search,
            "precision": self.precision.to_dict(),
            "graph": self.graph.to_dict(),
        })

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), sort_keys=True, indent=1) + "\n")

    @staticmethod
    def load(path: str | Path) -> Plan:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UserError("no such plan file", where=str(path)) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"not a plan file (invalid JSON: {exc})", where=str(path)) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise UserError(f"not a plan file (format should be {FORMAT!r})", where=str(path))
        return Plan.from_dict(data)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Plan:
        graph = Graph.from_dict(data["graph"])
        cluster = load_cluster(data["cluster"])
        program = DistProgram(graph, tuple(data["shares"]),
                              {k: parse_layout(v) for k, v in data["source_layouts"].items()})
        for s in data["steps"]:
            if "compute" in s:
                strat = Strategy(tuple(parse_layout(x) for x in s["inputs"]),
                                 tuple(parse_layout(x) for x in s["outputs"]), s["local"],
                                 tuple(s["rescale"]) if s["rescale"] else None)
                program.steps.append(Compute(s["compute"], strat, tuple(s["reads"])))
            else:
                program.steps.append(Redistribute(s["redistribute"], s["out"], parse_layout(s["from"]),
                                                  parse_layout(s["to"]), s["method"]))
        model = data.get("model", {})
        sim = simulate(program, cluster, optimizer=model.get("optimizer", "adamw"))
        return Plan(program, cluster, sim, data.get("name", "hapc"), dict(data.get("baselines", {})),
                    dict(data.get("search", {})), model, Precision.from_dict(data.get("precision")))

    def emit(self, out_dir: str | Path, constants: dict | None = None) -> Path:
        """Write ``out_dir/program.py`` (and the model file beside it); see :mod:`hapc.codegen`.

        ``constants`` are tensors ``torch.export`` lifted out of the model (``Traced.constants``);
        without them the program recovers them from the model at start-up."""
        from hapc.codegen import emit

        if not self.model.get("file"):
            raise UserError("this plan has no model file to emit a program for (plan a model file)")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        return Path(emit(self.program, self.model["file"], str(out), model_kwargs=self.model.get("kwargs", {}),
                         optimizer=self.model.get("optimizer", "adamw"), plan_summary=self.summary(),
                         cluster=self.cluster, constants=constants, precision=self.precision))


def _canonical(obj: Any) -> Any:
    """Floats to 9 significant digits (stable text), tuples to lists, keys as strings."""
    if isinstance(obj, float):
        if math.isnan(obj) or math.isinf(obj):
            return str(obj)
        return float(f"{obj:.9g}") + 0.0
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canonical(x) for x in obj]
    return obj
