"""Pipeline runtime for emitted programs: this rank's stage of a pipelined plan, its schedule,
and the point-to-point exchange of activations and their gradients between stages.

A pipelined ``program.py`` holds one table per stage (``STAGES``: the group's global ranks,
its SPMD tables at micro-batch shapes, what it receives and sends at its cuts) and one forward
function per stage; this file runs them. Every rank builds every stage's process group (in
stage order, as ``dist.new_group`` requires), finds its own stage, and runs that stage's
forward and backward over the micro-batches in the schedule's order.

**Why not torch.distributed.pipelining.** Its ``PipelineStage`` is one rank (or one rank per
pipeline of a DeviceMesh whose other dimensions are equal): its schedules send a stage's
output from that rank to the next stage's rank. Here a stage is an SPMD *group* of unequal
size (1 + 2 + 3 ranks) with uneven shares inside, and the boundary tensors are laid out
differently by the two groups' programs, so the exchange and the schedule are written here,
on the same torch primitives (``batch_isend_irecv``, process groups, autograd).

**Across a cut** every value live there (the hidden state, and an attention mask or the
positions when the model passes them on) travels *whole*, once, from the sending group's
first rank to the receiving group's first rank, then is broadcast inside the receiving group
(each member cuts its piece in its own layout). The sender first makes the value whole in its
group (all-gather of a Shard, all-reduce of a Partial; nothing for a Replicate). Backward is
the mirror image: the receiving group sums the gradients of its copies onto its first rank
(``dist.reduce``), which sends the one whole gradient back; on the sending group it enters
backward on the first rank (the others back-propagate zeros), which is the Partial gradient
a Replicate value has, and autograd runs the all-gather's or all-reduce's dual.

**Schedules.** 1F1B: stage ``s`` of ``S`` runs ``min(S - s - 1, m)`` warm-up forwards, then
alternates one forward and one backward, then drains the backwards (at most ``S - s``
micro-batches' activations held). GPipe: every forward, then every backward. Sends are
posted asynchronously and waited for at the end of the step; receives block, so a stage
waits exactly for the data it needs and the schedules cannot deadlock.

**Loss.** How micro-batches add up was decided at compile time from the graph
(``synth.microbatching``; a model whose samples are coupled is refused there). A mean over the
batch: ``LOSS_SCALE`` is ``1/m``; a sum: 1. A mean over counted targets (``LOSS_COUNT``: labels
with an ignored id, class weights): the last stage counts each micro-batch's targets (summed over
its group when it holds them in pieces), back-propagates the micro-batch loss times that count,
and at the end every rank divides its gradients, and the step's loss, by the whole batch's count
(sent from the last stage with the loss); a micro-batch with nothing to count adds nothing.
Gradients accumulate over micro-batches; each group then all-reduces its replicated
parameters' gradients once, and parameters that several stages read (a head tied to the
embedding) have their gradients summed across those stages' first ranks. Under fp16 the last
stage back-propagates the loss times the loss scale (the cut gradients carry it), and once
everything is summed every rank unscales and the found-inf verdict is agreed over the whole
world (``hapc_loss_scale.py``), so no stage steps while another skips.

This module depends on torch only: code generation copies it beside emitted programs.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

FORWARD, BACKWARD = "forward", "backward"


def schedule_order(schedule: str, stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """The (phase, micro-batch) sequence stage ``stage`` of ``stages`` runs."""
    m = microbatches
    if schedule == "gpipe":
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}")
    warmup = min(stages - stage - 1, m)
    order = [(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(FORWARD, warmup + i), (BACKWARD, i)]
    return order + [(BACKWARD, i) for i in range(m - warmup, m)]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _wire(t: torch.Tensor) -> torch.Tensor:
    """Point-to-point ops move numbers: booleans travel as bytes."""
    return t.to(torch.uint8) if t.dtype == torch.bool else t


@dataclass
class _InFlight:
    """One micro-batch between its forward and its backward on this rank."""

    received: list[torch.Tensor]               # whole boundary tensors from the previous stage
    outputs: list[torch.Tensor | None] = field(default_factory=list)   # sent ones carrying a gradient
    loss: torch.Tensor | None = None            # the last stage's micro-batch loss (this rank's piece)
    count: torch.Tensor | None = None           # its counted targets (a LOSS_COUNT loss; the whole micro-batch's)


class PipelineTrainer:
    """This rank's part of a pipelined plan: its stage's pieces of the weights and one step.

    ``program`` is the emitted program's namespace (its tables, ``Rank``, the runtime modules
    ``C``/``M``). The interface is the one-stage ``Trainer``'s: ``params``, ``step(batch)`` ->
    the global loss on every rank, ``full_grads()`` (whole gradients on rank 0, for --verify).
    """

    def __init__(self, program: Any, device: str | torch.device = "cpu", *, seed: int | None = None) -> None:
        P = self.P = program
        if not dist.is_initialized():
            raise RuntimeError("initialise the process group first (dist.init_process_group)")
        if dist.get_world_size() != P.WORLD:
            raise RuntimeError(f"this program is for {P.WORLD} ranks, the process group has {dist.get_world_size()}")
        self.device = torch.device(device)
        self.kwargs = dict(P.MODEL_KWARGS)
        self.seed = P.SEED if seed is None else seed
        self.steps_done = 0
        self.rank = dist.get_rank()
        self.comm = P.C.stage_comms([st["ranks"] for st in P.STAGES], [st["hierarchical"] for st in P.STAGES],
                                    P.NODE_SIZES)
        self.stage_index = next((s for s, st in enumerate(P.STAGES) if self.rank in st["ranks"]), None)
        self.roots = [st["ranks"][0] for st in P.STAGES]
        # Shared parameters' gradients are summed over the stages' first ranks (created by all).
        self.roots_group = dist.new_group(self.roots) if P.SHARED_PARAMS else None
        torch.manual_seed(self.seed)           # the same initial weights everywhere; each keeps its piece
        self.module = P._call_with(P.M.model, self.kwargs)
        self.params: dict[str, torch.Tensor] = {}
        self.sources: dict[str, torch.Tensor] = {}
        self._sends: list[tuple[list[Any], list[torch.Tensor]]] = []
        # fp16: the loss scale and its skip decision are the whole world's, idle ranks included.
        self.scaler = P.make_loss_scaler(self.device)
        self.verdict = self.scaler.before_first_step()
        self.zero = P.Z.StateShards(None, [], [])       # ZeRO's owned rows: none unless the stage has them
        self.stepped: dict[str, torch.Tensor] = {}      # what the optimizer steps, by module attribute
        if self.stage_index is None:            # a device the plan leaves idle
            self.rt = types.SimpleNamespace(ran=[], tied=[])
            return
        st = self.stage = P.STAGES[self.stage_index]
        self.forward = P.STAGE_FORWARDS[self.stage_index]
        self.last = self.stage_index == len(P.STAGES) - 1
        self.root = st["ranks"][0]
        self.rt = P.Rank(self.comm, self.device, self.seed, shards=st["shards"], local_calls=st["local_calls"])
        for name, target in st["params"].items():
            param = self.module.get_parameter(target)
            leaf = self.rt.piece(name, param.detach()).to(self.device).clone().requires_grad_(param.requires_grad)
            self.params[target] = self.sources[name] = leaf
        for name, target in st["buffers"].items():
            self.sources[name] = self.rt.piece(name, self.module.get_buffer(target).detach()).to(self.device).clone()
        constants = P._constants(self.module, self.kwargs) if st["constants"] else {}
        for name, target in st["constants"].items():
            self.sources[name] = self.rt.piece(name, constants[target].detach()).to(self.device).clone()
        rows = st["state_rows"]
        self.sync = P.C.GradSync(self.comm, [self.sources[n] for n in st["grad_sync_order"] if n not in rows],
                                 overlap=False)
        zero = [n for n in st["grad_sync_order"] if n in rows]
        self.zero = P.Z.StateShards(self.comm, [self.sources[n] for n in zero], [rows[n] for n in zero],
                                    overlap=False)
        self.stepped = {target: self.zero.stepped(leaf) for target, leaf in self.params.items()}

    # ---- one training step ----------------------------------------------------------------------
    def step(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        """Forward and backward of every micro-batch in the schedule's order, gradient sync in
        each group, shared gradients summed; returns the global loss on every rank."""
        P = self.P
        batch = tuple(batch)
        if len(batch) != len(P.INPUTS):
            raise ValueError(f"the model takes {len(P.INPUTS)} inputs, got {len(batch)}")
        # The step's loss and, for a LOSS_COUNT loss, the batch's count: both from the last stage.
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        if self.stage_index is not None:
            m = P.MICROBATCHES
            in_flight: dict[int, _InFlight] = {}
            losses, counts = [], []
            for phase, i in schedule_order(P.SCHEDULE, len(P.STAGES), self.stage_index, m):
                if phase == FORWARD:
                    in_flight[i] = self._forward(self._microbatch(batch, i), i)
                else:
                    mb = in_flight.pop(i)
                    losses.append(self._backward(mb))
                    counts.append(mb.count)
            self.sync.finish()                   # once, after the last micro-batch
            self.zero.finish()
            self.rt.gathered.clear()
            self._wait_sends()
            self._sum_shared_gradients()
            if self.last:
                loss = torch.stack(losses).sum()          # each already weighed (_backward)
                if self.stage["loss_partial"] and self.comm.world > 1:
                    dist.all_reduce(loss, group=self.comm.group)
                total[0] = loss
                if P.LOSS_COUNT:
                    total[1] = torch.stack(counts).sum()
        self.steps_done += 1
        dist.broadcast(total, src=self.roots[-1])     # from the last stage to every rank
        if P.LOSS_COUNT:
            self._divide_gradients(total[1])
        # Unscale the synced gradients; every rank of every stage skips or steps together.
        self.verdict = self.scaler.finish(list(self.stepped.values()))
        return (total[0] / total[1]).float() if P.LOSS_COUNT else total[0].float()

    def share_updates(self) -> None:
        """After the optimizer step: under ZeRO, every stage member's updated rows to the others."""
        self.zero.share_updates()

    def _divide_gradients(self, count: torch.Tensor) -> None:
        """A LOSS_COUNT loss: every gradient so far is the sum over counted targets; the model's
        mean divides by their number."""
        for tensor in self.stepped.values():
            if tensor.grad is not None:
                tensor.grad.div_(count.to(tensor.grad.dtype))

    def _count(self, results: dict[str, torch.Tensor]) -> torch.Tensor:
        """What the loss node's mean divides by on this micro-batch: its targets that are not the
        ignored id, or the sum of their class weights (as ``cross_entropy``/``nll_loss`` count)."""
        spec = self.P.LOSS_COUNT
        target = results[spec["target"]]
        counted = target != spec["ignore_index"]
        if spec["weight"] is not None:
            weight = results[spec["weight"]]
            count = (weight[target.clamp(0, weight.numel() - 1)].double() * counted).sum()
        else:
            count = counted.sum().double()
        if spec["sharded"] and self.comm.world > 1:
            dist.all_reduce(count, group=self.comm.group)
        return count

    def _microbatch(self, batch: tuple[torch.Tensor, ...], i: int) -> dict[str, torch.Tensor]:
        """Micro-batch ``i`` of the inputs this stage reads (rows ``[i*b, (i+1)*b)`` of each
        input that has the batch dimension), this rank's piece of each."""
        out = {}
        for name, x, split in zip(self.P.INPUTS, batch, self.P.INPUT_SPLIT):
            if name in self.stage["inputs"]:
                if split:
                    rows = x.shape[0] // self.P.MICROBATCHES
                    x = x.narrow(0, i * rows, rows)
                out[name] = self.rt.piece(name, x).to(self.device)
        return out

    def _forward(self, inputs: dict[str, torch.Tensor], i: int) -> _InFlight:
        P, st = self.P, self.stage
        received = self._receive_activations()
        whole = {entry[0]: t for entry, t in zip(st["recv"], received)}
        v = {name: self.sources[name] for name in (*st["params"], *st["buffers"], *st["constants"])}
        v.update(inputs)
        for name, (base, layout) in st["needs"].items():
            v[name] = self._piece(whole[base], name, layout)
        # The step's seed, as a one-stage program's: micro-batch i draws its rows of the whole
        # batch's draw (hapc_random_ops.micro_batch_view), the same on every member of the group.
        self.rt.seed, self.rt.tied, self.rt.ran = self.seed + self.steps_done, [], []
        self.rt.micro = (i, P.MICROBATCHES, st["random_batch_dims"])
        with P.autocast(self.device), self.rt.gathered.hooks():      # ZeRO-3: gathered weights freed
            results = self.forward(self.rt, v)
        tied, self.rt.tied = self.rt.tied, []
        if self.last:
            count = self._count(results) if P.LOSS_COUNT else None
            return _InFlight(received, loss=P.C.tie(results[P.LOSS].reshape(()), tied), count=count)
        sends = []
        for base, _, dtype, _, layout in st["send"]:
            t = whole[base] if layout == "pass" else self._whole(results[base], base, layout)
            sends.append(t if t.dtype == _dtype(dtype) else t.to(_dtype(dtype)))
        carrying = [k for k, entry in enumerate(st["send"]) if entry[3] and sends[k].requires_grad]
        if tied and carrying:                     # every rank runs those collectives' backward
            sends[carrying[0]] = P.C.tie(sends[carrying[0]], tied)
        self._send(sends, self.roots[self.stage_index + 1])
        return _InFlight(received, outputs=[sends[k] if k in carrying else None
                                            for k, entry in enumerate(st["send"]) if entry[3]])

    def _backward(self, mb: _InFlight) -> torch.Tensor:
        """Backward of one micro-batch; returns its weighted loss (last stage) or 0."""
        P, st = self.P, self.stage
        loss_value = torch.zeros((), dtype=torch.float64, device=self.device)
        if self.last:
            loss = mb.loss
            # The loss weighs its count (a LOSS_COUNT loss; none counted: it adds nothing, and its
            # 0/0 mean is not back-propagated) or LOSS_SCALE.
            weight = P.LOSS_SCALE if mb.count is None else mb.count.to(loss.dtype)
            loss_value = (loss.detach() * weight).double() if mb.count is None or mb.count > 0 else \
                torch.zeros((), dtype=torch.float64, device=self.device)
            if not st["loss_partial"] and self.comm.rank != 0:
                loss_value = loss_value * 0           # a replicated loss is counted once
            if loss.requires_grad and (mb.count is None or mb.count > 0):
                # A Partial loss: every rank back-propagates its piece; a replicated one, rank 0's.
                scaled = self.scaler.scale_loss(loss * weight)      # fp16's loss scale (else 1)
                (scaled if st["loss_partial"] or self.comm.rank == 0 else loss * 0).backward()
        else:
            grads = self._receive_gradients()
            pairs = [(t, g) for t, g in zip(mb.outputs, grads) if t is not None]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [g.to(t.dtype) for t, g in pairs])
        if self.stage_index > 0:
            self._send_gradients(mb.received)
        return loss_value

    # ---- layouts at the cut ----------------------------------------------------------------------
    def _whole(self, x: torch.Tensor, name: str, layout: str) -> torch.Tensor:
        """A value this stage computed, made whole on every member (differentiably)."""
        if layout == "S":
            return self.rt.all_gather(x, name)
        if layout == "P":
            return self.rt.all_reduce(x)
        return x

    def _piece(self, whole: torch.Tensor, name: str, layout: str) -> torch.Tensor:
        """This rank's piece of a received whole value, in the layout its stage's program holds
        ``name`` in (a Shard's narrow and a Partial's rank-0 copy are differentiable)."""
        if layout == "S":
            return self.rt.slice(whole, name)
        if layout == "P":
            return self.rt.keep_on_rank0(whole)
        return whole

    # ---- point-to-point between the groups' first ranks -----------------------------------------
    def _send(self, tensors: list[torch.Tensor], peer: int) -> None:
        """Post the sends (from the first rank only); they are waited for at the end of the step."""
        if self.rank != self.root or not tensors:
            return
        wire = [_wire(t.detach()).contiguous() for t in tensors]
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer) for t in wire])
        self._sends.append((works, wire))

    def _receive(self, specs: Sequence[tuple], peer: int) -> list[torch.Tensor]:
        """Receive whole tensors of the tables' shapes and dtypes on the first rank; the others
        get zeros (the caller broadcasts when every member needs them)."""
        bufs = [torch.zeros(tuple(shape), dtype=torch.uint8 if dtype == "bool" else _dtype(dtype), device=self.device)
                for _, shape, dtype, *_ in specs]
        if self.rank == self.root and bufs:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, peer) for b in bufs]):
                work.wait()
        return bufs

    def _receive_activations(self) -> list[torch.Tensor]:
        st = self.stage
        if self.stage_index == 0:
            return []
        bufs = self._receive(st["recv"], self.roots[self.stage_index - 1])
        if self.comm.world > 1:
            for b in bufs:
                dist.broadcast(b, src=self.root, group=self.comm.group)
        out = []
        for b, (_, _, dtype, grad) in zip(bufs, st["recv"]):
            t = b.to(_dtype(dtype)) if b.dtype != _dtype(dtype) else b
            out.append(t.requires_grad_(True) if grad else t)
        return out

    def _receive_gradients(self) -> list[torch.Tensor]:
        """Gradients of this stage's sent values (whole, on the first rank; zeros elsewhere)."""
        specs = [entry for entry in self.stage["send"] if entry[3]]
        return self._receive(specs, self.roots[self.stage_index + 1])

    def _send_gradients(self, received: list[torch.Tensor]) -> None:
        """Sum the gradients of the received copies over the group onto the first rank and send
        them back to the previous stage."""
        grads = []
        for t, (_, _, _, grad) in zip(received, self.stage["recv"]):
            if not grad:
                continue
            g = t.grad if t.grad is not None else torch.zeros_like(t)
            g = g.contiguous()
            if self.comm.world > 1:
                dist.reduce(g, dst=self.root, group=self.comm.group)
            grads.append(g)
        self._send(grads, self.roots[self.stage_index - 1])

    def _wait_sends(self) -> None:
        for works, _ in self._sends:
            for work in works:
                work.wait()
        self._sends = []

    # ---- gradients of parameters several stages read ---------------------------------------------
    def _whole_grad(self, name: str) -> torch.Tensor:
        """This stage's whole gradient of ``name`` (gathered when sharded; every member joins)."""
        leaf = self.sources[name]
        if name in self.stage["state_rows"]:
            return self.P.C.gather(self.comm, self.zero.owned_grad(leaf), 0, self.stage["state_rows"][name])
        g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        if name in self.stage["shards"]:
            dim, lengths = self.stage["shards"][name]
            g = self.P.C.gather(self.comm, g, dim, lengths)
        return g

    def _sum_shared_gradients(self) -> None:
        """A parameter held by several stages gets the sum of their gradients, in every copy."""
        for name, holders in self.P.SHARED_PARAMS.items():
            mine = self.stage_index in holders
            if mine:
                total = self._whole_grad(name).clone()
            else:
                target = self.P.PARAMS[name]
                total = torch.zeros_like(self.module.get_parameter(target), device=self.device)
            if self.rank == self.root:
                dist.all_reduce(total, group=self.roots_group)
            if not mine:
                continue
            if self.comm.world > 1:
                dist.broadcast(total, src=self.root, group=self.comm.group)
            leaf = self.sources[name]
            leaf.grad = self.rt.piece(name, total).clone()

    # ---- --verify -----------------------------------------------------------------------------------
    @property
    def random_nodes(self) -> tuple[tuple[str, str], ...]:
        """What the one-device reference replays: every drawing node once, in graph order (this
        rank ran only its stage's, once per micro-batch)."""
        return tuple(self.P.RANDOM_NODES)

    # ---- whole gradients for --verify ------------------------------------------------------------
    def full_grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's whole gradient on rank 0 (from the first stage holding it); every
        rank takes part. Other ranks get zeros."""
        P = self.P
        out = {}
        for name, target in P.PARAMS.items():
            param = self.module.get_parameter(target)
            buf = torch.zeros(param.shape, dtype=param.dtype, device=self.device)
            owner = P.PARAM_OWNER.get(name)
            if owner is None:                    # no stage reads it: no gradient
                out[target] = buf
                continue
            if self.stage_index == owner:
                g = self._whole_grad(name)
                if self.rank == self.root:
                    buf.copy_(g)
            dist.broadcast(buf, src=self.roots[owner])
            out[target] = buf
        return out
