"""Tracing one instance of a repeated block (hapc.frontend.blocktrace) gives exactly the IR of the full
trace, names and value order included, and falls back to the full trace whenever the layers
are not provably the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hapc.frontend import blocktrace, tracer
from hapc.frontend.modelfile import load_model_file

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
SMALL = {"hidden": 64, "heads": 4, "seq": 16, "vocab": 101, "batch": 3, "dropout": 0.0}


def _traced_both_ways(model: nn.Module, inputs: tuple, monkeypatch) -> tuple[tracer.Traced, tracer.Traced, bool]:
    """The full trace, the default trace, and whether the default one replicated blocks."""
    used = []

    def spy(*args):
        result = blocktrace.trace_repeated(*args)
        used.append(result is not None)
        return result

    monkeypatch.setattr(tracer, "trace_repeated", spy)
    full = tracer.trace(model, inputs, replicate_blocks=False)
    fast = tracer.trace(model, inputs)
    return full, fast, used == [True]


def _same_ir(a: tracer.Traced, b: tracer.Traced) -> None:
    assert a.graph.nodes == b.graph.nodes                       # ops, args, names, sources, costs
    assert list(a.graph.values.items()) == list(b.graph.values.items())
    assert (a.graph.params, a.graph.buffers, a.graph.inputs, a.graph.output) == \
        (b.graph.params, b.graph.buffers, b.graph.inputs, b.graph.output)
    assert a.graph == b.graph
    assert sorted(a.constants) == sorted(b.constants)


@pytest.mark.parametrize("file, layers", [("gpt.py", 5), pytest.param("bert.py", 6, marks=pytest.mark.slow)])
def test_example_models_replicate_to_the_full_trace(file, layers, monkeypatch):
    mf = load_model_file(str(MODELS / file), {**SMALL, "layers": layers})
    model = mf.build_model(device="meta")
    inputs = tuple(t.to("meta") for t in mf.build_inputs())
    full, fast, replicated = _traced_both_ways(model, inputs, monkeypatch)
    assert replicated
    _same_ir(full, fast)
    # Per-layer parameter names (every linear its own weight), the same source line in every layer.
    linears = [n for n in fast.graph.nodes if n.op == "aten.linear.default"]
    targets = [fast.graph.values[n.args[1].name].target for n in linears]
    assert len(set(targets)) == len(targets)
    layer_of = [t.split(".")[1] for t in targets if t.split(".")[1:2] and t.split(".")[1].isdigit()]
    assert set(layer_of) == {str(i) for i in range(layers)}
    assert len({str(n.source) for n in linears[:len(linears) // layers]}) > 1


@pytest.mark.slow              # importing transformers alone takes seconds
def test_hf_gpt2_falls_back_when_its_forward_reads_the_layer_index(monkeypatch):
    """Hugging Face blocks keep ``layer_idx``; with ``use_cache`` on, GPT-2's forward files its
    keys and values in the generation cache under it (even with labels), so the index is read
    and the model is traced whole; the blocks get their real indices back."""
    mf = load_model_file(str(MODELS / "hf_gpt2.py"), {**SMALL, "layers": 5, "attn_dropout": 0.0, "use_cache": True})
    model = mf.build_model(device="meta")
    found = blocktrace.find_repeated_blocks(model)
    assert found is not None and ("attn", "layer_idx") in found.index_attributes
    full, fast, replicated = _traced_both_ways(model, tuple(t.to("meta") for t in mf.build_inputs()), monkeypatch)
    assert not replicated
    _same_ir(full, fast)
    assert [b.attn.layer_idx for b in model.lm.transformer.h] == list(range(5))


@pytest.mark.slow
@pytest.mark.parametrize("file, extra", [("hf_gpt2.py", {"attn_dropout": 0.0}), ("hf_llama.py", {"mlp": 96})])
def test_hf_decoders_replicate_without_the_generation_cache(file, extra, monkeypatch):
    """The example Hugging Face decoders train with ``use_cache`` off (their default here): the
    layer index goes unread, one block is traced and replicated, identical to the full trace."""
    small = {k: v for k, v in SMALL.items() if k != "dropout" or file == "hf_gpt2.py"}
    mf = load_model_file(str(MODELS / file), {**small, "layers": 5, **extra})
    model = mf.build_model(device="meta")
    full, fast, replicated = _traced_both_ways(model, tuple(t.to("meta") for t in mf.build_inputs()), monkeypatch)
    assert replicated
    _same_ir(full, fast)


@pytest.mark.slow
def test_hf_bert_replicates_with_its_layer_index_unread(monkeypatch):
    """Hugging Face BERT keeps ``layer_idx`` too, but its encoder has no cache to file under it:
    replicated, and identical to the full trace."""
    transformers = pytest.importorskip("transformers")

    class MaskedLM(nn.Module):
        def __init__(self):
            super().__init__()
            config = transformers.BertConfig(num_hidden_layers=6, hidden_size=64, num_attention_heads=4,
                                             intermediate_size=128, vocab_size=101, max_position_embeddings=16,
                                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
            config._attn_implementation = "sdpa"
            self.lm = transformers.BertForMaskedLM(config)

        def forward(self, ids):
            return self.lm(input_ids=ids, labels=ids).loss

    with torch.device("meta"):
        model = MaskedLM()
    found = blocktrace.find_repeated_blocks(model)
    assert found is not None and found.path == "lm.bert.encoder.layer"
    full, fast, replicated = _traced_both_ways(model, (torch.randint(0, 101, (3, 16)).to("meta"),), monkeypatch)
    assert replicated
    _same_ir(full, fast)


class Block(nn.Module):
    def __init__(self, width: int = 8, scale: float = 1.0, layer_idx: int | None = None, reads_index: bool = False):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.scale = scale
        self.layer_idx = layer_idx          # as Hugging Face blocks keep it (for the generation cache)
        self.reads_index = reads_index

    def forward(self, x):
        if self.reads_index and self.layer_idx >= 4:
            x = x * 2
        return x + torch.tanh(self.fc(x)) * self.scale


class Stack(nn.Module):
    """``mode`` picks how forward walks the blocks: the plain loop and loops hapc must not copy."""

    def __init__(self, layers: int = 6, mode: str = "plain"):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block(layer_idx=i, reads_index=mode == "reads-index") for i in range(layers))
        self.mode = mode

    def forward(self, x):
        x = self.inp(x)
        for i, block in enumerate(self.blocks):
            if self.mode == "last-differs" and i == len(self.blocks) - 1:
                x = block(x * 2)
            elif self.mode == "after-last" and i == len(self.blocks) - 1:
                x = block(x) * 2            # code after the last block: the graph's tail, still a copy
            elif self.mode == "alternating" and i % 2:
                x = block(x.flip(0))
            elif self.mode == "between":
                x = block(x) * 0.5          # the forward's own code between blocks: still a layer
            else:
                x = block(x)
        if self.mode == "depth-scaled":
            x = x / len(self.blocks)
        return x.square().mean()


INPUT = (torch.randn(3, 4),)


@pytest.mark.parametrize("mode, replicated", [("plain", True), ("between", True), ("after-last", True),
                                              ("last-differs", False),
                                              ("alternating", False), ("depth-scaled", False),
                                              ("reads-index", False)])
def test_forward_walking_the_blocks(mode, replicated, monkeypatch):
    torch.manual_seed(0)
    full, fast, used = _traced_both_ways(Stack(mode=mode), INPUT, monkeypatch)
    assert used == replicated
    _same_ir(full, fast)


def test_blocks_that_are_not_interchangeable_are_not_copied():
    assert blocktrace.find_repeated_blocks(Stack()) == blocktrace.RepeatedBlocks("blocks", 6, (("", "layer_idx"),))
    assert blocktrace.find_repeated_blocks(Stack(layers=blocktrace.MIN_BLOCKS - 1)) is None

    assert blocktrace.find_repeated_blocks(Stack()).index_attributes == (("", "layer_idx"),)
    differ = Stack()
    differ.blocks[3].scale = 0.5                       # a plain attribute differs
    assert blocktrace.find_repeated_blocks(differ) is None
    shuffled = Stack()
    shuffled.blocks[3].layer_idx = 7                   # an integer, but not the position
    assert blocktrace.find_repeated_blocks(shuffled) is None

    tied = Stack()
    tied.blocks[2].fc.weight = tied.blocks[1].fc.weight     # shared parameter
    assert blocktrace.find_repeated_blocks(tied) is None

    hooked = Stack()
    hooked.blocks[4].register_forward_hook(lambda *_: None)
    assert blocktrace.find_repeated_blocks(hooked) is None

    shaped = Stack()
    shaped.blocks[0].fc = nn.Linear(8, 8, bias=False)
    assert blocktrace.find_repeated_blocks(shaped) is None


def test_the_users_model_is_untouched():
    model = Stack()
    before = [id(b) for b in model.blocks]
    tracer.trace(model, INPUT)
    assert [id(b) for b in model.blocks] == before and len(model.blocks) == 6
    assert [b.layer_idx for b in model.blocks] == list(range(6))


@pytest.mark.slow              # a synthesis on 3 devices: seconds
def test_a_plan_from_the_replicated_trace_runs_like_the_model():
    """Numerics: a synthesized plan on 3 uneven devices, run by the in-process executor on the
    replicated IR, gives the single-device loss and gradients."""
    from hapc import synthesize
    from hapc.codegen.executor import run

    torch.manual_seed(0)
    mf = load_model_file(str(MODELS / "gpt.py"), {**SMALL, "layers": 5})
    model = mf.build_model().double()
    inputs = mf.build_inputs()
    traced = tracer.trace(model, inputs)
    assert blocktrace.find_repeated_blocks(model) is not None
    cluster = {"nodes": [{"devices": [{"type": "V100-32GB", "count": 2}, {"type": "P100-16GB", "count": 1}],
                          "intra_link": "pcie3"}]}
    plan = synthesize(traced, None, cluster)
    got = run(plan.program, traced, inputs)
    loss = model(*inputs)
    names = {v.name: v.target for v in traced.graph.values.values() if v.kind == "param"}
    want = dict(zip([n for n, _ in model.named_parameters()], torch.autograd.grad(loss, list(model.parameters()))))
    assert torch.allclose(got.loss, loss.detach(), atol=1e-10)
    for name, grad in got.grads.items():
        assert torch.allclose(grad, want[names[name]], atol=1e-9), name


def test_files_read_by_the_forked_trace_are_announced_here(tmp_path, monkeypatch):
    """The trace of 3 blocks runs in a forked child: the files it reads (a module it imports, a
    file it opens) must reach this process's trace-cache recorder, which stamps them."""
    import sys

    from hapc.process.fork import Beside
    from hapc.frontend.cache.sources import Recorder

    (tmp_path / "bt_child_only.py").write_text("VALUE = 3\n")
    (tmp_path / "bt_setting.txt").write_text("4")
    monkeypatch.syspath_prepend(str(tmp_path))

    def job() -> int:
        import bt_child_only

        return bt_child_only.VALUE + int((tmp_path / "bt_setting.txt").read_text())

    recorder = Recorder()
    with recorder.active():
        assert blocktrace._announce_reads(Beside(blocktrace._reads_announced(job)).result()) == 7
    assert {str(tmp_path / "bt_child_only.py"), str(tmp_path / "bt_setting.txt")} <= recorder.opened
    sys.modules.pop("bt_child_only", None)         # imported here when there was no spare core


def test_beside_another_thread_both_short_traces_run_here(monkeypatch):
    """A forked child gets only the forking thread: with another Python thread alive (a
    notebook's), nothing is forked, and the IR is the same."""
    import threading

    mf = load_model_file(str(MODELS / "gpt.py"), {**SMALL, "layers": 5})
    model = mf.build_model(device="meta")
    inputs = tuple(t.to("meta") for t in mf.build_inputs())
    monkeypatch.setattr(blocktrace, "Beside", lambda job: pytest.fail("forked beside another thread"))
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        full, fast, replicated = _traced_both_ways(model, inputs, monkeypatch)
    finally:
        release.set()
        other.join()
    assert replicated
    _same_ir(full, fast)


class _Activation(nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * self.scale


class _KernelBlock(nn.Module):
    """A block that keeps a stateless module of its own in a plain dict, outside the module
    tree (as transformers 5 keeps its attention kernels)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.kernels = {"act": _Activation(scale)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels["act"](self.lin(x))


def test_blocks_holding_alike_stateless_modules_are_interchangeable():
    count = blocktrace.MIN_BLOCKS + 1
    found = blocktrace.find_repeated_blocks(nn.Sequential(*[_KernelBlock() for _ in range(count)]))
    assert found is not None and found.count == count and found.index_attributes == ()


def test_blocks_whose_stateless_modules_differ_are_not():
    count = blocktrace.MIN_BLOCKS + 1
    assert blocktrace.find_repeated_blocks(nn.Sequential(*[_KernelBlock(1.0 + i) for i in range(count)])) is None
