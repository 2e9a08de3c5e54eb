"""A plan: the chosen distributed program, its shares and what the cost model predicts for it.

``plan.json`` is canonical: keys sorted, floats rounded to 9 significant digits, nothing
that depends on the clock, so the same model and cluster give a byte-identical file (CI
compares plans with ``hapc check``). It holds the graph too, so a plan can be re-simulated
on another cluster or emitted without tracing the model again.

The file is written by the C JSON encoder, one entry per line down to the records of the big
lists (steps, the graph's values and nodes), rather than by the much slower pure-Python
encoder that indenting every number needs. Loading a plan does not simulate it until something
reads its simulation (:attr:`Plan.sim`); :attr:`Plan.recorded_seconds` is the predicted time
the file holds, for a caller that needs no more.

A replanned plan keeps the old plan's graph, which is most of the file. :meth:`Plan.load` keeps the graph's lines as it read them, and saving a plan of
that same graph writes them again rather than encoding it anew (see :class:`_GraphSection`).
"""

from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from costmodel.cluster import Cluster, load_cluster
from costmodel.simulator import SimResult, simulate
from hapc.errors import UserError
from hapc.ir.graph import Graph, hash_of_json
from hapc.ir.precision import Precision
from hapc.ir.program import DistProgram, Redistribute
from hapc.plan.paths import loaded_model_path, stored_model_path
from hapc.plan.program_json import memory_levers_entry, program_from_dict, steps_to_dict
from hapc.process.collector import gc_paused

if TYPE_CHECKING:
    from synth.stages import Pipeline, Stage

FORMAT = "hapc-plan/1"


class _SimulatedOnRead:
    """:attr:`Plan.sim` as a dataclass field that may be given as None (a loaded plan): the
    program is then simulated on its cluster the first time the field is read. A loaded plan
    that only gets re-planned or emitted without a summary never pays for that simulation."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, plan: Plan | None, owner: type | None = None) -> SimResult:
        if plan is None:
            raise AttributeError("sim")           # no class-level default: the field is required
        sim = plan.__dict__[self._slot]
        if sim is None:
            sim = plan.__dict__[self._slot] = simulate(plan.program, plan.cluster,
                                                       optimizer=plan.model.get("optimizer", "adamw"))
        return sim

    def __set__(self, plan: Plan, sim: SimResult | None) -> None:
        plan.__dict__[self._slot] = sim


@dataclass
class Plan:
    program: DistProgram
    cluster: Cluster
    sim: SimResult = _SimulatedOnRead()               # None when loaded: simulated on first read
    name: str = "hapc"                                  # "hapc" or the baseline it is
    baselines: dict[str, float] = field(default_factory=dict)   # name -> predicted seconds
    search: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)         # file, kwargs, optimizer
    precision: Precision = field(default_factory=Precision)     # dtypes, TF32, gradient reduction
    # Pipeline stages (one over all devices: gradient accumulation); None for a one-stage plan
    # over all devices, whose program is ``program``. A pipelined plan keeps the best one-stage
    # program in ``program`` and ``sim`` for comparison; its cost, memory and shares come from the stages.
    pipeline: Pipeline | None = None
    # plan.json's ``predicted`` entry when the plan was loaded (what the cost model that wrote it
    # predicted); empty for a plan made in this process.
    recorded: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # A pipelined plan's graph at one micro-batch, as changes to ``graph`` (JSON-ready; see hapc.codegen.
    # pipeline_emit): recorded by save() or emit(), so emitting from plan.json needs no torch; else None.
    microbatch_record: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    # Baselines that do not fit in memory: name -> bytes missing on the device short of most. A
    # speed-up over a program that cannot run is no speed-up; the reports say so instead.
    baseline_shortfall: dict[str, float] = field(default_factory=dict)
    _micro: Any = field(default=None, init=False, repr=False, compare=False)   # its MicroTrace, once made

    # ---- the contract's properties ---------------------------------------------------------
    @property
    def cost(self) -> float:
        """Predicted seconds per iteration."""
        if self.pipeline is not None:
            return float(self.pipeline.iteration_seconds)
        return self.sim.iteration_seconds

    @property
    def recorded_seconds(self) -> float:
        """The predicted seconds per iteration that plan.json recorded, read without simulating
        (:attr:`cost` re-simulates a loaded plan with the current cost model); the cost itself
        for a plan made in this process."""
        seconds = self.recorded.get("iteration_seconds")
        return float(seconds) if isinstance(seconds, (int, float)) else self.cost

    @property
    def ratios(self) -> list[float]:
        """Per-device shares of the sharded work, in cluster order (for a pipelined plan, each
        device's share inside its stage's group; 0 for a device no stage uses)."""
        if self.pipeline is None:
            return list(self.program.shares)
        out = [0.0] * self.cluster.world
        for st in self.pipeline.stages:
            for r, share in zip(st.ranks, st.program.shares):
                out[r] = float(share)
        return out

    @property
    def memory(self) -> list[float]:
        """Predicted peak bytes per device, in cluster order."""
        if self.pipeline is None:
            return list(self.sim.memory.totals)
        out = [0.0] * self.cluster.world
        for st, mem in zip(self.pipeline.stages, self.pipeline.cost.stage_memory_bytes):
            for r, b in zip(st.ranks, mem):
                out[r] = float(b)
        return out

    @property
    def stages(self) -> list[Stage]:
        """The pipeline stages; a one-stage plan has one stage over all devices."""
        from synth.stages import Stage

        if self.pipeline is not None:
            return list(self.pipeline.stages)
        return [Stage(0, len(self.graph.nodes), tuple(range(self.cluster.world)), self.program, None)]

    @property
    def fits(self) -> bool:
        if self.pipeline is None:
            return self.sim.memory.all_fit
        return self.pipeline.fits_in(self.cluster)

    @property
    def graph(self) -> Graph:
        return self.program.graph

    @property
    def lower_bound(self) -> float:
        return self.sim.lower_bound_seconds

    @property
    def speedups(self) -> dict[str, float]:
        """Speed-ups over the baselines that fit and split the batch (hapc.report.model.claimable)."""
        from hapc.report.model import claimable
        return {k: v / self.cost for k, v in self.baselines.items() if self.cost > 0 and claimable(self, k)}

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
        from hapc.report.summary import summary_text

        return summary_text(self)

    def report(self) -> str:
        """The plan as Markdown: time per iteration, speed-ups, devices, chart (inline SVG)."""
        from hapc.report.notebook import plan_markdown

        return plan_markdown(self)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the same content as :meth:`report`, as HTML."""
        from hapc.report.notebook import plan_html

        return plan_html(self)

    def __repr__(self) -> str:
        staged = "" if self.pipeline is None else f", {self.pipeline.shape}"
        return (f"Plan({self.name}: {self.cost * 1e3:.3f} ms/iter on {self.cluster.world} devices{staged}, "
                f"lower bound {self.lower_bound * 1e3:.3f} ms)")

    # ---- files -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """plan.json's data (canonical). For a loaded graph the ``graph`` entry is the dict read
        from the file, shared with the plan's next save: read it, do not change it."""
        steps = steps_to_dict(self.program)
        section = _GraphSection.of(self.graph)
        graph = section.data if section is not None else self.graph.to_dict()
        sim = self.sim
        cluster = self.cluster.to_dict()
        if self.cluster.op_table is not None:     # the measured times this plan was priced with
            cluster["measured_ops"] = self.cluster.op_table.restricted_to(self.graph).to_dict()
        out = _canonical({
            "format": FORMAT,
            "name": self.name,
            "model": self.model,
            "graph_hash": section.hash if section is not None else hash_of_json(graph),   # Graph.hash
            "cluster": cluster,
            "shares": list(self.program.shares), **memory_levers_entry(self.program),
            "source_layouts": {k: repr(v) for k, v in sorted(self.program.source_layouts.items())},
            "predicted": {
                "iteration_seconds": sim.iteration_seconds,
                "compute_seconds": sim.compute_seconds, "comm_seconds": sim.comm_seconds,
                "idle_seconds": sim.idle_seconds, "memory_bytes": list(sim.memory.totals),
                "lower_bound_seconds": sim.lower_bound_seconds,
            },
            "baselines": self.baselines,
            **({"baselines_short_bytes": self.baseline_shortfall} if self.baseline_shortfall else {}),
            "search": self.search,
            "precision": self.precision.to_dict(),
        })
        out["steps"] = steps        # canonical as made: names, layout texts, ints
        out["graph"] = graph if section is not None else _canonical_graph(graph)   # a loaded one is canonical
        if self.pipeline is not None:
            out["pipeline"] = _canonical(_pipeline_to_dict(self.pipeline, self.graph))
            if self.microbatch_record is not None:
                out["pipeline"]["microbatch_graph"] = _canonical(self.microbatch_record)
            out["predicted"]["one_stage_seconds"] = out["predicted"]["iteration_seconds"]
            out["predicted"]["iteration_seconds"] = _canonical(self.cost)
            out["predicted"]["memory_bytes"] = _canonical(self.memory)
        return out

    def save(self, path: str | Path) -> None:
        if self.pipeline is not None and self.model.get("file"):
            try:
                self._micro_batch()
            except UserError:       # no record; emitting the plan says why
                pass
        self._write(Path(path))

    def _write(self, path: Path) -> None:
        with gc_paused():       # tens of thousands of acyclic records (hapc.process.collector)
            data = self.to_dict()
            if data["model"].get("file"):
                data["model"] = {**data["model"], "file": stored_model_path(data["model"]["file"], path)}
            section = _GraphSection.of(self.graph)
            verbatim = {"graph": section.text} if section is not None and data["graph"] is section.data else {}
            text = plan_json(data, verbatim)
        path.write_text(text)

    def _micro_batch(self) -> Any:
        """A pipelined plan's graph at one micro-batch (a MicroTrace), made once: from the plan's
        record, else by tracing the model file (torch), which is then recorded. Outside the
        paused collector: a trace makes cyclic garbage."""
        from hapc.codegen.pipeline_emit import micro_batch_graph

        if self._micro is None:
            self._micro = micro_batch_graph(self)
            self.microbatch_record = self._micro.record
        return self._micro

    @staticmethod
    def load(path: str | Path) -> Plan:
        with gc_paused():       # tens of thousands of acyclic records (hapc.process.collector)
            return Plan._load(path)

    @staticmethod
    def _load(path: str | Path) -> Plan:
        try:
            text = Path(path).read_text()
            data, graph_text = _split_graph(text)
            if data is None:
                data = json.loads(text)
        except FileNotFoundError:
            raise UserError("no such plan file", where=str(path)) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"not a plan file (invalid JSON: {exc})", where=str(path)) from None
        except (ValueError, RecursionError) as exc:       # nesting or numbers beyond what JSON decoding takes
            raise UserError(f"not a plan file ({type(exc).__name__}: {_first_line(exc)})", where=str(path)) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise UserError(f"not a plan file (format should be {FORMAT!r})", where=str(path))
        model = data.get("model")
        if isinstance(model, dict) and isinstance(model.get("file"), str):
            data["model"] = {**model, "file": loaded_model_path(model["file"], path)}
        try:
            plan = Plan.from_dict(data)
        except UserError as exc:
            raise UserError(str(exc), where=str(path)) from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError, OverflowError) as exc:
            what = f"missing {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {_first_line(exc)}"
            raise UserError(f"not a valid plan file ({what})", where=str(path)) from None
        if graph_text is not None:
            _GraphSection.remember(plan.graph, data["graph"], graph_text)
        return plan

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Plan:
        graph = Graph.from_dict(data["graph"])
        cluster = load_cluster(data["cluster"])
        program = program_from_dict(graph, data)
        model = data.get("model", {})
        pipeline = None
        if "pipeline" in data:
            pipeline = _pipeline_from_dict(data["pipeline"], graph, cluster, model.get("optimizer", "adamw"))
        return Plan(program, cluster, None, data.get("name", "hapc"), dict(data.get("baselines", {})),
                    dict(data.get("search", {})), model, Precision.from_dict(data.get("precision")), pipeline,
                    dict(data.get("predicted", {})), data.get("pipeline", {}).get("microbatch_graph"),
                    baseline_shortfall=_shortfall(data.get("baselines_short_bytes", {})))

    def emit(self, out_dir: str | Path, constants: dict | None = None) -> Path:
        """Write ``out_dir/program.py`` (and the model file beside it); see :mod:`hapc.codegen`.

        ``constants`` are tensors ``torch.export`` lifted out of the model (``Traced.constants``);
        without them the program recovers them from the model at start-up. A pipelined plan needs
        its graph at one micro-batch: from its record (plan.json), else traced (torch) and then
        recorded (:mod:`hapc.codegen.pipeline_emit`)."""
        if not self.model.get("file"):
            raise UserError("this plan has no model file to emit a program for (plan a model file)")
        micro = self._micro_batch() if self.pipeline is not None else None
        with gc_paused():       # tables and lines of thousands of steps, all acyclic (hapc.process.collector)
            return self._emit(Path(out_dir), constants, micro)

    def _emit(self, out: Path, constants: dict | None, micro: Any) -> Path:
        from hapc.codegen import emit

        if micro is not None:       # stages: hapc.codegen.pipeline_emit
            from hapc.codegen.pipeline_emit import emit_pipeline

            return emit_pipeline(self, out, micro)
        out.mkdir(parents=True, exist_ok=True)
        return Path(emit(self.program, self.model["file"], str(out), model_kwargs=self.model.get("kwargs", {}),
                         optimizer=self.model.get("optimizer", "adamw"), plan_summary=self.summary(),
                         cluster=self.cluster, constants=constants, precision=self.precision))


def _shortfall(data: Any) -> dict[str, float]:
    """plan.json's ``baselines_short_bytes``, checked: names and non-negative byte counts."""
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, (int, float)) and v >= 0
                                             for k, v in data.items()):
        raise ValueError("baselines_short_bytes: expected baseline names and non-negative byte counts")
    return {k: float(v) for k, v in data.items()}


def prepare_save(graph: Graph) -> None:
    """Do now what saving a plan of ``graph``, a loaded plan's, would do first: hash its entry,
    which the save then finds done. For a caller with time to spare (hapc replan, while its
    child searches)."""
    section = _GraphSection.of(graph)
    if section is not None:
        _ = section.hash


def _pipeline_to_dict(pipeline: Pipeline, graph: Graph) -> dict[str, Any]:
    """Stages with their node range (and names, for readers), group ranks and group program;
    the predicted figures are there for readers and recomputed on load."""
    stages = []
    for st, end, mem in zip(pipeline.stages, pipeline.cost.stage_end_seconds, pipeline.cost.stage_memory_bytes):
        stages.append({
            "first_node": st.first_node, "stop_node": st.stop_node,
            "first_node_name": graph.nodes[st.first_node].name, "last_node_name": graph.nodes[st.stop_node - 1].name,
            "ranks": list(st.ranks), "shares": list(st.program.shares), **memory_levers_entry(st.program),
            "source_layouts": {k: repr(v) for k, v in sorted(st.program.source_layouts.items())},
            "steps": steps_to_dict(st.program),
            "predicted": {"fwd_seconds_per_microbatch": st.cost.fwd_seconds if st.cost else 0.0,
                          "bwd_seconds_per_microbatch": st.cost.bwd_seconds if st.cost else 0.0,
                          "end_seconds": end, "memory_bytes": list(mem)},
        })
    return {"microbatches": pipeline.microbatches, "schedule": pipeline.schedule, "stages": stages,
            "bubble_fraction": pipeline.cost.bubble_fraction,
            "search": {k: v for k, v in pipeline.search.items() if k != "seconds"}}   # no clock in the file


def _pipeline_from_dict(data: dict[str, Any], graph: Graph, cluster: Cluster, optimizer: str) -> Pipeline:
    from synth.stages import price_stages

    specs = [(st["first_node"], st["stop_node"], tuple(st["ranks"]), program_from_dict(graph, st))
             for st in data["stages"]]
    pipe = price_stages(graph, cluster, specs, int(data["microbatches"]), data["schedule"], optimizer)
    pipe.search = dict(data.get("search", {}))
    return pipe


# One item per line: dicts down to this depth below the top (0) (the graph's and the cluster's
# entries), and lists of records (steps, the graph's values and nodes) down to one deeper,
# each record on one line.
_DICT_LINES_DEPTH = 2
_ENCODER = json.JSONEncoder(sort_keys=True)
# The C encoder behind _ENCODER.encode, made once: encode() builds one per call, which was
# most of the cost of a short record. Same text (separators, key order, float repr).
_C_ENCODER = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, _ENCODER.default, json.encoder.encode_basestring_ascii, None, ": ", ", ", True, False, True)


def _encode(obj: Any) -> str:
    return "".join(_C_ENCODER(obj, 0)) if _C_ENCODER is not None else _ENCODER.encode(obj)


def plan_json(data: dict[str, Any], verbatim: dict[str, str] | None = None) -> str:
    """The text of plan.json for ``data`` (canonical: see the module docstring): keys sorted,
    one entry per line down to the big lists' records, each line written by the C encoder.
    ``verbatim``: top-level entries whose text is known already (what this function wrote
    for them before)."""
    if not verbatim:
        return _json_lines(data, 0) + "\n"
    lines = [f" {_encode(key)}: {verbatim[key] if key in verbatim else _json_lines(data[key], 1)}"
             for key in sorted(data)]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _json_lines(obj: Any, depth: int) -> str:
    pad, encode = " " * (depth + 1), _encode
    if isinstance(obj, dict) and obj and depth <= _DICT_LINES_DEPTH:
        lines = [f"{pad}{encode(key)}: {_json_lines(obj[key], depth + 1)}" for key in sorted(obj)]
        return "{\n" + ",\n".join(lines) + "\n" + " " * depth + "}"
    if _is_records(obj, depth):
        return "[\n" + ",\n".join(pad + encode(x) for x in obj) + "\n" + " " * depth + "]"
    return encode(obj)


def _is_records(obj: Any, depth: int) -> bool:
    return isinstance(obj, list) and bool(obj) and depth <= _DICT_LINES_DEPTH + 1 and isinstance(obj[0], (dict, list))


def _line_count(obj: Any, depth: int) -> int:
    """How many lines :func:`_json_lines` writes for ``obj`` (without encoding it)."""
    if isinstance(obj, dict) and obj and depth <= _DICT_LINES_DEPTH:
        return 2 + len(obj) + sum(_line_count(value, depth + 1) - 1 for value in obj.values()
                                  if isinstance(value, (dict, list)))
    if _is_records(obj, depth):
        return 2 + len(obj)
    return 1


# ---- the graph's lines, kept from a loaded plan.json ------------------------------------------

_GRAPH_KEY = '\n "graph": '          # the graph's entry as plan_json writes it (one space deep)
_TOP_CLOSE = "\n }"                  # a one-space-deep closing brace: only the entry's own


@dataclass
class _GraphSection:
    """The ``graph`` entry of a loaded plan.json: its data and its lines, for saving a plan of
    the same :class:`Graph` object again (a replan keeps the old plan's graph).

    Graphs are not changed after tracing (their hash keys the caches); the node and value
    counts are checked anyway, and an entry goes when its graph does."""

    graph: weakref.ref
    data: dict[str, Any]
    text: str
    sizes: tuple[int, int]
    _hash: str | None = None

    _by_graph: ClassVar[dict[int, _GraphSection]] = {}

    @staticmethod
    def remember(graph: Graph, data: dict[str, Any], text: str) -> None:
        key = id(graph)
        _GraphSection._by_graph[key] = _GraphSection(weakref.ref(graph), data, text,
                                                     (len(graph.nodes), len(graph.values)))
        weakref.finalize(graph, _GraphSection._by_graph.pop, key, None)

    @staticmethod
    def of(graph: Graph) -> _GraphSection | None:
        found = _GraphSection._by_graph.get(id(graph))
        if found is None or found.graph() is not graph or found.sizes != (len(graph.nodes), len(graph.values)):
            return None
        return found

    @property
    def hash(self) -> str:
        if self._hash is None:
            self._hash = hash_of_json(self.data)
        return self._hash


def _split_graph(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """plan.json's data, read with its graph entry's text cut out and parsed on its own, and
    that text; (None, None) when the file is not laid out as :func:`plan_json` writes it (the
    caller then parses it whole). The entry is kept only if it has exactly the lines
    plan_json writes for its data, so writing it again is what encoding it would give."""
    start = text.find(_GRAPH_KEY)
    if start < 0:
        return None, None
    begin = start + len(_GRAPH_KEY)
    end = text.find(_TOP_CLOSE, begin)
    if end < 0:
        return None, None
    end += len(_TOP_CLOSE)
    try:
        rest = json.loads(text[:begin] + "null" + text[end:])
        graph = json.loads(text[begin:end])
    except json.JSONDecodeError:
        return None, None
    entry = text[begin:end]
    if not (isinstance(rest, dict) and "graph" in rest and rest["graph"] is None and isinstance(graph, dict)
            and _line_count(graph, 1) == entry.count("\n") + 1):
        return None, None
    rest["graph"] = graph
    return rest, entry


# Graph.to_dict entries that hold no float and no tuple (names, shapes, source lines): already
# canonical. The name lists are the graph's own and get copied; the others are made by to_dict.
_GRAPH_NAME_LISTS = frozenset({"inputs", "params", "buffers"})
_GRAPH_PLAIN = frozenset({"values", "output", "sources", "mutates"}) | _GRAPH_NAME_LISTS


def _canonical_graph(graph: dict[str, Any]) -> dict[str, Any]:
    """:func:`_canonical` of a ``Graph.to_dict()``, walking only the entries that can hold floats
    (node arguments, costs, torch's facts)."""
    return {key: _canonical(value) if key not in _GRAPH_PLAIN else list(value) if key in _GRAPH_NAME_LISTS
            else value for key, value in graph.items()}


# Values _canonical returns as they are (by exact type: a subclass takes the general path).
_AS_IS = frozenset({str, int, bool, type(None)})


def _canonical(obj: Any) -> Any:
    """Floats to 9 significant digits (stable text), tuples to lists, keys as strings.

    A plan holds about 60k values for a 48-layer GPT, most of them names and numbers: those
    are passed over inline rather than by a call each."""
    kind = type(obj)
    if kind is dict:
        return {str(k): v if type(v) in _AS_IS else _canonical(v) for k, v in obj.items()}
    if kind is list or kind is tuple:
        return [x if type(x) in _AS_IS else _canonical(x) for x in obj]
    if isinstance(obj, float):
        if math.isnan(obj) or math.isinf(obj):
            return str(obj)
        return float(f"{obj:.9g}") + 0.0
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canonical(x) for x in obj]
    return obj


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
