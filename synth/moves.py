"""The search's move tables: what every strategy of a node costs from a given state.

A state is a tuple of layout bitmasks, one per activation live at that point (layouts are
small ints: R=0, P=1, S(d)=2+d). For each node, :meth:`MoveTables._compile` turns its
strategies into plain tuples (state-independent seconds, the activation inputs to convert,
the masks its outputs are born with), so pricing a move is index arithmetic and a few dict
lookups. The conversion and layout-change prices depend on the graph and the prices alone and
are shared, through the :class:`synth.costs.Prices` object, by every search at the same
prices. :class:`synth.search.Searcher` decides which moves to make; the bounds of
:mod:`synth.bounds` and the elimination of :mod:`synth.elimination` read the same tables.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable

from hapc.ir.layout import ExpertRows, Layout, Partial, Replicate, Shard
from hapc.ir.shards import storage_dim
from synth.space import FREE, PARAM, NodeSpace, SearchSpace, layout_order

EXPERT_ROWS_CODE = 18     # after R 0, P 1 and S(0..15) 2..17; no conversion reaches or leaves it

State = tuple  # layout bitmasks, one per activation live at that point (see MoveTables._live)


class MoveTables:
    """Prices of moves in one search space: per node, per strategy, from any state."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.prices = space.prices
        self.graph = space.graph
        self._param_cache: dict[tuple, tuple[float, Layout]] = {}
        # codes: R 0, P 1, S(d) 2 + d, E 18 (see code())
        self.layouts: list[Layout] = [Replicate(), Partial()] + [Shard(d) for d in range(16)] + [ExpertRows()]
        # Value ids and signatures, and every table below up to _relax_rows, depend on the graph
        # and the layout-change prices alone: searches at the same prices (the outer loop's
        # overlap assumptions) share them through the Prices object.
        memos = self.prices.search_memos
        if not memos:
            sigs: dict[tuple, int] = {}
            memos.update(vid={name: i for i, name in enumerate(self.graph.values)}, names=list(self.graph.values),
                         sig=[sigs.setdefault((v.meta, v.requires_grad), len(sigs))
                              for v in self.graph.values.values()],
                         move={}, conv={}, conv_seconds={}, codes={}, alt={})
        self._vid: dict[str, int] = memos["vid"]
        self._names: list[str] = memos["names"]
        self._sig: list[int] = memos["sig"]
        self._move_cache: dict[tuple[int, int, int], float] = memos["move"]
        self._conv_cache: dict[tuple[int, int, int], tuple[float, int]] = memos["conv"]
        # Per (value signature, wanted layout): held mask -> seconds to get it (the hot loop's
        # view of _conv_cache, one dict lookup per input instead of a tuple key and a call).
        self._conv_seconds: dict[tuple[int, int], dict[int, float]] = memos["conv_seconds"]
        self._codes_cache: dict[int, list[int]] = memos["codes"]
        self._alt_cache: dict[tuple[int, int], list[tuple[int, float]]] = memos["alt"]
        # Per (node, value, allowed strategies of a segment's last node or None): the relaxation
        # rows of ValueBound._solve, see _relaxation_rows (they carry parameter prices: per search).
        self._relax_rows: dict[tuple, list[tuple]] = {}
        self._templates: dict[tuple, list[tuple]] = {}
        self._live = [[self._vid[v] for v in live] for live in space.live]
        self._tables = _Tables(self)

    @staticmethod
    def code(layout: Layout) -> int:
        if isinstance(layout, Replicate):
            return 0
        if isinstance(layout, ExpertRows):
            return EXPERT_ROWS_CODE
        if isinstance(layout, Partial):
            return 1
        return 2 + layout.dim

    # ---- prices of one move ----------------------------------------------------------------
    def _move_seconds(self, vid: int, src: int, dst: int) -> float:
        key = (self._sig[vid], src, dst)
        hit = self._move_cache.get(key)
        if hit is None:
            v = self.graph.values[self._names[vid]]
            hit = self.prices.move(v.meta, v.requires_grad, self.layouts[src], self.layouts[dst]).seconds
            self._move_cache[key] = hit
        return hit

    def _factor_price(self, ns: NodeSpace, strat) -> float:
        """Sufficient factor broadcasting replaces the weight's all-reduce by two gathers; it
        needs the weight stored whole, so it is out when replicated storage is."""
        if not self.space.allow_replicated_params:
            return math.inf
        x = self.graph.values[ns.inputs[0][0]].meta
        y = self.graph.values[ns.node.outputs[0]].meta
        return self.prices.factor_gather_seconds(x, strat.inputs[0], y, strat.outputs[0])

    def _convert(self, vid: int, mask: int, want: int) -> tuple[float, int]:
        """Cheapest (seconds, source layout) to get layout ``want`` from the copies in ``mask``."""
        key = (self._sig[vid], mask, want)
        hit = self._conv_cache.get(key)
        if hit is None:
            hit = min((self._move_seconds(vid, src, want), src) for src in _bits(mask))
            self._conv_cache[key] = hit
        return hit

    def _param_price(self, name: str, want: Layout) -> tuple[float, Layout]:
        """Cheapest (seconds, storage layout) for reading parameter ``name`` as ``want``."""
        v = self.graph.values[name]
        uses = self.space.param_uses.get(name, 1)
        key = (v.meta, v.requires_grad, want, uses, self.space.allow_replicated_params)
        hit = self._param_cache.get(key)
        if hit is not None:
            return hit
        options: list[tuple[float, Layout]] = []
        if isinstance(want, Shard):
            options.append((0.0, want))
        if self.space.allow_replicated_params or not v.requires_grad:
            sync = self.prices.grad_sync_seconds(v.meta) / uses if v.requires_grad else 0.0
            move = self.prices.move(v.meta, v.requires_grad, Replicate(), want).seconds
            options.append((sync + move, Replicate()))
        if not isinstance(want, Shard):          # ZeRO-3: stored sharded, gathered for use
            d = storage_dim(v.meta.shape)
            if d is not None:
                gather = self.prices.move(v.meta, v.requires_grad, Shard(d), Replicate()).seconds
                # and gathered again for backward, not kept (costmodel.transfers.regathered)
                gather += self.prices.move(v.meta, False, Shard(d), Replicate()).seconds
                options.append((gather, Shard(d)))
        if not options:
            options.append((self.prices.move(v.meta, v.requires_grad, Replicate(), want).seconds, Replicate()))
        best = min(options, key=lambda o: (o[0], layout_order(o[1])))
        self._param_cache[key] = best
        return best

    def _compile(self, ns: NodeSpace) -> list[tuple]:
        """Per strategy: (state-independent seconds, activation inputs, fixed sources, carry,
        carrier, conversions).

        States are tuples of layout masks aligned with the (static) list of activations live
        before each node, so a move is index arithmetic. Parameter and free inputs cost the
        same in every state, so they are priced here once. ``carry`` says, for each value live
        after the node, which slot before it holds its layouts, or which mask it is born with;
        ``carrier`` applies it. ``conversions`` is the activation inputs as the hot loop reads
        them: (slot, wanted layout bit, that layout's conversion table, value id, layout code).
        Repeated layers have the same table up to which activations they read, so the table is
        built once per shape and only the value ids are filled in.
        """
        i = ns.index
        before = {vid: k for k, vid in enumerate(self._live[i])}
        shape: list = []
        act_vids: dict[int, int] = {}
        for pos, (value, kind) in enumerate(ns.inputs):
            if kind == PARAM:
                v = self.graph.values[value]
                shape.append((v.meta, v.requires_grad, self.space.param_uses.get(value, 1)))
            elif kind == FREE:
                shape.append(None)
            else:
                act_vids[pos] = vid = self._vid[value]
                shape.append(before[vid])
        born_at = {self._vid[o]: k for k, o in enumerate(ns.node.outputs)}
        carry_shape = tuple(before[vid] if vid in before else -1 - born_at[vid] for vid in self._live[i + 1])
        key = (ns.signature, len(before), tuple(shape), carry_shape)
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = self._compile_template(ns, shape, carry_shape)
        return [(base, tuple((pos, slot, want, act_vids[pos]) for pos, slot, want in acts), fixed, carry, carried,
                 tuple((slot, 1 << want, self._conversions(act_vids[pos], want), act_vids[pos], want)
                       for pos, slot, want in acts))
                for base, acts, fixed, carry, carried in template]

    def _conversions(self, vid: int, want: int) -> dict[int, float]:
        """The (lazily filled) table ``held mask -> seconds`` to get ``vid`` in layout ``want``,
        shared by every value of the same signature."""
        key = (self._sig[vid], want)
        table = self._conv_seconds.get(key)
        if table is None:
            table = self._conv_seconds[key] = {}
        return table

    def _conversion_miss(self, table: dict[int, float], vid: int, mask: int, want: int) -> float:
        """Price a conversion a :meth:`_conversions` table does not hold yet, and keep it there."""
        seconds = table[mask] = self._convert(vid, mask, want)[0]
        return seconds

    def _compile_template(self, ns: NodeSpace, shape: list, carry_shape: tuple[int, ...]) -> list[tuple]:
        """:meth:`_compile`'s table with activation inputs as (position, slot, layout code)."""
        table = []
        for k, strat in enumerate(ns.options):
            base = ns.compute_seconds[k]
            sfb = strat.local == "linear_sfb"
            if sfb:
                base += self._factor_price(ns, strat)
            fixed: list[Layout | None] = []
            acts = []
            for pos, ((value, kind), want) in enumerate(zip(ns.inputs, strat.inputs)):
                if kind == FREE:
                    fixed.append(None)
                elif kind == PARAM and sfb:       # complete gradients on every rank: no sync
                    fixed.append(Replicate())
                elif kind == PARAM:
                    c, storage = self._param_price(value, want)
                    base += c
                    fixed.append(storage)
                else:
                    fixed.append(None)
                    acts.append((pos, shape[pos], self.code(want)))
            born = [1 << self.code(lay) for lay in strat.outputs]
            carry = tuple((slot, 0) if slot >= 0 else (-1, born[-1 - slot]) for slot in carry_shape)
            table.append((base, tuple(acts), tuple(fixed), carry, _carrier(carry, len(self._live[ns.index]))))
        return table

    def _expand(self, ns: NodeSpace, state: State) -> list[tuple[State, float, int, tuple]]:
        """(new state, seconds, strategy index, sources) for every strategy of node ``ns``.

        The hot loop of the search: plain tuples, no objects (a :class:`Choice` is made only
        for moves that improve a state)."""
        convert = self._convert
        layouts = self.layouts
        out = []
        for k, (base, acts, fixed, _, carried, _) in enumerate(self._tables[ns.index]):
            if not acts:
                out.append((carried(list(state)), base, k, fixed))
                continue
            cost = base
            masks = list(state)
            sources = list(fixed)
            for pos, slot, want, vid in acts:
                mask = masks[slot]
                bit = 1 << want
                if mask & bit:
                    sources[pos] = layouts[want]
                    continue
                c, src = convert(vid, mask, want)
                cost += c
                sources[pos] = layouts[src]
                masks[slot] = mask | bit
            out.append((carried(masks), cost, k, tuple(sources)))
        return out

    def _sources(self, ns: NodeSpace, state: State, k: int) -> tuple[Layout | None, ...]:
        """The sources :meth:`_expand` gives strategy ``k`` of node ``ns`` from ``state``,
        worked out for that strategy alone (a path needs one move per node, not all of them)."""
        _, acts, fixed, *_ = self._tables[ns.index][k]
        layouts = self.layouts
        masks = list(state)
        sources = list(fixed)
        for pos, slot, want, vid in acts:
            mask = masks[slot]
            bit = 1 << want
            if mask & bit:
                sources[pos] = layouts[want]
                continue
            sources[pos] = layouts[self._convert(vid, mask, want)[1]]
            masks[slot] = mask | bit
        return tuple(sources)

    def _alternatives(self, vid: int, mask: int) -> list[tuple[int, float]]:
        """(single-layout mask, seconds to convert it into every layout of ``mask``) for each
        other layout ``vid`` can take, cheapest first: the candidates :meth:`_dominated` looks up."""
        key = (self._sig[vid], mask)
        hit = self._alt_cache.get(key)
        if hit is None:
            hit = []
            for code in self._codes_of(vid):
                alt = 1 << code
                if alt != mask:
                    hit.append((alt, sum(self._move_seconds(vid, code, c) for c in _bits(mask) if c != code)))
            hit.sort(key=lambda a: a[1])
            self._alt_cache[key] = hit
        return hit

    def _relaxation_rows(self, j: int, vid: int, options: frozenset[int] | None) -> list[tuple]:
        """Node ``j``'s strategies as the relaxation tracking ``vid`` sees them (see
        :meth:`ValueBound._solve`): (seconds, the (bit, code, conversion table) of each
        layout it wants ``vid`` in,
        the (value, mask) of each output born live), the cheapest strategy per distinct wish
        (the others cannot be better there), restricted to ``options`` when given. Outputs
        count only at nodes that read ``vid``."""
        key = (j, vid, options)
        hit = self._relax_rows.get(key)
        if hit is None:
            cheapest: dict[tuple, float] = {}
            after = self._live[j + 1]
            for k, (base, acts, _, carry, *_) in enumerate(self._tables[j]):
                if options is not None and k not in options:
                    continue
                wants = tuple(want for _, _, want, v in acts if v == vid)
                reads = any(v == vid for _, _, _, v in acts)
                born = tuple((after[n], bit) for n, (slot, bit) in enumerate(carry) if slot < 0) if reads else ()
                if base < cheapest.get((wants, born), math.inf):
                    cheapest[(wants, born)] = base
            hit = self._relax_rows[key] = [
                (base, tuple((1 << want, want, self._conversions(vid, want)) for want in wants), born)
                for (wants, born), base in cheapest.items()]
        return hit

    def _codes_of(self, vid: int) -> list[int]:
        hit = self._codes_cache.get(vid)
        if hit is None:
            shape = self.graph.values[self._names[vid]].meta.shape
            hit = [0, 1] + [2 + d for d, n in enumerate(shape) if n > 1]
            self._codes_cache[vid] = hit
        return hit

    def _node_floor(self, ns: NodeSpace) -> float:
        """No move at this node costs less than its cheapest strategy's own price."""
        return min(t[0] for t in self._tables[ns.index]) if ns.options else 0.0


class _Tables:
    """Each node's move table (see :meth:`MoveTables._compile`), built on first use: the A*
    and its bounds visit the first instances of each repeated segment, the rest are memo hits."""

    def __init__(self, owner: MoveTables) -> None:
        # A weak reference: the owner holds these tables, and a cycle would keep its memos
        # alive until the cyclic collector runs (the search pauses it).
        self._owner = weakref.ref(owner)
        self._nodes = owner.space.nodes
        self._rows: list[list[tuple] | None] = [None] * len(self._nodes)

    def __getitem__(self, index: int | slice) -> list:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._rows)))]
        rows = self._rows[index]
        if rows is None:
            rows = self._rows[index] = self._owner()._compile(self._nodes[index])
        return rows

    def __len__(self) -> int:
        return len(self._rows)


def _carrier(carry: tuple[tuple[int, int], ...], slots_before: int) -> Callable[[list[int]], State]:
    """A fast ``masks before -> state after`` for one strategy: an itemgetter over the masks
    before the node followed by the masks its outputs are born with (the search's hot loop)."""
    born = [bit for slot, bit in carry if slot < 0]
    picks, n_born = [], 0
    for slot, _ in carry:
        if slot >= 0:
            picks.append(slot)
        else:
            picks.append(slots_before + n_born)
            n_born += 1
    if not picks:
        return lambda masks: ()
    getter = operator.itemgetter(*picks)
    if len(picks) == 1:
        return lambda masks: (getter(masks + born),)
    if not born:
        return getter
    return lambda masks: getter(masks + born)


def _bits(mask: int) -> list[int]:
    return [c for c in range(mask.bit_length()) if mask >> c & 1]
