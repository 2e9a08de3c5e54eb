"""The rule checker: every strategy of every registered rule against the unsharded op.

For each sample of a rule we build a one-node graph, and for each strategy we cut the
global inputs into uneven pieces (``Shard``: shares 0.5/0.3/0.2 over 3 ranks, on sizes that
do not divide evenly; ``Partial``: random summands), run the strategy's local computation on
every rank, reassemble the output from its layout and compare it, and the gradients of all
float inputs, with the single-device result. A strategy that disagrees is a *wrong rule*.

For a random op the single-device result is the op's counter-based draw over the whole
output (:func:`hapc.runtime.random_ops.draw`), not torch's generator (whose values no two
runs share) nor the rule's own replicated strategy: every strategy, the replicated one too,
must give exactly that draw's pieces, and every rank of a replicated one the same values.

``python -m hapc.rules check`` prints a report; ``tests/rules/test_rules_check.py`` runs the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hapc.ir.graph import Graph, Node, Ref, TensorMeta, Value
from hapc.ir.layout import ExpertRows, Layout, Partial, Replicate, Shard
from hapc.ir.program import Compute, DistProgram, Redistribute, Strategy
from hapc.rules.registry import Rule, Sample, rules, strategies
from hapc.runtime.random_ops import RANDOM_OPS, draw

DEFAULT_SHARES = (0.5, 0.3, 0.2)


@dataclass
class Finding:
    op: str
    strategy: Strategy
    sample: int
    error: str

    def __str__(self) -> str:
        return f"WRONG {self.op} sample {self.sample} {self.strategy}: {self.error}"


@dataclass
class Report:
    rules: int = 0
    strategies: int = 0
    samples: int = 0
    wrong: list[Finding] = field(default_factory=list)
    no_samples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.wrong and not self.no_samples


def sample_graph(op: str, sample: Sample) -> tuple[Node, Graph, list[torch.Tensor]]:
    """A graph with a single node applying ``op`` to the sample's arguments."""
    tensors: list[torch.Tensor] = []
    values: dict[str, Value] = {}

    def lift(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            name = f"in{len(tensors)}"
            tensors.append(a)
            meta = TensorMeta(tuple(a.shape), str(a.dtype).removeprefix("torch."))
            values[name] = Value(name, meta, "input", requires_grad=a.is_floating_point())
            return Ref(name)
        if isinstance(a, (list, tuple)):
            return type(a)(lift(x) for x in a)
        if isinstance(a, torch.dtype):
            return str(a).removeprefix("torch.")
        return a

    args = tuple(lift(a) for a in sample.args)
    kwargs = {k: lift(v) for k, v in sample.kwargs.items()}
    from hapc.codegen.executor import _resolve  # executor sits above rules

    result = _resolve(op)(*sample.args, **sample.kwargs)
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    outs = []
    for i, r in enumerate(results):
        name = f"out{i}"
        values[name] = Value(name, TensorMeta(tuple(r.shape), str(r.dtype).removeprefix("torch.")),
                             "activation", requires_grad=r.is_floating_point())
        outs.append(name)
    node = Node("n", op, args, kwargs, tuple(outs))
    inputs = [f"in{i}" for i in range(len(tensors))]
    graph = Graph(values, [node], inputs, [], [], outs[0])
    return node, graph, tensors


def check_strategy(op: str, sample: Sample, strategy: Strategy, shares: Sequence[float] = DEFAULT_SHARES,
                   dtype: torch.dtype = torch.float64, atol: float = 1e-9) -> str | None:
    """``None`` when ``strategy`` reproduces the op on uneven pieces; else what went wrong."""
    from hapc.codegen.executor import _compute  # executor sits above rules

    node, graph, tensors = sample_graph(op, sample)
    gen = torch.Generator().manual_seed(0)
    globals_ = [t.to(dtype).detach().clone().requires_grad_(i not in sample.frozen)
                if t.is_floating_point() else t for i, t in enumerate(tensors)]
    ref_out = _reference(op, node, graph, globals_)

    prog = DistProgram(graph, tuple(shares), {n: Replicate() for n in graph.inputs})
    read = []
    for i, (ref, lay) in enumerate(zip(node.input_refs(), strategy.inputs)):
        read.append(f"{ref}@{i}")
        prog.steps.append(Redistribute(ref, read[-1], Replicate(), lay))
    prog.steps.append(Compute("n", strategy, tuple(read)))
    owners = _row_owners(prog, sample, globals_, read, gen)
    env = {name: _pieces(prog, name, globals_[graph.inputs.index(ref)], lay, gen, owners)
           for name, ref, lay in zip(read, node.input_refs(), strategy.inputs)}
    try:
        outs = _compute(prog, node, prog.steps[-1], env, seed=1)
    except Exception as exc:  # a strategy that cannot even run on its pieces is wrong too
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    err = 0.0
    float_globals = [g for g in globals_ if g.is_floating_point()]
    dist_total = ref_total = 0.0
    for name, lay, pieces, ref in zip(node.outputs, strategy.outputs, outs, ref_out):
        try:
            full = _assemble(prog, name, lay, pieces, owners)
        except AssertionError as exc:       # ranks disagree on a replicated output
            return str(exc)
        if full.shape != ref[0].shape:
            return f"output shape {tuple(full.shape)} != {tuple(ref[0].shape)}"
        if not ref[0].is_floating_point():
            if not torch.equal(full, ref[0]):
                return "integer output differs"
            continue
        err = max(err, (full - ref[0]).abs().max().item() if full.numel() else 0.0)
        w = torch.randn(full.shape, generator=gen, dtype=full.dtype)
        dist_total = dist_total + (full * w).sum()
        ref_total = ref_total + (ref[0] * w).sum()
    if err > atol:
        return f"forward max_abs_err={err:.3g}"
    needs = [g for g in float_globals if g.requires_grad]
    if needs and isinstance(dist_total, torch.Tensor) and dist_total.requires_grad:
        got = torch.autograd.grad(dist_total, needs, allow_unused=True)
        # An op with no gradient (full_like) may still be tied to its inputs on a rank with
        # empty pieces (hapc.runtime.local_ops.empty_piece_result): zero gradients then.
        want = torch.autograd.grad(ref_total, needs, allow_unused=True) \
            if isinstance(ref_total, torch.Tensor) and ref_total.requires_grad else [None] * len(needs)
        for g, w in zip(got, want):
            g = torch.zeros_like(w) if g is None and w is not None else g
            w = torch.zeros_like(g) if w is None and g is not None else w
            if g is not None and g.numel() and (g - w).abs().max().item() > atol:
                return f"gradient max_abs_err={(g - w).abs().max().item():.3g}"
    return None


def _reference(op: str, node: Node, graph: Graph, globals_: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The single-device result of the node (per output, a one-rank list): the plain op run
    through the rule's replicated strategy, or for a random op its counter-based global draw."""
    if op in RANDOM_OPS:
        from hapc.codegen.executor import _substitute

        args, kwargs = _substitute(node, list(globals_))
        return [[draw(op, node.name, 1, graph.meta(node.outputs[0]).shape, None, args, kwargs)]]
    from hapc.codegen.executor import _compute

    ref_prog = DistProgram(graph, (1.0,), {n: Replicate() for n in graph.inputs})
    ref_strat = next(s for s in strategies(node, graph) if s.is_replicated)
    return _compute(ref_prog, node, Compute("n", ref_strat, tuple(node.input_refs())),
                    {n: [t] for n, t in zip(graph.inputs, globals_)}, seed=1)


def _row_owners(prog: DistProgram, sample: Sample, globals_: list[torch.Tensor], read: list[str],
                gen) -> Callable[[int], torch.Tensor]:
    """For ``rows`` rows of ``ExpertRows``, the rank holding each (see
    ``Sample.owners``): at random (the same for every input of ``rows`` rows), or the rank
    holding the row's expert."""
    if sample.owners in ("experts", "routed"):
        table = 0 if sample.owners == "routed" else next(i for i, t in enumerate(globals_) if t.dim() == 3)
        ints = next(t for t in globals_ if t.dim() == 1 and not t.is_floating_point()).to(torch.int64)
        expert_owner = torch.repeat_interleave(torch.arange(prog.world), torch.tensor(prog.lengths(read[table], 0)))
        if sample.owners == "routed":          # the sorted expert id of every row
            by_row = expert_owner[ints]
        else:                                  # the cumulative row counts of the experts
            by_row = torch.repeat_interleave(expert_owner, torch.diff(ints, prepend=ints.new_zeros(1)))
        return lambda rows: by_row[:rows]
    drawn: dict[int, torch.Tensor] = {}
    return lambda rows: drawn.setdefault(rows, torch.randint(0, prog.world, (rows,), generator=gen))


def _pieces(prog: DistProgram, name: str, full: torch.Tensor, layout: Layout, gen,
            owners: Callable[[int], torch.Tensor] | None = None) -> list[torch.Tensor]:
    world = prog.world
    if isinstance(layout, ExpertRows):  # each rank its owned rows, in order
        owner = owners(full.shape[0])
        return [full[owner == r] for r in range(world)]
    if isinstance(layout, Replicate):
        return [full] * world
    if isinstance(layout, Shard):
        return list(torch.split(full, prog.lengths(name, layout.dim), dim=layout.dim))
    if isinstance(layout, Partial):  # random summands that add up to the value
        if not full.is_floating_point():
            return [full] + [torch.zeros_like(full)] * (world - 1)
        noise = [torch.randn(full.shape, generator=gen, dtype=full.dtype) for _ in range(world - 1)]
        return [full - sum(noise)] + noise
    raise ValueError(layout)


def _assemble(prog: DistProgram, name: str, layout: Layout, pieces: list[torch.Tensor],
              owners: Callable[[int], torch.Tensor]) -> torch.Tensor:
    if isinstance(layout, ExpertRows):  # each rank's rows back in their places
        owner = owners(sum(p.shape[0] for p in pieces))
        if [int((owner == r).sum()) for r in range(len(pieces))] != [p.shape[0] for p in pieces]:
            raise AssertionError("ExpertRows output: a rank holds other rows than its experts'")
        full = pieces[0].new_zeros((len(owner), *pieces[0].shape[1:]))
        for r, p in enumerate(pieces):
            full = full.index_put((torch.nonzero(owner == r).flatten(),), p)
        return full
    if isinstance(layout, Shard):
        return torch.cat(pieces, dim=layout.dim)
    if isinstance(layout, Partial):
        return torch.stack(pieces).sum(0)
    for p in pieces[1:]:
        if p.shape != pieces[0].shape or not torch.allclose(p, pieces[0], atol=1e-9, equal_nan=True):
            raise AssertionError("Replicate output differs across ranks")
    return pieces[0]


def check_rule(rule: Rule, shares: Sequence[float] = DEFAULT_SHARES, report: Report | None = None) -> Report:
    report = report or Report()
    report.rules += 1
    samples = rule.samples() if rule.samples else []
    if not samples:
        report.no_samples.append(rule.op)
        return report
    for i, sample in enumerate(samples):
        report.samples += 1
        try:
            node, graph, _ = sample_graph(rule.op, sample)
        except Exception as exc:  # a sample the op itself rejects is a bug in the sample
            report.wrong.append(Finding(rule.op, Strategy((), ()), i, f"sample does not run: {str(exc).splitlines()[0]}"))
            continue
        for strat in strategies(node, graph):
            report.strategies += 1
            try:
                err = check_strategy(rule.op, sample, strat, shares)
            except Exception as exc:  # report, and go on checking the other rules
                err = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if err:
                report.wrong.append(Finding(rule.op, strat, i, err))
    return report


def check_all(ops: Sequence[str] | None = None, shares: Sequence[float] = DEFAULT_SHARES,
              progress: Callable[[int, int, str], None] | None = None) -> Report:
    """Check the rules of ``ops`` (default: every op with a rule); ``progress(done, total, op)``
    is called before each rule is checked."""
    report = Report()
    chosen = [(op, rule) for op, rule in rules().items() if not ops or op in ops]
    for done, (op, rule) in enumerate(chosen):
        if progress is not None:
            progress(done, len(chosen), op)
        check_rule(rule, shares, report)
    return report


def matching_ops(names: Sequence[str]) -> list[str]:
    """The ops with rules that ``names`` name: a whole op (``aten.mm.default``) or its packet
    (``mm``, ``aten.mm``: every overload). Raises ValueError naming a name that matches none."""
    known = list(rules())
    found: list[str] = []
    for name in names:
        bare = name.removeprefix("aten.")
        hits = [op for op in known if op == name or op.split(".")[1] == bare]
        if not hits:
            close = sorted(op for op in known if bare and bare in op)[:5]
            raise ValueError(f"no rule for an op named {name!r}" + (f"; did you mean {', '.join(close)}?" if close
                                                                       else "; hapc rules lists them"))
        found += [op for op in hits if op not in found]
    return found
